"""Traffic a step sends, on the privileged side: snapshot, act, wait until the trace shows each packet's journey
ended, snapshot again — the :class:`~labkit.notebook.steps.Step` labkitd records as evidence and hands back.

    >>> conn = lab.pod("a1").tcp("b1", 8080)     # doctest: +SKIP
    >>> conn.open()                              # doctest: +SKIP   SYN, SYN-ACK, ACK
    >>> conn.send(b"hello"); conn.close()        # doctest: +SKIP
    >>> step = lab.pod("a1").ping("b1")          # doctest: +SKIP

A step waits — not for a fixed time, but until the trace shows each packet it expects at the end of its
journey (delivered into a pod by to-container, dropped, or handed to the fabric), and until the lab's monitor
has written out everything the kernel produced meanwhile. The pod's client process
(:mod:`labkit.net.podclient`) opens the connections and sends the packets.
"""
from __future__ import annotations

import itertools
import json
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from labkit.addr import be32
from labkit.constants import Hook, TraceFlags, Verdict
from labkit.errors import LabkitError, LabTimeoutError
from labkit.maps.ct import TcpFlags
from labkit.maps.sockmap import SOCKOPS_MAP, SockKey, sock_keys
from labkit.notebook.steps import LadderView, Step
from labkit.observe.evidence import JOURNAL
from labkit.observe.monitor import flushed_past
from labkit.observe.trace import Flow
from labkit.observe.view import LabView

__all__ = ["Journey", "TcpConn", "PodClient", "run_step", "ping_step", "udp_step", "raw_step", "STEP_TIMEOUT",
           "followed_ports"]

STEP_TIMEOUT = 5.0
_TCP, _UDP, _ICMP = socket.IPPROTO_TCP, socket.IPPROTO_UDP, socket.IPPROTO_ICMP
_ids = itertools.count(1)


def _port_ok(want: int | frozenset | None, port: int) -> bool:
    return want is None or (port in want if isinstance(want, frozenset) else port == want)


def followed_ports(lab: LabView, proto: str, src: str, sport: int | None) -> int | frozenset | None:
    """The client's port, and in --service-mode iptables also the ports Linux conntrack masqueraded it to:
    kube-proxy's MASQUERADE --random-fully gives a flow a new source port, so a packet past the SNAT is
    found by the reply tuple's port of the client's conntrack entry."""
    if sport is None or getattr(lab.config, "service_mode", "ebpf") != "iptables":
        return sport
    ports = {sport} | {row.reply_dport for node in lab.topology.nodes for row in lab.conntrack(node.name)
                       if row.proto == proto and (row.src, row.sport) == (src, sport) and row.snat}
    return frozenset(ports) if len(ports) > 1 else sport


@dataclass(frozen=True)
class Journey:
    """A packet a step waits for, matched by addresses, protocol, ports and TCP flags.

    Its journey ends where the trace shows it delivered into a pod
    (to-container, or from-container handing a hairpin reply straight back),
    dropped, delivered to a node's own stack (from-netdev, addressed to that
    node), or leaving a node for the fabric towards an address outside the
    cluster (to-netdev).
    """

    label: str
    src: str | None  #: None: any address (a Service VIP's flow changes addresses on the way)
    dst: str | None
    proto: int
    sport: int | frozenset | None = None  #: a frozenset: any of these (a port and what NAT made of it)
    dport: int | frozenset | None = None
    flags_all: int = 0  #: TCP flags that must be set
    flags_none: int = 0  #: TCP flags that must be clear
    #: An answer that may also come as the ICMP port unreachable a Service without backends sends back
    #: (--service-no-backend-response=reject: the record of the packet it answers carries NO_BACKEND_REPLY).
    rejected: bool = False

    def matches(self, t) -> bool:
        if t.proto != self.proto:
            return False
        if self.src is not None and t.saddr != be32(self.src):
            return False
        if self.dst is not None and t.daddr != be32(self.dst):
            return False
        if not _port_ok(self.sport, socket.ntohs(t.sport)) or not _port_ok(self.dport, socket.ntohs(t.dport)):
            return False
        return (t.tcp_flags & self.flags_all) == self.flags_all and not t.tcp_flags & self.flags_none

    def ended_by(self, flow: Flow, pod_ips: set[int], node_ips: dict[int, int] | None = None) -> bool:
        """True if ``flow`` is this packet's last hook. ``node_ips``: node id → its address."""
        ev = flow.event
        node_ips = node_ips or {}
        if self.rejected and ev.flags & TraceFlags.NO_BACKEND_REPLY:
            b = ev.before  # the packet the ICMP error answers: this answer's addresses and ports, reversed
            return (b.proto == self.proto and (self.src is None or b.daddr == be32(self.src))
                    and (self.dst is None or b.saddr == be32(self.dst))
                    and _port_ok(self.sport, socket.ntohs(b.dport)) and _port_ok(self.dport, socket.ntohs(b.sport)))
        if not (self.matches(ev.before) or self.matches(ev.after)):
            return False
        if flow.dropped or ev.hook == Hook.TO_CONTAINER or ev.flags & TraceFlags.NO_BACKEND_REPLY:
            return True  # delivered, dropped, or answered in its place (a Service without backends)
        if ev.hook == Hook.FROM_CONTAINER and flow.verdict == Verdict.REDIRECTED and not ev.tunnel_endpoint:
            return True  # a hairpin reply handed straight back into its pod
        if ev.hook == Hook.FROM_NETDEV and flow.verdict == Verdict.FORWARDED:
            return not ev.inner.proto and ev.after.daddr == node_ips.get(ev.node_id)
        return (ev.hook == Hook.TO_NETDEV and not ev.inner.proto and ev.after.daddr not in pod_ips
                and ev.after.daddr not in node_ips.values())


def run_step(lab: LabView, title: str, action: Callable[[], dict], journeys: Callable[[dict], list[Journey]],
             timeout: float = STEP_TIMEOUT, describe: Callable[[dict], dict] | None = None, **attrs) -> Step:
    """Snapshot, act, wait for the journeys and the monitor, snapshot: the Step, recorded as evidence with
    ``attrs``, what ``describe(result)`` adds once the action ran, and the faults that were on."""

    log = lab.step_events()
    log.seek_end()
    nodes = [n.name for n in lab.topology.nodes]
    before = {n: lab.ct(n) for n in nodes}
    nat_before = {n: lab.nat(n) for n in nodes}
    logs = {p.name: len(lab.pod(p.name).server_log()) for p in lab.topology.pods}
    t0 = time.monotonic()
    result = action()
    waiting = list(journeys(result))
    pod_ips = {be32(p.ip) for p in lab.topology.pods}
    node_ips = {n.node_id: be32(n.ip) for n in lab.topology.nodes}
    flows: list[Flow] = []
    deadline = time.monotonic() + timeout
    while True:
        flows += log.read()
        waiting = [j for j in waiting if not any(j.ended_by(f, pod_ips, node_ips) for f in flows)]
        if not waiting:
            break
        if time.monotonic() > deadline:
            seen = "\n".join(f.line() for f in flows[-8:]) or "(no trace records)"
            raise LabTimeoutError(
                f"step '{title}': after {timeout} s still waiting for {', '.join(j.label for j in waiting)}; "
                f"expected each to reach to-container, a drop, or the fabric. Last records:\n{seen}"
            )
        time.sleep(0.001)
    flushed_past(lab.name, lab.pin_dirs)
    flows += log.read()
    flows.sort(key=lambda f: f.event.ts_ns)
    after = {n: lab.ct(n) for n in nodes}
    nat_after = {n: lab.nat(n) for n in nodes}
    server_log = {p: lab.pod(p).server_log()[n:] for p, n in logs.items()}
    attrs = {**attrs, **(describe(result) if describe else {}), "ok": bool(result.get("ok", True)),
             "faults": tuple(lab.faults())}
    step = Step(title, lab, flows, before, after, result, lab.clock.now(), time.monotonic() - t0, attrs,
                nat_before, nat_after, {p: lines for p, lines in server_log.items() if lines})
    JOURNAL.record(lab.name, "step", title, step, **attrs)
    lab.note_change(step)
    return step


class TcpConn:
    """A TCP connection from a pod (or the external client), advanced one step at a time.

    >>> conn = lab.pod("a1").tcp("b1", 8080)   # doctest: +SKIP
    >>> conn.open().diff["node-a"].added        # doctest: +SKIP
    """

    def __init__(self, lab: LabView, pod: str, target: str, port: int = 8080, sport: int | None = None):
        self.lab = lab
        self.pod = pod
        self.src = lab.address_of(pod)
        self.outside = lab.topology.kind_of(pod) == "external"
        self.dst = lab.address_of(target, outside=self.outside)
        self.target = target
        self.port = port
        self.sport = sport
        self.id = next(_ids)
        self.state = "new"
        self.loopback = False
        self.redirected = False  #: sockmap on: sock_ops recorded both ends, so sends skip the TCP/IP stack
        self._sports: int | frozenset | None = None  #: the client's port as the server's side sees it
        self.steps: list[Step] = []  #: open, send, close, reset: every step this connection took

    def _keep(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    def ladder(self, title: str | None = None) -> LadderView:
        """The ladder (sequence) diagram of every step this connection took so far: a1, the hooks,
        b1 as columns, one arrow per packet with its TCP flags, CT verdicts, rows and NAT at each hook.

        >>> conn.open(); conn.send(); conn.close(); conn.ladder()   # doctest: +SKIP
        """
        return LadderView(self.steps, self.lab.topology, title or f"{self.pod} → {self.target}:{self.port} TCP")

    def __repr__(self) -> str:
        return f"TcpConn({self.pod} {self.src}:{self.sport or '?'} -> {self.target} {self.dst}:{self.port}, {self.state})"

    def _call(self, op: str, **kw) -> dict:
        return self.lab.podclient(self.pod).call({"op": op, "id": self.id, **kw})

    def _j(self, label: str, reply: bool = False, **kw) -> Journey:
        # To a Service the addresses change on the way (DNAT, hairpin SNAT, socket LB): follow the
        # client's port instead, which no translation here touches.
        direct = self.lab.is_direct(self.dst, self.port, "TCP")
        src, dst = (self.src, self.dst) if direct else (None, None)
        if reply:
            return Journey(label, dst, src, _TCP, self.port if direct else None, self.sport, **kw)
        if not direct and self._sports is None:
            self._sports = followed_ports(self.lab, "tcp", self.src, self.sport)
        return Journey(label, src, dst, _TCP, self.sport if direct else self._sports, self.port if direct else None,
                       **kw)

    def open(self) -> Step:
        """connect(): SYN, SYN-ACK, ACK (or the RST of a closed port)."""
        if self.state != "new":
            raise LabkitError(f"{self!r}: open() needs a new connection, this one is {self.state}")

        def act() -> dict:
            res = self._call("tcp_open", host=self.dst, port=self.port, sport=self.sport)
            self.sport = res.get("sport")
            self.state = "open" if res["ok"] else "failed"
            real = (res.get("real_peer") or "").split(":")[0]
            self.loopback = real == self.src  # socket LB chose this very pod: the kernel's loopback, no hooks
            if self.loopback:
                res["note"] = "socket LB connected the pod to itself: the packets stay on its loopback device"
            return res

        def describe(res: dict) -> dict:
            self.redirected = bool(res["ok"]) and self._sockmap_recorded()
            if self.redirected:
                res["note"] = ("sock_ops recorded both ends in cilium_sock_ops: sends now go socket to socket, "
                               "past the veths' hooks")
            return {**self._describe("tcp-open")(res), "redirected": self.redirected}

        def expect(res: dict) -> list[Journey]:
            if self.loopback:
                return []
            syn = self._j("SYN", flags_all=TcpFlags.SYN, flags_none=TcpFlags.ACK)
            if res["ok"]:
                return [syn, self._j("SYN-ACK", True, flags_all=TcpFlags.SYN | TcpFlags.ACK),
                        self._j("ACK", flags_all=TcpFlags.ACK, flags_none=0xFF & ~TcpFlags.ACK)]
            if res.get("error") == "ECONNREFUSED":
                return [syn, self._j("RST", True, flags_all=TcpFlags.RST, rejected=True)]
            return []

        return self._keep(run_step(self.lab, f"{self.pod} → {self.target}:{self.port} TCP open", act, expect,
                                   describe=describe))

    def _sockmap_recorded(self, timeout: float = 2.0) -> bool:
        """With ``--sockmap on``, whether sock_ops recorded this connection (a pod to a pod of its node): the
        connecting end goes into cilium_sock_ops when the SYN-ACK arrives, the accepted end at the handshake's
        last ACK, a moment after the open returns; so once the first is there, wait for the second (a send
        before it would take the stack). Neither there: not redirected (another node, or a fault)."""
        if getattr(self.lab.config, "sockmap", "off") != "on" or self.outside or self.sport is None:
            return False
        node = self.lab.topology.pod(self.pod).node
        path = f"{self.lab.pin_dir(node)}/{SOCKOPS_MAP}"
        peer_view = SockKey.make(self.src, self.sport, self.dst, self.port)  # the accepted end's key
        deadline = time.monotonic() + timeout
        while True:
            keys = set(sock_keys(path))
            if peer_view.swapped() not in keys:
                return False
            if peer_view in keys:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def send(self, data: bytes = b"hello") -> Step:
        """Send ``data``; the pod server echoes it back."""
        self._need_open("send")
        return self._keep(run_step(
            self.lab, f"{self.pod} → {self.target}:{self.port} TCP send {len(data)} bytes",
            lambda: self._call("tcp_send", data=bytes(data).hex()),
            lambda res: [self._j("data", flags_all=TcpFlags.PSH), self._j("echo", True, flags_all=TcpFlags.PSH),
                         self._j("ACK", flags_all=TcpFlags.ACK, flags_none=0xFF & ~TcpFlags.ACK)]
            if res["ok"] and not self.loopback and not self.redirected else [],
            describe=lambda res: {**self._describe("tcp-send")(res), "redirected": self.redirected},
        ))

    def close(self) -> Step:
        """Close gracefully: our FIN, their FIN, our last ACK."""
        self._need_open("close")
        self.state = "closed"
        return self._keep(run_step(
            self.lab, f"{self.pod} → {self.target}:{self.port} TCP close",
            lambda: self._call("tcp_close"),
            self._close_journeys,
            describe=self._describe("tcp-close"),
        ))

    def _close_journeys(self, res: dict) -> list[Journey]:
        if not res["ok"] or self.loopback:
            return []
        fin = self._j("FIN", flags_all=TcpFlags.FIN)
        if res.get("peer_closed_first"):  # their FIN came earlier: ours is answered by a plain ACK
            return [fin, self._j("ACK", True, flags_all=TcpFlags.ACK, flags_none=0xFF & ~TcpFlags.ACK)]
        return [fin, self._j("FIN", True, flags_all=TcpFlags.FIN),
                self._j("last ACK", flags_all=TcpFlags.ACK, flags_none=0xFF & ~TcpFlags.ACK)]

    def reset(self) -> Step:
        """Abort: close with SO_LINGER 0, so the kernel sends RST."""
        self._need_open("reset")
        self.state = "reset"
        return self._keep(run_step(
            self.lab, f"{self.pod} → {self.target}:{self.port} TCP reset", lambda: self._call("tcp_reset"),
            lambda res: [] if self.loopback else [self._j("RST", flags_all=TcpFlags.RST)],
            describe=self._describe("tcp-reset")))

    def _describe(self, kind: str) -> Callable[[dict], dict]:
        """What the step's evidence record says of it, once its action ran (the port is known then)."""
        return lambda res: {"op": kind, "actor": self.pod, "target": self.target, "port": self.port,
                            "sport": self.sport, "conn": self.id, "dst": self.dst}

    def _need_open(self, what: str) -> None:
        if self.state != "open":
            raise LabkitError(f"{self!r}: {what}() needs an open connection, this one is {self.state}")


class PodClient:
    """The :mod:`labkit.net.podclient` process of one pod."""

    def __init__(self, proc):
        self.proc = proc

    def call(self, cmd: dict) -> dict:
        if self.proc.poll() is not None:
            raise LabkitError(f"pod client exited ({self.proc.returncode})")
        self.proc.stdin.write(json.dumps({k: v for k, v in cmd.items() if v is not None}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise LabkitError("pod client closed its output")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(2)
            except Exception:
                self.proc.kill()


def ping_step(lab: LabView, pod: str, target: str, count: int = 1) -> Step:
    src, dst = lab.address_of(pod), lab.address_of(target)

    def act() -> dict:
        r = lab.exec(pod, ["ping", "-c", str(count), "-i", "0.2", "-W", "2", dst])
        return {"ok": r.returncode == 0, "output": r.stdout.strip(), "error": None if r.returncode == 0 else "no reply"}

    def expect(res: dict) -> list[Journey]:
        out = [Journey("echo request", src, dst, _ICMP)]
        return out + [Journey("echo reply", dst, src, _ICMP)] if res["ok"] else out

    return run_step(lab, f"{pod} → {target} ping ×{count}", act, expect, op="ping", actor=pod, target=target,
                    dst=dst, count=count)


def udp_step(lab: LabView, pod: str, target: str, port: int = 8080, data: bytes = b"hello",
             sport: int | None = None) -> Step:
    outside = lab.topology.kind_of(pod) == "external"
    src, dst = lab.address_of(pod), lab.address_of(target, outside=outside)

    def act() -> dict:
        res = lab.podclient(pod).call({"op": "udp", "host": dst, "port": port, "data": bytes(data).hex(),
                                        "sport": sport})
        if res.get("reply"):
            res["reply_text"] = bytes.fromhex(res["reply"]).decode(errors="replace")
        return res

    def expect(res: dict) -> list[Journey]:
        if lab.is_direct(dst, port, "UDP"):
            out = [Journey("datagram", src, dst, _UDP, res.get("sport"), port)]
            return out + [Journey("answer", dst, src, _UDP, port, res.get("sport"))] if res["ok"] else out
        # A Service: follow the client's port through the translations.
        out = [Journey("datagram", None, None, _UDP, followed_ports(lab, "udp", src, res.get("sport")), None)]
        return out + [Journey("answer", None, None, _UDP, None, res.get("sport"))] if res["ok"] else out

    return run_step(lab, f"{pod} → {target}:{port} UDP", act, expect, op="udp", actor=pod, target=target,
                    port=port, dst=dst, describe=lambda res: {"sport": res.get("sport")})


def raw_step(lab: LabView, pod: str, packet: Any, title: str | None = None) -> Step:
    """Send one crafted IPv4 packet (a scapy packet or its bytes) from ``pod``."""
    data = bytes(packet)
    if len(data) < 20 or data[0] >> 4 != 4:
        raise LabkitError(f"crafted packet from '{pod}': expected an IPv4 packet, got {len(data)} bytes")
    src, dst = socket.inet_ntoa(data[12:16]), socket.inet_ntoa(data[16:20])
    proto = data[9]
    summary = packet.summary() if hasattr(packet, "summary") else f"{src} > {dst} proto {proto}"
    return run_step(
        lab, title or f"{pod}: crafted {summary}",
        lambda: lab.podclient(pod).call({"op": "raw", "packet": data.hex()}),
        lambda res: [Journey("crafted packet", src, dst, proto)] if res["ok"] else [],
        op="raw", actor=pod, src=src, dst=dst, proto=proto,
    )
