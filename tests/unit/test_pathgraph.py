"""The lab's graph and a packet's path as data (labkit.notebook.pathgraph): graph, layout, hops, sizes."""
from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest

from labkit.errors import LabkitError
from labkit.net.topology import Topology
from labkit.notebook import pathgraph
from labkit.observe.trace import Flow
from tracefixtures import ECHO, event, ping_flows, tup




ECHO_TEXT = "198.18.1.11 -> 198.18.2.11 ICMP EchoRequest id 4660"



@pytest.fixture
def topo() -> Topology:
    return Topology.default("demo")


# -- graph -------------------------------------------------------------------
def test_graph_tunnel_ids_kinds_hooks(topo):
    """Tunnel mode: every namespace and device of the default lab, with its kind, netns and hooks."""
    g = pathgraph.lab_graph(topo, "tunnel")
    expected = {"fabric": "fabric", "ext": "external", "ext/eth0": "device"}
    for node in ("node-a", "node-b"):
        expected.update({node: "node", f"{node}/eth0": "device", f"{node}/cilium_vxlan": "device"})
    for pod, node in (("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b"), ("b2", "node-b")):
        expected.update({pod: "pod", f"{pod}/eth0": "device", f"{node}/lxc-{pod}": "device"})
    assert {n: d["kind"] for n, d in g.nodes(data=True)} == expected
    assert g.nodes["node-a/lxc-a1"]["hooks"] == ["from-container", "to-container"]
    assert g.nodes["node-b/eth0"]["hooks"] == ["from-netdev", "to-netdev"]
    assert g.nodes["node-a/cilium_vxlan"]["hooks"] == ["from-overlay", "to-overlay"]
    assert g.nodes["a1/eth0"]["hooks"] == [] and g.nodes["ext/eth0"]["hooks"] == []
    assert g.nodes["node-a/lxc-a1"]["netns"] == "lk-demo-node-a" and g.nodes["a1/eth0"]["netns"] == "lk-demo-a1"
    assert g.nodes["node-b/cilium_vxlan"]["ifname"] == "cilium_vxlan"
    assert all("label" in d and "netns" in d and "hooks" in d for _, d in g.nodes(data=True))


def test_graph_native_has_no_vxlan(topo):
    """Native mode: no cilium_vxlan device and no tunnel edge; the rest is as in tunnel mode."""
    native, tunnel = pathgraph.lab_graph(topo, "native"), pathgraph.lab_graph(topo, "tunnel")
    assert not any("cilium_vxlan" in n for n in native)
    assert not any(d["kind"] == "tunnel" for *_, d in native.edges(data=True))
    assert set(tunnel) - set(native) == {"node-a/cilium_vxlan", "node-b/cilium_vxlan"}


def test_graph_edges_follow_wiring(topo):
    """Edges: pod—eth0—lxc—node—eth0—fabric, node—cilium_vxlan, ext—eth0—fabric, dashed tunnel between nodes."""
    g = pathgraph.lab_graph(topo, "tunnel")
    for a, b in [("a1", "a1/eth0"), ("a1/eth0", "node-a/lxc-a1"), ("node-a/lxc-a1", "node-a"),
                 ("node-a", "node-a/eth0"), ("node-a/eth0", "fabric"), ("node-a", "node-a/cilium_vxlan"),
                 ("ext", "ext/eth0"), ("ext/eth0", "fabric"), ("b2/eth0", "node-b/lxc-b2")]:
        assert g.has_edge(a, b), (a, b)
    assert g.edges["node-a/cilium_vxlan", "node-b/cilium_vxlan"]["kind"] == "tunnel"
    assert g.edges["a1/eth0", "node-a/lxc-a1"]["kind"] == "veth"
    assert not g.has_edge("a1", "node-a") and not g.has_edge("node-a", "fabric")
    assert g.number_of_edges() == 4 * 3 + 2 * 3 + 2 + 1


def test_graph_rejects_unknown_routing(topo):
    """An unknown routing mode is a LabkitError naming the valid ones."""
    with pytest.raises(LabkitError, match="tunnel, native"):
        pathgraph.lab_graph(topo, "bgp")


# -- layout ------------------------------------------------------------------
@pytest.mark.parametrize("routing", ["tunnel", "native"])
def test_positions_deterministic_and_bounded(topo, routing):
    """Every graph node gets a finite, non-negative place, the same on every call, and no two share one."""
    g = pathgraph.lab_graph(topo, routing)
    random.seed(1)
    first = pathgraph.positions(g)
    random.seed(2)
    assert pathgraph.positions(pathgraph.lab_graph(topo, routing)) == first
    assert set(first) == set(g)
    for x, y in first.values():
        assert math.isfinite(x) and math.isfinite(y)
        assert 0 <= x <= 20 and 0 <= y <= 7
    assert len(set(first.values())) == len(first)


def test_positions_layout(topo):
    """Nodes left to right, pods above their node, fabric lowest, externals right of everything else."""
    pos = pathgraph.positions(pathgraph.lab_graph(topo))
    assert pos["node-a"][0] < pos["node-b"][0]
    for pod, node in (("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b"), ("b2", "node-b")):
        assert pos[pod][1] > pos[f"{pod}/eth0"][1] > pos[f"{node}/lxc-{pod}"][1] > pos[node][1]
    assert pos["a1"][0] < pos["a2"][0] < pos["b1"][0] < pos["b2"][0]
    assert max(x for x, _ in pos.values()) == pos["ext"][0]
    assert pos["fabric"][1] == min(y for _, y in pos.values())
    assert pos["ext/eth0"][0] > max(x for n, (x, _) in pos.items() if n not in ("ext", "ext/eth0"))
    # cilium_vxlan sits between the node stack and eth0, on the side facing the other node
    assert pos["node-a"][1] > pos["node-a/cilium_vxlan"][1] > pos["node-a/eth0"][1]
    assert pos["node-a/cilium_vxlan"][0] > pos["node-a"][0] and pos["node-b/cilium_vxlan"][0] < pos["node-b"][0]


# -- hops --------------------------------------------------------------------
def test_hops_ping_tunnel(topo):
    """A tunnelled ping: six hops in time order (input shuffled) with ids, hooks, verdicts and summaries."""
    flows = ping_flows()
    shuffled = flows[3:] + flows[:3]
    path = pathgraph.hops(shuffled, topo)
    assert [h.index for h in path] == [1, 2, 3, 4, 5, 6]
    assert [h.ts_ns for h in path] == [100, 200, 300, 400, 500, 600]
    assert [(h.id, h.hook, h.verdict) for h in path] == [
        ("node-a/lxc-a1", "from-container", "REDIRECTED"),
        ("node-a/cilium_vxlan", "to-overlay", "FORWARDED"),
        ("node-a/eth0", "to-netdev", "FORWARDED"),
        ("node-b/eth0", "from-netdev", "FORWARDED"),
        ("node-b/cilium_vxlan", "from-overlay", "FORWARDED"),
        ("node-b/lxc-b1", "to-container", "FORWARDED"),
    ]
    assert (path[0].node, path[0].device) == ("node-a", "lxc-a1")
    assert path[0].summary == f"{ECHO_TEXT}; ct=new/egress flags=[]; → tunnel 198.51.100.12 (node-b)"
    assert "→ tunnel 198.51.100.12" in path[1].summary and "ct=" not in path[1].summary
    assert path[2].summary == f"198.51.100.11:40001 -> 198.51.100.12:8472 UDP [vxlan: {ECHO_TEXT}]"
    assert f"[vxlan: {ECHO_TEXT}]" in path[3].summary and "tunnel" not in path[3].summary
    assert path[4].summary == ECHO_TEXT
    assert path[5].summary == f"{ECHO_TEXT}; ct=new/ingress flags=[]"
    assert all("=>" not in h.summary for h in path)
    assert path[0].flow is shuffled[3] and path[0].colour == pathgraph.VERDICT_COLOURS["REDIRECTED"]
    assert path[5].text().startswith("6. node-b lxc-b1 to-container FORWARDED: 198.18.1.11")


def test_hops_ct_flags_and_empty(topo):
    """CT flag names appear in the summary; no flows give no hops."""
    ev = event(1, 1, 2, 1, ECHO, ct_result=1, ct_dir=1, ct_flags=0x0010)
    [hop] = pathgraph.hops([Flow(ev, "node-a", "lxc-a1")], topo)
    assert "ct=established/ingress flags=[SeenNonSyn]" in hop.summary
    assert pathgraph.hops([], topo) == []


def test_hops_translated(topo):
    """A flow rewritten at its hook shows the packet before, '=>' and the packet after."""
    before = tup("198.18.1.11", 40000, "198.19.0.10", 80, 6, 0x02)
    after = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x02)
    ev = event(5, 1, 1, 2, before, after=after, ct_result=0, ct_dir=2, tunnel="198.51.100.12")
    [hop] = pathgraph.hops([Flow(ev, "node-a", "lxc-a1")], topo)
    assert hop.flow.translated
    assert ("198.18.1.11:40000 -> 198.19.0.10:80 TCP SYN => 198.18.1.11:40000 -> 198.18.2.11:8080 TCP SYN"
            in hop.summary)
    assert "ct=new/service" in hop.summary


@pytest.mark.parametrize("code, text", [(-158, "Service backend not found"),
                                        (-160, "No tunnel/encapsulation endpoint (datapath BUG!)"),
                                        (-157, "IP fragmentation not supported")])
def test_hops_dropped(topo, code, text):
    """A dropped flow's summary carries Hubble's drop text and no tunnel endpoint."""
    ev = event(9, 1, 1, 3, ECHO, ct_result=0, ct_dir=0, drop=code, tunnel="198.51.100.12")
    [hop] = pathgraph.hops([Flow(ev, "node-a", "lxc-a1")], topo)
    assert hop.verdict == "DROPPED" and hop.colour == pathgraph.VERDICT_COLOURS["DROPPED"]
    assert f"dropped: {text}" in hop.summary
    assert "tunnel" not in hop.summary.replace(text, "")


def test_hops_without_topology_and_unknown_numbers():
    """Without a topology a tunnel endpoint is a bare address; an unknown hook or verdict shows its number."""
    ev = event(1, 1, 1, 2, ECHO, ct_result=0, ct_dir=0, tunnel="198.51.100.12")
    [hop] = pathgraph.hops([Flow(ev, "node-a", "lxc-a1")])
    assert hop.summary.endswith("; → tunnel 198.51.100.12")
    odd = event(2, 1, 99, 77, ECHO)
    [hop] = pathgraph.hops([Flow(odd, "node-a", "eth0")])
    assert (hop.hook, hop.verdict, hop.colour) == ("hook#99", "VERDICT#77", pathgraph.UNKNOWN_COLOUR)


# -- sizes and titles --------------------------------------------------------
def test_box_size_extent_and_title(topo):
    """Box sizes follow kind and hooks, extent holds every box given, the default title names lab and routing."""
    g = pathgraph.lab_graph(topo, "tunnel")
    assert pathgraph.box_size(g.nodes["node-a/eth0"]) == pathgraph.BOX_SIZES["hooked"]
    assert pathgraph.box_size(g.nodes["a1/eth0"]) == pathgraph.BOX_SIZES["plain"]
    assert pathgraph.box_size(g.nodes["node-a"]) == pathgraph.BOX_SIZES["node"]
    pos = pathgraph.positions(g)
    ids = ["node-a", "node-a/eth0", "node-a/lxc-a1", "node-a/lxc-a2", "node-a/cilium_vxlan"]
    x0, y0, x1, y1 = pathgraph.extent(pos, g, ids)
    for gid in ids:
        (x, y), (w, h) = pos[gid], pathgraph.box_size(g.nodes[gid])
        assert x0 <= x - w / 2 and x + w / 2 <= x1 and y0 <= y - h / 2 and y + h / 2 <= y1
    assert pathgraph.default_title(g) == "lab demo · tunnel routing"


# -- the module --------------------------------------------------------------
def test_imports_no_drawing_library():
    """A fresh interpreter rendering SVG via svgpath/pathgraph never imports matplotlib, ipywidgets or viz."""
    code = ("import sys\n"
            "from labkit.notebook import svgpath\n"
            "from labkit.net.topology import Topology\n"
            "from labkit.notebook.pathgraph import lab_graph, positions\n"
            "g = lab_graph(Topology.default('demo'))\n"
            "svgpath.render(g, positions(g), [])\n"
            "print(sorted(m for m in ('matplotlib', 'ipywidgets', 'labkit.notebook.viz') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_all_is_documented():
    """Everything in __all__ exists and public callables have docstrings with examples."""
    for name in pathgraph.__all__:
        obj = getattr(pathgraph, name)
        if callable(obj):
            assert obj.__doc__ and ">>>" in obj.__doc__, name
