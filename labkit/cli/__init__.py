"""The ``labkit`` command: bring a lab up, look inside it, take it down.

Shape: ``labkit [--lab NAME] COMMAND …``; the lab is ``demo`` unless
``--lab`` or the environment variable ``LABKIT_LAB`` names another one.

Examples::

    labkit doctor                                   # can this machine run a lab?
    labkit up                                       # lab 'demo', tunnel routing
    labkit --lab native up --routing native --ct-timeout syn=5 --ct-timeout any=30
    labkit status                                   # nodes, pods, addresses, clock, faults
    labkit list                                     # every lab here, its variants, what it holds
    labkit exec a1 -- ping -c1 198.18.2.11          # run a command inside pod a1
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
    labkit grade handin/ --jobs 2 --csv             # re-run handed-in notebooks, one row per learner
    labkit answers 02                               # lab 02's answer key (for instructors)
    labkit work sync                                # make ~/work from labs/; updated labs arrive beside yours
    labkit export --to -                            # your notebooks as a .tar.gz on stdout

Exit status: 0 on success, 1 when labkit reports an error (``labkit: error: …``
on stderr), 2 for a usage error; ``exec`` passes the command's own status
through (127 when the command does not exist).

Run as another user than root, a command that needs root (all but ``work``, ``export`` and
``answers``) runs itself again with ``sudo`` (the VM's ``vagrant`` user has it without a password), so
the hints ``labkit up`` prints work as printed; without sudo it stops with one line saying so.

``ct list`` and ``nat list`` import :mod:`labkit.lab` only (no pyroute2, no
BCC), so they stay quick enough to run in a loop.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import textwrap

import importlib

from labkit import __version__
from labkit.cli.common import DEFAULT_LAB, CliError, lab_name
from labkit.errors import LabkitError

__all__ = ["main", "build_parser", "COMMANDS", "ROOT_FREE", "sudo_argv", "cmd_nat_list"]

#: Each command → the module of this package that adds it (one module per command group), in the order
#: ``labkit --help`` lists them. A command line loads only its command's module, so a command that talks
#: to the agent (``labkit service backend …``) does not pay for the lab, the grader or BCC.
COMMANDS = {"up": "lab", "down": "lab", "cleanup": "lab", "status": "lab", "list": "lab", "doctor": "lab", "exec": "lab",
            "ct": "ct", "nat": "nat", "service": "service", "policy": "policy", "identity": "policy", "fqdn": "fqdn", "lb": "lb", "conntrack": "conntrack", "pod": "pod",
            "gc": "gc", "trace": "trace", "observe": "observe", "clock": "clock", "fault": "fault", "agent": "agent",
            "grade": "grade", "answers": "grade", "work": "work", "export": "work"}

#: The commands that need no root: they read the repo or the learner's own files. Every other one drives
#: namespaces, BPF or a lab's root-only state.
ROOT_FREE = frozenset({"work", "export", "answers"})


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
        help=f"the lab to work on (default: $LABKIT_LAB, else '{DEFAULT_LAB}'; now: %(default)s)",
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



# -- root ----------------------------------------------------------------------
def sudo_argv(command: str | None, argv: list[str], *, euid: int | None = None, which=None,
              environ: dict | None = None, python: str | None = None, script: str | None = None) -> list[str] | None:
    """The command line that runs ``labkit ARGV`` again as root through sudo, or None when this one may go on
    (already root, or ``command`` needs no root). Keeps ``LABKIT_*`` and ``PYTHONPATH``, which sudo drops.
    Runs the ``labkit`` script itself (``script``, default ``sys.argv[0]``), not ``python -m labkit``: ``-m``
    puts the working directory first on sys.path, and in the VM's home ``~/labkit`` (the repo, no
    ``__init__.py``) would then shadow the installed package. Raises :class:`CliError` when root is needed
    and sudo is not installed.

        >>> sudo_argv("ct", ["ct", "list", "node-a"], euid=1000, which=lambda name: "/usr/bin/sudo",
        ...           environ={"LABKIT_LAB": "x", "HOME": "/home/vagrant"}, python="/opt/labkit/venv/bin/python",
        ...           script="/opt/labkit/venv/bin/labkit")
        ['/usr/bin/sudo', '--', '/usr/bin/env', 'LABKIT_LAB=x', '/opt/labkit/venv/bin/python', '/opt/labkit/venv/bin/labkit', 'ct', 'list', 'node-a']
        >>> sudo_argv("work", ["work", "sync"], euid=1000, which=lambda name: None) is None
        True
    """
    euid = os.geteuid() if euid is None else euid
    if euid == 0 or command is None or command in ROOT_FREE:
        return None
    sudo = (which or shutil.which)("sudo")
    if not sudo:
        raise CliError(f"`labkit {command}` needs root (network namespaces and BPF) and sudo is not installed: "
                       f"run it as root (su -c 'labkit {' '.join(argv)}')")
    environ = os.environ if environ is None else environ
    keep = [f"{k}={v}" for k, v in sorted(environ.items()) if k.startswith("LABKIT_") or k == "PYTHONPATH"]
    return [sudo, "--", "/usr/bin/env", *keep, python or sys.executable, os.path.abspath(script or sys.argv[0]), *argv]


# -- entry point ---------------------------------------------------------------
def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def main(argv: list[str] | None = None) -> int:
    """Run ``labkit`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status. From the command line
    (``argv`` None) a command that needs root runs itself again with sudo (:func:`sudo_argv`)."""
    from_command_line = argv is None
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
        again = sudo_argv(args.command, argv) if from_command_line else None
        if again is not None:
            sys.stdout.flush()
            os.execv(again[0], again)
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
