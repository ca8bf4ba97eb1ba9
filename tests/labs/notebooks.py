"""Helpers for the notebook tests: find the learner notebooks and their answer cells,
run a notebook headless with nbclient, and read what its checks logged (the answer
key and the mutants built from it are tests/labs/mutate.py's).

    ran, seconds = execute(load("02"), lab=tagged("nbtest"), grade_log=tmp / "log.jsonl")
    assert cell_errors(ran) == []
    last = last_checks(tmp / "log.jsonl")              # {"02.1": {"passed": True, ...}, ...}

Nothing is written next to the learner notebooks: executed copies live only in
memory (or where the caller saves them, under pytest's tmp_path).
"""
from __future__ import annotations

import copy
import json
import subprocess
import time
from pathlib import Path

import nbformat

from labkit.grading.headless import error_outputs, run_notebook
from labtag import tagged

__all__ = [
    "REPO", "LABS_DIR", "NOTEBOOKS", "CELL_TIMEOUT", "load", "answer_cells", "execute", "cell_errors",
    "cell_seconds", "read_log", "last_checks", "lab_netns",
]

REPO = Path(__file__).resolve().parents[2]
LABS_DIR = REPO / "labs"
#: Lab id → learner notebook file in labs/.
NOTEBOOKS = {"01": "01-tour.ipynb", "02": "02-tcp-conntrack.ipynb", "03": "03-pod-to-pod.ipynb",
             "04": "04-clusterip.ipynb", "05": "05-hairpin.ipynb", "06": "06-socket-lb.ipynb",
             "07": "07-external.ipynb", "08": "08-conntrack-gc.ipynb", "09": "09-kube-proxy.ipynb",
             "10": "10-network-policy.ipynb", "11": "11-tofqdns.ipynb", "12": "12-around-the-stack.ipynb",
             "13": "13-observability.ipynb"}
CELL_TIMEOUT = 120


def load(lab: str) -> nbformat.NotebookNode:
    """The learner notebook of ``lab`` as committed."""
    return nbformat.read(LABS_DIR / NOTEBOOKS[lab], as_version=4)


def answer_cells(nb) -> dict[str, nbformat.NotebookNode]:
    """Exercise id → its answer cell (``metadata.labkit.answer``)."""
    out = {}
    for cell in nb.cells:
        ex = cell.get("metadata", {}).get("labkit", {}).get("answer")
        if ex:
            if ex in out:
                raise AssertionError(f"two answer cells for exercise {ex}")
            out[ex] = cell
    return out


def execute(nb, lab: str, grade_log: Path, cwd: Path | None = None, timeout: int = CELL_TIMEOUT):
    """Run ``nb`` (a copy) as grading runs it (:func:`labkit.grading.headless.run_notebook`), with
    ``LABKIT_LAB=lab`` and ``LABKIT_GRADE_LOG=grade_log``. Returns (notebook, seconds)."""
    from doorcheck import require_door

    require_door()  # the notebook's kernel reaches its lab through labkitd
    ran = copy.deepcopy(nb)
    t0 = time.monotonic()
    run_notebook(ran, lab, grade_log, cwd or grade_log.parent, timeout)
    return ran, time.monotonic() - t0


def cell_errors(nb) -> list[str]:
    """``cell N: Ename: value`` for every cell that raised."""
    out = []
    for i, o in error_outputs(nb):
        source = nb.cells[i].source
        first = source.splitlines()[0] if source else ""
        out.append(f"cell {i} ({first!r}): {o.get('ename')}: {o.get('evalue')}")
    return out


def cell_seconds(nb) -> list[tuple[float, int, str]]:
    """(seconds, cell index, first line) of every executed code cell, slowest first (nbclient's timing)."""
    from datetime import datetime

    out = []
    for i, cell in enumerate(nb.cells):
        ex = cell.get("metadata", {}).get("execution", {})
        if "iopub.status.busy" in ex and "iopub.status.idle" in ex:
            start, end = (datetime.fromisoformat(ex[k].replace("Z", "+00:00"))
                          for k in ("iopub.status.busy", "iopub.status.idle"))
            out.append(((end - start).total_seconds(), i, cell.source.splitlines()[0] if cell.source else ""))
    return sorted(out, reverse=True)


def read_log(path: Path) -> list[dict]:
    """The check results a run appended to ``LABKIT_GRADE_LOG``."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def last_checks(path: Path) -> dict[str, dict]:
    """Exercise id → its last logged check result."""
    return {r["exercise"]: r for r in read_log(path)}


def lab_netns(names: list[str]) -> list[str]:
    """Network namespaces (``ip netns list``) that belong to any of the labs ``names``."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    spaces = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [ns for ns in spaces if any(ns.startswith(f"lk-{name}-") for name in names)]
