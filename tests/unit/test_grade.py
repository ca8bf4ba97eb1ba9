"""Unit tests of ``labkit grade`` without a lab or a kernel: the learner's record read from a handed-in file,
learner names, scoring from a grade log, and grading with fake executors. The reports: test_report.py; the job
runner: test_jobs.py. Re-execution on the datapath: tests/labs/test_grade_notebooks.py.
"""
from __future__ import annotations

import csv
import gc
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

from gradefixtures import check_output, class_scores, handed_in
from labkit import cli
from labkit.grading.checks import exercises_for
from labkit.errors import ConfigError
from labkit.grading.report import format_csv
from labkit.grading.grade import (HandedIn, answer_cells, check_cells, grade, grade_lab_name, lab_of, learner_names,
                          read_handed_in, read_record, saved_checks, score)

IDS = [e.id for e in exercises_for("02")]


# -- the learner's own record ---------------------------------------------------------------------
def test_tries_are_the_attempt_of_the_last_saved_result():
    """Tries come from the last CHECK_MIME output saved for an exercise; never checked is 0."""
    nb = handed_in("02", saved={"02.1": [1, 2, 3], "02.4": [1]})
    nb.cells[-1].outputs.append(check_output("02.4", 5, as_text=True))  # a JSON string is read as well
    rec = read_record(nb, IDS)
    assert (rec["02.1"].tries, rec["02.4"].tries, rec["02.2"].tries) == (3, 5, 0)
    assert rec["02.1"].last["attempt"] == 3 and rec["02.2"].last is None
    assert [r["exercise"] for r in saved_checks(nb)] == ["02.1", "02.1", "02.1", "02.4", "02.4"]


def test_answer_is_the_right_hand_side_of_the_answer_cell():
    """The answer is the source right of `answer_NN_M =` (comments dropped); None and a missing cell are unanswered."""
    nb = handed_in("02", answers={"02.1": "['SYN',\n   'ACK']", "02.2": "(60, 8000)"})
    del nb.cells[[i for i, c in enumerate(nb.cells) if c.metadata.get("labkit", {}).get("answer") == "02.3"][0]]
    rec = read_record(nb, IDS)
    assert rec["02.1"].answer == "['SYN',\n   'ACK']" and rec["02.2"].answer == "(60, 8000)"
    assert rec["02.3"].answer is None and rec["02.4"].answer is None  # cell deleted; still the None placeholder


def test_answer_cells_without_metadata_are_found_by_their_variable():
    """An older notebook without metadata.labkit: answer cells by `answer_NN_M =`, check cells by `check("NN.M"`."""
    nb = handed_in("02", answers={"02.2": "(60, 60)"}, metadata=False)
    assert sorted(answer_cells(nb)) == IDS and sorted(check_cells(nb)) == IDS
    assert read_record(nb, IDS)["02.2"].answer == "(60, 60)"
    nb.cells[answer_cells(nb)["02.2"]].source = "answer_02_2 = (60,"  # a syntax error: the text after '='
    assert read_record(nb, IDS)["02.2"].answer == "(60,"


def test_learner_from_folder_then_metadata_then_file():
    """A folder per learner names the learner (a recorded one too); else metadata.labkit.learner; else the
    file's name."""
    named = handed_in(learner="Dana")
    assert learner_names([(Path("x/02.ipynb"), named, "02"), (Path("y/02.ipynb"), None, "02")]) == ["x", "y"]
    assert learner_names([(Path("in/a.ipynb"), named, "02"), (Path("in/b.ipynb"), None, "02")]) == ["Dana", "b"]
    per_folder = [(Path("alice/02-tcp.ipynb"), None, "02"), (Path("alice/03-pods.ipynb"), None, "03"),
                  (Path("bob/02-tcp.ipynb"), None, "02")]
    assert learner_names(per_folder) == ["alice", "alice", "bob"]
    one_folder = [(Path("in/alice-02.ipynb"), None, "02"), (Path("in/bob-02.ipynb"), None, "02")]
    assert learner_names(one_folder) == ["alice-02", "bob-02"]
    assert learner_names([(Path("02-tcp.ipynb"), None, "02")]) == ["02-tcp"]


def test_lab_id_from_metadata_or_name():
    """The lab id comes from notebook metadata, else from the file name's number."""
    nb = nbformat.v4.new_notebook()
    assert lab_of(Path("3-x.ipynb"), nb) == "03"
    nb.metadata["labkit"] = {"lab": "07"}
    assert lab_of(Path("3-x.ipynb"), nb) == "07"
    with pytest.raises(ValueError, match="no labkit.lab"):
        lab_of(Path("x.ipynb"), nbformat.v4.new_notebook())


def test_a_recorded_lab_that_is_not_a_number_is_a_problem(tmp_path):
    """metadata.labkit.lab names the answer key the report reads: a path there ('../../etc/x'), or a labkit
    entry that is not a mapping, makes the notebook a problem, not a crash of the whole class."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["labkit"] = {"lab": "../../etc/x"}
    with pytest.raises(ValueError, match="is not a lab number"):
        lab_of(Path("02-x.ipynb"), nb)
    nbformat.write(nb, tmp_path / "02-a.ipynb")
    odd = nbformat.v4.new_notebook()
    odd.metadata["labkit"] = "02"
    nbformat.write(odd, tmp_path / "02-b.ipynb")
    a, b = read_handed_in([tmp_path / "02-a.ipynb", tmp_path / "02-b.ipynb"])
    assert "is not a lab number" in a.problem and score(a, []).statuses == ["not run"]
    assert (b.lab, b.problem) == ("02", None)


def test_unreadable_files_are_reported_not_fatal(tmp_path):
    """A file that is not a notebook, or has no lab, is kept with its problem."""
    (tmp_path / "02-broken.ipynb").write_text("{not json")
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "nolab.ipynb")
    broken, nolab = read_handed_in([tmp_path / "02-broken.ipynb", tmp_path / "nolab.ipynb"])
    assert broken.lab == "02" and broken.problem.startswith("cannot read it")
    assert nolab.problem and "no labkit.lab" in nolab.problem
    s = score(broken, [])
    assert s.score == 0 and {e.status for e in s.exercises} == {"not run"} and s.statuses == ["not run"]
    assert all(e.message.startswith("not graded: cannot read it") for e in s.exercises)


# -- scoring ----------------------------------------------------------------------------------------
def _log(ex: str, passed: bool, missing: str | None = None, message: str = "m") -> dict:
    return {"exercise": ex, "passed": passed, "attempt": 1, "missing": missing, "answer": "", "message": message}


def test_score_reads_the_last_logged_check_and_names_what_was_not_graded():
    """Passed = the last logged check passed; a placeholder is 'unanswered' (never 'replace None'); a check that
    never ran says why: no check cell, the run stopped before it, or its cell raised."""
    nb = handed_in("02", answers={ex: "1" for ex in IDS if ex != "02.2"}, saved={"02.1": [1, 2]})
    checks = check_cells(nb)
    del nb.cells[checks["02.6"]]  # no check cell for 02.6
    checks = check_cells(nb)
    item = HandedIn(Path("alice/02.ipynb"), nb, "02", "alice")
    placeholder = "no answer yet: replace None with your answer, then run this cell"
    logged = [_log("02.1", False), _log("02.1", True), _log("02.2", False, message=placeholder),
              _log("02.3", True), _log("02.3", False, message="wrong flags"), _log("02.5", False, missing="6. Clock")]
    run = {"cell_errors": [{"cell": checks["02.4"], "ename": "NameError", "evalue": "name 'x' is not defined"}]}
    s = score(item, logged, run)
    got = {e.id: (e.status, e.passed) for e in s.exercises}
    assert got == {"02.1": ("passed", True), "02.2": ("unanswered", False), "02.3": ("failed", False),
                   "02.4": ("not run", False), "02.5": ("missing evidence", False), "02.6": ("not run", False)}
    assert s.statuses == ["cell errors", "missing evidence"]
    by_id = {e.id: e for e in s.exercises}
    assert by_id["02.1"].tries == 2 and by_id["02.1"].checks == 2 and by_id["02.3"].message == "wrong flags"
    assert by_id["02.4"].message == "its check cell raised NameError: name 'x' is not defined"
    assert by_id["02.6"].message == "its check cell is not in the notebook"
    assert not any("replace None" in e.message for e in s.exercises)
    assert s.cell_errors == [f"cell {checks['02.4']}: NameError: name 'x' is not defined"] and s.score == 1

    stopped = score(item, logged[:2], {"stopped_at": checks["02.3"]}, error="stopped at cell 9: the kernel died")
    assert {e.id: e.message for e in stopped.exercises}["02.3"] == \
        "the run stopped before its check (stopped at cell 9: the kernel died)"


def _fake_execute(job):
    """Stands in for running a notebook: logs checks as the notebook would, then behaves as its name says."""
    name = Path(job["notebook"]).parent.name
    with open(job["log"], "a") as f:
        for ex in IDS[:3]:
            f.write(json.dumps(_log(ex, True)) + "\n")
        if name == "hangs":
            f.flush()
            time.sleep(300)
        if name == "raises":
            f.flush()
            raise RuntimeError("the grader fell over")
        for ex in IDS[3:]:
            f.write(json.dumps(_log(ex, True)) + "\n")
    return {"cell_errors": [], "stopped": None, "stopped_at": None, "teardown": []}


def test_grade_scores_what_each_notebook_reached(tmp_path):
    """grade() with a fake executor: one lab per notebook, a hanging and a crashing run score the checks they
    logged, the good one scores fully, and progress counts every notebook."""
    answers = {ex: "1" for ex in IDS}
    paths = []
    for who in ("good", "hangs", "raises"):
        (tmp_path / who).mkdir()
        nbformat.write(handed_in("02", answers=answers), tmp_path / who / "02-tcp.ipynb")
        paths.append(tmp_path / who / "02-tcp.ipynb")
    seen = []
    scores = grade(paths, jobs=3, notebook_timeout=1, kill_grace=0.5, executor=_fake_execute,
                   progress=lambda d, n, s: seen.append((d, n, s.learner)))
    by = {s.learner: s for s in scores}
    assert [s.learner for s in scores] == ["good", "hangs", "raises"]
    assert by["good"].score == len(IDS) and by["good"].error is None
    assert by["hangs"].score == by["raises"].score == 3
    assert "time limit" in by["hangs"].error and "the grader fell over" in by["raises"].error
    assert {e.status for e in by["hangs"].exercises[3:]} == {"not run"}
    assert (by["good"].statuses, by["hangs"].statuses, by["raises"].statuses) == (["ok"], ["timeout"], ["grader error"])
    assert len({s.lab_name for s in scores}) == 3 and all(s.lab_name.startswith(f"g{os.getpid()}n") for s in scores)
    assert sorted(d for d, _, _ in seen) == [1, 2, 3] and {n for _, n, _ in seen} == {3}


def test_jobs_fork_from_a_frozen_heap(tmp_path):
    """grade() moves its heap to the collector's permanent generation before the jobs fork (a child's collections
    never walk the parent's objects) and unfreezes it afterwards."""
    (tmp_path / "ann").mkdir()
    nbformat.write(handed_in("02", answers={}), tmp_path / "ann" / "02-tcp.ipynb")
    seen = tmp_path / "frozen"

    def executor(job):
        seen.write_text(str(gc.get_freeze_count()))
        return {"cell_errors": [], "stopped": None, "stopped_at": None, "teardown": []}

    grade([tmp_path / "ann" / "02-tcp.ipynb"], jobs=1, executor=executor)
    assert int(seen.read_text()) > 0
    assert gc.get_freeze_count() == 0


def test_grade_lab_names_fit_with_their_variants():
    """Grading labs are g<pid>n<k><tag>, and a tag too long for '<lab>-socklb' is refused up front."""
    assert grade_lab_name(0, "-g", pid=123) == "g123n0-g"
    with pytest.raises(ConfigError, match="shorten the lab tag"):
        grade_lab_name(0, "-a-very-long-tag", pid=4194304)


def test_cli_grade_and_answers_options():
    """`labkit grade` takes --jobs, --notebook-timeout, --csv, --html and --lab-tag; `labkit answers LAB --json`."""
    args = cli.build_parser().parse_args(["grade", "a.ipynb", "b/", "--jobs", "2", "--notebook-timeout", "30",
                                          "--csv", "--html", "r.html", "--lab-tag=-g"])
    assert (args.jobs, args.notebook_timeout, args.csv, args.html, args.lab_tag) == (2, 30, True, "r.html", "-g")
    assert args.notebooks == ["a.ipynb", "b/"] and args.cell_timeout == 120
    args = cli.build_parser().parse_args(["answers", "02", "--json"])
    assert (args.lab_id, args.json) == ("02", True)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["grade", "a.ipynb", "--jobs", "0"])


def test_cli_grade_writes_the_chosen_report(monkeypatch, capsys, tmp_path):
    """`labkit grade --csv --html F` prints the CSV on stdout, writes the class report, warns on stderr, and takes
    the notebooks' labs down through labkitd; with no labkitd answering it says so once, before anything runs."""
    import labkit.grading.grade
    from labkit.client import Lab
    from labkit.client.door import DoorClient

    scores = class_scores()
    scores[0].error = "stopped at cell 9: the kernel died"
    seen = {}

    def grade(paths, **kw):
        seen.update(kw)
        return scores

    monkeypatch.setattr(DoorClient, "call", lambda self, verb, lab=None, **kw: {"version": 1})
    monkeypatch.setattr(labkit.grading.grade, "grade", grade)
    assert cli.main(["grade", "x.ipynb", "--csv", "--html", str(tmp_path / "r.html"), "-q"]) == 0
    out, err = capsys.readouterr()
    assert out == format_csv(scores) and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert "labkit grade: alice/02.ipynb: stopped at cell 9: the kernel died" in err
    assert seen["cleanup"] == Lab.cleanup
    assert cli.main(["grade", "x.ipynb", "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["learners"][0]["learner"] == "alice"

    monkeypatch.undo()
    monkeypatch.setenv("LABKIT_DOOR", str(tmp_path / "nobody-here.sock"))
    monkeypatch.setattr(labkit.grading.grade, "grade", lambda paths, **kw: pytest.fail("graded without labkitd"))
    assert cli.main(["grade", "x.ipynb"]) == 1
    assert "labkit: error: no labkitd answers on" in capsys.readouterr().err


# -- who handed in what -------------------------------------------------------------------------------
def test_learner_names_are_checked():
    """A learner's name is short printable text without a path separator, '..', NUL or a control character."""
    from labkit.grading.grade import learner_problem

    for good in ("ada", "Ada Lovelace", "Zoë O'Neil", "a.b"):
        assert learner_problem(good) is None, good
    for bad in ("../../etc/x", "a/b", "a\\b", "..", ".", "x..y", "a\x00b", "a\nb", "a\tb", "\x1b[31m", "", "  ",
                "x" * 65, " ada", 7, ["ada"]):
        assert learner_problem(bad), repr(bad)


def test_a_recorded_name_that_is_not_a_name_is_a_problem_never_a_path(tmp_path):
    """metadata.labkit.learner "../../etc/x": the notebook is reported as a problem, never run, and
    --keep-executed writes nothing outside its folder; a good neighbour is graded as usual."""
    bad, good = tmp_path / "in" / "mallory" / "02-tcp.ipynb", tmp_path / "in" / "ann" / "02-tcp.ipynb"
    for path, who in ((bad, "../../etc/x"), (good, None)):
        path.parent.mkdir(parents=True)
        nbformat.write(handed_in("02", answers={ex: "1" for ex in IDS}, learner=who), path)
    ran = tmp_path / "ran"

    def executor(job):  # runs in the job's child process: it leaves what ran in a file
        with open(ran, "a") as f:
            f.write(job["notebook"] + "\n")
        Path(job["executed"]).write_text("{}")
        return {"cell_errors": [], "stopped": None, "stopped_at": None, "teardown": []}

    kept = tmp_path / "kept" / "a" / "b"
    before = sorted(p for p in tmp_path.rglob("*"))
    m, a = grade([bad, good], jobs=1, executor=executor, executed_dir=kept)
    assert ran.read_text().splitlines() == [str(good)]
    assert m.statuses == ["not run"] and "metadata.labkit.learner '../../etc/x' is not a learner's name" in m.error
    assert {e.status for e in m.exercises} == {"not run"} and m.learner == "mallory"
    assert a.statuses == ["ok"] and a.learner == "ann"
    new = sorted(set(tmp_path.rglob("*")) - set(before) - {ran})
    assert new == [tmp_path / "kept", tmp_path / "kept" / "a", kept, kept / "ann-02-tcp.ipynb"]


def test_executed_copies_never_overwrite_each_other(tmp_path):
    """Two notebooks of one name and file kept with --keep-executed: two files, both in the folder."""
    paths = []
    for where in ("x", "y"):
        (tmp_path / where).mkdir()
        nbformat.write(handed_in("02", learner="ann"), tmp_path / where / "02-tcp.ipynb")
        paths.append(tmp_path / where / "02-tcp.ipynb")

    def executor(job):
        Path(job["executed"]).write_text(job["notebook"])
        return {"cell_errors": [], "stopped": None, "stopped_at": None, "teardown": []}

    grade(paths, jobs=1, executor=executor, executed_dir=tmp_path / "kept")
    assert sorted(p.read_text() for p in (tmp_path / "kept").iterdir()) == sorted(map(str, paths))


def test_recorded_learner_differing_from_its_folder_is_flagged(tmp_path):
    """In a folder-per-learner layout, a notebook whose recorded learner is another's (copied from their hand-in)
    counts for the folder's learner and is flagged; the learner it names is not touched."""
    for who, recorded in (("ann", None), ("ben", "ann"), ("cy", "cy")):
        (tmp_path / who).mkdir()
        nbformat.write(handed_in("02", learner=recorded), tmp_path / who / "02-tcp.ipynb")
    ann, ben, cy = read_handed_in(sorted(tmp_path.glob("*/02-tcp.ipynb")))
    assert (ann.learner, ben.learner, cy.learner) == ("ann", "ben", "cy")
    assert ben.name_mismatch == "recorded learner 'ann' differs from its folder 'ben'"
    assert ann.name_mismatch is None and cy.name_mismatch is None
    assert ann.conflict is ben.conflict is cy.conflict is None
    assert score(ben, []).statuses == ["name mismatch"] and score(ann, []).statuses == ["ok"]


def _thirty_vms(tmp_path: Path, names: list[str]) -> list[Path]:
    """One hand-in per VM as `labkit export` packs it, unpacked: handin/<vm>/<name>/02-tcp.ipynb."""
    paths = []
    for k, name in enumerate(names):
        path = tmp_path / "handin" / f"vm{k:02d}" / name / "02-tcp.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(handed_in("02", answers={ex: "1" for ex in IDS}), path)
        paths.append(path)
    return paths


def _passes_by_vm(job):
    """A fake run: VM k passes its first k % 7 exercises (so each row is told apart by its score)."""
    k = int(Path(job["notebook"]).parent.parent.name[2:])
    with open(job["log"], "a") as f:
        for j, ex in enumerate(IDS):
            f.write(json.dumps(_log(ex, j < k % 7)) + "\n")
    return {"cell_errors": [], "stopped": None, "stopped_at": None, "teardown": []}


def test_thirty_hand_ins_from_thirty_vms_grade_to_thirty_rows_and_a_duplicate_is_reported(tmp_path):
    """Acceptance: thirty hand-ins from 30 VMs (30 names) grade to 30 CSV rows, each its own learner's score;
    a 31st under a name already taken is reported as a conflict (neither counts) rather than merged."""
    from labkit.grading.report import warnings

    names = [f"Learner {k:02d}" for k in range(30)]
    paths = _thirty_vms(tmp_path, names)
    scores = grade([tmp_path / "handin"], jobs=2, executor=_passes_by_vm)
    rows = list(csv.DictReader(format_csv(scores).splitlines()))
    assert [r["learner"] for r in rows] == names and len(rows) == 30
    assert [int(r["score"]) for r in rows] == [min(k % 7, len(IDS)) for k in range(30)]
    assert {r["status"] for r in rows} == {"ok"} and warnings(scores) == []

    dup = tmp_path / "handin" / "vm30" / "Learner 07" / "02-tcp.ipynb"
    dup.parent.mkdir(parents=True)
    nbformat.write(handed_in("02"), dup)
    scores = grade([tmp_path / "handin"], jobs=2, executor=_passes_by_vm)
    rows = list(csv.DictReader(format_csv(scores).splitlines()))
    assert len(rows) == 30
    row = next(r for r in rows if r["learner"] == "Learner 07")
    assert row["status"] == "lab 02: conflict" and row["score"] == "0"
    assert row["notebooks"] == f"{paths[7]};{dup}"
    assert [w for w in warnings(scores) if w.startswith("conflict:")] == [
        f"conflict: 2 notebooks of lab 02 handed in under 'Learner 07' ({paths[7]}, {dup}): none counts; "
        "grade the right one again alone"]


def test_progress_names_what_went_wrong_with_a_notebook():
    """The progress line of a notebook that did not run cleanly names its statuses, not only 'stopped early'."""
    import io

    from labkit.cli.grade import progress_bar

    scores = class_scores()
    scores[1].stop, scores[1].error = "dead kernel", "stopped at cell 9: the kernel died"
    out = io.StringIO()
    show = progress_bar(out)
    show(1, 2, scores[0])
    show(2, 2, scores[1])
    first, second = out.getvalue().splitlines()
    assert first.endswith("alice lab 02 5/6") and second.endswith("bob lab 02 4/6 - dead kernel")
