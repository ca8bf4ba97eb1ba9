"""Where labkitd keeps what checks grade: each lab's evidence journal, and its check results, in files
of the lab's run directory that the lab's owner can read and not write.

Steps, snapshots, clock moves, GC runs and faults are recorded by labkitd itself as they happen
(:class:`labkit.observe.evidence.Journal`, which tells :class:`EvidenceFiles` of every record); each
record is one JSON line of ``/run/labkit/<key>/evidence.jsonl`` (:mod:`labkit.door.wire`'s form), and
each check's result one line of ``checks.jsonl``. A learner's code never writes either: both files and
their directory are root's (:meth:`labkit.net.ledger.Ledger.start`). A new labkitd reads them back when it
opens the lab, so a check after a restart grades what the cells showed before it.

    $ sudo tail -n1 /run/labkit/demo.u1000/evidence.jsonl | jq .kind
    "step"
"""
from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, Callable

from labkit.door import wire
from labkit.net.ledger import Ledger, lab_dir
from labkit.observe.evidence import KEEP, Journal, Record

__all__ = ["EvidenceFiles", "EVIDENCE", "CHECKS", "read_checks", "append_check"]

EVIDENCE = "evidence.jsonl"
CHECKS = "checks.jsonl"


def _ensure(key: str, name: str) -> Path:
    """The lab's file ``name``, created (mode 0640, recorded in its ledger for teardown) if it is not there."""
    path = lab_dir(key) / name
    if not path.exists():
        Ledger(key).record("file", path=str(path))
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC, 0o640)
        os.close(fd)
    return path


class EvidenceFiles:
    """The journal's sink: every record of a lab appended to its ``evidence.jsonl``, a reset empties it.
    ``context(key)`` gives what decoding a lab's records needs (the lab, for its Steps)."""

    def __init__(self, journal: Journal, context: Callable[[str], dict]):
        self.journal = journal
        self.context = context
        self._lock = threading.Lock()
        self._lines: dict[str, int] = {}

    def __call__(self, what: str, arg: Any) -> None:
        try:
            if what == "record":
                self._append(arg)
            elif what == "reset":
                self._reset(arg)
        except FileNotFoundError:  # the lab went down meanwhile
            pass

    def _append(self, rec: Record) -> None:
        try:
            data = wire.to_json(rec.data)
        except TypeError as exc:  # kept in memory as it is; on disk only what can be said of it
            data = {"unencodable": str(exc)}
            print(f"labkitd: evidence {rec.kind} '{rec.title}' of lab {rec.lab}: {exc}", file=sys.stderr)
        line = json.dumps({"seq": rec.seq, "kind": rec.kind, "title": rec.title, "data": data,
                           "attrs": wire.to_json(rec.attrs), "time": rec.time}, separators=(",", ":"))
        with self._lock:
            if not Ledger(rec.lab).exists():
                return
            path = _ensure(rec.lab, EVIDENCE)
            with open(path, "a") as f:
                f.write(line + "\n")
            n = self._lines[rec.lab] = self._lines.get(rec.lab, 0) + 1
            if n > 2 * KEEP:
                self._compact(rec.lab, path)

    def _compact(self, key: str, path: Path) -> None:
        lines = path.read_text().splitlines()[-KEEP:]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in lines))
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
        self._lines[key] = len(lines)

    def _reset(self, key: str) -> None:
        with self._lock:
            path = lab_dir(key) / EVIDENCE
            if path.exists():
                with open(path, "w"):
                    pass
            self._lines[key] = 0

    def load(self, key: str) -> int:
        """Read lab ``key``'s records back into the journal (labkitd opening a lab it did not record); how many."""
        path = lab_dir(key) / EVIDENCE
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return 0
        context = self.context(key)
        records = []
        for line in lines:
            try:
                d = json.loads(line)
                data = wire.from_json(d["data"], context)
                records.append(Record(int(d["seq"]), key, d["kind"], d["title"], data, wire.from_json(d["attrs"]),
                                      float(d["time"])))
            except Exception as exc:  # a line labkitd cannot read back is not evidence
                print(f"labkitd: {path}: a record could not be read back ({type(exc).__name__}: {exc})",
                      file=sys.stderr)
        self.journal.forget(key)
        self.journal.load(records)
        self._lines[key] = len(lines)
        return len(records)


def append_check(key: str, result: dict) -> None:
    """Keep one check's result (``CheckResult.to_json`` plus what labkitd adds) in the lab's ``checks.jsonl``."""
    path = _ensure(key, CHECKS)
    with open(path, "a") as f:
        f.write(json.dumps(result, separators=(",", ":")) + "\n")


def read_checks(key: str) -> list[dict]:
    """Every check result kept for lab ``key``, oldest first."""
    try:
        lines = (lab_dir(key) / CHECKS).read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
