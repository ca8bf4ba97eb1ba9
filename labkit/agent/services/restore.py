"""The Services agent's restart: its state from the journal and the pinned maps, then only the rows
that are wrong rewritten, as cilium-agent restores its services and their ids from its BPF maps.

:func:`recover` replays the snapshot and journal as far as they can be trusted
(:meth:`labkit.agent.services.store.JsonStore.scan`), reads what every node's ``cilium_lb4_*`` maps
hold, and returns the state to serve: the journal's, corrected by the maps. Which wins, service by service:

- a node holds the journal's service exactly as :func:`plan.entries` writes it: the journal's (the
  other nodes' rows for it are wrong; :func:`sync` rewrites them);
- the maps hold some of its frontends' heads but not all (no change removes a frontend), or no node
  holds whole, plausible rows for it (a slot deleted, a count changed): the journal's, likewise;
- a node holds whole rows for it that say something else (more backends, other states): the maps'
  (the journal lost the change; it is damaged);
- the maps hold a service the replayed journal lacks: rebuilt from a node's rows, named from a
  journal record with the same ids (one after the damage, say) or ``restored-<id>``; damaged;
- the journal has a service no node's maps hold at all: kept while the journal is whole (the
  datapath was reloaded; :func:`sync` writes it), dropped when it is damaged or ends in a torn line
  (its removal may be what was lost).

:func:`sync` then makes every node hold exactly ``entries(state)``, writing only the rows that
are missing or differ, in the datapath-safe order of :func:`labkit.agent.services.plan.plan`.
:func:`check` is the read-only part, for ``labkit doctor``; :func:`rebuild_store` replaces a
damaged journal by a snapshot of the recovered state.

    >>> from labkit.agent.services import MemoryStore, Services
    >>> from labkit.net.topology import Topology
    >>> svcs = Services.in_memory(Topology.default())
    >>> _ = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    >>> r = recover(svcs.store, svcs.maps, svcs.topology)
    >>> r.source, r.damaged, r.problems, list(r.state.services)
    ('journal', False, [], ['web'])
    >>> sync(r.state, svcs.maps, svcs.topology).written
    {'node-a': 0, 'node-b': 0}
    >>> lost = recover(MemoryStore(), svcs.maps, svcs.topology)  # no journal: rebuilt from the maps
    >>> lost.source, lost.damaged, [(s.name, s.ids, [b.ref for b in s.backends]) for s in lost.state.services.values()]
    ('maps', True, [('restored-1', (1,), ['b1:8080', 'b2:8080'])])
"""
from __future__ import annotations

from dataclasses import dataclass, field

from labkit.agent.services.ids import AgentState, l4_key
from labkit.agent.services.lbmaps import MapWriter, Txn
from labkit.agent.services.model import MAX_BACKEND_ID, MAX_SERVICE_ID, SURROGATE, Backend, Frontend, Service
from labkit.agent.services.plan import ROW_MAPS, Entries, change_entries, entries, plan
from labkit.agent.services.store import Scan, ServiceStore
from labkit.errors import DatapathError, LabkitError, NotFoundError
from labkit.maglev import LAB_DEFAULT_M
from labkit.maps.lb import (
    AFFINITY_MATCH_MAP,
    BACKENDS_MAP,
    MAGLEV_MAP,
    REVNAT_MAP,
    SERVICES_MAP,
    Lb4BackendKey,
    Lb4Key,
    Lb4RevNatKey,
    LookupScope,
    ServiceFlags,
    ServiceFlags2,
    proto_number,
)
from labkit.net.topology import Topology
from labkit.release import DEFAULT_RELEASE, profile

__all__ = ["Recovery", "SyncReport", "recover", "sync", "check", "matches", "rebuild_store", "read_rows", "ROW_MAPS"]

#: The maps a node's services live in, in the order problems are listed.
#: Maps a datapath may lack (built before it had them): read as empty.
_OPTIONAL_MAPS = (MAGLEV_MAP, AFFINITY_MATCH_MAP)
#: Row problems listed per node before the rest are counted.
MAX_ROW_PROBLEMS = 20
_PROTO_NAMES = {6: "TCP", 17: "UDP"}


@dataclass
class Recovery:
    """What :func:`recover` found: the ``state`` to serve, ``problems`` (sentences naming the file and
    line or the node, map and key, what was expected and what was found), where the services came
    from (``source``: 'journal', 'maps' or 'journal+maps') and whether the journal can be trusted
    (``damaged``: unreadable, a gap, or corrected by the maps)."""

    state: AgentState
    problems: list[str]
    source: str
    damaged: bool


@dataclass
class SyncReport:
    """Rows :func:`sync` wrote, deleted and left alone, per node."""

    written: dict[str, int] = field(default_factory=dict)
    deleted: dict[str, int] = field(default_factory=dict)
    unchanged: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        return "; ".join(f"{n}: {self.written[n]} written, {self.deleted[n]} deleted, {self.unchanged[n]} unchanged"
                         for n in self.written)


@dataclass(frozen=True)
class _Head:
    """One frontend as a node's maps hold it: its head (slot 0), and the backends its full scope lists."""

    id: int
    address: str
    port: int
    proto: int
    flags: int
    flags2: int
    affinity: int
    listed: tuple[int, ...]  # backend ids, slot 1 first (the internal scope of a two-scope frontend)
    count: int  # how many of them are active

    @property
    def type(self) -> str:
        if self.flags & ServiceFlags.LOADBALANCER:
            return "LoadBalancer"
        if self.flags & ServiceFlags.NODEPORT:
            return "NodePort"
        return "ClusterIP"


# -- reading -----------------------------------------------------------------------
def read_rows(maps: MapWriter, node: str) -> Entries:
    """Every row of ``node``'s service maps, as :func:`labkit.agent.services.plan.entries` lays them out
    (a datapath without a Maglev map has no Maglev rows)."""
    out: Entries = {}
    for map_name in ROW_MAPS:
        try:
            items = maps.items(node, map_name)
        except (NotFoundError, FileNotFoundError):
            if map_name not in _OPTIONAL_MAPS:
                raise
            items = []
        out[map_name] = {bytes(k): (k, v) for k, v in items}
    return out


def _heads(rows: Entries) -> dict[int, _Head]:
    """Service id → its frontend, for every external-scope head in ``rows``."""
    slots: dict[tuple, dict[int, object]] = {}
    for key, value in rows[SERVICES_MAP].values():
        slots.setdefault(key.ident, {})[key.backend_slot] = value
    out: dict[int, _Head] = {}
    for ident, by_slot in sorted(slots.items()):
        head = by_slot.get(0)
        if head is None or ident[3] != LookupScope.EXT or head.rev_nat in out:
            continue
        full = by_slot
        if head.flags2 & ServiceFlags2.TWO_SCOPES:
            full = slots.get(ident[:3] + (LookupScope.INT,), by_slot)
        listed, n = [], 1
        while n in full:
            listed.append(full[n].backend_id)
            n += 1
        key = Lb4Key(address=ident[0], dport=ident[1], proto=ident[2])
        out[head.rev_nat] = _Head(head.rev_nat, key.vip, key.port, ident[2], head.flags, head.flags2,
                                  head.backend_id if head.flags & ServiceFlags.AFFINITY else 0, tuple(listed),
                                  full.get(0, head).count)
    return out


class _Ctx:
    """What recovering needs besides the rows: the topology, the release, the Maglev size, and the
    services the journal ever named (by their ids)."""

    def __init__(self, topology: Topology, cilium: str, maglev_m: int):
        self.topology, self.cilium, self.maglev_m = topology, cilium, maglev_m
        self.proto_keys = profile(cilium).has("lb_proto_keys")
        self.pods = {p.name for p in topology.pods}
        self.known: dict[tuple[int, ...], Service] = {}
        self.by_ident: dict[str, dict[tuple, dict]] = {}  # node -> a frontend's key ident -> its slots' rows

    def index(self, node: str, rows: Entries) -> None:
        """Index ``node``'s service rows by frontend (what :func:`_owned` looks up)."""
        idx: dict[tuple, dict] = {}
        for raw, (key, value) in rows[SERVICES_MAP].items():
            idx.setdefault(key.ident, {})[raw] = (key, value)
        self.by_ident[node] = idx

    def wire(self, svc: Service) -> int:
        return proto_number(svc.protocol) if self.proto_keys else 0

    def learn(self, svc: Service) -> None:
        self.known[svc.ids] = svc

    def pod_at(self, ip: str) -> str | None:
        owner = self.topology.owner_of(ip)
        return owner if owner in self.pods else None

    def rows_of(self, svc: Service, node: str) -> Entries:
        """The rows ``svc`` alone would have ``node`` hold (backends as it counts them)."""
        return change_entries(svc, lambda bid: None, self.topology, node, self.maglev_m, self.cilium)


def _owned(svc: Service, node: str, rows: Entries, ctx: _Ctx) -> Entries:
    """The rows of ``rows`` (``node``'s) that are ``svc``'s own: its frontends' slots in either scope,
    its reverse NAT and Maglev rows, and the backends it lists."""
    wire = ctx.wire(svc)
    by_ident = ctx.by_ident[node]
    out: Entries = {SERVICES_MAP: {}, REVNAT_MAP: {}, MAGLEV_MAP: {}, BACKENDS_MAP: {}, AFFINITY_MATCH_MAP: {}}
    ids = set(svc.ids)
    out[AFFINITY_MATCH_MAP] = {raw: kv for raw, kv in rows[AFFINITY_MATCH_MAP].items() if kv[0].rev_nat in ids}
    for fe in svc.frontends:
        for scope in LookupScope:
            out[SERVICES_MAP].update(by_ident.get(Lb4Key.make(fe.address, fe.port, wire, scope=scope).ident, {}))
        raw = bytes(Lb4RevNatKey.make(fe.id))
        for map_name in (REVNAT_MAP, MAGLEV_MAP):
            if raw in rows[map_name]:
                out[map_name][raw] = rows[map_name][raw]
    for b in svc.backends:
        raw = bytes(Lb4BackendKey(b.id))
        if raw in rows[BACKENDS_MAP]:
            out[BACKENDS_MAP][raw] = rows[BACKENDS_MAP][raw]
    return out


def _raw(rows: dict) -> dict[bytes, bytes]:
    return {raw: bytes(value) for raw, (_, value) in rows.items()}


def _matches(svc: Service, node: str, rows: Entries, ctx: _Ctx) -> bool:
    """Whether ``node`` holds ``svc``'s own rows exactly (a shared backend's state aside: another
    service may count it active)."""
    want, have = ctx.rows_of(svc, node), _owned(svc, node, rows, ctx)
    for map_name in (SERVICES_MAP, REVNAT_MAP, MAGLEV_MAP, AFFINITY_MATCH_MAP):
        if _raw(want[map_name]) != _raw(have[map_name]):
            return False
    for raw, (_, value) in want[BACKENDS_MAP].items():
        got = have[BACKENDS_MAP].get(raw)
        if got is None or (got[1].address, got[1].port, got[1].proto) != (value.address, value.port, value.proto):
            return False
    return True


def _rebuild(name: str, heads: list[_Head], rows: Entries, ctx: _Ctx, maglev_ids: set[int],
             known: Service | None) -> tuple[Service, list[str]]:
    """The service one node's rows spell for the frontends ``heads`` (the ClusterIP one first), and what
    could not be read back (a backend row missing, an address that is no pod). What the rows do not
    say comes from ``known`` (the journal's record with these ids), else a default: the protocol on
    v1.16, whose keys carry 0 (TCP), and the algorithm of a service with no active backend (random)."""
    first = heads[0]
    problems = []
    protocol = _PROTO_NAMES.get(first.proto) if ctx.proto_keys else None
    protocol = protocol or (known.protocol if known else "TCP")
    by_id = {b.id: b for b in known.backends} if known else {}
    backends = []
    for i, bid in enumerate(first.listed):
        state = "active" if i < first.count else "terminating"
        row = rows[BACKENDS_MAP].get(bytes(Lb4BackendKey(bid)))
        pod = ctx.pod_at(row[1].ip) if row else None
        if row is None or pod is None:
            found = "no row" if row is None else f"{row[1].l4addr}, no pod's address"
            if bid in by_id:
                backends.append(Backend(by_id[bid].pod, by_id[bid].port, state, bid))
                continue
            problems.append(f"service '{name}' slot {i + 1} of id {first.id}: expected backend {bid} to be a pod's "
                            f"address:port, found {found}; the backend is left out")
            continue
        backends.append(Backend(pod, row[1].host_port, state, bid))
    fes = tuple(Frontend(h.address, h.port, h.type, h.id) for h in heads)
    types = {h.type for h in heads}
    svc_type = "LoadBalancer" if "LoadBalancer" in types else "NodePort" if "NodePort" in types else "ClusterIP"
    node_port = next((h.port for h in heads if h.type == "NodePort"), 0)
    lb_vip = next((h.address for h in heads if h.type == "LoadBalancer"), None)
    local = any(h.flags & ServiceFlags.EXT_LOCAL_SCOPE for h in heads)
    maglev = bool(maglev_ids & {h.id for h in heads}) or (known is not None and known.algorithm == "maglev")
    svc = Service(name, first.address, first.port, protocol, tuple(backends), first.affinity, first.id, svc_type,
                  node_port, lb_vip, fes, "Local" if local else "Cluster", "maglev" if maglev else "random")
    return svc, problems


def _groups(heads: dict[int, _Head], ctx: _Ctx, order: list[Service]) -> list[tuple[tuple[int, ...], Service | None]]:
    """The maps' frontends grouped into services, each with the journal's service it is (or None).

    A service of the replayed journal claims the frontends of its ids the maps hold at its addresses
    (its ClusterIP one among them); a service only a journal record names claims them if the maps hold
    every one. What is left is grouped as a new service is written: a ClusterIP frontend and the
    NodePort and LoadBalancer frontends after it, with the next ids and the same backends."""
    free = dict(sorted(heads.items()))
    out: list[tuple[tuple[int, ...], Service | None]] = []

    def at(i: int, fe: Frontend) -> bool:
        return i in free and (free[i].address, free[i].port) == (fe.address, fe.port)

    for svc in order:
        present = tuple(i for i, fe in zip(svc.ids, svc.frontends) if at(i, fe))
        if present and present[0] == svc.ids[0]:
            out.append((present, svc))
            for i in present:
                del free[i]
    for ids, svc in ctx.known.items():
        if all(at(i, fe) for i, fe in zip(ids, svc.frontends)):
            out.append((ids, None))
            for i in ids:
                del free[i]
    ids_left = list(free)
    while ids_left:
        group = [ids_left.pop(0)]
        head = free[group[0]]
        while ids_left and ids_left[0] == group[-1] + 1:
            nxt = free[ids_left[0]]
            if nxt.type == "ClusterIP" or nxt.listed != head.listed or (nxt.type == "NodePort" and
                                                                         free[group[-1]].type == "LoadBalancer"):
                break
            group.append(ids_left.pop(0))
        out.append((tuple(group), None))
    return out


def _plausible(svc: Service, topology: Topology) -> bool:
    """Whether the agent could have written ``svc``: its ClusterIP frontend first, then one NodePort
    frontend per node and the surrogate 0.0.0.0 (a NodePort or LoadBalancer service; services written
    before labkit had the surrogate lack it), then one LoadBalancer frontend (a LoadBalancer)."""
    types = [fe.type for fe in svc.frontends]
    if svc.type == "ClusterIP":
        return types == ["ClusterIP"]
    nodes = [fe.address for fe in svc.frontends if fe.type == "NodePort"]
    tail = ["LoadBalancer"] if svc.type == "LoadBalancer" else []
    ips = [n.ip for n in topology.nodes]
    return (types == ["ClusterIP"] + ["NodePort"] * len(nodes) + tail
            and nodes in (ips, ips + [SURROGATE])
            and len({fe.port for fe in svc.frontends if fe.type == "NodePort"}) == 1)


def _replay(scan: Scan, ctx: _Ctx, journal: str) -> tuple[AgentState, list[str]]:
    """The scan's snapshot with its records applied, stopping at one that cannot be."""
    problems: list[str] = []
    try:
        state = AgentState.from_json(scan.snapshot)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        problems.append(f"services snapshot: expected services a service list can hold, found "
                        f"{type(exc).__name__}: {exc}")
        state = AgentState()
    for svc in state.services.values():
        ctx.learn(svc)
    for n, rec in enumerate(scan.records, start=1):
        try:
            state.apply(rec)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            problems.append(f"{journal} record {n} (seq {rec.get('seq', '?')}): expected a record that applies, "
                            f"found {type(exc).__name__}: {exc}; replay stops there")
            break
        if rec.get("op") == "put":
            ctx.learn(state.services[rec["service"]["name"]])
    for rec in scan.later:
        try:
            if rec.get("op") == "put":
                ctx.learn(Service.from_json(rec["service"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            pass
    return state, problems


# -- recovering --------------------------------------------------------------------
def recover(store: ServiceStore, maps: MapWriter, topology: Topology, cilium: str = DEFAULT_RELEASE,
            maglev_m: int = LAB_DEFAULT_M) -> Recovery:
    """The state to serve after a restart: the journal's, corrected by what every node's maps hold.

    Reads only: nothing is written to the store or the maps."""
    ctx = _Ctx(topology, profile(cilium).release, maglev_m)
    scan = store.scan()
    journal = str(getattr(store, "journal", "journal"))
    problems = list(scan.problems)
    damaged = scan.damaged
    state, bad = _replay(scan, ctx, journal)
    problems += bad
    damaged = damaged or bool(bad)
    nodes = [n.name for n in topology.nodes]
    try:
        rows = {node: read_rows(maps, node) for node in nodes}
    finally:
        maps.close()
    for node in nodes:
        ctx.index(node, rows[node])
    heads = {node: _heads(rows[node]) for node in nodes}
    maglev_ids = {k.rev_nat for node in nodes for k, _ in rows[node][MAGLEV_MAP].values()}
    union: dict[int, _Head] = {}  # each frontend as the node that lists the most slots for it holds it
    for node in nodes:
        for i, h in heads[node].items():
            if i not in union or len(h.listed) > len(union[i].listed):
                union[i] = h

    kept: dict[str, Service] = {}
    from_maps: set[str] = set()
    claimed: set[int] = set()
    for ids, journal_svc in _groups(union, ctx, list(state.services.values())):
        claimed.update(ids)
        holding = [n for n in nodes if all(i in heads[n] for i in ids)] or [n for n in nodes if ids[0] in heads[n]]
        if journal_svc is not None and (ids != journal_svc.ids or
                                        any(_matches(journal_svc, n, rows[n], ctx) for n in holding)):
            # A node holds it as the journal says (the others' rows are wrong), or the maps lost some of its
            # frontends (no change removes a frontend: a service keeps its ids until it goes).
            kept[journal_svc.name] = journal_svc
            continue
        known = journal_svc or ctx.known.get(ids)
        name = known.name if known is not None else f"restored-{ids[0]}"
        if name in kept or (journal_svc is None and name in state.services and state.services[name].ids != ids):
            name = f"restored-{ids[0]}"
        best = None
        for n in holding:
            # every frontend as some node holds it: a node's maps hold only its own NodePort address
            cand, why = _rebuild(name, [heads[n][i] if i in heads[n] else union[i] for i in ids
                                        if i in heads[n] or i in union], rows[n], ctx, maglev_ids, known)
            if _matches(cand, n, rows[n], ctx) and _plausible(cand, topology):
                best = (cand, why, n)
                break
            best = best or (cand, why, n)
        cand, why, n = best
        consistent = _matches(cand, n, rows[n], ctx) and _plausible(cand, topology)
        where = f"ids {', '.join(map(str, ids))}"
        if journal_svc is not None and not consistent:
            kept[journal_svc.name] = journal_svc  # a row or two wrong: the journal's version, sync rewrites them
            continue
        kept[name] = cand
        from_maps.add(name)
        problems += why
        damaged = True
        if journal_svc is not None:
            problems.append(f"service '{name}' ({where}): the journal says {journal_svc}; node {n}'s maps hold "
                            f"{cand}; the maps' version is kept")
        else:
            problems.append(f"service id {ids[0]} ({cand.frontend}): node {n}'s maps hold it, the replayed journal "
                            f"lacks it; restored from the maps as {cand}")

    order = list(state.services)
    for name in order:
        svc = state.services[name]
        if name in kept or not set(svc.ids) & claimed:
            continue
        problems.append(f"service '{name}' (ids {', '.join(map(str, svc.ids))}): the journal says {svc}; the maps "
                        f"give its ids to another service, which is kept")
        damaged = True
    gone = [s for name, s in state.services.items() if name not in kept and not set(s.ids) & claimed]
    for svc in gone:
        if damaged or scan.torn:
            problems.append(f"service '{svc.name}' (ids {', '.join(map(str, svc.ids))}): the journal has it, no "
                            f"node's maps hold it, and the journal cannot be trusted; dropped")
        else:
            kept[svc.name] = svc
            problems.append(f"service '{svc.name}' (ids {', '.join(map(str, svc.ids))}): the journal has it, no "
                            f"node's maps hold it; sync writes it")
    services = [kept[n] for n in order if n in kept] + sorted(
        (s for n, s in kept.items() if n not in state.services), key=lambda s: s.id)
    out = _state(services, state, rows, topology)
    for node in nodes:
        problems += _row_problems(node, entries(out, topology, node, maglev_m, ctx.cilium), rows[node])
    source = "journal" if not from_maps else "maps" if len(from_maps) == len(services) else "journal+maps"
    return Recovery(out, problems, source, damaged)


def _state(services: list[Service], journal: AgentState, rows: dict[str, Entries], topology: Topology) -> AgentState:
    """An AgentState holding ``services``, with backend ids from their backends and next ids above every
    id the maps or the journal use."""
    backend_ids = {}
    for svc in services:
        for b in svc.backends:
            backend_ids[l4_key(topology.pod(b.pod).ip, b.port, svc.protocol)] = b.id
    sids = {i for s in services for i in s.ids}
    sids |= {k.rev_nat for r in rows.values() for m in (REVNAT_MAP, MAGLEV_MAP, AFFINITY_MATCH_MAP)
             for k, _ in r[m].values()}
    sids |= {v.rev_nat for r in rows.values() for _, v in r[SERVICES_MAP].values()}
    bids = set(backend_ids.values()) | {k.backend_id for r in rows.values() for k, _ in r[BACKENDS_MAP].values()}
    return AgentState.from_json({
        "services": [s.to_json() for s in services], "backend_ids": backend_ids,
        "next_service_id": _above(journal.next_service_id, sids, MAX_SERVICE_ID),
        "next_backend_id": _above(journal.next_backend_id, bids, MAX_BACKEND_ID)})


def _above(nxt: int, used: set[int], limit: int) -> int:
    """``nxt``, or one past the highest id in ``used`` if that is not below it (wrapping at ``limit``)."""
    top = max(used, default=0)
    if nxt > top:
        return nxt
    return top + 1 if top < limit else 1


def _row_problems(node: str, want: Entries, have: Entries) -> list[str]:
    """One sentence per row ``node`` holds wrong: missing, different, or not wanted."""
    out = []
    for map_name in ROW_MAPS:
        w, h = want[map_name], have[map_name]
        for raw, (key, value) in w.items():
            got = h.get(raw)
            if got is None:
                out.append(f"node {node} {map_name} {key}: expected {value}, found no row; sync writes it")
            elif bytes(got[1]) != bytes(value):
                out.append(f"node {node} {map_name} {key}: expected {value}, found {got[1]}; sync rewrites it")
        for raw, (key, value) in h.items():
            if raw not in w:
                out.append(f"node {node} {map_name} {key}: expected no row, found {value}; sync deletes it")
    if len(out) > MAX_ROW_PROBLEMS:
        out = out[:MAX_ROW_PROBLEMS] + [f"node {node}: {len(out) - MAX_ROW_PROBLEMS} more rows differ"]
    return out


def check(store: ServiceStore, maps: MapWriter, topology: Topology, cilium: str = DEFAULT_RELEASE,
          maglev_m: int = LAB_DEFAULT_M) -> list[str]:
    """The problems :func:`recover` reports, for ``labkit doctor`` (reads only).

    >>> from labkit.agent.services import Services
    >>> from labkit.net.topology import Topology
    >>> svcs = Services.in_memory(Topology.default())
    >>> _ = svcs.add("web", 80, ["b1:8080"])
    >>> svcs.maps.clear("node-b", REVNAT_MAP)
    1
    >>> check(svcs.store, svcs.maps, svcs.topology)
    ['node node-b cilium_lb4_reverse_nat rev_nat 1: expected 198.19.0.10:80, found no row; sync writes it']
    """
    return recover(store, maps, topology, cilium, maglev_m).problems


def matches(state: AgentState, maps: MapWriter, topology: Topology, cilium: str = DEFAULT_RELEASE,
            maglev_m: int = LAB_DEFAULT_M) -> bool:
    """True if every node's service maps hold exactly ``entries(state)``, byte for byte: what a restarted
    agent checks first (one batched read per map, the rows computed once for all nodes unless a service
    has externalTrafficPolicy=Local or a NodePort: nodes hold their own NodePort addresses). When it holds, nothing needs writing and :func:`recover` is not needed.

    >>> from labkit.agent.services import Services
    >>> from labkit.net.topology import Topology
    >>> svcs = Services.in_memory(Topology.default())
    >>> _ = svcs.add("web", 80, ["b1:8080"])
    >>> matches(svcs._state(), svcs.maps, svcs.topology)
    True
    """
    cilium = profile(cilium).release
    per_node = any(s.etp == "Local" or s.node_port for s in state.services.values())
    want: dict[str, dict[bytes, bytes]] | None = None
    try:
        for node in (n.name for n in topology.nodes):
            if want is None or per_node:
                rows = entries(state, topology, node, maglev_m, cilium)
                want = {m: {raw: bytes(v) for raw, (_, v) in rows[m].items()} for m in ROW_MAPS}
            for map_name in ROW_MAPS:
                try:
                    have = maps.raw(node, map_name)
                except (NotFoundError, FileNotFoundError):
                    if map_name not in _OPTIONAL_MAPS:
                        raise
                    have = {}
                if have != want[map_name]:
                    return False
        return True
    finally:
        maps.close()


# -- writing -----------------------------------------------------------------------
def sync(state: AgentState, maps: MapWriter, topology: Topology, cilium: str = DEFAULT_RELEASE,
         maglev_m: int = LAB_DEFAULT_M) -> SyncReport:
    """Make every node's service maps hold exactly ``entries(state)``: rows missing or different (compared
    byte for byte) are written, rows not wanted deleted, a correct row never touched; backends and slots
    before the heads that count them, heads deleted before their slots (:func:`plan.plan`). If the kernel
    refuses a write, every write is undone and DatapathError says which."""
    cilium = profile(cilium).release
    report = SyncReport()
    txn = Txn(maps)
    node = op = None
    try:
        for node in (n.name for n in topology.nodes):
            want, have = entries(state, topology, node, maglev_m, cilium), read_rows(maps, node)
            ops = plan(have, want, grow=True)
            for op in ops:
                txn.apply(node, op)
            op = None
            report.written[node] = sum(o.value is not None for o in ops)
            report.deleted[node] = sum(o.value is None for o in ops)
            report.unchanged[node] = sum(raw in have[m] and bytes(have[m][raw][1]) == bytes(v)
                                         for m in ROW_MAPS for raw, (_, v) in want[m].items())
    except (OSError, LabkitError) as exc:
        left = txn.rollback()
        undo = f"; could not undo: {'; '.join(left)}" if left else "; every map is as it was"
        where = f"{op.map_name} {op.key} on node '{node}'" if op is not None else f"the maps of node '{node}'"
        raise DatapathError(f"syncing services: writing {where} failed ({exc}){undo}") from exc
    finally:
        maps.close()
    return report


def rebuild_store(store: ServiceStore, state: AgentState) -> None:
    """Replace the snapshot by ``state`` and empty the journal (a damaged journal becomes one that
    matches the maps).

    >>> from labkit.agent.services import MemoryStore
    >>> store = MemoryStore()
    >>> store.records = [{"seq": 1, "op": "put"}]  # a record that cannot be replayed
    >>> store.scan().damaged
    True
    >>> rebuild_store(store, AgentState())
    >>> store.records, store.scan().damaged
    ([], False)
    """
    with store.lock():
        store.save(state.to_json())
