"""A lab described as pure data: nodes, pods, the external client, addresses.

Nothing here touches the kernel; :class:`labkit.lab.Lab` turns a
:class:`Topology` into namespaces. The naming and addressing rules live here
and only here:

=====================  ===============================================  ==================
thing                  rule                                             default lab
=====================  ===============================================  ==================
network namespace      ``lk-<lab>-<name>``                              ``lk-demo-a1``
fabric (the underlay)  namespace ``lk-<lab>-fabric``, bridge ``fabric``
node uplink            ``eth0`` in the node, ``<node>`` on the fabric   ``node-a``
pod uplink             ``eth0`` in the pod, ``lxc-<pod>`` on its node   ``lxc-a1``
node address           underlay host, from the node's position          198.51.100.11
pod CIDR               one /24 per node from 198.18.0.0/15              198.18.1.0/24
router (gateway) IP    first host of the pod CIDR, on ``cilium_host``   198.18.1.1
pod address            pod CIDR host ``10 + <index on its node>``       198.18.1.11
pod labels             ``{"app": <pod name>}`` unless given             ``app=a1``
external client        ``ext``, underlay host .100                      198.51.100.100
=====================  ===============================================  ==================

A pod's security identity stands for its *labels*: the agent allocates it
(:mod:`labkit.agent.identities`, Cilium's rule: pods with equal labels share one
number, cluster identities from 256). :meth:`Topology.build` numbers pods from 256
in declaration order, which is what that allocator gives pods whose labels all
differ (the default labels do); the agent's allocation replaces it when a lab is built.

Addresses come only from ranges reserved for documentation and benchmarking
(RFC 5737, RFC 2544), never from 10/8, 172.16/12 or 192.168/16. Interface names
are checked against the kernel's 15-character limit when the topology is built.

Example::

    >>> topo = Topology.default("demo")
    >>> topo.pod("a1").ip, topo.netns("a1"), topo.host_veth("a1")
    ('198.18.1.11', 'lk-demo-a1', 'lxc-a1')
    >>> [p.name for p in topo.pods_on("node-b")]
    ['b1', 'b2']
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from labkit.constants import Hook
from labkit.errors import NotFoundError, TopologyError

__all__ = [
    "Node",
    "Pod",
    "External",
    "Topology",
    "default_labels",
    "LAB_NAME",
    "LAB_KEY",
    "UNDERLAY",
    "POD_SUPERNET",
    "CLUSTERIP_RANGE",
    "LB_RANGE",
    "LOOPBACK_SNAT_ADDR",
    "IFNAMSIZ",
    "DEVICE_HOOKS",
]

IFNAMSIZ = 15  # longest interface name the kernel accepts (16 bytes with NUL)
UNDERLAY = ipaddress.ip_network("198.51.100.0/24")  # RFC 5737 TEST-NET-2
POD_SUPERNET = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking
CLUSTERIP_RANGE = ipaddress.ip_network("198.19.0.0/16")
LB_RANGE = ipaddress.ip_network("203.0.113.0/24")  # RFC 5737 TEST-NET-3
LOOPBACK_SNAT_ADDR = "169.254.42.1"  # Cilium's --ipv4-service-loopback-address
_PRIVATE = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]
_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
#: What a lab may be called (it prefixes namespaces and device names, so it stays short).
LAB_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")
#: What names a lab to the kernel: its name, then ``_u<uid>`` for a lab that another user than root owns
#: (:mod:`labkit.door.owners`), so two users' labs called ``demo`` never share a namespace or a pin.
LAB_KEY = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}(_u[1-9][0-9]{0,9})?$")
_RESERVED_NAMES = {"fabric"}

#: The tc hooks on each kind of device, (ingress, egress), in Cilium's program names; ``lxc`` stands
#: for every ``lxc-<pod>``. The datapath attaches by it, the graph and the path view draw it.
DEVICE_HOOKS: dict[str, tuple[str, str]] = {
    "lxc": (Hook.FROM_CONTAINER.label, Hook.TO_CONTAINER.label),
    "eth0": (Hook.FROM_NETDEV.label, Hook.TO_NETDEV.label),
    "cilium_vxlan": (Hook.FROM_OVERLAY.label, Hook.TO_OVERLAY.label),
}


@dataclass(frozen=True)
class Node:
    """A Kubernetes-like node: one namespace with an uplink on the fabric."""

    name: str
    ip: str  #: underlay address of eth0
    pod_cidr: str  #: the /24 its pods take addresses from
    node_id: int  #: small number carried in trace events (1-based)

    @property
    def router_ip(self) -> str:
        """The pods' gateway: first host of the pod CIDR (Cilium's cilium_host address)."""
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))


@dataclass(frozen=True)
class Pod:
    """A pod: one namespace whose eth0 is a veth to its node."""

    name: str
    node: str
    ip: str
    identity: int  #: security identity of its labels (the agent's allocator: cluster-local from 256)
    #: Kubernetes labels (``{"app": "web"}``); None in a constructor call means ``{"app": <name>}``
    labels: dict = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.labels is None:
            object.__setattr__(self, "labels", default_labels(self.name))
        _check_labels(self.name, self.labels)


def default_labels(pod: str) -> dict[str, str]:
    """The labels a pod gets when none are given: ``app`` is its name, so every pod of a
    default lab has its own identity (as a Deployment per pod would).

    >>> default_labels("a1")
    {'app': 'a1'}
    """
    return {"app": pod}


_LABEL_KEY = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$")


def _check_labels(pod: str, labels) -> None:
    """Kubernetes label syntax: ``[prefix/]name`` keys, values of at most 63 characters."""
    if not isinstance(labels, dict):
        raise TopologyError(f"pod '{pod}': labels: expected a mapping of strings, got {type(labels).__name__}")
    for k, v in labels.items():
        if not isinstance(k, str) or not _LABEL_KEY.fullmatch(k):
            raise TopologyError(f"pod '{pod}': label key {k!r}: expected [prefix/]name of letters, digits, '-', "
                                f"'_' and '.', at most 63 characters")
        if not isinstance(v, str) or not _LABEL_VALUE.fullmatch(v):
            raise TopologyError(f"pod '{pod}': label {k}={v!r}: expected a value of letters, digits, '-', '_' "
                                f"and '.', at most 63 characters")


@dataclass(frozen=True)
class External:
    """A client outside the cluster, on the underlay only (no datapath)."""

    name: str
    ip: str


@dataclass(frozen=True)
class Topology:
    """The whole lab as data. Build with :meth:`default` or :meth:`build`."""

    lab: str
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...]
    externals: tuple[External, ...] = field(default_factory=tuple)
    underlay: str = str(UNDERLAY)

    # -- construction -----------------------------------------------------
    @classmethod
    def default(cls, lab: str = "demo", labels: Mapping[str, Mapping[str, str]] | None = None) -> "Topology":
        """The default lab of DESIGN §4: node-a (a1, a2), node-b (b1, b2) and ext; ``labels`` as in :meth:`build`.

        >>> len(Topology.default().pods), Topology.default(labels={"a2": {"app": "a1"}}).pod("a2").labels
        (4, {'app': 'a1'})
        """
        return cls.build(lab, {"node-a": ["a1", "a2"], "node-b": ["b1", "b2"]}, externals=["ext"], labels=labels)

    @classmethod
    def build(
        cls,
        lab: str,
        nodes: dict[str, list[str]],
        externals: Iterable[str] = ("ext",),
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> "Topology":
        """Lay out addresses for ``{node: [pods]}`` by the rules of this module; ``labels``
        gives some pods their labels (``{pod: {key: value}}``; the others get ``app=<name>``).

        >>> t = Topology.build("t", {"n1": ["p1", "p2"]}, labels={"p2": {"app": "web", "tier": "front"}})
        >>> t.pod("p1").ip, t.pod("p1").labels, t.pod("p2").labels
        ('198.18.1.11', {'app': 'p1'}, {'app': 'web', 'tier': 'front'})
        """
        labels = dict(labels or {})
        unknown = sorted(set(labels) - {p for pods in nodes.values() for p in pods})
        if unknown:
            raise TopologyError(f"lab '{lab}': labels given for {', '.join(unknown)}, which are not pods of it")
        node_objs, pod_objs = [], []
        identity = 256
        for i, (node_name, pod_names) in enumerate(nodes.items(), start=1):
            if i > 88:
                raise TopologyError(f"lab '{lab}': at most 88 nodes fit the underlay, got {len(nodes)}")
            cidr = ipaddress.ip_network(f"198.18.{i}.0/24")
            node_objs.append(Node(node_name, str(UNDERLAY[10 + i]), str(cidr), i))
            for j, pod_name in enumerate(pod_names, start=1):
                if j > 240:
                    raise TopologyError(f"node '{node_name}': at most 240 pods, got {len(pod_names)}")
                pod_objs.append(Pod(pod_name, node_name, str(cidr[10 + j]), identity,
                                    dict(labels[pod_name]) if pod_name in labels else None))
                identity += 1
        ext_objs = [External(name, str(UNDERLAY[100 + k])) for k, name in enumerate(externals)]
        topo = cls(lab, tuple(node_objs), tuple(pod_objs), tuple(ext_objs))
        topo.validate()
        return topo

    # -- lookups ----------------------------------------------------------
    def node(self, name: str) -> Node:
        """The node called ``name``; :class:`NotFoundError` lists the nodes otherwise."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise NotFoundError(
            f"node '{name}' not found in lab '{self.lab}' (nodes: {', '.join(n.name for n in self.nodes)})"
        )

    def pod(self, name: str) -> Pod:
        """The pod called ``name``; :class:`NotFoundError` lists the pods otherwise."""
        for p in self.pods:
            if p.name == name:
                return p
        raise NotFoundError(
            f"pod '{name}' not found in lab '{self.lab}' (pods: {', '.join(p.name for p in self.pods)})"
        )

    def external(self, name: str) -> External:
        """The external client called ``name``."""
        for e in self.externals:
            if e.name == name:
                return e
        raise NotFoundError(
            f"external client '{name}' not found in lab '{self.lab}' "
            f"(externals: {', '.join(e.name for e in self.externals) or 'none'})"
        )

    def pods_on(self, node: str) -> list[Pod]:
        """Pods scheduled on ``node``, in declaration order."""
        self.node(node)
        return [p for p in self.pods if p.node == node]

    def kind_of(self, name: str) -> str:
        """``'node'``, ``'pod'`` or ``'external'`` for any name in the lab."""
        if any(n.name == name for n in self.nodes):
            return "node"
        if any(p.name == name for p in self.pods):
            return "pod"
        if any(e.name == name for e in self.externals):
            return "external"
        raise NotFoundError(
            f"'{name}' is not a node, pod or external client of lab '{self.lab}' "
            f"(names: {', '.join(self.names())})"
        )

    def names(self) -> list[str]:
        """Every node, pod and external name."""
        return [n.name for n in self.nodes] + [p.name for p in self.pods] + [e.name for e in self.externals]

    def owner_of(self, ip: str) -> str | None:
        """Name of the pod, node or external client holding ``ip``, if any."""
        for p in self.pods:
            if p.ip == ip:
                return p.name
        for n in self.nodes:
            if n.ip == ip:
                return n.name
        for e in self.externals:
            if e.ip == ip:
                return e.name
        return None

    # -- naming rules -----------------------------------------------------
    def netns(self, name: str) -> str:
        """Network namespace of a node, pod, external client or ``'fabric'``."""
        if name != "fabric":
            self.kind_of(name)
        return f"lk-{self.lab}-{name}"

    def all_netns(self) -> list[str]:
        """Every namespace this topology creates, fabric first."""
        return [self.netns("fabric")] + [self.netns(n) for n in self.names()]

    @staticmethod
    def host_veth(pod: str) -> str:
        """Host-side veth of a pod, where bpf_lxc runs."""
        return f"lxc-{pod}"

    @staticmethod
    def fabric_port(name: str) -> str:
        """Fabric-side veth of a node or external client."""
        return name

    # -- validation -------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`TopologyError` for anything the kernel or the lab would reject later."""
        if not LAB_KEY.fullmatch(self.lab):
            raise TopologyError(
                f"lab name '{self.lab}': expected 1-24 characters of a-z, 0-9 and '-', starting with a letter or digit"
                f" (and labkitd's owner part, '_u<uid>')"
            )
        seen: set[str] = set()
        for name in self.names():
            if name in seen:
                raise TopologyError(f"name '{name}' is used twice in lab '{self.lab}'; names must be unique")
            seen.add(name)
            if not _NAME.fullmatch(name) or name in _RESERVED_NAMES:
                raise TopologyError(
                    f"name '{name}': expected lower-case letters, digits and '-', starting with a letter, "
                    f"and not one of {sorted(_RESERVED_NAMES)}"
                )
        for n in list(self.nodes) + list(self.externals):
            self._check_ifname(self.fabric_port(n.name), n.name)
        for p in self.pods:
            self._check_ifname(self.host_veth(p.name), p.name)
        underlay = ipaddress.ip_network(self.underlay)
        _check_reserved(underlay, "underlay")
        cidrs: list[tuple[str, ipaddress.IPv4Network]] = [("underlay", underlay)]
        for n in self.nodes:
            ip = ipaddress.ip_address(n.ip)
            if ip not in underlay:
                raise TopologyError(f"node '{n.name}': address {n.ip} is outside the underlay {underlay}")
            try:
                cidr = ipaddress.ip_network(n.pod_cidr)
            except ValueError as exc:
                raise TopologyError(f"node '{n.name}': pod CIDR {n.pod_cidr!r} is not a network ({exc})") from None
            _check_reserved(cidr, f"node '{n.name}' pod CIDR")
            cidrs.append((f"node '{n.name}' pod CIDR", cidr))
        for kind, reserved in (("the ClusterIP range", CLUSTERIP_RANGE), ("the LoadBalancer range", LB_RANGE)):
            cidrs.append((kind, reserved))
        for i, (a_name, a) in enumerate(cidrs):
            for b_name, b in cidrs[i + 1 :]:
                if a.overlaps(b):
                    raise TopologyError(f"{a_name} {a} overlaps {b_name} {b}; expected disjoint CIDRs")
        addrs: dict[str, str] = {}
        node_names = {n.name for n in self.nodes}
        for p in self.pods:
            if p.node not in node_names:
                raise TopologyError(f"pod '{p.name}': node '{p.node}' is not in lab '{self.lab}' (nodes: {', '.join(sorted(node_names))})")
            node = self.node(p.node)
            if ipaddress.ip_address(p.ip) not in ipaddress.ip_network(node.pod_cidr):
                raise TopologyError(f"pod '{p.name}': address {p.ip} is outside node '{node.name}' CIDR {node.pod_cidr}")
            if p.ip == node.router_ip:
                raise TopologyError(f"pod '{p.name}': address {p.ip} is node '{node.name}' router address")
        for e in self.externals:
            if ipaddress.ip_address(e.ip) not in underlay:
                raise TopologyError(f"external client '{e.name}': address {e.ip} is outside the underlay {underlay}")
        for obj in list(self.nodes) + list(self.pods) + list(self.externals):
            if obj.ip in addrs:
                raise TopologyError(f"'{obj.name}' and '{addrs[obj.ip]}' both have address {obj.ip}")
            addrs[obj.ip] = obj.name

    @staticmethod
    def _check_ifname(ifname: str, owner: str) -> None:
        if len(ifname) > IFNAMSIZ:
            raise TopologyError(
                f"'{owner}': interface name '{ifname}' has {len(ifname)} characters; "
                f"the kernel allows at most {IFNAMSIZ} (shorten the name to fit)"
            )

    # -- changes (return new topologies) ------------------------------------
    def with_pod(self, name: str, node: str, labels: Mapping[str, str] | None = None) -> "Topology":
        """A copy with one more pod on ``node``, addressed by the rules above (the next identity
        number: the agent's allocator gives it the identity of its labels)."""
        n = self.node(node)
        taken = {p.ip for p in self.pods}
        cidr = ipaddress.ip_network(n.pod_cidr)
        ip = next((str(cidr[10 + j]) for j in range(1, 241) if str(cidr[10 + j]) not in taken), None)
        if ip is None:
            raise TopologyError(f"node '{node}': no free pod address left in {n.pod_cidr}")
        identity = max([p.identity for p in self.pods], default=255) + 1
        topo = replace(self, pods=self.pods + (Pod(name, node, ip, identity, None if labels is None else dict(labels)),))
        topo.validate()
        return topo

    def with_identities(self, identities: Mapping[str, int]) -> "Topology":
        """A copy whose pods have the identities ``{pod: identity}`` gives (the others keep theirs).

        >>> Topology.default().with_identities({"a1": 300}).pod("a1").identity
        300
        """
        return replace(self, pods=tuple(replace(p, identity=int(identities.get(p.name, p.identity)))
                                        for p in self.pods))

    def without_pod(self, name: str) -> "Topology":
        """A copy without pod ``name``."""
        self.pod(name)
        return replace(self, pods=tuple(p for p in self.pods if p.name != name))

    # -- serialisation ----------------------------------------------------
    def to_dict(self) -> dict:
        """Plain data for the lab state file."""
        return {
            "lab": self.lab,
            "underlay": self.underlay,
            "nodes": [vars(n) for n in self.nodes],
            "pods": [{**vars(p), "labels": dict(p.labels)} for p in self.pods],
            "externals": [vars(e) for e in self.externals],
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Topology":
        """Inverse of :meth:`to_dict`.

        >>> t = Topology.default("x"); Topology.from_dict(t.to_dict()) == t
        True
        """
        topo = cls(
            data["lab"],
            tuple(Node(**n) for n in data["nodes"]),
            tuple(Pod(**p) for p in data["pods"]),
            tuple(External(**e) for e in data.get("externals", [])),
            data.get("underlay", str(UNDERLAY)),
        )
        topo.validate()
        return topo

    def to_networkx(self):
        """The lab as a networkx graph: namespaces and the devices between them.

        Each graph node has ``kind`` (fabric, node, pod, external, device) and
        devices carry ``netns`` and ``hooks`` (the BPF programs on them).
        """
        import networkx as nx

        g = nx.Graph(lab=self.lab)
        g.add_node("fabric", kind="fabric")
        for n in self.nodes:
            g.add_node(n.name, kind="node", ip=n.ip, pod_cidr=n.pod_cidr)
            eth0 = f"{n.name}/eth0"
            g.add_node(eth0, kind="device", netns=self.netns(n.name), hooks=list(DEVICE_HOOKS["eth0"]))
            g.add_edge(n.name, eth0)
            g.add_edge(eth0, "fabric")
        for p in self.pods:
            g.add_node(p.name, kind="pod", ip=p.ip, node=p.node)
            lxc = f"{p.node}/{self.host_veth(p.name)}"
            g.add_node(lxc, kind="device", netns=self.netns(p.node), hooks=list(DEVICE_HOOKS["lxc"]))
            g.add_edge(p.name, lxc)
            g.add_edge(lxc, p.node)
        for e in self.externals:
            g.add_node(e.name, kind="external", ip=e.ip)
            g.add_edge(e.name, "fabric")
        return g


def _check_reserved(net: ipaddress.IPv4Network, what: str) -> None:
    for private in _PRIVATE:
        if net.overlaps(private):
            raise TopologyError(
                f"{what} {net} overlaps private range {private}; labkit uses only documentation and "
                "benchmarking ranges (198.51.100.0/24, 198.18.0.0/15, 203.0.113.0/24)"
            )
