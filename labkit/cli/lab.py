"""The life of a lab: ``up``, ``down``, ``cleanup``, ``status``, ``list``, ``doctor``, ``exec``.

Each is a client of labkitd (:class:`labkit.client.Lab`), run as you: ``up`` asks labkitd for your lab with
these options, ``exec`` has labkitd start the command as you in the pod (its stdio this terminal's),
``list`` shows the labs labkitd lets you see. ``doctor`` alone looks at this machine itself.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import textwrap
import time

from labkit.cli import common
from labkit.cli.common import (
    CliError,
    ON_OFF,
    TIMEOUT_NAMES,
    ct_timeout,
    output_options,
    print_json,
    table,
)
from labkit.config import (
    LB_MODES,
    MAGLEV_TABLE_SIZES,
    NODEPORT_ACCEL_MODES,
    NO_BACKEND_RESPONSES,
    POLICY_MODES,
    ROUTING_MODES,
    SERVICE_MODES,
    SOCKET_LB_MODES,
    CtTimeouts,
)
from labkit.release import DEFAULT_RELEASE, RELEASES, profile

__all__ = ["add_commands", "policy_options", "up_options", "pod_labels", "cmd_up", "cmd_down", "cmd_cleanup",
           "cmd_status", "cmd_list", "cmd_doctor", "cmd_exec"]


def add_commands(add) -> None:
    """Add the lab commands to the parser (``add`` makes a subcommand)."""
    p = add("up", "bring the lab up (attach to it if it is already up with the same options)")
    p.add_argument("--routing", choices=ROUTING_MODES, default=None,
                   help="how pod traffic crosses nodes: VXLAN tunnel (default) or native routing")
    p.add_argument("--socket-lb", choices=SOCKET_LB_MODES, default=None,
                   help="socket-level LB at connect(): off, hostns (nodes only, default) or full (pods too)")
    p.add_argument("--ct-timeout", type=ct_timeout, action="append", default=[], metavar="NAME=SECONDS",
                   help=f"set a CT lifetime, repeatable; NAME is one of {', '.join(TIMEOUT_NAMES)}")
    p.add_argument("--lb-mode", choices=LB_MODES, default=None,
                   help="how a node hands outside traffic to a backend on another node: dsr (default: the "
                        "backend's node answers the client), snat (the reply comes back through the node) or "
                        "hybrid (DSR for TCP, SNAT for UDP)")
    p.add_argument("--nodeport-accel", choices=NODEPORT_ACCEL_MODES, default=None,
                   help="NodePort/LoadBalancer traffic from outside: none (default, tc's from-netdev) or xdp (an XDP "
                        "program on each node's eth0 load-balances it before an skb exists; needs --routing native; "
                        "Cilium's --bpf-lb-acceleration=native)")
    p.add_argument("--service-no-backend-response", choices=NO_BACKEND_RESPONSES, default=None,
                   dest="no_backend_response",
                   help="a Service without backends: reject (default, as on a node: ICMP port unreachable) or drop "
                        "(DROP_NO_SERVICE)")
    p.add_argument("--service-mode", choices=SERVICE_MODES, default=None,
                   help="where Services live: ebpf (default, the cilium_lb4_* maps) or iptables (kube-proxy's nat "
                        "table in every node, Linux conntrack; the BPF programs still track pod traffic)")
    p.add_argument("--cilium", choices=RELEASES, default=None,
                   help=f"the Cilium release whose behaviour and output the lab reproduces (default "
                        f"{DEFAULT_RELEASE}); `labkit status` lists what differs")
    p.add_argument("--ct-accounting", choices=ON_OFF, default=None,
                   help="count packets and bytes in CT entries (default off, as on a node: every row then "
                        "reads Packets=0 Bytes=0)")
    p.add_argument("--sockmap", choices=ON_OFF, default=None,
                   help="socket-level redirect between pods of one node (sock_ops + sk_msg on the sockhash "
                        "cilium_sock_ops, Cilium 1.4-1.13's --sockops-enable): established TCP data skips the "
                        "TCP/IP stack and the veth hooks; default off")
    p.add_argument("--maglev-table-size", type=int, choices=MAGLEV_TABLE_SIZES, default=None, metavar="M",
                   help=f"slots of each Maglev table, a prime from {MAGLEV_TABLE_SIZES[0]} (fits on a screen) to "
                        f"{MAGLEV_TABLE_SIZES[-1]}; default 16381, Cilium's")
    p.add_argument("--policy-mode", choices=POLICY_MODES, default=None,
                   help="network policy enforcement (Cilium's --policy-enforcement): default (the default, as on "
                        "a node: an endpoint is enforced in a direction once a policy selects it there), always "
                        "(every endpoint, default deny) or never (no policy code compiled in)")
    p.add_argument("--policy-audit", action="store_true", default=None,
                   help="policy audit mode: a packet policy would deny is let through and reported as AUDITED")
    p.add_argument("--label", type=pod_label, action="append", default=[], metavar="POD:KEY=VALUE",
                   help="give a pod a label, repeatable (a pod given none is labelled app=<its name>); pods with "
                        "equal labels share one security identity")
    p.add_argument("--monitor-aggregation", choices=("none", "lowest", "low", "medium", "maximum"), default=None,
                   help="which trace records count as reported to Hubble (`labkit observe`), as Cilium's "
                        "--monitor-aggregation (default medium, as on a node); `labkit trace` still shows all")
    p.add_argument("--hubble-buffer-size", type=int, default=None, metavar="N",
                   help="flows the lab's Hubble ring keeps: 2^n-1, default 4095 (Hubble's event buffer capacity)")
    p.set_defaults(func=cmd_up)

    p = add("down", "remove everything the lab created, then check that nothing is left")
    p.set_defaults(func=cmd_down)

    p = add("cleanup", "remove what a broken or half-built lab recorded (works without a readable lab.json)")
    p.set_defaults(func=cmd_cleanup)

    p = add("status", "nodes, pods and addresses, datapath options, clock, faults and health")
    output_options(p, "print Lab.status() as JSON")
    p.set_defaults(func=cmd_status)

    p = add("list", "your labs (an instructor: every lab on this machine): owner, variant labs, age, the process "
                    "that started it, what it holds (orphaned variant labs named, with the command that removes them)")
    output_options(p, "print the labs as a JSON list")
    p.set_defaults(func=cmd_list)

    p = add("doctor", "check whether this machine can run a lab (labkitd answering, kernel, BPF, tools) and, as root "
                      "with the lab up, that its services journal matches its maps (exit 1 if a check fails)")
    output_options(p, "print the checks as a JSON list")
    p.set_defaults(func=cmd_doctor)

    p = add("exec", "run a command as you inside a pod, node or external client: exec NAME -- CMD [ARG…]",
            usage="labkit exec [-h] NAME -- CMD [ARG ...]")
    p.add_argument("name", metavar="NAME", help="a pod (a1), node (node-a) or external client (ext)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments, after --")
    p.set_defaults(func=cmd_exec)


def pod_label(value: str) -> tuple[str, str, str]:
    """``POD:KEY=VALUE`` → ``(POD, KEY, VALUE)``."""
    pod, sep, rest = value.partition(":")
    key, eq, val = rest.partition("=")
    if not sep or not eq or not pod or not key:
        raise argparse.ArgumentTypeError(f"{value!r}: expected POD:KEY=VALUE, e.g. a1:app=web")
    return pod, key, val


def pod_labels(labels: list[tuple[str, str, str]]) -> dict[str, dict[str, str]] | None:
    """The ``--label`` values as ``up``'s ``labels`` (None when none were given): the pods named get exactly
    these labels, the others keep ``app=<name>``.

        >>> pod_labels([("a2", "app", "a1"), ("a2", "tier", "db")]), pod_labels([])
        ({'a2': {'app': 'a1', 'tier': 'db'}}, None)
    """
    per_pod: dict[str, dict[str, str]] = {}
    for pod, key, val in labels:
        per_pod.setdefault(pod, {})[key] = val
    return per_pod or None


def policy_options(args) -> dict:
    """``--policy-mode``/``--policy-audit`` as the datapath options ``policy``/``policy_audit``. A
    DatapathConfig without those fields builds a datapath that enforces nothing: then asking for a mode other
    than Cilium's default, or for audit, is refused rather than silently ignored."""
    from dataclasses import fields

    from labkit.config import DatapathConfig

    wanted = {k: v for k, v in (("policy", args.policy_mode), ("policy_audit", args.policy_audit)) if v is not None}
    missing = sorted(set(wanted) - {f.name for f in fields(DatapathConfig)})
    if missing:
        raise CliError(f"--policy-mode/--policy-audit: expected a datapath with the options {', '.join(missing)}, "
                       f"got one without them (this labkit's BPF programs do not enforce policy)")
    return wanted


def up_options(args) -> dict:
    """The options ``up`` was given, as :class:`~labkit.config.DatapathConfig` field names (what labkitd's ``up``
    takes); options not given are left out, so the lab's defaults apply."""
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
    if args.nodeport_accel is not None:
        changes["nodeport_accel"] = args.nodeport_accel
    if args.no_backend_response is not None:
        changes["no_backend_response"] = args.no_backend_response
    if args.cilium is not None:
        changes["cilium"] = args.cilium
    if args.ct_accounting is not None:
        changes["ct_accounting"] = args.ct_accounting == "on"
    if args.sockmap is not None:
        changes["sockmap"] = args.sockmap
    changes.update(policy_options(args))
    if args.monitor_aggregation is not None:
        changes["monitor_aggregation"] = args.monitor_aggregation
    if args.hubble_buffer_size is not None:
        changes["hubble_buffer_size"] = args.hubble_buffer_size
    return changes


def cmd_up(args) -> int:
    from labkit.client import Lab
    from labkit.client.door import default_door
    from labkit.config import DatapathConfig

    changes = up_options(args)
    config = DatapathConfig().with_options(**changes)  # a bad combination is refused here, before labkitd is asked
    door = default_door()
    door.call("hello")  # no labkitd: its one line now, not after the progress line
    print(f"bringing up lab {args.lab} ({config.routing} routing) ...", flush=True)
    t0 = time.time()
    lab = Lab.up(args.lab, labels=pod_labels(args.label), door=door, **changes)
    took = time.time() - t0
    reused = lab.state.created < t0
    topo = lab.topology
    print(f"lab {lab.name} is up: {lab.config.routing} routing, LB mode {lab.config.lb_mode}, "
          f"{'already running, attached' if reused else 'built'} in {took:.1f} s")
    changed = {k: v for k, v in vars(lab.config.timeouts).items() if getattr(CtTimeouts(), k) != v}
    if changed:
        print("CT timeouts: " + ", ".join(f"{k}={v}s" for k, v in changed.items()) + " (others default)")
    print("nodes:")
    for row in table([[n.name, n.ip, f"pod CIDR {n.pod_cidr}"] for n in topo.nodes]):
        print(f"  {row}")
    print("pods:")
    for row in table([[p.name, p.ip, f"on {p.node}"] for p in topo.pods]):
        print(f"  {row}")
    if topo.externals:
        print("external clients:")
        for row in table([[e.name, e.ip] for e in topo.externals]):
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
    from labkit.errors import LabStateError, NotFoundError

    try:
        lab = common.attach(args)
    except NotFoundError:
        print(f"lab {args.lab} is not up: nothing to take down")
        return 0
    except LabStateError as exc:  # recorded, but not a lab labkitd can open (half-built, lab.json unreadable)
        raise CliError(f"{exc}; `labkit --lab {args.lab} cleanup` removes what it recorded") from None
    lab.down()
    print(f"lab {lab.name}: taken down by labkitd; nothing of it is left")
    return 0


def cmd_cleanup(args) -> int:
    from labkit.client import Lab

    removed = Lab.cleanup(args.lab).get("removed", 0)
    print(f"lab {args.lab}: " + (f"removed {removed} recorded objects" if removed else "nothing was recorded to remove"))
    print(f"nothing of lab {args.lab} is left")
    return 0


def cmd_status(args) -> int:
    lab = common.attach(args)
    st = lab.status()
    if args.json:
        print_json(st)
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
        ["NodePort accel", _accel_text(lab, st)],
        ["Cilium", f"{st['datapath'].get('cilium', DEFAULT_RELEASE)} behaviour and output"],
        ["CT accounting", "on (Packets/Bytes counted)" if st["datapath"].get("ct_accounting")
                          else "off (as on a node: Packets=0 Bytes=0)"],
        ["sockmap", "on (same-node pod TCP redirected socket to socket through cilium_sock_ops)"
                    if st["datapath"].get("sockmap") == "on" else "off"],
        ["monitor", f"aggregation {st.get('monitor_aggregation', '-')}, Hubble ring of "
                    f"{st['datapath'].get('hubble_buffer_size', '-')} flows (`labkit observe`)"],
        ["clock", f"now {clock['now']} (offset {clock['offset']} s)"],
        ["agent", st.get("agent", "-")],
        ["CT GC", st.get("gc", "-")],
        ["variant labs", "; ".join(_variant_text(v) for v in st.get("variants", [])) or "none"],
        ["faults", ", ".join(st["faults"]) or "none"],
        ["CT timeouts", " ".join(f"{k}={v}" for k, v in timeouts.items()) + " (seconds)"],
        ["CT map sizes", f"tcp {st['datapath'].get('ct_tcp_size')}, any {st['datapath'].get('ct_any_size')}"],
    ]
    for row in table(head):
        print(row)
    print()
    rows = [["NAME", "KIND", "ADDRESS", "WHERE", "NETNS"]]
    for n in st["nodes"]:
        rows.append([n["name"], "node", n["ip"], f"pods {n['pod_cidr']} via {n['router_ip']}", n["netns"]])
    for p in st["pods"]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(p.get("labels", {}).items()))
        rows.append([p["name"], "pod", p["ip"], f"on {p['node']} ({p['host_veth']}, identity {p['identity']}"
                     + (f", labels {labels})" if labels else ")"), p["netns"]])
    for e in st["externals"]:
        rows.append([e["name"], "external", e["ip"], "underlay", e["netns"]])
    for row in table(rows):
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


#: bpftool net show's XDP modes as ``ip link`` names them.
_XDP_MODES = {"driver": "xdpdrv", "generic": "xdpgeneric", "offload": "xdpoffload"}


def _accel_text(lab, st: dict) -> str:
    """The NodePort acceleration row: the mode, what is attached where (labkitd's read-only bpftool in each
    node), and the command that shows it."""
    if st["datapath"].get("nodeport_accel", "none") != "xdp":
        return "none (tc from-netdev load-balances outside traffic)"
    from labkit.errors import LabkitError

    seen = []
    for n in st["nodes"]:
        try:
            done = lab.bpftool("-j", "net", "show", "dev", "eth0", node=n["name"])
            progs = [x for d in json.loads(done.stdout or "[]") for x in d.get("xdp", [])]
        except (LabkitError, ValueError, AttributeError) as exc:
            seen.append(f"{n['name']} eth0 not known ({exc})")
            continue
        seen.append(f"{n['name']} eth0 {_XDP_MODES.get(progs[0].get('mode'), progs[0].get('mode'))} id "
                    f"{progs[0].get('id')}" if progs else f"{n['name']} eth0 NOT attached")
    return f"xdp ({'; '.join(seen)}; see `labkit exec {st['nodes'][0]['name']} -- ip -d link show eth0`)"


def _variant_text(v: dict) -> str:
    """A variant lab in the status table: ``demo-snat (up 3 min, orphaned)``."""
    how = "orphaned: its kernel is gone" if v["orphaned"] else v["status"]
    return f"{v['name']} ({how}, {v['age']})"


def _summary(d: dict):
    """A lab as labkitd's ``list`` answers it (:meth:`LabSummary.to_dict` with ``name``, ``key``, ``owner_uid``),
    as a :class:`~labkit.lab.inventory.LabSummary` named as you name it; its variant is read from the key's name
    part (``demo-snat_u1000`` is a variant of ``demo``, shown to others as ``demo_u1000``)."""
    from labkit.door.owners import lab_key, name_of, owner_of
    from labkit.lab.inventory import LabSummary, split_variant

    base, variant = split_variant(name_of(d["key"]))
    if d["name"] == d["key"]:  # named by its key (root's, or another's lab an instructor sees): its main lab's key
        base = lab_key(owner_of(d["key"]), base)
    return LabSummary(d["name"], base, variant, d.get("status", "broken"), d.get("created"),
                      int(d.get("owner_pid") or 0), bool(d.get("owner_alive")), dict(d.get("holds") or {}),
                      int(d.get("running") or 0))


def owner_name(uid: int | None) -> str:
    """A lab owner's login name, or the uid when it has no passwd entry.

        >>> owner_name(0), owner_name(None)
        ('root', '-')
    """
    import pwd

    if uid is None:
        return "-"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def cmd_list(args) -> int:
    from labkit.client import Lab

    got = Lab.list()
    labs = [(_summary(d), d) for d in got]
    labs.sort(key=lambda sd: (sd[0].base, sd[0].variant is not None, sd[0].variant or ""))
    now = time.time()
    if args.json:
        print_json([{**d, **{k: v for k, v in s.to_dict(now).items() if k in ("base", "variant", "orphaned", "age")},
                     "owner": owner_name(d.get("owner_uid"))} for s, d in labs])
        return 0
    if not labs:
        print("no labs of yours on this machine (`labkit up` starts one)")
        return 0
    rows = [["LAB", "VARIANT OF", "STATUS", "AGE", "OWNER", "STARTED BY", "HOLDS"]]
    for s, d in labs:
        status = "orphaned" if s.orphaned else s.status
        rows.append([s.name, s.base if s.variant else "-", status, s.age(now), owner_name(d.get("owner_uid")),
                     s.owner_text(), s.holds_text()])
    for row in table(rows):
        print(row)
    notes = [n for n in (s.note() for s, _ in labs) if n]
    if notes:
        print()
        for n in notes:
            print(textwrap.fill(n, width=100, initial_indent="  - ", subsequent_indent="    "))
    return 0


def cmd_doctor(args) -> int:
    from labkit.cli.doctor import machine_checks, root_only_note, running_lab, services_journal
    from labkit.datapath.doctor import format_checks

    root = os.geteuid() == 0
    checks = machine_checks(root)
    lab = running_lab(args.lab) if root else None
    lines, journal_ok = services_journal(lab) if lab is not None else ([], True)
    if args.json:
        out = [c.to_json() for c in checks]
        if lab is not None:
            out.append({"name": "services journal", "ok": journal_ok, "detail": lines[-1], "fix": None,
                        "problems": [line[4:] for line in lines[:-1]]})
        print_json(out)
        if not root:
            print(root_only_note(os.geteuid()), file=sys.stderr)
    else:
        print(format_checks(checks))
        if lab is not None:
            print(f"\nlab {lab.name}:")
            print("\n".join(lines))
        if not root:
            print(f"\n{root_only_note(os.geteuid())}")
    return 0 if all(c.ok for c in checks) and journal_ok else 1


def _stdio(fd: int) -> int | None:
    """``fd`` for the command when this process has it open, else DEVNULL (labkitd needs a real descriptor)."""
    import subprocess

    try:
        os.fstat(fd)
    except OSError:
        return subprocess.DEVNULL
    return None


def cmd_exec(args) -> int:
    lab = common.attach(args)
    lab.topology.kind_of(args.name)  # NotFoundError lists the names
    cmd = args.cmd
    if cmd[0] == "bpftool":  # bpf(2) is root's: labkitd runs bpftool read-only on this lab's own objects
        done = lab.bpftool(*cmd[1:], node=args.name)
        sys.stdout.write(done.stdout or "")
        sys.stderr.write(done.stderr or "")
        return done.returncode
    sys.stdout.flush()
    sys.stderr.flush()
    # labkitd starts the command as you in the pod (labkit.door.sandbox), on this terminal's stdin, stdout and
    # stderr; its exit status comes back on a pipe of ours ("command not found" is its 127)
    proc = lab.popen(args.name, cmd, stdin=_stdio(0), stdout=_stdio(1), stderr=_stdio(2))
    previous = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _signalled)
        while True:  # the command is not in this process's group: the signals this process gets are passed on
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C
                _pass_on(proc, signal.SIGINT)
            except _Signalled as exc:
                _pass_on(proc, exc.signum)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return code if code >= 0 else 128 - code


class _Signalled(Exception):
    """SIGTERM or SIGHUP came while ``exec`` waited (raised, so the wait lets go of its lock first)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _signalled(signum, frame) -> None:
    raise _Signalled(signum)


def _pass_on(proc, signum: int) -> None:
    """Send ``signum`` on to the command labkitd started (nothing when it has ended or labkitd is gone)."""
    from labkit.errors import LabkitError

    try:
        proc.send_signal(signum)
    except (LabkitError, OSError):
        pass
