"""A lab as its owner's notebook and ``labkit`` command hold it: every operation is one request to labkitd.

    >>> from labkit.client import Lab
    >>> lab = Lab.up("demo")                                   # doctest: +SKIP
    >>> lab.pod("a1").ping("b1")                               # a Step  # doctest: +SKIP
    >>> [r.line() for r in lab.ct("node-a")]                   # CtRow, as root reads them  # doctest: +SKIP
    >>> lab.pod("a1").exec("ip", "route").stdout               # run as you, CAP_NET_RAW|NET_ADMIN  # doctest: +SKIP
    >>> lab.down()                                             # doctest: +SKIP

Its surface is the datapath side's (:class:`labkit.lab.Lab`): the same methods, the same typed rows, steps
and snapshots, decoded from what labkitd answered. What it holds itself is only what labkitd told it when it
attached (topology, options, where the pins are) and the live tables this process shows.
"""
from __future__ import annotations

import subprocess
from typing import Sequence

from labkit.client.door import DoorClient, default_door
from labkit.client.procs import RemoteProcess, run
from labkit.config import DatapathConfig
from labkit.lab.members import ExternalHandle, Members, NodeHandle, PodHandle
from labkit.net.ledger import LabState
from labkit.net.topology import Topology

__all__ = ["Lab", "PodHandle", "NodeHandle", "ExternalHandle", "TcpConn", "RemoteClock"]


class RemoteClock:
    """The lab clock, read and moved by labkitd (``lab.clock.now()``, ``lab.clock.advance(61)``)."""

    def __init__(self, lab: "Lab"):
        self._lab = lab

    def _get(self, **kw) -> dict:
        return self._lab._call("clock", **kw)

    @property
    def offset(self) -> int:
        return self._get()["offset"]

    def now(self) -> int:
        """The lab clock's now, in seconds (the datapath's bpf_ktime plus the lab's offset)."""
        return self._get()["now"]

    def advance(self, seconds: int) -> int:
        """Move the clock ``seconds`` ahead (every lifetime comes that much closer); returns the new now."""
        return self._get(advance=int(seconds))["now"]

    def __repr__(self) -> str:
        got = self._get()
        return f"LabClock(now={got['now']}, offset={got['offset']})"


class TcpConn:
    """A TCP connection from a pod (or the external client), advanced one step at a time by labkitd.

    >>> conn = lab.pod("a1").tcp("b1", 8080)      # doctest: +SKIP
    >>> conn.open(); conn.send(b"hi"); conn.close()  # doctest: +SKIP
    """

    def __init__(self, lab: "Lab", pod: str, target: str, port: int = 8080, sport: int | None = None):
        self.lab = lab
        self.steps: list = []  #: open, send, close, reset: every step this connection took
        self._state(lab._call("conn.new", pod=pod, target=target, port=int(port), sport=sport))

    def _state(self, st: dict) -> None:
        self.id, self.pod, self.target, self.port = st["id"], st["pod"], st["target"], st["port"]
        self.sport, self.src, self.dst, self.state = st["sport"], st["src"], st["dst"], st["state"]
        self.loopback, self.redirected, self.outside = st["loopback"], st["redirected"], st["outside"]

    def __repr__(self) -> str:
        return f"TcpConn({self.pod} {self.src}:{self.sport or '?'} -> {self.target} {self.dst}:{self.port}, {self.state})"

    def _step(self, op: str, data: bytes | None = None):
        got = self.lab._call("conn.step", context={"lab": self.lab}, id=self.id, op=op,
                             data=None if data is None else bytes(data).hex())
        self._state(got["conn"])
        step = got["step"]
        self.steps.append(step)
        self.lab.note_change(step)
        return step

    def open(self):
        """connect(): SYN, SYN-ACK, ACK (or the RST of a closed port)."""
        return self._step("open")

    def send(self, data: bytes = b"hello"):
        """Send ``data``; the pod server echoes it back."""
        return self._step("send", data)

    def close(self):
        """Close gracefully: our FIN, their FIN, our last ACK."""
        return self._step("close")

    def reset(self):
        """Abort: close with SO_LINGER 0, so the kernel sends RST."""
        return self._step("reset")

    def ladder(self, title: str | None = None):
        """The ladder (sequence) diagram of every step this connection took so far."""
        from labkit.notebook.steps import LadderView

        return LadderView(self.steps, self.lab.topology, title or f"{self.pod} → {self.target}:{self.port} TCP")


class Lab(Members):
    """A lab that is up, held through labkitd. Build with :meth:`up`, find with :meth:`attach`."""

    def __init__(self, door: DoorClient, desc: dict):
        self.door = door
        self._load(desc)
        self.clock = RemoteClock(self)
        self._watchers: list = []
        self._services = None
        self._policy = None

    def _load(self, desc: dict) -> None:
        self.name: str = desc["name"]  #: as you name it (``demo``)
        self.key: str = desc["key"]  #: as the kernel names it (``demo_u1000``: namespaces, pins, cgroups)
        self.owner: int = desc["owner"]
        self.topology = Topology.from_dict(desc["topology"])
        self.config = DatapathConfig.from_dict(desc["config"])
        self.state = LabState.from_dict(desc["state"])

    def __repr__(self) -> str:
        return f"Lab({self.name!r}, routing={self.config.routing}, nodes={[n.name for n in self.topology.nodes]})"

    # -- requests ----------------------------------------------------------------------------------
    def _call(self, verb: str, *, fds: list[int] | None = None, context: dict | None = None, **args):
        return self.door.call(verb, self.name, fds=fds, context=context or {"lab": self}, **args)

    def _step(self, verb: str, **args):
        step = self._call(verb, **{k: v for k, v in args.items() if v is not None})
        self.note_change(step)
        return step

    # -- life cycle --------------------------------------------------------------------------------
    @classmethod
    def up(cls, name: str = "demo", *, routing: str | None = None, config: DatapathConfig | None = None,
           labels: dict | None = None, door: DoorClient | None = None, **options) -> "Lab":
        """Bring up your lab ``name`` (or attach to it when it runs with the same options): ``routing``,
        a whole :class:`DatapathConfig`, or its options as keywords (``socket_lb="full"``, ``policy="default"``);
        ``labels`` gives some pods other labels than ``app=<pod>``."""
        door = door or default_door()
        wanted = dict(options)
        if config is not None:
            base = config.to_dict()
            default = DatapathConfig().to_dict()
            wanted = {**{k: v for k, v in base.items() if v != default[k]}, **wanted}
        if routing is not None:
            wanted["routing"] = routing
        if isinstance(wanted.get("timeouts"), dict):
            wanted["timeouts"] = {k: v for k, v in wanted["timeouts"].items()}
        desc = door.call("up", name, options=wanted, labels=labels)
        return cls(door, desc)

    @classmethod
    def attach(cls, name: str = "demo", door: DoorClient | None = None) -> "Lab":
        """Your running lab ``name``; NotFoundError if it is not up."""
        door = door or default_door()
        return cls(door, door.call("attach", name))

    @classmethod
    def cleanup(cls, name: str, door: DoorClient | None = None) -> dict:
        """Remove what your lab ``name`` recorded (also a broken or half-built one)."""
        return (door or default_door()).call("cleanup", name)

    @classmethod
    def list(cls, door: DoorClient | None = None) -> list[dict]:
        """Every lab you may see (``labkit list``)."""
        return (door or default_door()).call("list")

    def down(self) -> None:
        """Take the lab down: labkitd removes everything its ledger recorded and checks nothing is left."""
        for table in self._watchers:
            table.stop()
        self._call("down")

    def reset(self) -> None:
        """Remove every Service and network policy, flush CT and NAT state, switch faults off, set the lab clock
        back and start the GC's interval afresh; topology kept."""
        self._call("reset")
        self.note_change()

    def status(self) -> dict:
        """Nodes, pods and externals with addresses, datapath options, clock, faults, agent, GC, health."""
        return self._call("status")

    def health(self) -> list[str]:
        """What is wrong with this lab (empty when healthy)."""
        return self._call("health")

    # -- members -----------------------------------------------------------------------------------
    def tcp(self, member: str, target: str, port: int = 8080, sport: int | None = None) -> "TcpConn":
        """A TCP connection from pod or external client ``member`` to ``target``, not yet open."""
        return TcpConn(self, member, target, port, sport)

    def ping(self, pod: str, target: str, count: int = 1):
        """``pod`` pings ``target``: a Step."""
        return self._step("step.ping", pod=pod, target=target, count=int(count))

    def udp(self, member: str, target: str, port: int = 8080, data: bytes = b"hello", sport: int | None = None):
        """One UDP datagram from ``member`` to ``target`` (from port ``sport``, default any) and its answer: a Step."""
        return self._step("step.udp", pod=member, target=target, port=int(port), data=bytes(data).hex(), sport=sport)

    def send(self, member: str, packet, title: str | None = None):
        """One crafted IPv4 packet (scapy or bytes) sent from ``member``: a Step."""
        summary = packet.summary() if hasattr(packet, "summary") else None
        return self._step("step.raw", pod=member, packet=bytes(packet).hex(),
                          title=title or (f"{member}: crafted {summary}" if summary else None))

    def server_log(self, pod: str) -> list[str]:
        """Lines pod ``pod``'s server logged (what it saw of its clients)."""
        return self._call("server_log", pod=pod)

    def exec(self, name: str, argv: Sequence[str], timeout: float = 30, check: bool = False, **kw):
        """Run ``argv`` in the namespace (and for pods the cgroup) of ``name``, as you, with exactly CAP_NET_RAW and
        CAP_NET_ADMIN; output captured as text (:class:`subprocess.CompletedProcess`). ``bpftool`` is run by labkitd
        as root, read-only, on this lab's own pins and cgroups (:meth:`bpftool`)."""
        self.topology.kind_of(name)
        if argv and argv[0] == "bpftool":  # bpf(2) is root's: labkitd runs it read-only on this lab's objects
            done = self.bpftool(*argv[1:], node=name)
            if check:
                done.check_returncode()
            return done
        return run(self, name, list(argv), timeout=timeout, check=check, **kw)

    def popen(self, name: str, argv: Sequence[str], **kw) -> RemoteProcess:
        """Start ``argv`` in ``name`` without waiting (:class:`subprocess.Popen`'s surface)."""
        self.topology.kind_of(name)
        return RemoteProcess(self, name, list(argv), **kw)

    def bpftool(self, *args: str, node: str | None = None) -> subprocess.CompletedProcess:
        """``bpftool ARGS`` run by labkitd as root, read-only, on this lab's own pins and cgroups (``map dump pinned
        …``, ``cgroup show …``, ``net show`` with ``node``)."""
        return self._call("bpftool", node=node, args=[str(a) for a in args])

    # -- maps --------------------------------------------------------------------------------------
    def ct(self, node: str) -> list:
        """Every row of ``node``'s two CT maps, TCP map first (:class:`labkit.maps.ct.CtRow`)."""
        return self._call("ct", node=node)

    def nat(self, node: str) -> list:
        """Every row of ``node``'s NAT map (:class:`labkit.maps.nat.NatRow`)."""
        return self._call("nat", node=node)

    def conntrack(self, node: str) -> list:
        """Linux conntrack rows of ``node``'s namespace (``conntrack -L`` there)."""
        return self._call("conntrack", node=node)

    def ct_command(self, node: str) -> list[str]:
        """The real commands that show the same rows (as root: bpf(2) is root's)."""
        from labkit.maps.ct import CT_MAPS

        return [f"bpftool map dump pinned {self.pin_dir(node)}/{m}" for m in CT_MAPS]

    def nat_command(self, node: str) -> list[str]:
        from labkit.maps.nat import NAT_MAP

        return [f"bpftool map dump pinned {self.pin_dir(node)}/{NAT_MAP}"]

    def conntrack_command(self, node: str) -> list[str]:
        ns = self.topology.netns(node)
        return [f"ip netns exec {ns} conntrack -L", f"ip netns exec {ns} iptables-save -t nat"]

    def sock_keys(self, node: str) -> list[str]:
        """The keys of ``node``'s ``cilium_sock_ops`` (``--sockmap on``), as bpftool lists them."""
        return self._call("sockops", node=node)

    def flush_ct(self, node: str | None = None) -> int:
        """Empty the CT maps of ``node`` (default: every node); returns how many rows were deleted."""
        n = self._call("flush_ct", node=node)
        self.note_change()
        return n

    def delete_pod(self, name: str) -> dict:
        """Delete pod ``name`` as Kubernetes and Cilium would (labkitd's :meth:`labkit.lab.Lab.delete_pod`)."""
        gone = self._call("delete_pod", pod=name)
        self.topology = Topology.from_dict(self._call("attach")["topology"])
        self._services = None
        self.note_change()
        return gone

    def snapshot(self, title: str, lb: bool = False, extra=None, conntrack: str | None = None,
                 iptables: str | None = None, service: str | None = None):
        """Every node's CT and NAT rows now, recorded by labkitd as evidence under ``title``: with ``lb`` the
        Service maps, with ``conntrack``/``iptables`` a node's Linux conntrack and nat table, with ``service``
        the Service as the agent holds it. ``extra`` is kept with it for you (checks do not read it)."""
        return self._call("snapshot", title=title, lb=lb, extra=extra, conntrack=conntrack, iptables=iptables,
                          service=service)

    # -- clock, faults, trace ----------------------------------------------------------------------
    def fault(self, name: str, on: bool = True) -> list[str]:
        """Switch a break-it fault on or off; returns the faults now on."""
        return self._call("fault", name=name, on=bool(on))

    def faults(self) -> list[str]:
        """Names of the break-it faults switched on."""
        return self._call("fault")

    def agent_faults(self) -> list[str]:
        from labkit.maps.config import AGENT_FAULTS

        return [f for f in self.faults() if f in AGENT_FAULTS]

    def monitor_aggregation(self, level: "str | int | None" = None) -> str:
        """The monitor aggregation level (none, lowest, low, medium, maximum); sets it when given."""
        return self._call("aggregation", level=level)

    def trace_mode(self, mode: str | None = None) -> str:
        """Which packets the hooks report: 'all', 'drops' or 'none'; sets it when given."""
        return self._call("trace_mode", mode=mode)

    def events(self) -> "RemoteEventLog":
        """Reader of this lab's trace records (``labkit trace``)."""
        return RemoteEventLog(self)

    def observe(self, title: str, last: int | None = None, **filters):
        """The Hubble ring read as ``labkit observe`` does, recorded as evidence (:func:`labkit.nb.observe`)."""
        return self._call("observe", title=title, last=last, **filters)

    def hubble(self, seq: int | None = None) -> dict:
        """The Hubble ring's entries from ``seq`` on (None: all it holds): ``{responses, seq, capacity}``."""
        return self._call("hubble", seq=seq)

    # -- the agent's parts ----------------------------------------------------------------------------
    @property
    def gc(self) -> "RemoteGc":
        """The lab's CT garbage collector: ``run()``, ``state()``, ``history()``, ``set_timer()``, ``restart()``."""
        return RemoteGc(self)

    @property
    def services(self):
        """The lab's Services, kept by its agent (:class:`labkit.client.agent.DoorServices`)."""
        if self._services is None:
            from labkit.client.agent import DoorServices

            self._services = DoorServices(self)
        return self._services

    @property
    def policy(self):
        """The lab's network policies, kept by its agent (:class:`labkit.client.agent.DoorPolicies`)."""
        if self._policy is None:
            from labkit.client.agent import DoorPolicies

            self._policy = DoorPolicies(self)
        return self._policy

    @property
    def fqdn(self) -> "RemoteFqdn":
        """DNS lookups from pods and the agent's DNS cache (lab 11)."""
        return RemoteFqdn(self)

    def agent_status(self) -> dict:
        return self._call("agent.status")

    def restart_agent(self) -> dict:
        """A new agent for the lab; the datapath keeps forwarding meanwhile."""
        return self._call("agent.restart")

    def agent_logs(self, tail: int = 0) -> dict:
        return self._call("agent.logs", tail=tail)


class RemoteGc:
    """``lab.gc``: the CT garbage collector, run by labkitd."""

    def __init__(self, lab: Lab):
        self.lab = lab

    def run(self, mode: str | None = None):
        """Collect every node now (:class:`labkit.agent.gc.GcRun`)."""
        done = self.lab._call("gc.run", mode=mode)
        self.lab.note_change()
        return done

    def state(self) -> dict:
        return self.lab._call("gc.state")

    def history(self) -> list[dict]:
        return self.lab._call("gc.history")

    def set_timer(self, on: bool) -> None:
        self.lab._call("gc.timer", on=bool(on))

    def restart(self) -> None:
        self.lab._call("gc.restart")

    def fill_synthetic(self, node: str, n: int) -> int:
        """Fill ``node``'s TCP CT map with ``n`` synthetic rows, half expired (lab 08's timing of the two scans)."""
        return self.lab._call("gc.fill", node=node, n=int(n))


class RemoteFqdn:
    """``lab.fqdn``: a pod's DNS lookups (kept as evidence) and the agent's DNS cache."""

    def __init__(self, lab: Lab):
        self.lab = lab

    def resolve(self, pod: str, name: str):
        """Ask the lab's resolver for ``name`` from ``pod`` (:class:`labkit.fqdn.lookup.Lookup`)."""
        return self.lab._call("fqdn.resolve", pod=pod, name=name)

    def cache_list(self) -> list[str]:
        """The agent's DNS cache, in ``cilium-dbg fqdn cache list`` grammar."""
        return self.lab._call("fqdn.cache")

    def wait_expired(self) -> list[str]:
        """Wait until every answer's TTL has run out on the lab clock; the cache list then."""
        return self.lab._call("fqdn.cache", wait_expired=True)


class RemoteEventLog:
    """The lab's trace records, read through labkitd from where the last read stopped (``labkit trace``)."""

    def __init__(self, lab: Lab):
        self.lab = lab
        self.offset: int | None = None
        self.up = True

    def last(self, n: int, node: str | None = None) -> list:
        """The last ``n`` flows (of ``node``), in time order; reading goes on after them."""
        got = self.lab._call("events", last=n, node=node)
        self.offset, self.up = got["offset"], got["up"]
        return got["flows"]

    def read(self, node: str | None = None) -> list:
        """The flows recorded since the last read."""
        if self.offset is None:
            self.last(0)
        got = self.lab._call("events", offset=self.offset, node=node)
        self.offset, self.up = got["offset"], got["up"]
        return got["flows"]

    def seek_end(self) -> None:
        self.last(0)
