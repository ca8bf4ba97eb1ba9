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
