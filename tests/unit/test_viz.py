"""Pictures of the lab and of a packet's path (labkit.notebook.viz): Figure, SVG, HTML, explorer widget.

The graph, its layout and the hops are pathgraph's: tests/unit/test_pathgraph.py."""
from __future__ import annotations

import pytest

from labkit.net.topology import Topology
from labkit.notebook import pathgraph, viz
from tracefixtures import ping_flows

POD_NAMES = ("a1", "a2", "b1", "b2")






@pytest.fixture
def topo() -> Topology:
    return Topology.default("demo")


# -- the data, re-exported ------------------------------------------------------
def test_reexports_pathgraph(topo):
    """viz's lab_graph, positions, Hop, hops, ct_lookup and VERDICT_COLOURS are pathgraph's, for viz's callers."""
    for name in ("lab_graph", "positions", "Hop", "hops", "ct_lookup", "VERDICT_COLOURS"):
        assert getattr(viz, name) is getattr(pathgraph, name), name
    first = viz.hops(ping_flows(), topo)[0]
    assert first.text().startswith("1. node-a lxc-a1 from-container REDIRECTED: 198.18.1.11")


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
