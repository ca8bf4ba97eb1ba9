"""What a Service is, and what makes one valid: backends, frontends, types, policies, ranges.

Every check here runs before any map or table is touched; its ConfigError names the
service and what was expected.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from labkit.errors import ConfigError, NotFoundError
from labkit.net.topology import CLUSTERIP_RANGE, LB_RANGE, Topology

if TYPE_CHECKING:
    from labkit.maps.lb import ServiceFlags

__all__ = ["Backend", "Frontend", "Service", "FIRST_VIP", "FIRST_LB_VIP", "NODE_PORT_RANGE", "SURROGATE", "SERVICE_TYPES",
           "STATES", "TRAFFIC_POLICIES", "ALGORITHMS", "PROTOCOLS", "MAX_AFFINITY", "MAX_SERVICE_ID",
           "MAX_BACKEND_ID", "STATE_VERSION", "check_address_in", "check_affinity", "check_choice",
           "check_lb_vip", "check_name", "check_node_port", "check_port", "check_protocol", "check_state",
           "check_type", "check_vip"]


#: Where automatic VIPs start (the low ten addresses are left for hand-picked ones).
FIRST_VIP = ipaddress.IPv4Address("198.19.0.10")
#: Where automatic LoadBalancer VIPs start, in the LoadBalancer range.
FIRST_LB_VIP = ipaddress.IPv4Address("203.0.113.10")
#: The address of a NodePort's surrogate frontend (IPv4Unspecified).
SURROGATE = "0.0.0.0"
#: Kubernetes' default --service-node-port-range.
NODE_PORT_RANGE = range(30000, 32768)
#: Service types the agent can add; each adds frontends to the one before it.
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
#: Backend states a service can give a backend.
STATES = ("active", "terminating")
#: externalTrafficPolicy: every backend, or only the backends on the node the client reached.
TRAFFIC_POLICIES = ("Cluster", "Local")
#: How a new flow picks its backend: Cilium's random slot, or the service's Maglev table.
ALGORITHMS = ("random", "maglev")
PROTOCOLS = ("TCP", "UDP")
MAX_AFFINITY = 86400  # Kubernetes' limit for sessionAffinityConfig.clientIP.timeoutSeconds
MAX_SERVICE_ID = 0xFFFF  # rev_nat_index is a __u16
MAX_BACKEND_ID = 0xFFFFFFFF
STATE_VERSION = 1
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS-1035 label, as Kubernetes wants


# -- what a service is -------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Backend:
    """One backend of a service: a pod and the port it serves on.

    >>> Backend.parse("b1:8080"), str(Backend("b2", 8080, "terminating"))
    (Backend(pod='b1', port=8080, state='active'), 'b2:8080 (terminating)')
    """

    pod: str
    port: int
    state: str = "active"  #: 'active' or 'terminating'
    id: int = field(default=0, compare=False, repr=False)  #: backend id in cilium_lb4_backends_v3

    @classmethod
    def parse(cls, spec: "str | Backend", service: str = "?", state: str = "active") -> "Backend":
        """``'POD:PORT'`` (or a Backend) → Backend; ConfigError names the service otherwise."""
        if isinstance(spec, Backend):
            return spec
        pod, sep, port = str(spec).rpartition(":")
        if not sep or not pod or not port.strip().isdigit():
            raise ConfigError(f"service '{service}': backend {spec!r}: expected POD:PORT, e.g. b1:8080")
        return cls(pod.strip(), int(port), state)

    @property
    def ref(self) -> str:
        """``b1:8080``: how commands name it."""
        return f"{self.pod}:{self.port}"

    def __str__(self) -> str:
        return self.ref if self.state == "active" else f"{self.ref} ({self.state})"


@dataclass(frozen=True, slots=True)
class Frontend:
    """One frontend of a service: an address:port with its own service id (``rev_nat_index``).

    Cilium gives every frontend of a Kubernetes service its own id and reverse NAT
    entry (mapping back to that frontend), and its own head and slots, all
    pointing at the same backends.

    >>> from labkit.maps.lb import ServiceFlags
    >>> fe = Frontend("198.51.100.11", 30080, "NodePort", 2)
    >>> fe.flags(0) == ServiceFlags.NODEPORT | ServiceFlags.ROUTABLE, fe.l4("TCP")
    (True, '198.51.100.11:30080/TCP')
    """

    address: str
    port: int
    type: str = "ClusterIP"  #: 'ClusterIP', 'NodePort' or 'LoadBalancer'
    id: int = 0  #: rev_nat_index: the id of this frontend in cilium_lb4_services_v2 / reverse_nat

    def flags(self, affinity_timeout: int = 0) -> ServiceFlags:
        """``lb4_service.flags``: a ClusterIP sets no type bit (and no ROUTABLE: ``non-routable``);
        a NodePort frontend NODEPORT, a LoadBalancer one LOADBALANCER, both ROUTABLE; AFFINITY with a timeout."""
        from labkit.maps.lb import ServiceFlags  # here: the names of this module load without the maps

        flags = ServiceFlags(0)
        if self.type == "NodePort":
            # the surrogate 0.0.0.0:nodePort is not routable (pkg/maps/lbmap/lbmap.go:573: !fe.IsSurrogate())
            flags |= ServiceFlags.NODEPORT | (ServiceFlags(0) if self.surrogate else ServiceFlags.ROUTABLE)
        elif self.type == "LoadBalancer":
            flags |= ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE
        if affinity_timeout:
            flags |= ServiceFlags.AFFINITY
        return flags

    @property
    def surrogate(self) -> bool:
        """The NodePort frontend ``0.0.0.0:nodePort`` every node's maps hold beside the node's own addresses
        (pkg/k8s/service.go:203-216 at v1.16.0), for socket LB's wildcard lookup of any node's address."""
        return self.address == SURROGATE

    def l4(self, protocol: str) -> str:
        return f"{self.address}:{self.port}/{protocol}"

    def to_json(self, protocol: str) -> dict:
        return {"address": self.address, "port": self.port, "type": self.type, "id": self.id,
                "frontend": self.l4(protocol)}

    @classmethod
    def from_json(cls, data: dict) -> "Frontend":
        return cls(data["address"], int(data["port"]), data.get("type", "ClusterIP"), int(data["id"]))


@dataclass(frozen=True, slots=True)
class Service:
    """A service as the agent knows it: a ClusterIP, a NodePort or a LoadBalancer.

    ``frontends`` are its frontends, the ClusterIP one (``vip:port``) first, then for a
    NodePort one per node address (``nodeIP:node_port``) and the surrogate ``0.0.0.0:node_port``,
    then for a LoadBalancer ``lb_vip:port``; each has its own id. ``id`` is the ClusterIP
    frontend's id. A node's maps hold its own NodePort address and the surrogate, not the
    other nodes' addresses (:meth:`on_node`).
    """

    name: str
    vip: str
    port: int
    protocol: str = "TCP"
    backends: tuple[Backend, ...] = ()
    affinity_timeout: int = 0  #: seconds; 0: no session affinity
    id: int = 0
    type: str = "ClusterIP"
    node_port: int = 0  #: 0 for a ClusterIP
    lb_vip: str | None = None  #: LoadBalancer only
    frontends: tuple[Frontend, ...] = ()  #: empty: just the ClusterIP frontend (vip, port, id)
    etp: str = "Cluster"  #: externalTrafficPolicy of the NodePort and LoadBalancer frontends
    algorithm: str = "random"  #: 'random' or 'maglev'

    def with_backends(self, backends: tuple[Backend, ...]) -> "Service":
        """The same service with ``backends`` (what ``dataclasses.replace`` does, at a fraction of its cost:
        the agent calls it for every change)."""
        return Service(self.name, self.vip, self.port, self.protocol, backends, self.affinity_timeout, self.id,
                       self.type, self.node_port, self.lb_vip, self.frontends, self.etp, self.algorithm)

    def __post_init__(self):
        if not self.frontends:
            object.__setattr__(self, "frontends", (Frontend(self.vip, self.port, "ClusterIP", self.id),))

    @property
    def frontend(self) -> str:
        """``198.19.0.10:80/TCP``: the ClusterIP frontend."""
        return f"{self.vip}:{self.port}/{self.protocol}"

    @property
    def ids(self) -> tuple[int, ...]:
        """The ids of every frontend (``rev_nat_index`` values)."""
        return tuple(fe.id for fe in self.frontends)

    @property
    def active(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.state == "active")

    @property
    def terminating(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.state != "active")

    @property
    def slots(self) -> tuple[Backend, ...]:
        """Backends in slot order: slot 1 first; the active ones, then the terminating ones."""
        return self.active + self.terminating

    @property
    def flags(self) -> ServiceFlags:
        """``lb4_service.flags`` of the ClusterIP frontend: no type bit (non-routable), AFFINITY with a timeout.
        Each frontend's own flags: :meth:`Frontend.flags`."""
        from labkit.maps.lb import ServiceFlags

        return ServiceFlags.AFFINITY if self.affinity_timeout else ServiceFlags(0)

    def backend(self, ref: "str | Backend") -> Backend:
        """The backend ``pod:port``; NotFoundError lists the service's backends."""
        want = Backend.parse(ref, self.name)
        for b in self.backends:
            if (b.pod, b.port) == (want.pod, want.port):
                return b
        have = ", ".join(b.ref for b in self.backends) or "none"
        raise NotFoundError(f"service '{self.name}': backend '{want.ref}' not found (backends: {have})")

    def to_json(self, topology: Topology | None = None) -> dict:
        """Plain data: name, type, vip, port, protocol, id, affinity_timeout, frontend, node_port,
        lb_vip, frontends, backends."""
        bes = []
        for b in self.backends:
            d = {"pod": b.pod, "port": b.port, "state": b.state, "backend_id": b.id}
            if topology is not None:
                d["address"] = topology.pod(b.pod).ip
            bes.append(d)
        return {"name": self.name, "type": self.type, "vip": self.vip, "port": self.port,
                "protocol": self.protocol, "id": self.id, "affinity_timeout": self.affinity_timeout,
                "frontend": self.frontend, "node_port": self.node_port, "lb_vip": self.lb_vip,
                "frontends": [fe.to_json(self.protocol) for fe in self.frontends], "backends": bes,
                "etp": self.etp, "algorithm": self.algorithm}

    @classmethod
    def from_json(cls, data: dict) -> "Service":
        return cls(
            name=data["name"], vip=data["vip"], port=int(data["port"]), protocol=data["protocol"],
            backends=tuple(Backend(b["pod"], int(b["port"]), b["state"], int(b.get("backend_id", 0)))
                           for b in data["backends"]),
            affinity_timeout=int(data.get("affinity_timeout", 0)), id=int(data["id"]),
            type=data.get("type", "ClusterIP"), node_port=int(data.get("node_port") or 0),
            lb_vip=data.get("lb_vip"),
            frontends=tuple(Frontend.from_json(f) for f in data.get("frontends", ())),
            etp=data.get("etp", "Cluster"), algorithm=data.get("algorithm", "random"),
        )

    def __str__(self) -> str:
        bes = ", ".join(str(b) for b in self.backends) or "no backends"
        extra = "".join(f", {fe.type} {fe.l4(self.protocol)} id {fe.id}" for fe in self.frontends[1:])
        if self.type != "ClusterIP" and self.etp != "Cluster":
            extra += f", externalTrafficPolicy {self.etp}"
        if self.algorithm != "random":
            extra += f", {self.algorithm}"
        return f"{self.name} ({self.type} {self.frontend}, id {self.id}{extra}): {bes}"

    def on_node(self, fe: Frontend, node_ip: str) -> bool:
        """Whether the maps of the node with address ``node_ip`` hold frontend ``fe``: every frontend but
        another node's NodePort address (Cilium's agent writes its own node's NodePort addresses and the
        surrogate, pkg/k8s/service.go:203-248 at v1.16.0)."""
        return fe.type != "NodePort" or fe.surrogate or fe.address == node_ip

    def local_scope(self, fe: Frontend) -> bool:
        """True if ``fe`` lists only node-local backends to outside clients (eTP=Local on a
        NodePort or LoadBalancer frontend)."""
        return self.etp == "Local" and fe.type != "ClusterIP"




def check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"service name {name!r}: expected a DNS label: lower-case letters, digits and '-', "
                          f"starting with a letter, at most 63 characters")


def check_type(name: str, type_: str) -> str:
    for t in SERVICE_TYPES:
        if str(type_).lower() == t.lower():
            return t
    raise ConfigError(f"service '{name}': type {type_!r}; expected one of {', '.join(SERVICE_TYPES)}")


def check_choice(name: str, what: str, value, choices: tuple[str, ...]) -> str:
    """``value`` as spelled in ``choices`` (any case), or a ConfigError listing them."""
    for c in choices:
        if str(value).lower() == c.lower():
            return c
    raise ConfigError(f"service '{name}': {what} {value!r}; expected one of {', '.join(choices)}")


def check_node_port(name: str, port) -> None:
    lo, hi = NODE_PORT_RANGE.start, NODE_PORT_RANGE.stop - 1
    if isinstance(port, bool) or not isinstance(port, int):
        raise ConfigError(f"service '{name}': node port {port!r} is not a whole number; expected {lo}-{hi}")
    if port not in NODE_PORT_RANGE:
        raise ConfigError(f"service '{name}': node port {port} is outside the node port range; expected {lo}-{hi}")


def check_lb_vip(name: str, vip: str) -> str:
    return check_address_in(name, vip, "LoadBalancer VIP", "LoadBalancer", LB_RANGE)


def check_protocol(name: str, protocol: str) -> str:
    proto = str(protocol).upper()
    if proto not in PROTOCOLS:
        raise ConfigError(f"service '{name}': protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return proto


def check_port(what: str, port) -> None:
    if isinstance(port, bool) or not isinstance(port, int):
        raise ConfigError(f"{what} {port!r} is not a whole number; expected 1-65535")
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what} {port} is out of range; expected 1-65535")


def check_affinity(name: str, seconds) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise ConfigError(f"service '{name}': session affinity timeout {seconds!r}; expected whole seconds")
    if not 0 <= seconds <= MAX_AFFINITY:
        raise ConfigError(f"service '{name}': session affinity timeout {seconds} s; "
                          f"expected 0 (off) to {MAX_AFFINITY} seconds")


def check_state(name: str, state: str) -> None:
    if state not in STATES:
        raise ConfigError(f"service '{name}': backend state {state!r}; expected one of {', '.join(STATES)}")


def check_vip(name: str, vip: str) -> str:
    return check_address_in(name, vip, "VIP", "ClusterIP", CLUSTERIP_RANGE)


def check_address_in(name: str, vip: str, what: str, range_name: str, network) -> str:
    """A host address of ``network``, or a ConfigError naming the service and the range."""
    try:
        ip = ipaddress.IPv4Address(str(vip).strip())
    except ValueError:
        raise ConfigError(f"service '{name}': {what} {vip!r} is not an IPv4 address; "
                          f"expected one from the {range_name} range {network}") from None
    if ip not in network:
        raise ConfigError(f"service '{name}': {what} {ip} is outside the {range_name} range {network}")
    if ip in (network.network_address, network.broadcast_address):
        raise ConfigError(f"service '{name}': {what} {ip} is the {range_name} range's network or "
                          f"broadcast address; expected a host address of {network}")
    return str(ip)
