"""``labkit ct list``: a node's CT maps in ``cilium-dbg bpf ct list global``'s grammar."""
from __future__ import annotations

import sys

from labkit.cli import common
from labkit.cli.common import output_options, print_json
from labkit.maps.ct import CT_MAPS, list_text

__all__ = ["add_commands", "cmd_ct_list"]


def add_commands(add) -> None:
    """Add the ct commands to the parser (``add`` makes a subcommand)."""
    ct = add("ct", "connection tracking tables of a node").add_subparsers(
        dest="ct_command", metavar="COMMAND", required=True)
    p = ct.add_parser("list", help="the rows of a node's CT maps, as `cilium-dbg bpf ct list global` prints them",
                      description="The rows of both CT maps of NODE (TCP first), in cilium-dbg's grammar.")
    p.add_argument("node", metavar="NODE", help="the node whose maps to read (node-a, node-b, ...)")
    p.add_argument("-d", dest="remaining", action="store_true",
                   help="add the remaining lifetime on the lab clock, as cilium-dbg's -d does")
    output_options(p, "a JSON list of rows (always with remaining/expired)", show_command="first print the bpftool commands that dump the same maps, as '# ' lines")
    p.set_defaults(func=cmd_ct_list)


def cmd_ct_list(args) -> int:
    lab = common.attach(args)
    rows = lab.ct(args.node)
    if args.json:
        now = lab.clock.now()
        if args.show_command:
            for command in lab.ct_command(args.node):
                print(f"# {command}", file=sys.stderr)
        print_json([row.to_json(now) for row in rows])
        return 0
    now = lab.clock.now() if args.remaining else None
    if args.show_command:
        sys.stdout.write("".join(f"# {command}\n" for command in lab.ct_command(args.node)))
    sys.stdout.write(list_text([[r for r in rows if r.map == m] for m in CT_MAPS], now))
    return 0
