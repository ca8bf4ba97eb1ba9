"""The lab's monitor: the one consumer of every node's ``labkit_events`` ring
buffer, appending the records to ``/run/labkit/<lab>/events.bin`` for any
number of readers (``labkit trace``, notebook steps). Cilium's monitor agent
plays the same part between the datapath and Hubble.

It also plays Hubble's observer: each record the hook marked TRACE_R_REPORTED
(what Cilium at the lab's aggregation level would have emitted) goes into the
lab's Hubble ring (:mod:`labkit.observe.ring`), and growth of a node's
``labkit_events_lost`` counter (records the kernel ring had no room for)
becomes a lost-events entry there, as Hubble reports PERF_EVENT_RING_BUFFER
losses. Two agent faults break that part (``labkit fault on NAME``; lab 13's
exercises): ``hubble-no-aggregation`` puts every record into the ring, reported
or not, and ``monitor-no-lost`` never reports a loss.

It runs inside the lab's agent (:mod:`labkit.agent.daemon`). After every write it records, in ``monitor.pos`` (one u64 per node, in
``pin_dirs`` order), how far into each ring buffer it has consumed *and*
flushed; a reader that needs every event up to now compares those with the
rings' producer positions (:func:`flushed_past`).
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import struct
import threading
import time

from labkit.constants import POLICY_V_SHIFT
from labkit.datapath import bpf as _bpf
from labkit.errors import DatapathError, LabTimeoutError
from labkit.net.ledger import LabState, Ledger, lab_dir
from labkit.config import DatapathConfig
from labkit.maps.base import PinnedMap
from labkit.observe.ring import SLOT_FLOW, SLOT_LOST, SLOT_POLICY, HubbleRing, Slot
from labkit.observe.trace import EVENT_SIZE, Report, TraceEvent


class _U32(ctypes.c_uint32):
    """Key of the one-entry lost counter."""

__all__ = ["Monitor", "ROTATE_BYTES", "flushed_past"]

ROTATE_BYTES = 64 * 1024 * 1024  # keep at most two files of this size


class Monitor:
    """The drain loop: open every node's ring buffer and ``events.bin``, then :meth:`loop` until told to stop.

    The lab's agent runs it on a thread of its own (:mod:`labkit.agent.daemon`).
    A restarted agent goes on where the last one stopped: the rings keep their
    consumer position, so nothing the kernel wrote in between is lost (unless a ring filled up).
    """

    def __init__(self, lab: str):
        self.lab = lab
        state = LabState.read(lab)
        self.rings = [_bpf.RingBuffer(_bpf.obj_get(f"{pin}/labkit_events")) for pin in state.pin_dirs.values()]
        self.path = lab_dir(lab) / "events.bin"
        self.pos_fd = os.open(lab_dir(lab) / "monitor.pos", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.poller = select.epoll()
        for ring in self.rings:
            self.poller.register(ring.fd, select.EPOLLIN)
        self.out = open(self.path, "ab")
        self.records = 0  #: how many records it has written since it started
        capacity = DatapathConfig.from_dict(state.config).hubble_buffer_size
        self.hubble = HubbleRing.create(lab_dir(lab) / "hubble.ring", capacity)
        self.node_ids = [self._node_id(state, node) for node in state.pin_dirs]
        self.lost_maps = [self._open_lost(pin) for pin in state.pin_dirs.values()]
        self.lost_seen = [self._lost(i) for i in range(len(self.lost_maps))]
        self.faults_path = lab_dir(lab) / "faults.json"
        self._faults: tuple[int | None, frozenset] = (None, frozenset())

    def faults(self) -> frozenset:
        """The agent faults switched on (``faults.json``, read again only when it changed)."""
        try:
            mtime = os.stat(self.faults_path).st_mtime_ns
        except FileNotFoundError:
            return frozenset()
        if mtime != self._faults[0]:
            try:
                names = frozenset(json.loads(self.faults_path.read_text()))
            except (FileNotFoundError, ValueError):
                names = frozenset()
            self._faults = (mtime, names)
        return self._faults[1]

    @staticmethod
    def _node_id(state: LabState, node: str) -> int:
        for n in state.topology.get("nodes", []):
            if n.get("name") == node:
                return int(n.get("node_id", 0))
        return 0

    @staticmethod
    def _open_lost(pin: str) -> "PinnedMap | None":
        try:
            return PinnedMap(f"{pin}/labkit_events_lost", _U32, ctypes.c_uint64)
        except (OSError, DatapathError):  # a datapath built before the counter existed
            return None

    def _lost(self, index: int) -> int:
        if self.lost_maps[index] is None:
            return 0
        value = self.lost_maps[index].get(_U32(0))
        return int(value.value) if value is not None else 0

    def loop(self, stopping: threading.Event) -> None:
        """Drain until ``stopping`` is set (it looks every 0.2 s)."""
        try:
            while not stopping.is_set():
                self.drain(0.2)
        finally:
            self.out.close()
            os.close(self.pos_fd)
            self.hubble.close()
            for m in self.lost_maps:
                if m is not None:
                    m.close()

    def drain(self, wait: float) -> None:
        """Wait up to ``wait`` s for records, append what the rings hold, then publish how far it got."""
        try:
            self.poller.poll(wait)
        except InterruptedError:
            return
        wrote = 0
        wall_minus_mono = time.time_ns() - time.monotonic_ns()
        faults = self.faults()
        every = "hubble-no-aggregation" in faults
        for i, ring in enumerate(self.rings):
            for rec in ring.records():
                self.out.write(rec[:EVENT_SIZE])
                wrote += 1
                ev = TraceEvent.from_buffer_copy(rec[:EVENT_SIZE])
                if ev.flags >> POLICY_V_SHIFT:
                    # Cilium's send_policy_verdict_notify goes out before the packet's drop or trace notification,
                    # and monitor aggregation does not apply to it.
                    self.hubble.append(Slot(kind=SLOT_POLICY, node_id=ev.node_id,
                                            wall_ns=ev.ts_ns + wall_minus_mono, event=ev))
                if ev.report & Report.REPORTED or every:
                    self.hubble.append(Slot(kind=SLOT_FLOW, node_id=ev.node_id, wall_ns=ev.ts_ns + wall_minus_mono,
                                            event=ev))
            lost = self._lost(i)
            if lost > self.lost_seen[i]:
                if "monitor-no-lost" in faults:  # the loss goes unreported, and is not reported later either
                    self.lost_seen[i] = lost
                    continue
                self.hubble.append(Slot(kind=SLOT_LOST, node_id=self.node_ids[i], wall_ns=time.time_ns(),
                                        lost=lost - self.lost_seen[i], lost_total=lost))
                self.lost_seen[i] = lost
        if wrote:
            self.out.flush()
            self.records += wrote
        os.pwrite(self.pos_fd, struct.pack(f"={len(self.rings)}Q", *(r.consumer_pos() for r in self.rings)), 0)
        if wrote and self.out.tell() > ROTATE_BYTES:
            self.out.close()
            rotated = self.path.with_suffix(".bin.1")
            if not rotated.exists():
                Ledger(self.lab).record("file", path=str(rotated))
            os.replace(self.path, rotated)
            self.out = open(self.path, "ab")


def flushed_past(lab: str, pin_dirs: dict[str, str], timeout: float = 2.0) -> None:
    """Return once the monitor has written out every event the kernel produced before this call."""
    targets = []
    for pin in pin_dirs.values():
        fd = _bpf.obj_get(f"{pin}/labkit_events")
        try:
            targets.append(_bpf.ringbuf_producer_pos(fd))
        finally:
            os.close(fd)
    path = lab_dir(lab) / "monitor.pos"
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        if len(data) == 8 * len(targets):
            done = struct.unpack(f"={len(targets)}Q", data)
            if all(d >= t for d, t in zip(done, targets)):
                return
        if time.monotonic() > deadline:
            raise LabTimeoutError(f"lab '{lab}': the trace monitor has not caught up after {timeout} s (is the lab's agent running? `labkit agent status`)")
        time.sleep(0.001)
