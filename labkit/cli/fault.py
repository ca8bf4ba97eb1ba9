"""``labkit fault``: break-it faults, every one :mod:`labkit.maps.config` defines."""
from __future__ import annotations

from labkit.cli import common
from labkit.maps import config
from labkit.maps.config import AGENT_FAULTS, Fault

__all__ = ["add_commands", "cmd_fault", "cmd_fault_list"]


def add_commands(add) -> None:
    """Add the fault commands to the parser (``add`` makes a subcommand)."""
    fault = add("fault", "break-it faults for diagnosis exercises (always listed by status)").add_subparsers(
        dest="fault_command", metavar="COMMAND", required=True)
    fault_names = Fault.names(sum(Fault)) + sorted(AGENT_FAULTS)
    for verb, help_ in (("on", "switch a fault on (on every node's datapath, or in the agent)"),
                        ("off", "switch a fault off")):
        p = fault.add_parser(verb, help=help_, description=help_)
        p.add_argument("name", metavar="NAME", choices=fault_names, help=", ".join(fault_names))
        p.set_defaults(func=cmd_fault, on=verb == "on")
    p = fault.add_parser("list", help="the faults switched on, then every fault there is",
                         description="The faults switched on; with --all, every fault and what it breaks.")
    p.add_argument("--all", action="store_true", help="every fault labkit has, and what it breaks")
    p.set_defaults(func=cmd_fault_list)


def cmd_fault(args) -> int:
    lab = common.attach(args)
    now_on = lab.fault(args.name, on=args.on)
    print(f"faults on in lab '{lab.name}': {', '.join(now_on) or 'none'}")
    return 0


def cmd_fault_list(args) -> int:
    if args.all:
        for f in Fault:
            print(f"{Fault.names(f)[0]:20} datapath  {_fault_doc(f)}")
        for name, what in sorted(AGENT_FAULTS.items()):
            print(f"{name:20} agent     {what}")
        return 0
    lab = common.attach(args)
    print(", ".join(lab.faults()) or "none")
    return 0


def _fault_doc(fault) -> str:
    """The comment of a Fault member (its line in labkit/maps/config.py)."""
    import inspect


    for line in inspect.getsource(config.Fault).splitlines():
        if line.strip().startswith(f"{fault.name} =") and "#:" in line:
            return line.split("#:", 1)[1].strip()
    return ""
