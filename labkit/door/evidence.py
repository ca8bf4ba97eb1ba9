"""Where labkitd keeps what checks grade: each lab's evidence journal and its check results, in files its owner
can read and not write.

Steps, snapshots, clock moves, GC runs and faults are recorded by labkitd itself as they happen
(:class:`labkit.observe.evidence.Journal` tells :class:`EvidenceFiles` of every record); each record is one JSON
line (:mod:`labkit.door.wire`'s form) of ``/run/labkitd/evidence/<key>.jsonl``, each check's result one line of
``<key>.checks.jsonl``. They live beside labkitd, not in the lab's run directory: a second lab a notebook takes
down before its last checks (lab 03's native lab) still counts, until the lab is reset. The directory is
root's and not listable (0711); each file is root's, readable by its lab owner's group (0640). A learner's code
never writes either. A new labkitd reads them all back when it starts, so a check after a restart grades what
the cells showed before it.

    $ sudo tail -n1 /run/labkitd/evidence/demo_u1000.jsonl | jq .kind
    "step"
"""
from __future__ import annotations

import json
import os
import pwd
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from labkit.config import DatapathConfig
from labkit.door import api, wire
from labkit.door.owners import owner_of
from labkit.net.topology import Topology
from labkit.observe.evidence import KEEP, Journal, Record

__all__ = ["EvidenceFiles", "evidence_dir", "read_checks", "append_check", "Facts"]


def evidence_dir() -> Path:
    """Where labkitd keeps evidence and check results (beside its socket)."""
    return api.socket_path().parent / "evidence"


@dataclass
class Facts:
    """What a record read back needs of a lab that is not open (taken down since): its name and fixed facts."""

    name: str
    topology: Topology
    config: DatapathConfig


def _gid(key: str) -> int:
    try:
        uid = owner_of(key)
        return pwd.getpwuid(uid).pw_gid if uid else 0
    except (KeyError, Exception):
        return 0


def _path(key: str, suffix: str = "") -> Path:
    return evidence_dir() / f"{key}{suffix}.jsonl"


def _open_append(path: Path, key: str):
    """``path`` opened to append, created root's and readable by the lab owner's group (0640)."""
    d = path.parent
    if not d.is_dir():
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o711)
    new = not path.exists()
    f = open(path, "a")
    if new:
        os.fchmod(f.fileno(), 0o640)
        if os.geteuid() == 0:
            os.fchown(f.fileno(), 0, _gid(key))
    return f


class EvidenceFiles:
    """The journal's sink: every record of a lab appended to its evidence file, with the lab's facts on the file's
    first line; a reset empties it. ``lab_of(key)`` gives the open lab (its Steps belong to it), or None."""

    def __init__(self, journal: Journal, lab_of: Callable[[str], Any]):
        self.journal = journal
        self.lab_of = lab_of
        self._lock = threading.Lock()
        self._lines: dict[str, int] = {}

    def __call__(self, what: str, arg: Any) -> None:
        if what == "record":
            self._append(arg)
        elif what == "reset":
            self._reset(arg)

    def _facts_line(self, key: str) -> str | None:
        lab = self.lab_of(key)
        if lab is None:
            return None
        return json.dumps({"facts": {"topology": lab.topology.to_dict(), "config": lab.config.to_dict()}},
                          separators=(",", ":"))

    def _append(self, rec: Record) -> None:
        try:
            data = wire.to_json(rec.data)
        except TypeError as exc:  # kept in memory as it is; on disk only what can be said of it
            data = {"unencodable": str(exc)}
            print(f"labkitd: evidence {rec.kind} '{rec.title}' of lab {rec.lab}: {exc}", file=sys.stderr)
        line = json.dumps({"seq": rec.seq, "kind": rec.kind, "title": rec.title, "data": data,
                           "attrs": wire.to_json(rec.attrs), "time": rec.time}, separators=(",", ":"))
        path = _path(rec.lab)
        with self._lock:
            first = not path.exists() or path.stat().st_size == 0
            with _open_append(path, rec.lab) as f:
                if first:
                    facts = self._facts_line(rec.lab)
                    if facts:
                        f.write(facts + "\n")
                f.write(line + "\n")
            n = self._lines[rec.lab] = self._lines.get(rec.lab, 1) + 1
            if n > 2 * KEEP:
                self._compact(path, rec.lab)

    def _compact(self, path: Path, key: str) -> None:
        lines = path.read_text().splitlines()
        keep = [ln for ln in lines[:1] if ln.startswith('{"facts"')] + lines[-KEEP:]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(ln + "\n" for ln in keep))
        st = path.stat()
        os.chmod(tmp, 0o640)
        if os.geteuid() == 0:
            os.chown(tmp, 0, st.st_gid)
        os.replace(tmp, path)
        self._lines[key] = len(keep)

    def _reset(self, key: str) -> None:
        with self._lock:
            path = _path(key)
            if path.exists():
                with open(path, "w"):
                    pass
            self._lines[key] = 0

    def load(self, key: str) -> int:
        """Read lab ``key``'s records back into the journal; how many."""
        path = _path(key)
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return 0
        lab = self.lab_of(key)
        records = []
        for line in lines:
            try:
                d = json.loads(line)
                if "facts" in d:
                    if lab is None:
                        lab = Facts(key, Topology.from_dict(d["facts"]["topology"]),
                                    DatapathConfig.from_dict(d["facts"]["config"]))
                    continue
                data = wire.from_json(d["data"], {"lab": lab})
                records.append(Record(int(d["seq"]), key, d["kind"], d["title"], data, wire.from_json(d["attrs"]),
                                      float(d["time"])))
            except Exception as exc:  # a line labkitd cannot read back is not evidence
                print(f"labkitd: {path}: a record could not be read back ({type(exc).__name__}: {exc})",
                      file=sys.stderr)
        self.journal.forget(key)
        self.journal.load(records)
        self._lines[key] = len(lines)
        return len(records)

    def load_all(self) -> int:
        """Read every lab's records back (a labkitd starting); how many records."""
        d = evidence_dir()
        if not d.is_dir():
            return 0
        return sum(self.load(p.name[: -len(".jsonl")]) for p in sorted(d.glob("*.jsonl"))
                   if not p.name.endswith(".checks.jsonl"))

    def opened(self, key: str, lab) -> None:
        """Lab ``key`` was opened: the Steps read back before belong to it now."""
        for rec in self.journal.find(key, "step"):
            if getattr(rec.data, "lab", None) is None or isinstance(rec.data.lab, Facts):
                rec.data.lab = lab


def append_check(key: str, result: dict) -> None:
    """Keep one check's result (``CheckResult.to_json(full=True)`` plus what labkitd adds) for lab ``key``."""
    with _open_append(_path(key, ".checks"), key) as f:
        f.write(json.dumps(result, separators=(",", ":")) + "\n")


def read_checks(key: str) -> list[dict]:
    """Every check result kept for lab ``key``, oldest first."""
    try:
        lines = _path(key, ".checks").read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
