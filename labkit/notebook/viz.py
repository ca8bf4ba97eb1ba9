"""Pictures of a lab and of the path a packet took through it: matplotlib, SVG, HTML, a widget.

This module draws; the data it draws is :mod:`labkit.notebook.pathgraph`'s (the lab's
graph, its layout, a path's hops, the colours and sizes), and the SVG text is
:mod:`labkit.notebook.svgpath`'s. The import order is ``viz`` → ``svgpath`` →
``pathgraph`` (an import-linter contract in pyproject.toml). The data functions
are re-exported here, so ``viz.lab_graph(...)`` and ``viz.hops(...)`` keep working.

What is drawn
-------------
Each namespace is a rounded box and each network device a small box inside it,
named as ``ip link`` names it: **pods** in the top row (their ``eth0``);
**nodes** below them, left to right, each under its own pods (host veths
``lxc-<pod>``, the routing stack with the node's name and address, ``eth0``
and, in tunnel routing mode, ``cilium_vxlan``); the **fabric** bridge at the
bottom; **external clients** right of it, e.g. ``ext``. Devices with BPF
programs are shaded and list their hooks in small text (the table is in
:mod:`labkit.notebook.pathgraph`). In tunnel mode a dashed line joins the
``cilium_vxlan`` devices: the tunnel is logical, encapsulated packets really
travel ``cilium_vxlan`` → ``eth0`` → fabric → ``eth0`` → ``cilium_vxlan``.

With trace records (:class:`labkit.observe.trace.Flow`) the path is overlaid: every
record is a *hop*, numbered in time order, its number drawn in a badge at the
device whose hook reported it, and an arrow runs from each hop to the next
one on a different device. Colours say what the hook did: green forwarded,
blue redirected (``bpf_redirect`` straight to another device), red dropped.

Functions, from data to pictures:

* :func:`lab_graph` / :func:`positions` / :func:`hops` (from
  :mod:`~labkit.notebook.pathgraph`): the wiring as a networkx graph, a fixed
  layout of it, and trace records as numbered :class:`Hop` rows;
* :func:`draw` (a matplotlib Figure, Agg backend), :func:`svg` (byte-identical
  SVG text for identical input) and :func:`path_html` (SVG plus the hop list);
* :class:`PathExplorer`: a slider/play widget that steps through the hops.

matplotlib and ipywidgets are imported only by the functions that need them.

Example::

    >>> from labkit.net.topology import Topology
    >>> g = lab_graph(Topology.default("demo"))
    >>> g.nodes["node-a/lxc-a1"]["hooks"]
    ['from-container', 'to-container']
    >>> svg(Topology.default("demo")).startswith("<svg")
    True
"""
from __future__ import annotations

import html
import warnings
from typing import TYPE_CHECKING, Iterable, Sequence

from labkit.addr import ipv4
from labkit.config import VXLAN_PORT
from labkit.net.topology import DEVICE_HOOKS, Topology
from labkit.notebook import svgpath
from labkit.notebook.pathgraph import (BOX_SIZES, MARGIN, NS_EDGE, NS_FILL, ROW_Y, VERDICT_COLOURS, Hop, box_size,
                                       ct_lookup, default_title, extent, hops, lab_graph, positions)
from labkit.observe.trace import Flow

# A venv that also sees the distribution's matplotlib imports its mpl_toolkits and warns that
# Axes3D cannot load; labkit draws no 3D axes, so that warning would only confuse a learner.
warnings.filterwarnings("ignore", message="Unable to import Axes3D")

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "lab_graph",
    "ct_lookup",
    "positions",
    "Hop",
    "hops",
    "draw",
    "svg",
    "path_html",
    "PathExplorer",
    "VERDICT_COLOURS",
    "DEVICE_HOOKS",
]


# -- drawing -----------------------------------------------------------------
def _new_figure(figsize: tuple[float, float]) -> "Figure":
    # A bare Figure on an Agg canvas: no pyplot, no GUI, no global figure list.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _render(graph, pos, path: Sequence[Hop], title: str | None, ax: "Axes | None", upto: int | None) -> "Figure":
    from matplotlib.lines import Line2D
    from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

    # -- extents and figure ----------------------------------------------
    boxes_of: dict[str, list[str]] = {}  # netns -> graph ids inside it (not the fabric)
    for gid, d in graph.nodes(data=True):
        if d.get("kind") != "fabric":
            boxes_of.setdefault(d["netns"], []).append(gid)
    ns_boxes = {}
    for netns, ids in boxes_of.items():
        x0, y0, x1, y1 = extent(pos, graph, ids)
        owner = next(i for i in ids if graph.nodes[i]["kind"] != "device") if any(
            graph.nodes[i]["kind"] != "device" for i in ids) else ids[0]
        kind = graph.nodes[owner]["kind"]
        # room at the top: for the namespace's name, or (nodes) for hop badges above the host veths
        ns_boxes[netns] = (x0 - 0.12, y0 - 0.1, x1 + 0.12, y1 + (0.3 if kind == "node" else 0.22), kind)
    node_boxes = [b for b in ns_boxes.values() if b[4] in ("node", "pod")]
    fab_x0 = min((b[0] for b in node_boxes), default=MARGIN - 0.2)
    fab_x1 = max((b[2] for b in node_boxes), default=MARGIN + 1.0)
    fy = pos["fabric"][1] if "fabric" in pos else ROW_Y["fabric"]
    fab = (fab_x0, fy - 0.2, fab_x1, fy + 0.2)
    all_x0 = min([fab[0]] + [b[0] for b in ns_boxes.values()])
    all_x1 = max([fab[2]] + [b[2] for b in ns_boxes.values()])
    all_y0 = min([fab[1]] + [b[1] for b in ns_boxes.values()])
    all_y1 = max([fab[3]] + [b[3] for b in ns_boxes.values()])
    xlim = (all_x0 - 0.1, all_x1 + 0.1)
    ylim = (all_y0 - 0.05, all_y1 + 0.05)

    if ax is None:
        w_units, h_units = xlim[1] - xlim[0], ylim[1] - ylim[0]
        scale = max(10 / w_units, 0.72)  # inches per unit: 10 inches wide for the default lab
        fig = _new_figure((round(w_units * scale / 0.99, 2), round(h_units * scale / 0.94, 2)))
        ax = fig.add_axes((0.005, 0.005, 0.99, 0.94))
    else:
        fig = ax.figure
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal", adjustable="box")
    ax.set_axis_off()
    ax.set_title(title if title is not None else default_title(graph), fontsize=11)

    # -- namespaces --------------------------------------------------------
    for netns, (x0, y0, x1, y1, kind) in sorted(ns_boxes.items()):
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.12",
                                    facecolor=NS_FILL.get(kind, "#f5f5f5"), edgecolor=NS_EDGE.get(kind, "#999"),
                                    linewidth=1.0, zorder=1))
        # node namespaces: bottom-left, where no hop badge sits; the others: top-left
        ty, va = (y0 + 0.06, "bottom") if kind == "node" else (y1 - 0.06, "top")
        ax.text(x0 + 0.08, ty, netns, fontsize=5.5, color="#555", style="italic", ha="left", va=va, zorder=4)
    ax.add_patch(FancyBboxPatch((fab[0], fab[1]), fab[2] - fab[0], fab[3] - fab[1],
                                boxstyle="round,pad=0,rounding_size=0.1", facecolor="#e4e4e4", edgecolor="#888",
                                linewidth=1.0, zorder=1))
    if "fabric" in graph:
        fd = graph.nodes["fabric"]
        ax.text((fab[0] + fab[2]) / 2, fy, f"fabric bridge ({fd['netns']}) · underlay {fd.get('subnet', '')}",
                fontsize=7, ha="center", va="center", color="#333", zorder=4)

    # -- wiring ------------------------------------------------------------
    order = {n: i for i, n in enumerate(n for n, d in graph.nodes(data=True) if d.get("kind") == "node")}
    for u, v, d in sorted(graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]))):
        if u not in pos or v not in pos:
            continue
        if d.get("kind") == "tunnel":
            ou = order.get(graph.nodes[u].get("owner"), 0)
            ov = order.get(graph.nodes[v].get("owner"), 0)
            # neighbours: a straight line through the gap between them; others: a shallow arc
            # dipping under the nodes in between (between their cilium_vxlan and eth0)
            dx = pos[v][0] - pos[u][0]
            rad = 0.0 if abs(ou - ov) <= 1 or dx == 0 else round(0.7 / dx, 4)
            ax.add_patch(FancyArrowPatch(pos[u], pos[v], arrowstyle="-", connectionstyle=f"arc3,rad={rad}",
                                         linestyle=(0, (4, 3)), linewidth=1.3, color="#7b1fa2", zorder=2,
                                         shrinkA=0, shrinkB=0))
            if rad == 0.0:
                mx, my = (pos[u][0] + pos[v][0]) / 2, (pos[u][1] + pos[v][1]) / 2
                ax.text(mx, my + 0.08, f"VXLAN\nUDP {VXLAN_PORT}", fontsize=6, color="#7b1fa2", ha="center",
                        va="bottom", zorder=4, linespacing=1.0)
            continue
        if "fabric" in (u, v):
            other = v if u == "fabric" else u
            x, y = pos[other]
            end = (x, fab[3]) if fab[0] <= x <= fab[2] else (fab[2], min(max(y, fab[1]), fab[3]))
            ax.plot([x, end[0]], [y, end[1]], color="#777", linewidth=1.2, zorder=2, solid_capstyle="butt")
            continue
        style = "-" if d.get("kind") == "veth" else (0, (1, 1.5))
        ax.plot([pos[u][0], pos[v][0]], [pos[u][1], pos[v][1]], color="#777", linewidth=1.2 if style == "-" else 1.0,
                linestyle=style, zorder=2)

    # -- stacks, labels, devices -----------------------------------------------
    for gid, d in graph.nodes(data=True):
        if gid not in pos:
            continue
        x, y = pos[gid]
        kind = d.get("kind")
        if kind == "node":
            w, h = BOX_SIZES["node"]
            ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.08",
                                        facecolor="#dde3f3", edgecolor="#5c6bc0", linewidth=1.0, zorder=3))
            ax.text(x, y + 0.15, d["label"], fontsize=9, weight="bold", ha="center", va="center", zorder=4)
            ax.text(x, y - 0.06, d.get("ip", ""), fontsize=6.5, ha="center", va="center", zorder=4)
            ax.text(x, y - 0.21, f"pods {d.get('pod_cidr', '')}", fontsize=5.5, color="#444", ha="center",
                    va="center", zorder=4)
        elif kind in ("pod", "external"):
            ax.text(x, y + 0.08, d["label"], fontsize=9, weight="bold", ha="center", va="center", zorder=4)
            ax.text(x, y - 0.14, d.get("ip", ""), fontsize=6.5, ha="center", va="center", zorder=4)
        elif kind == "device":
            w, h = box_size(d)
            hooked = bool(d.get("hooks"))
            ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0,rounding_size=0.06",
                                        facecolor="#fff3d6" if hooked else "white",
                                        edgecolor="#e0a100" if hooked else "#888", linewidth=1.0, zorder=3))
            if hooked:
                ax.text(x, y + 0.14, d["ifname"], fontsize=7.5, weight="bold", ha="center", va="center", zorder=4)
                for k, hook in enumerate(d["hooks"]):
                    ax.text(x, y - 0.04 - 0.14 * k, hook, fontsize=6, color="#8a5a00", ha="center", va="center",
                            zorder=4)
            else:
                ax.text(x, y, d["ifname"], fontsize=7, ha="center", va="center", zorder=4)

    # -- the path ------------------------------------------------------------
    shown = list(path) if upto is None else list(path)[: max(upto, 0)]
    current = shown[-1].index if (upto is not None and shown) else None

    def where(hop: Hop):
        if hop.id in pos:
            return pos[hop.id]
        return pos.get(hop.node)

    # badges first: each hop's number sits just above its device, in rows read left to right.
    # Places come from the whole path, so a badge stays put while PathExplorer adds hops.
    r = 0.13 if len(path) <= 30 else 0.1
    pitch = 2.15 * r
    slot_of: dict[int, tuple[str, int]] = {}
    count: dict[str, int] = {}
    for hop in path:
        if where(hop) is None:
            continue
        gid = hop.id if hop.id in pos else hop.node
        slot_of[hop.index] = (gid, count.get(gid, 0))
        count[gid] = count.get(gid, 0) + 1
    badge: dict[int, tuple[float, float]] = {}
    for hop in shown:
        if hop.index not in slot_of:
            continue
        gid, k = slot_of[hop.index]
        x, y = pos[gid]
        w, h = box_size(graph.nodes[gid]) if gid in graph else BOX_SIZES["plain"]
        per_row = max(int((w + 0.5) // pitch), 1)
        row, col = divmod(k, per_row)
        in_row = min(per_row, count[gid] - row * per_row)
        # rows start at the end facing the node's stack, where the arrows come from
        owner = graph.nodes[gid].get("owner") if gid in graph else None
        if owner in pos and x < pos[owner][0] - 0.01:
            bx = x + w / 2 - r - (in_row - 1 - col) * pitch
        else:
            bx = x - w / 2 + r + col * pitch
        badge[hop.index] = (bx, y + h / 2 + r + 0.02 + row * pitch)

    # arrows from badge to badge, coloured by what the hook they leave did
    pairs: dict[tuple, int] = {}
    prev = None
    for hop in shown:
        if prev is not None and prev.index in badge and hop.index in badge and where(prev) != where(hop):
            a, b = badge[prev.index], badge[hop.index]
            n = pairs.get((where(prev), where(hop)), 0)
            pairs[(where(prev), where(hop))] = n + 1
            # bend so that A->B and B->A part, but by at most a quarter unit (more for repeats):
            # long arrows would otherwise sweep across the devices between their ends
            dist = max(((b[0] - a[0]) ** 2 + (b[1] - a[1]) ** 2) ** 0.5, 1e-6)
            rad = min(0.18 + 0.1 * n, (0.5 + 0.3 * n) / dist)
            is_current = hop.index == current
            ax.add_patch(FancyArrowPatch(
                a, b, arrowstyle="-|>", mutation_scale=13 if is_current else 11,
                connectionstyle=f"arc3,rad={rad:.3f}",
                color=prev.colour, linewidth=2.4 if is_current else 1.5,
                linestyle=":" if prev.verdict == "DROPPED" else "-",
                shrinkA=7, shrinkB=8, alpha=0.95, zorder=5))
        prev = hop

    # an outside client has no hooks: draw where its packets enter the cluster and where replies leave it
    for hop, a, b in _external_legs(graph, pos, shown, badge):
        ax.add_patch(FancyArrowPatch(
            a, b, arrowstyle="-|>", mutation_scale=11, connectionstyle="arc3,rad=0.12", color=hop.colour,
            linewidth=1.5, linestyle="--", shrinkA=8, shrinkB=8, alpha=0.9, zorder=5))

    for hop in shown:
        if hop.index not in badge:
            continue
        bx, by = badge[hop.index]
        is_current = hop.index == current
        ax.add_patch(Circle((bx, by), r * (1.25 if is_current else 1.0), facecolor=hop.colour,
                            edgecolor="black" if is_current else "white", linewidth=1.6 if is_current else 0.8,
                            zorder=6))
        ax.text(bx, by, str(hop.index), fontsize=6.5 if hop.index < 100 else 5, color="white", weight="bold",
                ha="center", va="center", zorder=7)

    if path:
        handles = [Line2D([], [], color=c, marker="o", linewidth=1.6, markersize=6, label=v.lower())
                   for v, c in VERDICT_COLOURS.items()]
        ax.legend(handles=handles, loc="upper right", fontsize=7, frameon=False, title="hop verdict",
                  title_fontsize=7)
    return fig


def _external_legs(graph, pos, shown: Sequence[Hop], badge: dict) -> list[tuple[Hop, tuple, tuple]]:
    """(hop, from, to) for each packet an external client sent that a node's from-netdev saw (client
    eth0 → badge), and each packet a node's to-netdev sent to a client (badge → client eth0)."""
    clients = {d["ip"]: f"{e}/eth0" for e, d in graph.nodes(data=True)
               if d.get("kind") == "external" and f"{e}/eth0" in pos}
    legs = []
    for hop in shown:
        ev = hop.flow.event if hop.flow is not None else None
        if ev is None or hop.index not in badge or ev.inner.proto:
            continue
        if hop.hook == "from-netdev" and (client := clients.get(ipv4(ev.before.saddr))):
            legs.append((hop, pos[client], badge[hop.index]))
        elif hop.hook == "to-netdev" and hop.verdict != "DROPPED" and (client := clients.get(ipv4(ev.after.daddr))):
            legs.append((hop, badge[hop.index], pos[client]))
    return legs


def draw(topology: Topology, routing: str = "tunnel", flows: Iterable["Flow"] | None = None,
         title: str | None = None, ax: "Axes | None" = None, *, upto: int | None = None) -> "Figure":
    """Draw the lab and, given trace records, the path they took. Returns the Figure.

    The figure is made on the Agg canvas (nothing is shown on screen; use
    ``fig.savefig(...)`` or display it in a notebook). It is about 10 × 6
    inches for the default lab and grows with larger labs. Pass ``ax`` to draw
    into an existing Axes instead. ``upto=k`` draws only hops 1..k and rings
    hop k (what :class:`PathExplorer` shows).

    >>> fig = draw(Topology.default("demo"))
    >>> fig.axes[0].get_title()
    'lab demo · tunnel routing'
    >>> [round(v) for v in fig.get_size_inches()]
    [10, 6]
    """
    graph = lab_graph(topology, routing)
    return _render(graph, positions(graph), hops(flows or [], topology), title, ax, upto)


def _svg_text(graph, pos, path, title, upto) -> str:
    return svgpath.render(graph, pos, path, title, upto)


def svg(topology: Topology, routing: str = "tunnel", flows: Iterable["Flow"] | None = None,
        title: str | None = None, *, upto: int | None = None) -> str:
    """The picture of :func:`draw` as SVG text to embed in HTML (no XML prolog), written by
    :mod:`labkit.notebook.svgpath` (no matplotlib): repeated hops grouped with ``×N``, hairpin
    loops drawn, badges inside their namespace's box, drop reasons beside dropped hops.

    Identical input gives byte-identical output. Text stays text, so names can
    be searched and the page's sans-serif font renders it.

    >>> text = svg(Topology.default("demo"))
    >>> text.startswith("<svg") and "a1" in text and text == svg(Topology.default("demo"))
    True
    """
    graph = lab_graph(topology, routing)
    return _svg_text(graph, positions(graph), hops(flows or [], topology), title, upto)


def _hop_item(hop: Hop) -> str:
    return (f'<code>{html.escape(hop.id)}</code> <b>{html.escape(hop.hook)}</b> '
            f'<span style="color:{hop.colour};font-weight:bold">{html.escape(hop.verdict)}</span>: '
            f'<code>{html.escape(hop.summary)}</code>')


def path_html(topology: Topology, routing: str = "tunnel", flows: Iterable["Flow"] | None = None,
              title: str | None = None) -> str:
    """The path picture (SVG) and an ordered list of its hops, as one HTML fragment.

    Repeated hops are one item with ``×N``, numbered as their badge on the picture.
    Meant for exported HTML and notebooks; all text from the records is escaped.

    >>> page = path_html(Topology.default("demo"), "native", [])
    >>> page.startswith('<div class="labkit-path">') and "no trace records" in page
    True
    """
    graph = lab_graph(topology, routing)
    path = hops(flows or [], topology)
    parts = ['<div class="labkit-path">', _svg_text(graph, positions(graph), path, title, None)]
    if path:
        parts.append('<ol class="labkit-hops" style="font-size:90%">')
        for g in svgpath.group_hops(path):
            times = f' <b>×{g.count}</b>' if g.count > 1 else ""
            parts.append(f'<li value="{g.number}">{_hop_item(g.first)}{times}</li>')
        parts.append("</ol>")
    else:
        parts.append("<p><i>no trace records</i></p>")
    parts.append("</div>")
    return "\n".join(parts)


# -- interactive -------------------------------------------------------------
class PathExplorer:
    """Step through a path hop by hop: play button, slider, picture and the chosen hop's details.

    Built only from core ipywidgets (``Play``, ``IntSlider``, ``HTML``,
    ``HBox``/``VBox``), so it works in JupyterLab 4 without any build step. The
    play button and the slider are linked in the browser (``jslink``); the
    picture follows the slider on the Python side, so it also updates when
    code sets ``explorer.slider.value``. Pictures are rendered once per hop
    and cached.

    >>> ex = PathExplorer(Topology.default("demo"), "tunnel", [])
    >>> ex.slider.max, "no trace records" in ex.detail.value
    (0, True)
    """

    def __init__(self, topology: Topology, routing: str = "tunnel", flows: Iterable["Flow"] = (),
                 title: str | None = None, *, interval_ms: int = 900):
        import ipywidgets as widgets

        self.topology = topology
        self.routing = routing
        self.title = title
        self._graph = lab_graph(topology, routing)
        self._pos = positions(self._graph)
        self.hops: list[Hop] = hops(flows or [], topology)
        self._cache: dict[int, str] = {}
        n = len(self.hops)
        low = 1 if n else 0
        self.play = widgets.Play(value=low, min=low, max=n, step=1, interval=interval_ms, description="play",
                                 disabled=n == 0)
        self.slider = widgets.IntSlider(value=low, min=low, max=n, step=1, description="hop", disabled=n == 0,
                                        continuous_update=True)
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.picture = widgets.HTML()
        self.detail = widgets.HTML()
        self.slider.observe(self._on_value, names="value")
        self._box = widgets.VBox([widgets.HBox([self.play, self.slider]), self.picture, self.detail])
        self.show(low)

    @property
    def widget(self):
        """The widget to display (a ``VBox``)."""
        return self._box

    def _on_value(self, change) -> None:
        self.show(change["new"])

    def show(self, k: int) -> None:
        """Draw hops 1..k and describe hop k (what moving the slider to k does)."""
        k = max(0, min(int(k), len(self.hops)))
        if k not in self._cache:
            self._cache[k] = _svg_text(self._graph, self._pos, self.hops, self.title, k)
        self.picture.value = self._cache[k]
        if not self.hops:
            self.detail.value = "<p><i>no trace records</i></p>"
        elif k == 0:
            self.detail.value = "<p><i>no hop chosen</i></p>"
        else:
            hop = self.hops[k - 1]
            self.detail.value = (f"<p><b>hop {k} of {len(self.hops)}</b> · {html.escape(hop.node)} · "
                                 f"{_hop_item(hop)}</p>")

    def _repr_mimebundle_(self, **kwargs):
        return self._box._repr_mimebundle_(**kwargs)
