"""``labkit grade``: run handed-in notebooks headless and score their exercises.

    labkit grade alice/02-tcp.ipynb bob/02-tcp.ipynb [--json | --csv] [--cell-timeout 120]

Each notebook runs in a copy (the original is never touched) with a time
limit per cell; a failing cell does not stop the run. Every ``check(...)``
call appends its result to a log (``LABKIT_GRADE_LOG``); an exercise counts
as passed when its last check passed, and as failed when it was never
checked. The lab comes from the notebook's metadata (``labkit.lab``) or the
number its file name starts with.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .checks import exercises_for

__all__ = ["ExerciseScore", "NotebookScore", "grade_notebook", "format_table", "format_csv"]


@dataclass
class ExerciseScore:
    id: str
    title: str
    passed: bool
    attempts: int
    message: str


@dataclass
class NotebookScore:
    notebook: str
    lab: str
    exercises: list[ExerciseScore] = field(default_factory=list)
    cell_errors: list[str] = field(default_factory=list)

    @property
    def score(self) -> int:
        return sum(e.passed for e in self.exercises)

    def to_json(self) -> dict:
        return {**asdict(self), "score": self.score, "total": len(self.exercises)}


def lab_of(path: Path, nb) -> str:
    """The lab id of a notebook: metadata ``labkit.lab``, else its file name's leading number."""
    lab = nb.metadata.get("labkit", {}).get("lab")
    if lab:
        return str(lab)
    m = re.match(r"(\d+)", path.name)
    if not m:
        raise ValueError(f"notebook {path}: no labkit.lab metadata and no leading lab number in its name")
    return m.group(1).zfill(2)


def grade_notebook(path: str | Path, cell_timeout: int = 120, lab_name: str = "grade") -> NotebookScore:
    """Execute one notebook in a scratch copy and score it."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    lab = lab_of(path, nb)
    score = NotebookScore(str(path), lab)
    with tempfile.TemporaryDirectory(prefix="labkit-grade-") as tmp:
        work = Path(tmp) / path.name
        shutil.copy(path, work)
        log = Path(tmp) / "checks.jsonl"
        saved = {k: os.environ.get(k) for k in ("LABKIT_GRADE_LOG", "LABKIT_LAB")}
        os.environ["LABKIT_GRADE_LOG"] = str(log)
        os.environ["LABKIT_LAB"] = lab_name
        try:
            client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                                    resources={"metadata": {"path": tmp}})
            try:
                client.execute()
            except Exception as exc:  # a cell over its time limit, a dead kernel: grade what ran
                score.cell_errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        for cell in nb.cells:
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    score.cell_errors.append(f"{out.get('ename')}: {out.get('evalue')}")
        results = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    for ex in exercises_for(lab):
        mine = [r for r in results if r["exercise"] == ex.id]
        last = mine[-1] if mine else None
        score.exercises.append(ExerciseScore(ex.id, ex.title, bool(last and last["passed"]), len(mine),
                                             last["message"] if last else "never checked"))
    return score


def format_table(scores: list[NotebookScore]) -> str:
    """The human-readable score table."""
    lines = []
    for s in scores:
        lines.append(f"{s.notebook}  (lab {s.lab})  score {s.score}/{len(s.exercises)}")
        for e in s.exercises:
            lines.append(f"  {e.id:6} {'pass' if e.passed else 'FAIL':4}  {e.title}  — {e.message}")
        for err in s.cell_errors:
            lines.append(f"  cell error: {err}")
    return "\n".join(lines)


def format_csv(scores: list[NotebookScore]) -> str:
    """One row per notebook and exercise, for a class spreadsheet."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["notebook", "lab", "exercise", "title", "passed", "attempts", "message"])
    for s in scores:
        for e in s.exercises:
            w.writerow([s.notebook, s.lab, e.id, e.title, int(e.passed), e.attempts, e.message])
    return buf.getvalue()
