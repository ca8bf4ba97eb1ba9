"""The grade reports (table, CSV, JSON, HTML) from fabricated scores (labkit.grading.report)."""
from __future__ import annotations

import csv
import io
import json

from gradefixtures import class_scores
from labkit.grading.checks import exercises_for
from labkit.grading.report import format_csv, format_html, format_json, format_table, summarize, warnings

IDS = [e.id for e in exercises_for("02")]


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
    assert header[:7] == ["learner", "notebooks", "status", "02.1", "02.1 status", "02.1 answer", "02.1 tries"]
    assert (rows["alice"]["status"], rows["alice"]["02.2 status"], rows["bob"]["02.2 status"]) == \
        ("ok", "failed", "unanswered")
    assert (rows["carol"]["status"], rows["carol"]["02.3 status"]) == ("lab 02: missing evidence", "missing evidence")
    assert header[-2:] == ["score", "total"]


def test_a_second_hand_in_of_one_lab_is_a_conflict_not_merged():
    """Two notebooks of one lab under one name: neither counts (the lab's exercises read 'conflict', the score
    leaves them out), both are listed, the learner's status and a warning say so; their other labs still count."""
    scores = class_scores()
    again = scores[0].__class__(**{**scores[0].__dict__, "notebook": "alice/02-again.ipynb", "exercises": [
        e.__class__(**{**e.__dict__, "passed": True, "status": "passed"}) for e in scores[0].exercises]})
    rows = _rows(format_csv(scores + [again]))
    ids03 = [e.id for e in exercises_for("03")]
    assert rows["alice"]["score"] == str(len(ids03)) and rows["alice"]["status"] == "lab 02: conflict"
    assert rows["alice"]["notebooks"] == "alice/02.ipynb;alice/03.ipynb;alice/02-again.ipynb"
    assert {rows["alice"][f"{ex} status"] for ex in IDS} == {"conflict"} and {rows["alice"][ex] for ex in IDS} == {""}
    assert rows["alice"][f"{ids03[0]} status"] == "passed" and rows["bob"]["status"] == "ok"
    notes = warnings(scores + [again])
    assert any(n.startswith("conflict: 2 notebooks of lab 02 handed in under 'alice' (alice/02.ipynb, "
                            "alice/02-again.ipynb): none counts") for n in notes)
    assert not any("later one counts" in n for n in notes)
    x1 = {x.id: x for x in summarize(scores + [again])}["02.1"]
    assert (x1.learners, x1.conflict, x1.passed) == (3, 1, 0)


def test_csv_cells_are_escaped_against_formula_injection():
    """An answer or a name starting with = + - @ TAB or CR gets a leading apostrophe (OWASP); others are as given."""
    scores = class_scores()
    scores[1].learner = "=cmd|'/c calc'!A1"
    for e, text in zip(scores[0].exercises, ["=1+1", "+SUM(A1)", "-2", "@x", "\tTAB", "\rCR"]):
        e.answer = text
    rows = list(csv.DictReader(io.StringIO(format_csv(scores))))
    assert rows[1]["learner"] == "'=cmd|'/c calc'!A1"
    assert [rows[0][f"{ex} answer"] for ex in IDS] == ["'=1+1", "'+SUM(A1)", "'-2", "'@x", "'\tTAB", "'\rCR"]
    assert rows[2]["02.1 answer"] == '["SYN"]'


def test_grader_error_and_notebook_statuses_are_distinct_in_csv_json_and_html():
    """A grader error shows with its reason; a timeout, a dead kernel and cell errors are each a status of their
    own in the CSV, JSON and HTML, never only a 0."""
    scores = class_scores()
    first = scores[0].exercises[0]
    first.status, first.message, first.passed = "grader error", "could not check this answer: KeyError: 'x'", False
    scores[1].stop, scores[1].error = "timeout", "stopped at cell 7: the notebook ran over its time limit (60 s)"
    scores[3].stop, scores[3].error = "dead kernel", "stopped at cell 9: the kernel died"
    scores[3].cell_errors = ["cell 4: NameError: x"]
    rows = _rows(format_csv(scores))
    assert rows["alice"]["02.1 status"] == "grader error: could not check this answer: KeyError: 'x'"
    assert (rows["bob"]["status"], rows["carol"]["status"]) == \
        ("lab 02: timeout", "lab 02: dead kernel, cell errors, missing evidence")
    data = format_json(scores)
    assert [n["statuses"] for n in data["notebooks"]] == \
        [["ok"], ["timeout"], ["ok"], ["dead kernel", "cell errors", "missing evidence"]]
    assert data["learners"][1]["status"] == "lab 02: timeout"
    page = format_html(scores)
    assert "Notebooks that did not run cleanly" in page and "the kernel died" in page
    assert "dead kernel, cell errors, missing evidence" in page


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


def test_table_writes_no_terminal_escape_from_a_learner():
    """An answer or a name carrying a terminal escape or a carriage return is shown escaped in the table."""
    scores = class_scores()
    scores[1].learner = "bob\x1b]0;owned\x07"
    scores[0].exercises[1].answer = "(60, 60)\r\x1b[2Jall passed"
    text = format_table(scores)
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text
    assert "bob\\x1b]0;owned\\x07  lab 02" in text and "answer (60, 60)\\r\\x1b[2Jall passed" in text
