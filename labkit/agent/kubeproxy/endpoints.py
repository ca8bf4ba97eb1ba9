"""A labkit Service's backends as kube-proxy sees its endpoints, and which of them a
node uses (kube-proxy's ``CategorizeEndpoints``, pkg/proxy/topology.go).

A backend in state ``active`` is a Ready endpoint; one in state ``terminating`` is
Serving and Terminating but not Ready (a pod that is shutting down and still passes
its readiness probe). kube-proxy sorts a service's endpoints by their ``ip:port``
string (``byEndpoint``), uses the Ready ones, and falls back to the serving
terminating ones only when none is Ready; for externalTrafficPolicy Local it does
the same among this node's endpoints on their own::

    >>> from labkit.agent.services import Backend, Service
    >>> from labkit.net.topology import Topology
    >>> topo = Topology.default("demo")
    >>> svc = Service("web", "198.19.0.10", 80, backends=(Backend("b2", 8080), Backend("a1", 8080, "terminating")),
    ...               type="NodePort", node_port=30080, etp="Local")
    >>> use = categorize(endpoints(svc, topo), svc, "node-a")
    >>> [str(e) for e in use.cluster], [str(e) for e in use.local], [str(e) for e in use.reachable], use.has_any
    (['198.18.2.12:8080'], ['198.18.1.11:8080'], ['198.18.2.12:8080', '198.18.1.11:8080'], True)
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Endpoint", "Categorized", "endpoints", "categorize", "externally_accessible", "external_policy_local"]


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of a service port: address, port, node and the three EndpointSlice conditions."""

    ip: str
    port: int
    node: str
    ready: bool
    serving: bool
    terminating: bool

    def __str__(self) -> str:
        return f"{self.ip}:{self.port}"


@dataclass(frozen=True)
class Categorized:
    """What CategorizeEndpoints returns: the Cluster and Local policy endpoints, every endpoint this
    node can reach (the union, one KUBE-SEP chain each), and whether any is usable anywhere."""

    cluster: tuple[Endpoint, ...]
    local: tuple[Endpoint, ...]
    reachable: tuple[Endpoint, ...]
    has_any: bool


def endpoints(svc, topology) -> list[Endpoint]:
    """The service's backends as endpoints, sorted by ``ip:port`` string as kube-proxy sorts them."""
    out = []
    for b in svc.backends:
        pod = topology.pod(b.pod)
        terminating = b.state == "terminating"
        out.append(Endpoint(pod.ip, b.port, pod.node, ready=not terminating, serving=True, terminating=terminating))
    return sorted(out, key=str)


def externally_accessible(svc) -> bool:
    """NodePort and LoadBalancer services are; a ClusterIP one is not (labkit has no externalIPs)."""
    return svc.type != "ClusterIP"


def external_policy_local(svc) -> bool:
    """ExternalPolicyLocal(): externalTrafficPolicy Local on an externally accessible service."""
    return externally_accessible(svc) and svc.etp == "Local"


def _usable(eps: list[Endpoint]) -> tuple[Endpoint, ...]:
    """The Ready endpoints, or if there is none, the serving terminating ones."""
    ready = tuple(e for e in eps if e.ready)
    return ready or tuple(e for e in eps if e.serving and e.terminating)


def categorize(eps: list[Endpoint], svc, node: str) -> Categorized:
    """Which endpoints ``node`` uses for ``svc``. labkit services have internalTrafficPolicy Cluster and no
    topology hints, so the Cluster endpoints are always in use and topology never narrows them."""
    cluster = _usable(eps)
    if not external_policy_local(svc):
        return Categorized(cluster, (), cluster, bool(cluster))
    local = _usable([e for e in eps if e.node == node])
    extra = tuple(e for e in local if e not in cluster)  # local terminating ones while remote ones are Ready
    return Categorized(cluster, local, cluster + extra, bool(cluster))
