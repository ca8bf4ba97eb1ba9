"""labkit.observe.hubble: ring entries as Hubble's GetFlowsResponse JSON and compact lines, and
``hubble observe``'s filters, on fabricated and recorded trace records (no kernel).

Expected lines follow hubble/pkg/printer/printer.go (WriteProtoFlow, CompactOutput:
``"%s%s: %s %s %s %s %s %s %s (%s)"``; WriteLostEvent: ``"EVENTS LOST: %s CPU(%d) %d"``), time in
Go's time.StampMilli of the UTC time; the JSON follows api/v1/flow/flow.proto's field names."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from labkit.net.topology import Topology
from labkit.observe.hubble import FLOW_FIELDS, FlowFilter, Names, compact, printed, response, ring_lost
from labkit.observe.ring import SLOT_FLOW, SLOT_LOST, SLOT_POLICY, Slot
from labkit.observe.trace import TraceEvent
from tracefixtures import be16, recorded_event, syn_event, tup

SCHEMA = json.loads((Path(__file__).parent / "data" / "hubble-flow.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
RECORDED = Path(__file__).parent / "data" / "tcp_conn_trace.json"
WALL = 1796178601_123456789  # 2026-12-02T02:30:01.123456789Z (calendar.timegm((2026, 12, 2, 2, 30, 1)))
NAMES = Names.from_topology(Topology.default("demo"))  # a1 .1.11 (256), a2 (257), b1 .2.11 (258), b2 (259)


def flow_slot(ev: TraceEvent, node_id: int = 1) -> Slot:
    return Slot(kind=SLOT_FLOW, node_id=node_id, wall_ns=WALL, event=ev)


def syn_to_overlay() -> Slot:
    """a1's SYN leaving node-a through the tunnel: from-container, redirected, CT new (reason known)."""
    return flow_slot(syn_event(verdict=2, obs_point=4, report=3))


def synack_to_endpoint() -> Slot:
    """b1's SYN-ACK delivered to a1 on node-a: to-container, CT reply."""
    t = tup("198.18.2.11", 8080, "198.18.1.11", 40000, 6, 0x12)
    return flow_slot(syn_event(hook=2, ifindex=7, before=t, after=t, ct_result=2, ct_dir=1, identity=258,
                               obs_point=0, report=3, tunnel_endpoint=0))


def vxlan_from_network() -> Slot:
    """node-b's VXLAN packet arriving at node-a's eth0 (no CT lookup: direction unknown)."""
    t = tup("198.51.100.12", 51000, "198.51.100.11", 8472, 17)
    return flow_slot(syn_event(hook=3, ifindex=2, before=t, after=t, ct_result=0xFF, identity=0, obs_point=10,
                               report=1, tunnel_endpoint=0))


def no_service_drop() -> Slot:
    """a1's UDP datagram to a Service without backends, dropped at node-a's from-container."""
    t = tup("198.18.1.11", 33000, "198.18.100.10", 53, 17)
    return flow_slot(syn_event(before=t, after=t, verdict=3, drop_reason=-158, ct_result=0xFF, obs_point=3,
                               report=1, tunnel_endpoint=0))


def test_compact_line_of_a_syn_to_the_overlay():
    """A forward trace prints source, identities, '->', the monitor's point name, FORWARDED and the flags."""
    assert compact(response(syn_to_overlay(), NAMES)) == \
        "Dec  2 02:30:01.123: default/a1:40000 (ID:256) -> default/b1:8080 (ID:258) to-overlay FORWARDED (TCP Flags: SYN)"


def test_compact_line_of_a_reply_flips_the_ends():
    """A CT reply prints the destination first and '<-' (printer.go flips src/dst for is_reply)."""
    assert compact(response(synack_to_endpoint(), NAMES)) == \
        "Dec  2 02:30:01.123: default/a1:40000 (ID:256) <- default/b1:8080 (ID:258) to-endpoint FORWARDED (TCP Flags: SYN, ACK)"


def test_compact_line_without_ct_reason_is_undirected_and_names_reserved_identities():
    """No CT result: '<>'; node addresses print as IP:port with (host) on their own node, (remote-node) else."""
    assert compact(response(vxlan_from_network(), NAMES), node_name=True) == \
        "Dec  2 02:30:01.123 [node-a]: 198.51.100.12:51000 (remote-node) <> 198.51.100.11:8472 (host) from-network FORWARDED (UDP)"


def test_compact_line_of_a_drop_names_the_reason():
    """A drop prints Cilium's drop reason text as its type, DROPPED, and '<>' (drops have no is_reply)."""
    assert compact(response(no_service_drop(), NAMES)) == \
        "Dec  2 02:30:01.123: default/a1:33000 (ID:256) <> 198.18.100.10:53 (world) Service backend not found DROPPED (UDP)"


def test_lost_events_print_from_1_17_on():
    """v1.16's CLI prints no lost events, in JSON or compact (hubble/pkg/printer/printer.go:797-811@82999990
    WriteGetFlowsResponse passes only flows and node status); from 1.17 (cilium/cilium#35208) they print as
    ``EVENTS LOST: <source> CPU(<n>) <count>`` (CPU 0: the ring is not per CPU here)."""
    slot = Slot(kind=SLOT_LOST, node_id=2, wall_ns=WALL, lost=12)
    flow = response(syn_to_overlay(), NAMES)
    assert printed([flow, response(slot, NAMES)], NAMES) == [flow]
    later = Names.from_topology(Topology.default("demo"), release="1.20")
    assert [compact(r) for r in printed([response(slot, later)], later)] == \
        ["EVENTS LOST: PERF_EVENT_RING_BUFFER CPU(0) 12"]


def _labels(app: str) -> list[str]:
    """The endpoint labels of a default lab pod (its own app label, then the k8s ones every pod carries), sorted
    as common/labels.go:50-55@82999990 SortAndFilterLabels sorts them."""
    return sorted([f"k8s:app={app}", "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default",
                   "k8s:io.cilium.k8s.policy.cluster=default", "k8s:io.cilium.k8s.policy.serviceaccount=default",
                   "k8s:io.kubernetes.pod.namespace=default"])


def test_json_of_a_syn_has_hubble_field_names():
    """The JSON is a GetFlowsResponse with flow.proto's field names, enum names and protojson's omissions.

    Each field as pkg/hubble/parser/threefour/parser.go@82999990 fills it for a trace from a1's bpf_lxc: the local
    endpoint with its ID and no cluster (common/endpoint.go:139-156), the remote one with the cluster of its
    labels and no ID (endpoint.go:159-188); traffic_direction EGRESS (parser.go:494-523: the notification's
    source, LXC_ID bpf_lxc.c:16, is the packet's source endpoint, no reply); trace_reason NEW (parser.go:446-458:
    CT_NEW 0 plus one); to-overlay's interface is ENCAP_IFINDEX, cilium_vxlan (bpf/lib/encap.h:52-53); the uuid
    (parser/parser.go:137) is checked apart."""
    resp = response(syn_to_overlay(), NAMES, {"node-a": {4: "cilium_vxlan", 5: "lxc-a1"}})
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", resp["flow"].pop("uuid"))
    assert resp == {
        "flow": {
            "time": "2026-12-02T02:30:01.123456789Z",
            "verdict": "FORWARDED",
            "IP": {"source": "198.18.1.11", "destination": "198.18.2.11", "ipVersion": "IPv4"},
            "l4": {"TCP": {"source_port": 40000, "destination_port": 8080, "flags": {"SYN": True}}},
            "source": {"ID": 1, "identity": 256, "namespace": "default", "labels": _labels("a1"), "pod_name": "a1"},
            "destination": {"identity": 258, "cluster_name": "default", "namespace": "default",
                            "labels": _labels("b1"), "pod_name": "b1"},
            "Type": "L3_L4",
            "node_name": "node-a",
            "event_type": {"type": 4, "sub_type": 4},
            "traffic_direction": "EGRESS",
            "trace_observation_point": "TO_OVERLAY",
            "trace_reason": "NEW",
            "is_reply": False,
            "interface": {"index": 4, "name": "cilium_vxlan"},
            "Summary": "TCP Flags: SYN",
        },
        "node_name": "node-a",
        "time": "2026-12-02T02:30:01.123456789Z",
    }
    assert list(resp["flow"]) == [k for k in FLOW_FIELDS if k in resp["flow"]]  # protojson's declaration order


def test_json_of_a_drop_and_of_to_endpoint():
    """A drop carries drop_reason, drop_reason_desc and event type 1 with the reason as sub type, its direction
    from its source endpoint (parser.go:484-493@82999990: a1's own bpf_lxc, so EGRESS), no is_reply, trace
    reason or interface (parser.go:410-430, 598-616); to-endpoint is trace point 0, which protojson leaves out
    of event_type, a reply (``reply`` too, parser.go:221), INGRESS-side program seeing a reply: EGRESS
    (parser.go:516-519)."""
    drop = response(no_service_drop(), NAMES)["flow"]
    assert (drop["verdict"], drop["drop_reason"], drop["drop_reason_desc"], drop["event_type"]) == \
        ("DROPPED", 158, "SERVICE_BACKEND_NOT_FOUND", {"type": 1, "sub_type": 158})
    assert drop["traffic_direction"] == "EGRESS"
    assert not {"trace_observation_point", "is_reply", "trace_reason", "interface"} & set(drop)
    reply = response(synack_to_endpoint(), NAMES, {"node-a": {7: "lxc-a1"}})["flow"]
    assert (reply["event_type"], reply["trace_observation_point"], reply["is_reply"], reply["reply"]) == \
        ({"type": 4}, "TO_ENDPOINT", True, True)
    assert (reply["trace_reason"], reply["traffic_direction"], reply["interface"]) == \
        ("REPLY", "EGRESS", {"index": 7, "name": "lxc-a1"})
    assert reply["l4"]["TCP"]["flags"] == {"SYN": True, "ACK": True}
    assert reply["destination"]["ID"] == 1 and "ID" not in reply["source"]


def _recorded_slots() -> list[Slot]:
    data = json.loads(RECORDED.read_text())
    node_ids = {"node-a": 1, "node-b": 2}
    slots = []
    for steps in data["connections"].values():
        for step in steps:
            for f in step["flows"]:
                slots.append(flow_slot(recorded_event(f["event"]), node_ids[f["node"]]))
    return slots


def test_every_json_line_validates_against_hubbles_flow_schema():
    """Every response — recorded flows of real connections, a drop, lost events of both sources — validates
    against the schema written from flow.proto and observer.proto."""
    slots = _recorded_slots() + [syn_to_overlay(), synack_to_endpoint(), vxlan_from_network(), no_service_drop(),
                                 Slot(kind=SLOT_LOST, node_id=1, wall_ns=WALL, lost=3)]
    assert len(slots) > 20
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    for slot in slots:
        VALIDATOR.validate(json.loads(json.dumps(response(slot, NAMES))))
    VALIDATOR.validate(ring_lost(7, WALL))


def test_schema_rejects_what_hubble_would_not_write():
    """The schema is strict enough to catch a misnamed field, a wrong enum name and a numeric uint64."""
    good = response(syn_to_overlay(), NAMES)
    for bad in ({**good, "flow": {**good["flow"], "src": "x"}},
                {**good, "flow": {**good["flow"], "verdict": "FORWARD"}},
                {"lost_events": {"source": "PERF_EVENT_RING_BUFFER", "num_events_lost": 3}, "time": good["time"]}):
        with pytest.raises(jsonschema.ValidationError):
            VALIDATOR.validate(bad)


def _sample() -> dict[str, dict]:
    resps = {
        "syn": response(syn_to_overlay(), NAMES),
        "synack": response(synack_to_endpoint(), NAMES),
        "vxlan": response(vxlan_from_network(), NAMES),
        "drop": response(no_service_drop(), NAMES),
        "lost": response(Slot(kind=SLOT_LOST, node_id=2, wall_ns=WALL, lost=1), NAMES),
    }
    a2_b2 = syn_event(before=tup("198.18.1.12", 41000, "198.18.2.12", 9090, 6, 0x02), obs_point=4, verdict=2)
    a2_b2.after = a2_b2.before
    resps["a2b2"] = response(flow_slot(a2_b2, node_id=2), NAMES)
    return resps


@pytest.mark.parametrize("criteria, expected", [
    ({"from_pods": ["a1"]}, {"syn", "drop", "lost"}),
    ({"from_pods": ["default/a"]}, {"syn", "drop", "a2b2", "lost"}),
    ({"from_pods": ["kube-system/a1"]}, {"lost"}),
    ({"to_pods": ["b1"]}, {"syn", "lost"}),
    ({"pods": ["b1"]}, {"syn", "synack", "lost"}),
    ({"verdicts": ["DROPPED"]}, {"drop", "lost"}),
    ({"verdicts": ["forwarded"]}, {"syn", "synack", "vxlan", "a2b2", "lost"}),
    ({"protocols": ["udp"]}, {"vxlan", "drop", "lost"}),
    ({"protocols": ["tcp"], "ports": [8080]}, {"syn", "synack", "lost"}),
    ({"ports": [40000]}, {"syn", "synack", "lost"}),
    ({"from_ips": ["198.51.100.0/24"]}, {"vxlan", "lost"}),
    ({"to_ips": ["198.18.2.12"]}, {"a2b2", "lost"}),
    ({"nodes": ["node-b"]}, {"a2b2", "lost"}),
    ({"nodes": ["node-*"], "from_pods": ["a2"]}, {"a2b2", "lost"}),
])
def test_filters_select_exactly_the_matching_flows(criteria, expected):
    """Each hubble observe filter (and a conjunction) keeps exactly the flows that match; lost events always pass."""
    sample = _sample()
    flt = FlowFilter(**criteria)
    assert {name for name, r in sample.items() if flt.matches(r)} == expected


def test_filter_rejects_unknown_protocol_and_bad_address():
    """An unknown protocol or a malformed address is a ValueError naming it."""
    with pytest.raises(ValueError, match="protocol 'tpc'"):
        FlowFilter(protocols=["tpc"])
    with pytest.raises(ValueError):
        FlowFilter(from_ips=["198.18.1.300"])


def test_be16_helper_matches_network_order():
    """The fixtures' ports are in network order, as the datapath writes them (sanity of the test data)."""
    assert be16(8080) == 0x901F


def denied_ingress_verdict() -> Slot:
    """a2's SYN to a1:8080 meeting a1's ingress policy on node-a (no entry matched: match type none), denied; the
    record's policy byte is POLICY_INGRESS | POLICY_V_DENIED and remote_id a2's identity."""
    t = tup("198.18.1.12", 44172, "198.18.1.11", 8080, 6, 0x02)
    ev = syn_event(hook=2, ifindex=6, before=t, after=t, verdict=3, drop_reason=-133, ct_result=0, ct_dir=1,
                   identity=257, remote_id=257, obs_point=0, report=1, tunnel_endpoint=0,
                   flags=(0x01 | 0x80) << 8)
    return Slot(kind=SLOT_POLICY, node_id=1, wall_ns=WALL, event=ev)


def allowed_egress_verdict() -> Slot:
    """a1's SYN to b1:8080 allowed by a1's egress rule for b1's identity on 8080 (match type L3-L4)."""
    ev = syn_event(remote_id=258, flags=(0x02 | (2 << 3)) << 8)
    return Slot(kind=SLOT_POLICY, node_id=1, wall_ns=WALL, event=ev)


def test_a_policy_verdict_is_its_own_hubble_event():
    """A record with a policy verdict gives Hubble's policy-verdict event (type 5): the direction, the match type
    (left out when none, as protojson does), DROPPED with the drop reason when denied, FORWARDED when allowed,
    the peer's identity from the verdict. An allowed verdict is no reply (is_reply false); a denied one's is
    unknown: no is_reply in the JSON and ``<>`` in the compact line (threefour/parser.go:420-429@82999990
    decodeIsReply: only ``pvn.Verdict >= 0`` gets a value; hubble/pkg/printer/printer.go:365-374@82999990: a nil
    is_reply prints ``<>``). Neither carries an interface (parser.go:598-616: trace notifications only)."""
    denied = response(denied_ingress_verdict(), NAMES)["flow"]
    assert (denied["event_type"], denied["verdict"], denied["traffic_direction"], denied["drop_reason_desc"]) == \
        ({"type": 5}, "DROPPED", "INGRESS", "POLICY_DENIED")
    assert "policy_match_type" not in denied and "is_reply" not in denied and "interface" not in denied
    assert (denied["source"]["identity"], denied["destination"]["identity"]) == (257, 256)
    assert compact(response(denied_ingress_verdict(), NAMES)) == \
        "Dec  2 02:30:01.123: default/a2:44172 (ID:257) <> default/a1:8080 (ID:256) " \
        "policy-verdict:none INGRESS DENIED (TCP Flags: SYN)"
    allowed = response(allowed_egress_verdict(), NAMES)["flow"]
    assert (allowed["verdict"], allowed["traffic_direction"], allowed["policy_match_type"]) == ("FORWARDED", "EGRESS", 2)
    assert "drop_reason_desc" not in allowed and allowed["destination"]["identity"] == 258
    assert allowed["is_reply"] is False and "interface" not in allowed
    assert compact(response(allowed_egress_verdict(), NAMES)).endswith(
        "default/a1:40000 (ID:256) -> default/b1:8080 (ID:258) policy-verdict:L3-L4 EGRESS ALLOWED (TCP Flags: SYN)")
    for slot in (denied_ingress_verdict(), allowed_egress_verdict()):
        VALIDATOR.validate(response(slot, NAMES))


def test_every_drop_reason_labkit_knows_has_its_hubble_name():
    """Each DropReason the datapath can report has a drop_reason_desc, and it is one of flow.proto's names (a
    reason without one would print DROP_REASON_UNKNOWN)."""
    from labkit.constants import DropReason
    from labkit.observe.hubble import DROP_REASON_DESC

    names = SCHEMA["properties"]["flow"]["properties"]["drop_reason_desc"]["enum"]
    assert sorted(DROP_REASON_DESC) == sorted(-int(r) for r in DropReason)
    assert set(DROP_REASON_DESC.values()) <= set(names)
