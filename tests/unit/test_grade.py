"""Unit tests of ``labkit grade`` without a lab or a kernel: the learner's record read from a handed-in file,
learner names, scoring from a grade log, the reports (table, CSV, JSON, HTML) from fabricated scores, and
the job runner's time limits and crashes with fake executors. Re-execution on the datapath: tests/labs/test_grade.py.
"""
from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

import nbformat
import pytest

from gradefixtures import check_output, class_scores, handed_in
from labkit import cli
from labkit.grading.jobs import run_jobs
from labkit.grading.checks import exercises_for
from labkit.errors import ConfigError
from labkit.grading.grade import (HandedIn, answer_cells, check_cells, grade, grade_lab_name, lab_of, learner_names,
                          read_handed_in, read_record, saved_checks, score)
from labkit.grading.report import format_csv, format_html, format_json, format_table, summarize, warnings

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


def test_learner_from_metadata_then_folder_then_file():
    """metadata.labkit.learner wins; a folder per learner names the learner; else the file's name."""
    named = handed_in(learner="Dana")
    assert learner_names([(Path("x/02.ipynb"), named, "02"), (Path("y/02.ipynb"), None, "02")]) == ["Dana", "y"]
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


def test_unreadable_files_are_reported_not_fatal(tmp_path):
    """A file that is not a notebook, or has no lab, is kept with its problem."""
    (tmp_path / "02-broken.ipynb").write_text("{not json")
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "nolab.ipynb")
    broken, nolab = read_handed_in([tmp_path / "02-broken.ipynb", tmp_path / "nolab.ipynb"])
    assert broken.lab == "02" and broken.problem.startswith("cannot read it")
    assert nolab.problem and "no labkit.lab" in nolab.problem
    s = score(broken, [])
    assert s.score == 0 and {e.status for e in s.exercises} == {"not checked"}
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
                   "02.4": ("not checked", False), "02.5": ("missing", False), "02.6": ("not checked", False)}
    by_id = {e.id: e for e in s.exercises}
    assert by_id["02.1"].tries == 2 and by_id["02.1"].checks == 2 and by_id["02.3"].message == "wrong flags"
    assert by_id["02.4"].message == "its check cell raised NameError: name 'x' is not defined"
    assert by_id["02.6"].message == "its check cell is not in the notebook"
    assert not any("replace None" in e.message for e in s.exercises)
    assert s.cell_errors == [f"cell {checks['02.4']}: NameError: name 'x' is not defined"] and s.score == 1

    stopped = score(item, logged[:2], {"stopped_at": checks["02.3"]}, error="stopped at cell 9: the kernel died")
    assert {e.id: e.message for e in stopped.exercises}["02.3"] == \
        "the run stopped before its check (stopped at cell 9: the kernel died)"


# -- reports ------------------------------------------------------------------------------------------
def _rows(text: str) -> dict[str, dict]:
    return {r["learner"]: r for r in csv.DictReader(io.StringIO(text))}


def test_csv_one_row_per_learner_with_answers_tries_and_totals():
    """A row per learner (labs handed in several share it): passed, answer, tries per exercise; score/total
    over every lab of the run (a lab not handed in is blank and scores 0)."""
    scores = class_scores()
    ids03 = [e.id for e in exercises_for("03")]
    rows = _rows(format_csv(scores))
    assert list(rows) == ["alice", "bob", "carol"]
    total = str(len(IDS) + len(ids03))
    assert (rows["alice"]["score"], rows["alice"]["total"]) == (str(len(IDS) - 1 + len(ids03)), total)
    assert (rows["bob"]["score"], rows["bob"]["total"]) == (str(len(IDS) - 2), total)
    assert rows["alice"]["02.2"] == "0" and rows["alice"]["02.2 answer"] == "(60, 60)"
    assert rows["alice"]["02.2 tries"] == "3"
    assert (rows["bob"]["02.2"], rows["bob"]["02.2 answer"], rows["bob"]["02.2 tries"]) == ("0", "", "0")
    assert rows["bob"][ids03[0]] == rows["bob"][f"{ids03[0]} answer"] == rows["bob"][f"{ids03[0]} tries"] == ""
    assert rows["alice"]["notebooks"] == "alice/02.ipynb;alice/03.ipynb"
    header = format_csv(scores).splitlines()[0].split(",")
    assert header[:5] == ["learner", "notebooks", "02.1", "02.1 answer", "02.1 tries"]
    assert header[-2:] == ["score", "total"]


def test_a_second_hand_in_of_one_lab_counts_and_is_warned_about():
    """Two notebooks of one lab by one learner: the later counts in the CSV, and a warning says so."""
    scores = class_scores()
    again = scores[1].__class__(**{**scores[1].__dict__, "notebook": "bob/02-again.ipynb", "exercises": [
        e.__class__(**{**e.__dict__, "passed": True, "status": "passed"}) for e in scores[1].exercises]})
    rows = _rows(format_csv(scores + [again]))
    assert rows["bob"]["score"] == str(len(IDS)) and rows["bob"]["notebooks"] == "bob/02-again.ipynb"
    assert any("bob handed in lab 02 twice" in w for w in warnings(scores + [again]))


def test_json_has_every_notebook_learner_and_exercise():
    """JSON: every notebook's score (with exercises, answers, tries), learners' totals, and the per-exercise summary."""
    data = json.loads(json.dumps(format_json(class_scores())))
    assert [n["learner"] for n in data["notebooks"]] == ["alice", "bob", "alice", "carol"]
    first = data["notebooks"][0]
    assert (first["score"], first["total"]) == (len(IDS) - 1, len(IDS))
    assert {"id", "status", "passed", "answer", "tries", "message"} <= set(first["exercises"][0])
    assert [t["learner"] for t in data["learners"]] == ["alice", "bob", "carol"]
    x1 = next(x for x in data["exercises"] if x["id"] == "02.1")
    assert (x1["learners"], x1["passed"], x1["failed"], x1["pass_rate"]) == (3, 1, 2, 0.333)


def test_summary_groups_equal_wrong_answers_commonest_first():
    """Wrong answers of failed exercises group by their value (quotes and spaces do not matter), commonest first."""
    x = {s.id: s for s in summarize(class_scores())}
    assert x["02.1"].wrong[0]["answer"] == "['SYN']" and x["02.1"].wrong[0]["count"] == 2
    assert (x["02.2"].failed, x["02.2"].unanswered, x["02.3"].other) == (1, 1, 1)
    assert x["02.3"].wrong == []  # missing evidence is not a wrong answer


def test_html_report_is_self_contained(monkeypatch, tmp_path):
    """The HTML report shows pass rates, wrong answers with the key's misconception, learners' totals; it
    escapes what learners wrote and loads nothing from elsewhere."""
    key = {ex: {"answer": f"answer_{ex.replace('.', '_')} = 1", "wrong": []} for ex in IDS}
    key["02.1"]["wrong"] = [{"answer": "answer_02_1 = ['SYN']", "misconception": "the last ACK is not sent",
                             "message": "missing"}]
    (tmp_path / "02.json").write_text(json.dumps(key))
    monkeypatch.setenv("LABKIT_ANSWERS", str(tmp_path))
    scores = class_scores()
    scores[1].exercises[0].answer = "['<script>']"
    page = format_html(scores)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "1/3 (33%)" in page and "the last ACK is not sent" in page
    assert "<script" not in page and "&lt;script&gt;" in page
    assert not any(s in page for s in ("http://", "https://", "<link", "src="))
    assert "<td>alice</td>" in page and "<td>carol</td>" in page


def test_table_shows_scores_statuses_and_totals():
    """The table has a block per notebook with each exercise's status and tries, the message of what failed,
    and the learners' totals."""
    text = format_table(class_scores())
    assert "alice  lab 02  alice/02.ipynb  score 5/6" in text
    assert "  02.2   FAIL        tries 3   The lifetime jump" in text and "answer (60, 60): failed message" in text
    assert "  02.2   unanswered  tries 0" in text and "  02.3   no evidence tries 0" in text
    assert "totals: alice 11/12, bob 4/12, carol 4/12" in text


# -- the job runner ------------------------------------------------------------------------------------
def _sleep_then(job):
    kind, seconds = job
    if kind == "child":  # a process of its own that must die with the job
        import subprocess

        p = subprocess.Popen(["sleep", "300"])
        Path(seconds).write_text(str(p.pid))
        time.sleep(300)
    time.sleep(seconds)
    if kind == "raise":
        raise RuntimeError("boom")
    if kind == "die":
        os._exit(3)
    if kind == "hang":
        time.sleep(300)
    return kind


def test_jobs_run_side_by_side_in_order():
    """Four half-second jobs on two workers take about two rounds, and results keep the jobs' order."""
    t = time.monotonic()
    results = run_jobs([("ok", 0.5)] * 4, _sleep_then, workers=2)
    assert [r.value for r in results] == ["ok"] * 4 and all(r.ok for r in results)
    assert time.monotonic() - t < 1.9


def test_a_job_that_raises_dies_or_hangs_never_stops_the_others(tmp_path):
    """Raising, exiting and running over the limit are each reported; the other jobs finish; finish() runs
    for every job; a timed-out job's own child processes are killed with it."""
    pidfile = tmp_path / "child.pid"
    jobs = [("raise", 0), ("ok", 0.2), ("die", 0), ("hang", 0), ("child", str(pidfile)), ("ok", 0.1)]
    finished, progress = [], []
    t = time.monotonic()
    results = run_jobs(jobs, _sleep_then, workers=3, timeout=1.5,
                       finish=lambda job, r: finished.append(job[0]), progress=lambda d, n, r: progress.append((d, n)))
    assert time.monotonic() - t < 6
    assert results[0].error.startswith("RuntimeError: boom")
    assert results[1].value == "ok" and results[5].value == "ok"
    assert results[2].error == "its process died (exit status 3)"
    assert results[3].timed_out and "time limit (1.5 s)" in results[3].error
    assert results[4].timed_out
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert sorted(finished) == sorted(j[0] for j in jobs)
    assert progress == [(k, 6) for k in range(1, 7)]


def test_a_finish_that_raises_is_reported_on_its_job():
    """An error in finish() (a lab not taken down) is kept on the job's result; the run goes on."""
    def finish(job, result):
        raise RuntimeError("lab 'g1n0' left behind")

    results = run_jobs([("ok", 0), ("ok", 0)], _sleep_then, workers=2, finish=finish)
    assert [r.finish_error for r in results] == ["RuntimeError: lab 'g1n0' left behind"] * 2


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
    assert {e.status for e in by["hangs"].exercises[3:]} == {"not checked"}
    assert len({s.lab_name for s in scores}) == 3 and all(s.lab_name.startswith(f"g{os.getpid()}n") for s in scores)
    assert sorted(d for d, _, _ in seen) == [1, 2, 3] and {n for _, n, _ in seen} == {3}


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
    """`labkit grade --csv --html F` prints the CSV on stdout, writes the class report, warns on stderr; a
    machine that cannot run labs is told so once, before anything runs."""
    import labkit.datapath.doctor
    import labkit.grading.grade
    from labkit.errors import PrivilegeError

    scores = class_scores()
    scores[0].error = "stopped at cell 9: the kernel died"
    monkeypatch.setattr(labkit.datapath.doctor, "require_datapath", lambda: None)
    monkeypatch.setattr(labkit.grading.grade, "grade", lambda paths, **kw: scores)
    assert cli.main(["grade", "x.ipynb", "--csv", "--html", str(tmp_path / "r.html"), "-q"]) == 0
    out, err = capsys.readouterr()
    assert out == format_csv(scores) and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert "labkit grade: alice/02.ipynb: stopped at cell 9: the kernel died" in err
    assert cli.main(["grade", "x.ipynb", "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["learners"][0]["learner"] == "alice"

    def no_root():
        raise PrivilegeError("this machine cannot run the lab datapath yet: not root")

    monkeypatch.setattr(labkit.datapath.doctor, "require_datapath", no_root)
    assert cli.main(["grade", "x.ipynb"]) == 1
    assert "labkit: error: this machine cannot run the lab datapath yet" in capsys.readouterr().err
