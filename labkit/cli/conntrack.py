"""``labkit conntrack``: a node's Linux conntrack rows (kube-proxy's iptables mode)."""
from __future__ import annotations

import sys

from labkit.cli import common
from labkit.cli.common import output_options, print_json

__all__ = ["add_commands", "cmd_conntrack"]


def add_commands(add) -> None:
    """Add the conntrack commands to the parser (``add`` makes a subcommand)."""
    p = add("conntrack", "a node's Linux conntrack rows (`conntrack -L` in its namespace)",
            description="The Linux conntrack entries of NODE's namespace: original and reply tuple, state, "
                        "timeout. In --service-mode iptables they carry the Services' DNAT and masquerade.")
    p.add_argument("node", metavar="NODE", help="the node (node-a, node-b, ...)")
    output_options(p, "a JSON list of rows", show_command="first print the real commands, as '# ' lines")
    p.set_defaults(func=cmd_conntrack)


def cmd_conntrack(args) -> int:
    from dataclasses import asdict

    lab = common.attach(args)
    rows = lab.conntrack(args.node)
    if args.show_command:
        for command in lab.conntrack_command(args.node):
            print(f"# {command}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print_json([asdict(r) for r in rows])
        return 0
    for r in rows:
        print(r.line())
    if not rows:
        print(f"no TCP or UDP conntrack entries in {args.node}")
    return 0
