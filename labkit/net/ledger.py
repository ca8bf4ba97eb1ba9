"""What a lab created, written down as it is created, and the lab's lock.

Everything under ``/run/labkit/<lab>/``:

==============  ==========================================================
``ledger.jsonl``  one JSON line per created object (namespace, pin, process,
                  cgroup, tc filter, file), appended before the next step
``lab.json``      :class:`LabState`: topology, datapath options, status (building / up)
``events.bin``    trace records written by the lab's monitor
``pods/``         pod server logs
==============  ==========================================================

``down`` and ``cleanup`` remove exactly what the ledger lists, newest first,
then check that nothing is left. The lock (``/run/labkit/<lab>.lock``) is
held while a process builds or tears the lab down; another process gets
:class:`~labkit.errors.LabBusyError` naming the holder. The state files other
processes share while the lab runs (``services.json`` and its journal, ``gc.json``) are
read and written under :func:`dir_lock`, a flock of the lab's directory.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterator

from labkit.errors import LabBusyError, LabStateError, NotFoundError

__all__ = ["RUN_DIR", "STATE_VERSION", "LabState", "Ledger", "LabLock", "lab_dir", "mkdir_shared_parent", "dir_lock",
           "file_lock", "process_start_time", "list_labs"]

RUN_DIR = Path(os.environ.get("LABKIT_RUN_DIR", "/run/labkit"))
STATE_VERSION = 1  #: lab.json's layout; a lab whose state has another is rebuilt by ``up``


@dataclass
class LabState:
    """What ``lab.json`` holds: what a lab is and where its parts are, for every process that attaches.

    The file is :meth:`to_dict` as JSON; :meth:`from_dict` reads it back (a missing field takes its default):

    >>> s = LabState("demo", topology={}, config={}, pin_dirs={"node-a": "/sys/fs/bpf/labkit/demo/node-a"})
    >>> LabState.from_dict(s.to_dict()) == s, s.status, sorted(s.to_dict())[:4]
    (True, 'building', ['cgroups', 'config', 'created', 'devices'])
    """

    lab: str
    topology: dict  #: :meth:`Topology.to_dict` of the lab (rewritten when a pod is removed)
    config: dict  #: :meth:`DatapathConfig.to_dict`
    pin_dirs: dict[str, str]  #: node → the bpffs directory its maps are pinned in
    status: str | None = "building"  #: 'building', then 'up' (None: a lab.json that does not say)
    version: int = STATE_VERSION
    owner_pid: int = 0  #: the process that asked for it (a notebook's kernel, a ``labkit up``)
    owner_uid: int = 0  #: the user it belongs to (:mod:`labkit.door.owners`): they alone, and instructors, may use it
    created: float = 0.0  #: wall-clock time the build started
    devices: dict[str, dict[str, str]] = field(default_factory=dict)  #: node → {ifindex as text: device}
    cgroups: dict[str, str] = field(default_factory=dict)  #: node or pod → its cgroup (none without cgroup v2)
    faults: int = 0
    timings: dict[str, float] = field(default_factory=dict)  #: seconds per build phase
    images: dict[str, str] = field(default_factory=dict)  #: node → how its programs were had: compiled, cached, preloaded

    def to_dict(self) -> dict:
        """The JSON object of lab.json."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "LabState":
        """The state of a lab.json object; fields it lacks take their defaults (no version or status: none,
        so such a lab is neither reused nor attached), unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{"topology": {}, "config": {}, "pin_dirs": {}, "lab": "", "version": 0, "status": None,
                      **{k: v for k, v in data.items() if k in known}})

    @classmethod
    def read(cls, lab: str) -> "LabState":
        """The lab's lab.json; LabStateError when it has none or it is unreadable."""
        return cls.from_dict({"lab": lab, **Ledger(lab).read_state()})

    def write(self) -> None:
        """Replace the lab's lab.json with this state."""
        Ledger(self.lab).write_state(self.to_dict())


def _primary_gid(uid: int) -> int:
    """The primary group of user ``uid`` (0 for root or a uid without a passwd entry)."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid if uid else 0
    except KeyError:
        return 0


def lab_dir(lab: str) -> Path:
    """``/run/labkit/<lab>``."""
    return RUN_DIR / lab


@contextlib.contextmanager
def dir_lock(lab: str, shared: bool = False) -> Iterator[None]:
    """Hold a flock of ``/run/labkit/<lab>``: exclusive for a writer of the lab's shared state files,
    ``shared`` for a reader, so no reader sees half a file. Blocks until granted.

    >>> with dir_lock("no-such-lab"):  # doctest: +SKIP
    ...     pass
    Traceback (most recent call last):
    labkit.errors.NotFoundError: lab 'no-such-lab' is not up (no /run/labkit/no-such-lab)
    """
    path = lab_dir(lab)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotFoundError(f"lab '{lab}' is not up (no {path})") from None
    with _flocked(fd, shared):
        yield


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock of the file ``path`` (created if missing). Blocks until granted."""
    with _flocked(os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600), False):
        yield


@contextlib.contextmanager
def _flocked(fd: int, shared: bool) -> Iterator[None]:
    """flock ``fd`` (shared or exclusive) until the block ends, then close it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def list_labs() -> list[str]:
    """Names of labs with state on this machine."""
    if not RUN_DIR.is_dir():
        return []
    return sorted(p.name for p in RUN_DIR.iterdir() if p.is_dir() and (p / "ledger.jsonl").exists())


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks (field 22 of /proc/pid/stat), None if gone.

    Recorded with every process so cleanup never signals a recycled pid.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # exited, waiting to be reaped: as good as gone
        _reap(pid)
        return None
    return int(fields[19])


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@dataclass
class Ledger:
    """Append-only record of what lab ``lab`` created."""

    lab: str

    @property
    def dir(self) -> Path:
        return lab_dir(self.lab)

    @property
    def path(self) -> Path:
        return self.dir / "ledger.jsonl"

    def exists(self) -> bool:
        """Whether this lab has a ledger at all."""
        return self.path.exists()

    def start(self, owner: int = 0) -> None:
        """Create the lab directory and an empty ledger (the directory is its first entry). The directory is
        root's, readable by the lab's ``owner`` through its group (the owner's own group; for root's labs
        root's) and by no one else: the owner reads what the lab recorded and writes none of it."""
        created = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(self.dir, 0, _primary_gid(owner))
        os.chmod(self.dir, 0o750)
        self.path.touch()
        if created:
            self.record("dir", path=str(self.dir))
        # The ledger file itself is removed last by teardown, not listed in itself.

    def record(self, kind: str, **fields) -> dict:
        """Append one created object; flushed to disk before returning."""
        entry = {"kind": kind, **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return entry

    def record_process(self, name: str, pid: int, **fields) -> dict:
        """Record a process with its start time."""
        return self.record("process", name=name, pid=pid, start=process_start_time(pid), **fields)

    def entries(self, kind: str | None = None) -> list[dict]:
        """Recorded objects, oldest first (``kind`` filters)."""
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                if kind is None or entry["kind"] == kind:
                    out.append(entry)
        return out

    def forget(self, predicate) -> None:
        """Rewrite the ledger without the entries ``predicate`` accepts (after removing them)."""
        keep = [e for e in self.entries() if not predicate(e)]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in keep))
        os.replace(tmp, self.path)

    # -- lab.json -----------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.dir / "lab.json"

    def read_state(self) -> dict:
        """lab.json's object (:meth:`LabState.read` types it), or LabStateError when the lab has none."""
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            raise LabStateError(f"lab '{self.lab}' is not up (no {self.state_path})") from None
        except ValueError as exc:
            raise LabStateError(
                f"lab '{self.lab}': state file {self.state_path} is unreadable ({exc}); "
                f"`labkit --lab {self.lab} cleanup` removes what the lab created"
            ) from None

    def write_state(self, state: dict) -> None:
        """Replace lab.json atomically (recorded in the ledger the first time)."""
        first = not self.state_path.exists()
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)
        if first:
            self.record("file", path=str(self.state_path))


def mkdir_shared_parent(path: Path, attempts: int = 10) -> None:
    """Make directory ``path`` (not there yet) in a parent every lab shares — ``/sys/fs/bpf/labkit`` or the
    ``labkit`` cgroup — which a lab's cleanup removes once it is empty (:class:`LabLock` retries the same way
    for ``/run/labkit``). Labs come up and go
    down side by side (``labkit grade --jobs 2``): the parent may vanish between its creation and the child's,
    so it is made again; once the child exists the parent is not empty and stays.

        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> mkdir_shared_parent(d / "labkit" / "demo"); (d / "labkit" / "demo").is_dir()
        True
    """
    for _ in range(attempts - 1):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir()
            return
        except FileNotFoundError:  # another lab's cleanup took the empty parent away meanwhile
            continue
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir()


class LabLock:
    """An exclusive, non-blocking flock on ``/run/labkit/<lab>.lock``.

    >>> import tempfile, os
    >>> os.environ.setdefault("LABKIT_RUN_DIR", tempfile.mkdtemp())  # doctest: +SKIP
    """

    def __init__(self, lab: str, purpose: str):
        self.lab = lab
        self.purpose = purpose
        self.path = RUN_DIR / f"{lab}.lock"
        self.fd: int | None = None

    def acquire(self) -> "LabLock":
        """Take the lock or raise LabBusyError naming the live holder."""
        for _ in range(10):
            RUN_DIR.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # another lab's cleanup removed the empty run directory meanwhile
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = self._holder(fd)
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise LabBusyError(
                        exc.errno,
                        f"lab '{self.lab}' is held by another live process ({holder}); "
                        f"expected no other labkit process working on it",
                    ) from None
                raise
            # The file may have been unlinked by a releasing holder: lock the current one.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"pid {os.getpid()} ({self.purpose})".encode())
                self.fd = fd
                return self
            os.close(fd)
        raise LabBusyError(errno.EAGAIN, f"lab '{self.lab}': could not take {self.path} (kept changing)")

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            return os.pread(fd, 200, 0).decode(errors="replace") or "unknown process"
        except OSError:
            return "unknown process"

    def release(self, remove: bool = False) -> None:
        """Let go; ``remove`` also deletes the lock file (after down)."""
        if self.fd is None:
            return
        if remove:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> "LabLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def wait_gone(pid: int, start: int | None, timeout: float) -> bool:
    """Poll until process ``pid`` (with that start time) has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_start_time(pid) != start:
            return True
        time.sleep(0.005)
    return False
