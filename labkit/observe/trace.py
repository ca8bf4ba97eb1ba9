"""Trace records: one per packet per hook, decoded into flows.

The BPF programs write ``struct trace_event`` (bpf/lib/trace_types.h; keep in
sync) into each node's ``labkit_events`` ring buffer; the lab's monitor
(:mod:`labkit.observe.monitor`) is the one consumer and appends them to
``/run/labkit/<lab>/events.bin``, which any number of readers follow.

A flow line reads like Hubble's::

    12:00:01.123456 node-a from-container lxc-a1  198.18.1.11:40000 -> 198.18.2.11:8080 TCP SYN
        ct=new/egress flags=[] FORWARDED→tunnel 198.51.100.12

With policy compiled in, a record that carries a policy verdict says so as
Hubble does, with the peer's identity as Hubble writes one (ID:n)::

    ... ct=new/egress flags=[] policy-verdict:none EGRESS DENIED (ID:258) DROPPED (Policy denied)
"""
from __future__ import annotations

import ctypes
import enum
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from labkit.addr import ipv4
from labkit.constants import POLICY_V_SHIFT, DropReason, Hook, PolicyVerdict, TraceFlags, Verdict
from labkit.maps.ct import CtFlags, CtResult, TcpFlags, proto_name

__all__ = ["TraceTuple", "TraceEvent", "Flow", "EventLog", "EVENT_SIZE", "Report"]


class TraceTuple(ctypes.LittleEndianStructure):
    """``struct trace_tuple``: a packet's addresses and ports in packet order."""

    _fields_ = [
        ("saddr", ctypes.c_uint32),
        ("daddr", ctypes.c_uint32),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("proto", ctypes.c_uint8),
        ("tcp_flags", ctypes.c_uint8),
        ("icmp_type", ctypes.c_uint8),
        ("icmp_code", ctypes.c_uint8),
    ]

    def text(self) -> str:
        """``198.18.1.11:40000 -> 198.18.2.11:8080 TCP SYN``"""
        src, dst = ipv4(self.saddr), ipv4(self.daddr)
        name = proto_name(self.proto)
        if self.proto == socket.IPPROTO_TCP:
            return f"{src}:{socket.ntohs(self.sport)} -> {dst}:{socket.ntohs(self.dport)} TCP {TcpFlags.text(self.tcp_flags)}"
        if self.proto == socket.IPPROTO_UDP:
            return f"{src}:{socket.ntohs(self.sport)} -> {dst}:{socket.ntohs(self.dport)} UDP"
        if self.proto == socket.IPPROTO_ICMP:
            kind = _ICMP_TYPES.get(self.icmp_type, f"type {self.icmp_type}")
            ident = f" id {socket.ntohs(self.sport)}" if self.icmp_type in (0, 8) else ""
            return f"{src} -> {dst} ICMP {kind}{ident}"
        return f"{src} -> {dst} {name}"

    def key(self) -> tuple:
        """Comparable identity of the packet's addresses."""
        return (self.saddr, self.daddr, self.sport, self.dport, self.proto)


_ICMP_TYPES = {0: "EchoReply", 3: "DestUnreachable", 5: "Redirect", 8: "EchoRequest", 11: "TimeExceeded",
               12: "ParameterProblem"}


class Report(enum.IntFlag):
    """``trace_event.report`` (REPORT_* in bpf/lib/trace_types.h; keep in sync)."""

    REPORTED = 0x01  #: Cilium at the lab's monitor aggregation level would have emitted this record
    MONITOR = 0x02  #: the hook's CT lookup returned a non-zero 'monitor'


class TraceEvent(ctypes.LittleEndianStructure):
    """``struct trace_event`` (104 bytes)."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("ifindex", ctypes.c_uint32),
        ("len", ctypes.c_uint32),
        ("node_id", ctypes.c_uint8),
        ("hook", ctypes.c_uint8),
        ("verdict", ctypes.c_uint8),
        ("ct_result", ctypes.c_uint8),
        ("drop_reason", ctypes.c_int16),
        ("ct_flags", ctypes.c_uint16),
        ("ct_lifetime", ctypes.c_uint32),
        ("ct_dir", ctypes.c_uint8),
        ("ct_tx_seen", ctypes.c_uint8),
        ("ct_rx_seen", ctypes.c_uint8),
        ("svc_ct_result", ctypes.c_uint8),
        ("tunnel_endpoint", ctypes.c_uint32),
        ("identity", ctypes.c_uint32),
        ("before", TraceTuple),
        ("after", TraceTuple),
        ("inner", TraceTuple),
        ("rev_nat_index", ctypes.c_uint16),
        ("flags", ctypes.c_uint16),  # TRACE_F_*; the high byte: a policy verdict (POLICY_V_*)
        ("obs_point", ctypes.c_uint8),
        ("report", ctypes.c_uint8),
        ("proxy_port", ctypes.c_uint16),  # the proxy port of a redirecting policy verdict (host order)
        ("remote_id", ctypes.c_uint32),  # the peer's identity of that verdict
        ("pad3", ctypes.c_uint32),
    ]


EVENT_SIZE = ctypes.sizeof(TraceEvent)


def _wall(ts_ns: int) -> float:
    """The wall-clock time of kernel monotonic time ``ts_ns`` (bpf_ktime_get_ns)."""
    return time.time() - (time.monotonic_ns() - ts_ns) / 1e9


@dataclass(frozen=True)
class Flow:
    """One trace record with names resolved: which node, hook and device."""

    event: TraceEvent
    node: str
    device: str
    #: wall-clock time of the record (``ts_ns`` is the kernel's monotonic clock), fixed when it was decoded so that
    #: its line reads the same however often and wherever it is printed
    wall: float | None = field(default=None, compare=False)

    @classmethod
    def decode(cls, raw: bytes, nodes: dict[int, str], devices: dict[str, dict[int, str]]) -> "Flow":
        """Decode a record; ``nodes`` maps node ids to names, ``devices`` node → ifindex → name."""
        ev = TraceEvent.from_buffer_copy(raw[:EVENT_SIZE])
        node = nodes.get(ev.node_id, f"node#{ev.node_id}")
        device = devices.get(node, {}).get(ev.ifindex, f"if{ev.ifindex}")
        return cls(ev, node, device, _wall(ev.ts_ns))

    @property
    def hook(self) -> Hook:
        return Hook(self.event.hook)

    @property
    def verdict(self) -> Verdict:
        return Verdict(self.event.verdict)

    @property
    def ct_result(self) -> CtResult:
        return CtResult(self.event.ct_result)

    @property
    def policy(self) -> PolicyVerdict | None:
        """The policy verdict this record carries, or None (no policy, or none reported for this packet)."""
        return PolicyVerdict.decode(self.event.flags >> POLICY_V_SHIFT)

    @property
    def dropped(self) -> bool:
        return self.event.verdict == Verdict.DROPPED

    @property
    def translated(self) -> bool:
        """True when the hook rewrote addresses or ports (NAT)."""
        return self.event.before.key() != self.event.after.key()

    def line(self) -> str:
        """A Hubble-like one-line summary."""
        ev = self.event
        wall = self.wall if self.wall is not None else _wall(ev.ts_ns)
        stamp = time.strftime("%H:%M:%S", time.localtime(wall)) + f".{int(wall % 1 * 1e6):06d}"
        parts = [stamp, self.node, self.hook.label, self.device, "", ev.before.text()]
        if self.translated:
            parts.append(f"=> {ev.after.text()}")
        if ev.inner.proto:
            parts.append(f"[vxlan: {ev.inner.text()}]")
        parts += [f"[{name}]" for name in TraceFlags.names(ev.flags)]
        if ev.ct_result != CtResult.NONE:
            ct_dir = {0: "egress", 1: "ingress", 2: "service"}.get(ev.ct_dir, str(ev.ct_dir))
            names = " ".join(CtFlags.names(ev.ct_flags))
            parts.append(f"ct={self.ct_result.name.lower()}/{ct_dir} flags=[{names}]")
        policy = self.policy
        if policy is not None:
            parts.append(f"{policy.text()} (ID:{ev.remote_id})")  # the peer, as Hubble prints identities
        verdict = self.verdict.name
        if ev.verdict == Verdict.DROPPED or ev.flags & TraceFlags.NO_BACKEND_REPLY:  # dropped, or answered instead
            verdict += f" ({DropReason.text(ev.drop_reason)})"
        elif ev.tunnel_endpoint and self.hook in (Hook.FROM_CONTAINER, Hook.TO_OVERLAY):
            verdict += f" -> tunnel {ipv4(ev.tunnel_endpoint)}"
        parts.append(verdict)
        return " ".join(p for p in parts if p != "") 

    def to_json(self) -> dict:
        """Plain data for ``labkit trace --json``."""
        ev = self.event

        def tup(t: TraceTuple) -> dict:
            return {
                "src": ipv4(t.saddr),
                "dst": ipv4(t.daddr),
                "sport": socket.ntohs(t.sport),
                "dport": socket.ntohs(t.dport),
                "proto": proto_name(t.proto),
                "tcp_flags": TcpFlags.text(t.tcp_flags),
            }

        data = {
            "ts_ns": ev.ts_ns,
            "node": self.node,
            "hook": self.hook.label,
            "device": self.device,
            "verdict": self.verdict.name,
            "drop_reason": DropReason.text(ev.drop_reason) if ev.drop_reason else None,
            "drop_code": ev.drop_reason,
            "len": ev.len,
            "identity": ev.identity,
            "before": tup(ev.before),
            "after": tup(ev.after),
            "ct_result": self.ct_result.name,
            "ct_flags": CtFlags.names(ev.ct_flags),
            "ct_lifetime": ev.ct_lifetime,
            "tunnel_endpoint": ipv4(ev.tunnel_endpoint) if ev.tunnel_endpoint else None,
            "flags": TraceFlags.names(ev.flags),
        }
        if ev.inner.proto:
            data["inner"] = tup(ev.inner)
        policy = self.policy
        if policy is not None:
            data["policy"] = {"match": str(policy.match), "direction": policy.direction, "verdict": policy.outcome,
                              "remote_identity": ev.remote_id}
        return data

    def __str__(self) -> str:
        return self.line()


class EventLog:
    """Reader of a lab's ``events.bin`` (the monitor's output)."""

    def __init__(self, path: Path, nodes: dict[int, str], devices: dict[str, dict[int, str]]):
        self.path = Path(path)
        self.nodes = nodes
        self.devices = devices
        self.offset = 0
        self._inode: int | None = None

    def start_at(self, offset: int, inode: int | None) -> None:
        """Start reading at ``offset`` of the file with ``inode`` (a trace epoch); a rotated file starts at 0."""
        try:
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            return
        if inode is None or inode == current:
            self.offset, self._inode = offset, current

    def seek_end(self) -> None:
        """Start reading at what is written from now on."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.offset, self._inode = 0, None
            return
        self.offset = st.st_size - st.st_size % EVENT_SIZE
        self._inode = st.st_ino

    def read(self) -> list[Flow]:
        """Flows written since the last read."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if self._inode is not None and st.st_ino != self._inode:
                    self.offset = 0  # the monitor rotated the file
                self._inode = st.st_ino
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        usable = len(data) - len(data) % EVENT_SIZE
        self.offset += usable
        return [
            Flow.decode(data[i : i + EVENT_SIZE], self.nodes, self.devices) for i in range(0, usable, EVENT_SIZE)
        ]

    def follow(self, poll: float = 0.05, stop=None) -> Iterator[Flow]:
        """Yield flows as they are written until ``stop()`` is true."""
        while stop is None or not stop():
            flows = self.read()
            yield from flows
            if not flows:
                time.sleep(poll)
