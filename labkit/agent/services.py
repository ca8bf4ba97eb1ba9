"""Services: the part of the cilium-agent that turns a Kubernetes Service into
rows of every node's ``cilium_lb4_*`` maps.

A ClusterIP service is a frontend (VIP, port, protocol) and its backends
(pod, port). For each one, on every node, the agent writes (layouts in
:mod:`labkit.maps.lb`):

- ``cilium_lb4_backends_v3``: backend id → pod address, port, state;
- ``cilium_lb4_services_v2``: slots 1..n → backend ids (active first, then the
  terminating ones, which the random pick never reaches), and slot 0, the head:
  how many are active, the service id (``rev_nat_index``), flags;
- ``cilium_lb4_reverse_nat``: service id → VIP:port, to rewrite replies.

The datapath reads these while the agent writes them, so the order matters:
a growing service gets its backends, then its slots, then reverse NAT and its
head **last**; a shrinking one gets its head (the new count) **first**, then
slots, then loses the backends nothing uses any more. A packet never sees a
count that points at a slot not yet written.

A NodePort service is its ClusterIP frontend plus one frontend per node address,
``nodeIP:nodePort`` (flags NODEPORT and ROUTABLE); a LoadBalancer one is a NodePort
plus ``lbVIP:port`` from 203.0.113.0/24 (LOADBALANCER, ROUTABLE). As in Cilium,
every frontend has its own head and slots, its own service id and reverse NAT
entry (back to that frontend's address:port), and they all share the backends.
The write order above holds across all of a service's frontends at once.

What the agent writes depends on the Cilium release the lab reproduces (``lab.config.cilium``,
:mod:`labkit.release`): v1.16's agent writes protocol 0 in every service key and backend, so
one VIP:port holds one service whatever its protocol (two that differ only in protocol are
refused), and names Maglev backends ``ip:port``; 1.17+ writes the protocol
(cilium/cilium#33434) and 1.18+ hashes ``[ip:port/TCP,State:active]``
(:func:`labkit.maglev.backend_name`). Maglev tables are Cilium's: the lab's table size
(16381 by default) and the seed of ``--bpf-lb-maglev-hash-seed``'s default.

Service ids (1, 2, ...; one per frontend) and backend ids are allocated per lab, the same on
every node; a backend id belongs to one address:port/protocol and is shared by
every service that uses it (as in Cilium), and freed when the last one stops.
The list of services lives in ``/run/labkit/<lab>/services.json`` so every
process attached to the lab sees the same ones.

Without a kernel, the same agent writes into dictionaries::

    >>> from labkit.net.topology import Topology
    >>> svcs = Services.in_memory(Topology.default())
    >>> web = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    >>> web.frontend, web.id, [str(b) for b in web.backends]
    ('198.19.0.10:80/TCP', 1, ['b1:8080', 'b2:8080'])
    >>> for line in svcs.lb("node-a").lines():  # `cilium service list` on v1.16 (its lines end in spaces)
    ...     print(line.rstrip())
    ID   Frontend         Service Type   Backend
    1    198.19.0.10:80   ClusterIP      1 => 198.18.2.11:8080 (active)
                                         2 => 198.18.2.12:8080 (active)
    >>> svcs.maps.ops[:6]  # node-a, in the order written; v1.16 keys carry protocol 0 (ANY)
    ['update node-a cilium_lb4_backends_v3 backend 1', 'update node-a cilium_lb4_backends_v3 backend 2', 'update node-a cilium_lb4_services_v2 198.19.0.10:80/ANY slot 1', 'update node-a cilium_lb4_services_v2 198.19.0.10:80/ANY slot 2', 'update node-a cilium_lb4_reverse_nat rev_nat 1', 'update node-a cilium_lb4_services_v2 198.19.0.10:80/ANY slot 0']

On a running lab the same calls are ``lab.services.add(...)``, and
``labkit service add web --port 80 --backend b1:8080 --backend b2:8080``.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import json
import os
import re
import subprocess
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator, Protocol, Sequence

from labkit.errors import ConfigError, DatapathError, LabkitError, NotFoundError
from labkit.maglev import LAB_DEFAULT_M, MURMUR_SEED, backend_name, lookup_table
from labkit.maps.lb import (
    AFFINITY_MAP,
    BACKENDS_MAP,
    LB_MAPS,
    MAGLEV_MAP,
    REVNAT_MAP,
    SERVICES_MAP,
    BackendState,
    Lb4Backend,
    Lb4BackendKey,
    Lb4Key,
    Lb4ReverseNat,
    Lb4RevNatKey,
    Lb4Service,
    LbSnapshot,
    LookupScope,
    MaglevLut,
    PinnedMaglev,
    ServiceFlags,
    ServiceFlags2,
    proto_number,
)
from labkit.release import DEFAULT_RELEASE, profile
from labkit.net.topology import CLUSTERIP_RANGE, LB_RANGE, Topology

__all__ = [
    "Backend",
    "Frontend",
    "Service",
    "Services",
    "MapWriter",
    "PinnedMaps",
    "MemoryMaps",
    "ServiceStore",
    "JsonStore",
    "MemoryStore",
    "FIRST_VIP",
    "FIRST_LB_VIP",
    "NODE_PORT_RANGE",
    "SERVICE_TYPES",
    "STATES",
    "TRAFFIC_POLICIES",
    "ALGORITHMS",
]

#: Where automatic VIPs start (the low ten addresses are left for hand-picked ones).
FIRST_VIP = ipaddress.IPv4Address("198.19.0.10")
#: Where automatic LoadBalancer VIPs start, in the LoadBalancer range.
FIRST_LB_VIP = ipaddress.IPv4Address("203.0.113.10")
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
@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Frontend:
    """One frontend of a service: an address:port with its own service id (``rev_nat_index``).

    Cilium gives every frontend of a Kubernetes service its own id and reverse NAT
    entry (mapping back to that frontend), and its own head and slots, all
    pointing at the same backends.

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
        flags = ServiceFlags(0)
        if self.type == "NodePort":
            flags |= ServiceFlags.NODEPORT | ServiceFlags.ROUTABLE
        elif self.type == "LoadBalancer":
            flags |= ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE
        if affinity_timeout:
            flags |= ServiceFlags.AFFINITY
        return flags

    def l4(self, protocol: str) -> str:
        return f"{self.address}:{self.port}/{protocol}"

    def to_json(self, protocol: str) -> dict:
        return {"address": self.address, "port": self.port, "type": self.type, "id": self.id,
                "frontend": self.l4(protocol)}

    @classmethod
    def from_json(cls, data: dict) -> "Frontend":
        return cls(data["address"], int(data["port"]), data.get("type", "ClusterIP"), int(data["id"]))


@dataclass(frozen=True)
class Service:
    """A service as the agent knows it: a ClusterIP, a NodePort or a LoadBalancer.

    ``frontends`` are its frontends, the ClusterIP one (``vip:port``) first, then for a
    NodePort one per node address (``nodeIP:node_port``), then for a LoadBalancer
    ``lb_vip:port``; each has its own id. ``id`` is the ClusterIP frontend's id.
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

    def local_scope(self, fe: Frontend) -> bool:
        """True if ``fe`` lists only node-local backends to outside clients (eTP=Local on a
        NodePort or LoadBalancer frontend)."""
        return self.etp == "Local" and fe.type != "ClusterIP"


# -- where maps are written --------------------------------------------------------
class MapWriter(Protocol):
    """The map layer the agent writes through: a node's pinned LB maps, or a fake.

    Keys and values are the ctypes types of :data:`labkit.maps.lb.LB_MAPS`.
    """

    def get(self, node: str, map_name: str, key) -> ctypes.Structure | None: ...
    def update(self, node: str, map_name: str, key, value) -> None: ...
    def delete(self, node: str, map_name: str, key) -> bool: ...
    def items(self, node: str, map_name: str) -> list[tuple]: ...
    def clear(self, node: str, map_name: str) -> int: ...
    def close(self) -> None: ...


class PinnedMaps:
    """:class:`MapWriter` over the pinned maps of each node (``bpftool map update pinned …``).

    Maps are opened on first use and closed by :meth:`close` (after every agent call).
    """

    def __init__(self, pin_dirs: dict[str, str], maglev_m: int = LAB_DEFAULT_M):
        self.pin_dirs = dict(pin_dirs)
        self.maglev_m = maglev_m
        self._open: dict[tuple[str, str], object] = {}

    def path(self, node: str, map_name: str) -> str:
        return f"{self.pin_dirs[node]}/{map_name}"

    def _map(self, node: str, map_name: str):
        from labkit.maps.base import PinnedMap

        m = self._open.get((node, map_name))
        if m is None and map_name == MAGLEV_MAP:
            m = self._open[(node, map_name)] = PinnedMaglev(self.path(node, map_name), self.maglev_m)
        if m is None:
            key_type, value_type = LB_MAPS[map_name]
            m = self._open[(node, map_name)] = PinnedMap(self.path(node, map_name), key_type, value_type)
        return m

    def get(self, node, map_name, key):
        return self._map(node, map_name).get(key)

    def update(self, node, map_name, key, value) -> None:
        self._map(node, map_name)[key] = value

    def delete(self, node, map_name, key) -> bool:
        return self._map(node, map_name).delete(key)

    def items(self, node, map_name) -> list[tuple]:
        return self._map(node, map_name).items()

    def clear(self, node, map_name) -> int:
        return self._map(node, map_name).clear()

    def close(self) -> None:
        for m in self._open.values():
            m.close()
        self._open.clear()


class MemoryMaps:
    """:class:`MapWriter` into dictionaries, for examples and tests.

    ``ops`` lists every update and delete in order (``'update node-a <map> <key>'``);
    ``fail`` may be set to a callable ``(op, node, map_name, key)`` that raises,
    to play a kernel that refuses a write.
    """

    def __init__(self, nodes: Iterable[str], maps: Iterable[str] = tuple(LB_MAPS)):
        self.data: dict[str, dict[str, dict[bytes, bytes]]] = {n: {m: {} for m in maps} for n in nodes}
        self.ops: list[str] = []
        self.fail = None

    def _table(self, node: str, map_name: str) -> dict[bytes, bytes]:
        try:
            return self.data[node][map_name]
        except KeyError:
            raise NotFoundError(f"pinned map {node}/{map_name} does not exist (is the lab up?)") from None

    def get(self, node, map_name, key):
        raw = self._table(node, map_name).get(bytes(key))
        return None if raw is None else LB_MAPS[map_name][1].from_buffer_copy(raw)

    def update(self, node, map_name, key, value) -> None:
        table = self._table(node, map_name)
        if self.fail is not None:
            self.fail("update", node, map_name, key)
        table[bytes(key)] = bytes(value)
        self.ops.append(f"update {node} {map_name} {key}")

    def delete(self, node, map_name, key) -> bool:
        table = self._table(node, map_name)
        if bytes(key) not in table:
            return False
        if self.fail is not None:
            self.fail("delete", node, map_name, key)
        del table[bytes(key)]
        self.ops.append(f"delete {node} {map_name} {key}")
        return True

    def items(self, node, map_name) -> list[tuple]:
        key_type, value_type = LB_MAPS[map_name]
        return [(key_type.from_buffer_copy(k), value_type.from_buffer_copy(v))
                for k, v in self._table(node, map_name).items()]

    def clear(self, node, map_name) -> int:
        table = self._table(node, map_name)
        n = len(table)
        table.clear()
        return n

    def close(self) -> None:
        pass

    def dump(self, node: str, map_name: str) -> dict[bytes, bytes]:
        """A copy of one map's raw bytes (compare two to see that nothing changed)."""
        return dict(self._table(node, map_name))


# -- where the service list is kept ------------------------------------------------
class ServiceStore(Protocol):
    """Where the agent keeps its list of services between calls and processes."""

    def load(self) -> dict: ...
    def save(self, data: dict) -> None: ...
    def lock(self) -> contextlib.AbstractContextManager: ...


class JsonStore:
    """``/run/labkit/<lab>/services.json``, in the lab's ledger.

    Writers hold an exclusive flock of the lab directory, so two processes adding
    services at once allocate different ids; a reader outside a writer's lock takes
    it shared, so it never reads half a file. The file is rewritten in place under
    the lock: a rename per change cost 0.2 ms on the VM's disk, a fifth of the
    agent's 1 ms budget.
    """

    def __init__(self, lab: str):
        from labkit.net.ledger import Ledger, lab_dir

        self.lab = lab
        self.dir = lab_dir(lab)
        self.path = self.dir / "services.json"
        self._ledger = Ledger(lab)
        self._held = False  # this object holds the exclusive lock (load() must not ask again)
        self._recorded = False

    def load(self) -> dict:
        try:
            if self._held:
                return self._read()
            with self._flock(fcntl.LOCK_SH):
                return self._read()
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ConfigError(f"lab '{self.lab}': {self.path} is unreadable ({exc}); "
                              f"`labkit --lab {self.lab} cleanup` removes what the lab created") from None

    def _read(self) -> dict:
        text = self.path.read_text()
        return json.loads(text) if text else {}

    def save(self, data: dict) -> None:
        if not self._recorded and not self.path.exists():
            if str(self.path) not in {e.get("path") for e in self._ledger.entries("file")}:
                self._ledger.record("file", path=str(self.path))  # before it exists: teardown removes it
        self._recorded = True
        raw = json.dumps(data, separators=(",", ":")).encode()  # compact: the C encoder, fast
        with contextlib.ExitStack() as stack:
            if not self._held:
                stack.enter_context(self._flock(fcntl.LOCK_EX))
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, raw)
                os.ftruncate(fd, len(raw))
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _flock(self, how: int) -> Iterator[None]:
        try:
            fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFoundError(f"lab '{self.lab}' is not up (no {self.dir})") from None
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        with self._flock(fcntl.LOCK_EX):
            self._held = True
            try:
                yield
            finally:
                self._held = False


class MemoryStore:
    """A :class:`ServiceStore` in memory (examples and tests)."""

    def __init__(self, data: dict | None = None):
        self.data = json.loads(json.dumps(data or {}))
        self.saves = 0

    def load(self) -> dict:
        return json.loads(json.dumps(self.data))

    def save(self, data: dict) -> None:
        self.data = json.loads(json.dumps(data))
        self.saves += 1

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        yield


# -- the agent's state -------------------------------------------------------------
@dataclass(frozen=True)
class _State:
    """Services by name, backend ids by ``address:port/protocol``, the next ids to hand out."""

    services: dict = field(default_factory=dict)  # name -> Service, in creation order
    backend_ids: dict = field(default_factory=dict)  # "ip:port/PROTO" -> id
    next_service_id: int = 1
    next_backend_id: int = 1

    @classmethod
    def from_json(cls, data: dict) -> "_State":
        if not data:
            return cls()
        return cls(
            services={s["name"]: Service.from_json(s) for s in data.get("services", [])},
            backend_ids=dict(data.get("backend_ids", {})),
            next_service_id=int(data.get("next_service_id", 1)),
            next_backend_id=int(data.get("next_backend_id", 1)),
        )

    def to_json(self) -> dict:
        return {"version": STATE_VERSION, "services": [s.to_json() for s in self.services.values()],
                "backend_ids": self.backend_ids, "next_service_id": self.next_service_id,
                "next_backend_id": self.next_backend_id}

    def with_service(self, svc: Service, topo: Topology, drop: str | None = None) -> tuple["_State", Service]:
        """This state with ``svc`` in (replacing one of its name), backend ids assigned;
        ``drop`` names a service to take out instead. Unused backend ids are freed."""
        services = dict(self.services)
        ids = dict(self.backend_ids)
        next_bid = self.next_backend_id
        if drop is not None:
            services.pop(drop, None)
        else:
            bes = []
            for b in svc.backends:
                l4 = _l4(topo.pod(b.pod).ip, b.port, svc.protocol)
                if l4 not in ids:
                    ids[l4], next_bid = _allocate(next_bid, set(ids.values()), MAX_BACKEND_ID, "backend id")
                bes.append(replace(b, id=ids[l4]))
            svc = replace(svc, backends=tuple(bes))
            services[svc.name] = svc
        used = {b.id for s in services.values() for b in s.backends}
        ids = {k: v for k, v in ids.items() if v in used}
        return replace(self, services=services, backend_ids=ids, next_backend_id=next_bid), svc


def _memory_tables():
    """Every node's iptables in memory (an agent without a kernel)."""
    from labkit.agent.kubeproxy import MemoryTables

    return MemoryTables()


def _l4(ip: str, port: int, proto: str) -> str:
    return f"{ip}:{port}/{proto}"


def _allocate(start: int, used: set[int], limit: int, what: str) -> tuple[int, int]:
    """The first free id from ``start`` on, wrapping to 1; returns (id, the next start)."""
    candidate = start if 1 <= start <= limit else 1
    for _ in range(len(used) + 1):
        if candidate not in used:
            return candidate, candidate % limit + 1
        candidate = candidate % limit + 1
    raise ConfigError(f"no free {what}: all {limit} are in use")


# -- what to write, in which order -------------------------------------------------
_Entries = dict[str, dict[bytes, tuple]]  # map name -> raw key -> (key, value)

#: Phases of one change; a growing service and a shrinking one take them in different orders.
#: A Maglev table only names backends that exist, and is gone only once no head points at it.
_GROW = ("be_new", "be_changed", "maglev_put", "slot_put", "revnat_put", "head_put", "head_del", "slot_del",
         "maglev_del", "revnat_del", "be_del")
_SHRINK = ("be_new", "revnat_put", "head_put", "head_del", "maglev_put", "be_changed", "slot_put", "slot_del",
           "maglev_del", "revnat_del", "be_del")
_PUT = {SERVICES_MAP: "slot_put", BACKENDS_MAP: "be_new", REVNAT_MAP: "revnat_put", MAGLEV_MAP: "maglev_put"}
_DEL = {SERVICES_MAP: "slot_del", BACKENDS_MAP: "be_del", REVNAT_MAP: "revnat_del", MAGLEV_MAP: "maglev_del"}


@functools.lru_cache(maxsize=256)
def _maglev_lut(names: tuple[tuple[str, int], ...], m: int) -> MaglevLut:
    """One Maglev table (the frontends of a service share it, and old and new states mostly agree)."""
    return MaglevLut(lookup_table(list(names), m, MURMUR_SEED))


def _entries(state: _State, topo: Topology, node: str, maglev_m: int = LAB_DEFAULT_M,
             cilium: str = DEFAULT_RELEASE, short_count: bool = False) -> _Entries:
    """Every row ``node``'s service maps should hold for ``state``, as release ``cilium``'s agent writes them.

    Keys and backends carry protocol 0 on v1.16 (pkg/maps/lbmap: ``u8proto.ANY``) and the
    service's protocol on 1.17+; heads carry the service's flags, slots flags 0.
    Nodes differ only where a frontend has externalTrafficPolicy=Local: its external
    scope lists the node's own backends (flag Local); its internal scope, read by pods
    and node processes (flag TWO_SCOPES on the external head), lists them all.
    A Maglev service gets one table per frontend, over what the external scope lists,
    built as Cilium builds it (:func:`labkit.maglev.backend_name`, Cilium's seed)."""
    out: _Entries = {SERVICES_MAP: {}, BACKENDS_MAP: {}, REVNAT_MAP: {}, MAGLEV_MAP: {}}
    proto_keys = profile(cilium).has("lb_proto_keys")
    backends: dict[int, tuple[str, int, int, bool]] = {}
    for svc in state.services.values():
        wire = proto_number(svc.protocol) if proto_keys else 0
        slots = svc.slots  # once per service: every frontend lists the same backends
        n_active = sum(b.state == "active" for b in slots)
        for fe in svc.frontends:  # each its own head, slots and reverse NAT; the same backends
            flags, flags2 = int(fe.flags(svc.affinity_timeout)), 0
            scopes = [(LookupScope.EXT, slots, n_active)]
            if svc.local_scope(fe):
                flags |= ServiceFlags.EXT_LOCAL_SCOPE
                flags2 |= ServiceFlags2.TWO_SCOPES
                here = tuple(b for b in slots if topo.pod(b.pod).node == node)
                scopes = [(LookupScope.EXT, here, sum(b.state == "active" for b in here)),
                          (LookupScope.INT, slots, n_active)]
            for scope, listed, active in scopes:
                head_key = Lb4Key.make(fe.address, fe.port, wire, scope=scope)
                # short_count: the agent fault lb-wrong-count, one backend fewer in the head than listed
                head = Lb4Service.head(max(0, active - short_count), fe.id, flags, flags2, svc.affinity_timeout)
                out[SERVICES_MAP][bytes(head_key)] = (head_key, head)
                for slot, b in enumerate(listed, start=1):
                    key = head_key.with_slot(slot)
                    out[SERVICES_MAP][bytes(key)] = (key, Lb4Service.slot(b.id, fe.id))
            rn_key = Lb4RevNatKey.make(fe.id)
            out[REVNAT_MAP][bytes(rn_key)] = (rn_key, Lb4ReverseNat.make(fe.address, fe.port))
            if svc.algorithm == "maglev":
                ext_active = [b for b in scopes[0][1] if b.state == "active"]
                if ext_active:
                    names = tuple(sorted((backend_name(topo.pod(b.pod).ip, b.port, svc.protocol, cilium), b.id)
                                         for b in ext_active))
                    out[MAGLEV_MAP][bytes(rn_key)] = (rn_key, _maglev_lut(names, maglev_m))
        for b in slots:
            ip = topo.pod(b.pod).ip
            was_active = backends.get(b.id, (ip, b.port, wire, False))[3]
            backends[b.id] = (ip, b.port, wire, was_active or b.state == "active")
    for bid, (ip, port, proto, active) in backends.items():
        # Shared by several services: active while any of them still counts it.
        state_ = BackendState.ACTIVE if active else BackendState.TERMINATING
        key = Lb4BackendKey(bid)
        out[BACKENDS_MAP][bytes(key)] = (key, Lb4Backend.make(ip, port, proto, state_))
    return out


@dataclass(frozen=True)
class _Op:
    phase: str
    map_name: str
    key: object
    value: object | None  # None: delete

    def sort_key(self) -> tuple:
        if self.map_name == SERVICES_MAP:
            slot = self.key.backend_slot
            return (self.key.ident, -slot if self.value is None else slot)
        return (bytes(self.key),)


def _plan(old: _Entries, new: _Entries, grow: bool) -> list[_Op]:
    """The writes that turn ``old`` into ``new``, in a safe order for the datapath."""
    ops = []
    for map_name in (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP, MAGLEV_MAP):
        before, after = old[map_name], new[map_name]
        for raw, (key, value) in after.items():
            if raw in before and bytes(before[raw][1]) == bytes(value):
                continue
            phase = _PUT[map_name]
            if map_name == SERVICES_MAP and key.backend_slot == 0:
                phase = "head_put"
            elif map_name == BACKENDS_MAP and raw in before:
                phase = "be_changed"
            ops.append(_Op(phase, map_name, key, value))
        for raw, (key, _value) in before.items():
            if raw not in after:
                head = map_name == SERVICES_MAP and key.backend_slot == 0
                ops.append(_Op("head_del" if head else _DEL[map_name], map_name, key, None))
    order = {p: i for i, p in enumerate(_GROW if grow else _SHRINK)}
    return sorted(ops, key=lambda op: (order[op.phase], op.sort_key()))


class _Txn:
    """Writes with their undo: the value each key had before (None: absent)."""

    def __init__(self, maps: MapWriter):
        self.maps = maps
        self.undo: list[tuple[str, str, object, object | None]] = []

    def apply(self, node: str, op: _Op) -> None:
        prev = self.maps.get(node, op.map_name, op.key)
        if op.value is None:
            if prev is None:
                return
            self.maps.delete(node, op.map_name, op.key)
        else:
            self.maps.update(node, op.map_name, op.key, op.value)
        self.undo.append((node, op.map_name, op.key, prev))

    def rollback(self) -> list[str]:
        """Put back what was there, newest write first; returns what could not be undone."""
        problems = []
        for node, map_name, key, prev in reversed(self.undo):
            try:
                if prev is None:
                    self.maps.delete(node, map_name, key)
                else:
                    self.maps.update(node, map_name, key, prev)
            except (OSError, LabkitError) as exc:
                problems.append(f"{node} {map_name} {key}: {exc}")
        self.undo.clear()
        return problems


# -- the agent ---------------------------------------------------------------------
class Services:
    """The services of one lab and the maps they are written to.

    Build with :meth:`for_lab` (``lab.services``) or :meth:`in_memory`.
    Every change is checked before any map is touched, written to every node in
    a datapath-safe order, and rolled back if the kernel refuses a write.
    """

    def __init__(self, lab: str, topology: Topology, maps: MapWriter, store: ServiceStore,
                 maglev_m: int = LAB_DEFAULT_M, mode: str = "ebpf", tables=None, cilium: str = DEFAULT_RELEASE,
                 faults=None):
        self.lab = lab
        self.topology = topology
        self.maps = maps
        self.store = store
        self.maglev_m = maglev_m  #: the lab's Maglev table size (its datapath was compiled for it)
        #: the Cilium release whose agent this one plays: what its keys, backends, tables and views hold
        self.cilium = profile(cilium).release
        #: 'ebpf' (the cilium_lb4_* maps) or 'iptables' (kube-proxy's nat table on every node, no LB map entry)
        self.mode = mode
        #: iptables mode: ``tables(node)`` is that node's iptables (:class:`labkit.agent.kubeproxy.Iptables`)
        self.tables = tables if tables is not None else _memory_tables()
        #: the lab's agent faults, asked at every change (break-it exercises: ``lb-wrong-count``, ``kp-no-masq``)
        self.faults = faults or (lambda: [])

    def __repr__(self) -> str:
        return f"Services(lab={self.lab!r}, services={[s.name for s in self.list()]})"

    @classmethod
    def for_lab(cls, lab) -> "Services":
        """The agent of a running :class:`~labkit.lab.Lab`: its pinned maps, its services.json."""
        pins = {n.name: lab.pin_dir(n.name) for n in lab.topology.nodes}
        from labkit.agent.kubeproxy import NetnsIptables

        m = lab.config.maglev_table_size
        mode = getattr(lab.config, "service_mode", "ebpf")
        tables = lambda node: NetnsIptables(lab.topology.netns(node))  # noqa: E731
        return cls(lab.name, lab.topology, PinnedMaps(pins, m), JsonStore(lab.name), m, mode, tables,
                   lab.config.profile.release, lab.agent_faults)

    @classmethod
    def in_memory(cls, topology: Topology, cilium: str = DEFAULT_RELEASE, maglev_m: int = LAB_DEFAULT_M) -> "Services":
        """An agent of release ``cilium`` writing into :class:`MemoryMaps` and a :class:`MemoryStore` (no kernel)."""
        return cls(topology.lab, topology, MemoryMaps(n.name for n in topology.nodes), MemoryStore(), maglev_m,
                   cilium=cilium)

    # -- reading -------------------------------------------------------------------
    def _state(self) -> _State:
        try:
            return _State.from_json(self.store.load())
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"lab '{self.lab}': the service list is unreadable ({type(exc).__name__}: {exc})") from None

    def list(self) -> list[Service]:
        """Every service, in the order they were added."""
        return list(self._state().services.values())

    def get(self, name: str) -> Service:
        """The service ``name``; NotFoundError lists the services."""
        return self._find(self._state(), name)

    def __iter__(self) -> Iterator[Service]:
        return iter(self.list())

    def __len__(self) -> int:
        return len(self._state().services)

    def __contains__(self, name: object) -> bool:
        return name in self._state().services

    def _find(self, state: _State, name: str) -> Service:
        try:
            return state.services[name]
        except KeyError:
            have = ", ".join(state.services) or "none"
            raise NotFoundError(f"service '{name}' not found in lab '{self.lab}' (services: {have})") from None

    def lb(self, node: str) -> LbSnapshot:
        """``node``'s three service maps as they are now (``labkit lb list NODE``)."""
        self.topology.node(node)
        try:
            return LbSnapshot.of(*(self.maps.items(node, m) for m in (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP)),
                                 cilium=self.cilium)
        finally:
            self.maps.close()

    def maglev(self, name: str, node: str) -> dict[int, tuple[MaglevLut | None, MaglevLut | None]]:
        """Service ``name``'s Maglev tables on ``node``: frontend id → (the table the BPF map
        holds, the table :func:`labkit.maglev.lookup_table` computes for it). Either may be
        None: no table in the map, or none expected (random algorithm, no active backend)."""
        self.topology.node(node)
        svc = self.get(name)
        want = _entries(_State(services={svc.name: svc}), self.topology, node, self.maglev_m, self.cilium)[MAGLEV_MAP]
        try:
            out = {}
            for fe in svc.frontends:
                key = Lb4RevNatKey.make(fe.id)
                expected = want.get(bytes(key))
                out[fe.id] = (self.maps.get(node, MAGLEV_MAP, key), expected[1] if expected else None)
            return out
        finally:
            self.maps.close()

    def lb_command(self, node: str) -> list[str]:
        """The bpftool commands that show the same maps."""
        if isinstance(self.maps, PinnedMaps):
            return [f"bpftool map dump pinned {self.maps.path(node, m)}" for m in (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP)]
        return [f"bpftool map dump pinned <{node} pins>/{m}" for m in (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP)]

    # -- changing ------------------------------------------------------------------
    def add(self, name: str, port: int, backends: Sequence["str | Backend"] = (), vip: str | None = None,
            protocol: str = "TCP", affinity: int = 0, type: str = "ClusterIP", node_port: int | None = None,
            lb_vip: str | None = None, etp: str = "Cluster", algorithm: str = "random") -> Service:
        """Add a service ``name`` on ``port`` with ``backends`` (``'pod:port'``).

        ``vip`` defaults to the next free address from 198.19.0.10; ``affinity`` is
        the session affinity timeout in seconds (0: none). ``type`` is ``'ClusterIP'``,
        ``'NodePort'`` (also a frontend ``nodeIP:node_port`` per node, ``node_port``
        defaulting to the next free one from 30000) or ``'LoadBalancer'`` (a NodePort
        plus ``lb_vip:port``, ``lb_vip`` defaulting to the next free one from 203.0.113.10).
        Every frontend gets its own service id; ``Service.id`` is the ClusterIP one's.
        ``etp`` is the externalTrafficPolicy of the NodePort and LoadBalancer frontends
        (``'Cluster'``, or ``'Local'``: outside clients only reach backends on the node
        they reached); ``algorithm`` how a new flow picks its backend (``'random'`` or
        ``'maglev'``: a Maglev table per frontend in ``cilium_lb4_maglev``).
        """
        _check_name(name)
        type = _check_type(name, type)
        etp = _check_choice(name, "externalTrafficPolicy", etp, TRAFFIC_POLICIES)
        algorithm = _check_choice(name, "algorithm", algorithm, ALGORITHMS)
        if etp == "Local" and type == "ClusterIP":
            raise ConfigError(f"service '{name}': externalTrafficPolicy Local given for a ClusterIP service; "
                              f"expected type NodePort or LoadBalancer")
        protocol = _check_protocol(name, protocol)
        _check_port(f"service '{name}': port", port)
        _check_affinity(name, affinity)
        parsed = self._check_backends(name, backends)
        if vip is not None:
            vip = _check_vip(name, vip)
        if node_port is not None:
            if type == "ClusterIP":
                raise ConfigError(f"service '{name}': node port {node_port!r} given for a ClusterIP service; "
                                  f"expected type NodePort or LoadBalancer")
            _check_node_port(name, node_port)
        if lb_vip is not None:
            if type != "LoadBalancer":
                raise ConfigError(f"service '{name}': LoadBalancer VIP {lb_vip!r} given for a {type} service; "
                                  f"expected type LoadBalancer")
            lb_vip = _check_lb_vip(name, lb_vip)
        with self.store.lock():
            state = self._state()
            if name in state.services:
                old = state.services[name]
                raise ConfigError(f"service '{name}' already exists in lab '{self.lab}' ({old.frontend}); "
                                  f"expected a new name (`labkit service del {name}` removes it)")
            if vip is None:
                vip = self._free_vip(state)
            if type != "ClusterIP":
                if node_port is None:
                    node_port = self._free_node_port(state, protocol, profile(self.cilium).has("lb_proto_keys"))
                else:
                    for other in state.services.values():
                        if other.node_port == node_port and other.protocol == protocol:
                            raise ConfigError(f"service '{name}': node port {node_port}/{protocol} is already "
                                              f"service '{other.name}'; expected a node port no other "
                                              f"{protocol} service uses")
            if type == "LoadBalancer" and lb_vip is None:
                lb_vip = self._free_lb_vip(state)
            wanted = [("ClusterIP", vip, port)]
            if type != "ClusterIP":
                wanted += [("NodePort", n.ip, node_port) for n in self.topology.nodes]
            if type == "LoadBalancer":
                wanted.append(("LoadBalancer", lb_vip, port))
            self._check_frontends_free(state, name, protocol, [(address, p) for _, address, p in wanted])
            used = {i for s in state.services.values() for i in s.ids}
            next_sid = state.next_service_id
            frontends = []
            for fe_type, address, p in wanted:
                sid, next_sid = _allocate(next_sid, used, MAX_SERVICE_ID, "service id")
                used.add(sid)
                frontends.append(Frontend(address, p, fe_type, sid))
            svc = Service(name, vip, port, protocol, tuple(parsed), affinity, frontends[0].id, type,
                          node_port or 0, lb_vip, tuple(frontends), etp, algorithm)
            new, svc = state.with_service(svc, self.topology)
            new = replace(new, next_service_id=next_sid)
            self._commit(state, new, name, f"adding service '{name}'")
        return svc

    def remove(self, name: str) -> None:
        """Remove service ``name`` from every node (head first, then slots, reverse NAT, backends)."""
        with self.store.lock():
            state = self._state()
            svc = self._find(state, name)
            new, _ = state.with_service(svc, self.topology, drop=name)
            self._commit(state, new, name, f"removing service '{name}'")
        self._forget_affinity(svc, {b.id for b in svc.backends})

    def add_backend(self, name: str, backend: "str | Backend", state: str = "active") -> Service:
        """Add one backend (``'pod:port'``) to service ``name``."""
        _check_state(name, state)
        (be,) = self._check_backends(name, [backend])
        be = replace(be, state=state)
        with self.store.lock():
            current = self._state()
            svc = self._find(current, name)
            if any((b.pod, b.port) == (be.pod, be.port) for b in svc.backends):
                raise ConfigError(f"service '{name}': backend '{be.ref}' is already one of its backends")
            return self._change(current, replace(svc, backends=svc.backends + (be,)), f"adding backend '{be.ref}'")

    def remove_backend(self, name: str, backend: "str | Backend") -> Service:
        """Take one backend out of service ``name`` (its id is freed once no service uses it)."""
        with self.store.lock():
            current = self._state()
            svc = self._find(current, name)
            gone = svc.backend(backend)
            out = self._change(current, replace(svc, backends=tuple(b for b in svc.backends if b != gone)),
                               f"removing backend '{gone.ref}'")
        self._forget_affinity(svc, {gone.id})
        return out

    def set_backend_state(self, name: str, backend: "str | Backend", state: str) -> Service:
        """Mark a backend ``'active'`` or ``'terminating'`` (moved after the count: no new connections)."""
        _check_state(name, state)
        with self.store.lock():
            current = self._state()
            svc = self._find(current, name)
            be = svc.backend(backend)
            if be.state == state:
                return svc
            bes = tuple(replace(b, state=state) if b == be else b for b in svc.backends)
            return self._change(current, replace(svc, backends=bes), f"setting backend '{be.ref}' {state}")

    def flush(self) -> None:
        """Remove every service, clear what is left in the LB maps (also the datapath's own
        affinity and socket entries), and start ids from 1 again. ``lab.reset()`` calls this.
        In iptables mode every node gets ``kube-proxy --cleanup`` instead: the next sync is full."""
        with self.store.lock():
            state = self._state()
            if self.mode == "iptables":
                self._cleanup_iptables()
                state = _State()
            for name in list(state.services):
                new, _ = state.with_service(state.services[name], self.topology, drop=name)
                self._commit(state, new, name, f"removing service '{name}'")
                state = new
            try:
                for node in self.topology.nodes:
                    for map_name in LB_MAPS:
                        try:
                            self.maps.clear(node.name, map_name)
                        except NotFoundError:  # a datapath without this map has nothing to clear
                            pass
            finally:
                self.maps.close()
            if self.store.load():
                self.store.save(_State().to_json())

    # -- internals -----------------------------------------------------------------
    def _change(self, state: _State, svc: Service, what: str) -> Service:
        new, svc = state.with_service(svc, self.topology)
        self._commit(state, new, svc.name, f"{what} of service '{svc.name}'")
        return svc

    def _commit(self, old: _State, new: _State, name: str, what: str) -> None:
        """Write the difference between two states to every node, then save ``new``."""
        if self.mode == "iptables":
            return self._commit_iptables(old, new, what)
        was, now = old.services.get(name), new.services.get(name)
        grow = now is not None and (was is None or len(now.active) >= len(was.active))
        txn = _Txn(self.maps)
        node = op = None
        # Nodes differ only for externalTrafficPolicy=Local: otherwise one plan serves every node.
        per_node = any(s.etp == "Local" for st in (old, new) for s in st.services.values())
        plans: dict[str | None, list[_Op]] = {}
        try:
            for node in (n.name for n in self.topology.nodes):
                which = node if per_node else None
                if which not in plans:
                    short = "lb-wrong-count" in self.faults()
                    plans[which] = _plan(_entries(old, self.topology, node, self.maglev_m, self.cilium, short),
                                         _entries(new, self.topology, node, self.maglev_m, self.cilium, short), grow)
                for op in plans[which]:
                    txn.apply(node, op)
            op = None
            self.store.save(new.to_json())
        except BaseException as exc:
            problems = txn.rollback()
            left = f"; could not undo: {'; '.join(problems)}" if problems else "; every map is as it was"
            if isinstance(exc, OSError):
                where = f"{op.map_name} on node '{node}'" if op is not None else f"the service list ({exc.filename})"
                raise DatapathError(f"{what}: writing {where} failed ({exc.strerror or exc}){left}") from exc
            if problems:
                raise DatapathError(f"{what}: {exc}{left}") from exc
            raise
        finally:
            self.maps.close()

    def _commit_iptables(self, old: _State, new: _State, what: str) -> None:
        """kube-proxy's way: one sync per node (partial: the changed services' chains; full the first time
        after ``up`` or ``reset``), then save ``new``. Nothing is written if a changed service cannot be
        rendered; on a failure every node touched gets a full sync of ``old``."""
        from labkit.agent.kubeproxy import changed_services, check_service, sync

        changed = changed_services(old.services, new.services)
        for name in sorted(changed & set(new.services)):
            check_service(new.services[name])
        touched: list[str] = []
        try:
            for node in (n.name for n in self.topology.nodes):
                touched.append(node)
                sync(self.tables(node), new.services.values(), self.topology, node, changed, self.faults())
            self.store.save(new.to_json())
        except BaseException as exc:
            problems = self._resync_iptables(old, touched)
            left = f"; could not undo: {'; '.join(problems)}" if problems else "; the tables are as they were"
            if isinstance(exc, LabkitError) and not isinstance(exc, DatapathError) and not problems:
                raise
            raise DatapathError(f"{what}: {exc}{left}") from exc

    def _cleanup_iptables(self) -> None:
        """CleanupLeftovers on every node: kube-proxy's chains, jumps and canaries go."""
        from labkit.agent.kubeproxy import cleanup

        for node in self.topology.nodes:
            try:
                cleanup(self.tables(node.name))
            except (OSError, LabkitError) as exc:
                raise DatapathError(f"lab '{self.lab}': cleaning kube-proxy's iptables on node '{node.name}' "
                                    f"failed ({exc})") from exc

    def _resync_iptables(self, state: _State, nodes: list[str]) -> list[str]:
        """A full sync of ``state`` on ``nodes`` (kube-proxy's answer to a failed sync); returns what failed."""
        from labkit.agent.kubeproxy import sync

        problems = []
        for node in nodes:
            try:
                sync(self.tables(node), state.services.values(), self.topology, node, None, self.faults())
            except (OSError, LabkitError) as exc:
                problems.append(f"{node}: {exc}")
        return problems

    def iptables(self, node: str, table: str = "nat") -> str:
        """``node``'s ``table`` as kube-proxy mode left it (``iptables-save -t nat`` in its namespace)."""
        self.topology.node(node)
        return self.tables(node).save(table)

    def _forget_affinity(self, svc: Service, backend_ids: set[int]) -> None:
        """Drop clients' affinity to backends that left ``svc`` (best effort: it is a cache)."""
        if not svc.affinity_timeout or not backend_ids:
            return
        try:
            for node in self.topology.nodes:
                for key, value in self.maps.items(node.name, AFFINITY_MAP):
                    if key.rev_nat in svc.ids and value.backend_id in backend_ids:
                        self.maps.delete(node.name, AFFINITY_MAP, key)
        except (OSError, LabkitError):
            pass
        finally:
            self.maps.close()

    def _check_backends(self, name: str, backends: Sequence["str | Backend"]) -> list[Backend]:
        if isinstance(backends, (str, Backend)):
            backends = [backends]
        out: list[Backend] = []
        for spec in backends:
            be = Backend.parse(spec, name)
            try:
                self.topology.pod(be.pod)
            except NotFoundError as exc:
                raise NotFoundError(f"service '{name}': backend '{be.ref}': {exc}") from None
            _check_port(f"service '{name}': backend '{be.ref}' port", be.port)
            _check_state(name, be.state)
            if any((b.pod, b.port) == (be.pod, be.port) for b in out):
                raise ConfigError(f"service '{name}': backend '{be.ref}' is listed twice; expected each once")
            out.append(be)
        return out

    def _check_frontends_free(self, state: _State, name: str, protocol: str, wanted: list[tuple[str, int]]) -> None:
        """ConfigError if one of ``wanted`` (address, port) would take another service's map key. On v1.16
        every key carries protocol 0, so a VIP:port is one key whatever the protocol."""
        proto_keys = profile(self.cilium).has("lb_proto_keys")
        for other in state.services.values():
            for fe in other.frontends:
                for address, p in wanted:
                    if (fe.address, fe.port) != (address, p):
                        continue
                    frontend = _l4(address, p, protocol)
                    if other.protocol == protocol:
                        raise ConfigError(f"service '{name}': frontend {frontend} is already service "
                                          f"'{other.name}'; expected a VIP:port/protocol no other service uses")
                    if not proto_keys:
                        raise ConfigError(
                            f"service '{name}': frontend {frontend} would share its cilium_lb4_services_v2 key "
                            f"with service '{other.name}' ({fe.l4(other.protocol)}): Cilium {self.cilium} writes "
                            f"protocol 0 in every service key, so one VIP:port holds one service whatever its "
                            f"protocol (keys per protocol came with 1.17, cilium/cilium#33434); expected another "
                            f"VIP or port, or a lab of Cilium 1.20 (`labkit up --cilium 1.20`)")

    def _free_node_port(self, state: _State, protocol: str, proto_keys: bool = True) -> int:
        """The first node port no service of ``protocol`` uses (of any protocol without per-protocol keys)."""
        used = {s.node_port for s in state.services.values() if s.protocol == protocol or not proto_keys}
        for p in NODE_PORT_RANGE:
            if p not in used:
                return p
        raise ConfigError(f"no free {protocol} node port left in {NODE_PORT_RANGE.start}-{NODE_PORT_RANGE.stop - 1}")

    def _free_lb_vip(self, state: _State) -> str:
        used = {s.lb_vip for s in state.services.values()}
        ip = FIRST_LB_VIP
        while ip in LB_RANGE and ip != LB_RANGE.broadcast_address:
            if str(ip) not in used:
                return str(ip)
            ip += 1
        raise ConfigError(f"no free LoadBalancer VIP left in {LB_RANGE} from {FIRST_LB_VIP}")

    def _free_vip(self, state: _State) -> str:
        used = {s.vip for s in state.services.values()}
        ip = FIRST_VIP
        while ip in CLUSTERIP_RANGE and ip != CLUSTERIP_RANGE.broadcast_address:
            if str(ip) not in used:
                return str(ip)
            ip += 1
        raise ConfigError(f"no free VIP left in the ClusterIP range {CLUSTERIP_RANGE} from {FIRST_VIP}")


# -- checks --------------------------------------------------------------------------
def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"service name {name!r}: expected a DNS label: lower-case letters, digits and '-', "
                          f"starting with a letter, at most 63 characters")


def _check_type(name: str, type_: str) -> str:
    for t in SERVICE_TYPES:
        if str(type_).lower() == t.lower():
            return t
    raise ConfigError(f"service '{name}': type {type_!r}; expected one of {', '.join(SERVICE_TYPES)}")


def _check_choice(name: str, what: str, value, choices: tuple[str, ...]) -> str:
    """``value`` as spelled in ``choices`` (any case), or a ConfigError listing them."""
    for c in choices:
        if str(value).lower() == c.lower():
            return c
    raise ConfigError(f"service '{name}': {what} {value!r}; expected one of {', '.join(choices)}")


def _check_node_port(name: str, port) -> None:
    lo, hi = NODE_PORT_RANGE.start, NODE_PORT_RANGE.stop - 1
    if isinstance(port, bool) or not isinstance(port, int):
        raise ConfigError(f"service '{name}': node port {port!r} is not a whole number; expected {lo}-{hi}")
    if port not in NODE_PORT_RANGE:
        raise ConfigError(f"service '{name}': node port {port} is outside the node port range; expected {lo}-{hi}")


def _check_lb_vip(name: str, vip: str) -> str:
    return _check_address_in(name, vip, "LoadBalancer VIP", "LoadBalancer", LB_RANGE)


def _check_protocol(name: str, protocol: str) -> str:
    proto = str(protocol).upper()
    if proto not in PROTOCOLS:
        raise ConfigError(f"service '{name}': protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}")
    return proto


def _check_port(what: str, port) -> None:
    if isinstance(port, bool) or not isinstance(port, int):
        raise ConfigError(f"{what} {port!r} is not a whole number; expected 1-65535")
    if not 1 <= port <= 65535:
        raise ConfigError(f"{what} {port} is out of range; expected 1-65535")


def _check_affinity(name: str, seconds) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise ConfigError(f"service '{name}': session affinity timeout {seconds!r}; expected whole seconds")
    if not 0 <= seconds <= MAX_AFFINITY:
        raise ConfigError(f"service '{name}': session affinity timeout {seconds} s; "
                          f"expected 0 (off) to {MAX_AFFINITY} seconds")


def _check_state(name: str, state: str) -> None:
    if state not in STATES:
        raise ConfigError(f"service '{name}': backend state {state!r}; expected one of {', '.join(STATES)}")


def _check_vip(name: str, vip: str) -> str:
    return _check_address_in(name, vip, "VIP", "ClusterIP", CLUSTERIP_RANGE)


def _check_address_in(name: str, vip: str, what: str, range_name: str, network) -> str:
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
