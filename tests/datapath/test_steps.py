"""Steps on the real kernel: their diffs, flows, waiting, faults and crafted packets."""
from __future__ import annotations

import json
import subprocess

import pytest

from labkit.constants import Hook, Verdict
from labkit.errors import ConfigError, LabTimeoutError
from labkit.maps.ct import CT_MAPS, CtFlags, CtResult
from labkit.lab.traffic import Journey, run_step

from .util import rows


def _dump(lab) -> dict:
    """Every CT entry of every node as bpftool prints it: {(node, map, key bytes): value bytes}."""
    out = {}
    for node in lab.topology.nodes:
        for name in CT_MAPS:
            path = f"{lab.pin_dir(node.name)}/{name}"
            r = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", path], capture_output=True, text=True,
                               check=True)
            for entry in json.loads(r.stdout):
                key = bytes(int(b, 16) for b in entry["key"])
                out[(node.name, name, key)] = bytes(int(b, 16) for b in entry["value"])
    return out


def test_step_diff_equals_two_full_dumps(lab):
    """A step's CT diff is exactly the difference of bpftool dumps taken before and after it."""
    conn = lab.pod("a1").tcp("b1", 8080)
    for action in (conn.open, lambda: conn.send(b"abc"), conn.close):
        before = _dump(lab)
        step = action()
        after = _dump(lab)
        added = {(n, m, k) for (n, m, k) in after if (n, m, k) not in before}
        removed = {(n, m, k) for (n, m, k) in before if (n, m, k) not in after}
        changed = {x for x in after if x in before and after[x] != before[x]}
        mine_added = {(n, r.map, r.key) for n, d in step.diff.items() for r in d.added}
        mine_removed = {(n, r.map, r.key) for n, d in step.diff.items() for r in d.removed}
        mine_changed = {(n, new.map, new.key) for n, d in step.diff.items() for _, new, _ in d.changed}
        assert (mine_added, mine_removed, mine_changed) == (added, removed, changed), step.title


def test_open_step_flows_follow_the_handshake(any_lab):
    """conn.open() returns the handshake's flows: SYN created OUT at node-a and IN at node-b."""
    lab = any_lab
    step = lab.pod("a1").tcp("b1", 8080).open()
    assert step.ok and step.result["sport"]
    created = [(f.node, f.hook.label, f.ct_result.name) for f in step.flows if f.ct_result == CtResult.NEW]
    assert created == [("node-a", "from-container", "NEW"), ("node-b", "to-container", "NEW")]
    delivered = [f for f in step.flows if f.hook == Hook.TO_CONTAINER]
    assert [f.node for f in delivered] == ["node-b", "node-a", "node-b"]  # SYN, SYN-ACK, ACK
    assert [a.dir for a in step.diff["node-a"].added if not a.related] == ["OUT"]
    assert [a.dir for a in step.diff["node-b"].added if not a.related] == ["IN"]
    if lab.config.routing == "tunnel":
        assert any(f.hook == Hook.TO_OVERLAY for f in step.flows)
        assert step.flows[0].verdict == Verdict.REDIRECTED
    else:
        assert not any(f.hook in (Hook.FROM_OVERLAY, Hook.TO_OVERLAY) for f in step.flows)


def test_refused_open_and_reset(lab):
    """A closed port's RST ends the open step; reset() sends RST and closes both rows."""
    refused = lab.pod("a1").tcp("b1", 9999).open()
    assert not refused.ok and refused.result["error"] == "ECONNREFUSED"
    conn = lab.pod("a2").tcp("b2", 8080)
    conn.open()
    step = conn.reset()
    out = [r for r in step.rows["node-a"] if r.sport == conn.sport and r.proto_name == "TCP"][0]
    assert out.flags & CtFlags.TX_CLOSING


def test_a_step_that_never_completes_times_out_clearly(lab):
    """Waiting for a packet that never comes raises LabTimeoutError naming it."""
    never = Journey("a packet nobody sends", "198.18.1.11", "198.18.2.11", 17, 1, 1)
    with pytest.raises(LabTimeoutError, match="a packet nobody sends"):
        run_step(lab, "nothing", lambda: {"ok": True}, lambda res: [never], timeout=0.3)


def test_udp_and_ping_steps(lab):
    """udp() and ping() return steps with the answer and the rows they created."""
    step = lab.pod("a2").udp("b1", 8080, b"hey")
    assert step.result["reply_text"].endswith("data=hey")
    assert [r.proto_name for r in step.diff["node-a"].added if not r.related] == ["UDP"]
    step = lab.pod("a1").ping("b2", count=2)
    assert step.ok and rows(lab, "node-a", "ICMP", "OUT", related=False)[0].packets == 4


def test_crafted_syn_from_scapy(lab):
    """A scapy SYN sent from a1 goes through from-container and creates an OUT row."""
    from scapy.all import IP, TCP

    pkt = IP(src=lab.pod("a1").ip, dst=lab.pod("b1").ip) / TCP(sport=40404, dport=8080, flags="S")
    step = lab.pod("a1").send(pkt)
    first = step.flows[0]
    assert (first.node, first.hook.label, first.ct_result.name) == ("node-a", "from-container", "NEW")
    out = [r for r in step.rows["node-a"] if r.proto_name == "TCP" and r.sport == 40404]
    assert out and out[0].dir == "OUT" and out[0].tx_flags_seen & 0x02  # (a1's kernel may RST the SYN-ACK)


def test_fault_wrong_lifetime(lab):
    """wrong-lifetime: the handshake completes but SeenNonSyn never sets (SYN lifetime kept)."""
    assert lab.fault("wrong-lifetime") == ["wrong-lifetime"]
    assert lab.status()["faults"] == ["wrong-lifetime"]
    conn = lab.pod("a1").tcp("b1")
    conn.open()
    out = [r for r in lab.ct("node-a") if r.proto_name == "TCP" and r.sport == conn.sport][0]
    assert not out.flags & CtFlags.SEEN_NON_SYN
    assert out.remaining(lab.clock.now()) <= lab.config.timeouts.syn
    lab.reset()
    assert lab.faults() == []


def test_fault_no_in_entry_and_no_related(lab):
    """no-in-entry: node-b gets no IN rows; no-related: no RELATED twins anywhere."""
    lab.fault("no-in-entry")
    lab.fault("no-related")
    step = lab.pod("a1").ping("b1")
    assert step.ok
    assert rows(lab, "node-b", direction="IN") == []
    assert rows(lab, "node-a", related=True) == []
    assert [r.dir for r in rows(lab, "node-a")] == ["OUT"]
    lab.fault("no-in-entry", on=False)
    assert lab.faults() == ["no-related"]


def test_fault_names_are_checked(lab):
    """Unknown fault names are refused, listing the valid ones."""
    with pytest.raises(ConfigError, match="expected one of .*no-in-entry"):
        lab.fault("bogus")
    assert lab.faults() == []
