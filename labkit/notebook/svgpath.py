"""The path picture as SVG text written by labkit itself (no matplotlib on a step's path).

This module owns the SVG picture of :mod:`labkit.notebook.pathgraph`'s data
(:func:`~labkit.notebook.pathgraph.lab_graph` placed by
:func:`~labkit.notebook.pathgraph.positions`, a path's
:class:`~labkit.notebook.pathgraph.Hop` rows) and the grouping of repeated hops
that the step's hop list numbers by. It imports from ``pathgraph`` only;
:mod:`labkit.notebook.viz` (``svg``, ``path_html``, ``PathExplorer``) calls it.

The layout is that of :func:`labkit.notebook.viz.draw`: namespaces as rounded boxes,
devices inside them (hooked devices shaded, their hooks listed), the fabric at
the bottom, the VXLAN tunnel dashed. The hops of a path are drawn as numbered
badges above the device whose hook reported them, coloured by verdict, with an
arrow from each hop to the next on another device. What it adds to that picture:

* **repeats grouped**: hops with the same device, hook, verdict and packet
  summary (a TCP retry, a retransmission) are one badge with ``×N``
  (:func:`group_hops`; the step's hop list uses the same numbers);
* **loops**: a packet that comes back to the device it left (a hairpin:
  from-container, then to-container of the same ``lxc``) gets a loop drawn
  from one badge to the next;
* **badges stay inside their namespace's box**: the badges of a device are
  laid out in rows that fit above it, smaller when there are many, and the
  box grows if they still do not fit;
* **drops**: the dropped hop's badge is red and its drop reason is written
  under the device.

Output is deterministic (byte-identical for identical input), text stays text,
and the ``<svg>`` carries a ``viewBox`` and ``max-width:100%`` so it scales with
the page. Element classes name what they are (``ns``, ``device``, ``badge``,
``arrow``, ``loop``, ``drop-reason``), which the tests and a page's CSS can use.

    >>> from labkit.net.topology import Topology
    >>> from labkit.notebook.pathgraph import lab_graph, positions
    >>> g = lab_graph(Topology.default("demo"))
    >>> text = render(g, positions(g), [])
    >>> text.startswith("<svg") and 'class="device"' in text and text == render(g, positions(g), [])
    True
"""
from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from typing import Sequence

from labkit.addr import ipv4
from labkit.config import VXLAN_PORT
from labkit.constants import DropReason
from labkit.notebook.pathgraph import (BOX_SIZES, NS_EDGE, NS_FILL, ROW_Y, UNKNOWN_COLOUR, VERDICT_COLOURS, Hop,
                                       box_size, default_title)

__all__ = ["HopGroup", "group_hops", "render", "SCALE"]

#: Pixels per layout unit (the layout of :func:`labkit.notebook.pathgraph.positions`).
SCALE = 64.0
_R = 0.13  # badge radius (units) when there is room
_R_MIN = 0.06
_BADGE_ROOM = 0.3  # height above a device for its badge rows
_COUNT_W = 0.3  # extra width of a badge that carries "×N"


@dataclass(frozen=True)
class HopGroup:
    """Hops that repeat one another: same device, hook, verdict and summary (a retry, a retransmission;
    for a VXLAN record the outer UDP source port, a hash that changes per packet, is left out).

    ``number`` counts groups from 1 in the order of their first hop; ``hops`` are
    the repeats in time order.

    >>> h = Hop(1, "node-a", "lxc-a1", "node-a/lxc-a1", "from-container", "FORWARDED", "SYN")
    >>> g = HopGroup(1, (h, h))
    >>> g.count, g.first is h, g.label
    (2, True, '1 ×2')
    """

    number: int
    hops: tuple[Hop, ...]

    @property
    def first(self) -> Hop:
        """The group's first hop."""
        return self.hops[0]

    @property
    def count(self) -> int:
        """How many hops the group stands for."""
        return len(self.hops)

    @property
    def label(self) -> str:
        """``3`` or, for repeats, ``3 ×9``."""
        return f"{self.number} ×{self.count}" if self.count > 1 else str(self.number)


_OUTER_SPORT = re.compile(r"^([0-9.]+):\d+ ")


def _key(hop: Hop) -> tuple:
    summary = hop.summary
    if hop.flow is not None and hop.flow.event.inner.proto:
        # a VXLAN record: the outer source port is a per-packet hash, so a retry differs only there
        summary = _OUTER_SPORT.sub(r"\1:* ", summary, count=1)
    return (hop.id, hop.hook, hop.verdict, summary)


def group_hops(path: Sequence[Hop]) -> list[HopGroup]:
    """The hops of ``path`` grouped by :class:`HopGroup`'s key, numbered in order of first appearance.

    >>> a = Hop(1, "node-a", "lxc-a1", "node-a/lxc-a1", "from-container", "FORWARDED", "SYN")
    >>> b = Hop(2, "node-a", "eth0", "node-a/eth0", "to-netdev", "DROPPED", "SYN; dropped: x")
    >>> [g.label for g in group_hops([a, b, a, b, a, b])]
    ['1 ×3', '2 ×3']
    """
    groups: dict[tuple, list[Hop]] = {}
    for hop in path:
        groups.setdefault(_key(hop), []).append(hop)
    return [HopGroup(i, tuple(hops)) for i, hops in enumerate(groups.values(), start=1)]


def drop_reason(hop: Hop) -> str:
    """The drop reason of a dropped hop, as text ('' for other hops)."""
    if hop.verdict != "DROPPED":
        return ""
    if hop.flow is not None:
        return DropReason.text(hop.flow.event.drop_reason)
    _, _, reason = hop.summary.partition("dropped: ")
    return reason


# -- writing SVG ---------------------------------------------------------------
def _n(v: float) -> str:
    text = f"{v:.1f}"
    return "0.0" if text == "-0.0" else text


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


class _Canvas:
    """Units in, pixels out: x right, y up (as the layout), flipped into SVG's y down."""

    def __init__(self, x0: float, y0: float, x1: float, y1: float):
        self.x0, self.y1 = x0, y1
        self.width, self.height = (x1 - x0) * SCALE, (y1 - y0) * SCALE
        self.out: list[str] = []

    def px(self, x: float, y: float) -> tuple[str, str]:
        return _n((x - self.x0) * SCALE), _n((self.y1 - y) * SCALE)

    def rect(self, x0, y0, x1, y1, cls, fill, stroke, rx=0.08, **attrs) -> None:
        px, py = self.px(x0, y1)
        extra = "".join(f' {k.replace("_", "-")}="{_esc(v)}"' for k, v in attrs.items())
        self.out.append(f'<rect class="{cls}" x="{px}" y="{py}" width="{_n((x1 - x0) * SCALE)}" '
                        f'height="{_n((y1 - y0) * SCALE)}" rx="{_n(rx * SCALE)}" fill="{fill}" '
                        f'stroke="{stroke}"{extra}/>')

    def text(self, x, y, text, size, cls="", anchor="middle", fill="#222", weight="", style="") -> None:
        px, py = self.px(x, y)
        attrs = f' class="{cls}"' if cls else ""
        attrs += ' font-weight="bold"' if weight else ""
        attrs += f' font-style="{style}"' if style else ""
        self.out.append(f'<text{attrs} x="{px}" y="{py}" font-size="{_n(size)}" text-anchor="{anchor}" '
                        f'dominant-baseline="central" fill="{fill}">{_esc(text)}</text>')

    def line(self, a, b, stroke="#777", width=1.2, dash="", cls="wire") -> None:
        (x1, y1), (x2, y2) = self.px(*a), self.px(*b)
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.out.append(f'<line class="{cls}" x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{stroke}" '
                        f'stroke-width="{width}"{d}/>')


def _marker_id(colour: str) -> str:
    return "lk-arrow-" + colour.lstrip("#")


def _defs() -> str:
    colours = sorted(set(VERDICT_COLOURS.values()) | {UNKNOWN_COLOUR})
    markers = "".join(
        f'<marker id="{_marker_id(c)}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{c}"/></marker>' for c in colours)
    return f"<defs>{markers}</defs>"


# -- layout of badges ------------------------------------------------------------
def _place_badges(graph, pos, groups: Sequence[HopGroup]) -> tuple[dict[int, tuple[float, float]], dict[str, float]]:
    """Badge centres by group number, and each device's badge radius. A device's badges go in rows
    above it, as wide as the device, starting at the end facing the node's stack; the radius shrinks
    until the rows fit in the room above the device."""
    at: dict[str, list[HopGroup]] = {}
    for g in groups:
        gid = _where(graph, pos, g.first)
        if gid is not None:
            at.setdefault(gid, []).append(g)
    centres: dict[int, tuple[float, float]] = {}
    radius: dict[str, float] = {}
    for gid, gs in at.items():
        x, y = pos[gid]
        w, h = box_size(graph.nodes[gid]) if gid in graph else BOX_SIZES["plain"]
        width = max(w, 1.0)
        r = _R
        while True:
            rows = _rows(gs, r, width)
            if len(rows) * 2.15 * r <= _BADGE_ROOM or r <= _R_MIN:
                break
            r = round(r - 0.01, 4)
        radius[gid] = r
        owner = graph.nodes[gid].get("owner") if gid in graph else None
        from_right = owner in pos and x < pos[owner][0] - 0.01
        for k, row in enumerate(rows):
            used = sum(_slot(g, r) for g in row)
            cx = x + width / 2 - used if from_right else x - width / 2
            for g in row:
                centres[g.number] = (round(cx + r * 1.075, 4), round(y + h / 2 + r + 0.03 + k * 2.15 * r, 4))
                cx += _slot(g, r)
    return centres, radius


def _slot(g: HopGroup, r: float) -> float:
    return 2.15 * r + (_COUNT_W * r / _R if g.count > 1 else 0.0)


def _rows(gs: Sequence[HopGroup], r: float, width: float) -> list[list[HopGroup]]:
    rows: list[list[HopGroup]] = [[]]
    used = 0.0
    for g in gs:
        s = _slot(g, r)
        if rows[-1] and used + s > width + 1e-9:
            rows.append([])
            used = 0.0
        rows[-1].append(g)
        used += s
    return rows


def _where(graph, pos, hop: Hop) -> str | None:
    if hop.id in pos:
        return hop.id
    return hop.node if hop.node in pos else None


# -- the picture -------------------------------------------------------------
def render(graph, pos: dict, path: Sequence[Hop], title: str | None = None, upto: int | None = None) -> str:
    """The lab ``graph`` laid out at ``pos`` with the hops of ``path``, as SVG text.

    ``upto=k`` shows hops 1..k only (grouped as far as they go) and rings the
    badge of hop k; badges keep the places the whole path gives them.

    >>> from labkit.net.topology import Topology
    >>> from labkit.notebook.pathgraph import lab_graph, positions
    >>> g = lab_graph(Topology.default("demo"), "native")
    >>> "cilium_vxlan" in render(g, positions(g), [], title="bare")
    False
    """
    all_groups = group_hops(path)
    centres, radius = _place_badges(graph, pos, all_groups)
    shown = list(path) if upto is None else list(path)[: max(upto, 0)]
    groups = group_hops(shown)
    number_of = {_key(g.first): g.number for g in all_groups}
    group_of = {h.index: number_of[_key(h)] for h in path}
    current = shown[-1].index if (upto is not None and shown) else None
    current_group = group_of.get(current) if current is not None else None

    # -- boxes: namespaces (grown to hold their badges), fabric --------------------
    boxes_of: dict[str, list[str]] = {}
    for gid, d in graph.nodes(data=True):
        if d.get("kind") != "fabric" and gid in pos:
            boxes_of.setdefault(d["netns"], []).append(gid)
    ns_boxes: dict[str, list] = {}
    netns_of = {gid: d.get("netns") for gid, d in graph.nodes(data=True)}
    for netns, ids in boxes_of.items():
        xs0, ys0, xs1, ys1 = [], [], [], []
        for gid in ids:
            x, y = pos[gid]
            w, h = box_size(graph.nodes[gid])
            xs0.append(x - w / 2), xs1.append(x + w / 2), ys0.append(y - h / 2), ys1.append(y + h / 2)
        kinds = [graph.nodes[i]["kind"] for i in ids if graph.nodes[i]["kind"] != "device"]
        kind = kinds[0] if kinds else graph.nodes[ids[0]]["kind"]
        ns_boxes[netns] = [min(xs0) - 0.12, min(ys0) - 0.1, max(xs1) + 0.12,
                           max(ys1) + (0.3 if kind == "node" else 0.22), kind]
    for g in all_groups:
        gid = _where(graph, pos, g.first)
        if g.number not in centres or gid is None or netns_of.get(gid) not in ns_boxes:
            continue
        box = ns_boxes[netns_of[gid]]
        bx, by = centres[g.number]
        r = radius[gid]
        right = bx + r + (_COUNT_W * r / _R if g.count > 1 else 0.0)
        box[0], box[1] = min(box[0], bx - r - 0.04), min(box[1], by - r - 0.04)
        box[2], box[3] = max(box[2], right + 0.04), max(box[3], by + r + 0.04)
    node_boxes = [b for b in ns_boxes.values() if b[4] in ("node", "pod")]
    fab_x0 = min((b[0] for b in node_boxes), default=0.6)
    fab_x1 = max((b[2] for b in node_boxes), default=1.8)
    fy = pos["fabric"][1] if "fabric" in pos else ROW_Y["fabric"]
    fab = (fab_x0, fy - 0.2, fab_x1, fy + 0.2)
    x0 = min([fab[0]] + [b[0] for b in ns_boxes.values()]) - 0.1
    x1 = max([fab[2]] + [b[2] for b in ns_boxes.values()]) + 0.1
    y0 = min([fab[1]] + [b[1] for b in ns_boxes.values()]) - 0.45  # room for drop reasons under eth0
    y1 = max([fab[3]] + [b[3] for b in ns_boxes.values()]) + 0.45  # the title
    c = _Canvas(x0, y0, x1, y1)

    c.text((x0 + x1) / 2, y1 - 0.22, title if title is not None else default_title(graph), 14, cls="title")
    for netns, (bx0, by0, bx1, by1, kind) in sorted(ns_boxes.items()):
        c.rect(bx0, by0, bx1, by1, "ns", NS_FILL.get(kind, "#f5f5f5"), NS_EDGE.get(kind, "#999"), rx=0.12,
               data_netns=netns)
        ty = by0 + 0.09 if kind == "node" else by1 - 0.09
        c.text(bx0 + 0.08, ty, netns, 7, cls="ns-label", anchor="start", fill="#555", style="italic")
    c.rect(fab[0], fab[1], fab[2], fab[3], "fabric", "#e4e4e4", "#888", rx=0.1)
    if "fabric" in graph:
        fd = graph.nodes["fabric"]
        c.text((fab[0] + fab[2]) / 2, fy, f"fabric bridge ({fd['netns']}) · underlay {fd.get('subnet', '')}", 9,
               fill="#333")

    # -- wiring --------------------------------------------------------------------
    for u, v, d in sorted(graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]))):
        if u not in pos or v not in pos:
            continue
        if d.get("kind") == "tunnel":
            c.line(pos[u], pos[v], "#7b1fa2", 1.3, "5 4", cls="tunnel")
            mx, my = (pos[u][0] + pos[v][0]) / 2, (pos[u][1] + pos[v][1]) / 2
            c.text(mx, my + 0.22, "VXLAN", 8, fill="#7b1fa2")
            c.text(mx, my + 0.1, f"UDP {VXLAN_PORT}", 8, fill="#7b1fa2")
            continue
        if "fabric" in (u, v):
            other = v if u == "fabric" else u
            x, y = pos[other]
            end = (x, fab[3]) if fab[0] <= x <= fab[2] else (fab[2], min(max(y, fab[1]), fab[3]))
            c.line((x, y), end)
            continue
        c.line(pos[u], pos[v], width=1.2 if d.get("kind") == "veth" else 1.0,
               dash="" if d.get("kind") == "veth" else "1.5 2")

    # -- stacks, pods, devices -------------------------------------------------------
    for gid, d in sorted(graph.nodes(data=True), key=lambda n: str(n[0])):
        if gid not in pos:
            continue
        x, y = pos[gid]
        kind = d.get("kind")
        if kind == "node":
            w, h = BOX_SIZES["node"]
            c.rect(x - w / 2, y - h / 2, x + w / 2, y + h / 2, "stack", "#dde3f3", "#5c6bc0", data_id=gid)
            c.text(x, y + 0.15, d["label"], 12, weight="bold")
            c.text(x, y - 0.06, d.get("ip", ""), 9)
            c.text(x, y - 0.21, f"pods {d.get('pod_cidr', '')}", 7.5, fill="#444")
        elif kind in ("pod", "external"):
            c.text(x, y + 0.08, d["label"], 12, cls=kind, weight="bold")
            c.text(x, y - 0.14, d.get("ip", ""), 9)
        elif kind == "device":
            w, h = box_size(d)
            hooked = bool(d.get("hooks"))
            c.rect(x - w / 2, y - h / 2, x + w / 2, y + h / 2, "device", "#fff3d6" if hooked else "white",
                   "#e0a100" if hooked else "#888", rx=0.06, data_id=gid)
            if hooked:
                c.text(x, y + 0.14, d["ifname"], 10, weight="bold")
                for k, hook in enumerate(d["hooks"]):
                    c.text(x, y - 0.04 - 0.14 * k, hook, 8, fill="#8a5a00")
            else:
                c.text(x, y, d["ifname"], 9)

    # -- the path: arrows between groups, loops, external legs -----------------------
    out = c.out
    drawn: set[tuple[int, int]] = set()
    prev: Hop | None = None
    for hop in shown:
        if prev is not None:
            a, b = group_of[prev.index], group_of[hop.index]
            same = _where(graph, pos, prev) == _where(graph, pos, hop)
            # The packet came back to the device it entered by (from-container then to-container of one lxc:
            # a hairpin; from-netdev then to-netdev of one eth0): a loop. A pod sending (from-container), or
            # anything after the packet left by a device and came in by it again (a pod's or a peer's reply),
            # starts a new packet: no arrow from wherever the last one ended.
            turn = same and prev.hook.startswith("from-") and hop.hook.startswith("to-")
            starts = (hop.hook == "from-container" or same) and not turn
            if a != b and (a, b) not in drawn and a in centres and b in centres and not starts:
                drawn.add((a, b))
                out.append(_arrow(c, centres[a], centres[b], prev, turn, radius, graph, pos,
                                  bold=hop.index == current))
        prev = hop
    for hop, a, b in _external_legs(graph, pos, shown, centres, group_of):
        (ax_, ay), (bx_, by_) = c.px(*a), c.px(*b)
        out.append(f'<path class="arrow external" d="M{ax_},{ay} L{bx_},{by_}" fill="none" stroke="{hop.colour}" '
                   f'stroke-width="1.5" stroke-dasharray="5 3" marker-end="url(#{_marker_id(hop.colour)})"/>')

    # -- badges and drop reasons -------------------------------------------------------
    reasons_at: dict[str, int] = {}
    for g in groups:
        full = next(x for x in all_groups if x.number == number_of[_key(g.first)])
        if full.number not in centres:
            continue
        hop = g.first
        gid = _where(graph, pos, hop)
        r = radius[gid]
        bx, by = centres[full.number]
        px, py = c.px(bx, by)
        ring = full.number == current_group
        hop_list = ", ".join(str(h.index) for h in g.hops)
        tip = f"{full.number}. {hop.id} {hop.hook} {hop.verdict}: {hop.summary}" + (
            f" (×{g.count}: hops {hop_list})" if g.count > 1 else "")
        out.append(f'<g class="badge" data-hop="{full.number}" data-count="{g.count}" data-device="{_esc(gid)}" '
                   f'data-verdict="{_esc(hop.verdict)}"><title>{_esc(tip)}</title>'
                   f'<circle cx="{px}" cy="{py}" r="{_n(r * SCALE * (1.25 if ring else 1.0))}" fill="{hop.colour}" '
                   f'stroke="{"black" if ring else "white"}" stroke-width="{1.6 if ring else 0.8}"/>'
                   f'<text x="{px}" y="{py}" font-size="{_n(r * SCALE * (0.95 if full.number < 100 else 0.75))}" '
                   f'text-anchor="middle" dominant-baseline="central" fill="white" font-weight="bold">'
                   f'{full.number}</text>')
        if g.count > 1:
            cx, cy = c.px(bx + r * 1.1, by)
            out.append(f'<text class="count" x="{cx}" y="{cy}" font-size="{_n(max(r * SCALE * 0.85, 6))}" '
                       f'dominant-baseline="central" fill="{hop.colour}" font-weight="bold">×{g.count}</text>')
        out.append("</g>")
        reason = drop_reason(hop)
        if reason and gid in pos:
            x, y = pos[gid]
            w, h = box_size(graph.nodes[gid]) if gid in graph else BOX_SIZES["plain"]
            k = reasons_at.get(gid, 0)
            reasons_at[gid] = k + 1
            c.text(x, y - h / 2 - 0.13 - 0.15 * k, f"✗ {full.number}: {reason}", 9, cls="drop-reason",
                   fill=VERDICT_COLOURS["DROPPED"], weight="bold")

    # -- legend --------------------------------------------------------------------------
    if path:
        lx, ly = x1 - 1.35, y1 - 0.2
        c.text(lx, ly, "hop verdict", 8, anchor="start", fill="#333", cls="legend")
        for k, (verdict, colour) in enumerate(VERDICT_COLOURS.items()):
            px, py = c.px(lx + 0.06, ly - 0.15 * (k + 1))
            out.append(f'<circle class="legend" cx="{px}" cy="{py}" r="4" fill="{colour}"/>')
            c.text(lx + 0.16, ly - 0.15 * (k + 1), verdict.lower(), 8, anchor="start", cls="legend")

    head = (f'<svg xmlns="http://www.w3.org/2000/svg" class="labkit-path-svg" viewBox="0 0 {_n(c.width)} '
            f'{_n(c.height)}" width="{_n(c.width)}" height="{_n(c.height)}" '
            f'style="max-width:100%;height:auto" font-family="sans-serif">')
    return "\n".join([head, _defs(), *c.out, "</svg>"]) + "\n"


def _arrow(c: _Canvas, a, b, prev: Hop, same_device: bool, radius, graph, pos, bold: bool) -> str:
    """A curved arrow from badge ``a`` to badge ``b`` in the colour of what ``prev`` did; from a device
    back to itself (a hairpin) a loop rising above the badges."""
    colour = prev.colour
    dash = ' stroke-dasharray="2 3"' if prev.verdict == "DROPPED" else ""
    width = 2.4 if bold else 1.5
    (ax, ay), (bx, by) = a, b
    gid = _where(graph, pos, prev)
    r = radius.get(gid, _R)
    if same_device:
        lift = 0.45 + 0.1 * abs(bx - ax)
        p0, p1 = c.px(ax, ay + r), c.px(bx, by + r)
        q0, q1 = c.px(ax - 0.15, ay + lift), c.px(bx + 0.15, by + lift)
        return (f'<path class="loop" d="M{p0[0]},{p0[1]} C{q0[0]},{q0[1]} {q1[0]},{q1[1]} {p1[0]},{p1[1]}" '
                f'fill="none" stroke="{colour}" stroke-width="{width}"{dash} '
                f'marker-end="url(#{_marker_id(colour)})"/>')
    dx, dy = bx - ax, by - ay
    dist = max(math.hypot(dx, dy), 1e-6)
    ux, uy = dx / dist, dy / dist
    start = (ax + ux * r * 1.1, ay + uy * r * 1.1)
    end = (bx - ux * r * 1.3, by - uy * r * 1.3)
    bend = min(0.18 * dist, 0.5)
    mid = ((ax + bx) / 2 - uy * bend, (ay + by) / 2 + ux * bend)
    (sx, sy), (mx, my), (ex, ey) = c.px(*start), c.px(*mid), c.px(*end)
    return (f'<path class="arrow" d="M{sx},{sy} Q{mx},{my} {ex},{ey}" fill="none" stroke="{colour}" '
            f'stroke-width="{width}"{dash} opacity="0.95" marker-end="url(#{_marker_id(colour)})"/>')


def _external_legs(graph, pos, shown: Sequence[Hop], centres, group_of) -> list[tuple[Hop, tuple, tuple]]:
    """(hop, from, to): an outside client's packet reaching a node's from-netdev, or a node's to-netdev
    sending one to the client (the client has no hooks, so nothing else would show these legs)."""
    clients = {d["ip"]: f"{e}/eth0" for e, d in graph.nodes(data=True)
               if d.get("kind") == "external" and f"{e}/eth0" in pos}
    legs, seen = [], set()
    for hop in shown:
        ev = hop.flow.event if hop.flow is not None else None
        number = group_of.get(hop.index)
        if ev is None or number not in centres or ev.inner.proto or number in seen:
            continue
        if hop.hook == "from-netdev" and (client := clients.get(ipv4(ev.before.saddr))):
            legs.append((hop, pos[client], centres[number]))
            seen.add(number)
        elif hop.hook == "to-netdev" and hop.verdict != "DROPPED" and (client := clients.get(ipv4(ev.after.daddr))):
            legs.append((hop, centres[number], pos[client]))
            seen.add(number)
    return legs
