"""The lab's graph and a packet's path through it, as pure data: what the path pictures draw.

This module owns the data both renderers share, and draws nothing (no matplotlib,
no ipywidgets): :mod:`labkit.notebook.svgpath` writes it as SVG text and
:mod:`labkit.notebook.viz` draws it with matplotlib. The import order is
``viz`` → ``svgpath`` → ``pathgraph`` (an import-linter contract in pyproject.toml).

The graph
---------
A lab is a handful of network namespaces wired together. :func:`lab_graph` has
one graph node per namespace and per network device, named as ``ip link`` names it:

* **pods**: one namespace per pod, with its ``eth0``. The pod's ``eth0`` is one
  end of a veth pair; no BPF program runs on it.
* **nodes**: the node's host veths ``lxc-<pod>`` (the other ends of the pods'
  ``eth0``), the node's routing stack (the node's name and address), ``eth0``
  (the uplink to the fabric) and, in tunnel routing mode, ``cilium_vxlan``.
  Devices with BPF programs list their hooks:

  ==================  ===============================================================
  device              hooks (Cilium's program names)
  ==================  ===============================================================
  ``lxc-<pod>``       from-container (tc ingress: packets leaving the pod),
                      to-container (tc egress: packets entering the pod)
  ``eth0``            from-netdev (tc ingress), to-netdev (tc egress)
  ``cilium_vxlan``    from-overlay (ingress, after decapsulation),
                      to-overlay (egress, before encapsulation)
  ==================  ===============================================================

* **fabric**: the bridge that plays the underlay network; every node's ``eth0``
  and every external client's ``eth0`` is a veth to one of its ports.
* **external clients**, e.g. ``ext``.
* **the tunnel** (tunnel mode): an edge between the ``cilium_vxlan`` devices. It
  is logical: encapsulated packets really travel
  ``cilium_vxlan`` → ``eth0`` → fabric → ``eth0`` → ``cilium_vxlan``.

:func:`positions` places it: pods in the top row, nodes left to right under
their pods, the fabric at the bottom, external clients right of it (data units;
:data:`ROW_Y` and :data:`BOX_SIZES` are the rows and the box sizes both
renderers use).

The path
--------
With trace records (:class:`labkit.observe.trace.Flow`), :func:`hops` makes every
record a numbered :class:`Hop` at the device whose hook reported it, with a
one-line summary (including NAT done at the hook, which a wire capture cannot
show) and the colour of its verdict (:data:`VERDICT_COLOURS`: green forwarded,
blue redirected by ``bpf_redirect`` straight to another device, red dropped).

Example::

    >>> from labkit.net.topology import Topology
    >>> g = lab_graph(Topology.default("demo"))
    >>> g.nodes["node-a/lxc-a1"]["hooks"]
    ['from-container', 'to-container']
    >>> sorted(n for n, d in g.nodes(data=True) if d["kind"] == "pod")
    ['a1', 'a2', 'b1', 'b2']
    >>> box_size(g.nodes["node-a/eth0"]), box_size(g.nodes["a1/eth0"])
    ((1.3, 0.58), (0.62, 0.3))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from labkit.addr import ipv4
from labkit.config import ROUTING_MODES
from labkit.constants import DropReason, Hook, TraceFlags, Verdict
from labkit.errors import ConfigError
from labkit.maps.ct import CtDir, CtFlags, CtResult
from labkit.net.topology import DEVICE_HOOKS, Topology
from labkit.observe.trace import Flow

if TYPE_CHECKING:  # pragma: no cover
    import networkx

__all__ = [
    "lab_graph",
    "positions",
    "Hop",
    "hops",
    "ct_lookup",
    "box_size",
    "extent",
    "default_title",
    "VERDICT_COLOURS",
    "UNKNOWN_COLOUR",
    "NS_FILL",
    "NS_EDGE",
    "BOX_SIZES",
    "ROW_Y",
    "MARGIN",
]

#: Colour of a hop badge and of the arrow leaving it, by verdict name.
VERDICT_COLOURS: dict[str, str] = {
    "FORWARDED": "#2e7d32",
    "REDIRECTED": "#1565c0",
    "DROPPED": "#c62828",
}
#: Colour of a hop whose verdict :data:`VERDICT_COLOURS` does not name.
UNKNOWN_COLOUR = "#616161"

# -- layout (data units; one unit is about 0.7 inch at the default size) ------
_POD_PITCH = 1.6  # horizontal distance between pods of a node
_COLUMN_GAP = 1.6  # between the columns of two nodes
#: Left of the first column (where the drawing starts when the graph has no node).
MARGIN = 0.8
_VXLAN_DX = 1.45  # cilium_vxlan beside its node's stack
_EXT_DX = 0.95  # external eth0 right of the fabric's end
_EXT_LABEL_DX = 1.05  # external name right of its eth0
_EXT_PITCH = 1.0  # externals stacked upwards
#: The y of each row of the layout, by what stands in it.
ROW_Y = {
    "pod": 5.95,
    "pod_eth0": 5.3,
    "lxc": 4.2,
    "node": 3.05,
    "vxlan": 2.3,
    "eth0": 1.2,
    "fabric": 0.35,
}
_TOP = 7.0  # nothing is placed above this

#: Box sizes (width, height) by what is drawn: a graph node's kind, or a device's "hooked" or "plain".
BOX_SIZES = {
    "pod": (1.2, 0.5),
    "node": (1.45, 0.62),
    "external": (1.0, 0.5),
    "hooked": (1.3, 0.58),
    "plain": (0.62, 0.3),
}

#: Fill and edge colours of a namespace's box, by the kind of what owns the namespace.
NS_FILL = {"pod": "#edf6ee", "node": "#f1f2f8", "external": "#fbefe4"}
NS_EDGE = {"pod": "#7cb383", "node": "#8e95b8", "external": "#d39b6a"}


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
    x0 = MARGIN
    right = x0
    count = len(nodes)
    for i, name in enumerate(nodes):
        pods = pods_of[name]
        width = max(len(pods), 1) * _POD_PITCH
        cx = x0 + width / 2
        for k, p in enumerate(pods):
            px = x0 + (k + 0.5) * _POD_PITCH
            pos[p] = (px, ROW_Y["pod"])
            if f"{p}/eth0" in graph:
                pos[f"{p}/eth0"] = (px, ROW_Y["pod_eth0"])
            if p in lxc_of:
                pos[lxc_of[p]] = (px, ROW_Y["lxc"])
        pos[name] = (cx, ROW_Y["node"])
        if f"{name}/eth0" in graph:
            pos[f"{name}/eth0"] = (cx, ROW_Y["eth0"])
        if f"{name}/cilium_vxlan" in graph:
            # face the middle of the row, so the tunnel between neighbours runs through the gap
            side = 1 if i < (count - 1) / 2 or count == 1 else -1
            pos[f"{name}/cilium_vxlan"] = (cx + side * _VXLAN_DX, ROW_Y["vxlan"])
        right = x0 + width
        x0 = right + _COLUMN_GAP
    if "fabric" in graph:
        pos["fabric"] = ((MARGIN + right) / 2, ROW_Y["fabric"])
    externals = [e for e, d in graph.nodes(data=True) if d.get("kind") == "external"]
    for k, e in enumerate(externals):
        y = ROW_Y["fabric"] + k * _EXT_PITCH
        pos[f"{e}/eth0"] = (right + _EXT_DX, y)
        pos[e] = (right + _EXT_DX + _EXT_LABEL_DX, y)
    # anything else (graphs built by hand) goes in a row at the very top
    extra = [n for n in graph.nodes if n not in pos]
    for k, n in enumerate(sorted(extra, key=str)):
        pos[n] = (MARGIN + k * _POD_PITCH, _TOP)
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
        return VERDICT_COLOURS.get(self.verdict, UNKNOWN_COLOUR)

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


# -- sizes and extents (what both renderers measure boxes with) -----------------
def box_size(data: dict) -> tuple[float, float]:
    """The (width, height) of a graph node's box, from its attributes (:data:`BOX_SIZES`).

    >>> box_size({"kind": "device", "hooks": ["from-netdev"]}), box_size({"kind": "device", "hooks": []})
    ((1.3, 0.58), (0.62, 0.3))
    >>> box_size({"kind": "node"})
    (1.45, 0.62)
    """
    kind = data.get("kind")
    if kind == "device":
        return BOX_SIZES["hooked"] if data.get("hooks") else BOX_SIZES["plain"]
    return BOX_SIZES.get(kind, BOX_SIZES["plain"])


def extent(pos: dict, graph, ids: Iterable[str]) -> tuple[float, float, float, float]:
    """The box ``(x0, y0, x1, y1)`` that holds the boxes of graph nodes ``ids`` placed at ``pos``.

    >>> from labkit.net.topology import Topology
    >>> g = lab_graph(Topology.default("demo"))
    >>> extent(positions(g), g, ["a1"])
    (1.0, 5.7, 2.2, 6.2)
    """
    xs0, ys0, xs1, ys1 = [], [], [], []
    for gid in ids:
        x, y = pos[gid]
        w, h = box_size(graph.nodes[gid])
        xs0.append(x - w / 2)
        xs1.append(x + w / 2)
        ys0.append(y - h / 2)
        ys1.append(y + h / 2)
    return min(xs0), min(ys0), max(xs1), max(ys1)


def default_title(graph) -> str:
    """The title of a picture of ``graph`` when the caller gives none.

    >>> from labkit.net.topology import Topology
    >>> default_title(lab_graph(Topology.default("demo"), "native"))
    'lab demo · native routing'
    """
    return f"lab {graph.graph.get('lab', '?')} · {graph.graph.get('routing', '?')} routing"

