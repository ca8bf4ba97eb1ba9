"""``labkit service``: add, delete, list Services and set a backend's state (the agent writes them)."""
from __future__ import annotations

import json
import sys
import time

from labkit.agent.services.model import ALGORITHMS, PROTOCOLS, SERVICE_TYPES, STATES, TRAFFIC_POLICIES
from labkit.cli import common
from labkit.cli.common import count, output_options, port, print_json, table

__all__ = ["add_commands", "cmd_service_add", "cmd_service_del", "cmd_service_list", "cmd_service_backend",
           "cmd_service_apply", "load_specs"]


def add_commands(add) -> None:
    """Add the service commands to the parser (``add`` makes a subcommand)."""
    svc = add("service", "services (ClusterIP, NodePort, LoadBalancer): what the agent writes into every "
                         "node's LB maps").add_subparsers(
        dest="service_command", metavar="COMMAND", required=True)
    p = svc.add_parser("add", help="add a service and write it to every node",
                       description="Add a service NAME (ClusterIP, NodePort or LoadBalancer) with its backends "
                                   "and write every frontend to every node's cilium_lb4_* maps (backends, slots, reverse NAT, then the head).")
    p.add_argument("name", metavar="NAME", help="the service name (a DNS label: web, api, ...)")
    p.add_argument("--port", type=port, required=True, metavar="P", help="the service port (1-65535)")
    p.add_argument("--backend", action="append", default=[], metavar="POD:PORT",
                   help="a backend pod and its port, repeatable (none: the service drops its traffic)")
    p.add_argument("--vip", metavar="IP", help="the ClusterIP, from 198.19.0.0/16 (default: the next free from 198.19.0.10)")
    p.add_argument("--protocol", type=str.upper, choices=PROTOCOLS, default="TCP", help="L4 protocol (default TCP)")
    p.add_argument("--affinity", type=count, default=0, metavar="SECONDS",
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
    output_options(p, "a JSON list of services")
    p.set_defaults(func=cmd_service_list)
    p = svc.add_parser("backend", help="add or remove a backend, or mark it active or terminating",
                       description="Change backend POD:PORT of service NAME: --add it, --remove it, or set its "
                                   "--state; a terminating backend moves after the head's count, so it gets no new "
                                   "connections. Only that service's rows are written.")
    p.add_argument("name", metavar="NAME", help="the service")
    p.add_argument("backend", metavar="POD:PORT", help="the backend")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--add", action="store_true", help="add it (active, or --state)")
    what.add_argument("--remove", action="store_true", help="take it out (its id is freed once no service uses it)")
    what.add_argument("--state", choices=STATES, help="the new state of one of its backends")
    p.set_defaults(func=cmd_service_backend)
    p = svc.add_parser("apply", help="make a list of services exist as a file describes (YAML or JSON)",
                       description="Apply FILE ('-': standard input), a list of services as `kubectl apply -f` "
                                   "would: each item has name and port, and any of backends (POD:PORT or {pod, "
                                   "port, state}), vip, protocol, affinity, type, node_port, lb_vip, etp, "
                                   "algorithm. New names are added, changed backends updated (ids kept), a changed "
                                   "frontend replaced, equal services left alone — in one call to the agent, all "
                                   "or nothing.")
    p.add_argument("file", metavar="FILE", help="a YAML or JSON list of services (or {services: [...]})")
    output_options(p, "what happened to each name, as JSON")
    p.set_defaults(func=cmd_service_apply)


def _service_line(svc) -> str:
    bes = ", ".join(f"{b.ref} ({b.state})" for b in svc.backends) or "none"
    return f"{svc.frontend} id {svc.id}, backends {bes}"


def cmd_service_add(args) -> int:
    lab = common.attach(args)
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
    lab = common.attach(args)
    svc = lab.services.get(args.name)
    lab.services.remove(args.name)
    more = f", and {len(svc.frontends) - 1} more frontends" if len(svc.frontends) > 1 else ""
    print(f"service {svc.name} ({svc.frontend}, id {svc.id}{more}) removed from every node")
    return 0


def cmd_service_list(args) -> int:
    lab = common.attach(args)
    services = lab.services.list()
    if args.json:
        print_json([s.to_json(lab.topology) for s in services])
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
    for row in table(rows):
        print(row)
    return 0


def cmd_service_backend(args) -> int:
    services = common.agent_services(args)
    if args.add:
        svc = services.add_backend(args.name, args.backend)
    elif args.remove:
        svc = services.remove_backend(args.name, args.backend)
    else:
        svc = services.set_backend_state(args.name, args.backend, args.state)
    print(f"service {svc.name}: {_service_line(svc)}")
    return 0


def load_specs(text: str, source: str) -> list:
    """A YAML or JSON list of services (or a mapping with ``services:``) → the list; CliError names ``source``."""
    try:
        data = json.loads(text)
    except ValueError:
        try:
            import yaml
        except ImportError:
            raise common.CliError(f"{source}: not JSON, and YAML needs PyYAML (`pip install pyyaml`)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise common.CliError(f"{source}: neither JSON nor YAML ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("services"), list):
        data = data["services"]
    if not isinstance(data, list):
        raise common.CliError(f"{source}: expected a list of services (or services: [...]), got "
                              f"{type(data).__name__}")
    return data


def cmd_service_apply(args) -> int:
    if args.file == "-":
        text, source = sys.stdin.read(), "standard input"
    else:
        try:
            with open(args.file) as f:
                text, source = f.read(), args.file
        except OSError as exc:
            raise common.CliError(f"service apply: cannot read {args.file} ({exc.strerror})") from None
    specs = load_specs(text, source)
    services = common.agent_services(args)
    t = time.perf_counter()
    result = services.apply(specs)
    took = time.perf_counter() - t
    agent_s = getattr(services, "last_agent_seconds", None)  # the agent's own time, when it answered
    if args.json:
        print_json({**result, "agent_seconds": agent_s, "seconds": round(took, 6)})
        return 0
    counts = ", ".join(f"{len(v)} {k}" for k, v in result.items())
    inside = f" ({agent_s} s in the agent)" if agent_s is not None else ""
    print(f"applied {len(specs)} services from {source}: {counts}{inside}")
    for kind in ("added", "updated", "replaced"):
        if result[kind] and len(result[kind]) <= 20:
            print(f"  {kind}: {', '.join(result[kind])}")
    return 0
