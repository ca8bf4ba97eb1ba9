"""Pictures of the lab and of a packet's path: graph, layout, hops, Figure, SVG, HTML, explorer widget."""
from __future__ import annotations

import math
import random

import pytest

from labkit.addr import be32
from labkit.notebook import viz
from labkit.errors import LabkitError
from labkit.net.topology import Topology
from labkit.observe.trace import Flow, TraceEvent
from tracefixtures import tup

CT_NONE = 0xFF
POD_NAMES = ("a1", "a2", "b1", "b2")


def event(ts, node_id, hook, verdict, before, after=None, inner=None, ct_result=CT_NONE, ct_dir=CT_NONE,
          tunnel=None, drop=0, ct_flags=0) -> TraceEvent:
    ev = TraceEvent(ts_ns=ts, node_id=node_id, hook=hook, verdict=verdict, ct_result=ct_result, ct_dir=ct_dir,
                    ct_flags=ct_flags, drop_reason=drop, tunnel_endpoint=be32(tunnel) if tunnel else 0,
                    before=before, after=after if after is not None else before)
    if inner is not None:
        ev.inner = inner
    return ev


ECHO = tup("198.18.1.11", 0x1234, "198.18.2.11", 0, 1, 0, 8)  # a1 -> b1 ICMP EchoRequest
ECHO_TEXT = "198.18.1.11 -> 198.18.2.11 ICMP EchoRequest id 4660"
OUTER = tup("198.51.100.11", 40001, "198.51.100.12", 8472, 17)  # node-a -> node-b VXLAN


def ping_flows() -> list[Flow]:
    """a1 -> b1 ping in tunnel mode, one record per hook, in time order."""
    return [
        Flow(event(100, 1, 1, 2, ECHO, ct_result=0, ct_dir=0, tunnel="198.51.100.12"), "node-a", "lxc-a1"),
        Flow(event(200, 1, 6, 1, ECHO, tunnel="198.51.100.12"), "node-a", "cilium_vxlan"),
        Flow(event(300, 1, 4, 1, OUTER, inner=ECHO), "node-a", "eth0"),
        Flow(event(400, 2, 3, 1, OUTER, inner=ECHO), "node-b", "eth0"),
        Flow(event(500, 2, 5, 1, ECHO), "node-b", "cilium_vxlan"),
        Flow(event(600, 2, 2, 1, ECHO, ct_result=0, ct_dir=1), "node-b", "lxc-b1"),
    ]


@pytest.fixture
def topo() -> Topology:
    return Topology.default("demo")


# -- graph -------------------------------------------------------------------
def test_graph_tunnel_ids_kinds_hooks(topo):
    """Tunnel mode: every namespace and device of the default lab, with its kind, netns and hooks."""
    g = viz.lab_graph(topo, "tunnel")
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
    native, tunnel = viz.lab_graph(topo, "native"), viz.lab_graph(topo, "tunnel")
    assert not any("cilium_vxlan" in n for n in native)
    assert not any(d["kind"] == "tunnel" for *_, d in native.edges(data=True))
    assert set(tunnel) - set(native) == {"node-a/cilium_vxlan", "node-b/cilium_vxlan"}


def test_graph_edges_follow_wiring(topo):
    """Edges: pod—eth0—lxc—node—eth0—fabric, node—cilium_vxlan, ext—eth0—fabric, dashed tunnel between nodes."""
    g = viz.lab_graph(topo, "tunnel")
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
        viz.lab_graph(topo, "bgp")


# -- layout ------------------------------------------------------------------
@pytest.mark.parametrize("routing", ["tunnel", "native"])
def test_positions_deterministic_and_bounded(topo, routing):
    """Every graph node gets a finite, non-negative place, the same on every call, and no two share one."""
    g = viz.lab_graph(topo, routing)
    random.seed(1)
    first = viz.positions(g)
    random.seed(2)
    assert viz.positions(viz.lab_graph(topo, routing)) == first
    assert set(first) == set(g)
    for x, y in first.values():
        assert math.isfinite(x) and math.isfinite(y)
        assert 0 <= x <= 20 and 0 <= y <= 7
    assert len(set(first.values())) == len(first)


def test_positions_layout(topo):
    """Nodes left to right, pods above their node, fabric lowest, externals right of everything else."""
    pos = viz.positions(viz.lab_graph(topo))
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
    path = viz.hops(shuffled, topo)
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
    assert path[0].flow is shuffled[3] and path[0].colour == viz.VERDICT_COLOURS["REDIRECTED"]
    assert path[5].text().startswith("6. node-b lxc-b1 to-container FORWARDED: 198.18.1.11")


def test_hops_ct_flags_and_empty(topo):
    """CT flag names appear in the summary; no flows give no hops."""
    ev = event(1, 1, 2, 1, ECHO, ct_result=1, ct_dir=1, ct_flags=0x0010)
    [hop] = viz.hops([Flow(ev, "node-a", "lxc-a1")], topo)
    assert "ct=established/ingress flags=[SeenNonSyn]" in hop.summary
    assert viz.hops([], topo) == []


def test_hops_translated(topo):
    """A flow rewritten at its hook shows the packet before, '=>' and the packet after."""
    before = tup("198.18.1.11", 40000, "198.19.0.10", 80, 6, 0x02)
    after = tup("198.18.1.11", 40000, "198.18.2.11", 8080, 6, 0x02)
    ev = event(5, 1, 1, 2, before, after=after, ct_result=0, ct_dir=2, tunnel="198.51.100.12")
    [hop] = viz.hops([Flow(ev, "node-a", "lxc-a1")], topo)
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
    [hop] = viz.hops([Flow(ev, "node-a", "lxc-a1")], topo)
    assert hop.verdict == "DROPPED" and hop.colour == viz.VERDICT_COLOURS["DROPPED"]
    assert f"dropped: {text}" in hop.summary
    assert "tunnel" not in hop.summary.replace(text, "")


# -- pictures ----------------------------------------------------------------
def test_draw_returns_figure(topo):
    """draw gives an Agg Figure with one Axes, about 10 × 6 inches, titled; it also draws into a given Axes."""
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = viz.draw(topo, "tunnel", ping_flows(), title="ping a1 → b1")
    assert isinstance(fig, Figure) and isinstance(fig.canvas, FigureCanvasAgg)
    assert len(fig.axes) == 1 and fig.axes[0].get_title() == "ping a1 → b1"
    width, height = fig.get_size_inches()
    assert 9 <= width <= 11 and 5.5 <= height <= 7
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"a1", "lxc-a1", "cilium_vxlan", "from-container", "to-overlay", "1", "6"} <= texts
    own = Figure()
    ax = own.add_subplot()
    assert viz.draw(topo, "native", ax=ax) is own
    assert "cilium_vxlan" not in {t.get_text() for t in ax.texts}


def test_svg_deterministic(topo):
    """svg() is byte-identical for identical input, has no XML prolog and names every pod."""
    pytest.importorskip("matplotlib")
    first = viz.svg(topo, "tunnel", ping_flows(), title="ping")
    assert first == viz.svg(topo, "tunnel", ping_flows(), title="ping")
    assert first.startswith("<svg") and "<?xml" not in first and "<!DOCTYPE" not in first
    for pod in POD_NAMES:
        assert f">{pod}<" in first
    assert viz.svg(topo, "tunnel") != first  # the path shows


def test_path_html_lists_hops_escaped(topo):
    """path_html holds the SVG and an ordered list of hops, with record text escaped."""
    pytest.importorskip("matplotlib")
    page = viz.path_html(topo, "tunnel", ping_flows(), title="<ping>")
    assert "<svg" in page and page.count("<li ") == 6 and "<ol" in page
    assert "198.18.1.11 -&gt; 198.18.2.11" in page and "&lt;ping&gt;" in page and "<ping>" not in page
    listing = page[page.index("<ol"):]
    assert listing.index("from-container") < listing.index("to-overlay") < listing.index("from-overlay")


def test_path_explorer_slider_updates_html(topo):
    """Setting the slider redraws the picture (hops 1..k) and describes hop k."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("matplotlib")
    ex = viz.PathExplorer(topo, "tunnel", ping_flows())
    assert (ex.slider.min, ex.slider.max, ex.slider.value) == (1, 6, 1)
    assert (ex.play.min, ex.play.max) == (1, 6)
    before_picture, before_detail = ex.picture.value, ex.detail.value
    assert "from-container" in before_detail and "hop 1 of 6" in before_detail
    ex.slider.value = 4
    assert ex.picture.value != before_picture and ex.picture.value.startswith("<svg")
    assert "hop 4 of 6" in ex.detail.value and "from-netdev" in ex.detail.value
    ex.slider.value = 1
    assert ex.picture.value == before_picture  # same hop, same picture
    assert ex.widget.children[1] is ex.picture and ex.widget.children[2] is ex.detail
    bundle = ex._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_path_explorer_without_flows(topo):
    """With no trace records the explorer shows the bare lab and says so."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("matplotlib")
    ex = viz.PathExplorer(topo, "native", [])
    assert ex.slider.max == 0 and ex.slider.disabled and "no trace records" in ex.detail.value
    assert ex.picture.value.startswith("<svg")


def test_all_is_documented():
    """Everything in __all__ exists and public callables have docstrings with examples."""
    for name in viz.__all__:
        obj = getattr(viz, name)
        if callable(obj):
            assert obj.__doc__ and ">>>" in obj.__doc__, name
