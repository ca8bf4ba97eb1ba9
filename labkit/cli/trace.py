"""``labkit trace``: flows seen by the datapath hooks, Hubble style."""
from __future__ import annotations

import json
import os
import sys
import time

from labkit.cli import common
from labkit.cli.common import CliError, POLL, count, output_options
from labkit.observe.trace import EVENT_SIZE

__all__ = ["add_commands", "cmd_trace"]


_TRACE_LAST = 50  # flows `labkit trace` prints without --follow


def add_commands(add) -> None:
    """Add the trace commands to the parser (``add`` makes a subcommand)."""
    p = add("trace", "flows seen by the datapath hooks, Hubble style")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new flows until Ctrl-C")
    output_options(p, "one JSON object per flow per line")
    p.add_argument("--node", metavar="NODE", help="only flows of this node")
    p.add_argument("--last", type=count, default=None, metavar="N",
                   help=f"print the last N flows first (default: {_TRACE_LAST}; 0 with --follow)")
    p.set_defaults(func=cmd_trace)


def _last_flows(log, n: int, node: str | None) -> list:
    """The last ``n`` flows (of ``node``) in time order, reading only the end of a long log."""

    if n == 0:
        log.seek_end()
        return []
    try:
        size = os.stat(log.path).st_size
    except FileNotFoundError:
        return []
    size -= size % EVENT_SIZE
    window = max(4 * n, 1024)
    while True:
        start = max(0, size - window * EVENT_SIZE)
        log.offset = start
        flows = [f for f in log.read() if node is None or f.node == node]
        if start == 0 or len(flows) >= 2 * n:  # margin: two rings interleave slightly out of order
            break
        window *= 4
    flows.sort(key=lambda f: f.event.ts_ns)
    return flows[-n:]


def cmd_trace(args) -> int:
    lab = common.attach(args)
    if args.node is not None:
        lab.topology.node(args.node)  # NotFoundError lists the nodes
    log = lab.events()
    last = args.last if args.last is not None else (0 if args.follow else _TRACE_LAST)

    def emit(flows) -> None:
        for flow in flows:
            print(json.dumps(flow.to_json()) if args.json else flow.line())
        sys.stdout.flush()

    emit(_last_flows(log, last, args.node))
    if not args.follow:
        return 0
    idle = 0
    try:
        while True:
            flows = [f for f in log.read() if args.node is None or f.node == args.node]
            if flows:
                idle = 0
                emit(sorted(flows, key=lambda f: f.event.ts_ns))
                continue
            idle += 1
            if idle % 20 == 0 and not log.path.parent.exists():
                raise CliError(f"lab '{lab.name}' went down while following its trace")
            time.sleep(POLL)
    except KeyboardInterrupt:
        return 0
