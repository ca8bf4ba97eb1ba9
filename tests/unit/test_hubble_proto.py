"""Every event type labkit's Hubble emits, checked against flow.proto's JSON mapping as ``hubble observe -o json``
writes it (no kernel).

``-o json`` is JSONPB (hubble/cmd/observe/flows.go:665-673@82999990, unless the legacy-JSON compat flag is set):
``json.Encoder`` over GetFlowsResponse, whose MarshalJSON is protojson with UseProtoNames
(api/v1/observer/observer.pb.json.go:13-18@82999990). So: the proto field names as written in the .proto (``IP``,
``Type``, ``ipVersion``, ``Summary``), fields in declaration order, zero scalars and zero enums left out, set
messages written even when empty, enums by name, 64-bit integers as strings, BoolValue as a bare boolean,
Timestamp as RFC 3339 in UTC with 0, 3, 6 or 9 fractional digits.

The tables below are the messages and enums of api/v1/flow/flow.proto@82999990 labkit writes, each field with
its line there; the per-event rules are pkg/hubble/parser/threefour/parser.go@82999990 Decode (97-238).
"""
from __future__ import annotations

import re

import pytest

from labkit.net.topology import Topology
from labkit.observe.hubble import DROP_REASON_DESC, FLOW_FIELDS, Names, printed, response
from labkit.observe.ring import SLOT_FLOW, SLOT_LOST, SLOT_POLICY, Slot
from tracefixtures import syn_event, tup

WALL = 1796178601_123456789

#: message → [(field, line in flow.proto, kind)], in declaration order. Kinds: ts, str, u32, i32, u64, bool,
#: boolvalue, enum:<E>, msg:<M>, rep:str, rep:<M>, oneof:<M> (a oneof's member).
MESSAGES = {
    "Flow": [("time", 15, "ts"), ("uuid", 18, "str"), ("verdict", 20, "enum:Verdict"), ("drop_reason", 23, "u32"),
             ("auth_type", 27, "enum:AuthType"), ("ethernet", 30, "msg:Ethernet"), ("IP", 32, "msg:IP"),
             ("l4", 34, "msg:Layer4"), ("source", 38, "msg:Endpoint"), ("destination", 39, "msg:Endpoint"),
             ("Type", 41, "enum:FlowType"), ("node_name", 44, "str"), ("node_labels", 46, "rep:str"),
             ("source_names", 51, "rep:str"), ("destination_names", 53, "rep:str"), ("l7", 56, "msg:Layer7"),
             ("reply", 61, "bool"), ("event_type", 66, "msg:CiliumEventType"), ("source_service", 69, "msg:Service"),
             ("destination_service", 71, "msg:Service"), ("traffic_direction", 74, "enum:TrafficDirection"),
             ("policy_match_type", 78, "u32"), ("trace_observation_point", 81, "enum:TraceObservationPoint"),
             ("trace_reason", 83, "enum:TraceReason"), ("drop_reason_desc", 86, "enum:DropReason"),
             ("is_reply", 91, "boolvalue"), ("debug_capture_point", 94, "enum:DebugCapturePoint"),
             ("interface", 97, "msg:NetworkInterface"), ("proxy_port", 100, "u32"),
             ("trace_context", 104, "msg:TraceContext"), ("sock_xlate_point", 108, "enum:SocketTranslationPoint"),
             ("socket_cookie", 112, "u64"), ("cgroup_id", 116, "u64"), ("Summary", 121, "str"),
             ("extensions", 126, "msg:Any"), ("egress_allowed_by", 129, "rep:Policy"),
             ("ingress_allowed_by", 131, "rep:Policy"), ("egress_denied_by", 134, "rep:Policy"),
             ("ingress_denied_by", 136, "rep:Policy")],
    "Endpoint": [("ID", 255, "u32"), ("identity", 256, "u32"), ("cluster_name", 257, "str"), ("namespace", 258, "str"),
                 ("labels", 260, "rep:str"), ("pod_name", 261, "str"), ("workloads", 262, "rep:Workload")],
    "Workload": [("name", 266, "str"), ("kind", 267, "str")],
    "IP": [("source", 277, "str"), ("source_xlated", 280, "str"), ("destination", 281, "str"),
           ("ipVersion", 282, "enum:IPVersion"), ("encrypted", 285, "bool")],
    "Ethernet": [("source", 289, "str"), ("destination", 290, "str")],
    "Layer4": [("TCP", 209, "oneof:TCP"), ("UDP", 210, "oneof:UDP"), ("ICMPv4", 212, "oneof:ICMPv4"),
               ("ICMPv6", 213, "oneof:ICMPv6"), ("SCTP", 214, "oneof:SCTP")],
    "TCP": [("source_port", 271, "u32"), ("destination_port", 272, "u32"), ("flags", 273, "msg:TCPFlags")],
    "TCPFlags": [(f, 293 + i, "bool") for i, f in enumerate(("FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR", "NS"), 1)],
    "UDP": [("source_port", 306, "u32"), ("destination_port", 307, "u32")],
    "ICMPv4": [("type", 316, "u32"), ("code", 317, "u32")],
    "CiliumEventType": [("type", 488, "i32"), ("sub_type", 493, "i32")],
    "Service": [("name", 674, "str"), ("namespace", 675, "str")],
    "NetworkInterface": [("index", 806, "u32"), ("name", 807, "str")],
    "LostEvent": [("source", 698, "enum:LostEventSource"), ("num_events_lost", 700, "u64"), ("cpu", 703, "i32value")],
}
#: observer.proto@82999990:145-159 GetFlowsResponse (oneof response_types, then node_name and time).
RESPONSE = [("flow", 147, "oneof:Flow"), ("node_status", 150, "oneof:NodeStatusEvent"),
            ("lost_events", 153, "oneof:LostEvent"), ("node_name", 156, "str"), ("time", 158, "ts")]
#: enum → its names, value 0 first (protojson never writes the zero name of a set field: it leaves the field out).
ENUMS = {
    "Verdict": ["VERDICT_UNKNOWN", "FORWARDED", "DROPPED", "ERROR", "AUDIT", "REDIRECTED", "TRACED", "TRANSLATED"],  # 331-354
    "FlowType": ["UNKNOWN_TYPE", "L3_L4", "L7", "SOCK"],  # 139-144
    "AuthType": ["DISABLED", "SPIRE", "TEST_ALWAYS_FAIL"],  # 147-151
    "TraceObservationPoint": ["UNKNOWN_POINT", "TO_PROXY", "TO_HOST", "TO_STACK", "TO_OVERLAY", "TO_ENDPOINT",
                              "FROM_ENDPOINT", "FROM_PROXY", "FROM_HOST", "FROM_STACK", "FROM_OVERLAY",
                              "FROM_NETWORK", "TO_NETWORK"],  # 153-193
    "TraceReason": ["TRACE_REASON_UNKNOWN", "NEW", "ESTABLISHED", "REPLY", "RELATED", "REOPENED", "SRV6_ENCAP",
                    "SRV6_DECAP", "ENCRYPT_OVERLAY"],  # 195-205
    "IPVersion": ["IP_NOT_USED", "IPv4", "IPv6"],  # 325-329
    "TrafficDirection": ["TRAFFIC_DIRECTION_UNKNOWN", "INGRESS", "EGRESS"],  # 442-446
    "LostEventSource": ["UNKNOWN_LOST_EVENT_SOURCE", "PERF_EVENT_RING_BUFFER", "OBSERVER_EVENTS_QUEUE",
                        "HUBBLE_RING_BUFFER"],  # 678-692
}
#: DropReason (359-440): the values labkit's datapath reports, as numbered there.
DROP_REASONS = {132: "INVALID_SOURCE_IP", 133: "POLICY_DENIED", 134: "INVALID_PACKET_DROPPED",
                135: "CT_TRUNCATED_OR_INVALID_HEADER", 137: "CT_UNKNOWN_L4_PROTOCOL", 139: "UNSUPPORTED_L3_PROTOCOL",
                141: "ERROR_WRITING_TO_PACKET", 142: "UNKNOWN_L4_PROTOCOL", 147: "ERROR_RETRIEVING_TUNNEL_KEY",
                153: "ERROR_WHILE_CORRECTING_L3_CHECKSUM", 154: "ERROR_WHILE_CORRECTING_L4_CHECKSUM",
                155: "CT_MAP_INSERTION_FAILED", 157: "IP_FRAGMENTATION_NOT_SUPPORTED", 158: "SERVICE_BACKEND_NOT_FOUND",
                160: "NO_TUNNEL_OR_ENCAPSULATION_ENDPOINT", 167: "NO_MAPPING_FOR_NAT_MASQUERADE",
                169: "FIB_LOOKUP_FAILED", 178: "SOCKET_LOOKUP_FAILED", 179: "SOCKET_ASSIGN_FAILED",
                180: "PROXY_REDIRECTION_NOT_SUPPORTED_FOR_PROTOCOL", 181: "POLICY_DENY", 196: "TTL_EXCEEDED"}
_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.(\d{3}|\d{6}|\d{9}))?Z$")


def check(value, kind: str, where: str) -> None:
    """``value`` is what protojson writes for a field of ``kind`` (a set field: zero scalars never appear)."""
    if kind == "ts":
        assert isinstance(value, str) and _TS.match(value), (where, value)
        frac = value[20:-1] if "." in value else ""
        assert not frac.endswith("000"), (where, value)  # the fewest of 0/3/6/9 digits
    elif kind == "str":
        assert isinstance(value, str) and value, (where, value)
    elif kind in ("u32", "i32"):
        assert isinstance(value, int) and not isinstance(value, bool) and value != 0, (where, value)
        assert value > 0 or kind == "i32", (where, value)
    elif kind == "u64":
        assert isinstance(value, str) and value.isdigit() and value != "0", (where, value)
    elif kind == "bool":
        assert value is True, (where, value)  # false is the zero value
    elif kind in ("boolvalue", "i32value"):  # wrappers: written bare, their zero too
        assert isinstance(value, bool if kind == "boolvalue" else int), (where, value)
    elif kind.startswith("enum:"):
        names = ENUMS.get(kind[5:])
        if kind == "enum:DropReason":
            names = ["DROP_REASON_UNKNOWN", *DROP_REASONS.values()]
        assert isinstance(value, str) and value in names[1:], (where, value)
    elif kind.startswith("rep:"):
        assert isinstance(value, list) and value, (where, value)
        for i, item in enumerate(value):
            check(item, "str" if kind == "rep:str" else "msg:" + kind[4:], f"{where}[{i}]")
    elif kind.startswith(("msg:", "oneof:")):
        message(value, kind.split(":")[1], where)
    else:
        raise AssertionError(f"{where}: unknown kind {kind}")


def message(value: dict, name: str, where: str) -> None:
    """A message: only its fields, in declaration order, each as its kind says."""
    assert isinstance(value, dict), (where, value)
    fields = MESSAGES[name]
    order = [f for f, _, _ in fields]
    assert set(value) <= set(order), f"{where}: {sorted(set(value) - set(order))} are not fields of {name}"
    assert list(value) == [f for f in order if f in value], f"{where}: not in {name}'s declaration order"
    if name == "Layer4":
        assert len(value) == 1, f"{where}: a oneof holds one member"
    for f, _, kind in fields:
        if f in value:
            check(value[f], kind, f"{where}.{f}")


def get_flows_response(resp: dict) -> None:
    order = [f for f, _, _ in RESPONSE]
    assert set(resp) <= set(order) and list(resp) == [f for f in order if f in resp], resp.keys()
    assert sum(k in resp for k in ("flow", "node_status", "lost_events")) == 1
    for f, _, kind in RESPONSE:
        if f in resp:
            check(resp[f], kind, f)


NAMES = Names.from_topology(Topology.default("demo"), {"node-a": {4: "cilium_vxlan", 5: "lxc-a1", 6: "lxc-a2"},
                                                       "node-b": {4: "cilium_vxlan", 5: "lxc-b1", 7: "eth0"}})
A1_B1 = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x02)
B1_A1 = tup("198.18.2.11", 8080, "198.18.1.11", 40000, 6, 0x12)


def _slot(kind=SLOT_FLOW, node_id=1, **ev) -> Slot:
    return Slot(kind=kind, node_id=node_id, wall_ns=WALL, seq=7, event=syn_event(**ev))


#: name → (slot, event type): one of each event labkit emits. Traces at every observation point labkit's hooks
#: report (bpf/lib/trace.h trace_obs_point and trace_emit_at), drops, policy verdicts of each outcome.
EVENTS = {
    "to-overlay": (_slot(verdict=2, obs_point=4), "trace"),
    "to-stack": (_slot(verdict=1, obs_point=3, tunnel_endpoint=0), "trace"),
    "to-proxy": (_slot(before=tup("198.18.1.11", 33000, "198.18.1.2", 53, 17),
                       after=tup("198.18.1.11", 33000, "198.18.1.2", 53, 17), obs_point=1, proxy_port=10053,
                       tunnel_endpoint=0), "trace"),
    "from-endpoint": (_slot(before=tup("198.18.1.11", 40000, "198.18.1.12", 8080, 6, 0x02),
                            after=tup("198.18.1.11", 40000, "198.18.1.12", 8080, 6, 0x02), obs_point=5,
                            tunnel_endpoint=0), "trace"),
    "to-endpoint reply": (_slot(hook=2, ifindex=5, before=B1_A1, after=B1_A1, ct_result=2, ct_dir=1, obs_point=0,
                                tunnel_endpoint=0), "trace"),
    "from-overlay": (_slot(hook=5, ifindex=4, node_id=2, ct_result=0xFF, obs_point=9, tunnel_endpoint=0), "trace"),
    "from-network": (_slot(hook=3, ifindex=7, node_id=2, before=tup("198.51.100.11", 51000, "198.51.100.12", 8472, 17),
                           after=tup("198.51.100.11", 51000, "198.51.100.12", 8472, 17), ct_result=0xFF, identity=0,
                           obs_point=10, tunnel_endpoint=0), "trace"),
    "to-network": (_slot(hook=4, ifindex=7, node_id=2, before=tup("198.51.100.12", 51000, "198.51.100.11", 8472, 17),
                         after=tup("198.51.100.12", 51000, "198.51.100.11", 8472, 17), ct_result=0xFF, identity=0,
                         obs_point=11, tunnel_endpoint=0), "trace"),
    "icmp echo reply": (_slot(hook=2, ifindex=5, before=tup("198.18.2.11", 7, "198.18.1.11", 0, 1),
                              after=tup("198.18.2.11", 7, "198.18.1.11", 0, 1), ct_result=2, obs_point=0,
                              tunnel_endpoint=0), "trace"),
    "drop": (_slot(verdict=3, drop_reason=-158, ct_result=0xFF, obs_point=3, tunnel_endpoint=0), "drop"),
    "allowed egress verdict": (_slot(SLOT_POLICY, remote_id=258, flags=(0x02 | (2 << 3)) << 8), "policy"),
    "denied ingress verdict": (_slot(SLOT_POLICY, node_id=2, hook=2, ifindex=5, verdict=3, drop_reason=-133,
                                     remote_id=256, flags=(0x01 | 0x80) << 8, tunnel_endpoint=0), "policy"),
    "audit verdict": (_slot(SLOT_POLICY, remote_id=258, flags=(0x02 | (2 << 3) | 0x40) << 8), "policy"),
    "redirected verdict": (_slot(SLOT_POLICY, remote_id=2, proxy_port=10053, flags=(0x02 | (2 << 3)) << 8,
                                 before=tup("198.18.1.11", 33000, "198.18.1.2", 53, 17),
                                 after=tup("198.18.1.11", 33000, "198.18.1.2", 53, 17)), "policy"),
}


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_every_event_is_flow_proto_json(name):
    """Each event labkit emits is a GetFlowsResponse in protojson's mapping of flow.proto, and carries the fields
    its event type carries in threefour's Decode: traces their observation point (parser.go:117-132) and no drop
    fields, is_reply with trace_reason exactly when the reason is known (410-430, 439-460); drops their reason,
    its name and the reason as sub type (110-116, 304-313), no is_reply, trace fields or interface (598-616);
    policy verdicts their direction (526-531), is_reply false unless denied (420-428), the drop reason when
    denied, no trace fields or interface."""
    slot, kind = EVENTS[name]
    resp = response(slot, NAMES)
    get_flows_response(resp)
    f = resp["flow"]
    assert list(f) == [k for k in FLOW_FIELDS if k in f]
    assert f["Type"] == "L3_L4" and f["IP"]["ipVersion"] == "IPv4" and f["time"] == resp["time"]
    etype = f["event_type"]
    if kind == "trace":
        assert etype["type"] == 4 and etype.get("sub_type", 0) == slot.event.obs_point
        assert f["verdict"] == "FORWARDED" and "trace_observation_point" in f
        assert not {"drop_reason", "drop_reason_desc", "policy_match_type"} & set(f)
        assert ("is_reply" in f) == ("trace_reason" in f)
        assert ("interface" in f) == (slot.event.obs_point not in (1, 3, 5))
        assert ("proxy_port" in f) == (slot.event.obs_point == 1)
    elif kind == "drop":
        assert (etype["type"], etype["sub_type"], f["drop_reason"]) == (1, 158, 158)
        assert f["verdict"] == "DROPPED" and f["drop_reason_desc"] == DROP_REASONS[158]
        assert not {"is_reply", "reply", "trace_observation_point", "trace_reason", "interface"} & set(f)
    else:
        assert etype == {"type": 5} and f["traffic_direction"] in ("INGRESS", "EGRESS")
        assert not {"trace_observation_point", "trace_reason", "interface", "proxy_port"} & set(f)
        assert ("is_reply" in f) == (f["verdict"] != "DROPPED")
        assert ("drop_reason" in f) == ("drop_reason_desc" in f) == (f["verdict"] == "DROPPED")


def test_verdicts_of_policy_events():
    """A policy verdict is FORWARDED, DROPPED, AUDIT or REDIRECTED (parser.go:289-299@82999990: a verdict below 0
    dropped, above 0 — a proxy port — redirected, audited when the audit flag is set)."""
    got = {name: response(slot, NAMES)["flow"]["verdict"] for name, (slot, kind) in EVENTS.items() if kind == "policy"}
    assert got == {"allowed egress verdict": "FORWARDED", "denied ingress verdict": "DROPPED",
                   "audit verdict": "AUDIT", "redirected verdict": "REDIRECTED"}


def test_empty_messages_are_written():
    """protojson writes a set message even when all its fields are zero: an ICMP echo reply (type 0, code 0) has
    ``"l4": {"ICMPv4": {}}`` (decodeICMPv4 always sets it, parser.go:392-399@82999990)."""
    f = response(EVENTS["icmp echo reply"][0], NAMES)["flow"]
    assert f["l4"] == {"ICMPv4": {}} and f["Summary"] == "ICMPv4 EchoReply"


def test_lost_events_are_flow_proto_json():
    """A lost-events response (printed from 1.17 on): LostEvent's source by name and num_events_lost, a uint64, as
    a string (flow.proto:696-704@82999990)."""
    names = Names.from_topology(Topology.default("demo"), release="1.20")
    resp = response(Slot(kind=SLOT_LOST, node_id=1, wall_ns=WALL, lost=12), names)
    get_flows_response(resp)
    assert resp["lost_events"] == {"source": "PERF_EVENT_RING_BUFFER", "num_events_lost": "12"}
    assert printed([resp], names) == [resp] and printed([resp], NAMES) == []


def test_drop_reason_names_are_flow_protos():
    """labkit's drop reasons carry flow.proto's DropReason name for their number (flow.proto:359-440@82999990)."""
    assert DROP_REASON_DESC == DROP_REASONS


def test_timestamps_use_protojsons_fraction_digits():
    """protojson writes a Timestamp's fraction with 0, 3, 6 or 9 digits, the fewest that hold it."""
    times = {}
    for ns in (0, 500_000_000, 123_456_000, 123_456_789):
        times[ns] = response(Slot(kind=SLOT_FLOW, node_id=1, wall_ns=1796178601_000000000 + ns,
                                  event=syn_event(verdict=2, obs_point=4)), NAMES)["time"]
    assert times == {0: "2026-12-02T02:30:01Z", 500_000_000: "2026-12-02T02:30:01.500Z",
                     123_456_000: "2026-12-02T02:30:01.123456Z", 123_456_789: "2026-12-02T02:30:01.123456789Z"}
