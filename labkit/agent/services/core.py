"""The Services agent itself: see :mod:`labkit.agent.services` for what it writes and why."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator, Sequence

from labkit.agent.kubeproxy import NetnsIptables
from labkit.agent.services.ids import AgentState, Change, l4_key
from labkit.agent.services.iptables import IptablesWriter
from labkit.agent.services.lbmaps import LbMapsWriter, MapWriter, MemoryMaps, PinnedMaps
from labkit.agent.services.model import (
    ALGORITHMS,
    FIRST_LB_VIP,
    FIRST_VIP,
    NODE_PORT_RANGE,
    PROTOCOLS,
    SURROGATE,
    TRAFFIC_POLICIES,
    Backend,
    Frontend,
    Service,
    check_affinity,
    check_choice,
    check_lb_vip,
    check_name,
    check_node_port,
    check_port,
    check_protocol,
    check_state,
    check_type,
    check_vip,
)
from labkit.agent.services.plan import change_entries
from labkit.agent.services.store import COMPACT_MIN, COMPACT_RATIO, JsonStore, Mark, MemoryStore, ServiceStore
from labkit.errors import ConfigError, NotFoundError
from labkit.maglev import LAB_DEFAULT_M
from labkit.maps.lb import (AFFINITY_MATCH_MAP, BACKENDS_MAP, LB_MAPS, MAGLEV_MAP, REVNAT_MAP, SERVICES_MAP, LbSnapshot,
                            Lb4RevNatKey, MaglevLut)
from labkit.net.topology import CLUSTERIP_RANGE, LB_RANGE, Topology
from labkit.release import DEFAULT_RELEASE, profile



__all__ = ["Services", "APPLY_CHUNK"]

#: An apply writes its new services this many at a time (each batch heads last), so its peak memory is
#: bounded whatever the number of services; the call stays all or nothing.
APPLY_CHUNK = 4096


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
        #: the lab's agent faults, asked at every change (break-it exercises: ``lb-wrong-count``, ``kp-no-masq``)
        self.faults = faults or (lambda: [])
        #: where changes go, chosen once: the cilium_lb4_* maps ('ebpf'), or kube-proxy's tables on every node
        #: ('iptables': no LB map entry)
        self.writer = (IptablesWriter(tables, topology, lab, self.faults) if mode == "iptables" else
                       LbMapsWriter(maps, topology, maglev_m, self.cilium, self.faults))
        #: iptables mode: ``tables(node)`` is that node's iptables (:class:`labkit.agent.kubeproxy.Iptables`)
        self.tables = self.writer.tables if mode == "iptables" else tables
        self._table: AgentState | None = None  # the services in memory, with their indexes
        self._mark: Mark | None = None  # how far into the store they are

    @property
    def mode(self) -> str:
        """'ebpf' or 'iptables': which writer this agent has."""
        return self.writer.mode

    def __repr__(self) -> str:
        return f"Services(lab={self.lab!r}, services={[s.name for s in self.list()]})"

    @classmethod
    def for_lab(cls, lab, keep_open: bool = False) -> "Services":
        """The agent of a running :class:`~labkit.lab.Lab` (or anything with its ``name``, ``topology``,
        ``config``, ``pin_dir`` and ``agent_faults``): its pinned maps, its services.json. ``keep_open``: the
        maps stay open between calls (the agent process)."""
        pins = {n.name: lab.pin_dir(n.name) for n in lab.topology.nodes}
        m = lab.config.maglev_table_size
        mode = getattr(lab.config, "service_mode", "ebpf")
        tables = lambda node: NetnsIptables(lab.topology.netns(node))  # noqa: E731
        return cls(lab.name, lab.topology, PinnedMaps(pins, m, keep_open), JsonStore(lab.name), m, mode, tables,
                   lab.config.profile.release, lab.agent_faults)

    @classmethod
    def in_memory(cls, topology: Topology, cilium: str = DEFAULT_RELEASE, maglev_m: int = LAB_DEFAULT_M,
                  mode: str = "ebpf") -> "Services":
        """An agent of release ``cilium`` writing into :class:`MemoryMaps` (or with ``mode='iptables'`` into
        in-memory tables) and a :class:`MemoryStore` (no kernel)."""
        return cls(topology.lab, topology, MemoryMaps(n.name for n in topology.nodes), MemoryStore(), maglev_m,
                   mode=mode, cilium=cilium)

    # -- reading -------------------------------------------------------------------
    def _state(self) -> AgentState:
        """The services as the store has them now: the records other processes appended since this
        agent last looked are replayed over its state in memory (all of it only when the snapshot changed)."""
        try:
            snap, records, mark = self.store.load(self._mark)
            if snap is not None or self._table is None:
                self._table = AgentState.from_json(snap or {}, records)
            else:
                for rec in records:
                    self._table.apply(rec)
        except (KeyError, TypeError, ValueError) as exc:
            self._table, self._mark = None, None
            raise ConfigError(f"lab '{self.lab}': the service list is unreadable ({type(exc).__name__}: {exc})") from None
        self._mark = mark
        return self._table

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

    def _find(self, state: AgentState, name: str) -> Service:
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
        want = change_entries(svc, lambda bid: None, self.topology, node, self.maglev_m, self.cilium)[MAGLEV_MAP]
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
        """The bpftool commands that show the same maps (and session affinity's match map: one key
        ``{backend_id, rev_nat_id}`` per backend of each affinity service, as Cilium's ``cilium_lb_affinity_match``)."""
        shown = (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP, AFFINITY_MATCH_MAP)
        if isinstance(self.maps, PinnedMaps):
            return [f"bpftool map dump pinned {self.maps.path(node, m)}" for m in shown]
        return [f"bpftool map dump pinned <{node} pins>/{m}" for m in shown]

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
        spec = self._check_spec(dict(name=name, port=port, backends=backends, vip=vip, protocol=protocol,
                                     affinity=affinity, type=type, node_port=node_port, lb_vip=lb_vip, etp=etp,
                                     algorithm=algorithm))
        with self.store.lock():
            state = self._state()
            if name in state.services:
                old = state.services[name]
                raise ConfigError(f"service '{name}' already exists in lab '{self.lab}' ({old.frontend}); "
                                  f"expected a new name (`labkit service del {name}` removes it)")
            change = self._new_service(state, spec)
            self._commit(change, f"adding service '{name}'")
        return change.after

    def apply(self, specs: Sequence[dict]) -> dict[str, list[str]]:
        """Make each service of ``specs`` exist as described, in one agent call (``kubectl apply -f``;
        ``labkit service apply FILE``). A spec is :meth:`add`'s keywords as a dict (``backends`` a list of
        ``'pod:port'``). A new name is added; a known one whose backends differ gets them (its ids kept);
        a known one whose frontend differs is replaced; an equal one is left alone. Every spec is checked
        before anything is written, and if one is refused on the way the ones already applied are undone:
        the call changes all or nothing. Returns the names ``added``, ``updated``, ``replaced``, ``unchanged``.

            >>> from labkit.net.topology import Topology
            >>> svcs = Services.in_memory(Topology.default())
            >>> svcs.apply([{"name": "web", "port": 80, "backends": ["b1:8080"]},
            ...             {"name": "api", "port": 8080, "backends": ["a2:8080"]}])["added"]
            ['web', 'api']
            >>> svcs.apply([{"name": "web", "port": 80, "backends": ["b1:8080", "b2:8080"]}])["updated"]
            ['web']
        """
        if isinstance(specs, dict) or not isinstance(specs, (list, tuple)):
            raise ConfigError(f"service apply: expected a list of services, got {type(specs).__name__}")
        checked, seen = [], set()
        for i, raw in enumerate(specs):
            if not isinstance(raw, dict):
                raise ConfigError(f"service apply: item {i + 1} is a {type(raw).__name__}; expected a mapping "
                                  f"with name, port and backends")
            spec = self._check_spec(raw, f"service apply: item {i + 1}")
            if spec["name"] in seen:
                raise ConfigError(f"service apply: service '{spec['name']}' is listed twice; expected each once")
            seen.add(spec["name"])
            checked.append(spec)
        out: dict[str, list[str]] = {"added": [], "updated": [], "replaced": [], "unchanged": []}
        done: list[tuple[str, Service | None]] = []  # (name, the service before) of what this call changed
        with self.store.lock():
            state = self._state()
            fresh = [spec for spec in checked if spec["name"] not in state.services]
            try:
                if len(fresh) > 1 and hasattr(self.writer, "commit_new"):
                    for i in range(0, len(fresh), APPLY_CHUNK):  # a bounded batch at a time: a bounded peak
                        names = self._add_many(state, fresh[i:i + APPLY_CHUNK])
                        out["added"] += names
                        done += [(name, None) for name in names]
                        state = self._state()
                    added = set(out["added"])
                    checked = [spec for spec in checked if spec["name"] not in added]
                for spec in checked:
                    name = spec["name"]
                    old = state.services.get(name)
                    if old is None:
                        self._commit(self._new_service(state, spec), f"adding service '{name}'")
                        out["added"].append(name)
                    elif _same_frontend(old, spec):
                        bes = tuple(self._apply_backends(old, spec["backends"]))
                        if bes == old.backends:  # pods, ports and states (ids do not compare)
                            out["unchanged"].append(name)
                            continue
                        self._change(state, replace(old, backends=bes), "applying backends")
                        out["updated"].append(name)
                    else:
                        self._commit(state.drop(name), f"removing service '{name}'")
                        done.append((name, old))
                        self._commit(self._new_service(state, spec), f"adding service '{name}'")
                        out["replaced"].append(name)
                        continue
                    done.append((name, old))
            except BaseException:
                state = self._state()  # a refused batch left the state to be read again from the store
                self._undo(state, done)
                raise
        return out

    def _add_many(self, state: AgentState, specs: list[dict]) -> list[str]:
        """New services at once: each is checked and given its ids against the state with the ones before it
        in (in memory), then every node's rows go in a phase at a time (:meth:`LbMapsWriter.commit_new`) and
        the journal gets every record in one write. If anything is refused, the maps and the journal are
        as they were and the state is read again from the store."""
        plans, records = [], []
        short = "lb-wrong-count" in self.faults()  # asked once for the whole call
        try:
            for spec in specs:
                change = self._new_service(state, spec)
                plans.append(self.writer.plans(change, short, ordered=False)[0])  # commit_new orders them all
                records.append(change.record)
                state.apply(change.record, change.after)

            def save() -> None:
                end = self.store.append_many(records)
                self._mark = replace(self._mark, offset=end, records=self._mark.records + len(records))

            self.writer.commit_new(plans, f"adding {len(specs)} services", save)
        except BaseException:
            self._table = self._mark = None  # the state in memory ran ahead: the store has what is true
            raise
        if self._mark.records > max(COMPACT_MIN, COMPACT_RATIO * len(state.services)):
            self._compact()
        return [spec["name"] for spec in specs]

    def _undo(self, state: AgentState, done: list[tuple[str, Service | None]]) -> None:
        """Put back what an :meth:`apply` changed before it was refused, newest first."""
        for name, before in reversed(done):
            if before is not None:  # its ids come back with it (:meth:`AgentState.put` reuses free ones)
                self._commit(state.put(before, self.topology), f"undoing service '{name}'")
            elif name in state.services:
                self._commit(state.drop(name), f"undoing service '{name}'")

    def _apply_backends(self, old: Service, wanted: list[Backend]) -> list[Backend]:
        """``wanted`` with the ids ``old`` already gave the same pod:port."""
        ids = {(b.pod, b.port): b.id for b in old.backends}
        return [replace(b, id=ids.get((b.pod, b.port), 0)) for b in wanted]

    def _check_spec(self, spec: dict, where: str | None = None) -> dict:
        """One service's description, checked without the state: names, ranges, combinations. Returns it
        with defaults filled in and values as the agent spells them."""
        known = {"name", "port", "backends", "vip", "protocol", "affinity", "type", "node_port", "lb_vip", "etp",
                 "algorithm"}
        extra = set(spec) - known
        if extra or "name" not in spec or "port" not in spec:
            what = (f"unknown field(s) {', '.join(sorted(extra))}" if extra else
                    f"no {'name' if 'name' not in spec else 'port'}")
            raise ConfigError(f"{where or 'service'}: {what}; expected the fields {', '.join(sorted(known))}")
        s = {"backends": (), "vip": None, "protocol": "TCP", "affinity": 0, "type": "ClusterIP", "node_port": None,
             "lb_vip": None, "etp": "Cluster", "algorithm": "random", **spec}
        name = s["name"]
        check_name(name)
        s["type"] = type_ = check_type(name, s["type"])
        s["etp"] = check_choice(name, "externalTrafficPolicy", s["etp"], TRAFFIC_POLICIES)
        s["algorithm"] = check_choice(name, "algorithm", s["algorithm"], ALGORITHMS)
        if s["etp"] == "Local" and type_ == "ClusterIP":
            raise ConfigError(f"service '{name}': externalTrafficPolicy Local given for a ClusterIP service; "
                              f"expected type NodePort or LoadBalancer")
        s["protocol"] = check_protocol(name, s["protocol"])
        check_port(f"service '{name}': port", s["port"])
        check_affinity(name, s["affinity"])
        s["backends"] = self._check_backends(name, s["backends"] if s["backends"] is not None else ())
        if s["vip"] is not None:
            s["vip"] = check_vip(name, s["vip"])
        if s["node_port"] is not None:
            if type_ == "ClusterIP":
                raise ConfigError(f"service '{name}': node port {s['node_port']!r} given for a ClusterIP service; "
                                  f"expected type NodePort or LoadBalancer")
            check_node_port(name, s["node_port"])
        if s["lb_vip"] is not None:
            if type_ != "LoadBalancer":
                raise ConfigError(f"service '{name}': LoadBalancer VIP {s['lb_vip']!r} given for a {type_} "
                                  f"service; expected type LoadBalancer")
            s["lb_vip"] = check_lb_vip(name, s["lb_vip"])
        return s

    def _new_service(self, state: AgentState, s: dict) -> Change:
        """A checked spec (:meth:`_check_spec`) of a name not in ``state`` → its change: free VIP, node port
        and LoadBalancer VIP picked where not given, frontends checked against the others, ids given."""
        name, protocol, type_, port = s["name"], s["protocol"], s["type"], s["port"]
        vip, node_port, lb_vip = s["vip"], s["node_port"], s["lb_vip"]
        if vip is None:
            vip = self._free_vip(state)
        if type_ != "ClusterIP":
            if node_port is None:
                node_port = self._free_node_port(state, protocol, profile(self.cilium).has("lb_proto_keys"))
            elif (protocol, node_port) in state.node_ports:
                other = state.first(state.node_ports[(protocol, node_port)])
                raise ConfigError(f"service '{name}': node port {node_port}/{protocol} is already "
                                  f"service '{other}'; expected a node port no other {protocol} service uses")
        if type_ == "LoadBalancer" and lb_vip is None:
            lb_vip = self._free_lb_vip(state)
        wanted = [("ClusterIP", vip, port)]
        if type_ != "ClusterIP":
            wanted += [("NodePort", n.ip, node_port) for n in self.topology.nodes]
            wanted.append(("NodePort", SURROGATE, node_port))  # every node's: socket LB's wildcard lookup
        if type_ == "LoadBalancer":
            wanted.append(("LoadBalancer", lb_vip, port))
        self._check_frontends_free(state, name, protocol, [(address, p) for _, address, p in wanted])
        sids, next_sid = state.new_service_ids(len(wanted))
        frontends = [Frontend(address, p, fe_type, sid) for (fe_type, address, p), sid in zip(wanted, sids)]
        svc = Service(name, vip, port, protocol, tuple(s["backends"]), s["affinity"], frontends[0].id, type_,
                      node_port or 0, lb_vip, tuple(frontends), s["etp"], s["algorithm"])
        return state.put(svc, self.topology, next_service_id=next_sid)

    def remove(self, name: str) -> None:
        """Remove service ``name`` from every node (head first, then slots, reverse NAT, backends)."""
        with self.store.lock():
            state = self._state()
            self._find(state, name)  # NotFoundError names the services
            self._commit(state.drop(name), f"removing service '{name}'")

    def add_backend(self, name: str, backend: "str | Backend", state: str = "active") -> Service:
        """Add one backend (``'pod:port'``) to service ``name``."""
        check_state(name, state)
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
        return out

    def set_backend_state(self, name: str, backend: "str | Backend", state: str) -> Service:
        """Mark a backend ``'active'`` or ``'terminating'`` (moved after the count: no new connections)."""
        check_state(name, state)
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
            if not self.writer.reset():
                for name in list(state.services):  # no snapshot on the way: an empty one ends the flush
                    self._commit(state.drop(name), f"removing service '{name}'", compact=False)
            try:
                for node in self.topology.nodes:
                    for map_name in LB_MAPS:
                        try:
                            self.maps.clear(node.name, map_name)
                        except NotFoundError:  # a datapath without this map has nothing to clear
                            pass
            finally:
                self.maps.close()
            self._table = AgentState()
            if self.store.exists():
                self._mark = self.store.save(self._table.to_json())

    # -- internals -----------------------------------------------------------------
    def _change(self, state: AgentState, svc: Service, what: str) -> Service:
        change = state.put(svc, self.topology)
        self._commit(change, f"{what} of service '{svc.name}'")
        return change.after

    def _commit(self, change: Change, what: str, compact: bool = True) -> None:
        """Write one service's change with this agent's writer, journal it, then apply it to the state
        in memory (a refused write or journal line leaves all three as they were)."""
        def save() -> None:
            end = self.store.append(change.record)
            self._mark = replace(self._mark, offset=end, records=self._mark.records + 1)

        self.writer.commit(change, what, save)
        change.state.apply(change.record, change.after)
        if compact and self._mark.records > max(COMPACT_MIN, COMPACT_RATIO * len(change.state.services)):
            self._compact()

    def _compact(self) -> None:
        """A new snapshot of the state in memory, the journal emptied. The journal already holds every
        change, so a snapshot that cannot be written is tried again at the next change."""
        try:
            self._mark = self.store.save(self._table.to_json())
        except OSError:
            pass

    def iptables(self, node: str, table: str = "nat") -> str:
        """``node``'s ``table`` as kube-proxy mode left it (``iptables-save -t nat`` in its namespace)."""
        self.topology.node(node)
        return self.tables(node).save(table)

    def _check_backends(self, name: str, backends: Sequence["str | Backend"]) -> list[Backend]:
        if isinstance(backends, (str, Backend)):
            backends = [backends]
        out: list[Backend] = []
        for spec in backends:
            if isinstance(spec, dict):  # an apply file's {pod, port[, state]}
                try:
                    spec = Backend(str(spec["pod"]), spec["port"], spec.get("state", "active"))
                except KeyError as exc:
                    raise ConfigError(f"service '{name}': backend {spec!r} has no {exc}; expected pod and port")
            be = Backend.parse(spec, name)
            try:
                self.topology.pod(be.pod)
            except NotFoundError as exc:
                raise NotFoundError(f"service '{name}': backend '{be.ref}': {exc}") from None
            check_port(f"service '{name}': backend '{be.ref}' port", be.port)
            check_state(name, be.state)
            if any((b.pod, b.port) == (be.pod, be.port) for b in out):
                raise ConfigError(f"service '{name}': backend '{be.ref}' is listed twice; expected each once")
            out.append(be)
        return out

    def _check_frontends_free(self, state: AgentState, name: str, protocol: str, wanted: list[tuple[str, int]]) -> None:
        """ConfigError if one of ``wanted`` (address, port) would take another service's map key. On v1.16
        every key carries protocol 0, so a VIP:port is one key whatever the protocol."""
        proto_keys = profile(self.cilium).has("lb_proto_keys")
        clashes = []  # (the other's position, its frontend's, ours): the first a scan in creation order meets
        for i, (address, p) in enumerate(wanted):
            for other_name in state.by_frontend.get((address, p), ()):
                other = state.services[other_name]
                for j, fe in enumerate(other.frontends):
                    if (fe.address, fe.port) == (address, p) and (other.protocol == protocol or not proto_keys):
                        clashes.append((state.order[other_name], j, i, other, fe, address, p))
        if not clashes:
            return
        _, _, _, other, fe, address, p = min(clashes, key=lambda c: c[:3])
        frontend = l4_key(address, p, protocol)
        if other.protocol == protocol:
            raise ConfigError(f"service '{name}': frontend {frontend} is already service "
                              f"'{other.name}'; expected a VIP:port/protocol no other service uses")
        raise ConfigError(
            f"service '{name}': frontend {frontend} would share its cilium_lb4_services_v2 key "
            f"with service '{other.name}' ({fe.l4(other.protocol)}): Cilium {self.cilium} writes "
            f"protocol 0 in every service key, so one VIP:port holds one service whatever its "
            f"protocol (keys per protocol came with 1.17, cilium/cilium#33434); expected another "
            f"VIP or port, or a lab of Cilium 1.20 (`labkit up --cilium 1.20`)")

    def _free_node_port(self, state: AgentState, protocol: str, proto_keys: bool = True) -> int:
        """The first node port no service of ``protocol`` uses (of any protocol without per-protocol keys)."""
        protocols = (protocol,) if proto_keys else PROTOCOLS
        for p in NODE_PORT_RANGE:
            if not any((proto, p) in state.node_ports for proto in protocols):
                return p
        raise ConfigError(f"no free {protocol} node port left in {NODE_PORT_RANGE.start}-{NODE_PORT_RANGE.stop - 1}")

    def _free_lb_vip(self, state: AgentState) -> str:
        ip = FIRST_LB_VIP
        while ip in LB_RANGE and ip != LB_RANGE.broadcast_address:
            if str(ip) not in state.lb_vips:
                return str(ip)
            ip += 1
        raise ConfigError(f"no free LoadBalancer VIP left in {LB_RANGE} from {FIRST_LB_VIP}")

    def _free_vip(self, state: AgentState) -> str:
        """The first VIP from :data:`FIRST_VIP` no service has; ``state.vip_floor`` remembers how far
        the addresses are all taken (lowered when one is freed), so the scan starts there."""
        ip = FIRST_VIP + state.vip_floor
        while ip in CLUSTERIP_RANGE and ip != CLUSTERIP_RANGE.broadcast_address:
            if str(ip) not in state.vips:
                state.vip_floor = int(ip) - int(FIRST_VIP)
                return str(ip)
            ip += 1
        raise ConfigError(f"no free VIP left in the ClusterIP range {CLUSTERIP_RANGE} from {FIRST_VIP}")


def _same_frontend(svc: Service, spec: dict) -> bool:
    """True if a checked spec describes ``svc``'s frontends (what is not given is whatever it has)."""
    return (svc.port == spec["port"] and svc.protocol == spec["protocol"] and svc.type == spec["type"]
            and svc.affinity_timeout == spec["affinity"] and svc.etp == spec["etp"]
            and svc.algorithm == spec["algorithm"] and spec["vip"] in (None, svc.vip)
            and spec["node_port"] in (None, svc.node_port or None) and spec["lb_vip"] in (None, svc.lb_vip))
