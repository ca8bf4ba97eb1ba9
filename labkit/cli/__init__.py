"""The ``labkit`` command: bring a lab up, look inside it, take it down.

Shape: ``labkit [--lab NAME] COMMAND …``; the lab is ``demo`` unless
``--lab`` or the environment variable ``LABKIT_LAB`` names another one.

Examples::

    labkit doctor                                   # can this machine run a lab?
    labkit up                                       # lab 'demo', tunnel routing
    labkit --lab native up --routing native --ct-timeout syn=5 --ct-timeout any=30
    labkit status                                   # nodes, pods, addresses, clock, faults
    labkit exec a1 -- ping -c1 198.18.2.11          # run a command inside pod a1
    labkit exec node-a -- ip route                  # ... or inside a node
    labkit ct list node-a                           # like `cilium-dbg bpf ct list global`
    labkit ct list node-a -d                        # ... with the remaining lifetime
    labkit ct list node-a --json --show-command     # ... as JSON / with the bpftool commands
    labkit nat list node-a                          # like `cilium-dbg bpf nat list` (SNAT/DNAT entries)
    labkit service add web --port 80 --backend b1:8080 --backend b2:8080   # a ClusterIP service
    labkit service list                             # services, their VIPs and backends
    labkit service backend web b1:8080 --state terminating
    labkit lb list node-a                           # like `cilium service list`, from node-a's maps
    labkit lb list node-a --bpf                     # like `cilium-dbg bpf lb list`
    labkit lb list node-a --raw                     # ... every slot, backend and reverse NAT entry
    labkit trace --last 20                          # the last 20 flows, Hubble style
    labkit trace --follow --node node-b             # new flows of node-b until Ctrl-C
    labkit clock advance 120                        # move the lab clock 2 minutes ahead
    labkit clock show --json
    labkit down                                     # remove everything the lab created
    labkit grade handin/ --jobs 2 --csv             # re-run handed-in notebooks, one row per learner
    labkit answers 02                               # lab 02's answer key (for instructors)

Exit status: 0 on success, 1 when labkit reports an error (``labkit: error: …``
on stderr), 2 for a usage error; ``exec`` passes the command's own status
through (127 when the command does not exist).

``ct list`` and ``nat list`` import :mod:`labkit.lab` only (no pyroute2, no
BCC), so they stay quick enough to run in a loop.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import textwrap
import time
from collections import Counter
from dataclasses import fields

from labkit import __version__
from labkit.agent.services.model import ALGORITHMS, PROTOCOLS, SERVICE_TYPES, STATES, TRAFFIC_POLICIES
from labkit.config import LB_MODES, MAGLEV_TABLE_SIZES, ROUTING_MODES, SERVICE_MODES, SOCKET_LB_MODES, CtTimeouts
from labkit.errors import LabkitError
from labkit.maps.ct import CT_MAPS, list_text
from labkit.release import DEFAULT_RELEASE, RELEASES, profile
from labkit.agent.gc import SCAN_MODES
from labkit.maps.config import AGENT_FAULTS, Fault

__all__ = ["main", "build_parser", "ON_OFF"]

#: The values of a switch on the command line.
ON_OFF = ("on", "off")

DEFAULT_LAB = "demo"
_LAB_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")  # the rule of Topology.validate
_TIMEOUT_NAMES = tuple(f.name for f in fields(CtTimeouts))
_TRACE_LAST = 50
_EPILOG = "examples:\n" + textwrap.indent(
    textwrap.dedent(__doc__.split("Examples::", 1)[1].split("Exit status", 1)[0]).strip("\n"), "  ")
_POLL = 0.05


# -- argument types ------------------------------------------------------------
def _lab_name(value: str) -> str:
    if not _LAB_NAME.match(value):
        raise argparse.ArgumentTypeError(
            f"lab name {value!r}: expected 1-24 characters of a-z, 0-9 and '-', starting with a letter or digit"
        )
    return value


def _ct_timeout(value: str) -> tuple[str, int]:
    """``NAME=SECONDS`` → ``(NAME, SECONDS)``."""
    name, sep, seconds = value.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or name not in _TIMEOUT_NAMES:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected NAME=SECONDS with NAME one of {', '.join(_TIMEOUT_NAMES)}"
        )
    try:
        secs = int(seconds.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: SECONDS must be a whole number, got {seconds!r}") from None
    if not 1 <= secs <= 2**31:
        raise argparse.ArgumentTypeError(f"{value!r}: SECONDS must be from 1 to 2^31, got {secs}")
    return name, secs


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {n}")
    return n


def _port(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {n}")
    return n


# -- parser --------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser (the default lab is read from ``LABKIT_LAB`` now)."""
    parser = argparse.ArgumentParser(
        prog="labkit",
        description="Kubernetes nodes and pods as network namespaces, with a Cilium-style eBPF conntrack datapath.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    parser.add_argument(
        "--lab",
        type=_lab_name,
        default=os.environ.get("LABKIT_LAB") or DEFAULT_LAB,
        metavar="NAME",
        help=f"the lab to work on (default: $LABKIT_LAB, else '{DEFAULT_LAB}'; now: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str, description: str | None = None, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help, **kw)

    p = add("up", "bring the lab up (attach to it if it is already up with the same options)")
    p.add_argument("--routing", choices=ROUTING_MODES, default=None,
                   help="how pod traffic crosses nodes: VXLAN tunnel (default) or native routing")
    p.add_argument("--socket-lb", choices=SOCKET_LB_MODES, default=None,
                   help="socket-level LB at connect(): off, hostns (nodes only, default) or full (pods too)")
    p.add_argument("--ct-timeout", type=_ct_timeout, action="append", default=[], metavar="NAME=SECONDS",
                   help=f"set a CT lifetime, repeatable; NAME is one of {', '.join(_TIMEOUT_NAMES)}")
    p.add_argument("--lb-mode", choices=LB_MODES, default=None,
                   help="how a node hands outside traffic to a backend on another node: dsr (default: the "
                        "backend's node answers the client), snat (the reply comes back through the node) or "
                        "hybrid (DSR for TCP, SNAT for UDP)")
    p.add_argument("--service-mode", choices=SERVICE_MODES, default=None,
                   help="where Services live: ebpf (default, the cilium_lb4_* maps) or iptables (kube-proxy's nat "
                        "table in every node, Linux conntrack; the BPF programs still track pod traffic)")
    p.add_argument("--cilium", choices=RELEASES, default=None,
                   help=f"the Cilium release whose behaviour and output the lab reproduces (default "
                        f"{DEFAULT_RELEASE}); `labkit status` lists what differs")
    p.add_argument("--ct-accounting", choices=ON_OFF, default=None,
                   help="count packets and bytes in CT entries (default off, as on a node: every row then "
                        "reads Packets=0 Bytes=0)")
    p.add_argument("--maglev-table-size", type=int, choices=MAGLEV_TABLE_SIZES, default=None, metavar="M",
                   help=f"slots of each Maglev table, a prime from {MAGLEV_TABLE_SIZES[0]} (fits on a screen) to "
                        f"{MAGLEV_TABLE_SIZES[-1]}; default 16381, Cilium's")
    p.set_defaults(func=cmd_up)

    p = add("down", "remove everything the lab created, then check that nothing is left")
    p.set_defaults(func=cmd_down)

    p = add("cleanup", "tear down a lab whose process died (same as down; works with a broken lab.json)")
    p.set_defaults(func=cmd_down)

    p = add("status", "nodes, pods and addresses, datapath options, clock, faults and health")
    p.add_argument("--json", action="store_true", help="print Lab.status() as JSON")
    p.set_defaults(func=cmd_status)

    p = add("doctor", "check whether this machine can run a lab (exit 1 if a check fails)")
    p.add_argument("--json", action="store_true", help="print the checks as a JSON list")
    p.set_defaults(func=cmd_doctor)

    p = add("exec", "run a command inside a pod, node or external client: exec NAME -- CMD [ARG…]",
            usage="labkit exec [-h] NAME -- CMD [ARG ...]")
    p.add_argument("name", metavar="NAME", help="a pod (a1), node (node-a) or external client (ext)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments, after --")
    p.set_defaults(func=cmd_exec)

    ct = add("ct", "connection tracking tables of a node").add_subparsers(
        dest="ct_command", metavar="COMMAND", required=True)
    p = ct.add_parser("list", help="the rows of a node's CT maps, as `cilium-dbg bpf ct list global` prints them",
                      description="The rows of both CT maps of NODE (TCP first), in cilium-dbg's grammar.")
    p.add_argument("node", metavar="NODE", help="the node whose maps to read (node-a, node-b, ...)")
    p.add_argument("-d", dest="remaining", action="store_true",
                   help="add the remaining lifetime on the lab clock, as cilium-dbg's -d does")
    p.add_argument("--json", action="store_true", help="a JSON list of rows (always with remaining/expired)")
    p.add_argument("--show-command", action="store_true",
                   help="first print the bpftool commands that dump the same maps, as '# ' lines")
    p.set_defaults(func=cmd_ct_list)

    nat = add("nat", "the NAT table of a node (SNAT/DNAT for NodePort and DSR)").add_subparsers(
        dest="nat_command", metavar="COMMAND", required=True)
    p = nat.add_parser("list", help="the entries of a node's NAT map, as `cilium-dbg bpf nat list` prints them",
                       description="The entries of NODE's NAT map, cilium_snat_v4_external, in cilium-dbg's "
                                   "grammar (Created= in lab-clock seconds).")
    p.add_argument("node", metavar="NODE", help="the node whose map to read (node-a, node-b, ...)")
    p.add_argument("--json", action="store_true", help="a JSON list of entries")
    p.add_argument("--show-command", action="store_true",
                   help="first print the bpftool command that dumps the same map, as a '# ' line")
    p.set_defaults(func=cmd_nat_list)

    svc = add("service", "services (ClusterIP, NodePort, LoadBalancer): what the agent writes into every "
                         "node's LB maps").add_subparsers(
        dest="service_command", metavar="COMMAND", required=True)
    p = svc.add_parser("add", help="add a service and write it to every node",
                       description="Add a service NAME (ClusterIP, NodePort or LoadBalancer) with its backends "
                                   "and write every frontend to every node's cilium_lb4_* maps (backends, slots, reverse NAT, then the head).")
    p.add_argument("name", metavar="NAME", help="the service name (a DNS label: web, api, ...)")
    p.add_argument("--port", type=_port, required=True, metavar="P", help="the service port (1-65535)")
    p.add_argument("--backend", action="append", default=[], metavar="POD:PORT",
                   help="a backend pod and its port, repeatable (none: the service drops its traffic)")
    p.add_argument("--vip", metavar="IP", help="the ClusterIP, from 198.19.0.0/16 (default: the next free from 198.19.0.10)")
    p.add_argument("--protocol", type=str.upper, choices=PROTOCOLS, default="TCP", help="L4 protocol (default TCP)")
    p.add_argument("--affinity", type=_count, default=0, metavar="SECONDS",
                   help="session affinity (ClientIP) timeout in seconds (default 0: none)")
    p.add_argument("--type", dest="svc_type", default="ClusterIP", choices=SERVICE_TYPES,
                   help="ClusterIP (default); NodePort adds a frontend NODE-IP:NODE-PORT per node; "
                        "LoadBalancer adds to those LB-VIP:PORT")
    p.add_argument("--node-port", type=int, metavar="N",
                   help="NodePort/LoadBalancer: the node port, 30000-32767 (default: the next free from 30000)")
    p.add_argument("--lb-vip", metavar="IP",
                   help="LoadBalancer: the VIP, from 203.0.113.0/24 (default: the next free from 203.0.113.10)")
    p.add_argument("--etp", choices=TRAFFIC_POLICIES, default="Cluster",
                   help="externalTrafficPolicy of the NodePort/LoadBalancer frontends: Cluster (default, any "
                        "backend) or Local (only backends on the node the client reached; none there: drop)")
    p.add_argument("--algorithm", choices=ALGORITHMS, default="random",
                   help="how a new flow picks its backend: random (default) or maglev (a table per frontend "
                        "in cilium_lb4_maglev; `labkit lb maglev NAME` shows it)")
    p.set_defaults(func=cmd_service_add)
    p = svc.add_parser("del", help="remove a service from every node",
                       description="Remove service NAME from every node (head first, then slots, reverse NAT, backends).")
    p.add_argument("name", metavar="NAME", help="the service to remove")
    p.set_defaults(func=cmd_service_del)
    p = svc.add_parser("list", help="the services of the lab, their VIPs and backends",
                       description="The services the agent knows, with VIP, port, protocol, id and backends.")
    p.add_argument("--json", action="store_true", help="a JSON list of services")
    p.set_defaults(func=cmd_service_list)
    p = svc.add_parser("backend", help="mark a backend active or terminating",
                       description="Set the state of backend POD:PORT of service NAME; a terminating backend moves "
                                   "after the head's count, so it gets no new connections.")
    p.add_argument("name", metavar="NAME", help="the service")
    p.add_argument("backend", metavar="POD:PORT", help="one of its backends")
    p.add_argument("--state", required=True, choices=STATES, help="the new state")
    p.set_defaults(func=cmd_service_backend)

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
    p.add_argument("--json", action="store_true", help="as JSON")
    p.add_argument("--show-command", action="store_true",
                   help="first print the bpftool commands that dump the same maps, as '# ' lines")
    p.set_defaults(func=cmd_lb_list)

    p = lb.add_parser("maglev", help="a service's Maglev tables as the BPF map holds them, checked against "
                                     "labkit's own computation",
                      description="For each frontend of service NAME on NODE: the table in cilium_lb4_maglev "
                                  "(read through its inner map), how many slots each backend holds, and whether "
                                  "it equals the table labkit.maglev.lookup_table computes.")
    p.add_argument("name", metavar="NAME", help="a service added with --algorithm maglev")
    p.add_argument("--node", metavar="NODE", default=None, help="whose map to read (default: the first node)")
    p.add_argument("--slots", action="store_true", help="also print every slot's backend id, 16 to a line")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_lb_maglev)

    p = add("conntrack", "a node's Linux conntrack rows (`conntrack -L` in its namespace)",
            description="The Linux conntrack entries of NODE's namespace: original and reply tuple, state, "
                        "timeout. In --service-mode iptables they carry the Services' DNAT and masquerade.")
    p.add_argument("node", metavar="NODE", help="the node (node-a, node-b, ...)")
    p.add_argument("--json", action="store_true", help="a JSON list of rows")
    p.add_argument("--show-command", action="store_true", help="first print the real commands, as '# ' lines")
    p.set_defaults(func=cmd_conntrack)

    pod = add("pod", "pods of the lab").add_subparsers(dest="pod_command", metavar="COMMAND", required=True)
    p = pod.add_parser("del", help="delete a pod: its endpoints, CT and NAT entries everywhere, its namespace",
                       description="Delete pod NAME as Kubernetes and Cilium would: remove it from every Service, "
                                   "remove its endpoint and ipcache entries, delete every CT and NAT entry naming its "
                                   "address on every node, and remove its server, namespace and veth. "
                                   "`labkit up` brings the default lab back whole.")
    p.add_argument("name", metavar="NAME", help="the pod (a1, b2, ...)")
    p.add_argument("--json", action="store_true", help="what was removed, as JSON")
    p.set_defaults(func=cmd_pod_del)

    gc = add("gc", "the CT garbage collector: delete expired entries now, or see its timer").add_subparsers(
        dest="gc_command", metavar="COMMAND", required=True)
    p = gc.add_parser("run", help="collect every node's CT maps now, as the agent's GC does",
                      description="Delete every CT entry whose lifetime is below the lab clock's now (and the NAT "
                                  "entries of a deleted OUT entry: its SNAT pair, or a DSRInternal entry's NAT "
                                  "entry), on every node; print what each map read and deleted, the time taken and "
                                  "the next interval.")
    p.add_argument("--mode", choices=SCAN_MODES, default=None,
                   help="per-entry: one lookup per entry and one delete per expired entry (v1.16); batch: "
                        "BPF_MAP_LOOKUP_BATCH and DELETE_BATCH (1.18+); default: the lab's release's")
    p.add_argument("--json", action="store_true", help="the run as JSON")
    p.set_defaults(func=cmd_gc_run)
    p = gc.add_parser("status", help="the interval, the last run and the timer",
                      description="The GC's current interval, when it last ran (lab clock), whether its timer is on, "
                                  "and its last runs.")
    p.add_argument("--json", action="store_true", help="the state and history as JSON")
    p.set_defaults(func=cmd_gc_status)
    p = gc.add_parser("timer", help="switch the GC timer on or off",
                      description="Switch the lab's GC timer on or off (off: only `gc run` collects).")
    p.add_argument("state", choices=ON_OFF)
    p.set_defaults(func=cmd_gc_timer)

    p = add("trace", "flows seen by the datapath hooks, Hubble style")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new flows until Ctrl-C")
    p.add_argument("--json", action="store_true", help="one JSON object per flow per line")
    p.add_argument("--node", metavar="NODE", help="only flows of this node")
    p.add_argument("--last", type=_count, default=None, metavar="N",
                   help=f"print the last N flows first (default: {_TRACE_LAST}; 0 with --follow)")
    p.set_defaults(func=cmd_trace)

    clock = add("clock", "the lab clock that CT lifetimes are measured on").add_subparsers(
        dest="clock_command", metavar="COMMAND", required=True)
    p = clock.add_parser("advance", help="move the lab clock forward by SECONDS (so CT entries expire)",
                         description="Move the lab clock forward by SECONDS on every node.")
    p.add_argument("seconds", type=int, metavar="SECONDS", help="whole seconds >= 0")
    p.set_defaults(func=cmd_clock_advance)
    p = clock.add_parser("show", help="the lab clock now and its offset from CLOCK_MONOTONIC",
                         description="The lab clock now and its offset from CLOCK_MONOTONIC.")
    p.add_argument("--json", action="store_true", help="print now, offset and mono as JSON")
    p.set_defaults(func=cmd_clock_show)

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

    from labkit.cli.grade import add_commands as add_grade_commands

    add_grade_commands(add)  # grade, answers

    parser._labkit_exec = sub.choices["exec"]  # for the missing-command error
    return parser


# -- helpers -------------------------------------------------------------------
class _CliError(LabkitError):
    """An error the command line itself found."""


def _attach(args):
    from labkit.lab import Lab

    try:
        return Lab.attach(args.lab)
    except LabkitError:
        raise
    except (ValueError, KeyError, TypeError) as exc:  # lab.json unreadable (e.g. half-written)
        raise _CliError(
            f"lab '{args.lab}': its state file is unreadable ({type(exc).__name__}: {exc}); "
            f"`labkit --lab {args.lab} cleanup` removes what it created"
        ) from None


def _print_json(data) -> None:
    print(json.dumps(data, indent=2))


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


# -- commands ------------------------------------------------------------------
def cmd_up(args) -> int:
    from labkit.config import DatapathConfig
    from labkit.lab import Lab

    changes = {}
    if args.routing is not None:
        changes["routing"] = args.routing
    if args.socket_lb is not None:
        changes["socket_lb"] = args.socket_lb
    if args.ct_timeout:
        changes["timeouts"] = dict(args.ct_timeout)
    if args.lb_mode is not None:
        changes["lb_mode"] = args.lb_mode
    if args.maglev_table_size is not None:
        changes["maglev_table_size"] = args.maglev_table_size
    if args.service_mode is not None:
        changes["service_mode"] = args.service_mode
    if args.cilium is not None:
        changes["cilium"] = args.cilium
    if args.ct_accounting is not None:
        changes["ct_accounting"] = args.ct_accounting == "on"
    config = DatapathConfig().with_options(**changes)
    print(f"bringing up lab {args.lab} ({config.routing} routing) ...", flush=True)
    t0 = time.time()
    lab = Lab.up(args.lab, config=config)
    took = time.time() - t0
    created = getattr(lab, "_state", {}).get("created")
    reused = isinstance(created, (int, float)) and created < t0
    topo = lab.topology
    print(f"lab {lab.name} is up: {lab.config.routing} routing, LB mode {lab.config.lb_mode}, "
          f"{'already running, attached' if reused else 'built'} in {took:.1f} s")
    changed = {k: v for k, v in vars(lab.config.timeouts).items() if getattr(CtTimeouts(), k) != v}
    if changed:
        print("CT timeouts: " + ", ".join(f"{k}={v}s" for k, v in changed.items()) + " (others default)")
    print("nodes:")
    for row in _table([[n.name, n.ip, f"pod CIDR {n.pod_cidr}"] for n in topo.nodes]):
        print(f"  {row}")
    print("pods:")
    for row in _table([[p.name, p.ip, f"on {p.node}"] for p in topo.pods]):
        print(f"  {row}")
    if topo.externals:
        print("external clients:")
        for row in _table([[e.name, e.ip] for e in topo.externals]):
            print(f"  {row}")
    print("try next:")
    if topo.pods:
        src = topo.pods[0]
        dst = next((p for p in topo.pods if p.node != src.node), topo.pods[-1])
        print(f"  labkit --lab {lab.name} exec {src.name} -- ping -c1 {dst.ip}")
        print(f"  labkit --lab {lab.name} ct list {src.node}")
    print(f"  labkit --lab {lab.name} status")
    print(f"  labkit --lab {lab.name} down")
    return 0


def cmd_down(args) -> int:
    from labkit.lab import Lab

    removed = Lab.cleanup(args.lab)
    if removed:
        counts = Counter(removed)
        print(f"lab {args.lab}: removed " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())))
    else:
        print(f"lab {args.lab}: nothing was recorded to remove")
    print(f"nothing of lab {args.lab} is left")
    return 0


def cmd_status(args) -> int:
    lab = _attach(args)
    st = lab.status()
    if args.json:
        _print_json(st)
        return 0
    timeouts = st["datapath"].get("timeouts", {})
    clock = st["clock"]
    head = [
        ["lab", f"{st['lab']} ({st['status']})"],
        ["routing", st["routing"]],
        ["socket LB", st.get("socket_lb", "-")],
        ["services", f"{st['datapath'].get('service_mode', 'ebpf')} "
                     f"({'kube-proxy nat table, Linux conntrack' if st['datapath'].get('service_mode') == 'iptables' else 'cilium_lb4_* maps'})"],
        ["LB mode", f"{st['datapath'].get('lb_mode', '-')} (Maglev tables of "
                    f"{st['datapath'].get('maglev_table_size', '-')} slots)"],
        ["Cilium", f"{st['datapath'].get('cilium', DEFAULT_RELEASE)} behaviour and output"],
        ["CT accounting", "on (Packets/Bytes counted)" if st["datapath"].get("ct_accounting")
                          else "off (as on a node: Packets=0 Bytes=0)"],
        ["clock", f"now {clock['now']} (offset {clock['offset']} s)"],
        ["CT GC", st.get("gc", "-")],
        ["faults", ", ".join(st["faults"]) or "none"],
        ["CT timeouts", " ".join(f"{k}={v}" for k, v in timeouts.items()) + " (seconds)"],
        ["CT map sizes", f"tcp {st['datapath'].get('ct_tcp_size')}, any {st['datapath'].get('ct_any_size')}"],
    ]
    for row in _table(head):
        print(row)
    print()
    rows = [["NAME", "KIND", "ADDRESS", "WHERE", "NETNS"]]
    for n in st["nodes"]:
        rows.append([n["name"], "node", n["ip"], f"pods {n['pod_cidr']} via {n['router_ip']}", n["netns"]])
    for p in st["pods"]:
        rows.append([p["name"], "pod", p["ip"], f"on {p['node']} ({p['host_veth']}, identity {p['identity']})",
                     p["netns"]])
    for e in st["externals"]:
        rows.append([e["name"], "external", e["ip"], "underlay", e["netns"]])
    for row in _table(rows):
        print(row)
    print()
    release = st["datapath"].get("cilium", DEFAULT_RELEASE)
    print(f"Cilium {release}: behaviours that changed between the releases labkit reproduces:")
    for line in profile(release).lines():
        print(textwrap.fill(line, width=100, initial_indent="  ", subsequent_indent="      "))
    print()
    print("where the lab differs from Cilium:")
    for diff in st["lab_differences"]:
        print(textwrap.fill(diff, width=100, initial_indent="  - ", subsequent_indent="    "))
    if st["health"]:
        print()
        print(f"health problems ({len(st['health'])}); `labkit --lab {st['lab']} up` rebuilds the lab:")
        for problem in st["health"]:
            print(f"  - {problem}")
    else:
        print("health: ok")
    return 0


def cmd_doctor(args) -> int:
    from labkit.datapath.doctor import format_checks, run_checks

    checks = run_checks()
    if args.json:
        _print_json([c.to_json() for c in checks])
    else:
        print(format_checks(checks))
    return 0 if all(c.ok for c in checks) else 1


def cmd_exec(args) -> int:
    from labkit.net import netns as _netns

    lab = _attach(args)
    netns = lab.topology.netns(args.name)  # NotFoundError lists the names
    cgroup = lab.cgroup(args.name) if lab.topology.kind_of(args.name) == "pod" else None
    cmd = args.cmd
    try:
        _netns.enter_process(netns, cgroup)
    except FileNotFoundError as exc:
        raise _CliError(f"{args.name}: network namespace {netns} or its cgroup is gone ({exc.filename}); "
                     f"`labkit --lab {lab.name} up` rebuilds the lab")
    except PermissionError as exc:
        raise _CliError(f"{args.name}: cannot enter {netns} ({exc.strerror}); run labkit as root")
    sys.stdout.flush()
    sys.stderr.flush()
    # Python ignores SIGPIPE and SIGXFSZ; the command should get the defaults back.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(cmd[0], cmd)
    except FileNotFoundError:
        print(f"labkit: error: {cmd[0]}: command not found in {args.name}", file=sys.stderr)
        return 127
    except PermissionError as exc:
        print(f"labkit: error: {cmd[0]}: cannot run ({exc.strerror})", file=sys.stderr)
        return 126
    except OSError as exc:
        print(f"labkit: error: {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    return 0  # not reached


def cmd_ct_list(args) -> int:
    lab = _attach(args)
    rows = lab.ct(args.node)
    if args.json:
        now = lab.clock.now()
        if args.show_command:
            for command in lab.ct_command(args.node):
                print(f"# {command}", file=sys.stderr)
        _print_json([row.to_json(now) for row in rows])
        return 0
    now = lab.clock.now() if args.remaining else None
    if args.show_command:
        sys.stdout.write("".join(f"# {command}\n" for command in lab.ct_command(args.node)))
    sys.stdout.write(list_text([[r for r in rows if r.map == m] for m in CT_MAPS], now))
    return 0


def cmd_nat_list(args) -> int:
    lab = _attach(args)
    rows = lab.nat(args.node)
    commands = [f"# {command}" for command in lab.nat_command(args.node)] if args.show_command else []
    if args.json:
        for command in commands:
            print(command, file=sys.stderr)
        _print_json([row.to_json() for row in rows])
        return 0
    # Cilium prints the map's dump with fmt.Println: a blank line after it
    sys.stdout.write("".join(line + "\n" for line in commands + [row.line() for row in rows]) + "\n")
    return 0


def _last_flows(log, n: int, node: str | None) -> list:
    """The last ``n`` flows (of ``node``) in time order, reading only the end of a long log."""
    from labkit.observe.trace import EVENT_SIZE

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
    lab = _attach(args)
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
                raise _CliError(f"lab '{lab.name}' went down while following its trace")
            time.sleep(_POLL)
    except KeyboardInterrupt:
        return 0


def _service_line(svc) -> str:
    bes = ", ".join(f"{b.ref} ({b.state})" for b in svc.backends) or "none"
    return f"{svc.frontend} id {svc.id}, backends {bes}"


def cmd_service_add(args) -> int:
    lab = _attach(args)
    svc = lab.services.add(args.name, args.port, args.backend, vip=args.vip, protocol=args.protocol,
                           affinity=args.affinity, type=args.svc_type, node_port=args.node_port,
                           lb_vip=args.lb_vip, etp=args.etp, algorithm=args.algorithm)
    print(f"service {svc.name} added on every node: {_service_line(svc)}")
    for fe in svc.frontends[1:]:
        print(f"  {fe.type} frontend {fe.l4(svc.protocol)} id {fe.id}")
    if svc.affinity_timeout:
        print(f"session affinity: {svc.affinity_timeout} s")
    if svc.type != "ClusterIP":
        print(f"externalTrafficPolicy: {svc.etp}")
    node = lab.topology.nodes[0].name
    print("try next:")
    print(f"  labkit --lab {lab.name} lb list {node}")
    print(f"  labkit --lab {lab.name} lb list {node} --raw")
    if svc.algorithm == "maglev":
        print(f"  labkit --lab {lab.name} lb maglev {svc.name}")
    return 0


def cmd_service_del(args) -> int:
    lab = _attach(args)
    svc = lab.services.get(args.name)
    lab.services.remove(args.name)
    more = f", and {len(svc.frontends) - 1} more frontends" if len(svc.frontends) > 1 else ""
    print(f"service {svc.name} ({svc.frontend}, id {svc.id}{more}) removed from every node")
    return 0


def cmd_service_list(args) -> int:
    lab = _attach(args)
    services = lab.services.list()
    if args.json:
        _print_json([s.to_json(lab.topology) for s in services])
        return 0
    if not services:
        print(f"no services in lab {lab.name}; add one with `labkit --lab {lab.name} service add NAME --port P "
              f"--backend POD:PORT`")
        return 0
    rows = [["NAME", "TYPE", "VIP", "PORT", "PROTOCOL", "ID", "NODEPORT", "LB-VIP", "BACKENDS"]]
    for s in services:
        bes = ", ".join(f"{b.ref} ({b.state})" for b in s.backends) or "none"
        rows.append([s.name, s.type, s.vip, str(s.port), s.protocol, str(s.id), str(s.node_port or "-"),
                     s.lb_vip or "-", bes])
    for row in _table(rows):
        print(row)
    return 0


def cmd_service_backend(args) -> int:
    lab = _attach(args)
    svc = lab.services.set_backend_state(args.name, args.backend, args.state)
    print(f"service {svc.name}: {_service_line(svc)}")
    return 0


def cmd_lb_list(args) -> int:
    lab = _attach(args)
    snap = lab.services.lb(args.node)
    if args.show_command:
        for command in lab.services.lb_command(args.node):
            print(f"# {command}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        _print_json(snap.bpf_json() if args.bpf else snap.raw_json() if args.raw else snap.to_json())
        return 0
    if args.raw:
        sys.stdout.write("\n".join(snap.raw_lines()) + "\n")
    else:  # Go's tabwriter output as it is: every line padded, trailing spaces kept
        sys.stdout.write(snap.bpf_text() if args.bpf else snap.text())
    return 0


def cmd_lb_maglev(args) -> int:
    from labkit.maglev import shares

    lab = _attach(args)
    node = args.node or lab.topology.nodes[0].name
    svc = lab.services.get(args.name)
    tables = lab.services.maglev(args.name, node)
    by_id = {b.id: b for b in svc.backends}
    if args.json:
        _print_json([{"frontend": fe.l4(svc.protocol), "id": fe.id, "node": node,
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
            print(f"{fe.type} {fe.l4(svc.protocol)} id {fe.id}: no table in the map"
                  + ("" if want is None else " (one was expected!)"))
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


def cmd_conntrack(args) -> int:
    from dataclasses import asdict

    lab = _attach(args)
    rows = lab.conntrack(args.node)
    if args.show_command:
        for command in lab.conntrack_command(args.node):
            print(f"# {command}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        _print_json([asdict(r) for r in rows])
        return 0
    for r in rows:
        print(r.line())
    if not rows:
        print(f"no TCP or UDP conntrack entries in {args.node}")
    return 0


def cmd_pod_del(args) -> int:
    lab = _attach(args)
    gone = lab.delete_pod(args.name)
    if args.json:
        _print_json(gone)
        return 0
    print(f"pod {gone['pod']} ({gone['ip']}) deleted from lab {lab.name}")
    print(f"  service endpoints removed: {', '.join(gone['backends']) or 'none'}")
    for node in gone["ct"]:
        print(f"  {node}: {gone['ct'][node]} CT and {gone['nat'][node]} NAT entries naming {gone['ip']} deleted")
    return 0


def cmd_gc_run(args) -> int:
    lab = _attach(args)
    run = lab.gc.run(args.mode)
    if args.json:
        _print_json(run.to_json())
    else:
        print("\n".join(run.lines()))
    return 0


def cmd_gc_status(args) -> int:
    lab = _attach(args)
    st = lab.gc.state()
    if args.json:
        _print_json(st)
        return 0
    last = "never" if st["last_run"] is None else f"at lab clock {st['last_run']}"
    print(f"GC of lab {lab.name}: timer {'on' if st['timer'] else 'off'}, interval {st['interval']} s, "
          f"last run {last}; lab clock now {lab.clock.now()}")
    for run in st["runs"][-10:]:
        print(f"  {run['now']:>8}  {run['mode']:9} read {run['scanned']:>8} deleted {run['deleted']:>8} "
              f"ratio {run['ratio']:.4f}  {run['interval']} s -> {run['next_interval']} s")
    return 0


def cmd_gc_timer(args) -> int:
    lab = _attach(args)
    lab.gc.set_timer(args.state == "on")
    print(f"GC timer of lab {lab.name} is {args.state}")
    return 0


def cmd_clock_advance(args) -> int:
    lab = _attach(args)
    now = lab.clock.advance(args.seconds)
    print(f"lab clock now {now} (offset {lab.clock.offset} s)")
    return 0


def cmd_clock_show(args) -> int:
    from labkit.clock import mono_seconds

    lab = _attach(args)
    offset = lab.clock.offset
    mono = mono_seconds()
    if args.json:
        _print_json({"now": mono + offset, "offset": offset, "mono": mono})
    else:
        print(f"lab clock now {mono + offset} (offset {offset} s)")
    return 0


def cmd_fault(args) -> int:
    lab = _attach(args)
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
    lab = _attach(args)
    print(", ".join(lab.faults()) or "none")
    return 0


def _fault_doc(fault) -> str:
    """The comment of a Fault member (its line in labkit/maps/config.py)."""
    import inspect

    from labkit.maps import config

    for line in inspect.getsource(config.Fault).splitlines():
        if line.strip().startswith(f"{fault.name} =") and "#:" in line:
            return line.split("#:", 1)[1].strip()
    return ""


# -- entry point ---------------------------------------------------------------
def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def main(argv: list[str] | None = None) -> int:
    """Run ``labkit`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
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

