"""The lab's Hubble ring: ``/run/labkit/<lab>/hubble.ring``, a fixed file of slots into which the
monitor (:mod:`labkit.observe.monitor`) writes every *reported* trace record and every count of
records the kernel ring had no room for. ``labkit observe`` reads it; nothing else is kept, so its
history is as long as its capacity allows.

Like Hubble's ring (pkg/hubble/container/ring.go, ``NewRing``/``read``): a capacity of 2^n-1 has
2^n slots, sequence number ``seq`` lives in slot ``seq & capacity``, and the slot the writer fills
next is never readable, so a reader sees at most the newest ``capacity`` entries.

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "hubble.ring"
    >>> ring = HubbleRing.create(path, capacity=3)
    >>> for n in range(5):
    ...     ring.append(Slot(kind=SLOT_LOST, node_id=1, lost=n + 1))
    >>> [s.lost for s in HubbleRing.open(path).entries()], ring.written
    ([3, 4, 5], 5)
"""
from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path

from labkit.errors import LabStateError
from labkit.observe.trace import EVENT_SIZE, TraceEvent

__all__ = ["HubbleRing", "Slot", "SLOT_FLOW", "SLOT_LOST", "SLOT_POLICY", "DEFAULT_CAPACITY"]

DEFAULT_CAPACITY = 4095  #: Hubble's default --hubble-event-buffer-capacity
SLOT_FLOW = 1  #: a reported trace record
SLOT_LOST = 2  #: records the node's labkit_events had no room for
SLOT_POLICY = 3  #: the policy verdict notification a record carries (Cilium sends it beside the trace or drop)

_MAGIC = b"LKHUBRNG"
_HEADER = struct.Struct("=8sIIQ")  # magic, capacity, slot size, written (total appended)
_HEADER_SIZE = 64


class Slot(ctypes.LittleEndianStructure):
    """One entry: a reported record (``kind=SLOT_FLOW``) or a lost-events count (``SLOT_LOST``)."""

    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("node_id", ctypes.c_uint8),
        ("pad", ctypes.c_uint16),
        ("pad2", ctypes.c_uint32),
        ("wall_ns", ctypes.c_uint64),  #: wall-clock time of the record (CLOCK_REALTIME ns)
        ("seq", ctypes.c_uint64),  #: its sequence number (a reader checks it was not overwritten)
        ("lost", ctypes.c_uint64),  #: SLOT_LOST: how many records (Hubble's num_events_lost)
        ("lost_total", ctypes.c_uint64),  #: SLOT_LOST: the node's counter when read (all losses so far)
        ("event", TraceEvent),
    ]


SLOT_SIZE = ctypes.sizeof(Slot)
assert SLOT_SIZE == 40 + EVENT_SIZE


def _check_capacity(capacity: int) -> None:
    if capacity < 1 or (capacity + 1) & capacity:
        raise ValueError(f"Hubble ring capacity: expected 2^n-1 (e.g. 4095), got {capacity}")


class HubbleRing:
    """The ring file: :meth:`create` (the monitor) or :meth:`open` (readers)."""

    def __init__(self, path: Path, fd: int, capacity: int, written: int):
        self.path = Path(path)
        self.fd = fd
        self.capacity = capacity
        self.written = written  #: entries appended since the file was made

    @classmethod
    def create(cls, path: Path, capacity: int = DEFAULT_CAPACITY) -> "HubbleRing":
        """Open the ring for writing; an existing file of the same capacity is continued, any other replaced."""
        _check_capacity(capacity)
        path = Path(path)
        try:
            old = cls.open(path)
        except (FileNotFoundError, LabStateError):
            old = None
        if old is not None and old.capacity == capacity:
            os.close(old.fd)
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            return cls(path, fd, capacity, old.written)
        if old is not None:
            os.close(old.fd)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.ftruncate(fd, _HEADER_SIZE + (capacity + 1) * SLOT_SIZE)  # bounded: 2^n slots
        os.pwrite(fd, _HEADER.pack(_MAGIC, capacity, SLOT_SIZE, 0), 0)
        return cls(path, fd, capacity, 0)

    @classmethod
    def open(cls, path: Path) -> "HubbleRing":
        """Open an existing ring read-only; LabStateError when the file is not one."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        head = os.pread(fd, _HEADER.size, 0)
        if len(head) < _HEADER.size or head[:8] != _MAGIC:
            os.close(fd)
            raise LabStateError(f"Hubble ring {path}: expected a labkit ring file, got {len(head)} bytes without its header")
        _, capacity, slot_size, written = _HEADER.unpack(head)
        if slot_size != SLOT_SIZE:
            os.close(fd)
            raise LabStateError(f"Hubble ring {path}: slots of {slot_size} bytes, expected {SLOT_SIZE}")
        return cls(path, fd, capacity, written)

    def close(self) -> None:
        os.close(self.fd)

    def _offset(self, seq: int) -> int:
        return _HEADER_SIZE + (seq & self.capacity) * SLOT_SIZE

    def append(self, slot: Slot) -> None:
        """Write ``slot`` as the next entry, then publish the new count (the writer is the monitor alone)."""
        slot.seq = self.written
        os.pwrite(self.fd, bytes(slot), self._offset(self.written))
        self.written += 1
        os.pwrite(self.fd, struct.pack("=Q", self.written), 16)

    def refresh(self) -> int:
        """Read the writer's count afresh; returns it."""
        self.written = struct.unpack("=Q", os.pread(self.fd, 8, 16))[0]
        return self.written

    def oldest(self) -> int:
        """The sequence number of the oldest readable entry."""
        return max(0, self.written - self.capacity)

    def read(self, start: int) -> tuple[list[Slot], int]:
        """Entries from sequence ``start`` on, and how many of those were already overwritten
        (Hubble's ring would answer ErrInvalidRead for them)."""
        self.refresh()
        first = max(start, self.oldest())
        skipped = first - start if start < first else 0
        out: list[Slot] = []
        for seq in range(first, self.written):
            slot = Slot.from_buffer_copy(os.pread(self.fd, SLOT_SIZE, self._offset(seq)))
            if slot.seq != seq:  # overwritten while we read
                skipped += 1
                continue
            out.append(slot)
        return out, skipped

    def entries(self) -> list[Slot]:
        """Every readable entry, oldest first."""
        return self.read(0)[0]
