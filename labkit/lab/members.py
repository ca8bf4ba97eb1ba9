"""A lab's members as handles: ``lab.pod("a1")``, ``lab.node("node-a")``, ``lab.external("ext")``.

One set of handles serves both sides of the door: a handle reads the lab's topology itself and asks the lab
for everything else (``lab.tcp``, ``lab.ping``, ``lab.udp``, ``lab.send``, ``lab.exec``, ``lab.ct`` ...),
which the datapath side (:class:`labkit.lab.Lab`, root, in-process) and the client
(:class:`labkit.client.Lab`, through labkitd) each implement.

    >>> from types import SimpleNamespace
    >>> from labkit.net.topology import Topology
    >>> lab = SimpleNamespace(topology=Topology.default("demo"))
    >>> a1 = PodHandle(lab, "a1")
    >>> a1.ip, a1.node, a1.labels, a1.netns
    ('198.18.1.11', 'node-a', {'app': 'a1'}, 'lk-demo-a1')
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any

__all__ = ["PodHandle", "NodeHandle", "ExternalHandle", "Members"]


@dataclass(frozen=True)
class _Member:
    lab: Any
    name: str

    @property
    def netns(self) -> str:
        """Its network namespace (``ip netns exec <netns> …``)."""
        return self.lab.topology.netns(self.name)

    def exec(self, *argv: str, timeout: float = 30, check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run a command inside it; output captured as text."""
        return self.lab.exec(self.name, list(argv), timeout=timeout, check=check, **kw)


@dataclass(frozen=True)
class PodHandle(_Member):
    """A pod of a running lab."""

    @property
    def ip(self) -> str:
        return self.lab.topology.pod(self.name).ip

    @property
    def node(self) -> str:
        return self.lab.topology.pod(self.name).node

    @property
    def labels(self) -> dict[str, str]:
        """Its Kubernetes labels (``{"app": "a1"}`` unless the topology gave others)."""
        return dict(self.lab.topology.pod(self.name).labels)

    @property
    def identity(self) -> int:
        """The security identity the agent allocated for its labels."""
        return self.lab.topology.pod(self.name).identity

    def tcp(self, target: str, port: int = 8080, sport: int | None = None):
        """A TCP connection to ``target`` (pod, node, external name, Service or address), not yet open."""
        return self.lab.tcp(self.name, target, port, sport)

    def ping(self, target: str, count: int = 1):
        """Ping ``target``: a Step."""
        return self.lab.ping(self.name, target, count)

    def udp(self, target: str, port: int = 8080, data: bytes = b"hello", sport: int | None = None):
        """One UDP datagram to ``target`` (from port ``sport``, default any) and its answer: a Step."""
        return self.lab.udp(self.name, target, port, data, sport)

    def send(self, packet, title: str | None = None):
        """Send one crafted IPv4 packet (scapy or bytes) from this pod: a Step."""
        return self.lab.send(self.name, packet, title)

    def server_log(self) -> list[str]:
        """Lines the pod's server logged (what it saw of its clients)."""
        return self.lab.server_log(self.name)


@dataclass(frozen=True)
class ExternalHandle(_Member):
    """The client outside the cluster (``ext``): an address on the underlay, no datapath.

    It reaches Services the way the world does: a LoadBalancer VIP (routed to the
    first node) or a NodePort on any node's address::

        lab.external("ext").tcp("web", 80).open()         # the LoadBalancer VIP of 'web'
        lab.external("ext").tcp("node-b", 30080).open()   # NodePort on node-b
    """

    @property
    def ip(self) -> str:
        return self.lab.topology.external(self.name).ip

    def tcp(self, target: str, port: int = 80, sport: int | None = None):
        """A TCP connection to ``target`` (a LoadBalancer service by name, a node, an address), not yet open."""
        return self.lab.tcp(self.name, target, port, sport)

    def udp(self, target: str, port: int = 80, data: bytes = b"hello", sport: int | None = None):
        """One UDP datagram to ``target`` (from port ``sport``, default any) and its answer: a Step."""
        return self.lab.udp(self.name, target, port, data, sport)

    def send(self, packet, title: str | None = None):
        """Send one crafted IPv4 packet (scapy or bytes) onto the underlay: a Step."""
        return self.lab.send(self.name, packet, title)


@dataclass(frozen=True)
class NodeHandle(_Member):
    """A node of a running lab."""

    @property
    def ip(self) -> str:
        return self.lab.topology.node(self.name).ip

    def ct(self) -> list:
        """Rows of both CT maps of this node."""
        return self.lab.ct(self.name)

    def nat(self) -> list:
        """Rows of this node's NAT map."""
        return self.lab.nat(self.name)

    def pin(self, map_name: str) -> str:
        """Path of one of its pinned maps."""
        return f"{self.lab.pin_dir(self.name)}/{map_name}"


class Members:
    """What both sides' ``Lab`` share of their members, from the topology and the state they hold: the handles
    (``lab.pod("a1")``, checked against the topology: NotFoundError lists the names), the pin directories and
    the cgroups, and this process's live tables (a subclass sets ``self._watchers = []``)."""

    def pod(self, name: str) -> PodHandle:
        """A pod by name (NotFoundError lists the pods)."""
        self.topology.pod(name)
        return PodHandle(self, name)

    def external(self, name: str = "ext") -> ExternalHandle:
        """The external client by name (NotFoundError lists them)."""
        self.topology.external(name)
        return ExternalHandle(self, name)

    def node(self, name: str) -> NodeHandle:
        """A node by name (NotFoundError lists the nodes)."""
        self.topology.node(name)
        return NodeHandle(self, name)

    def pin_dir(self, node: str) -> str:
        """``/sys/fs/bpf/labkit/<key>/<node>``"""
        self.topology.node(node)
        return self.state.pin_dirs[node]

    @property
    def pin_dirs(self) -> dict[str, str]:
        """``{node: /sys/fs/bpf/labkit/<key>/<node>}`` for every node."""
        return dict(self.state.pin_dirs)

    def cgroup(self, name: str) -> str | None:
        """The cgroup v2 directory of a pod or node (their processes run in it)."""
        if self.topology.kind_of(name) == "external":
            return None
        return self.state.cgroups.get(name)

    # -- live tables: this process's, refreshed on each change it makes --------------------------------
    def note_change(self, step: Any = None) -> None:
        """Something changed the maps (a step, a GC run, a reset): live tables refresh."""
        self._watchers = [t for t in self._watchers if not getattr(t, "closed", False)]
        for table in list(self._watchers):
            try:
                table.refresh()
            except Exception:  # a table that cannot refresh must not break the step
                pass

    def watch(self, node: str, interval: float | None = None):
        """A live table of ``node``'s CT rows, refreshed after every step (and every ``interval`` s)."""
        from labkit.notebook.widgets import watch  # ipywidgets: loaded when a table is asked for

        self.topology.node(node)
        table = watch(self, node, interval)
        self._watchers.append(table)
        return table
