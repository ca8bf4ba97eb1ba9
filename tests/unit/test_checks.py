"""Unit tests for labkit.checks: registration, grading, hint ladder, never a traceback."""
from __future__ import annotations

import json

import pytest

from labkit import checks
from labkit.checks import Outcome, check, compare_rows, exercise


@pytest.fixture
def fake_exercise(monkeypatch):
    """Register exercise 99.1 whose answer must equal the fake lab's value."""
    monkeypatch.setattr(checks, "_REGISTRY", dict(checks._REGISTRY))
    checks.reset_attempts()

    @exercise("99.1", "the answer is the lab's value", hints=("nudge", "look at lab.value", "it is 42"))
    def grade(answer, lab):
        if answer == lab.value:
            return Outcome(True, "right")
        return Outcome(False, f"expected {lab.value}, got {answer}", (("-", str(lab.value), str(answer)),))

    class Lab:
        value = 42

    return Lab()


def test_pass_and_fail_read_the_lab(fake_exercise):
    """check() passes when the grader agrees with the live value and fails otherwise."""
    assert check("99.1", 42, lab=fake_exercise).passed
    res = check("99.1", 41, lab=fake_exercise)
    assert not res.passed and res.message == "expected 42, got 41"
    assert res.diff == (("-", "42", "41"),)


def test_hint_ladder_reveals_the_answer_last(fake_exercise):
    """Wrong answers get the nudge, then where to look, then the answer, which then stays."""
    hints = [check("99.1", 0, lab=fake_exercise).hint for _ in range(4)]
    assert hints == ["nudge", "look at lab.value", "it is 42", "it is 42"]


def test_grader_exception_becomes_a_failed_result(fake_exercise, monkeypatch):
    """A grader that raises yields a failed result with the error's text, not a traceback."""

    @exercise("99.2", "broken grader")
    def broken(answer, lab):
        raise KeyError("row")

    res = check("99.2", 1, lab=fake_exercise)
    assert not res.passed and "KeyError" in res.message and "row" in res.message


def test_unknown_exercise_lists_known_ones(fake_exercise):
    """Checking an unknown id fails with the list of known exercises."""
    res = check("99.9", 1, lab=fake_exercise)
    assert not res.passed and "99.1" in res.message


def test_results_go_to_the_grade_log(fake_exercise, tmp_path, monkeypatch):
    """With LABKIT_GRADE_LOG set, every result is appended as one JSON line."""
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("LABKIT_GRADE_LOG", str(log))
    check("99.1", 1, lab=fake_exercise)
    check("99.1", 42, lab=fake_exercise)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["exercise"], x["passed"], x["attempt"]) for x in lines] == [("99.1", False, 1), ("99.1", True, 2)]


def test_result_renders_html_with_banner_and_diff(fake_exercise):
    """The HTML form shows pass/fail, the message, the hint and the diff table."""
    html = check("99.1", "<b>", lab=fake_exercise)._repr_html_()
    assert "not yet" in html and "&lt;b&gt;" in html and "<table" in html and "nudge" in html
    assert "correct" in check("99.1", 42, lab=fake_exercise)._repr_html_()


def test_compare_rows_diff():
    """compare_rows marks matching, missing and unexpected rows."""
    out = compare_rows(["IN TCP", "IN ICMP related"], ["IN TCP", "OUT TCP"], "rows")
    assert not out.passed
    assert sorted(out.diff) == [("+", "(not expected)", "OUT TCP"), ("-", "IN ICMP related", "(missing)"),
                                ("=", "IN TCP", "IN TCP")]
    assert compare_rows(["a"], ["a"], "rows").passed


def test_duplicate_registration_refused(fake_exercise):
    """Registering a different grader under an existing id is an error."""
    with pytest.raises(ValueError, match="registered twice"):
        exercise("99.1", "again")(lambda a, l: Outcome(True, ""))


def test_placeholder_is_not_an_attempt(fake_exercise):
    """Checking the None placeholder fails politely and spends no hint."""
    res = check("99.1", None, lab=fake_exercise)
    assert not res.passed and "replace None" in res.message and res.hint is None
    assert check("99.1", 0, lab=fake_exercise).hint == "nudge"
