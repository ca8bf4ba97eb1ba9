"""``labkit grade`` on the real datapath: handed-in copies of lab 02 re-executed, each in a fresh lab of its
own (``g<pid>n<k>`` plus this run's LABKIT_TEST_TAG), several at a time.

- six learners' copies with different planted wrong answers (from the answer key's ``wrong`` lists), graded
  with ``--jobs 2 --csv``: the CSV shows exactly the planted failures, one row per learner, the learners'
  answers and tries (from the saved check outputs) and their totals;
- two notebooks graded one after the other, the second with its evidence cells deleted: nothing of the first
  lab reaches the second, which scores 0 on every exercise that has evidence cells;
- beside a good notebook, one that hangs, one whose kernel dies and one with a cell that raises, under a small
  ``--notebook-timeout``: each scores what it reached, and nothing of grading is left behind;
- a class with a planted timeout, a dead kernel and an unanswered exercise: the CSV shows each status distinctly.

Handed-in notebooks are written under pytest's tmp_path only.
"""
from __future__ import annotations

import copy
import csv
import io
import json
import re
import subprocess
from html import escape as html_escape
import sys
from pathlib import Path

import nbformat
import pytest

from gradefixtures import check_output
from labkit.grading.answers import canonical, load_key, rhs
from labkit.grading.checks import exercises_for
from labkit.grading.grade import answer_cells, check_cells, grade
from labkit.nb import VARIANTS
from labtag import TAG

try:
    from .notebooks import NOTEBOOKS, REPO, lab_netns, load
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from notebooks import NOTEBOOKS, REPO, lab_netns, load

pytestmark = pytest.mark.labs

IDS = [e.id for e in exercises_for("02")]
#: The labs of a grading run with this tag: g<pid>n<k><tag>, and its variants.
GRADE_LAB = re.compile(rf"^g\d+n\d+{re.escape(TAG)}(-({'|'.join(VARIANTS)}))?$")
#: --notebook-timeout of the run with a hanging notebook: the test waits this long for it, so it is kept short, yet
#: several times what lab 02 takes to run to its end beside another notebook on a two-core machine (8-15 s).
HANG_LIMIT = 60
#: Learner -> exercise -> which wrong answer of the key (its index, taken modulo the key's count), or None
#: for the unanswered placeholder; exercises not named get the reference answer.
PLANTED = {
    "alice": {},
    "bob": {"02.1": 0},
    "carol": {"02.2": 0, "02.3": 1},
    "dan": {"02.4": 0, "02.5": 1, "02.6": 0},
    "erin": {"02.1": 1, "02.6": 1},
    "fay": {"02.3": None, "02.5": 0},
}


def _var(ex: str) -> str:
    return "answer_" + ex.replace(".", "_")


def _source(ex: str, planted) -> str:
    key = load_key("02")[ex]
    if planted is None:
        return f"{_var(ex)} = None  # your answer"
    return key.wrong[planted % len(key.wrong)].answer


def _handed_in(answers: dict[str, str], tries: dict[str, int]):
    """Lab 02 with these answer sources (others: the reference) and, per exercise, a saved check output of
    that try number (none for 0), as a learner's saved notebook has."""
    nb = copy.deepcopy(load("02"))
    key = load_key("02")
    for ex, i in answer_cells(nb).items():
        nb.cells[i].source = answers.get(ex, key[ex].answer)
    for ex, i in check_cells(nb).items():
        if tries.get(ex):
            nb.cells[i].outputs = [check_output(ex, tries[ex], answer="(saved)")]
            nb.cells[i].execution_count = 10 + tries[ex]
    return nb


def _tries(k: int) -> dict[str, int]:
    return {ex: (k + j) % 4 for j, ex in enumerate(IDS)}


def _leftovers() -> list[str]:
    """What of this run's grading labs is still on the machine: namespaces, state, pins, kernels."""
    left = _grade_netns()
    for root in (Path("/run/labkit"), Path("/sys/fs/bpf/labkit")):
        if root.is_dir():
            left += [str(p) for p in root.iterdir() if GRADE_LAB.match(p.name.removesuffix(".lock"))]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                env = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(GRADE_LAB.match(e[len(b"LABKIT_LAB="):].decode(errors="replace"))
                   for e in env if e.startswith(b"LABKIT_LAB=")):
                left.append(f"process {proc.name} of a grading lab")
    return left


def _grade_netns() -> list[str]:
    """Namespaces (``lk-<lab>-<node or pod>``) of any grading lab of this tag."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.splitlines()
    out = []
    for name in (line.split()[0] for line in names if line.strip()):
        rest = name.removeprefix("lk-")
        if rest != name and any(GRADE_LAB.match(rest[:i]) for i, c in enumerate(rest) if c == "-"):
            out.append(name)
    return out


@pytest.fixture
def clean(door_ready):
    """Nothing of a grading run with this tag before the test, and nothing after it."""
    assert _leftovers() == [], "grading labs of an earlier run are still up"
    yield
    assert _leftovers() == []


def _cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "labkit", "cli", "grade", f"--lab-tag={TAG}", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_csv_shows_exactly_the_planted_failures(clean, tmp_path):
    """Six learners' copies of lab 02, graded two at a time: one CSV row per learner with exactly the planted
    wrong answers failed, each learner's answers and tries as handed in, and the right totals."""
    paths, sources = [], {}
    for k, (who, planted) in enumerate(PLANTED.items()):
        sources[who] = {ex: _source(ex, p) for ex, p in planted.items()}
        path = tmp_path / who / NOTEBOOKS["02"]
        path.parent.mkdir()
        nbformat.write(_handed_in(sources[who], _tries(k)), path)
        paths.append(path)
    before = [p.read_bytes() for p in paths]
    html = tmp_path / "report.html"
    proc = _cli(*map(str, paths), "--jobs", "2", "--csv", "--html", str(html))
    assert [p.read_bytes() for p in paths] == before, "grading changed a handed-in notebook"
    assert "graded 6/6" in proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [r["learner"] for r in rows] == list(PLANTED)
    key = load_key("02")
    for k, row in enumerate(rows):
        planted = PLANTED[row["learner"]]
        got = {ex: row[ex] for ex in IDS}
        assert got == {ex: "0" if ex in planted else "1" for ex in IDS}, row["learner"]
        for ex in IDS:
            source = sources[row["learner"]].get(ex, key[ex].answer)
            expected = "" if planted.get(ex, 0) is None and ex in planted else rhs(source, _var(ex))
            assert row[f"{ex} answer"] == expected, (row["learner"], ex)
            assert row[f"{ex} tries"] == str(_tries(k)[ex]), (row["learner"], ex)
        assert (row["score"], row["total"]) == (str(len(IDS) - len(planted)), str(len(IDS)))
    page = html.read_text()
    first_wrong = html_escape(canonical(rhs(key["02.1"].wrong[0].answer, "answer_02_1")))
    assert "4/6 (67%)" in page and first_wrong in page


def _evidence_cells(nb) -> dict[int, list[str]]:
    """Cell index -> the exercises whose evidence it records (``metadata.labkit.evidence``)."""
    out = {}
    for i, cell in enumerate(nb.cells):
        ids = cell.get("metadata", {}).get("labkit", {}).get("evidence") or []
        if ids:
            out[i] = [ids] if isinstance(ids, str) else list(ids)
    return out


def test_each_notebook_has_a_lab_of_its_own(clean, tmp_path):
    """Graded one after the other, a notebook with one wrong answer fails exactly that one (with the key's
    message), and the next, whose evidence cells are deleted, scores 0 on every exercise with evidence cells:
    nothing the first one's cells did reaches it."""
    nb = load("02")
    evidence = _evidence_cells(nb)
    assert evidence, "lab 02 marks no evidence cells (metadata.labkit.evidence): this test needs them"
    with_evidence = sorted({ex for ids in evidence.values() for ex in ids})
    wrong = "02.4"
    first = tmp_path / "ann" / NOTEBOOKS["02"]
    second = tmp_path / "ben" / NOTEBOOKS["02"]
    first.parent.mkdir()
    second.parent.mkdir()
    nbformat.write(_handed_in({wrong: _source(wrong, 0)}, {}), first)
    stripped = _handed_in({}, {})
    stripped.cells = [c for i, c in enumerate(stripped.cells) if i not in evidence]
    nbformat.write(stripped, second)
    a, b = grade([first, second], jobs=1, lab_tag=TAG)
    assert (a.learner, b.learner) == ("ann", "ben") and a.lab_name != b.lab_name
    assert {e.id: e.passed for e in a.exercises} == {ex: ex != wrong for ex in IDS}
    message = next(e.message for e in a.exercises if e.id == wrong)
    assert load_key("02")[wrong].wrong[0].message in message
    assert [e.id for e in b.exercises if e.passed and e.id in with_evidence] == []
    assert all(not e.passed for e in b.exercises if e.id in with_evidence)


def test_a_hanging_a_dying_and_a_raising_notebook_score_what_they_reached(clean, tmp_path):
    """Under a small --notebook-timeout, beside a good notebook: one that hangs after 02.1's check scores 02.1
    only, one whose kernel dies after 02.2's check scores 02.1 and 02.2 (and --keep-executed keeps what it printed as
    it died), one with a cell that raises runs on and reports the error; the good one scores fully and nothing is
    left behind."""
    plain = _handed_in({}, {})
    checks = check_cells(plain)

    def after(ex: str, source: str):
        nb = copy.deepcopy(plain)
        nb.cells.insert(checks[ex] + 1, nbformat.v4.new_code_cell(source))
        return nb

    notebooks = {"good": plain, "hangs": after("02.1", "import time; time.sleep(10**6)"),
                 "dies": after("02.2", "import os; os.write(2, b'last words on stderr\\n'); os._exit(1)"),
                 "raises": after("02.1", "raise RuntimeError('a learner left this in')")}
    paths = []
    for who, nb in notebooks.items():
        path = tmp_path / who / NOTEBOOKS["02"]
        path.parent.mkdir()
        nbformat.write(nb, path)
        paths.append(str(path))
    kept = tmp_path / "executed"
    proc = _cli(*paths, "--jobs", "2", "--notebook-timeout", str(HANG_LIMIT), "--cell-timeout", "300", "--json",
                "--keep-executed", str(kept))
    data = json.loads(proc.stdout)
    by = {n["learner"]: n for n in data["notebooks"]}
    assert "last words on stderr" in (kept / f"dies-{NOTEBOOKS['02']}.output.log").read_text()
    passed = {who: [e["id"] for e in n["exercises"] if e["passed"]] for who, n in by.items()}
    assert passed == {"good": IDS, "hangs": IDS[:1], "dies": IDS[:2], "raises": IDS}
    assert by["good"]["error"] is None and by["good"]["cell_errors"] == []
    assert f"the notebook ran over its time limit ({HANG_LIMIT} s)" in by["hangs"]["error"]
    assert "the kernel died" in by["dies"]["error"]
    assert by["raises"]["error"] is None
    assert by["raises"]["cell_errors"] == [f"cell {checks['02.1'] + 1}: RuntimeError: a learner left this in"]
    unreached = {e["id"]: e for e in by["hangs"]["exercises"][1:]}
    assert {e["status"] for e in unreached.values()} == {"not run"}
    assert all(e["message"].startswith("the run stopped before its check") for e in unreached.values())
    assert len({n["lab_name"] for n in data["notebooks"]}) == 4
    assert not lab_netns([n["lab_name"] for n in data["notebooks"]])


def test_csv_shows_a_timeout_a_dead_kernel_and_an_unanswered_exercise_distinctly(clean, tmp_path):
    """Acceptance: a class with a planted timeout (after 02.1's check), a dead kernel (after 02.2's) and an
    unanswered 02.3, run for real: the CSV's status columns tell the three apart (timeout, dead kernel,
    unanswered; the exercises a stopped run never reached read 'not run'), where every one of them used to read 0."""
    plain = _handed_in({}, {})
    checks = check_cells(plain)

    def after(ex: str, source: str):
        nb = copy.deepcopy(plain)
        nb.cells.insert(checks[ex] + 1, nbformat.v4.new_code_cell(source))
        return nb

    notebooks = {"hangs": after("02.1", "import time; time.sleep(10**6)"),
                 "dies": after("02.2", "import os; os._exit(1)"),
                 "blank": _handed_in({"02.3": _source("02.3", None)}, {})}
    paths = []
    for who, nb in notebooks.items():
        path = tmp_path / who / NOTEBOOKS["02"]
        path.parent.mkdir()
        nbformat.write(nb, path)
        paths.append(str(path))
    proc = _cli(*paths, "--jobs", "2", "--notebook-timeout", str(HANG_LIMIT), "--cell-timeout", "300", "--csv")
    rows = {r["learner"]: r for r in csv.DictReader(io.StringIO(proc.stdout))}
    assert list(rows) == list(notebooks)
    status = {who: [r[f"{ex} status"] for ex in IDS] for who, r in rows.items()}
    assert status == {"hangs": ["passed"] + ["not run"] * (len(IDS) - 1),
                      "dies": ["passed"] * 2 + ["not run"] * (len(IDS) - 2),
                      "blank": ["passed" if ex != "02.3" else "unanswered" for ex in IDS]}
    assert (rows["hangs"]["status"], rows["dies"]["status"], rows["blank"]["status"]) == \
        ("lab 02: timeout", "lab 02: dead kernel", "ok")
    assert [rows[w]["score"] for w in notebooks] == ["1", "2", str(len(IDS) - 1)]
