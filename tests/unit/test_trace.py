"""Trace records: the 96-byte event, Hubble-like flow lines, JSON, and the events.bin reader."""
from __future__ import annotations

import ctypes
import socket
import struct

import pytest

from labkit.constants import DropReason
from labkit.observe.trace import EVENT_SIZE, EventLog, Flow, TraceEvent, TraceTuple
from tracefixtures import syn_event, tup

NODES = {1: "node-a", 2: "node-b"}
DEVICES = {"node-a": {5: "lxc-a1", 2: "eth0"}, "node-b": {2: "eth0"}}

# Hubble's wording of Cilium's drop reasons (pkg/monitor/api/drop.go), by the absolute code.
HUBBLE_DROP_TEXT = {
    132: "Invalid source ip",
    134: "Invalid packet",
    135: "CT: Truncated or invalid header",
    137: "CT: Unknown L4 protocol",
    139: "Unsupported L3 protocol",
    141: "Error writing to packet",
    142: "Unknown L4 protocol",
    147: "Error retrieving tunnel key",
    153: "Error while correcting L3 checksum",
    154: "Error while correcting L4 checksum",
    155: "CT: Map insertion failed",
    157: "IP fragmentation not supported",
    158: "Service backend not found",
    160: "No tunnel/encapsulation endpoint (datapath BUG!)",
    167: "No mapping for NAT masquerade",
    169: "FIB lookup failed",
    178: "Socket lookup failed",
    179: "Socket assign failed",
    180: "Proxy redirection not supported for protocol",
    133: "Policy denied",
    181: "Policy denied by denylist",
    196: "TTL exceeded",  # pkg/monitor/api/drop.go:94@82999990
}


def test_event_size():
    """struct trace_event is 104 bytes and EVENT_SIZE says so."""
    assert ctypes.sizeof(TraceEvent) == 104 == EVENT_SIZE
    assert ctypes.sizeof(TraceTuple) == 16


def test_event_bytes_layout():
    """Addresses and ports sit in the record in network byte order at trace_event's offsets."""
    raw = bytes(syn_event())
    assert raw[16] == 1 and raw[17] == 1  # node_id, hook
    # 8+4+4 bytes, four u8, s16, u16, u32, four u8 → tunnel_endpoint at 32, identity 36, before at 40
    assert raw[32:36] == socket.inet_aton("198.51.100.12")  # tunnel_endpoint
    assert raw[40:44] == socket.inet_aton("198.18.1.11")  # before.saddr
    assert raw[48:50] == struct.pack(">H", 40000)  # before.sport
    assert raw[20:22] == struct.pack("<h", 0)  # drop_reason


def test_flow_line_syn():
    """A SYN at from-container reads: node, hook label, device, addresses, SYN, ct=new/egress, verdict, tunnel."""
    flow = Flow.decode(bytes(syn_event()), {1: "node-a"}, {"node-a": {5: "lxc-a1"}})
    line = flow.line()
    assert (flow.node, flow.device) == ("node-a", "lxc-a1")
    for part in ("node-a", "from-container", "lxc-a1", "198.18.1.11:40000 -> 198.18.2.11:8080", "TCP SYN",
                 "ct=new/egress", "FORWARDED", "198.51.100.12"):
        assert part in line, (part, line)
    assert line.index("node-a") < line.index("from-container") < line.index("lxc-a1") < line.index("198.18.1.11")
    assert "=>" not in line and "vxlan" not in line  # not translated, no inner packet
    assert not flow.dropped and not flow.translated


def test_flow_unknown_node_and_device():
    """Unknown ids decode to node#<id> and if<ifindex>."""
    flow = Flow.decode(bytes(syn_event(node_id=9, ifindex=77)), NODES, DEVICES)
    assert (flow.node, flow.device) == ("node#9", "if77")


def test_flow_line_no_ct():
    """Hooks without a CT lookup (CT_NONE) print no ct= part."""
    flow = Flow.decode(bytes(syn_event(hook=4, ifindex=2, ct_result=0xFF, ct_dir=0xFF, tunnel_endpoint=0)), NODES, DEVICES)
    line = flow.line()
    assert "to-netdev" in line and "eth0" in line and "ct=" not in line


def test_flow_line_translated_and_inner():
    """A rewritten packet shows '=> after', a VXLAN packet its inner flow."""
    after = tup("198.18.1.11", 40000, "198.18.2.12", 8080, 6, 0x02)
    inner = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x10)
    ev = syn_event(after=after, inner=inner)
    flow = Flow.decode(bytes(ev), NODES, DEVICES)
    assert flow.translated
    line = flow.line()
    assert "=> 198.18.1.11:40000 -> 198.18.2.12:8080 TCP SYN" in line
    assert "198.18.2.11:8080 TCP ACK" in line.split("vxlan", 1)[1]


@pytest.mark.parametrize("code", sorted(HUBBLE_DROP_TEXT))
def test_dropped_event_shows_hubble_reason(code):
    """A dropped event prints DROPPED with Hubble's text for its reason."""
    ev = syn_event(verdict=3, drop_reason=-code)
    line = Flow.decode(bytes(ev), NODES, DEVICES).line()
    assert f"DROPPED ({HUBBLE_DROP_TEXT[code]})" in line
    assert DropReason.text(-code) == HUBBLE_DROP_TEXT[code]


def test_drop_reasons_all_have_hubble_text():
    """Every DropReason member is one of the reasons Hubble names (no unnamed numbers)."""
    assert {-int(r) for r in DropReason} <= set(HUBBLE_DROP_TEXT)


def test_dropped_flow_properties():
    """A dropped flow reports dropped=True and its verdict."""
    flow = Flow.decode(bytes(syn_event(verdict=3, drop_reason=-158)), NODES, DEVICES)
    assert flow.dropped and flow.verdict.name == "DROPPED"


def test_icmp_and_udp_text():
    """ICMP echo prints type and id; UDP prints ports."""
    icmp = tup("198.18.1.11", 0x1234, "198.18.2.11", 0, 1, 0, 8)
    assert icmp.text() == f"198.18.1.11 -> 198.18.2.11 ICMP EchoRequest id {0x1234}"
    udp = tup("198.18.1.11", 5000, "198.18.2.11", 53, 17)
    assert udp.text() == "198.18.1.11:5000 -> 198.18.2.11:53 UDP"


def test_to_json():
    """to_json names node, hook, device, verdict, addresses, ct result/flags and the tunnel endpoint."""
    ev = syn_event(ct_flags=0x0010)
    data = Flow.decode(bytes(ev), NODES, DEVICES).to_json()
    expected = {
        "ts_ns": 123,
        "node": "node-a",
        "hook": "from-container",
        "device": "lxc-a1",
        "verdict": "FORWARDED",
        "drop_reason": None,
        "drop_code": 0,
        "len": 74,
        "identity": 256,
        "ct_result": "NEW",
        "ct_flags": ["SeenNonSyn"],
        "ct_lifetime": 160,
        "tunnel_endpoint": "198.51.100.12",
    }
    assert {k: data[k] for k in expected} == expected
    assert data["before"] == {"src": "198.18.1.11", "dst": "198.18.2.11", "sport": 40000, "dport": 8080,
                              "proto": "TCP", "tcp_flags": "SYN"}
    assert data["after"] == data["before"]
    assert "inner" not in data


def test_to_json_dropped():
    """A dropped event's JSON carries the reason text and the negative code."""
    data = Flow.decode(bytes(syn_event(verdict=3, drop_reason=-158, tunnel_endpoint=0)), NODES, DEVICES).to_json()
    assert (data["verdict"], data["drop_code"], data["drop_reason"]) == ("DROPPED", -158, "Service backend not found")
    assert data["tunnel_endpoint"] is None


def test_event_log_partial_records(tmp_path):
    """EventLog returns whole records only: 2 of 2.5 written, the third once its second half lands."""
    path = tmp_path / "events.bin"
    evs = [syn_event(ts_ns=i + 1, before=tup("198.18.1.11", 40000 + i, "198.18.2.11", 8080, 6, 2)) for i in range(3)]
    raw = b"".join(bytes(e) for e in evs)
    half = EVENT_SIZE * 2 + EVENT_SIZE // 2
    path.write_bytes(raw[:half])
    log = EventLog(path, NODES, DEVICES)
    first = log.read()
    assert [f.event.ts_ns for f in first] == [1, 2]
    assert log.read() == []
    with open(path, "ab") as f:
        f.write(raw[half:])
    rest = log.read()
    assert [f.event.ts_ns for f in rest] == [3]
    assert "40002" in rest[0].line()
    assert log.read() == []


def test_event_log_missing_file_and_seek_end(tmp_path):
    """A missing file reads as no flows; seek_end skips what was written before it."""
    path = tmp_path / "events.bin"
    log = EventLog(path, NODES, DEVICES)
    assert log.read() == []
    path.write_bytes(bytes(syn_event(ts_ns=1)) + bytes(syn_event(ts_ns=2)))
    log.seek_end()
    assert log.read() == []
    with open(path, "ab") as f:
        f.write(bytes(syn_event(ts_ns=3)))
    assert [f.event.ts_ns for f in log.read()] == [3]


def test_event_log_rotation(tmp_path):
    """When the monitor replaces the file, reading restarts at its beginning."""
    path = tmp_path / "events.bin"
    path.write_bytes(bytes(syn_event(ts_ns=1)))
    log = EventLog(path, NODES, DEVICES)
    assert len(log.read()) == 1
    new = tmp_path / "events.new"
    new.write_bytes(bytes(syn_event(ts_ns=7)))
    new.replace(path)
    assert [f.event.ts_ns for f in log.read()] == [7]


def test_trace_flags_print_in_the_line():
    """The TRACE_F_* bits a hook set (DSR option added, SNAT, ...) appear in the line and the JSON."""
    flow = Flow(syn_event(flags=0x05), "node-a", "eth0")
    assert "[dsr-opt-added] [snat]" in flow.line()
    assert flow.to_json()["flags"] == ["dsr-opt-added", "snat"]


# hubble observe's policy-verdict type (hubble/pkg/printer GetFlowType: "policy-verdict:<match> <DIRECTION>") and
# verdict column (getVerdict: ALLOWED / DENIED / AUDITED), match names from pkg/monitor/api PolicyMatchType.String.
@pytest.mark.parametrize("byte,text", [
    (0x02 | 2 << 3 | 0x80, "policy-verdict:L3-L4 EGRESS DENIED"),
    (0x01 | 0 << 3 | 0x80, "policy-verdict:none INGRESS DENIED"),
    (0x02 | 0 << 3, "policy-verdict:none EGRESS ALLOWED"),
    (0x01 | 1 << 3, "policy-verdict:L3-Only INGRESS ALLOWED"),
    (0x01 | 3 << 3, "policy-verdict:L4-Only INGRESS ALLOWED"),
    (0x02 | 4 << 3, "policy-verdict:all EGRESS ALLOWED"),
    (0x02 | 5 << 3 | 0x40, "policy-verdict:L3-Proto EGRESS AUDITED"),
    (0x01 | 6 << 3, "policy-verdict:Proto-Only INGRESS ALLOWED"),
])
def test_policy_verdict_prints_as_hubble(byte, text):
    """The policy byte (high byte of flags) and remote_id print as Hubble prints a policy verdict, JSON alike."""
    flow = Flow(syn_event(flags=byte << 8, remote_id=16777217), "node-a", "lxc-a1")
    assert f"{text} (ID:16777217) " in flow.line()
    p = flow.to_json()["policy"]
    assert (f"policy-verdict:{p['match']} {p['direction']} {p['verdict']}", p["remote_identity"]) == (text, 16777217)


def test_no_policy_byte_no_policy_text():
    """Without a policy verdict (high byte 0) the line and JSON are exactly as before policy existed."""
    flow = Flow(syn_event(flags=0x05, remote_id=0), "node-a", "eth0")
    assert flow.policy is None and "policy" not in flow.line() and "policy" not in flow.to_json()
    assert flow.to_json()["flags"] == ["dsr-opt-added", "snat"], "TRACE_F_* names ignore the policy byte"
    both = Flow(syn_event(flags=0x05 | (0x02 | 0x80) << 8), "node-a", "eth0")
    assert both.to_json()["flags"] == ["dsr-opt-added", "snat"]


def test_remote_id_follows_the_observation_bytes():
    """remote_id sits after flags, obs_point, report and proxy_port (bytes 96-99), before the final pad."""
    raw = bytes(syn_event(remote_id=0x01000001))
    assert raw[96:100] == struct.pack("<I", 0x01000001) and raw[100:104] == bytes(4)
