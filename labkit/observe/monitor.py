"""The lab's monitor: the one consumer of every node's ``labkit_events`` ring
buffer, appending the records to ``/run/labkit/<lab>/events.bin`` for any
number of readers (``labkit trace``, notebook steps). Cilium's monitor agent
plays the same part between the datapath and Hubble.

It runs inside the lab's agent (:mod:`labkit.agent.daemon`). After every write it records, in ``monitor.pos`` (one u64 per node, in
``pin_dirs`` order), how far into each ring buffer it has consumed *and*
flushed; a reader that needs every event up to now compares those with the
rings' producer positions (:func:`flushed_past`).
"""
from __future__ import annotations

import os
import select
import struct
import threading
import time

from labkit.datapath import bpf as _bpf
from labkit.errors import LabTimeoutError
from labkit.net.ledger import LabState, Ledger, lab_dir
from labkit.observe.trace import EVENT_SIZE

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

    def loop(self, stopping: threading.Event) -> None:
        """Drain until ``stopping`` is set (it looks every 0.2 s)."""
        try:
            while not stopping.is_set():
                self.drain(0.2)
        finally:
            self.out.close()
            os.close(self.pos_fd)

    def drain(self, wait: float) -> None:
        """Wait up to ``wait`` s for records, append what the rings hold, then publish how far it got."""
        try:
            self.poller.poll(wait)
        except InterruptedError:
            return
        wrote = 0
        for ring in self.rings:
            for rec in ring.records():
                self.out.write(rec[:EVENT_SIZE])
                wrote += 1
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
