"""Where a lab's services are kept between calls and processes: a snapshot and a journal.

The snapshot is ``/run/labkit/<lab>/services.json`` (the layout labkit always wrote, so a lab made
before the journal existed loads as it is); every change after it is one JSON line appended to
``services.journal``: ``{"op": "put", "service": {...}, "backend_ids": {...}, "freed": [...],
"next_service_id": n, "next_backend_id": m}`` or ``{"op": "del", "name": ...}`` with the same ids.
Records are absolute (they name the whole service and the next ids), so replaying one twice is
harmless. A lab's state is the snapshot plus the journal replayed
(:meth:`labkit.agent.services.ids.AgentState.from_json`); when the journal holds more than
:data:`COMPACT_RATIO` times as many records as there are services, the agent writes a new
snapshot and empties the journal (:meth:`JsonStore.save`), so a change costs one line and
compaction's O(services) is paid once per O(services) changes.

:meth:`JsonStore.load` takes a :class:`Mark` (how far a reader got): if the snapshot is the one it
read, only the records after it come back, which is how a second process (a CLI command beside a
notebook) catches up without reading everything. :class:`MemoryStore` is the same in memory.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Iterator, Protocol

from labkit.errors import ConfigError
from labkit.net.ledger import Ledger, dir_lock, lab_dir

__all__ = ["ServiceStore", "JsonStore", "MemoryStore", "Mark", "COMPACT_RATIO", "COMPACT_MIN", "replay"]

#: A new snapshot once the journal has this many records per service (and at least :data:`COMPACT_MIN`).
COMPACT_RATIO = 2
COMPACT_MIN = 256


@dataclass(frozen=True)
class Mark:
    """How far a reader got: which snapshot (``snapshot``: an identity, None for none), how far into
    the journal (``offset``: bytes or records), and how many records that is (``records``)."""

    snapshot: object = None
    offset: int = 0
    records: int = 0


class ServiceStore(Protocol):
    """Where the agent keeps its services between calls and processes."""

    def load(self, since: Mark | None = None) -> tuple[dict | None, list[dict], Mark]:
        """(the snapshot, or None if ``since`` still holds; the records after it; where that leaves the reader)."""
        ...

    def append(self, record: dict) -> int:
        """One record at the journal's end; returns the journal's new end (a :attr:`Mark.offset`)."""
        ...

    def save(self, data: dict) -> Mark: ...
    def exists(self) -> bool: ...
    def lock(self) -> contextlib.AbstractContextManager: ...


def replay(data: dict, records: list[dict]) -> dict:
    """The snapshot ``data`` with ``records`` applied, in the snapshot's layout (no topology needed)."""
    if not data and not records:
        return {}
    services = {s["name"]: s for s in (data or {}).get("services", [])}
    ids = dict((data or {}).get("backend_ids", {}))
    out = {"version": (data or {}).get("version", 1), "next_service_id": (data or {}).get("next_service_id", 1),
           "next_backend_id": (data or {}).get("next_backend_id", 1)}
    for rec in records:
        if rec["op"] == "put":
            services[rec["service"]["name"]] = rec["service"]
            ids.update(rec.get("backend_ids", {}))
        else:
            services.pop(rec["name"], None)
        for l4 in rec.get("freed", ()):
            ids.pop(l4, None)
        out["next_service_id"], out["next_backend_id"] = rec["next_service_id"], rec["next_backend_id"]
    return {**out, "services": list(services.values()), "backend_ids": ids}


class JsonStore:
    """``/run/labkit/<lab>/services.json`` and ``services.journal``, both in the lab's ledger.

    Writers hold an exclusive flock of the lab directory, so two processes adding
    services at once allocate different ids; a reader outside a writer's lock takes
    it shared, so it never reads half a record. A record is one ``write(2)`` with ``O_APPEND``;
    a last line without its newline (a writer killed mid-write) is not a record yet.
    """

    def __init__(self, lab: str):
        self.lab = lab
        self.dir = lab_dir(lab)
        self.path = self.dir / "services.json"
        self.journal = self.dir / "services.journal"
        self._ledger = Ledger(lab)
        self._held = False  # this object holds the exclusive lock (load() must not ask again)
        self._recorded: set[str] = set()

    def load(self, since: Mark | None = None) -> tuple[dict | None, list[dict], Mark]:
        try:
            if self._held:
                return self._read(since)
            with dir_lock(self.lab, shared=True):
                return self._read(since)
        except ValueError as exc:
            raise ConfigError(f"lab '{self.lab}': the service list ({self.path}, {self.journal}) is unreadable "
                              f"({exc}); `labkit --lab {self.lab} cleanup` removes what the lab created") from None

    @property
    def data(self) -> dict:
        """The state as one document (the snapshot with the journal replayed)."""
        snap, records, _ = self.load()
        return replay(snap, records)

    def _ident(self):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self, since: Mark | None) -> tuple[dict | None, list[dict], Mark]:
        ident = self._ident()
        try:
            size = os.stat(self.journal).st_size
        except FileNotFoundError:
            size = 0
        if since is not None and since.snapshot == ident and since.offset <= size:
            records, end = self._records(since.offset)
            return None, records, Mark(ident, end, since.records + len(records))
        snap = {}
        if ident is not None:
            text = self.path.read_text()
            snap = json.loads(text) if text else {}
        records, end = self._records(0)
        return snap, records, Mark(ident, end, len(records))

    def _records(self, offset: int) -> tuple[list[dict], int]:
        try:
            with open(self.journal, "rb") as f:
                f.seek(offset)
                raw = f.read()
        except FileNotFoundError:
            return [], 0
        complete = raw[:raw.rfind(b"\n") + 1]  # a torn last line is not a record
        records = []
        for n, line in enumerate(complete.splitlines(), start=1):
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise ValueError(f"journal record {n} after byte {offset}: {exc}") from None
        return records, offset + len(complete)

    def _record_in_ledger(self, path) -> None:
        if str(path) in self._recorded:
            return
        if not path.exists() and str(path) not in {e.get("path") for e in self._ledger.entries("file")}:
            self._ledger.record("file", path=str(path))  # before it exists: teardown removes it
        self._recorded.add(str(path))

    def append(self, record: dict) -> int:
        """One record at the end of the journal; returns the journal's new size."""
        self._record_in_ledger(self.journal)
        raw = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        with contextlib.ExitStack() as stack:
            if not self._held:
                stack.enter_context(dir_lock(self.lab))
            fd = os.open(self.journal, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            try:
                _cut_torn_line(fd)
                os.write(fd, raw)
                end = os.fstat(fd).st_size
            finally:
                os.close(fd)
        return end

    def save(self, data: dict) -> Mark:
        """A new snapshot (written beside it and renamed over it), then an empty journal."""
        tmp = self.path.with_name(self.path.name + ".new")
        self._record_in_ledger(self.path)
        self._record_in_ledger(tmp)  # only there if a compaction was killed mid-write; teardown removes it
        raw = json.dumps(data, separators=(",", ":")).encode()  # compact: the C encoder, fast
        with contextlib.ExitStack() as stack:
            if not self._held:
                stack.enter_context(dir_lock(self.lab))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, raw)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)  # then the journal: a crash between replays records already in
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.journal, 0)
            return Mark(self._ident(), 0, 0)

    def exists(self) -> bool:
        return self.path.exists() or self.journal.exists()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        with dir_lock(self.lab):
            self._held = True
            try:
                yield
            finally:
                self._held = False


def _cut_torn_line(fd: int) -> None:
    """If the journal ends mid-line (its writer was killed), cut that line off so the next record
    starts on a line of its own."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    start = max(0, size - 65536)
    while True:
        chunk = os.pread(fd, size - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0 or start == 0:
            os.ftruncate(fd, start + nl + 1)
            return
        start = max(0, start - 65536)


class MemoryStore:
    """A :class:`ServiceStore` in memory (examples and tests): ``data`` is the state as one document,
    ``saves`` counts records and snapshots written."""

    def __init__(self, data: dict | None = None):
        self.snapshot = json.loads(json.dumps(data or {}))
        self.records: list[dict] = []
        self.generation = 0
        self.saves = 0

    @property
    def data(self) -> dict:
        return replay(self.snapshot, self.records)

    def load(self, since: Mark | None = None) -> tuple[dict | None, list[dict], Mark]:
        n = len(self.records)
        if since is not None and since.snapshot == self.generation and since.offset <= n:
            return None, json.loads(json.dumps(self.records[since.offset:])), Mark(self.generation, n, n)
        return json.loads(json.dumps(self.snapshot)), json.loads(json.dumps(self.records)), Mark(self.generation, n, n)

    def append(self, record: dict) -> int:
        self.records.append(json.loads(json.dumps(record)))
        self.saves += 1
        return len(self.records)

    def save(self, data: dict) -> Mark:
        self.snapshot = json.loads(json.dumps(data))
        self.records = []
        self.generation += 1
        self.saves += 1
        return Mark(self.generation, 0, 0)

    def exists(self) -> bool:
        return bool(self.snapshot or self.records)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        yield
