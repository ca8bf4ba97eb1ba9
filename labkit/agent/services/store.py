"""Where a lab's services are kept between calls and processes: a snapshot and a journal.

The snapshot is ``/run/labkit/<lab>/services.json`` (the layout labkit always wrote, so a lab made
before the journal existed loads as it is); every change after it is one JSON line appended to
``services.journal``: ``{"op": "put", "service": {...}, "backend_ids": {...}, "freed": [...],
"next_service_id": n, "next_backend_id": m}`` or ``{"op": "del", "name": ...}`` with the same ids.
Records are absolute (they name the whole service and the next ids), so replaying one twice is
harmless. Each record starts with ``"seq": n``, one more than the record before it, and the snapshot
starts with the ``seq`` of the last record it holds, so a journal that lost lines in its middle, or
starts after a gap, is told from a whole one (:meth:`JsonStore.scan`, which
:mod:`labkit.agent.services.restore` reads); files written before ``seq`` existed still load.
A lab's state is the snapshot plus the journal replayed
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
import re
from dataclasses import dataclass
from typing import Iterator, Protocol

from labkit.errors import ConfigError
from labkit.net.ledger import Ledger, dir_lock, lab_dir

__all__ = ["ServiceStore", "JsonStore", "MemoryStore", "Mark", "Scan", "COMPACT_RATIO", "COMPACT_MIN", "replay",
           "scan_records"]

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

    def append_many(self, records: list[dict]) -> int:
        """Several records at once (one write); returns the journal's new end."""
        ...

    def save(self, data: dict) -> Mark: ...
    def scan(self) -> "Scan":
        """The snapshot and journal read without trusting them (:func:`scan_records`)."""
        ...

    def exists(self) -> bool: ...
    def lock(self) -> contextlib.AbstractContextManager: ...


#: The fields a journal record cannot do without, by ``op``.
REQUIRED = {"put": ("service", "next_service_id", "next_backend_id"),
            "del": ("name", "next_service_id", "next_backend_id")}
_SERVICE_REQUIRED = ("name", "vip", "port", "protocol", "id", "backends")


@dataclass
class Scan:
    """What a damage-tolerant read of a store found (:meth:`JsonStore.scan`).

    ``records`` are the ones to replay over ``snapshot``, in order, up to the first damage;
    ``later`` are records that still parse after it (they can name a service, not change one);
    ``problems`` are sentences naming the file and line, what was expected and what was found;
    ``torn``: the journal ends mid-line (a writer was killed there: the maps may be one change ahead).
    """

    snapshot: dict
    records: list[dict]
    later: list[dict]
    problems: list[str]
    damaged: bool
    torn: bool = False
    last_seq: int = 0
    #: where a reader that replayed these records stands (None: unknown); with it, an agent can serve the
    #: scanned state without reading the store a second time
    mark: "Mark | None" = None


def scan_records(snapshot: dict | None, lines, journal: str = "services.journal", snap_problem: str | None = None,
                 torn: bool = False) -> Scan:
    """Check ``lines`` (``(line number, raw bytes or a dict)``) after ``snapshot``: each parses, has the
    fields its op needs, and carries the ``seq`` after the one before (records the snapshot already
    holds, left by a compaction killed before it emptied the journal, are skipped). Replay stops at
    the first damage.

    >>> ok = scan_records({"seq": 4}, [(1, b'{"seq":5,"op":"del","name":"a","next_service_id":1,"next_backend_id":1}')])
    >>> len(ok.records), ok.damaged
    (1, False)
    >>> gap = scan_records({"seq": 4}, [(1, b'{"seq":7,"op":"del","name":"a","next_service_id":1,"next_backend_id":1}')])
    >>> gap.damaged, gap.problems[0]
    (True, 'services.journal line 1: expected record seq 5, found seq 7 (records 5-6 are missing)')
    """
    problems = [snap_problem] if snap_problem else []
    damaged = bool(snap_problem)
    snapshot = snapshot or {}
    snap_seq = _int(snapshot.get("seq", 0)) if not snap_problem else None
    expected = None if snap_seq is None else snap_seq + 1
    records: list[dict] = []
    later: list[dict] = []
    last = snap_seq or 0
    for n, raw in lines:
        rec, problem = _parse_record(raw)
        if problem is None and not damaged:
            seq = rec.get("seq")
            if seq is not None and expected is not None and seq != expected:
                if not records and snap_seq is not None and seq <= snap_seq:
                    continue  # already in the snapshot
                lost = f"records {expected}-{seq - 1} are" if seq > expected + 1 else f"record {expected} is"
                problem = (f"expected record seq {expected}, found seq {seq} "
                           + (f"({lost} missing)" if seq > expected else "(out of order)"))
            if problem is None:
                expected = (seq if seq is not None else (expected or 0)) + 1
                last = expected - 1
                records.append(rec)
                continue
        if problem is not None:
            problems.append(f"{journal} line {n}: {problem}")
            damaged = True
        if rec is not None:
            later.append(rec)
    return Scan(snapshot, records, later, problems, damaged, torn, last)


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _parse_record(raw) -> tuple[dict | None, str | None]:
    """A journal line as a record, or None and what is wrong with it."""
    if isinstance(raw, (bytes, str)):
        try:
            rec = json.loads(raw)
        except ValueError as exc:
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            shown = text if len(text) <= 40 else text[:37] + "..."
            return None, f"expected a JSON record, found {shown!r} ({exc})"
    else:
        rec = raw
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, found {type(rec).__name__}"
    op = rec.get("op")
    if op not in REQUIRED:
        return None, f"expected op 'put' or 'del', found {op!r}"
    missing = [f for f in REQUIRED[op] if f not in rec]
    if op == "put" and isinstance(rec.get("service"), dict):
        missing += [f"service.{f}" for f in _SERVICE_REQUIRED if f not in rec["service"]]
    elif op == "put" and "service" in rec:
        missing.append("service (an object)")
    if missing:
        return None, f"expected a {op} record with {', '.join(missing)}; found one without"
    return rec, None


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

    def scan(self) -> Scan:
        """The snapshot and journal read without trusting them (:func:`scan_records`): nothing is
        written, a torn last line is left where it is."""
        with contextlib.ExitStack() as stack:
            if not self._held:
                stack.enter_context(dir_lock(self.lab, shared=True))
            snap, problem = {}, None
            try:
                text = self.path.read_text()
                snap = json.loads(text) if text.strip() else {}
                if not isinstance(snap, dict):
                    raise ValueError(f"a JSON {type(snap).__name__}")
            except FileNotFoundError:
                pass
            except (ValueError, UnicodeDecodeError) as exc:
                snap, problem = {}, f"{self.path}: expected the services snapshot as a JSON object, found {exc}"
            try:
                raw = self.journal.read_bytes()
            except FileNotFoundError:
                raw = b""
            ident = self._ident()
        complete = raw[:raw.rfind(b"\n") + 1]
        lines = list(enumerate(complete.splitlines(), start=1))
        scan = scan_records(snap, lines, str(self.journal), problem, torn=len(complete) < len(raw))
        scan.mark = Mark(ident, len(complete), len(lines))
        return scan

    def _record_in_ledger(self, path) -> None:
        if str(path) in self._recorded:
            return
        if not path.exists() and str(path) not in {e.get("path") for e in self._ledger.entries("file")}:
            self._ledger.record("file", path=str(path))  # before it exists: teardown removes it
        self._recorded.add(str(path))

    def append(self, record: dict) -> int:
        """One record at the end of the journal; returns the journal's new size."""
        return self.append_many([record])

    def append_many(self, records: list[dict]) -> int:
        """Records at the end of the journal, in one ``write(2)`` (a bulk apply); returns its new size."""
        self._record_in_ledger(self.journal)
        with contextlib.ExitStack() as stack:
            if not self._held:
                stack.enter_context(dir_lock(self.lab))
            fd = os.open(self.journal, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            try:
                _cut_torn_line(fd)
                seq = self._last_seq(fd)
                dumps = json.JSONEncoder(separators=(",", ":")).encode
                raw = "".join(dumps({"seq": seq + i, **rec}) + "\n" for i, rec in enumerate(records, 1)).encode()
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                end = os.fstat(fd).st_size
            finally:
                os.close(fd)
        return end

    def save(self, data: dict) -> Mark:
        """A new snapshot (written beside it and renamed over it), then an empty journal. The snapshot
        carries the ``seq`` of the journal's last record (``data['seq']`` if it names one)."""
        tmp = self.path.with_name(self.path.name + ".new")
        self._record_in_ledger(self.path)
        self._record_in_ledger(tmp)  # only there if a compaction was killed mid-write; teardown removes it
        with contextlib.ExitStack() as stack:
            if not self._held:
                stack.enter_context(dir_lock(self.lab))
            seq = data.get("seq")
            if seq is None:
                try:
                    fd = os.open(self.journal, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    seq = self._snapshot_seq()
                else:
                    try:
                        seq = self._last_seq(fd)
                    finally:
                        os.close(fd)
            body = {k: v for k, v in data.items() if k != "seq"}
            raw = json.dumps({"seq": int(seq), **body}, separators=(",", ":")).encode()  # compact: the C encoder
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, raw)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)  # then the journal: a crash between replays records already in
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.journal, 0)
            return Mark(self._ident(), 0, 0)

    def _snapshot_seq(self) -> int:
        """The ``seq`` the snapshot starts with (0: none, or a snapshot from before ``seq``)."""
        try:
            with open(self.path, "rb") as f:
                head = f.read(64)
        except FileNotFoundError:
            return 0
        m = _SEQ.match(head)
        return int(m.group(1)) if m else 0

    def _last_seq(self, fd: int) -> int:
        """The ``seq`` of the journal's last record (its last complete line: the cost of one line);
        if that line has none (a journal from before ``seq``), the snapshot's plus the records counted."""
        size = os.fstat(fd).st_size
        if size == 0:
            return self._snapshot_seq()
        end = size if os.pread(fd, 1, size - 1) == b"\n" else None
        if end is not None:
            start = end - 1
            while start > 0:
                step = min(start, 4096)
                nl = os.pread(fd, step, start - step).rfind(b"\n")
                if nl >= 0:
                    start = start - step + nl + 1
                    break
                start -= step
            m = _SEQ.match(os.pread(fd, 64, start))
            if m:
                return int(m.group(1))
        data = os.pread(fd, size, 0)
        return self._snapshot_seq() + data[:data.rfind(b"\n") + 1].count(b"\n")

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


_SEQ = re.compile(rb'\{"seq":(\d+)[,}]')


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
        self.seq = int(self.snapshot.get("seq", 0))
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

    def scan(self) -> Scan:
        """As :meth:`JsonStore.scan`, over the records in memory (a test may put any value in them)."""
        scan = scan_records(json.loads(json.dumps(self.snapshot)),
                            list(enumerate(json.loads(json.dumps(self.records)), start=1)), "journal")
        scan.mark = Mark(self.generation, len(self.records), len(self.records))
        return scan

    def append(self, record: dict) -> int:
        return self.append_many([record])

    def append_many(self, records: list[dict]) -> int:
        for record in records:
            self.seq += 1
            self.records.append(json.loads(json.dumps({"seq": self.seq, **record})))
        self.saves += 1
        return len(self.records)

    def save(self, data: dict) -> Mark:
        self.seq = int(data.get("seq", self.seq))
        self.snapshot = json.loads(json.dumps({**data, "seq": self.seq}))
        self.records = []
        self.generation += 1
        self.saves += 1
        return Mark(self.generation, 0, 0)

    def exists(self) -> bool:
        return bool(self.snapshot or self.records)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        yield
