"""Hubble's view of a lab: the entries of the Hubble ring (:mod:`labkit.observe.ring`) as Hubble's
``GetFlowsResponse``, printed as ``hubble observe`` prints them, and ``hubble observe``'s filters.

- :class:`Names` — what a node's Hubble resolves addresses with (its getters): pods and their labels, each
  pod's endpoint on its own node (``cilium_lxc``), Services' frontends, devices, the lab's release;
- :func:`response` — one entry as the JSON ``hubble observe -o json`` writes: ``{"flow": {...},
  "node_name": ..., "time": ...}`` or ``{"lost_events": {...}, ...}`` (observer.proto
  GetFlowsResponse; the fields pkg/hubble/parser/threefour fills for the event, named and ordered as
  api/v1/flow/flow.proto declares them, as protojson writes them with proto names: zero values left
  out, enums by name, 64-bit integers as strings, times in RFC 3339);
- :func:`printed` — the responses the release's ``hubble observe`` prints (v1.16: no lost events);
- :func:`compact` — the ``-o compact`` line (hubble/pkg/printer/printer.go, ``WriteProtoFlow`` and,
  from 1.17, ``WriteLostEvent``);
- :class:`FlowFilter` — ``--from-pod``, ``--to-pod``, ``--pod``, ``--verdict``, ``--protocol``,
  ``--port``, ``--from-ip``, ``--to-ip``, ``--node``.

Which Hubble observation point a labkit record stands for is decided in the datapath
(``trace_obs_point`` in bpf/lib/trace.h) and carried in the record.

    >>> FlowFilter(verdicts=["DROPPED"]).matches({"flow": {"verdict": "DROPPED"}})
    True
"""
from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import ipaddress
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterable

from labkit.addr import ipv4
from labkit.constants import POLICY_V_SHIFT, DropReason, PolicyMatch, PolicyVerdict
from labkit.errors import LabkitError
from labkit.maps.base import PinnedMap
from labkit.maps.eps import EndpointInfo, EndpointKey
from labkit.observe.ring import SLOT_LOST, SLOT_POLICY, Slot
from labkit.observe.trace import TraceEvent, TraceTuple
from labkit.policy.identity import RESERVED_NAMES, pod_labels, reserved_labels
from labkit.release import DEFAULT_RELEASE, profile

__all__ = ["Names", "LocalEndpoint", "response", "printed", "ring_lost", "compact", "last_flows", "FlowFilter",
           "OBS_POINTS", "DROP_REASON_DESC", "FLOW_FIELDS"]

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
    196: "TTL_EXCEEDED",
}

MESSAGE_TYPE_DROP = 1  #: pkg/monitor/api/types.go MessageTypeDrop
MESSAGE_TYPE_TRACE = 4  #: ... MessageTypeTrace
MESSAGE_TYPE_POLICY_VERDICT = 5  #: ... MessageTypePolicyVerdict
VERDICT_DROPPED = 3  #: labkit's VERDICT_DROPPED (bpf/lib/trace_types.h)
CT_REPLY, CT_NONE = 2, 0xFF  #: bpf/lib/ct_types.h
#: labkit hooks (bpf/lib/trace_types.h HOOK_*): the pod's veth, the node's netdev.
_HOOK_FROM_CONTAINER, _HOOK_TO_CONTAINER, _HOOK_FROM_NETDEV, _HOOK_TO_NETDEV = 1, 2, 3, 4
#: flow.proto TraceReason of a CT result (pkg/hubble/parser/threefour/parser.go:446-458 decodeTraceReason: the
#: datapath's TRACE_REASON_POLICY..CT_RELATED, 0..3, plus one).
_TRACE_REASONS = {0: "NEW", 1: "ESTABLISHED", 2: "REPLY", 3: "RELATED"}
#: Observation points whose trace notification carries the CT result as its reason in v1.16: the to-* points
#: (bpf_lxc.c, lib/encap.h, bpf_host.c pass trace.reason). The from-* points pass TRACE_REASON_UNKNOWN
#: (bpf_lxc.c:1451-1453, bpf_overlay.c:675-677, bpf_host.c:1131-1132): their direction is unknown.
_REASON_POINTS = {0, 1, 2, 3, 4, 11}
#: ``send_trace_notify``'s ifindex by observation point (v1.16): to-endpoint THIS_INTERFACE_IFINDEX, the
#: endpoint's lxc (bpf_lxc.c:1976-1977, 2008); to-overlay ENCAP_IFINDEX, cilium_vxlan (lib/encap.h:52-53);
#: to-stack and to-proxy from a pod TRACE_IFINDEX_UNKNOWN (bpf_lxc.c:1306-1308, 1073-1075): no interface.
_NO_INTERFACE_POINTS = {1, 3, 5}  # ... and from-endpoint (bpf_lxc.c:1451-1453)
#: flow.proto message Flow's fields in declaration order (api/v1/flow/flow.proto:14-137), the order protojson
#: writes them in (hubble/cmd/observe/flows.go:665-673: ``-o json`` is JSONPB, api/v1/observer/observer.pb.json.go:
#: protojson with UseProtoNames).
FLOW_FIELDS = ("time", "uuid", "verdict", "drop_reason", "auth_type", "ethernet", "IP", "l4", "source", "destination",
               "Type", "node_name", "node_labels", "source_names", "destination_names", "l7", "reply", "event_type",
               "source_service", "destination_service", "traffic_direction", "policy_match_type",
               "trace_observation_point", "trace_reason", "drop_reason_desc", "is_reply", "debug_capture_point",
               "interface", "proxy_port", "trace_context", "sock_xlate_point", "socket_cookie", "cgroup_id", "Summary",
               "extensions", "egress_allowed_by", "ingress_allowed_by", "egress_denied_by", "ingress_denied_by")
_HOST_SOURCE = -1  #: a trace's source endpoint is the host endpoint (bpf_host.c:12 EVENT_SOURCE HOST_EP_ID)
#: TCP flag bits in Hubble's order (pkg/hubble/parser/threefour getTCPFlags: SYN, ACK, RST, FIN, PSH, URG,
#: ECE, CWR), with their bit in the TCP header.
_TCP_FLAGS = (("SYN", 0x02), ("ACK", 0x10), ("RST", 0x04), ("FIN", 0x01), ("PSH", 0x08), ("URG", 0x20),
              ("ECE", 0x40), ("CWR", 0x80))
#: ICMPv4 types and codes as gopacket v1.1.19 (Cilium v1.16's, go.mod:54) names them in ICMPv4TypeCode.String()
#: (layers/icmp4.go): type → (name, {code: name}); a type without a code table prints its name alone when the
#: code is 0, ``Name(Code: n)`` otherwise; an unknown code of a typed table ``Name(Code: n)``, a known one
#: ``Name(CodeName)``, an unknown type ``t(c)``.
_ICMP_NAMES: dict[int, tuple[str, dict[int, str] | None]] = {
    0: ("EchoReply", None),
    3: ("DestinationUnreachable", dict(enumerate((
        "Net", "Host", "Protocol", "Port", "FragmentationNeeded", "SourceRoutingFailed", "NetUnknown", "HostUnknown",
        "SourceIsolated", "NetAdminProhibited", "HostAdminProhibited", "NetTOS", "HostTOS", "CommAdminProhibited",
        "HostPrecedence", "PrecedenceCutoff")))),
    4: ("SourceQuench", None),
    5: ("Redirect", {0: "Net", 1: "Host", 2: "TOS+Net", 3: "TOS+Host"}),
    8: ("EchoRequest", None),
    9: ("RouterAdvertisement", None),
    10: ("RouterSolicitation", None),
    11: ("TimeExceeded", {0: "TTLExceeded", 1: "FragmentReassemblyTimeExceeded"}),
    12: ("ParameterProblem", {0: "PointerIndicatesError", 1: "MissingOption", 2: "BadLength"}),
    13: ("TimestampRequest", None),
    14: ("TimestampReply", None),
    15: ("InfoRequest", None),
    16: ("InfoReply", None),
    17: ("AddressMaskRequest", None),
    18: ("AddressMaskReply", None),
}
_LOST_SOURCE = "PERF_EVENT_RING_BUFFER"  #: flow.proto LostEventSource: the datapath's ring overflowed


@dataclass(frozen=True)
class LocalEndpoint:
    """A pod's endpoint on its node, as the node's ``cilium_lxc`` holds it."""

    id: int  #: the endpoint id (LXC_ID)
    ifindex: int = 0  #: its host veth (lxc-<pod>)
    mac: str = ""  #: the pod's eth0
    node_mac: str = ""  #: the host veth's


@dataclass
class Names:
    """What Hubble knows about addresses from the agent: pods (name, identity, labels), their endpoints on
    their nodes, nodes, Services' frontends and the nodes' devices; :meth:`for_lab` (a running lab) or
    :meth:`from_topology` (no kernel: endpoint ids in the order the lab creates them, no MACs)."""

    pods: dict[str, tuple[str, int]] = field(default_factory=dict)  #: ip → (pod name, identity)
    nodes: dict[int, str] = field(default_factory=dict)  #: node id → name
    node_ips: dict[str, str] = field(default_factory=dict)  #: ip → node name
    namespace: str = "default"
    pod_nodes: dict[str, str] = field(default_factory=dict)  #: pod ip → its node
    labels: dict[str, list[str]] = field(default_factory=dict)  #: pod ip → its endpoint's labels, sorted
    endpoints: dict[str, LocalEndpoint] = field(default_factory=dict)  #: pod ip → its endpoint on its node
    services: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)  #: (ip, port) → (ns, name)
    devices: dict[str, dict[int, str]] = field(default_factory=dict)  #: node → ifindex → device name
    release: str = DEFAULT_RELEASE  #: the Cilium release whose Hubble CLI prints (labkit.release)

    @classmethod
    def from_topology(cls, topology, devices: dict[str, dict[int, str]] | None = None,
                      release: str = DEFAULT_RELEASE) -> "Names":
        endpoints = {}
        for n in topology.nodes:  # labkit.net.build numbers a node's endpoints from 1 in pod order
            endpoints.update({p.ip: LocalEndpoint(i) for i, p in enumerate(topology.pods_on(n.name), start=1)})
        return cls(
            pods={p.ip: (p.name, p.identity) for p in topology.pods},
            nodes={n.node_id: n.name for n in topology.nodes},
            node_ips={n.ip: n.name for n in topology.nodes},
            pod_nodes={p.ip: p.node for p in topology.pods},
            labels={p.ip: pod_labels(p.labels, namespace="default").printable() for p in topology.pods},
            endpoints=endpoints,
            devices=dict(devices or {}),
            release=release,
        )

    @classmethod
    def for_lab(cls, lab) -> "Names":
        """Everything a node's Hubble resolves names with, read from a running lab: its topology, every
        node's ``cilium_lxc`` (endpoint ids, veths, MACs), its devices and its Services (from the agent;
        none while the agent does not answer)."""
        devices = {node: {int(k): v for k, v in devs.items()} for node, devs in lab.state.devices.items()}
        names = cls.from_topology(lab.topology, devices, lab.config.cilium)
        for node, pin in lab.pin_dirs.items():
            try:
                with PinnedMap(f"{pin}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
                    for key, info in lxc.items():
                        names.endpoints[key.ip] = LocalEndpoint(info.lxc_id, info.ifindex, _mac(info.mac),
                                                                _mac(info.node_mac))
                        names.pod_nodes.setdefault(key.ip, node)
            except (OSError, LabkitError):
                continue
        try:
            services = lab.services.list()
        except (OSError, LabkitError):
            services = []
        for svc in services:
            for fe in svc.frontends:
                names.services[(fe.address, fe.port)] = ("default", svc.name)
        return names

    def local(self, ip: str, node: str) -> LocalEndpoint | None:
        """The endpoint of pod ``ip`` if it lives on ``node`` (Hubble's endpointGetter finds only those)."""
        if ip in self.pods and self.pod_nodes.get(ip) == node:
            return self.endpoints.get(ip)
        return None

    def endpoint(self, ip: str, node: str, identity: int = 0) -> dict:
        """flow.proto Endpoint for ``ip`` seen on ``node``; ``identity`` when the record carries it.

        pkg/hubble/parser/common/endpoint.go ResolveEndpoint: a local endpoint (endpoint.go:139-156) has its
        ID, identity, namespace, labels and pod name (workloads only for a pod a controller made, which lab
        pods are not); any other address (endpoint.go:159-188) its identity, the cluster of its identity's
        labels (``io.cilium.k8s.policy.cluster``), namespace and pod name from the ipcache, and its labels.
        Labels are sorted (common/labels.go:50-55)."""
        if ip in self.pods:
            name, ident = self.pods[ip]
            labels = self.labels.get(ip) or pod_labels(namespace=self.namespace).printable()
            ep = self.local(ip, node)
            cluster = next((lbl.split("=", 1)[1] for lbl in labels
                            if lbl.startswith("k8s:io.cilium.k8s.policy.cluster=")), "")
            return _drop_zero({"ID": ep.id if ep else 0, "identity": identity or ident,
                               "cluster_name": "" if ep else cluster, "namespace": self.namespace,
                               "labels": labels, "pod_name": name})
        if not identity:
            identity = 1 if self.node_ips.get(ip) == node else 6 if ip in self.node_ips else 2
        labels = reserved_labels(identity).printable() if identity in RESERVED_NAMES and identity else []
        return _drop_zero({"identity": identity, "labels": labels})

    def service(self, ip: str, port: int) -> dict:
        """flow.proto Service of a frontend address (daemon/cmd/hubble.go:481-499 GetServiceByAddr: any
        frontend with that address and port, whatever its protocol), or {}."""
        found = self.services.get((ip, port))
        return {"name": found[1], "namespace": found[0]} if found else {}

    def device(self, node: str, name: str) -> int:
        """The ifindex of device ``name`` on ``node`` (0 when unknown)."""
        return next((i for i, n in self.devices.get(node, {}).items() if n == name), 0)

    def prints_lost_events(self) -> bool:
        """Whether the release's ``hubble observe`` prints lost-events responses (labkit.release)."""
        return profile(self.release).has("hubble_lost_events_printed")


def _mac(value: int) -> str:
    """A MAC held in a u64 of cilium_lxc (mac_t: its six bytes first in memory) as Go's net.HardwareAddr prints it."""
    return ":".join(f"{b:02x}" for b in int(value).to_bytes(8, "little")[:6])


def _drop_zero(d: dict) -> dict:
    """protojson leaves out zero values (EmitUnpopulated off)."""
    return {k: v for k, v in d.items() if v not in (0, "", [], {}, None)}


def _rfc3339(wall_ns: int) -> str:
    """A google.protobuf.Timestamp as protojson writes it: RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits
    (the fewest that hold the nanoseconds).

    >>> _rfc3339(1_500_000_000), _rfc3339(1_123_456_000), _rfc3339(1_000_000_001)
    ('1970-01-01T00:00:01.500Z', '1970-01-01T00:00:01.123456Z', '1970-01-01T00:00:01.000000001Z')
    """
    secs, nanos = divmod(wall_ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    if not nanos:
        return f"{stamp}Z"
    frac = f"{nanos:09d}"
    while frac.endswith("000"):
        frac = frac[:-3]
    return f"{stamp}.{frac}Z"


def _l4(t: TraceTuple) -> tuple[dict, str]:
    sport, dport = socket.ntohs(t.sport), socket.ntohs(t.dport)
    if t.proto == socket.IPPROTO_TCP:
        flags = {name: True for name, bit in _TCP_FLAGS if t.tcp_flags & bit}
        summary = "TCP Flags: " + ", ".join(name for name, bit in _TCP_FLAGS if t.tcp_flags & bit)
        # decodeTCP (threefour/parser.go:354-368) always sets Flags: protojson prints a set message, empty or not.
        return {"TCP": {**_drop_zero({"source_port": sport, "destination_port": dport}), "flags": flags}}, summary
    if t.proto == socket.IPPROTO_UDP:
        return {"UDP": _drop_zero({"source_port": sport, "destination_port": dport})}, "UDP"
    if t.proto == socket.IPPROTO_ICMP:
        code = getattr(t, "icmp_code", 0)
        # threefour/parser.go:392-399 decodeICMPv4 (type and code), 271-273 the summary.
        return {"ICMPv4": _drop_zero({"type": t.icmp_type, "code": code})}, f"ICMPv4 {_icmp_text(t.icmp_type, code)}"
    return {}, ""


def _icmp_text(icmp_type: int, code: int) -> str:
    """gopacket's ICMPv4TypeCode.String() of a type and code (:data:`_ICMP_NAMES`).

    >>> _icmp_text(8, 0), _icmp_text(3, 3), _icmp_text(0, 7), _icmp_text(42, 1)
    ('EchoRequest', 'DestinationUnreachable(Port)', 'EchoReply(Code: 7)', '42(1)')
    """
    if icmp_type not in _ICMP_NAMES:
        return f"{icmp_type}({code})"
    name, codes = _ICMP_NAMES[icmp_type]
    if codes is None and code == 0:
        return name
    return f"{name}({codes[code]})" if codes and code in codes else f"{name}(Code: {code})"


def _ports(t: TraceTuple) -> tuple[int, int]:
    """Source and destination port as Hubble's parser takes them for the service lookup (0 without L4 ports)."""
    if t.proto in (socket.IPPROTO_TCP, socket.IPPROTO_UDP, socket.IPPROTO_SCTP):
        return socket.ntohs(t.sport), socket.ntohs(t.dport)
    return 0, 0


def _veth_endpoint(ev: TraceEvent, node: str, names: Names) -> str | None:
    """The pod whose host veth the record's hook ran on (its address), if it is one."""
    for ip, ep in names.endpoints.items():
        if ep.ifindex and ep.ifindex == ev.ifindex and names.pod_nodes.get(ip) == node:
            return ip
    device = names.devices.get(node, {}).get(ev.ifindex, "")
    for ip, (pod, _) in names.pods.items():
        if device and device == f"lxc-{pod}" and names.pod_nodes.get(ip) == node:
            return ip
    # Without the veth's ifindex: the pod a from-container packet left, or a to-container packet goes to.
    ip = ipv4(ev.before.saddr) if ev.hook == _HOOK_FROM_CONTAINER else ipv4(ev.after.daddr)
    return ip if names.local(ip, node) else None


def _ethernet(ip: str | None, names: Names, into_pod: bool) -> dict:
    """flow.proto Ethernet of a frame on a pod's veth: the pod's MAC and its host veth's (the gateway), in the
    direction the frame goes (parser.go:323-328 decodeEthernet); {} when the MACs are not known."""
    ep = names.endpoints.get(ip) if ip else None
    if ep is None or not ep.mac or not ep.node_mac:
        return {}
    if into_pod:  # ipv4_local_delivery rewrites the frame to node_mac -> mac before the endpoint's policy
        return {"source": ep.node_mac, "destination": ep.mac}
    return {"source": ep.mac, "destination": ep.node_mac}


def _direction(source_ep: int | None, src_id: int, is_reply: bool | None) -> str:
    """threefour/parser.go:494-524 decodeTrafficDirection for a trace: known only with a source endpoint and a
    reason; EGRESS when the packet's source is that endpoint and it is no reply (or is a reply and is not)."""
    if not source_ep or is_reply is None:
        return ""
    return "EGRESS" if (source_ep == src_id) != is_reply else "INGRESS"


def _flow(ev: TraceEvent, wall_ns: int, node: str, names: Names) -> dict:
    dropped = ev.verdict == VERDICT_DROPPED
    obs = ev.obs_point
    # The packet as the notification captures it: as received at from-* points and drops, as sent at to-* points.
    t = ev.before if dropped or obs in _FROM_POINTS else ev.after
    src, dst = ipv4(t.saddr), ipv4(t.daddr)
    xlated = ""
    if not dropped and obs == 0 and ev.before.saddr != t.saddr:
        # to-endpoint carries the source before the reply's reverse NAT (bpf_lxc.c:1830 orig_sip, 1976): Hubble
        # takes it as the source and the packet's as source_xlated (threefour/parser.go:173-186).
        xlated, src = src, ipv4(ev.before.saddr)
    l4, summary = _l4(t)
    sport, dport = _ports(t)
    source, destination = names.endpoint(src, node, ev.identity), names.endpoint(dst, node)
    veth = _veth_endpoint(ev, node, names)
    to_pod = obs == 0 or ev.hook == _HOOK_TO_CONTAINER
    pod = dst if obs == 0 else veth
    # The endpoint whose program sent the notification (EVENT_SOURCE): LXC_ID in bpf_lxc (bpf_lxc.c:16; local
    # delivery runs in the destination's program), HOST_EP_ID in bpf_host (bpf_host.c:12), none elsewhere.
    if ev.hook in (_HOOK_FROM_CONTAINER, _HOOK_TO_CONTAINER):
        ep = names.local(pod, node) if pod else None
        event_source = ep.id if ep else None
    elif ev.hook in (_HOOK_FROM_NETDEV, _HOOK_TO_NETDEV):
        event_source = _HOST_SOURCE
    else:
        event_source = None
    src_ep = names.local(src, node)
    src_id = src_ep.id if src_ep else (_HOST_SOURCE if names.node_ips.get(src) == node else 0)
    flow: dict = {"time": _rfc3339(wall_ns), "verdict": "DROPPED" if dropped else "FORWARDED"}
    if dropped:
        flow["drop_reason"] = -ev.drop_reason
    if ev.hook in (_HOOK_FROM_CONTAINER, _HOOK_TO_CONTAINER):
        flow["ethernet"] = _ethernet(pod, names, to_pod)
    flow["IP"] = _drop_zero({"source": src, "source_xlated": xlated, "destination": dst, "ipVersion": "IPv4"})
    flow.update({"l4": l4, "source": source, "destination": destination, "Type": "L3_L4", "node_name": node})
    is_reply = None
    if not dropped and obs in _REASON_POINTS and ev.ct_result != CT_NONE:
        # decodeIsReply (threefour/parser.go:410-430): known only when the trace's reason is.
        is_reply = ev.ct_result == CT_REPLY
        flow["is_reply"] = is_reply
    if dropped:
        reason = -ev.drop_reason
        flow["event_type"] = {"type": MESSAGE_TYPE_DROP, "sub_type": reason}
    else:
        flow["event_type"] = _drop_zero({"type": MESSAGE_TYPE_TRACE, "sub_type": obs})
    flow["source_service"] = names.service(src, sport)
    flow["destination_service"] = names.service(dst, dport)
    if dropped:
        # threefour/parser.go:484-493: a drop's direction from its source endpoint (dn.Source) alone.
        if event_source:
            flow["traffic_direction"] = "EGRESS" if event_source == src_id else "INGRESS"
        flow["drop_reason_desc"] = DROP_REASON_DESC.get(-ev.drop_reason, "DROP_REASON_UNKNOWN")
    else:
        flow["traffic_direction"] = _direction(event_source, src_id, is_reply)
        flow["trace_observation_point"] = OBS_POINTS.get(obs, ("UNKNOWN_POINT", ""))[0]
        if is_reply is not None:
            flow["trace_reason"] = _TRACE_REASONS.get(ev.ct_result, "")
        flow["interface"] = _interface(ev, node, names, pod)
        if obs == 1:  # to-proxy carries the proxy port as its dst_id (bpf_lxc.c:1073-1075, parser.go:630-633)
            flow["proxy_port"] = getattr(ev, "proxy_port", 0)
    flow["Summary"] = summary
    return {k: v for k, v in flow.items() if v not in ({}, "")}


def _interface(ev: TraceEvent, node: str, names: Names, pod: str | None) -> dict:
    """flow.proto NetworkInterface of a trace (threefour/parser.go:598-628: the notification's ifindex, named)."""
    obs = ev.obs_point
    if obs in _NO_INTERFACE_POINTS:
        return {}
    if obs == 0:
        ep = names.local(pod, node) if pod else None
        index = ep.ifindex if ep and ep.ifindex else ev.ifindex if ev.hook == _HOOK_TO_CONTAINER else 0
    elif obs == 4:
        index = names.device(node, "cilium_vxlan")
    else:
        index = ev.ifindex
    if not index:
        return {}
    return _drop_zero({"index": index, "name": names.devices.get(node, {}).get(index, "")})


def _policy_flow(ev: TraceEvent, wall_ns: int, node: str, names: Names) -> dict:
    """A policy verdict notification as Hubble decodes it (parser/threefour on a PolicyVerdictNotify): the
    packet as it met the policy, the peer's identity from the verdict, FORWARDED / DROPPED / AUDIT, the
    direction and the match type; not a reply unless denied, when it is unknown (threefour/parser.go:420-428),
    and no interface (parser.go:598-616: trace notifications only)."""
    verdict = PolicyVerdict.decode(ev.flags >> POLICY_V_SHIFT)
    t = ev.after if verdict.egress else ev.before
    src, dst = ipv4(t.saddr), ipv4(t.daddr)
    l4, summary = _l4(t)
    sport, dport = _ports(t)
    if verdict.egress:
        source, destination = names.endpoint(src, node, ev.identity), names.endpoint(dst, node, ev.remote_id)
    else:
        source, destination = names.endpoint(src, node, ev.remote_id), names.endpoint(dst, node)
    # threefour/parser.go:289-299 decodeVerdict: a verdict below 0 is DROPPED, above 0 (a proxy port) REDIRECTED.
    redirected = not verdict.denied and getattr(ev, "proxy_port", 0)
    flow: dict = {
        "time": _rfc3339(wall_ns),
        "verdict": "DROPPED" if verdict.denied else "REDIRECTED" if redirected else "AUDIT" if verdict.audited
        else "FORWARDED",
    }
    if verdict.denied:
        flow["drop_reason"] = -ev.drop_reason
    if ev.hook in (_HOOK_FROM_CONTAINER, _HOOK_TO_CONTAINER):
        flow["ethernet"] = _ethernet(src if verdict.egress else dst, names, not verdict.egress)
    flow.update({
        "IP": {"source": src, "destination": dst, "ipVersion": "IPv4"},
        "l4": l4,
        "source": source,
        "destination": destination,
        "Type": "L3_L4",
        "node_name": node,
    })
    if not verdict.denied:
        flow["is_reply"] = False
    flow["event_type"] = {"type": MESSAGE_TYPE_POLICY_VERDICT}
    flow["source_service"] = names.service(src, sport)
    flow["destination_service"] = names.service(dst, dport)
    flow["traffic_direction"] = verdict.direction
    if verdict.match:  # protojson leaves out a zero match type (none)
        flow["policy_match_type"] = int(verdict.match)
    if verdict.denied:
        flow["drop_reason_desc"] = DROP_REASON_DESC.get(-ev.drop_reason, "DROP_REASON_UNKNOWN")
    flow["Summary"] = summary
    return {k: v for k, v in flow.items() if v not in ({}, "")}


def response(slot: Slot, names: Names, devices: dict[str, dict[int, str]] | None = None) -> dict:
    """One ring entry as ``hubble observe -o json`` prints it (a GetFlowsResponse); ``devices`` (node →
    ifindex → name) adds to the names' own."""
    node = names.nodes.get(slot.node_id, f"node#{slot.node_id}")
    if slot.kind == SLOT_LOST:
        return {"lost_events": {"source": _LOST_SOURCE, "num_events_lost": str(slot.lost)},
                "node_name": node, "time": _rfc3339(slot.wall_ns)}
    if devices:
        names = dataclasses.replace(names, devices={**devices, **names.devices})
    make = _policy_flow if slot.kind == SLOT_POLICY else _flow
    flow = make(slot.event, slot.wall_ns, node, names)
    # Every decoded event gets a UUID (pkg/hubble/parser/parser.go:137; a random one there, one derived from the
    # entry here, so that reading the ring twice gives the same flow); the deprecated ``reply`` is is_reply's
    # value, written only when true (parser.go:221 in threefour).
    digest = hashlib.sha256(f"{node}/{slot.kind}/{slot.seq}/{slot.wall_ns}".encode()).digest()[:16]
    flow["uuid"] = str(uuid.UUID(bytes=digest, version=4))
    if flow.get("is_reply"):
        flow["reply"] = True
    flow = {k: flow[k] for k in FLOW_FIELDS if k in flow}
    return {"flow": flow, "node_name": node, "time": _rfc3339(slot.wall_ns)}


def printed(resps: Iterable[dict], names: Names) -> list[dict]:
    """The responses ``hubble observe`` of the lab's release prints: v1.16's CLI drops lost-events responses
    (hubble/pkg/printer/printer.go:797-811 WriteGetFlowsResponse prints flows and node status only; the
    lost-events printer came with cilium/cilium#35208, 1.17), for ``-o json`` as for ``-o compact``."""
    if names.prints_lost_events():
        return list(resps)
    return [r for r in resps if "lost_events" not in r]


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


def _host(ip: str, port: int, ep: dict, svc: dict, names: list[str]) -> str:
    """printer.go:775-794 Hostname (IP translation on, the CLI's default): ``namespace/pod``, else
    ``namespace/service``, else the DNS names, else the address; ``:port`` unless 0."""
    if ep.get("pod_name"):
        host = f"{svc.get('namespace') or ep.get('namespace', '')}/{ep['pod_name']}".lstrip("/")
    elif svc.get("name"):
        host = f"{svc.get('namespace', '')}/{svc['name']}".lstrip("/")
    elif names:
        host = ",".join(names)
    else:
        host = ip
    return f"{host}:{port}" if port else host


def _stamp(rfc3339: str) -> str:
    """Go's time.StampMilli (``Jan _2 15:04:05.000``) of a UTC RFC 3339 time, as printer.go writes it."""
    base, _, frac = rfc3339.rstrip("Z").partition(".")
    tm = time.strptime(base, "%Y-%m-%dT%H:%M:%S")
    return f"{time.strftime('%b', tm)} {tm.tm_mday:>2} {time.strftime('%H:%M:%S', tm)}.{(frac + '000')[:3]}"


def compact(resp: dict, node_name: bool = False) -> str:
    """The ``hubble observe -o compact`` line of a GetFlowsResponse (``--print-node-name`` with ``node_name``)."""
    if "lost_events" in resp:
        lost = resp["lost_events"]
        return f"EVENTS LOST: {lost['source']} CPU({lost.get('cpu', 0)}) {lost['num_events_lost']}"
    f = resp["flow"]
    l4 = next(iter(f.get("l4", {}).values()), {})
    src_ep, dst_ep = f.get("source", {}), f.get("destination", {})
    # printer.go:133-167 GetHostNames: a service's namespace wins over the endpoint's.
    src = _host(f["IP"]["source"], l4.get("source_port", 0), src_ep, f.get("source_service", {}),
                f.get("source_names", []))
    dst = _host(f["IP"]["destination"], l4.get("destination_port", 0), dst_ep, f.get("destination_service", {}),
                f.get("destination_names", []))
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
    """The lab's Hubble ring as GetFlowsResponse dicts, oldest first: those the lab's release's ``hubble observe``
    prints (:func:`printed`) and ``flt`` keeps, the last ``last`` of them (all with None) — what
    ``labkit observe --last N`` prints.

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
    names = Names.for_lab(lab)
    resps = printed([response(s, names) for s in slots], names)
    if flt is not None:
        resps = flt.select(resps)
    return resps[-last:] if last else resps if last is None else []
