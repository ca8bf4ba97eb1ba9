"""The ``labkit`` command: bring a lab up, look inside it, take it down.

Shape: ``labkit [--lab NAME] COMMAND …``; the lab is ``demo`` unless
``--lab`` or the environment variable ``LABKIT_LAB`` names another one.
Your labs are yours: another user's ``demo`` is another lab. An instructor
(root, or the group ``labkit-instructors``) may name anyone's lab by its key,
``--lab demo_u1000`` (user 1000's ``demo``; ``labkit list`` shows the keys).

Examples::

    labkit doctor                                   # can this machine run a lab? (sudo: every check)
    labkit daemon status                            # does labkitd answer? (sudo labkit daemon start)
    labkit up                                       # lab 'demo', tunnel routing
    labkit --lab native up --routing native --ct-timeout syn=5 --ct-timeout any=30
    labkit status                                   # nodes, pods, addresses, clock, faults
    labkit list                                     # your labs (an instructor's: every lab), owner, variants
    labkit exec a1 -- ping -c1 198.18.2.11          # run a command inside pod a1, as you
    labkit exec node-a -- ip route                  # ... or inside a node
    labkit ct list node-a                           # like `cilium-dbg bpf ct list global`
    labkit ct list node-a -d                        # ... with the remaining lifetime
    labkit ct list node-a --json --show-command     # ... as JSON / with the bpftool commands
    labkit nat list node-a                          # like `cilium-dbg bpf nat list` (SNAT/DNAT entries)
    labkit service add web --port 80 --backend b1:8080 --backend b2:8080   # a ClusterIP service
    labkit service list                             # services, their VIPs and backends
    labkit service backend web b1:8080 --state terminating
    labkit service backend web a2:8080 --add        # only that service's rows are written
    labkit service apply services.yaml              # many services in one call, as kubectl apply -f
    labkit policy apply web.yaml                    # CiliumNetworkPolicies; the agent writes the policy maps
    labkit policy get a1                            # a1's policy map, like `cilium-dbg bpf policy get`
    labkit fqdn cache list                          # names the DNS proxy learnt, like `cilium-dbg fqdn cache list`
    labkit policy list                              # the policies and the pods each selects
    labkit policy delete web.yaml                   # ... or by name: labkit policy delete web
    labkit identity list                            # like `cilium-dbg identity list`
    labkit agent status                             # the lab's agent: pid, services, what it restored
    labkit agent restart                            # a new agent; the datapath keeps forwarding
    labkit lb list node-a                           # like `cilium service list`, from node-a's maps
    labkit lb list node-a --bpf                     # like `cilium-dbg bpf lb list`
    labkit lb list node-a --raw                     # ... every slot, backend and reverse NAT entry
    labkit trace --last 20                          # the last 20 flows, Hubble style
    labkit trace --follow --node node-b             # new flows of node-b until Ctrl-C
    labkit observe --from-pod a1 --last 10          # what Hubble would show, `hubble observe` style
    labkit observe -o json --verdict DROPPED        # one GetFlowsResponse per line, for jq
    labkit clock advance 120                        # move the lab clock 2 minutes ahead
    labkit clock show --json
    labkit down                                     # remove everything the lab created
    labkit --lab demo_u1000 status                  # an instructor looks at user 1000's lab 'demo'
    labkit grade handin/ --jobs 2 --csv             # re-run handed-in notebooks, one row per learner
    labkit answers 02                               # lab 02's answer key (for instructors)
    labkit work sync                                # make ~/work from labs/; updated labs arrive beside yours
    labkit export --to -                            # your notebooks as a .tar.gz on stdout

Exit status: 0 on success, 1 when labkit reports an error (``labkit: error: …``
on stderr), 2 for a usage error; ``exec`` passes the command's own status
through (127 when the command does not exist).

Every lab command is a client of labkitd, the one root service of the machine
(:mod:`labkit.door`; ``/run/labkitd/labkitd.sock``, or ``$LABKIT_DOOR``): it runs as you,
each thing it asks of a lab is one request to labkitd (:mod:`labkit.client`), and
labkitd does the privileged part — on your own labs only. ``labkit exec`` runs the
command as you too, in the pod's namespace with CAP_NET_RAW and CAP_NET_ADMIN only.
What needs sudo is the machine's: ``labkit daemon run|start|stop`` (labkitd itself) and
the fixes ``labkit doctor`` prints (``sudo labkit doctor`` checks what only root can).
When no labkitd answers, a lab command says so in one line, with how to start it.

``ct list`` and ``nat list`` load the client only (no pyroute2, no BCC), so
they stay quick enough to run in a loop.

    >>> _command_of(["--lab", "demo_u1000", "ct", "list", "node-a"]), _command_of(["--version"])
    ('ct', None)
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

from labkit import __version__
from labkit.cli.common import DEFAULT_LAB, lab_name
from labkit.errors import LabkitError

__all__ = ["main", "build_parser", "COMMANDS", "cmd_nat_list"]

#: Each command → the module of this package that adds it (one module per command group), in the order
#: ``labkit --help`` lists them. A command line loads only its command's module, so a command that talks
#: to the agent (``labkit service backend …``) does not pay for the grader or BCC.
COMMANDS = {"up": "lab", "down": "lab", "cleanup": "lab", "status": "lab", "list": "lab", "doctor": "lab", "exec": "lab",
            "ct": "ct", "nat": "nat", "service": "service", "policy": "policy", "identity": "policy", "fqdn": "fqdn", "lb": "lb", "conntrack": "conntrack", "pod": "pod",
            "gc": "gc", "trace": "trace", "observe": "observe", "clock": "clock", "fault": "fault", "agent": "agent",
            "grade": "grade", "answers": "grade", "work": "work", "export": "work", "daemon": "daemon"}


def __getattr__(name: str):
    if name == "cmd_nat_list":
        from labkit.cli.nat import cmd_nat_list

        return cmd_nat_list
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_EPILOG = "examples:\n" + textwrap.indent(
    textwrap.dedent(__doc__.split("Examples::", 1)[1].split("Exit status", 1)[0]).strip("\n"), "  ")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (the default lab is read from ``LABKIT_LAB`` now): every command, or with
    ``command`` only the group that has it (what :func:`main` builds for a command line)."""
    parser = argparse.ArgumentParser(
        prog="labkit",
        description="Kubernetes nodes and pods as network namespaces, with a Cilium-style eBPF conntrack datapath.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    parser.add_argument(
        "--lab",
        type=lab_name,
        default=os.environ.get("LABKIT_LAB") or DEFAULT_LAB,
        metavar="NAME",
        help=f"the lab to work on: one of yours by name, or (instructors) anyone's by key NAME_u<UID> "
             f"(default: $LABKIT_LAB, else '{DEFAULT_LAB}'; now: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str, description: str | None = None, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help, **kw)
    groups = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for group in groups:
        importlib.import_module(f"{__name__}.{group}").add_commands(add)
    parser._labkit_exec = sub.choices.get("exec")  # for the missing-command error
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The command word of a command line (after ``--lab NAME``), or None (``--help``, ``--version``)."""
    it = iter(argv)
    for word in it:
        if word == "--lab":
            next(it, None)
        elif not word.startswith("-"):
            return word
    return None



# -- entry point ---------------------------------------------------------------
def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def main(argv: list[str] | None = None) -> int:
    """Run ``labkit`` with ``argv`` (default ``sys.argv[1:]``) as the user it is; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
    try:
        args = parser.parse_args(argv)
        if args.command == "exec":
            if args.cmd[:1] == ["--"]:  # some Python versions keep the separator
                args.cmd = args.cmd[1:]
            if not args.cmd:
                parser._labkit_exec.error(
                    f"a command is needed after '--', e.g. labkit exec {args.name} -- ip addr")
    except SystemExit as exc:
        return _exit_code(exc)
    try:
        return args.func(args)
    except LabkitError as exc:
        print(f"labkit: error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        if args.command != "clock":
            raise
        print(f"labkit: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("labkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (labkit trace | head): stop quietly.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 141
