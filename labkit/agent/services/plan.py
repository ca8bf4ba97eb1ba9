"""What to write, in which order: every row a node's LB maps should hold for a state
(:func:`entries`), the rows one service's change can touch (:func:`change_entries`), and the
writes that turn one set of rows into another without a packet ever seeing a count that points
at a slot not yet written (:func:`plan`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

from labkit.agent.services.ids import AgentState
from labkit.agent.services.model import Service
from labkit.maglev import LAB_DEFAULT_M, MURMUR_SEED, backend_name, lookup_table
from labkit.maps.lb import (
    AFFINITY_MATCH_MAP,
    BACKENDS_MAP,
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
    LbAffinityMatch,
    LbAffinityMatchValue,
    LookupScope,
    MaglevLut,
    ServiceFlags,
    ServiceFlags2,
    proto_number,
)
from labkit.net.topology import Topology
from labkit.release import DEFAULT_RELEASE, profile

__all__ = ["Entries", "Op", "entries", "change_entries", "plan", "GROW_PHASES", "ROW_MAPS"]


Entries = dict[str, dict[bytes, tuple]]  # map name -> raw key -> (key, value)

#: Phases of one change; a growing service and a shrinking one take them in different orders.
#: A Maglev table only names backends that exist, and is gone only once no head points at it.
#: Affinity matches go as Cilium's upsertServiceIntoLBMaps has them: the obsolete ones first, the new ones once
#: the service is written (a client whose backend has no match is given a new one, never a gone one).
_GROW = ("match_del", "be_new", "be_changed", "maglev_put", "slot_put", "revnat_put", "head_put", "match_put",
         "head_del", "slot_del", "maglev_del", "revnat_del", "be_del")
_SHRINK = ("match_del", "be_new", "revnat_put", "head_put", "head_del", "maglev_put", "be_changed", "slot_put",
           "match_put", "slot_del", "maglev_del", "revnat_del", "be_del")
#: The phases of a growing change, in order (a bulk apply of new services writes every service's rows
#: of one phase before the next: :meth:`labkit.agent.services.lbmaps.LbMapsWriter.commit_new`).
GROW_PHASES = _GROW
_PUT = {SERVICES_MAP: "slot_put", BACKENDS_MAP: "be_new", REVNAT_MAP: "revnat_put", MAGLEV_MAP: "maglev_put",
        AFFINITY_MATCH_MAP: "match_put"}
_DEL = {SERVICES_MAP: "slot_del", BACKENDS_MAP: "be_del", REVNAT_MAP: "revnat_del", MAGLEV_MAP: "maglev_del",
        AFFINITY_MATCH_MAP: "match_del"}
#: Every map whose rows :func:`entries` computes.
ROW_MAPS = (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP, MAGLEV_MAP, AFFINITY_MATCH_MAP)


def _empty() -> "Entries":
    return {m: {} for m in ROW_MAPS}


@functools.lru_cache(maxsize=256)
def _maglev_lut(names: tuple[tuple[str, int], ...], m: int) -> MaglevLut:
    """One Maglev table (the frontends of a service share it, and old and new states mostly agree)."""
    return MaglevLut(lookup_table(list(names), m, MURMUR_SEED))


def entries(state: AgentState, topo: Topology, node: str, maglev_m: int = LAB_DEFAULT_M,
            cilium: str = DEFAULT_RELEASE, short_count: bool = False) -> Entries:
    """Every row ``node``'s service maps should hold for ``state``, as release ``cilium``'s agent writes them.

    Keys and backends carry protocol 0 on v1.16 (pkg/maps/lbmap: ``u8proto.ANY``) and the
    service's protocol on 1.17+; heads carry the service's flags, slots flags 0.
    Nodes differ only where a frontend has externalTrafficPolicy=Local: its external
    scope lists the node's own backends (flag Local); its internal scope, read by pods
    and node processes (flag TWO_SCOPES on the external head), lists them all.
    A Maglev service gets one table per NodePort and LoadBalancer frontend, over what the external
    scope lists, built as Cilium builds it (:func:`labkit.maglev.backend_name`, Cilium's seed); its
    ClusterIP frontend gets none (v1.16's svcInfo.useMaglev, pkg/service/service.go:173: pods select
    at random, bpf_lxc.c forces LB_SELECTION_RANDOM).

    This is the whole state's rows (O(services)): what a change writes is :func:`change_entries`,
    the part of these rows one service owns."""
    out: Entries = _empty()
    proto_keys = profile(cilium).has("lb_proto_keys")
    backends: dict[int, tuple[str, int, int, bool]] = {}
    for svc in state.services.values():
        _service_rows(out, svc, topo, node, maglev_m, cilium, short_count)
        wire = proto_number(svc.protocol) if proto_keys else 0
        for b in svc.slots:
            ip = topo.pod(b.pod).ip
            was_active = backends.get(b.id, (ip, b.port, wire, False))[3]
            backends[b.id] = (ip, b.port, wire, was_active or b.state == "active")
    for bid, (ip, port, proto, active) in backends.items():
        _backend_row(out, bid, ip, port, proto, active)
    return out


def change_entries(svc: Service | None, shared: Callable[[int], bool | None], topo: Topology, node: str,
                   maglev_m: int = LAB_DEFAULT_M, cilium: str = DEFAULT_RELEASE, short_count: bool = False,
                   other: Service | None = None) -> Entries:
    """The rows of :func:`entries` that service ``svc`` owns or shares: its heads, slots, reverse NAT and
    Maglev tables, and its backends' rows. ``shared(id)`` says how the other services see a backend
    (None: none uses it; True: one counts it active), since a shared backend is active while any
    service counts it. ``other`` is the same service on the other side of the change: its backends'
    rows are here too while another service keeps them. Two of these, before and after a change,
    are what :func:`plan` needs: every other row is the same in both."""
    out: Entries = _empty()
    proto_keys = profile(cilium).has("lb_proto_keys")
    mine = set()
    if svc is not None:
        _service_rows(out, svc, topo, node, maglev_m, cilium, short_count)
        wire = proto_number(svc.protocol) if proto_keys else 0
        for b in svc.slots:
            mine.add(b.id)
            _backend_row(out, b.id, topo.pod(b.pod).ip, b.port, wire, bool(shared(b.id)) or b.state == "active")
    if other is not None:
        wire = proto_number(other.protocol) if proto_keys else 0
        for b in other.slots:
            if b.id not in mine and (active := shared(b.id)) is not None:
                _backend_row(out, b.id, topo.pod(b.pod).ip, b.port, wire, active)
    return out


def _service_rows(out: Entries, svc: Service, topo: Topology, node: str, maglev_m: int, cilium: str,
                  short_count: bool) -> None:
    """``svc``'s heads, slots, reverse NAT and Maglev rows into ``out``."""
    wire = proto_number(svc.protocol) if profile(cilium).has("lb_proto_keys") else 0
    slots = svc.slots  # once per service: every frontend lists the same backends
    n_active = sum(b.state == "active" for b in slots)
    node_ip = topo.node(node).ip
    for fe in svc.frontends:  # each its own head, slots and reverse NAT; the same backends
        if not svc.on_node(fe, node_ip):
            continue  # another node's NodePort address: that node's maps hold it
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
        if svc.affinity_timeout:  # every backend of the service, terminating ones too (v1.16's svc.backends)
            for b in slots:
                mk = LbAffinityMatch.make(fe.id, b.id)
                out[AFFINITY_MATCH_MAP][bytes(mk)] = (mk, LbAffinityMatchValue())
        if svc.algorithm == "maglev" and fe.type != "ClusterIP" and not fe.surrogate:
            ext_active = [b for b in scopes[0][1] if b.state == "active"]
            if ext_active:
                names = tuple(sorted((backend_name(topo.pod(b.pod).ip, b.port, svc.protocol, cilium), b.id)
                                     for b in ext_active))
                out[MAGLEV_MAP][bytes(rn_key)] = (rn_key, _maglev_lut(names, maglev_m))


def _backend_row(out: Entries, bid: int, ip: str, port: int, proto: int, active: bool) -> None:
    # Shared by several services: active while any of them still counts it.
    state_ = BackendState.ACTIVE if active else BackendState.TERMINATING
    key = Lb4BackendKey(bid)
    out[BACKENDS_MAP][bytes(key)] = (key, Lb4Backend.make(ip, port, proto, state_))


@dataclass(frozen=True)
class Op:
    phase: str
    map_name: str
    key: object
    value: object | None  # None: delete

    def sort_key(self) -> tuple:
        if self.map_name == SERVICES_MAP:
            slot = self.key.backend_slot
            return (self.key.ident, -slot if self.value is None else slot)
        return (bytes(self.key),)


def plan(old: Entries, new: Entries, grow: bool, ordered: bool = True) -> list[Op]:
    """The writes that turn ``old`` into ``new``, in a safe order for the datapath (``ordered=False``: in
    any order, each marked with its phase, for a caller that orders many plans' writes together)."""
    ops = []
    for map_name in ROW_MAPS:
        before, after = old.get(map_name, {}), new.get(map_name, {})
        for raw, (key, value) in after.items():
            if raw in before and bytes(before[raw][1]) == bytes(value):
                continue
            phase = _PUT[map_name]
            if map_name == SERVICES_MAP and key.backend_slot == 0:
                phase = "head_put"
            elif map_name == BACKENDS_MAP and raw in before:
                phase = "be_changed"
            ops.append(Op(phase, map_name, key, value))
        for raw, (key, _value) in before.items():
            if raw not in after:
                head = map_name == SERVICES_MAP and key.backend_slot == 0
                ops.append(Op("head_del" if head else _DEL[map_name], map_name, key, None))
    if not ordered:
        return ops
    order = {p: i for i, p in enumerate(_GROW if grow else _SHRINK)}
    return sorted(ops, key=lambda op: (order[op.phase], op.sort_key()))
