"""The ladder diagram of a connection (labkit.notebook.ladder), from records recorded on the real datapath."""
from __future__ import annotations

import socket
import xml.etree.ElementTree as ET

from labkit.addr import be32, ipv4
from labkit.constants import Hook
from labkit.maps.ct import CtDir, CtResult
from labkit.net.topology import Topology
from labkit.notebook import ladder
from labkit.notebook.steps import LadderView
from labkit.observe.trace import Flow, TraceEvent
from tracefixtures import recorded_steps, tup

SVG = "{http://www.w3.org/2000/svg}"
TOPO = Topology.default("demo")


def groups(root, cls: str) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == cls]


def ct_text(ev) -> str:
    """The CT verdict of a record, named from the enums (what the ladder must show at that hook)."""
    if ev.ct_result == CtResult.NONE:
        return ""
    return f"ct={CtResult(ev.ct_result).name.lower()}/{CtDir(ev.ct_dir).name.lower()}"


def render(name: str) -> tuple[list, ET.Element]:
    steps = recorded_steps(name)
    return steps, ET.fromstring(LadderView(steps, TOPO, name).svg)


def test_recorded_open_send_close_arrows_and_flags():
    """The ladder of a recorded a1 -> b1 open/send/close has one arrow per packet: the handshake
    SYN, SYN-ACK, ACK between a1 and b1, data both ways, and a FIN from each side; columns run a1,
    node-a's devices, node-b's devices, b1."""
    steps, root = render("a1-b1")
    packets = groups(root, "packet")
    by_step = [[p for p in packets if p.get("data-step") == str(k)] for k in range(3)]
    assert [p.get("data-flags") for p in by_step[0]][:3] == ["SYN", "SYN-ACK", "ACK"]
    assert [(p.get("data-src"), p.get("data-dst")) for p in by_step[0][:3]] == [("a1", "b1"), ("b1", "a1"),
                                                                                 ("a1", "b1")]
    assert any("PSH" in p.get("data-flags") and p.get("data-src") == "a1" for p in by_step[1])
    assert any("PSH" in p.get("data-flags") and p.get("data-src") == "b1" for p in by_step[1])
    fins = [p.get("data-src") for p in by_step[2] if "FIN" in p.get("data-flags")]
    assert sorted(fins) == ["a1", "b1"]
    # every recorded packet arrow carries as many hooks as the records of that packet
    assert sum(int(p.get("data-hooks")) for p in packets) == sum(len(s.flows) for s in steps)
    columns = [t.get("data-column") for t in root.iter(f"{SVG}text") if t.get("class") == "column"]
    order = list(dict.fromkeys(columns))
    assert order[0] == "a1" and order[-1] == "b1"
    devices = order[1:-1]
    assert devices[0] == "node-a/lxc-a1" and devices[-1] == "node-b/lxc-b1"
    assert max(i for i, d in enumerate(devices) if d.startswith("node-a/")) < min(
        i for i, d in enumerate(devices) if d.startswith("node-b/"))


def test_recorded_ct_annotation_per_hook():
    """Each hook of the ladder is a recorded record, in time order, with that record's node, device,
    hook and CT verdict; the SYN's from-container on node-a and its to-container on node-b name the
    OUT and IN rows they created, and the close step marks the closing flags where they were set."""
    steps, root = render("a1-b1")
    hooks = groups(root, "hook")
    flows = [f for s in steps for f in sorted(s.flows, key=lambda f: f.event.ts_ns)]
    assert len(hooks) == len(flows)
    for g, f in zip(hooks, flows):
        assert (g.get("data-node"), g.get("data-device")) == (f.node, f.device)
        assert g.get("data-hook") == Hook(f.event.hook).label
        assert g.get("data-ct") == ct_text(f.event)
    syn = next(f for f in steps[0].flows if f.event.hook == Hook.FROM_CONTAINER)
    sport = socket.ntohs(syn.event.before.sport)
    notes = [g.get("data-note") for g in hooks]
    out_row = f"+ TCP OUT 198.18.1.11:{sport} -> 198.18.2.11:8080"
    in_row = f"+ TCP IN 198.18.1.11:{sport} -> 198.18.2.11:8080"
    assert notes[0].startswith("from-container · ct=new/egress") and out_row in notes[0]
    first_b = next(n for g, n in zip(hooks, notes) if g.get("data-node") == "node-b" and "ct=new" in n)
    assert first_b.startswith("to-container") and in_row in first_b
    # the close: node-a's row gains TxClosing where a1's FIN leaves (from-container) and RxClosing where
    # b1's FIN arrives (to-container); the packets are told apart by their recorded sources
    first_close = len(steps[0].flows) + len(steps[1].flows)
    closing = [g for g in hooks if int(g.get("data-n")) > first_close and g.get("data-node") == "node-a"]
    fin_a = next(p for p in groups(root, "packet") if p.get("data-step") == "2" and p.get("data-src") == "a1")
    fin_b = next(p for p in groups(root, "packet") if p.get("data-step") == "2" and p.get("data-src") == "b1")
    assert "FIN" in fin_a.get("data-flags") and "FIN" in fin_b.get("data-flags")
    tx = [g.get("data-hook") for g in closing if "+TxClosing" in g.get("data-note")]
    rx = [g.get("data-hook") for g in closing if "+RxClosing" in g.get("data-note")]
    assert tx == ["from-container"] and rx == ["to-container"]


def test_recorded_service_nat_marks():
    """Through the Service web:80 (one backend, b2:8080) the ladder marks DNAT to b2 at node-a's
    from-container and the reverse NAT back to the Service address at node-a's to-container."""
    steps, root = render("a1-web")
    hooks = groups(root, "hook")
    b2 = TOPO.pod("b2").ip
    dnat = [g.get("data-note") for g in hooks if g.get("data-node") == "node-a"
            and g.get("data-hook") == "from-container" and "DNAT" in g.get("data-note")]
    assert dnat and all(f"DNAT → {b2}:8080" in n for n in dnat)
    syn = next(f for f in steps[0].flows if f.event.hook == Hook.FROM_CONTAINER)
    vip, sport = syn.event.before.daddr, socket.ntohs(syn.event.before.sport)
    assert f"+ TCP SVC 198.18.1.11:{sport} -> {ipv4(vip)}:80" in dnat[0]  # the SYN writes the SVC row...
    assert f"+ TCP OUT 198.18.1.11:{sport} -> {b2}:8080" in dnat[0]  # ...and the OUT row to the backend
    rev = [g.get("data-note") for g in hooks if g.get("data-node") == "node-a"
           and g.get("data-hook") == "to-container"]
    assert rev and all(f"rev-NAT → {ipv4(vip)}:80" in n for n in rev)


def test_packets_follow_addresses_and_end_in_pods():
    """A record continues the packet it arrived as (inner addresses through VXLAN); a packet ends in the
    pod behind to-container, and a hairpin (DNAT to the sender) goes from a1 back to a1."""
    syn = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x02)
    outer = tup("198.51.100.11", 40001, "198.51.100.12", 8472, 17)

    def ev(ts, node_id, hook, before, after=None, inner=None, ct=0xFF):
        e = TraceEvent(ts_ns=ts, node_id=node_id, hook=hook, verdict=1, ct_result=ct, before=before,
                       after=after if after is not None else before)
        if inner is not None:
            e.inner = inner
        return e

    flows = [Flow(ev(1, 1, 1, syn, ct=0), "node-a", "lxc-a1"), Flow(ev(2, 1, 6, syn), "node-a", "cilium_vxlan"),
             Flow(ev(3, 1, 4, outer, inner=syn), "node-a", "eth0"),
             Flow(ev(4, 2, 3, outer, inner=syn), "node-b", "eth0"),
             Flow(ev(5, 2, 5, syn), "node-b", "cilium_vxlan"), Flow(ev(6, 2, 2, syn, ct=0), "node-b", "lxc-b1")]
    [p] = ladder.packets([flows], TOPO)
    assert (p.src, p.dst, p.label, len(p.flows)) == ("a1", "b1", "SYN", 6)
    vip = tup("198.18.1.11", 40000, "198.19.0.10", 80, 6, 0x02)
    back = tup("198.18.1.11", 40000, "198.18.1.11", 8080, 6, 0x02)
    hair = [Flow(ev(1, 1, 1, vip, back, ct=0), "node-a", "lxc-a1"), Flow(ev(2, 1, 2, back, ct=0), "node-a", "lxc-a1")]
    [h] = ladder.packets([hair], TOPO)
    assert (h.src, h.dst, len(h.flows)) == ("a1", "a1", 2)
    assert "DNAT → 198.18.1.11:8080" in ladder.hook_note(hair[0])


def test_svg_deterministic_and_scalable():
    """The same steps give byte-identical SVG with a viewBox that scales to its container."""
    steps = recorded_steps("a1-b1")
    first = ladder.svg(steps, TOPO, "x")
    assert first == ladder.svg(steps, TOPO, "x")
    root = ET.fromstring(first)
    assert root.get("viewBox").startswith("0 0 ") and "max-width:100%" in root.get("style")


def test_hairpin_rows_told_once_by_direction():
    """In a hairpin (a1 to a Service whose backend is a1, SNAT to 169.254.42.1) the OUT, IN and SVC rows
    share addresses: from-container (egress) names the SVC and OUT rows, to-container (ingress) the IN row."""
    from types import SimpleNamespace

    from labkit.maps.ct import CtEntry, CtKey4, CtRow, TupleFlags, diff_rows

    vip = tup("198.18.1.11", 40000, "198.19.0.10", 80, 6, 0x02)
    snat = tup("169.254.42.1", 40000, "198.18.1.11", 8080, 6, 0x02)
    out_ev = TraceEvent(ts_ns=1, node_id=1, hook=1, verdict=2, ct_result=0, ct_dir=0, before=vip, after=snat)
    in_ev = TraceEvent(ts_ns=2, node_id=1, hook=2, verdict=1, ct_result=0, ct_dir=1, before=snat, after=snat)
    flows = [Flow(out_ev, "node-a", "lxc-a1"), Flow(in_ev, "node-a", "lxc-a1")]
    rows = [CtRow.of(CtKey4.make("169.254.42.1", "198.18.1.11", 40000, 8080, 6, TupleFlags.OUT), CtEntry()),
            CtRow.of(CtKey4.make("169.254.42.1", "198.18.1.11", 40000, 8080, 6, TupleFlags.IN), CtEntry()),
            CtRow.of(CtKey4(be32("198.19.0.10"), be32("198.18.1.11"), socket.htons(40000), socket.htons(80), 6,
                            TupleFlags.SERVICE), CtEntry())]
    step = SimpleNamespace(title="hairpin", flows=flows, diff={"node-a": diff_rows([], rows)})
    root = ET.fromstring(ladder.svg([step], TOPO))
    notes = [g.get("data-note") for g in groups(root, "hook")]
    assert notes[0].count("+ TCP") == 2 and "+ TCP SVC" in notes[0] and "+ TCP OUT 169.254.42.1:40000" in notes[0]
    assert notes[1].count("+ TCP") == 1 and "+ TCP IN 169.254.42.1:40000 -> 198.18.1.11:8080" in notes[1]
    assert "DNAT → 198.18.1.11:8080" in notes[0] and "SNAT → 169.254.42.1:40000" in notes[0]
