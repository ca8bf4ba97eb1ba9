"""``labkit observe``: the flows Hubble would hold, with ``hubble observe``'s filters and output. labkitd reads
the lab's Hubble ring (``lab.hubble(seq)``: GetFlowsResponse dicts from ``seq`` on); the filters run here."""
from __future__ import annotations

import json
import sys
import time

from labkit.cli import common
from labkit.cli.common import CliError, POLL, count

__all__ = ["add_commands", "cmd_observe", "DEFAULT_LAST"]

DEFAULT_LAST = 20  #: what ``hubble observe`` prints without --last or --follow


def add_commands(add) -> None:
    """Add ``observe`` to the parser (``add`` makes a subcommand)."""
    p = add("observe", "the flows the lab's Hubble ring holds (what Cilium at the lab's monitor aggregation level "
                       "reported), as `hubble observe` prints them")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new flows until Ctrl-C")
    p.add_argument("--last", type=count, default=None, metavar="N",
                   help=f"the last N matching flows (default {DEFAULT_LAST}; 0 with --follow)")
    p.add_argument("--output", "-o", choices=("compact", "json", "jsonpb"), default="compact",
                   help="compact: Hubble's one-line format (default); json/jsonpb: one GetFlowsResponse per line")
    p.add_argument("--print-node-name", action="store_true", help="compact: print the node name of each flow")
    for flag, dest, what in (
        ("--from-pod", "from_pods", "flows from pods whose name starts so ([namespace/]prefix; namespace default)"),
        ("--to-pod", "to_pods", "flows to such pods"),
        ("--pod", "pods", "flows from or to such pods"),
        ("--verdict", "verdicts", "FORWARDED or DROPPED (Hubble's verdict names)"),
        ("--protocol", "protocols", "tcp, udp, icmp, icmpv4, icmpv6, sctp"),
        ("--from-ip", "from_ips", "flows from this address or CIDR"),
        ("--to-ip", "to_ips", "flows to this address or CIDR"),
        ("--node", "nodes", "flows observed on this node (glob patterns allowed)"),
    ):
        p.add_argument(flag, dest=dest, action="append", default=[], metavar="VALUE", help=f"{what}; repeatable")
    p.add_argument("--port", dest="ports", action="append", default=[], type=int, metavar="PORT",
                   help="flows with this source or destination port; repeatable")
    p.set_defaults(func=cmd_observe)


def cmd_observe(args) -> int:
    from labkit.errors import NotFoundError
    from labkit.observe.hubble import FlowFilter, compact

    lab = common.attach(args)
    for node in args.nodes:
        if not any(ch in node for ch in "*?[") and node not in {n.name for n in lab.topology.nodes}:
            lab.topology.node(node)  # NotFoundError lists the nodes
    try:
        flt = FlowFilter(from_pods=args.from_pods, to_pods=args.to_pods, pods=args.pods, verdicts=args.verdicts,
                         protocols=args.protocols, ports=args.ports, from_ips=args.from_ips, to_ips=args.to_ips,
                         nodes=args.nodes)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    bad = {v.upper() for v in args.verdicts} - {"FORWARDED", "DROPPED", "ERROR", "AUDIT", "REDIRECTED", "TRACED",
                                                "TRANSLATED"}
    if bad:
        raise CliError(f"verdict {sorted(bad)[0]!r}: expected FORWARDED, DROPPED, ERROR, AUDIT, REDIRECTED, TRACED "
                       f"or TRANSLATED")

    def emit(resps) -> None:
        for r in resps:
            print(json.dumps(r) if args.output != "compact" else compact(r, args.print_node_name))
        sys.stdout.flush()

    last = args.last if args.last is not None else (0 if args.follow else DEFAULT_LAST)
    got = lab.hubble()  # the whole ring as GetFlowsResponses (labkitd reads it); filtered here
    seq = got["seq"]  # --follow goes on exactly after what was read
    matching = flt.select(got["responses"])
    emit(matching[-last:] if last else [])
    if not args.follow:
        return 0
    try:
        while True:
            try:
                got = lab.hubble(seq)  # from seq on; a lost-events entry first when the ring overwrote some
            except NotFoundError:
                raise CliError(f"lab '{lab.name}' went down while following its flows") from None
            seq = got["seq"]
            emit(flt.select(got["responses"]))
            if not got["responses"]:
                time.sleep(POLL)
    except KeyboardInterrupt:
        return 0
