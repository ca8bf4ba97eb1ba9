"""The eBPF way to write Services: every node's ``cilium_lb4_*`` maps, in a datapath-safe order.

:class:`MapWriter` is where rows go (:class:`PinnedMaps` on a running lab, :class:`MemoryMaps`
without a kernel); :class:`LbMapsWriter` turns a change of the agent's state into writes
(:func:`labkit.agent.services.plan.plan` of one service's rows before and after) and undoes them all if one fails (:class:`Txn`).
"""
from __future__ import annotations

import ctypes
from typing import Callable, Iterable, Protocol

from labkit.agent.services.ids import Change
from labkit.agent.services.plan import GROW_PHASES, Op, change_entries, plan
from labkit.errors import DatapathError, LabkitError, NotFoundError
from labkit.maglev import LAB_DEFAULT_M
from labkit.maps.base import PinnedMap
from labkit.maps.lb import AFFINITY_MATCH_MAP, LB_MAPS, MAGLEV_MAP, SERVICES_MAP, PinnedMaglev
from labkit.net.topology import Topology

__all__ = ["MapWriter", "PinnedMaps", "MemoryMaps", "Txn", "LbMapsWriter"]


class _Absent:
    """A map the node's datapath was built without (``cilium_lb_affinity_match`` on a lab built before labkit
    had it): nothing to read, and writes go nowhere, since a datapath without the map never reads it."""

    def get(self, key):
        return None

    def __setitem__(self, key, value) -> None:
        pass

    def delete(self, key) -> bool:
        return False

    def items(self) -> list:
        return []

    def raw_items(self) -> dict:
        return {}

    def update_many(self, pairs) -> None:
        pass

    def clear(self) -> int:
        return 0

    def close(self) -> None:
        pass


#: Maps a node may lack without being broken (see :class:`_Absent`).
OPTIONAL_MAPS = (AFFINITY_MATCH_MAP,)


class MapWriter(Protocol):
    """The map layer the agent writes through: a node's pinned LB maps, or a fake.

    Keys and values are the ctypes types of :data:`labkit.maps.lb.LB_MAPS`.
    """

    def get(self, node: str, map_name: str, key) -> ctypes.Structure | None: ...
    def update(self, node: str, map_name: str, key, value) -> None: ...
    def delete(self, node: str, map_name: str, key) -> bool: ...
    def items(self, node: str, map_name: str) -> list[tuple]: ...
    def update_many(self, node: str, map_name: str, pairs: list[tuple]) -> None: ...
    def raw(self, node: str, map_name: str) -> dict[bytes, bytes]: ...
    def clear(self, node: str, map_name: str) -> int: ...
    def close(self) -> None: ...


class PinnedMaps:
    """:class:`MapWriter` over the pinned maps of each node (``bpftool map update pinned …``).

    Maps are opened on first use and closed by :meth:`close` (after every agent call), unless
    ``keep_open``: the lab's agent process keeps them open for its life (:meth:`release` closes them).
    """

    def __init__(self, pin_dirs: dict[str, str], maglev_m: int = LAB_DEFAULT_M, keep_open: bool = False):
        self.pin_dirs = dict(pin_dirs)
        self.maglev_m = maglev_m
        self.keep_open = keep_open
        self._open: dict[tuple[str, str], object] = {}

    def path(self, node: str, map_name: str) -> str:
        return f"{self.pin_dirs[node]}/{map_name}"

    def _map(self, node: str, map_name: str):
        m = self._open.get((node, map_name))
        if m is None and map_name == MAGLEV_MAP:
            m = self._open[(node, map_name)] = PinnedMaglev(self.path(node, map_name), self.maglev_m)
        if m is None:
            key_type, value_type = LB_MAPS[map_name]
            try:
                m = PinnedMap(self.path(node, map_name), key_type, value_type)
            except NotFoundError:
                if map_name not in OPTIONAL_MAPS:
                    raise
                m = _Absent()
            self._open[(node, map_name)] = m
        return m

    def get(self, node, map_name, key):
        return self._map(node, map_name).get(key)

    def update(self, node, map_name, key, value) -> None:
        self._map(node, map_name)[key] = value

    def delete(self, node, map_name, key) -> bool:
        return self._map(node, map_name).delete(key)

    def items(self, node, map_name) -> list[tuple]:
        return self._map(node, map_name).items()

    def raw(self, node, map_name) -> dict[bytes, bytes]:
        m = self._map(node, map_name)
        if map_name == MAGLEV_MAP:  # the tables, not the outer map's inner-map ids
            return {bytes(k): bytes(v) for k, v in m.items()}
        return m.raw_items()

    def update_many(self, node, map_name, pairs) -> None:
        m = self._map(node, map_name)
        if map_name == MAGLEV_MAP:  # a map of maps: each table is an inner map of its own
            for key, value in pairs:
                m[key] = value
        else:
            m.update_many(pairs)

    def clear(self, node, map_name) -> int:
        return self._map(node, map_name).clear()

    def close(self) -> None:
        if not self.keep_open:
            self.release()

    def release(self) -> None:
        """Close every map this writer opened."""
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

    def raw(self, node, map_name) -> dict[bytes, bytes]:
        return dict(self._table(node, map_name))

    def update_many(self, node, map_name, pairs) -> None:
        for key, value in pairs:
            self.update(node, map_name, key, value)

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




class Txn:
    """Writes with their undo: the value each key had before (None: absent)."""

    def __init__(self, maps: MapWriter):
        self.maps = maps
        self.undo: list[tuple[str, str, object, object | None]] = []

    def apply(self, node: str, op: Op) -> None:
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


class LbMapsWriter:
    """Writes a change of the agent's state into every node's LB maps (the lab's ``service_mode`` 'ebpf')."""

    mode = "ebpf"

    def __init__(self, maps: MapWriter, topology: Topology, maglev_m: int, cilium: str,
                 faults: Callable[[], list[str]]):
        self.maps = maps
        self.topology = topology
        self.maglev_m = maglev_m
        self.cilium = cilium
        self.faults = faults

    def reset(self) -> bool:
        """Before a flush: every node's heads go first, so no packet is load-balanced any more while the
        rest of the rows are cleared (True: the services need not be removed one by one)."""
        try:
            for node in (n.name for n in self.topology.nodes):
                for key, _ in self.maps.items(node, SERVICES_MAP):
                    if key.backend_slot == 0:
                        self.maps.delete(node, SERVICES_MAP, key)
        finally:
            self.maps.close()
        return True

    def plans(self, change: Change, short: bool | None = None, ordered: bool = True) -> tuple[dict[str, list[Op]], bool]:
        """Every node's writes for ``change`` (computed now, against the state as it is now), and whether
        the service grows. Only the rows the service owns or shares are computed (:func:`change_entries`,
        before and after): a change costs what it touches, whatever the number of services."""
        was, now = change.before, change.after
        grow = now is not None and (was is None or len(now.active) >= len(was.active))
        # Nodes differ for externalTrafficPolicy=Local and for NodePort frontends (each node holds its own
        # address's): otherwise one plan serves every node.
        per_node = any(s is not None and (s.etp == "Local" or s.node_port) for s in (was, now))
        if short is None:  # the agent fault lb-wrong-count, asked at every change
            short = "lb-wrong-count" in self.faults()
        out: dict[str, list[Op]] = {}
        shared_plan = None
        for node in (n.name for n in self.topology.nodes):
            if per_node or shared_plan is None:
                rows = [change_entries(s, change.shared, self.topology, node, self.maglev_m, self.cilium, short, o)
                        for s, o in ((was, now), (now, was))]
                ops = plan(*rows, grow, ordered)
                shared_plan = shared_plan if per_node else ops
            out[node] = ops if per_node else shared_plan
        return out, grow

    def commit_new(self, plans: list[dict[str, list[Op]]], what: str, save: Callable[[], None]) -> None:
        """Write the plans of many new services (an apply's) in one go: per node, every service's rows of
        a phase together — all backends, then Maglev tables, slots, reverse NAT, and the heads last — each
        map's rows in one ``BPF_MAP_UPDATE_BATCH``; then ``save``. No packet sees a head before the rows it
        points at. If anything fails, every row written is taken out again (what was there before is put
        back) and the maps are as they were."""
        order = {p: i for i, p in enumerate(GROW_PHASES)}
        written: list[tuple[str, str, object, object | None]] = []  # what to put back: (node, map, key, before)
        added: list[tuple[str, str, list]] = []  # rows that were not there: (node, map, keys)
        node = map_name = None
        try:
            for node in (n.name for n in self.topology.nodes):
                ops = sorted((op for p in plans for op in p[node]), key=lambda op: (order[op.phase], op.map_name))
                i = 0
                while i < len(ops):
                    phase, map_name = ops[i].phase, ops[i].map_name
                    j = i
                    while j < len(ops) and (ops[j].phase, ops[j].map_name) == (phase, map_name):
                        j += 1
                    group = ops[i:j]
                    if any(op.value is None for op in group) or phase == "be_changed":
                        txn = Txn(self.maps)  # rare in an apply of new services: one by one, with their undo
                        for op in group:
                            txn.apply(node, op)
                        written += [(node, m, k, prev) for (_, m, k, prev) in txn.undo]
                    else:
                        pairs = list({bytes(op.key): (op.key, op.value) for op in group}.values())
                        added.append((node, map_name, [k for k, _ in pairs]))
                        self.maps.update_many(node, map_name, pairs)
                    i = j
            map_name = None
            save()
        except BaseException as exc:
            undo = Txn(self.maps)
            undo.undo = written
            problems = undo.rollback()
            for n, m, keys in reversed(added):
                for key in reversed(keys):
                    try:
                        self.maps.delete(n, m, key)
                    except (OSError, LabkitError) as err:
                        problems.append(f"{n} {m} {key}: {err}")
            _refused(exc, what, map_name, node, problems)
        finally:
            self.maps.close()

    def commit(self, change: Change, what: str, save: Callable[[], None]) -> None:
        """Write one service's change to every node, then ``save`` it; undo every write if one fails."""
        txn = Txn(self.maps)
        node = op = None
        try:
            plans, _ = self.plans(change)
            for node, ops in plans.items():
                for op in ops:
                    txn.apply(node, op)
            op = None
            save()
        except BaseException as exc:
            problems = txn.rollback()
            _refused(exc, what, op and op.map_name, node, problems)
        finally:
            self.maps.close()


def _refused(exc: BaseException, what: str, map_name: str | None, node: str | None, problems: list[str]) -> None:
    """Raise what a refused change was, once its writes were undone: a kernel refusal names the map and node
    (or the service list, if saving failed), and either says what could not be undone; anything else as it is."""
    left = f"; could not undo: {'; '.join(problems)}" if problems else "; every map is as it was"
    if isinstance(exc, OSError):
        where = f"{map_name} on node '{node}'" if map_name is not None else f"the service list ({exc.filename})"
        raise DatapathError(f"{what}: writing {where} failed ({exc.strerror or exc}){left}") from exc
    if problems:
        raise DatapathError(f"{what}: {exc}{left}") from exc
    raise exc
