"""Unit tests for labkit.grading.checks: registration, grading from recorded evidence, the hint ladder, missing evidence
that costs no try, what a saved notebook keeps, never a traceback."""
from __future__ import annotations

import json

import pytest

from labkit.grading import checks
from labkit.grading.checks import CHECK_MIME, Outcome, check, compare_rows, exercise
from labkit.observe.evidence import JOURNAL


class FakeLab:
    """The static facts a grader may read; graders never touch its maps."""

    name = "unit-checks"


@pytest.fixture
def lab(monkeypatch):
    """Exercise 99.1: the answer must equal the value the newest 'measure' snapshot recorded."""
    monkeypatch.setattr(checks, "_REGISTRY", dict(checks._REGISTRY))
    checks.reset_attempts()
    JOURNAL.reset(FakeLab.name)

    @exercise("99.1", "the answer is the measured value", hints=("where to look", "narrower", "it is 42"),
              cells=("1. Measure",))
    def grade(answer, ev):
        snap = ev.snapshot("measure")
        if snap is None:
            return Outcome.needs("1. Measure", "it records the value")
        if answer == snap.extra:
            return Outcome(True, "right")
        return Outcome(False, f"{answer} is not what your cell measured", (("-", str(snap.extra), str(answer)),),
                       reveal=str(snap.extra))

    yield FakeLab()
    JOURNAL.reset(FakeLab.name)


def _measure(value):
    from labkit.observe.evidence import Snapshot

    JOURNAL.record(FakeLab.name, "snapshot", "measure", Snapshot("measure", 0, {}, {}, extra=value))


def test_grades_the_recorded_evidence(lab):
    """check() grades against what the cell recorded, however the world moved on since."""
    _measure(42)
    assert check("99.1", 42, lab=lab).passed
    _measure(7)  # a later cell measured again: the newest evidence counts
    assert not check("99.1", 42, lab=lab).passed and check("99.1", 7, lab=lab).passed


def test_missing_evidence_names_the_cell_and_costs_no_try(lab):
    """Without the evidence the check names the cell to run and does not count a try or spend a hint."""
    res = check("99.1", 42, lab=lab)
    assert not res.passed and res.missing == "1. Measure" and "1. Measure" in res.message
    assert res.attempt == 0 and res.hint is None and checks.attempts("99.1", lab.name) == 0


def test_hint_ladder_reveals_only_on_the_third_try(lab):
    """Try 1 says where to look, try 2 narrows, try 3 gives the answer and the expected value; before that
    no expected value is shown."""
    _measure(42)
    first, second, third = (check("99.1", n, lab=lab) for n in range(3))
    assert (first.hint, second.hint, third.hint) == ("where to look", "narrower", "it is 42")
    assert first.diff == () and first.reveal is None and "42" not in str(first)
    assert second.diff == () and second.reveal is None
    assert third.diff == (("-", "42", "2"),) and third.reveal == "42"


def test_reveal_shows_the_expected_value_at_once(lab):
    """check(..., reveal=True) shows the expected value and the last hint on the first try, and counts it."""
    _measure(42)
    res = check("99.1", 0, lab=lab, reveal=True)
    assert res.reveal == "42" and res.hint == "it is 42" and res.attempt == 1


def test_grader_exception_becomes_a_failed_result(lab):
    """A grader that raises yields a failed result with the error's text, not a traceback."""

    @exercise("99.2", "broken grader")
    def broken(answer, ev):
        raise KeyError("row")

    res = check("99.2", 1, lab=lab)
    assert not res.passed and "KeyError" in res.message and "row" in res.message


def test_unknown_exercise_lists_known_ones(lab):
    """Checking an unknown id fails with the list of known exercises."""
    res = check("99.9", 1, lab=lab)
    assert not res.passed and "99.1" in res.message


def test_results_go_to_the_grade_log(lab, tmp_path, monkeypatch):
    """With LABKIT_GRADE_LOG set, every result is appended as one JSON line, the answer and a missing
    evidence's cell included."""
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("LABKIT_GRADE_LOG", str(log))
    check("99.1", 5, lab=lab)
    _measure(42)
    check("99.1", 1, lab=lab)
    check("99.1", 42, lab=lab)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["exercise"], x["passed"], x["attempt"], x["missing"], x["answer"]) for x in lines] == [
        ("99.1", False, 0, "1. Measure", "5"), ("99.1", False, 1, None, "1"), ("99.1", True, 2, None, "42")]


def test_result_keeps_a_machine_readable_part(lab):
    """The displayed result carries CHECK_MIME (exercise, passed, try, answer): a saved notebook keeps the
    learner's own tries for `labkit grade`."""
    _measure(42)
    bundle = check("99.1", 1, lab=lab)._repr_mimebundle_()
    assert bundle[CHECK_MIME] == {"exercise": "99.1", "passed": False, "attempt": 1, "missing": None,
                                  "answer": "1", "message": "1 is not what your cell measured"}
    assert "not yet" in bundle["text/html"] and "where to look" in bundle["text/html"]
    assert "correct" in check("99.1", 42, lab=lab)._repr_mimebundle_()["text/html"]


def test_html_escapes_the_answer(lab):
    """The HTML form escapes what the learner typed."""
    _measure(42)
    assert "&lt;b&gt;" in check("99.1", "<b>", lab=lab)._repr_mimebundle_()["text/html"]


def test_compare_rows_diff():
    """compare_rows marks matching, missing and unexpected rows; its message names none of the expected rows."""
    out = compare_rows(["IN TCP", "IN ICMP related"], ["IN TCP", "OUT TCP"], "rows")
    assert not out.passed and "IN ICMP related" not in out.message
    assert sorted(out.diff) == [("+", "(not expected)", "OUT TCP"), ("-", "IN ICMP related", "(missing)"),
                                ("=", "IN TCP", "IN TCP")]
    assert out.reveal == "IN ICMP related, IN TCP"
    assert compare_rows(["a"], ["a"], "rows").passed


def test_duplicate_registration_refused(lab):
    """Registering a different grader under an existing id is an error."""
    with pytest.raises(ValueError, match="registered twice"):
        exercise("99.1", "again")(lambda a, e: Outcome(True, ""))


def test_placeholder_is_not_an_attempt(lab):
    """Checking the None placeholder fails politely and spends no hint."""
    _measure(42)
    res = check("99.1", None, lab=lab)
    assert not res.passed and "replace None" in res.message and res.hint is None
    assert check("99.1", 0, lab=lab).hint == "where to look"


def test_check_before_the_setup_cell_says_so(monkeypatch):
    """A check with no lab (labkitd found none up under the notebook's name) names the setup cell instead of
    raising, and spends no try."""
    monkeypatch.setattr(checks, "_REGISTRY", dict(checks._REGISTRY))

    @exercise("99.3", "needs a lab")
    def grade(answer, ev):
        return Outcome(True, "")

    res = check("99.3", 1, lab=None)
    assert not res.passed and res.missing == "Run this cell" and res.attempt == 0


def test_tries_are_counted_per_lab(lab):
    """Two labs' tries of one exercise are counted apart (labkitd grades every user's labs in one process)."""
    _measure(42)
    check("99.1", 1, lab=lab)
    check("99.1", 2, lab=lab)
    assert checks.attempts("99.1", lab.name) == 2 and checks.attempts("99.1", "someone-else") == 0
    checks.set_attempts("99.1", 5, lab="someone-else")
    assert checks.attempts("99.1", "someone-else") == 5 and checks.attempts("99.1", lab.name) == 2


def test_a_full_result_crosses_the_door_whole(lab):
    """CheckResult.to_json(full=True) carries everything from_json needs to show the same result."""
    _measure(42)
    for answer in (1, 2, 3, 42):
        res = check("99.1", answer, lab=lab)
        back = checks.CheckResult.from_json(res.to_json(full=True))
        assert back == res and str(back) == str(res) and back._repr_mimebundle_() == res._repr_mimebundle_()


def test_the_same_wrong_answer_again_costs_no_try(lab):
    """A wrong answer given again (the answer cell re-run as it was) is graded and answered but not counted: the
    try count, hint and reveal stay where the first time left them; a new wrong answer counts."""
    _measure(42)
    first = check("99.1", {"a", "b"}, lab=lab)
    again = check("99.1", {"b", "a"}, lab=lab)  # the same set, built in another order
    assert (first.attempt, again.attempt) == (1, 1) and checks.attempts("99.1", lab.name) == 1
    assert first.charged and not again.charged and again.hint == "where to look" and again.reveal is None
    assert "try 1" in again.message and checks.NOT_A_TRY in again.message
    assert check("99.1", 0, lab=lab).attempt == 2 and check("99.1", 0, lab=lab).attempt == 2
    assert check("99.1", 42, lab=lab).attempt == 3  # a right answer always counts


def test_a_repeat_after_the_tries_restart_counts_again(lab):
    """When the tries start again (the lab was taken down), the wrong answers given before are forgotten too."""
    _measure(42)
    check("99.1", 0, lab=lab)
    checks.reset_attempts(lab=lab.name)
    assert check("99.1", 0, lab=lab).attempt == 1 and checks.attempts("99.1", lab.name) == 1


def test_a_malformed_answer_costs_no_try(lab):
    """An answer the grader cannot read (Outcome.unreadable, or a grader that raises on it) is answered with what
    was expected and costs no try and no hint."""

    @exercise("99.4", "a number of seconds", hints=("one", "two", "three"))
    def grade(answer, ev):
        if not isinstance(answer, int):
            return Outcome.unreadable(f"expected a whole number of seconds, got {answer!r}.")
        return Outcome(answer == int(answer[0]), "unreachable")  # raises on every int answer

    res = check("99.4", "ten", lab=lab)
    assert not res.passed and "whole number" in res.message and checks.NOT_A_TRY in res.message
    assert res.attempt == 0 and res.hint is None and not res.charged and checks.attempts("99.4", lab.name) == 0
    raised = check("99.4", 10, lab=lab)
    assert not raised.passed and "TypeError" in raised.message and raised.attempt == 0


def test_a_new_labkitd_keeps_the_repeats_free(lab, tmp_path, monkeypatch):
    """labkitd reading a lab's kept results back (after a restart) knows the wrong answers already counted."""
    from types import SimpleNamespace

    from labkit.door import daemon
    from labkit.door.evidence import append_check

    monkeypatch.setenv("LABKIT_DOOR", str(tmp_path / "labkitd.sock"))
    _measure(42)
    for answer in ("x", "y"):
        append_check(lab.name, check("99.1", answer, lab=lab).to_json(full=True))
    checks.reset_attempts()  # a new labkitd: nothing in memory
    daemon._open_lab(SimpleNamespace(opened=lambda key, lab: None))(SimpleNamespace(key=lab.name, lab=lab))
    assert checks.attempts("99.1", lab.name) == 2
    assert check("99.1", "x", lab=lab).attempt == 2 and check("99.1", "z", lab=lab).attempt == 3
