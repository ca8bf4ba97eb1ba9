"""``labkit lb``: a node's load-balancing maps, and a service's Maglev tables."""
from __future__ import annotations

import sys

from labkit.cli import common
from labkit.cli.common import output_options, print_json
from labkit.maglev import shares

__all__ = ["add_commands", "cmd_lb_list", "cmd_lb_maglev"]


def add_commands(add) -> None:
    """Add the lb commands to the parser (``add`` makes a subcommand)."""
    lb = add("lb", "the load-balancing maps of a node").add_subparsers(
        dest="lb_command", metavar="COMMAND", required=True)
    p = lb.add_parser("list", help="a node's services as `cilium service list` prints them",
                      description="The services in NODE's cilium_lb4_* maps as the lab's Cilium release prints "
                                  "them: `cilium service list` (one line per backend), or with --bpf "
                                  "`cilium-dbg bpf lb list` (one line per map entry); --raw shows every map entry "
                                  "with its slot in labkit's own words.")
    p.add_argument("node", metavar="NODE", help="the node whose maps to read (node-a, node-b, ...)")
    view = p.add_mutually_exclusive_group()
    view.add_argument("--bpf", action="store_true",
                      help="as `cilium-dbg bpf lb list` prints the services map (with --json: its key -> entries)")
    view.add_argument("--raw", action="store_true", help="every slot, backend and reverse NAT entry as stored")
    output_options(p, "as JSON", show_command="first print the bpftool commands that dump the same maps, as '# ' lines")
    p.set_defaults(func=cmd_lb_list)

    p = lb.add_parser("maglev", help="a service's Maglev tables as the BPF map holds them, checked against "
                                     "labkit's own computation",
                      description="For each frontend of service NAME on NODE: the table in cilium_lb4_maglev "
                                  "(read through its inner map), how many slots each backend holds, and whether "
                                  "it equals the table labkit.maglev.lookup_table computes.")
    p.add_argument("name", metavar="NAME", help="a service added with --algorithm maglev")
    p.add_argument("--node", metavar="NODE", default=None, help="whose map to read (default: the first node)")
    p.add_argument("--slots", action="store_true", help="also print every slot's backend id, 16 to a line")
    output_options(p, "as JSON")
    p.set_defaults(func=cmd_lb_maglev)


def cmd_lb_list(args) -> int:
    lab = common.attach(args)
    snap = lab.services.lb(args.node)
    if args.show_command:
        for command in lab.services.lb_command(args.node):
            print(f"# {command}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print_json(snap.bpf_json() if args.bpf else snap.raw_json() if args.raw else snap.to_json())
        return 0
    if args.raw:
        sys.stdout.write("\n".join(snap.raw_lines()) + "\n")
    else:  # Go's tabwriter output as it is: every line padded, trailing spaces kept
        sys.stdout.write(snap.bpf_text() if args.bpf else snap.text())
    return 0


def cmd_lb_maglev(args) -> int:

    lab = common.attach(args)
    node = args.node or lab.topology.nodes[0].name
    svc = lab.services.get(args.name)
    tables = lab.services.maglev(args.name, node)
    by_id = {b.id: b for b in svc.backends}
    if args.json:
        print_json([{"frontend": fe.l4(svc.protocol), "id": fe.id, "node": node,
                      "table": list(tables[fe.id][0].backend_ids) if tables[fe.id][0] else None,
                      "matches_python": tables[fe.id][0] == tables[fe.id][1]} for fe in svc.frontends])
        return 0 if all(bpf == want for bpf, want in tables.values()) else 1
    if svc.algorithm != "maglev":
        print(f"service {svc.name} picks backends at random (added without --algorithm maglev): no Maglev tables")
        return 0
    print(f"# bpftool map dump pinned {lab.pin_dir(node)}/cilium_lb4_maglev   (values are inner map ids)")
    ok = True
    for fe in svc.frontends:
        bpf, want = tables[fe.id]
        if bpf is None:
            why = " (one was expected!)" if want is not None else \
                " (a ClusterIP gets none: pods pick at random, as in Cilium)" if fe.type == "ClusterIP" else \
                " (the surrogate gets none: no outside client reaches it)" if fe.address == "0.0.0.0" else \
                " (another node's address: only that node's maps hold it)" if fe.type == "NodePort" else ""
            print(f"{fe.type} {fe.l4(svc.protocol)} id {fe.id}: no table in the map{why}")
            ok = ok and want is None
            continue
        same = bpf == want
        ok = ok and same
        print(f"{fe.type} {fe.l4(svc.protocol)} id {fe.id}: M={len(bpf)}, "
              f"{'equals' if same else 'DIFFERS FROM'} labkit.maglev.lookup_table")
        for bid, share in shares(list(bpf.backend_ids)).items():
            be = by_id.get(bid)
            name = f"{be.ref} ({lab.topology.pod(be.pod).ip}:{be.port})" if be else "?"
            print(f"  backend {bid:<4} {name:<28} {round(share * len(bpf)):>6} slots  {share:6.1%}")
        if args.slots:
            ids = list(bpf.backend_ids)
            for i in range(0, len(ids), 16):
                print(f"  {i:>6}: " + " ".join(f"{b:>3}" for b in ids[i:i + 16]))
    return 0 if ok else 1
