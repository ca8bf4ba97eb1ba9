"""Conntrack garbage collection: what the cilium-agent does to the CT maps, on
the lab clock.

CT entries never delete themselves: the datapath only writes a lifetime
(``expires=`` in ``labkit ct list``). The agent scans both CT maps of a node
and deletes every entry whose lifetime is below *now*, together with the NAT
twin of a ``DSRInternal`` entry. It runs again after an interval it adapts to
how much it deleted, as a fraction of the map's size (the largest over the
maps) — Cilium's ``calculateInterval`` (pkg/maps/ctmap/ctmap.go:887-920@82999990):

=====================  =============================================
delete ratio           next interval
=====================  =============================================
0, or 0.05 to 0.25     unchanged
above 0.25             interval × (1 − min(ratio, 0.9)), at least 10 s
below 0.05 (not 0)     interval × 1.5, at most 12 h
=====================  =============================================

Products are Go ``time.Duration``-s: nanoseconds truncated, then ``Round(time.Second)``, which rounds a half
away from zero (675 s × 1.5 = 1012.5 s → 1013 s, where Python's ``round`` would give 1012):

    >>> [next_interval(300, r) for r in (0.0, 0.01, 0.1, 0.5, 0.95)]
    [300, 450, 300, 150, 30]
    >>> next_interval(12, 0.99), next_interval(40000, 0.01), next_interval(675, 0.01)
    (10, 43200, 1013)

Around it, ``GetInterval`` (ctmap.go:856-885@82999990), :func:`get_interval`: the rule starts from the
interval the last run computed (``cachedGCInterval``; 5 min before any run deleted something), and when
this run came earlier than that (a signal, ``labkit gc run``), the ratio is first multiplied by
expected / actual. The result is capped at ``--conntrack-gc-max-interval`` (:meth:`LabGc.set_max_interval`;
none by default) — but the cached interval is not, so under a cap every run looks early:

    >>> get_interval(actual=150, ratio=0.1, cached=450)   # 0.1 × 450/150 = 0.3: 450 × 0.7
    (315, 315)
    >>> get_interval(actual=0, ratio=0.01, cached=0, max_interval=400)
    (400, 450)

Two ways to scan, to compare (``labkit gc run --mode``): **per-entry**, as
v1.16 does it (``DumpReliablyWithCallback``): ``BPF_MAP_GET_NEXT_KEY`` and one
lookup per entry, one delete per expired entry; and **batch**, Cilium 1.18's
``BPF_MAP_LOOKUP_BATCH`` in chunks of 2^ceil(log2(sqrt(2·max))) (1024 for the
default maps), growing on ENOSPC, and one ``BPF_MAP_DELETE_BATCH``. A lab's
GC uses its release's way (:func:`default_mode`) unless told otherwise.
"""
from __future__ import annotations

import ctypes
import json
import os
import struct
import time
from dataclasses import asdict, dataclass

from labkit.addr import be32
from labkit.datapath import bpf as _bpf
from labkit.maps.base import PinnedMap, open_pinned
from labkit.maps.ct import CT_MAPS, CtEntry, CtFlags, CtKey4, TupleFlags
from labkit.maps.nat import NAT_MAP, NatEntry, NatKey4
from labkit.net.ledger import Ledger, dir_lock, lab_dir
from labkit.observe.evidence import JOURNAL
from labkit.release import profile

__all__ = ["START_INTERVAL", "MIN_INTERVAL", "MAX_INTERVAL", "SCAN_MODES", "default_mode", "next_interval", "get_interval",
           "MapScan", "GcRun", "collect_node", "flush_address", "fill_synthetic", "LabGc"]

START_INTERVAL = 300  #: Cilium's ConntrackGCStartingInterval: 5 minutes
MIN_INTERVAL = 10  #: ConntrackGCMinInterval
MAX_INTERVAL = 12 * 3600  #: ConntrackGCMaxLRUInterval
SCAN_MODES = ("batch", "per-entry")

_KEY = ctypes.sizeof(CtKey4)  # 14 bytes, packed
_VALUE = ctypes.sizeof(CtEntry)  # 56 bytes
_LIFETIME = struct.Struct("<32xIH18x")  # lifetime and flags of a ct_entry
_NOT_OUT = int(TupleFlags.IN | TupleFlags.RELATED | TupleFlags.SERVICE)  # key flags of entries owning no NAT entry
_DSR_INTERNAL = int(CtFlags.DSR_INTERNAL)  # plain ints: an IntFlag operation per entry costs more than the scan


def default_mode(release: str) -> str:
    """The scan a release's agent does: per-entry up to 1.17, batch from 1.18 (behaviour ``gc_batch``).

    >>> default_mode("1.16"), default_mode("1.20")
    ('per-entry', 'batch')
    """
    return "batch" if profile(release).has("gc_batch") else "per-entry"


def _go_seconds(seconds: int, factor: float) -> int:
    """``time.Duration(float64(d) * factor).Round(time.Second)`` for a whole number of seconds ``d``: the
    product truncated to nanoseconds, then rounded to seconds with halves away from zero (Go's Duration.Round)."""
    ns = int(float(seconds * 1_000_000_000) * factor)
    whole, rest = divmod(ns, 1_000_000_000)
    return whole + (1 if rest + rest >= 1_000_000_000 else 0)


def next_interval(interval: int, ratio: float) -> int:
    """The interval after a run that deleted ``ratio`` of the map's size: Cilium's calculateInterval (table above)."""
    if ratio > 0.25:
        return max(MIN_INTERVAL, _go_seconds(interval, 1.0 - min(ratio, 0.9)))
    if 0 < ratio < 0.05:
        return min(MAX_INTERVAL, _go_seconds(interval, 1.5))
    return int(interval)


def get_interval(actual: int, ratio: float, cached: int = 0, max_interval: int = 0) -> tuple[int, int]:
    """Cilium's GetInterval: ``(next interval, cachedGCInterval after it)``.

    ``actual``: seconds since the previous run started (0 for the first); ``cached``: the interval the last
    calculation gave (0 when none did: the rule starts from :data:`START_INTERVAL` and no run counts as
    early); ``max_interval``: ``--conntrack-gc-max-interval`` (0: no cap). calculateInterval stores its
    result only when the ratio is not 0, and the cap never reaches the stored value."""
    expected, adjusted = cached, ratio
    if expected == 0:
        expected = START_INTERVAL
    elif 0 < actual < expected:
        adjusted *= float(expected) / float(actual)
    interval = next_interval(expected, adjusted)
    if adjusted != 0.0:
        cached = interval
    if max_interval and interval > max_interval:
        interval = max_interval
    return interval, cached


@dataclass(frozen=True)
class MapScan:
    """One map of one node in one run: how many entries were read and deleted, and how long it took."""

    node: str
    map: str
    max_entries: int
    scanned: int
    deleted: int
    seconds: float
    nat_deleted: int = 0  #: NAT entries deleted with their OUT entries (SNAT pairs, DSR twins)

    @property
    def ratio(self) -> float:
        """Deleted entries as a fraction of the map's size: what the interval rule reads."""
        return self.deleted / self.max_entries if self.max_entries else 0.0


@dataclass(frozen=True)
class GcRun:
    """One GC run over every node: per-map results, the interval before and after."""

    now: int  #: lab clock second the run compared lifetimes with
    mode: str
    maps: tuple[MapScan, ...]
    seconds: float
    interval: int  #: the interval this run was scheduled with
    next_interval: int
    actual: int = 0  #: lab clock seconds since the previous run (0: the first since a restart)
    cached: int | None = None  #: Cilium's cachedGCInterval before the run (0: none yet; None: not recorded)
    max_interval: int = 0  #: --conntrack-gc-max-interval in force (0: none)

    @property
    def expected(self) -> int:
        """The interval the rule starts from (GetInterval's expectedPrevInterval)."""
        if self.cached is None:
            return self.interval
        return self.cached or START_INTERVAL

    @property
    def adjusted_ratio(self) -> float:
        """The ratio the rule reads: this run's, times expected / actual when the run came early."""
        if self.cached and 0 < self.actual < self.cached:
            return self.ratio * (float(self.cached) / float(self.actual))
        return self.ratio

    def rule(self) -> int:
        """The next interval Cilium's GetInterval gives for this run (what :attr:`next_interval` should be)."""
        if self.cached is None:
            return next_interval(self.interval, self.ratio)
        return get_interval(self.actual, self.ratio, self.cached, self.max_interval)[0]

    @property
    def deleted(self) -> int:
        return sum(m.deleted for m in self.maps)

    @property
    def scanned(self) -> int:
        return sum(m.scanned for m in self.maps)

    @property
    def ratio(self) -> float:
        """The largest delete ratio over the maps (the one the interval rule uses)."""
        return max((m.ratio for m in self.maps), default=0.0)

    def to_json(self) -> dict:
        data = asdict(self)
        data["ratio"] = self.ratio
        data["adjusted_ratio"], data["expected"] = self.adjusted_ratio, self.expected
        data["deleted"], data["scanned"] = self.deleted, self.scanned
        return data

    def lines(self) -> list[str]:
        """A table of the run, then the interval decision."""
        out = [f"GC at lab clock {self.now} ({self.mode} scan): {self.scanned} entries read, {self.deleted} deleted "
               f"in {self.seconds * 1000:.1f} ms"]
        for m in self.maps:
            nat = f", {m.nat_deleted} NAT entries" if m.nat_deleted else ""
            out.append(f"  {m.node:8} {m.map:24} read {m.scanned:>8}  deleted {m.deleted:>8}{nat}  "
                       f"ratio {m.ratio:.4f} of {m.max_entries}  {m.seconds * 1000:8.1f} ms")
        early = (f" (early: {self.actual} s of {self.expected} s, ratio × {self.expected}/{self.actual} = "
                 f"{self.adjusted_ratio:.4f})" if self.adjusted_ratio != self.ratio else "")
        cap = f", capped at {self.max_interval} s" if self.max_interval and self.next_interval == self.max_interval else ""
        out.append(f"largest ratio {self.ratio:.4f}{early}: interval {self.interval} s -> {self.next_interval} s{cap}")
        return out


def _dsr_nat_key(key: bytes) -> NatKey4:
    """The NAT entry a DSRInternal OUT entry made on the backend's node: the CT key with only its ports
    swapped (Cilium's ``DeleteSwappedMapping4``). CT {daddr=C, saddr=B, dport=bp, sport=cp} →
    NAT {saddr=B, daddr=C, sport=bp, dport=cp, OUT}, the key of the reply it rewrites."""
    ct = CtKey4.from_buffer_copy(key)
    nat = NatKey4()
    nat.saddr, nat.daddr, nat.sport, nat.dport = ct.saddr, ct.daddr, ct.dport, ct.sport
    nat.nexthdr, nat.flags = ct.nexthdr, TupleFlags.OUT
    return nat


def _snat_out_key(key: bytes) -> NatKey4:
    """The SNAT entry of the flow an OUT entry tracks: the CT key with its addresses swapped (Cilium's
    ``DeleteMapping4``). CT {daddr=C, saddr=B, dport=bp, sport=cp} → NAT {saddr=C, daddr=B, sport=cp,
    dport=bp, OUT}: the request as it left, before its source was rewritten."""
    ct = CtKey4.from_buffer_copy(key)
    nat = NatKey4()
    nat.saddr, nat.daddr, nat.sport, nat.dport = ct.daddr, ct.saddr, ct.sport, ct.dport
    nat.nexthdr, nat.flags = ct.nexthdr, TupleFlags.OUT
    return nat


def _delete_nat_of(nat: PinnedMap, key: bytes, dsr: bool) -> int:
    """Delete what an expired OUT entry stood for in the NAT map; how many NAT entries went."""
    if dsr:
        return int(nat.delete(_dsr_nat_key(key)))
    out = _snat_out_key(key)
    value = nat.get(out)
    if value is None:
        return 0
    # The reverse entry, keyed by the reply: {saddr=backend, sport=its port, daddr=to_addr, dport=to_port, IN}.
    back = NatKey4(daddr=value.to_addr, saddr=out.daddr, dport=value.to_port, sport=out.dport,
                   nexthdr=out.nexthdr, flags=TupleFlags.IN)
    return int(nat.delete(out)) + int(nat.delete(back))


def _nat_key_of(key: bytes, dsr: bool) -> bytes:
    """:func:`_dsr_nat_key` (``dsr``) or :func:`_snat_out_key` of a raw CT key, as raw bytes: the 14-byte
    tuple is daddr 0:4, saddr 4:8, dport 8:10, sport 10:12, nexthdr 12, flags 13 in both maps.

        >>> k = bytes(CtKey4(daddr=1, saddr=2, dport=3, sport=4, nexthdr=6, flags=0))
        >>> _nat_key_of(k, False) == bytes(_snat_out_key(k)), _nat_key_of(k, True) == bytes(_dsr_nat_key(k))
        (True, True)
    """
    if dsr:
        return key[0:8] + key[10:12] + key[8:10] + key[12:13] + b"\0"
    return key[4:8] + key[0:4] + key[8:13] + b"\0"


def _delete_nat_batch(nat: PinnedMap, outs: list[tuple[bytes, bool]]) -> int:
    """What :func:`_delete_nat_of` deletes for every expired OUT entry of ``outs``, with the NAT map read once
    in batches and the doomed keys deleted in one batch: syscalls for the NAT map's size, not a lookup per
    expired entry. Returns how many NAT entries went."""
    table = nat.raw_items()
    doomed: dict[bytes, None] = {}  # ordered and unique: a batch delete stops at a key already gone
    for key, dsr in outs:
        k = _nat_key_of(key, dsr)
        value = table.get(k)
        if value is None:
            continue
        doomed[k] = None
        if not dsr:  # the reverse entry, keyed by the reply (see _delete_nat_of)
            v, out = NatEntry.from_buffer_copy(value), NatKey4.from_buffer_copy(k)
            back = bytes(NatKey4(daddr=v.to_addr, saddr=out.daddr, dport=v.to_port, sport=out.dport,
                                 nexthdr=out.nexthdr, flags=TupleFlags.IN))
            if back in table:
                doomed[back] = None
    return nat.items_delete_batch(list(doomed))


def _scan_batch(ct: PinnedMap, now: int) -> tuple[int, list[bytes], list[tuple[bytes, bool]]]:
    """(entries read, keys to delete, (key, is DSRInternal) of the deleted OUT entries), one syscall per
    chunk (:meth:`PinnedMap.lookup_batches`); each chunk is read as bytes, no object per entry."""
    scanned, expired, outs = 0, [], []
    for keys, values, n in ct.lookup_batches():
        raw_keys, raw_values = bytes(keys), bytes(values)
        for i, (lifetime, flags) in enumerate(_LIFETIME.iter_unpack(raw_values[: n * _VALUE])):
            if lifetime < now:
                key = raw_keys[i * _KEY:(i + 1) * _KEY]
                expired.append(key)
                if key[13] & _NOT_OUT == 0:  # an OUT entry: not IN, RELATED or SVC
                    outs.append((key, bool(flags & _DSR_INTERNAL)))
        scanned += n
    return scanned, expired, outs


def _scan_per_entry(ct: PinnedMap, now: int) -> tuple[int, list[bytes], list[tuple[bytes, bool]]]:
    """The same, one BPF_MAP_GET_NEXT_KEY and one lookup per entry."""
    scanned, expired, outs = 0, [], []
    for key in ct:
        value = ct.get(key)
        if value is None:
            continue
        scanned += 1
        if value.lifetime < now:
            raw = bytes(key)
            expired.append(raw)
            if key.flags & _NOT_OUT == 0:
                outs.append((raw, bool(value.flags & CtFlags.DSR_INTERNAL)))
    return scanned, expired, outs


def collect_node(node: str, pin_dir: str, now: int, mode: str = "per-entry",
                 map_names: tuple[str, ...] = CT_MAPS, delete: bool = True) -> list[MapScan]:
    """Scan ``node``'s CT maps (pinned under ``pin_dir``), delete what expired before ``now`` and the NAT
    entries of deleted OUT entries. One :class:`MapScan` per map. ``delete=False`` (the agent fault
    ``gc-noop``) scans and deletes nothing."""
    if mode not in SCAN_MODES:
        raise ValueError(f"GC scan mode {mode!r}: expected one of {', '.join(SCAN_MODES)}")
    out = []
    nat = None
    try:
        for map_name in map_names:
            with PinnedMap(f"{pin_dir}/{map_name}", CtKey4, CtEntry) as ct:
                t0 = time.perf_counter()
                if mode == "batch":
                    scanned, expired, outs = _scan_batch(ct, now)
                else:
                    scanned, expired, outs = _scan_per_entry(ct, now)
                if not delete:
                    expired, outs = [], []
                if mode == "batch":
                    deleted = ct.items_delete_batch(expired)
                else:
                    deleted = sum(ct.delete(CtKey4.from_buffer_copy(k)) for k in expired)
                nat_deleted = 0
                if outs:
                    if nat is None:
                        nat = PinnedMap(f"{pin_dir}/{NAT_MAP}", NatKey4, NatEntry)
                    if mode == "batch":
                        nat_deleted = _delete_nat_batch(nat, outs)
                    else:
                        nat_deleted = sum(_delete_nat_of(nat, k, dsr) for k, dsr in outs)
                out.append(MapScan(node, map_name, ct.max_entries, scanned, deleted,
                                   round(time.perf_counter() - t0, 6), nat_deleted))
    finally:
        if nat is not None:
            nat.close()
    return out


def flush_address(pin_dir: str, ip: str) -> tuple[int, int]:
    """Delete every CT entry with ``ip`` as either address, and every NAT entry with it as an address or
    translation, from the maps pinned under ``pin_dir``: Cilium's GC of a removed endpoint.
    Returns (CT entries, NAT entries) deleted."""
    addr = be32(ip)
    ct_deleted = 0
    for map_name in CT_MAPS:
        with PinnedMap(f"{pin_dir}/{map_name}", CtKey4, CtEntry) as ct:
            ct_deleted += ct.items_delete_batch([k for k in ct if addr in (k.daddr, k.saddr)])
    with PinnedMap(f"{pin_dir}/{NAT_MAP}", NatKey4, NatEntry) as nat:
        doomed = [k for k in nat
                  if addr in (k.daddr, k.saddr) or ((v := nat.get(k)) is not None and v.to_addr == addr)]
        nat_deleted = sum(nat.delete(k) for k in doomed)
    return ct_deleted, nat_deleted


def fill_synthetic(pin_dir: str, n: int, now: int) -> None:
    """Write ``n`` made-up TCP entries into the TCP CT map pinned under ``pin_dir``, every other one already
    expired at ``now`` (lifetime now − 1, the others now + 1000), one BPF_MAP_UPDATE_BATCH per 65,536:
    a known mix to time the two scan modes on. Addresses 198.18.x.11 → 198.18.2.11:80, no real flow."""
    key = struct.Struct("<IIHHBB")  # daddr, saddr, dport, sport, nexthdr, flags
    value = struct.Struct("<QQQQIHHHBBIII")  # ct_entry: counters, lifetime, flags, ... src_sec_id
    fd = open_pinned(f"{pin_dir}/{CT_MAPS[0]}")
    try:
        for base in range(0, n, 65536):
            count = min(65536, n - base)
            keys = b"".join(key.pack(0x0B0112C6 + ((i >> 16) << 16), 0x0B0212C6, i & 0xFFFF, 0x5000, 6, 0)
                            for i in range(base, base + count))
            values = b"".join(value.pack(0, 0, 1, 60, now - 1 if i % 2 else now + 1000, 0, 0, 0, 2, 0, 256, 0, 0)
                              for i in range(base, base + count))
            _bpf.update_batch(fd, ctypes.create_string_buffer(keys, len(keys)),
                              ctypes.create_string_buffer(values, len(values)), count)
    finally:
        os.close(fd)


# -- one lab's GC: on demand, and on a timer driven by the lab clock ---------------------------
class LabGc:
    """The garbage collector of a running lab (``lab.gc``).

    :meth:`run` collects now; the lab's GC process (started by ``labkit up`` unless
    the lab was built with ``gc_timer=False``) calls it whenever the *lab clock* has
    passed the last run by the current interval, so ``labkit clock advance 301``
    makes the next run happen within a second. State and the history of runs live in
    ``/run/labkit/<lab>/gc.json``.

        >>> run = lab.gc.run()            # doctest: +SKIP
        >>> print("\\n".join(run.lines()))  # doctest: +SKIP
    """

    HISTORY = 200  #: runs kept in gc.json

    def __init__(self, lab):
        self.lab = lab

    @property
    def path(self):
        return lab_dir(self.lab.name) / "gc.json"

    def state(self) -> dict:
        """``{"interval", "cached", "max_interval", "last_run", "timer", "runs": [...]}``; a lab that never
        collected starts at 5 min."""
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            data = {}
        data.setdefault("interval", START_INTERVAL)
        data.setdefault("cached", 0)  # Cilium's cachedGCInterval: 0 until a run deleted something
        data.setdefault("max_interval", 0)  # --conntrack-gc-max-interval: 0, no cap
        data.setdefault("last_run", None)
        data.setdefault("timer", bool(getattr(self.lab.config, "gc_timer", True)))
        data.setdefault("runs", [])
        return data

    def _save(self, data: dict) -> None:
        if not self.path.exists():
            recorded = {e.get("path") for e in Ledger(self.lab.name).entries("file")}
            for p in (self.path, self.path.with_suffix(".tmp")):
                if str(p) not in recorded:
                    Ledger(self.lab.name).record("file", path=str(p))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.path)

    def due(self) -> bool:
        """True when the timer is on and the lab clock has reached the last run plus the interval."""
        st = self.state()
        if not st["timer"]:
            return False
        last = st["last_run"] if st["last_run"] is not None else st.get("started")
        if last is None:  # the first look: the interval counts from now
            with dir_lock(self.lab.name):
                st = self.state()
                st["started"] = last = self.lab.clock.now()
                self._save(st)
        return self.lab.clock.now() >= last + st["interval"]

    def run(self, mode: str | None = None) -> GcRun:
        """Collect every node now: delete what expired before the lab clock's now, then adapt the interval.
        ``mode``: 'per-entry' or 'batch'; by default the lab's release's (:func:`default_mode`)."""
        mode = mode or default_mode(self.lab.config.cilium)
        with dir_lock(self.lab.name):
            st = self.state()
            now = self.lab.clock.now()
            t0 = time.perf_counter()
            maps: list[MapScan] = []
            faults = self.lab.agent_faults()
            for node in self.lab.topology.nodes:
                maps += collect_node(node.name, self.lab.pin_dir(node.name), now, mode, delete="gc-noop" not in faults)
            interval = int(st["interval"])
            ratio = max((m.ratio for m in maps), default=0.0)
            actual = now - st["last_run"] if st["last_run"] is not None else 0
            cached, cap = int(st["cached"]), int(st["max_interval"])
            nxt, st["cached"] = get_interval(actual, ratio, cached, cap)
            if "gc-fixed-interval" in faults:
                nxt, st["cached"] = interval, cached
            run = GcRun(now, mode, tuple(maps), round(time.perf_counter() - t0, 6), interval, nxt,
                        actual, cached, cap)
            st["interval"], st["last_run"] = run.next_interval, now
            st["runs"] = (st["runs"] + [run.to_json()])[-self.HISTORY:]
            self._save(st)
        JOURNAL.record(self.lab.name, "gc", f"GC run at lab clock {now}", run, mode=mode, now=now)
        self.lab.note_change()
        return run

    def restart(self) -> None:
        """Forget past runs and start again at 5 minutes, counted from now (``lab.reset()`` calls this);
        the timer stays as it is."""
        with dir_lock(self.lab.name):
            st = self.state()
            timer, cap = st["timer"], st["max_interval"]
            self._save({"interval": START_INTERVAL, "cached": 0, "max_interval": cap, "last_run": None,
                        "timer": timer, "runs": [], "started": self.lab.clock.now()})

    def set_max_interval(self, seconds: int) -> None:
        """Cap the computed interval, as the agent's ``--conntrack-gc-max-interval`` does (0: no cap). Like
        Cilium, the cap applies to each new interval, not to the interval the next calculation starts from."""
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
            raise ValueError(f"GC max interval: expected whole seconds, 0 for none, got {seconds!r}")
        with dir_lock(self.lab.name):
            st = self.state()
            st["max_interval"] = seconds
            self._save(st)

    def set_timer(self, on: bool) -> None:
        """Switch the timer on or off (the lab's GC process keeps running and checks every second)."""
        with dir_lock(self.lab.name):
            st = self.state()
            st["timer"] = bool(on)
            if on and st["last_run"] is None:
                st["started"] = self.lab.clock.now()
            self._save(st)

    def history(self) -> list[dict]:
        """Past runs, oldest first (each as :meth:`GcRun.to_json`)."""
        return list(self.state()["runs"])
