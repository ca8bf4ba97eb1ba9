"""``labkit trace``: flows seen by the datapath hooks, Hubble style, read through labkitd
(``lab.events()``: from where the last read stopped)."""
from __future__ import annotations

import json
import sys
import time

from labkit.cli import common
from labkit.cli.common import CliError, POLL, count, output_options
from labkit.errors import NotFoundError

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

    emit(log.last(last, args.node))  # labkitd reads only the end of a long log; in time order
    if not args.follow:
        return 0
    gone = CliError(f"lab '{lab.name}' went down while following its trace")
    try:
        while True:
            try:
                flows = log.read(args.node)
            except NotFoundError:
                raise gone from None
            if flows:
                emit(sorted(flows, key=lambda f: f.event.ts_ns))
                continue
            if not log.up:
                raise gone
            time.sleep(POLL)
    except KeyboardInterrupt:
        return 0
