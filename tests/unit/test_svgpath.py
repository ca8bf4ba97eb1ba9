"""The path picture written by labkit (labkit.notebook.svgpath): boxes, badges, repeats, loops, drops."""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import pytest

from labkit.addr import be32
from labkit.constants import DropReason
from labkit.net.topology import Topology
from labkit.notebook import svgpath, viz
from labkit.observe.trace import Flow, TraceEvent
from tracefixtures import tup

NS = {"s": "http://www.w3.org/2000/svg"}
NS_SVG = "{http://www.w3.org/2000/svg}"
CT_NONE = 0xFF
SYN = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x02)
VIP_SYN = tup("198.18.1.11", 40000, "198.19.0.10", 80, 6, 0x02)  # a1 -> a Service
HAIRPIN_SYN = tup("169.254.42.1", 40000, "198.18.1.11", 8080, 6, 0x02)  # after DNAT to a1 and SNAT
HAIRPIN_SYNACK = tup("198.18.1.11", 8080, "169.254.42.1", 40000, 6, 0x12)
VIP_SYNACK = tup("198.19.0.10", 80, "198.18.1.11", 40000, 6, 0x12)


def event(ts, node_id, hook, verdict, before, after=None, inner=None, tunnel=None, drop=0, ct_result=CT_NONE):
    ev = TraceEvent(ts_ns=ts, node_id=node_id, hook=hook, verdict=verdict, ct_result=ct_result, ct_dir=0,
                    drop_reason=drop, tunnel_endpoint=be32(tunnel) if tunnel else 0, before=before,
                    after=after if after is not None else before)
    if inner is not None:
        ev.inner = inner
    return ev


def retry_flows(tries: int = 9) -> list[Flow]:
    """a1 -> b1 SYN in tunnel mode, dropped at node-b's to-container (as a fault makes it), retried: 6 hooks per try.
    Each try's VXLAN packet has its own outer source port, as the kernel's flow hash gives it."""
    out = []
    for k in range(tries):
        t = 1000 * k
        outer = tup("198.51.100.11", 40001 + 997 * k, "198.51.100.12", 8472, 17)
        out += [
            Flow(event(t + 1, 1, 1, 2, SYN, tunnel="198.51.100.12", ct_result=0), "node-a", "lxc-a1"),
            Flow(event(t + 2, 1, 6, 1, SYN, tunnel="198.51.100.12"), "node-a", "cilium_vxlan"),
            Flow(event(t + 3, 1, 4, 1, outer, inner=SYN), "node-a", "eth0"),
            Flow(event(t + 4, 2, 3, 1, outer, inner=SYN), "node-b", "eth0"),
            Flow(event(t + 5, 2, 5, 1, SYN), "node-b", "cilium_vxlan"),
            Flow(event(t + 6, 2, 2, 3, SYN, drop=int(DropReason.NO_TUNNEL_ENDPOINT)), "node-b", "lxc-b1"),
        ]
    return out


def hairpin_flows() -> list[Flow]:
    """a1 -> a Service whose backend is a1: every hook is on lxc-a1."""
    return [
        Flow(event(1, 1, 1, 2, VIP_SYN, HAIRPIN_SYN, ct_result=0), "node-a", "lxc-a1"),
        Flow(event(2, 1, 2, 1, HAIRPIN_SYN, ct_result=0), "node-a", "lxc-a1"),
        Flow(event(3, 1, 1, 2, HAIRPIN_SYNACK, VIP_SYNACK, ct_result=2), "node-a", "lxc-a1"),
        Flow(event(4, 1, 2, 1, VIP_SYNACK, ct_result=2), "node-a", "lxc-a1"),
    ]


@pytest.fixture
def topo() -> Topology:
    return Topology.default("demo")


def picture(topo, flows, routing="tunnel", **kw) -> str:
    g = viz.lab_graph(topo, routing)
    return svgpath.render(g, viz.positions(g), viz.hops(flows, topo), **kw)


def parse(text: str) -> ET.Element:
    return ET.fromstring(text)


def rects(root, cls: str) -> dict[str, tuple[float, float, float, float]]:
    """class -> {data-id or data-netns: (x0, y0, x1, y1)} in SVG pixels."""
    out = {}
    for r in root.iter(f"{{{NS['s']}}}rect"):
        if r.get("class") == cls:
            x, y, w, h = (float(r.get(k)) for k in ("x", "y", "width", "height"))
            out[r.get("data-id") or r.get("data-netns")] = (x, y, x + w, y + h)
    return out


def badges(root) -> list[ET.Element]:
    return [g for g in root.iter(f"{{{NS['s']}}}g") if g.get("class") == "badge"]


def test_boxes_devices_and_scaling(topo):
    """Every namespace is a box, every device a rectangle inside its namespace's box; the svg scales
    (viewBox, max-width:100%) and keeps its text as text."""
    root = parse(picture(topo, []))
    assert root.get("viewBox", "").startswith("0 0 ") and "max-width:100%" in root.get("style")
    ns = rects(root, "ns")
    devices = rects(root, "device")
    assert {"node-a/lxc-a1", "node-a/eth0", "node-b/cilium_vxlan", "a1/eth0", "ext/eth0"} <= set(devices)
    assert "lk-demo-node-a" in ns and "lk-demo-a1" in ns
    x0, y0, x1, y1 = devices["node-a/lxc-a1"]
    n0, m0, n1, m1 = ns["lk-demo-node-a"]
    assert n0 <= x0 and x1 <= n1 and m0 <= y0 and y1 <= m1
    texts = {t.text for t in root.iter(f"{{{NS['s']}}}text")}
    assert {"a1", "b1", "lxc-a1", "from-container", "to-overlay", "lab demo · tunnel routing"} <= texts
    assert not badges(root)


def test_retries_grouped_with_count(topo):
    """A 54-hop path of nine identical tries is six badges, each ×9, numbered 1..6 in path order."""
    flows = retry_flows(9)
    assert len(flows) == 54
    root = parse(picture(topo, flows))
    found = badges(root)
    assert [b.get("data-hop") for b in found] == ["1", "2", "3", "4", "5", "6"]
    assert {b.get("data-count") for b in found} == {"9"}
    counts = [t.text for b in found for t in b.iter(f"{{{NS['s']}}}text") if t.get("class") == "count"]
    assert counts == ["×9"] * 6
    assert found[0].get("data-device") == "node-a/lxc-a1" and found[5].get("data-device") == "node-b/lxc-b1"
    arrows = [p for p in root.iter(f"{NS_SVG}path") if p.get("class") == "arrow"]
    assert len(arrows) == 5  # the path of one try; no arrow from a drop at b1 back to a1's next SYN


def test_every_badge_inside_its_namespace(topo):
    """Each badge's circle lies inside the box of the namespace its device is in, also with many
    distinct hops on one device."""
    g = viz.lab_graph(topo, "tunnel")
    many = [Flow(event(k, 1, 1, 2, tup("198.18.1.11", 40000 + k, "198.18.2.11", 8080, 6, 0x02)), "node-a",
                 "lxc-a1") for k in range(20)]
    for flows in (retry_flows(9), many, hairpin_flows()):
        root = parse(picture(topo, flows))
        ns = rects(root, "ns")
        assert badges(root)
        for b in badges(root):
            netns = g.nodes[b.get("data-device")]["netns"]
            x0, y0, x1, y1 = ns[netns]
            circle = b.find("s:circle", NS)
            cx, cy, r = (float(circle.get(k)) for k in ("cx", "cy", "r"))
            assert x0 <= cx - r and cx + r <= x1 and y0 <= cy - r and cy + r <= y1, b.get("data-hop")


def test_hairpin_draws_loops(topo):
    """A packet that returns to the device it left is drawn as a loop (a path element of class loop): one
    for the SYN and one for the SYN-ACK, each from-container then to-container of lxc-a1; a1 answering (its
    SYN-ACK after the SYN reached it) starts a new packet, not a loop; and no straight arrow."""
    root = parse(picture(topo, hairpin_flows()))
    paths = [p for p in root.iter(f"{{{NS['s']}}}path") if p.get("class") == "loop"]
    assert len(paths) == 2
    assert all(p.get("d").startswith("M") and " C" in p.get("d") for p in paths)
    assert not [p for p in root.iter(f"{{{NS['s']}}}path") if p.get("class") == "arrow"]
    assert {b.get("data-device") for b in badges(root)} == {"node-a/lxc-a1"}


def test_a_reply_is_not_a_loop(topo):
    """Pod to pod across nodes, the server answering: b1's SYN-ACK leaves by the lxc its SYN came in by, a new
    packet (no loop, no arrow from the SYN's last hop), and the SYN-ACK's own hops get their arrows."""
    syn_ack = tup("198.18.2.11", 8080, "198.18.1.11", 40000, 6, 0x12)
    outer = tup("198.51.100.12", 40001, "198.51.100.11", 8472, 17)
    flows = retry_flows(1)[:5] + [
        Flow(event(6, 2, 2, 1, SYN, ct_result=0), "node-b", "lxc-b1"),
        Flow(event(7, 2, 1, 2, syn_ack, tunnel="198.51.100.11", ct_result=2), "node-b", "lxc-b1"),
        Flow(event(8, 2, 6, 1, syn_ack, tunnel="198.51.100.11"), "node-b", "cilium_vxlan"),
        Flow(event(9, 2, 4, 1, outer, inner=syn_ack), "node-b", "eth0"),
    ]
    root = parse(picture(topo, flows))
    paths = [p for p in root.iter(f"{{{NS['s']}}}path")]
    assert not [p for p in paths if p.get("class") == "loop"]
    assert len([p for p in paths if p.get("class") == "arrow"]) == 5 + 2  # SYN: 6 hops, SYN-ACK: 3 hops


def test_dropped_hop_red_with_reason(topo):
    """The dropped hop's badge is red and its drop reason is written beside its device."""
    root = parse(picture(topo, retry_flows(1)))
    dropped = [b for b in badges(root) if b.get("data-verdict") == "DROPPED"]
    assert len(dropped) == 1 and dropped[0].get("data-device") == "node-b/lxc-b1"
    assert dropped[0].find("s:circle", NS).get("fill") == viz.VERDICT_COLOURS["DROPPED"]
    reasons = [t for t in root.iter(f"{{{NS['s']}}}text") if t.get("class") == "drop-reason"]
    assert len(reasons) == 1 and DropReason.text(int(DropReason.NO_TUNNEL_ENDPOINT)) in reasons[0].text
    assert reasons[0].get("fill") == viz.VERDICT_COLOURS["DROPPED"]
    arrows = [p for p in root.iter(f"{{{NS['s']}}}path") if p.get("class") == "arrow"]
    assert len(arrows) == 5  # one between each pair of consecutive hops on different devices


def test_deterministic_and_no_matplotlib(topo):
    """The same input gives byte-identical SVG, and rendering it imports no matplotlib."""
    first = picture(topo, retry_flows(3), title="retries")
    assert first == picture(topo, retry_flows(3), title="retries")
    assert first != picture(topo, retry_flows(3), title="other")
    if "matplotlib" not in sys.modules:
        picture(topo, hairpin_flows())
        assert "matplotlib" not in sys.modules


def test_upto_rings_current_and_keeps_places(topo):
    """upto=k shows the groups of hops 1..k, rings hop k's badge and leaves every badge where the
    whole path puts it."""
    flows = retry_flows(2)
    whole, part = parse(picture(topo, flows)), parse(picture(topo, flows, upto=3))
    where = {b.get("data-hop"): b.find("s:circle", NS).get("cx") for b in badges(whole)}
    shown = badges(part)
    assert [b.get("data-hop") for b in shown] == ["1", "2", "3"]
    assert all(where[b.get("data-hop")] == b.find("s:circle", NS).get("cx") for b in shown)
    assert shown[2].find("s:circle", NS).get("stroke") == "black"


def test_group_hops_numbers_first_appearance():
    """group_hops numbers groups by their first hop and keeps every hop of a group."""
    topo = Topology.default("demo")
    groups = svgpath.group_hops(viz.hops(retry_flows(2), topo))
    assert [g.number for g in groups] == [1, 2, 3, 4, 5, 6]
    assert [h.index for h in groups[0].hops] == [1, 7] and groups[5].label == "6 ×2"
