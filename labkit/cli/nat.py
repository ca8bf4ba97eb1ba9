"""``labkit nat list``: a node's NAT map as ``cilium-dbg bpf nat list`` prints it."""
from __future__ import annotations

import sys

from labkit.cli import common
from labkit.cli.common import output_options, print_json

__all__ = ["add_commands", "cmd_nat_list"]


def add_commands(add) -> None:
    """Add the nat commands to the parser (``add`` makes a subcommand)."""
    nat = add("nat", "the NAT table of a node (SNAT/DNAT for NodePort and DSR)").add_subparsers(
        dest="nat_command", metavar="COMMAND", required=True)
    p = nat.add_parser("list", help="the entries of a node's NAT map, as `cilium-dbg bpf nat list` prints them",
                       description="The entries of NODE's NAT map, cilium_snat_v4_external, in cilium-dbg's "
                                   "grammar (Created= in lab-clock seconds).")
    p.add_argument("node", metavar="NODE", help="the node whose map to read (node-a, node-b, ...)")
    output_options(p, "a JSON list of entries", show_command="first print the bpftool command that dumps the same map, as a '# ' line")
    p.set_defaults(func=cmd_nat_list)


def cmd_nat_list(args) -> int:
    lab = common.attach(args)
    rows = lab.nat(args.node)
    commands = [f"# {command}" for command in lab.nat_command(args.node)] if args.show_command else []
    if args.json:
        for command in commands:
            print(command, file=sys.stderr)
        print_json([row.to_json() for row in rows])
        return 0
    # Cilium prints the map's dump with fmt.Println: a blank line after it
    sys.stdout.write("".join(line + "\n" for line in commands + [row.line() for row in rows]) + "\n")
    return 0
