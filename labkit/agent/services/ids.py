"""The agent's state and its ids: services by name, backend ids by ``address:port/protocol``, and the
indexes that make a change cost what it touches, not what the lab holds.

Service ids (1, 2, ...; one per frontend) and backend ids are allocated per lab, the same on every
node; a backend id is shared by every service that uses it and freed when the last one stops.
Allocation is Cilium's IDAllocator: the next id after the last one handed out, skipping those in
use, wrapping to 1 (:func:`allocate`); the set of ids in use is kept, not recomputed.

A change is computed first (:meth:`AgentState.put` / :meth:`AgentState.drop` return a
:class:`Change`: the service before and after, and the journal record that says so), written to
the maps, and only then applied (:meth:`AgentState.apply`), so a refused write leaves the state as
it was. Loading a lab's state replays the same records over its snapshot.

    >>> allocate(3, {1, 3}, 4, 'id')
    (4, 1)
"""
from __future__ import annotations

import functools
import ipaddress
from collections import Counter
from dataclasses import dataclass, replace
from typing import Iterable

from labkit.agent.services.model import FIRST_VIP, MAX_BACKEND_ID, MAX_SERVICE_ID, STATE_VERSION, Service
from labkit.errors import ConfigError
from labkit.net.topology import Topology

__all__ = ["AgentState", "Change", "allocate", "l4_key"]


class _Either:
    """Two sets seen as one (ids in use, and the ones this change is taking), for :func:`allocate`."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __contains__(self, x) -> bool:
        return x in self.a or x in self.b

    def __len__(self) -> int:
        return len(self.a) + len(self.b)


@dataclass(frozen=True)
class Change:
    """One service changing: ``before`` (None: new) and ``after`` (None: removed), in ``state`` (still as
    it was before the change), and ``record``, the journal line that applies it."""

    name: str
    before: Service | None
    after: Service | None
    state: "AgentState"
    record: dict

    def shared(self, bid: int) -> bool | None:
        """Backend ``bid`` as the *other* services see it: None if none uses it, else whether one
        counts it active (a shared backend's row is active while any service still counts it)."""
        users = self.state.by_backend.get(bid, {})
        if len(users) - (self.name in users) == 0:
            return None
        return self.state.active_users[bid] - (bid in self._active_before) > 0

    @functools.cached_property
    def _active_before(self) -> frozenset[int]:
        return frozenset(b.id for b in self.before.backends if b.state == "active") if self.before else frozenset()

    def old_services(self) -> dict:
        """``name -> Service`` before the change (a copy: O(services); kube-proxy's full sync needs it)."""
        return dict(self.state.services)

    def new_services(self) -> dict:
        """``name -> Service`` after the change, in the order the state will hold them."""
        out = dict(self.state.services)
        if self.after is None:
            out.pop(self.name, None)
        else:
            out[self.name] = self.after
        return out


class AgentState:
    """Services by name (in creation order), backend ids by ``address:port/protocol``, the next ids to
    hand out, and indexes: by frontend, by backend id, ids, VIPs and node ports in use."""

    def __init__(self):
        self.services: dict[str, Service] = {}
        self.backend_ids: dict[str, int] = {}  # "ip:port/PROTO" -> id
        self.next_service_id = 1
        self.next_backend_id = 1
        self.order: dict[str, int] = {}  # name -> position (kept when a service is replaced)
        self._seq = 0
        self.by_frontend: dict[tuple[str, int], dict[str, None]] = {}  # (address, port) -> names
        self.by_backend: dict[int, dict[str, None]] = {}  # backend id -> names of the services using it
        self.active_users: Counter = Counter()  # backend id -> how many services count it active
        self.service_ids: set[int] = set()
        self.backend_l4: dict[int, str] = {}  # backend_ids turned round: its keys are the ids in use
        self.vips: Counter = Counter()
        self.lb_vips: Counter = Counter()
        self.node_ports: dict[tuple[str, int], dict[str, None]] = {}  # (protocol, node port) -> names
        self.vip_floor = 0  # every automatic VIP below this offset from the first is taken

    # -- plain data ------------------------------------------------------------------
    @classmethod
    def from_json(cls, data: dict, records: Iterable[dict] = ()) -> "AgentState":
        """A snapshot (``services.json``'s layout, the one labkit always wrote) and the journal after it."""
        state = cls()
        if data:
            for s in data.get("services", []):
                state._index(Service.from_json(s))
            state.backend_ids = {k: int(v) for k, v in data.get("backend_ids", {}).items()}
            state.backend_l4 = {v: k for k, v in state.backend_ids.items()}
            state.next_service_id = int(data.get("next_service_id", 1))
            state.next_backend_id = int(data.get("next_backend_id", 1))
        for rec in records:
            state.apply(rec)
        return state

    def to_json(self) -> dict:
        return {"version": STATE_VERSION, "services": [s.to_json() for s in self.services.values()],
                "backend_ids": self.backend_ids, "next_service_id": self.next_service_id,
                "next_backend_id": self.next_backend_id}

    # -- changes ---------------------------------------------------------------------
    def put(self, svc: Service, topo: Topology, next_service_id: int | None = None) -> Change:
        """``svc`` in (replacing one of its name), with backend ids assigned (a backend keeps an id it
        carries if that id is free); nothing applied yet."""
        before = self.services.get(svc.name)
        next_bid = self.next_backend_id
        taken: dict[str, int] = {}
        bes = []
        for b in svc.backends:
            l4 = l4_key(topo.pod(b.pod).ip, b.port, svc.protocol)
            bid = self.backend_ids.get(l4) or taken.get(l4)
            if bid is None and b.id and b.id not in self.backend_l4 and b.id not in taken.values():
                bid = taken[l4] = b.id  # a service put back as it was (an undone apply) keeps its ids
            if bid is None:
                bid, next_bid = allocate(next_bid, _Either(self.backend_l4, set(taken.values())),
                                         MAX_BACKEND_ID, "backend id")
                taken[l4] = bid
            bes.append(replace(b, id=bid))
        svc = replace(svc, backends=tuple(bes))
        freed = self._freed(before, {b.id for b in svc.backends})
        nsid = self.next_service_id if next_service_id is None else next_service_id
        record = {"op": "put", "service": svc.to_json(), "backend_ids": taken, "freed": freed,
                  "next_service_id": nsid, "next_backend_id": next_bid}
        return Change(svc.name, before, svc, self, record)

    def new_service_ids(self, n: int) -> tuple[list[int], int]:
        """``n`` free service ids from the next one on (a new service's frontends), and the next after them."""
        taken: set[int] = set()
        ids, nxt = [], self.next_service_id
        for _ in range(n):
            sid, nxt = allocate(nxt, _Either(self.service_ids, taken), MAX_SERVICE_ID, "service id")
            taken.add(sid)
            ids.append(sid)
        return ids, nxt

    def drop(self, name: str) -> Change:
        """Service ``name`` out; its backend ids no other service uses are freed."""
        before = self.services[name]
        record = {"op": "del", "name": name, "freed": self._freed(before, set()),
                  "next_service_id": self.next_service_id, "next_backend_id": self.next_backend_id}
        return Change(name, before, None, self, record)

    def _freed(self, before: Service | None, keep: set[int]) -> list[str]:
        """The ``address:port/protocol`` of ``before``'s backend ids that nothing uses once it has ``keep``."""
        if before is None:
            return []
        gone = {b.id for b in before.backends} - keep
        return [self.backend_l4[bid] for bid in sorted(gone)
                if bid in self.backend_l4 and self.by_backend.get(bid, {}).keys() <= {before.name}]

    def apply(self, record: dict, svc: Service | None = None) -> None:
        """Apply a journal record (``svc``: the record's service, already built)."""
        if record["op"] == "put":
            svc = svc if svc is not None else Service.from_json(record["service"])
            old = self.services.get(svc.name)
            if old is not None:
                self._unindex(old)
            self._index(svc)
            for l4, bid in record.get("backend_ids", {}).items():
                self.backend_ids[l4] = int(bid)
                self.backend_l4[int(bid)] = l4
        elif record["op"] == "del":
            old = self.services.get(record["name"])
            if old is not None:
                self._unindex(old)
                del self.services[old.name]
                del self.order[old.name]
        else:
            raise ValueError(f"journal record op {record['op']!r}; expected 'put' or 'del'")
        for l4 in record.get("freed", ()):
            bid = self.backend_ids.pop(l4, None)
            if bid is not None:
                self.backend_l4.pop(bid, None)
        self.next_service_id = int(record["next_service_id"])
        self.next_backend_id = int(record["next_backend_id"])

    # -- indexes ---------------------------------------------------------------------
    def _index(self, svc: Service) -> None:
        if svc.name not in self.order:
            self._seq += 1
            self.order[svc.name] = self._seq
        self.services[svc.name] = svc
        for fe in svc.frontends:
            self.by_frontend.setdefault((fe.address, fe.port), {})[svc.name] = None
            self.service_ids.add(fe.id)
        for b in svc.backends:
            self.by_backend.setdefault(b.id, {})[svc.name] = None
            if b.state == "active":
                self.active_users[b.id] += 1
        self.vips[svc.vip] += 1
        if svc.lb_vip:
            self.lb_vips[svc.lb_vip] += 1
        if svc.node_port:
            self.node_ports.setdefault((svc.protocol, svc.node_port), {})[svc.name] = None

    def _unindex(self, svc: Service) -> None:
        for fe in svc.frontends:
            _forget(self.by_frontend, (fe.address, fe.port), svc.name)
            self.service_ids.discard(fe.id)
        for b in svc.backends:
            _forget(self.by_backend, b.id, svc.name)
            if b.state == "active":
                _uncount(self.active_users, b.id)
        _uncount(self.vips, svc.vip)
        if svc.vip not in self.vips:  # an automatic VIP below the floor is free again
            off = int(ipaddress.IPv4Address(svc.vip)) - int(FIRST_VIP)
            if 0 <= off < self.vip_floor:
                self.vip_floor = off
        if svc.lb_vip:
            _uncount(self.lb_vips, svc.lb_vip)
        if svc.node_port:
            _forget(self.node_ports, (svc.protocol, svc.node_port), svc.name)

    def first(self, names) -> str:
        """Of ``names``, the one added first (errors name it, as a scan in creation order would)."""
        return min(names, key=self.order.__getitem__)


def _forget(index: dict, key, name: str) -> None:
    names = index.get(key)
    if names is not None:
        names.pop(name, None)
        if not names:
            del index[key]


def _uncount(counter: Counter, key) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


def l4_key(ip: str, port: int, proto: str) -> str:
    return f"{ip}:{port}/{proto}"


def allocate(start: int, used, limit: int, what: str) -> tuple[int, int]:
    """The first free id from ``start`` on, wrapping to 1; returns (id, the next start)."""
    candidate = start if 1 <= start <= limit else 1
    for _ in range(len(used) + 1):
        if candidate not in used:
            return candidate, candidate % limit + 1
        candidate = candidate % limit + 1
    raise ConfigError(f"no free {what}: all {limit} are in use")
