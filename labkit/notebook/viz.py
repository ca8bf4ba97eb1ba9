"""Pictures of a lab and of the path a packet took through it.

What is drawn
-------------
A lab is a handful of network namespaces wired together. The picture shows
each namespace as a rounded box and each network device as a small box inside
it, named as ``ip link`` names it:

* **pods** (top row): one namespace per pod, with its ``eth0``. The pod's
  ``eth0`` is one end of a veth pair; no BPF program runs on it.
* **nodes** (middle, left to right, each node under its own pods): the node's
  host veths ``lxc-<pod>`` (the other ends of the pods' ``eth0``), the node's
  routing stack (the box with the node's name and address), ``eth0`` (the
  uplink to the fabric) and, in tunnel routing mode, ``cilium_vxlan``. Devices
  with BPF programs are shaded and list their hooks in small text:

  ==================  ===============================================================
  device              hooks (Cilium's program names)
  ==================  ===============================================================
  ``lxc-<pod>``       from-container (tc ingress: packets leaving the pod),
                      to-container (tc egress: packets entering the pod)
  ``eth0``            from-netdev (tc ingress), to-netdev (tc egress)
  ``cilium_vxlan``    from-overlay (ingress, after decapsulation),
                      to-overlay (egress, before encapsulation)
  ==================  ===============================================================

* **fabric** (bottom): the bridge that plays the underlay network; every node's
  ``eth0`` and every external client's ``eth0`` is a veth to one of its ports.
* **external clients** (right of the fabric), e.g. ``ext``.
* **the tunnel** (tunnel mode): a dashed line between the ``cilium_vxlan``
  devices. It is logical: encapsulated packets really travel
  ``cilium_vxlan`` → ``eth0`` → fabric → ``eth0`` → ``cilium_vxlan``.

With trace records (:class:`labkit.observe.trace.Flow`) the path is overlaid: every
record is a *hop*, numbered in time order, its number drawn in a badge at the
device whose hook reported it, and an arrow runs from each hop to the next
one on a different device. Colours say what the hook did: green forwarded,
blue redirected (``bpf_redirect`` straight to another device), red dropped.

Functions, from data to pictures:

* :func:`lab_graph` / :func:`positions`: the wiring as a networkx graph, and a
  fixed (not random) layout of it;
* :func:`hops`: trace records as numbered :class:`Hop` rows with a one-line
  summary each (including NAT done at the hook, which a wire capture cannot
  show);
* :func:`draw` (a matplotlib Figure, Agg backend), :func:`svg` (byte-identical
  SVG text for identical input) and :func:`path_html` (SVG plus the hop list);
* :class:`PathExplorer`: a slider/play widget that steps through the hops.

Example::

    >>> from labkit.net.topology import Topology
    >>> g = lab_graph(Topology.default("demo"))
    >>> g.nodes["node-a/lxc-a1"]["hooks"]
    ['from-container', 'to-container']
    >>> sorted(n for n, d in g.nodes(data=True) if d["kind"] == "pod")
    ['a1', 'a2', 'b1', 'b2']
"""
from __future__ import annotations

import html
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from labkit.addr import ipv4
from labkit.config import ROUTING_MODES, VXLAN_PORT
from labkit.constants import DropReason, Hook, TraceFlags, Verdict
from labkit.errors import ConfigError
from labkit.maps.ct import CtDir, CtFlags, CtResult
from labkit.net.topology import DEVICE_HOOKS, Topology
from labkit.observe.trace import Flow

# A venv that also sees the distribution's matplotlib imports its mpl_toolkits and warns that
# Axes3D cannot load; labkit draws no 3D axes, so that warning would only confuse a learner.
warnings.filterwarnings("ignore", message="Unable to import Axes3D")

if TYPE_CHECKING:  # pragma: no cover
    import networkx
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

#: Colour of a hop badge and of the arrow leaving it, by verdict name.
VERDICT_COLOURS: dict[str, str] = {
    "FORWARDED": "#2e7d32",
    "REDIRECTED": "#1565c0",
    "DROPPED": "#c62828",
}
_UNKNOWN_COLOUR = "#616161"

# -- layout (data units; one unit is about 0.7 inch at the default size) ------
_POD_PITCH = 1.6  # horizontal distance between pods of a node
_COLUMN_GAP = 1.6  # between the columns of two nodes
_MARGIN = 0.8  # left of the first column
_VXLAN_DX = 1.45  # cilium_vxlan beside its node's stack
_EXT_DX = 0.95  # external eth0 right of the fabric's end
_EXT_LABEL_DX = 1.05  # external name right of its eth0
_EXT_PITCH = 1.0  # externals stacked upwards
_Y = {
    "pod": 5.95,
    "pod_eth0": 5.3,
    "lxc": 4.2,
    "node": 3.05,
    "vxlan": 2.3,
    "eth0": 1.2,
    "fabric": 0.35,
}
_TOP = 7.0  # nothing is placed above this

# box sizes (width, height) by what is drawn
_SIZE = {
    "pod": (1.2, 0.5),
    "node": (1.45, 0.62),
    "external": (1.0, 0.5),
    "hooked": (1.3, 0.58),
    "plain": (0.62, 0.3),
}

_NS_FILL = {"pod": "#edf6ee", "node": "#f1f2f8", "external": "#fbefe4"}
_NS_EDGE = {"pod": "#7cb383", "node": "#8e95b8", "external": "#d39b6a"}


def _check_routing(routing: str) -> None:
    if routing not in ROUTING_MODES:
        raise ConfigError(f"routing mode: expected one of {', '.join(ROUTING_MODES)}, got {routing!r}")


# -- the graph ---------------------------------------------------------------
def lab_graph(topology: Topology, routing: str = "tunnel") -> "networkx.Graph":
    """The lab's namespaces and devices as a networkx graph, wired as the lab is.

    Graph node ids are strings: pods (``"a1"``), pod devices (``"a1/eth0"``),
    host veths (``"node-a/lxc-a1"``), node stacks (``"node-a"``), node devices
    (``"node-a/eth0"``, ``"node-a/cilium_vxlan"`` in tunnel mode only),
    ``"fabric"`` and external clients (``"ext"``, ``"ext/eth0"``). A device id
    is ``"<namespace owner>/<ifname>"``, so the id of a trace record's device is
    ``f"{flow.node}/{flow.device}"``.

    Attributes of every graph node: ``kind`` (pod, node, device, fabric,
    external), ``label``, ``netns`` and ``hooks`` (hook labels of the BPF
    programs on it; empty except on hooked devices). Devices also carry
    ``ifname`` and ``owner``; host veths ``pod``; pods ``node`` and ``ip``.
    Edges have ``kind``: ``netns`` (a device inside a namespace), ``veth`` (the
    two ends of a veth pair, or a veth and the fabric bridge) or ``tunnel``
    (the logical VXLAN link between two nodes' ``cilium_vxlan``, drawn dashed).

    >>> g = lab_graph(Topology.default("demo"), routing="native")
    >>> g.nodes["node-a/eth0"]["hooks"], g.nodes["a1/eth0"]["hooks"]
    (['from-netdev', 'to-netdev'], [])
    >>> "node-a/cilium_vxlan" in g
    False
    >>> lab_graph(Topology.default("demo")).edges["node-a/cilium_vxlan", "node-b/cilium_vxlan"]["kind"]
    'tunnel'
    """
    import networkx as nx

    _check_routing(routing)
    tunnel = routing == "tunnel"
    g = nx.Graph(lab=topology.lab, routing=routing)

    def device(owner: str, ifname: str, hooks: list[str], **attrs) -> str:
        gid = f"{owner}/{ifname}"
        g.add_node(gid, kind="device", label=ifname, ifname=ifname, owner=owner, netns=topology.netns(owner),
                   hooks=list(hooks), **attrs)
        g.add_edge(owner, gid, kind="netns")
        return gid

    for n in topology.nodes:
        g.add_node(n.name, kind="node", label=n.name, netns=topology.netns(n.name), hooks=[], ip=n.ip,
                   pod_cidr=n.pod_cidr)
        for p in topology.pods_on(n.name):
            g.add_node(p.name, kind="pod", label=p.name, netns=topology.netns(p.name), hooks=[], ip=p.ip,
                       node=n.name)
            pod_eth0 = device(p.name, "eth0", [])
            lxc = device(n.name, topology.host_veth(p.name), DEVICE_HOOKS["lxc"], pod=p.name)
            g.add_edge(pod_eth0, lxc, kind="veth")
        device(n.name, "eth0", DEVICE_HOOKS["eth0"], port=topology.fabric_port(n.name))
        if tunnel:
            device(n.name, "cilium_vxlan", DEVICE_HOOKS["cilium_vxlan"])
    g.add_node("fabric", kind="fabric", label="fabric", netns=topology.netns("fabric"), hooks=[], ifname="fabric",
               subnet=topology.underlay)
    for n in topology.nodes:
        g.add_edge(f"{n.name}/eth0", "fabric", kind="veth")
    for e in topology.externals:
        g.add_node(e.name, kind="external", label=e.name, netns=topology.netns(e.name), hooks=[], ip=e.ip)
        eth0 = device(e.name, "eth0", [], port=topology.fabric_port(e.name))
        g.add_edge(eth0, "fabric", kind="veth")
    if tunnel:
        names = [n.name for n in topology.nodes]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                g.add_edge(f"{a}/cilium_vxlan", f"{b}/cilium_vxlan", kind="tunnel")
    return g


def positions(graph: "networkx.Graph") -> dict[str, tuple[float, float]]:
    """A fixed layout of :func:`lab_graph`: the same graph always gets the same positions.

    Nodes stand left to right in the order of the topology, each node's pods
    in a row above it (pod, its ``eth0``, then the host veth on the node); the
    node's stack sits under its pods, ``eth0`` under the stack and
    ``cilium_vxlan`` beside it, on the side facing the other nodes. The fabric
    is at the bottom, centred under the nodes, and external clients stand
    right of it. All coordinates are non-negative; y is at most 7.

    >>> pos = positions(lab_graph(Topology.default("demo")))
    >>> pos["a1"][1] > pos["node-a/lxc-a1"][1] > pos["node-a"][1] > pos["node-a/eth0"][1] > pos["fabric"][1]
    True
    >>> pos["node-a"][0] < pos["node-b"][0] < pos["ext"][0]
    True
    """
    nodes = [n for n, d in graph.nodes(data=True) if d.get("kind") == "node"]
    pods_of: dict[str, list[str]] = {n: [] for n in nodes}
    for p, d in graph.nodes(data=True):
        if d.get("kind") == "pod" and d.get("node") in pods_of:
            pods_of[d["node"]].append(p)
    lxc_of = {d["pod"]: gid for gid, d in graph.nodes(data=True) if d.get("kind") == "device" and "pod" in d}

    pos: dict[str, tuple[float, float]] = {}
    x0 = _MARGIN
    right = x0
    count = len(nodes)
    for i, name in enumerate(nodes):
        pods = pods_of[name]
        width = max(len(pods), 1) * _POD_PITCH
        cx = x0 + width / 2
        for k, p in enumerate(pods):
            px = x0 + (k + 0.5) * _POD_PITCH
            pos[p] = (px, _Y["pod"])
            if f"{p}/eth0" in graph:
                pos[f"{p}/eth0"] = (px, _Y["pod_eth0"])
            if p in lxc_of:
                pos[lxc_of[p]] = (px, _Y["lxc"])
        pos[name] = (cx, _Y["node"])
        if f"{name}/eth0" in graph:
            pos[f"{name}/eth0"] = (cx, _Y["eth0"])
        if f"{name}/cilium_vxlan" in graph:
            # face the middle of the row, so the tunnel between neighbours runs through the gap
            side = 1 if i < (count - 1) / 2 or count == 1 else -1
            pos[f"{name}/cilium_vxlan"] = (cx + side * _VXLAN_DX, _Y["vxlan"])
        right = x0 + width
        x0 = right + _COLUMN_GAP
    if "fabric" in graph:
        pos["fabric"] = ((_MARGIN + right) / 2, _Y["fabric"])
    externals = [e for e, d in graph.nodes(data=True) if d.get("kind") == "external"]
    for k, e in enumerate(externals):
        y = _Y["fabric"] + k * _EXT_PITCH
        pos[f"{e}/eth0"] = (right + _EXT_DX, y)
        pos[e] = (right + _EXT_DX + _EXT_LABEL_DX, y)
    # anything else (graphs built by hand) goes in a row at the very top
    extra = [n for n in graph.nodes if n not in pos]
    for k, n in enumerate(sorted(extra, key=str)):
        pos[n] = (_MARGIN + k * _POD_PITCH, _TOP)
    return {n: (round(x, 4), round(y, 4)) for n, (x, y) in pos.items()}


# -- hops --------------------------------------------------------------------
@dataclass(frozen=True)
class Hop:
    """One trace record on the path: where it was reported and what the hook saw and did.

    ``index`` counts from 1 in time order; ``id`` is the graph id of the
    device (``"node-a/lxc-a1"``); ``hook`` is the hook label
    (``"from-container"``) and ``verdict`` the verdict name (``"FORWARDED"``,
    ``"REDIRECTED"``, ``"DROPPED"``). ``summary`` reads like the tail of a
    Hubble line: the packet as it reached the hook, ``=> packet`` when the hook
    rewrote it (NAT), its trace tags (``[snat]``, ``[dsr-opt-added]``), the CT
    lookup, ``→ tunnel <ip>`` and the drop reason.

    >>> Hop(1, "node-a", "eth0", "node-a/eth0", "to-netdev", "FORWARDED", "...").text()
    '1. node-a eth0 to-netdev FORWARDED: ...'
    """

    index: int
    node: str
    device: str
    id: str
    hook: str
    verdict: str
    summary: str
    ts_ns: int = 0
    flow: "Flow | None" = field(default=None, repr=False, compare=False)

    @property
    def colour(self) -> str:
        """The colour of this hop's verdict (:data:`VERDICT_COLOURS`)."""
        return VERDICT_COLOURS.get(self.verdict, _UNKNOWN_COLOUR)

    def text(self) -> str:
        """``index. node device hook VERDICT: summary`` on one line."""
        return f"{self.index}. {self.node} {self.device} {self.hook} {self.verdict}: {self.summary}"


def _hook_label(value: int) -> str:
    try:
        return Hook(value).label
    except ValueError:
        return f"hook#{value}"


def _verdict_name(value: int) -> str:
    try:
        return Verdict(value).name
    except ValueError:
        return f"VERDICT#{value}"


def ct_lookup(ev) -> str:
    """A trace record's CT lookup as ``result/direction``; the raw number for one the enums lack.

    >>> from types import SimpleNamespace
    >>> ct_lookup(SimpleNamespace(ct_result=CtResult.NEW, ct_dir=CtDir.EGRESS))
    'new/egress'
    >>> ct_lookup(SimpleNamespace(ct_result=99, ct_dir=CtDir.EGRESS))
    '99/egress'
    """
    try:
        result = CtResult(ev.ct_result).name.lower()
    except ValueError:
        result = str(ev.ct_result)
    try:
        direction = CtDir(ev.ct_dir).name.lower()
    except ValueError:
        direction = str(ev.ct_dir)
    return f"{result}/{direction}"


def _summary(flow: "Flow", topology: Topology | None) -> str:
    ev = flow.event
    packet = ev.before.text()
    if ev.before.key() != ev.after.key():
        packet += f" => {ev.after.text()}"
    if ev.inner.proto:
        packet += f" [vxlan: {ev.inner.text()}]"
    packet += "".join(f" [{name}]" for name in TraceFlags.names(ev.flags))  # what the hook did besides NAT
    parts = [packet]
    if ev.ct_result != CtResult.NONE:
        parts.append(f"ct={ct_lookup(ev)} flags=[{' '.join(CtFlags.names(ev.ct_flags))}]")
    if ev.verdict == Verdict.DROPPED:
        parts.append(f"dropped: {DropReason.text(ev.drop_reason)}")
    elif ev.tunnel_endpoint and ev.hook in (Hook.FROM_CONTAINER, Hook.TO_OVERLAY):
        endpoint = ipv4(ev.tunnel_endpoint)
        owner = topology.owner_of(endpoint) if topology is not None else None
        parts.append(f"→ tunnel {endpoint}" + (f" ({owner})" if owner else ""))
    return "; ".join(parts)


def hops(flows: Iterable["Flow"], topology: Topology | None = None) -> list[Hop]:
    """Trace records as numbered hops, in time order (``flow.event.ts_ns``; ties keep input order).

    ``topology`` names the node behind a tunnel endpoint (``→ tunnel
    198.51.100.12 (node-b)``); without it only the address is shown.

    >>> import socket
    >>> from labkit.addr import be32
    >>> from labkit.observe.trace import Flow, TraceEvent, TraceTuple
    >>> ping = TraceTuple(be32("198.18.1.11"), be32("198.18.2.11"), socket.htons(7), 0, 1, 0, 8, 0)
    >>> ev = TraceEvent(ts_ns=1, node_id=1, hook=1, verdict=2, ct_result=0, ct_dir=0,
    ...                 tunnel_endpoint=be32("198.51.100.12"), before=ping, after=ping)
    >>> [hop] = hops([Flow(ev, "node-a", "lxc-a1")], Topology.default())
    >>> hop.index, hop.id, hop.hook, hop.verdict
    (1, 'node-a/lxc-a1', 'from-container', 'REDIRECTED')
    >>> hop.summary
    '198.18.1.11 -> 198.18.2.11 ICMP EchoRequest id 7; ct=new/egress flags=[]; → tunnel 198.51.100.12 (node-b)'
    """
    ordered = sorted(flows, key=lambda f: f.event.ts_ns)
    return [
        Hop(
            index=i,
            node=f.node,
            device=f.device,
            id=f"{f.node}/{f.device}",
            hook=_hook_label(f.event.hook),
            verdict=_verdict_name(f.event.verdict),
            summary=_summary(f, topology),
            ts_ns=int(f.event.ts_ns),
            flow=f,
        )
        for i, f in enumerate(ordered, start=1)
    ]


# -- drawing -----------------------------------------------------------------
def _box_size(data: dict) -> tuple[float, float]:
    kind = data.get("kind")
    if kind == "device":
        return _SIZE["hooked"] if data.get("hooks") else _SIZE["plain"]
    return _SIZE.get(kind, _SIZE["plain"])


def _extent(pos: dict, graph, ids: Iterable[str]) -> tuple[float, float, float, float]:
    xs0, ys0, xs1, ys1 = [], [], [], []
    for gid in ids:
        x, y = pos[gid]
        w, h = _box_size(graph.nodes[gid])
        xs0.append(x - w / 2)
        xs1.append(x + w / 2)
        ys0.append(y - h / 2)
        ys1.append(y + h / 2)
    return min(xs0), min(ys0), max(xs1), max(ys1)


def _default_title(graph) -> str:
    return f"lab {graph.graph.get('lab', '?')} · {graph.graph.get('routing', '?')} routing"


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
        x0, y0, x1, y1 = _extent(pos, graph, ids)
        owner = next(i for i in ids if graph.nodes[i]["kind"] != "device") if any(
            graph.nodes[i]["kind"] != "device" for i in ids) else ids[0]
        kind = graph.nodes[owner]["kind"]
        # room at the top: for the namespace's name, or (nodes) for hop badges above the host veths
        ns_boxes[netns] = (x0 - 0.12, y0 - 0.1, x1 + 0.12, y1 + (0.3 if kind == "node" else 0.22), kind)
    node_boxes = [b for b in ns_boxes.values() if b[4] in ("node", "pod")]
    fab_x0 = min((b[0] for b in node_boxes), default=_MARGIN - 0.2)
    fab_x1 = max((b[2] for b in node_boxes), default=_MARGIN + 1.0)
    fy = pos["fabric"][1] if "fabric" in pos else _Y["fabric"]
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
    ax.set_title(title if title is not None else _default_title(graph), fontsize=11)

    # -- namespaces --------------------------------------------------------
    for netns, (x0, y0, x1, y1, kind) in sorted(ns_boxes.items()):
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0,rounding_size=0.12",
                                    facecolor=_NS_FILL.get(kind, "#f5f5f5"), edgecolor=_NS_EDGE.get(kind, "#999"),
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
            w, h = _SIZE["node"]
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
            w, h = _box_size(d)
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
        w, h = _box_size(graph.nodes[gid]) if gid in graph else _SIZE["plain"]
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
    from labkit.notebook import svgpath

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
    from labkit.notebook import svgpath

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
