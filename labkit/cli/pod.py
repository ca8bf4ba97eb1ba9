"""``labkit pod del``: delete a pod as Kubernetes and Cilium would."""
from __future__ import annotations

from labkit.cli import common
from labkit.cli.common import output_options, print_json

__all__ = ["add_commands", "cmd_pod_del"]


def add_commands(add) -> None:
    """Add the pod commands to the parser (``add`` makes a subcommand)."""
    pod = add("pod", "pods of the lab").add_subparsers(dest="pod_command", metavar="COMMAND", required=True)
    p = pod.add_parser("del", help="delete a pod: its endpoints, CT and NAT entries everywhere, its namespace",
                       description="Delete pod NAME as Kubernetes and Cilium would: remove it from every Service, "
                                   "remove its endpoint and ipcache entries, delete every CT and NAT entry naming its "
                                   "address on every node, and remove its server, namespace and veth. "
                                   "`labkit up` brings the default lab back whole.")
    p.add_argument("name", metavar="NAME", help="the pod (a1, b2, ...)")
    output_options(p, "what was removed, as JSON")
    p.set_defaults(func=cmd_pod_del)


def cmd_pod_del(args) -> int:
    lab = common.attach(args)
    gone = lab.delete_pod(args.name)
    if args.json:
        print_json(gone)
        return 0
    print(f"pod {gone['pod']} ({gone['ip']}) deleted from lab {lab.name}")
    print(f"  service endpoints removed: {', '.join(gone['backends']) or 'none'}")
    for node in gone["ct"]:
        print(f"  {node}: {gone['ct'][node]} CT and {gone['nat'][node]} NAT entries naming {gone['ip']} deleted")
    return 0
