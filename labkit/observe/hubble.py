"""Hubble's view of a lab: the entries of the Hubble ring (:mod:`labkit.observe.ring`) as Hubble's
``GetFlowsResponse``, printed as ``hubble observe`` prints them, and ``hubble observe``'s filters.

- :func:`response` — one entry as the JSON ``hubble observe -o json`` writes: ``{"flow": {...},
  "node_name": ..., "time": ...}`` or ``{"lost_events": {...}, ...}`` (observer.proto
  GetFlowsResponse; field names and enum names of api/v1/flow/flow.proto, as protojson writes them
  with proto names: zero values left out, enums by name, times in RFC 3339);
- :func:`compact` — the ``-o compact`` line (hubble/pkg/printer/printer.go, ``WriteProtoFlow`` and
  ``WriteLostEvent``);
- :class:`FlowFilter` — ``--from-pod``, ``--to-pod``, ``--pod``, ``--verdict``, ``--protocol``,
  ``--port``, ``--from-ip``, ``--to-ip``, ``--node``.

Which Hubble observation point a labkit record stands for is decided in the datapath
(``trace_obs_point`` in bpf/lib/trace.h) and carried in the record.

    >>> FlowFilter(verdicts=["DROPPED"]).matches({"flow": {"verdict": "DROPPED"}})
    True
"""
from __future__ import annotations

import fnmatch
import ipaddress
import socket
import time
from dataclasses import dataclass, field
from typing import Iterable

from labkit.addr import ipv4
from labkit.constants import POLICY_V_SHIFT, DropReason, PolicyMatch, PolicyVerdict
from labkit.observe.ring import SLOT_LOST, SLOT_POLICY, Slot
from labkit.observe.trace import TraceEvent, TraceTuple
from labkit.policy.identity import RESERVED_NAMES, pod_labels, reserved_labels

__all__ = ["Names", "response", "ring_lost", "compact", "last_flows", "FlowFilter", "OBS_POINTS", "DROP_REASON_DESC"]

#: Cilium's trace_point numbers → (flow.proto TraceObservationPoint name, the monitor's name that
#: ``-o compact`` prints: pkg/monitor/api/types.go TraceObservationPoints). 0 is TO_LXC, which Hubble's
#: parser turns into TO_ENDPOINT (pkg/hubble/parser/threefour).
OBS_POINTS = {
    0: ("TO_ENDPOINT", "to-endpoint"),
    1: ("TO_PROXY", "to-proxy"),
    2: ("TO_HOST", "to-host"),
    3: ("TO_STACK", "to-stack"),
    4: ("TO_OVERLAY", "to-overlay"),
    5: ("FROM_ENDPOINT", "from-endpoint"),
    6: ("FROM_PROXY", "from-proxy"),
    7: ("FROM_HOST", "from-host"),
    8: ("FROM_STACK", "from-stack"),
    9: ("FROM_OVERLAY", "from-overlay"),
    10: ("FROM_NETWORK", "from-network"),
    11: ("TO_NETWORK", "to-network"),
}
_FROM_POINTS = {5, 6, 7, 8, 9, 10}

#: flow.proto's DropReason names for the reasons labkit's datapath reports (api/v1/flow/flow.proto).
DROP_REASON_DESC = {
    132: "INVALID_SOURCE_IP",
    133: "POLICY_DENIED",
    134: "INVALID_PACKET_DROPPED",
    135: "CT_TRUNCATED_OR_INVALID_HEADER",
    137: "CT_UNKNOWN_L4_PROTOCOL",
    139: "UNSUPPORTED_L3_PROTOCOL",
    141: "ERROR_WRITING_TO_PACKET",
    142: "UNKNOWN_L4_PROTOCOL",
    147: "ERROR_RETRIEVING_TUNNEL_KEY",
    153: "ERROR_WHILE_CORRECTING_L3_CHECKSUM",
    154: "ERROR_WHILE_CORRECTING_L4_CHECKSUM",
    155: "CT_MAP_INSERTION_FAILED",
    157: "IP_FRAGMENTATION_NOT_SUPPORTED",
    158: "SERVICE_BACKEND_NOT_FOUND",
    160: "NO_TUNNEL_OR_ENCAPSULATION_ENDPOINT",
    167: "NO_MAPPING_FOR_NAT_MASQUERADE",
    169: "FIB_LOOKUP_FAILED",
    178: "SOCKET_LOOKUP_FAILED",
    179: "SOCKET_ASSIGN_FAILED",
    180: "PROXY_REDIRECTION_NOT_SUPPORTED_FOR_PROTOCOL",
    181: "POLICY_DENY",
}

MESSAGE_TYPE_DROP = 1  #: pkg/monitor/api/types.go MessageTypeDrop
MESSAGE_TYPE_TRACE = 4  #: ... MessageTypeTrace
MESSAGE_TYPE_POLICY_VERDICT = 5  #: ... MessageTypePolicyVerdict
VERDICT_DROPPED = 3  #: labkit's VERDICT_DROPPED (bpf/lib/trace_types.h)
CT_REPLY, CT_NONE = 2, 0xFF  #: bpf/lib/ct_types.h

#: TCP flag bits in Hubble's order (pkg/hubble/parser/threefour getTCPFlags: SYN, ACK, RST, FIN, PSH, URG,
#: ECE, CWR), with their bit in the TCP header.
_TCP_FLAGS = (("SYN", 0x02), ("ACK", 0x10), ("RST", 0x04), ("FIN", 0x01), ("PSH", 0x08), ("URG", 0x20),
              ("ECE", 0x40), ("CWR", 0x80))
#: ICMPv4 type names as gopacket's ICMPv4TypeCode prints them (codes are not in the record).
_ICMP_NAMES = {0: "EchoReply", 3: "DestinationUnreachable", 5: "Redirect", 8: "EchoRequest", 11: "TimeExceeded",
               12: "ParameterProblem"}
_LOST_SOURCE = "PERF_EVENT_RING_BUFFER"  #: flow.proto LostEventSource: the datapath's ring overflowed


@dataclass
class Names:
    """What Hubble knows about addresses from the agent: pods (name, identity), nodes; built from a
    topology (:meth:`from_topology`)."""

    pods: dict[str, tuple[str, int]] = field(default_factory=dict)  #: ip → (pod name, identity)
    nodes: dict[int, str] = field(default_factory=dict)  #: node id → name
    node_ips: dict[str, str] = field(default_factory=dict)  #: ip → node name
    namespace: str = "default"

    @classmethod
    def from_topology(cls, topology) -> "Names":
        return cls(
            pods={p.ip: (p.name, p.identity) for p in topology.pods},
            nodes={n.node_id: n.name for n in topology.nodes},
            node_ips={n.ip: n.name for n in topology.nodes},
        )

    def endpoint(self, ip: str, node: str, identity: int = 0) -> dict:
        """flow.proto Endpoint for ``ip`` seen on ``node``; ``identity`` when the record carries it."""
        if ip in self.pods:
            name, ident = self.pods[ip]
            return _drop_zero({"identity": identity or ident, "namespace": self.namespace,
                               "labels": pod_labels(namespace=self.namespace).printable(), "pod_name": name})
        if not identity:
            identity = 1 if self.node_ips.get(ip) == node else 6 if ip in self.node_ips else 2
        labels = reserved_labels(identity).printable() if identity in RESERVED_NAMES and identity else []
        return _drop_zero({"identity": identity, "labels": labels})


def _drop_zero(d: dict) -> dict:
    """protojson leaves out zero values (EmitUnpopulated off)."""
    return {k: v for k, v in d.items() if v not in (0, "", [], {}, None)}


def _rfc3339(wall_ns: int) -> str:
    secs, nanos = divmod(wall_ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    return f"{stamp}.{nanos:09d}Z"


def _l4(t: TraceTuple) -> tuple[dict, str]:
    sport, dport = socket.ntohs(t.sport), socket.ntohs(t.dport)
    if t.proto == socket.IPPROTO_TCP:
        flags = {name: True for name, bit in _TCP_FLAGS if t.tcp_flags & bit}
        summary = "TCP Flags: " + ", ".join(name for name, bit in _TCP_FLAGS if t.tcp_flags & bit)
        return {"TCP": _drop_zero({"source_port": sport, "destination_port": dport, "flags": flags})}, summary
    if t.proto == socket.IPPROTO_UDP:
        return {"UDP": _drop_zero({"source_port": sport, "destination_port": dport})}, "UDP"
    if t.proto == socket.IPPROTO_ICMP:
        name = _ICMP_NAMES.get(t.icmp_type, str(t.icmp_type))
        return {"ICMPv4": _drop_zero({"type": t.icmp_type})}, f"ICMPv4 {name}"
    return {}, ""


def _flow(ev: TraceEvent, wall_ns: int, node: str, names: Names, device: str = "") -> dict:
    dropped = ev.verdict == VERDICT_DROPPED
    # The packet as the notification captures it: as received at from-* points, as sent at to-* points.
    t = ev.before if dropped or ev.obs_point in _FROM_POINTS else ev.after
    src, dst = ipv4(t.saddr), ipv4(t.daddr)
    l4, summary = _l4(t)
    flow: dict = {
        "time": _rfc3339(wall_ns),
        "verdict": "DROPPED" if dropped else "FORWARDED",
        "IP": {"source": src, "destination": dst, "ipVersion": "IPv4"},
        "l4": l4,
        "source": names.endpoint(src, node, ev.identity),
        "destination": names.endpoint(dst, node),
        "Type": "L3_L4",
        "node_name": node,
    }
    if dropped:
        reason = -ev.drop_reason
        flow["drop_reason"] = reason
        flow["event_type"] = {"type": MESSAGE_TYPE_DROP, "sub_type": reason}
        flow["drop_reason_desc"] = DROP_REASON_DESC.get(reason, "DROP_REASON_UNKNOWN")
    else:
        flow["event_type"] = _drop_zero({"type": MESSAGE_TYPE_TRACE, "sub_type": ev.obs_point})
        flow["trace_observation_point"] = OBS_POINTS.get(ev.obs_point, ("UNKNOWN_POINT", ""))[0]
    if not dropped and ev.ct_result != CT_NONE:
        # decodeIsReply: known only when the notification's reason carries the CT result.
        flow["is_reply"] = ev.ct_result == CT_REPLY
    if ev.ifindex:
        flow["interface"] = _drop_zero({"index": ev.ifindex, "name": device})
    flow["Summary"] = summary
    return {k: v for k, v in flow.items() if v not in ({}, "")}


def _policy_flow(ev: TraceEvent, wall_ns: int, node: str, names: Names, device: str = "") -> dict:
    """A policy verdict notification as Hubble decodes it (parser/threefour on a PolicyVerdictNotify): the
    packet as it met the policy, the peer's identity from the verdict, FORWARDED / DROPPED / AUDIT, the
    direction and the match type; never a reply (only a connection's first packets get one)."""
    verdict = PolicyVerdict.decode(ev.flags >> POLICY_V_SHIFT)
    t = ev.after if verdict.egress else ev.before
    src, dst = ipv4(t.saddr), ipv4(t.daddr)
    l4, summary = _l4(t)
    if verdict.egress:
        source, destination = names.endpoint(src, node, ev.identity), names.endpoint(dst, node, ev.remote_id)
    else:
        source, destination = names.endpoint(src, node, ev.remote_id), names.endpoint(dst, node)
    flow: dict = {
        "time": _rfc3339(wall_ns),
        "verdict": "DROPPED" if verdict.denied else "AUDIT" if verdict.audited else "FORWARDED",
        "IP": {"source": src, "destination": dst, "ipVersion": "IPv4"},
        "l4": l4,
        "source": source,
        "destination": destination,
        "Type": "L3_L4",
        "node_name": node,
        "event_type": {"type": MESSAGE_TYPE_POLICY_VERDICT},
        "traffic_direction": verdict.direction,
        "is_reply": False,
    }
    if verdict.match:  # protojson leaves out a zero match type (none)
        flow["policy_match_type"] = int(verdict.match)
    if verdict.denied:
        reason = -ev.drop_reason
        flow["drop_reason"] = reason
        flow["drop_reason_desc"] = DROP_REASON_DESC.get(reason, "DROP_REASON_UNKNOWN")
    if ev.ifindex:
        flow["interface"] = _drop_zero({"index": ev.ifindex, "name": device})
    flow["Summary"] = summary
    return {k: v for k, v in flow.items() if v not in ({}, "")}


def response(slot: Slot, names: Names, devices: dict[str, dict[int, str]] | None = None) -> dict:
    """One ring entry as ``hubble observe -o json`` prints it (a GetFlowsResponse)."""
    node = names.nodes.get(slot.node_id, f"node#{slot.node_id}")
    if slot.kind == SLOT_LOST:
        return {"lost_events": {"source": _LOST_SOURCE, "num_events_lost": str(slot.lost)},
                "node_name": node, "time": _rfc3339(slot.wall_ns)}
    device = (devices or {}).get(node, {}).get(slot.event.ifindex, "")
    make = _policy_flow if slot.kind == SLOT_POLICY else _flow
    return {"flow": make(slot.event, slot.wall_ns, node, names, device), "node_name": node,
            "time": _rfc3339(slot.wall_ns)}


def ring_lost(count: int, wall_ns: int | None = None) -> dict:
    """The lost-events response a reader gets when Hubble's ring overwrote ``count`` entries it had not read
    (LostEventSource HUBBLE_RING_BUFFER)."""
    return {"lost_events": {"source": "HUBBLE_RING_BUFFER", "num_events_lost": str(count)},
            "time": _rfc3339(time.time_ns() if wall_ns is None else wall_ns)}


def _identity_text(identity: int) -> str:
    """printer.go fmtIdentity: reserved identities by name, others as ``ID:n``."""
    if identity < 256 and identity in RESERVED_NAMES:
        return f"({RESERVED_NAMES[identity]})"
    return f"(ID:{identity})"


def _host(ep: dict, ip: str, port: int) -> str:
    """printer.go Hostname: ``namespace/pod`` when known, else the address; ``:port`` unless 0."""
    host = f"{ep['namespace']}/{ep['pod_name']}" if ep.get("pod_name") else ip
    return f"{host}:{port}" if port else host


def _stamp(rfc3339: str) -> str:
    """Go's time.StampMilli (``Jan _2 15:04:05.000``) of a UTC RFC 3339 time, as printer.go writes it."""
    base, frac = rfc3339.rstrip("Z").split(".")
    tm = time.strptime(base, "%Y-%m-%dT%H:%M:%S")
    return f"{time.strftime('%b', tm)} {tm.tm_mday:>2} {time.strftime('%H:%M:%S', tm)}.{frac[:3]}"


def compact(resp: dict, node_name: bool = False) -> str:
    """The ``hubble observe -o compact`` line of a GetFlowsResponse (``--print-node-name`` with ``node_name``)."""
    if "lost_events" in resp:
        lost = resp["lost_events"]
        return f"EVENTS LOST: {lost['source']} CPU({lost.get('cpu', 0)}) {lost['num_events_lost']}"
    f = resp["flow"]
    l4 = next(iter(f.get("l4", {}).values()), {})
    src_ep, dst_ep = f.get("source", {}), f.get("destination", {})
    src = _host(src_ep, f["IP"]["source"], l4.get("source_port", 0))
    dst = _host(dst_ep, f["IP"]["destination"], l4.get("destination_port", 0))
    src_id, dst_id = _identity_text(src_ep.get("identity", 0)), _identity_text(dst_ep.get("identity", 0))
    arrow = "->"
    if "is_reply" not in f:
        arrow = "<>"  # direction unknown
    elif f["is_reply"]:
        src, dst, src_id, dst_id, arrow = dst, src, dst_id, src_id, "<-"
    if f["event_type"]["type"] == MESSAGE_TYPE_POLICY_VERDICT:
        # printer.go: GetFlowType "policy-verdict:<match> <DIRECTION>", then the verdict as ALLOWED / DENIED /
        # AUDITED (PolicyVerdict.text writes both).
        verdict = PolicyVerdict(egress=f["traffic_direction"] == "EGRESS", match=PolicyMatch(f.get("policy_match_type", 0)),
                                audited=f["verdict"] == "AUDIT", denied=f["verdict"] == "DROPPED")
        node = f" [{f.get('node_name', '')}]" if node_name else ""
        return f"{_stamp(f['time'])}{node}: {src} {src_id} {arrow} {dst} {dst_id} {verdict.text()} ({f.get('Summary', '')})"
    if f["event_type"]["type"] == MESSAGE_TYPE_DROP:
        kind = DropReason.text(-f["event_type"]["sub_type"])
    else:
        kind = OBS_POINTS.get(f["event_type"].get("sub_type", 0), ("", "UNKNOWN"))[1]
    node = f" [{f.get('node_name', '')}]" if node_name else ""
    return f"{_stamp(f['time'])}{node}: {src} {src_id} {arrow} {dst} {dst_id} {kind} {f['verdict']} ({f.get('Summary', '')})"


def _pod_spec(spec: str) -> tuple[str, str]:
    """``[namespace/]pod-prefix`` → (namespace, prefix); hubble observe fills in ``default``."""
    ns, _, pod = spec.rpartition("/")
    return ns or "default", pod


def _pod_matches(ep: dict, specs: list[str]) -> bool:
    for spec in specs:
        ns, prefix = _pod_spec(spec)
        if ep.get("namespace") == ns and ep.get("pod_name", "").startswith(prefix) and (prefix or ep.get("pod_name")):
            return True
    return False


def _ip_matches(ip: str, specs: list[str]) -> bool:
    addr = ipaddress.ip_address(ip)
    return any(addr in ipaddress.ip_network(s, strict=False) if "/" in s else ip == s for s in specs)


_PROTOCOLS = {"tcp": "TCP", "udp": "UDP", "icmp": "ICMPv4", "icmpv4": "ICMPv4", "icmpv6": "ICMPv6", "sctp": "SCTP"}


@dataclass
class FlowFilter:
    """``hubble observe``'s flow filters: each given criterion must match (lost events always pass, as
    Hubble sends them whatever the filter). Lists are alternatives (``--verdict A --verdict B``)."""

    from_pods: list[str] = field(default_factory=list)
    to_pods: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)  #: --pod: source or destination
    verdicts: list[str] = field(default_factory=list)
    protocols: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)  #: source or destination port
    from_ips: list[str] = field(default_factory=list)
    to_ips: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  #: node names or globs

    def __post_init__(self) -> None:
        for p in self.protocols:
            if p.lower() not in _PROTOCOLS:
                raise ValueError(f"protocol {p!r}: expected one of {', '.join(_PROTOCOLS)}")
        for ip in self.from_ips + self.to_ips:
            ipaddress.ip_network(ip, strict=False)  # ValueError names the address

    def matches(self, resp: dict) -> bool:
        """True if the response passes every criterion."""
        if "flow" not in resp:
            return True
        f = resp["flow"]
        src, dst = f.get("source", {}), f.get("destination", {})
        if self.from_pods and not _pod_matches(src, self.from_pods):
            return False
        if self.to_pods and not _pod_matches(dst, self.to_pods):
            return False
        if self.pods and not (_pod_matches(src, self.pods) or _pod_matches(dst, self.pods)):
            return False
        if self.verdicts and f.get("verdict") not in {v.upper() for v in self.verdicts}:
            return False
        l4 = f.get("l4", {})
        if self.protocols and not set(l4) & {_PROTOCOLS[p.lower()] for p in self.protocols}:
            return False
        if self.ports:
            ports = next(iter(l4.values()), {})
            if not {ports.get("source_port"), ports.get("destination_port")} & set(self.ports):
                return False
        ip = f.get("IP", {})
        if self.from_ips and not _ip_matches(ip.get("source", "0.0.0.0"), self.from_ips):
            return False
        if self.to_ips and not _ip_matches(ip.get("destination", "0.0.0.0"), self.to_ips):
            return False
        if self.nodes and not any(fnmatch.fnmatchcase(f.get("node_name", ""), n) for n in self.nodes):
            return False
        return True

    def select(self, responses: Iterable[dict]) -> list[dict]:
        """The responses that match, in order."""
        return [r for r in responses if self.matches(r)]


def last_flows(lab, flt: FlowFilter | None = None, last: int | None = None) -> list[dict]:
    """The lab's Hubble ring as GetFlowsResponse dicts, oldest first: those ``flt`` keeps, the last ``last`` of
    them (all with None) — what ``labkit observe --last N`` prints.

        >>> drops = last_flows(lab, FlowFilter(verdicts=["DROPPED"]), last=5)   # doctest: +SKIP
        >>> [r["flow"]["drop_reason_desc"] for r in drops]                       # doctest: +SKIP
        ['NO_TUNNEL_OR_ENCAPSULATION_ENDPOINT']
    """
    from labkit.net.ledger import lab_dir
    from labkit.observe.ring import HubbleRing

    ring = HubbleRing.open(lab_dir(lab.name) / "hubble.ring")
    try:
        slots = ring.entries()
    finally:
        ring.close()
    names = Names.from_topology(lab.topology)
    devices = {node: {int(k): v for k, v in devs.items()} for node, devs in lab.state.devices.items()}
    resps = [response(s, names, devices) for s in slots]
    if flt is not None:
        resps = flt.select(resps)
    return resps[-last:] if last else resps if last is None else []
