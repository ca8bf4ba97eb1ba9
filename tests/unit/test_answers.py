"""Unit tests of labkit.grading.answers: the answer key in both formats, `labkit answers`, and reading an answer's value."""
from __future__ import annotations

import json

import pytest

from labkit import cli
from labkit.grading.answers import canonical, format_key, key_json, lab_id, load_key, rhs
from labkit.grading.checks import exercises_for
from labkit.errors import ConfigError, NotFoundError

IDS = [e.id for e in exercises_for("02")]


@pytest.fixture
def keys(tmp_path, monkeypatch):
    """A folder of keys ($LABKIT_ANSWERS): lab 02 in the instructor format."""
    key = {ex: {"answer": f"answer_{ex.replace('.', '_')} = 1",
                "wrong": [{"answer": f"answer_{ex.replace('.', '_')} = 2", "misconception": f"why {ex}",
                           "message": "two is not one"},
                          {"answer": f"answer_{ex.replace('.', '_')} = 3", "misconception": "", "message": "nor three"}]}
           for ex in reversed(IDS)}
    (tmp_path / "02.json").write_text(json.dumps(key))
    monkeypatch.setenv("LABKIT_ANSWERS", str(tmp_path))
    return tmp_path


def test_key_in_the_instructor_format(keys):
    """Each exercise has its reference answer and its wrong answers with misconception and message, in order."""
    key = load_key("2")
    assert list(key) == IDS
    e = key["02.1"]
    assert e.answer == "answer_02_1 = 1" and [w.answer for w in e.wrong] == ["answer_02_1 = 2", "answer_02_1 = 3"]
    assert (e.wrong[0].misconception, e.wrong[0].message) == ("why 02.1", "two is not one")


def test_key_in_the_old_format(tmp_path, monkeypatch):
    """labs/answers' format (one wrong source and its wrong_message) reads as one wrong answer."""
    (tmp_path / "05.json").write_text(json.dumps({"05.1": {"answer": "answer_05_1 = 1", "wrong": "answer_05_1 = 2",
                                                           "wrong_message": "not 2"}}))
    monkeypatch.setenv("LABKIT_ANSWERS", str(tmp_path))
    [w] = load_key("05")["05.1"].wrong
    assert (w.answer, w.message, w.misconception) == ("answer_05_1 = 2", "not 2", "")


def test_missing_key_names_where_it_looked(keys):
    """A lab without a key is a NotFoundError naming the file looked for."""
    with pytest.raises(NotFoundError, match=r"answer key of lab 42 not found .*42\.json"):
        load_key("42")
    with pytest.raises(ConfigError, match="expected a lab number"):
        lab_id("tcp")


def test_labkit_answers_prints_the_key(keys, capsys):
    """`labkit answers 02` prints each exercise's title, answer, wrong answers and misconceptions; --json the same data."""
    assert cli.main(["answers", "02"]) == 0
    out = capsys.readouterr().out
    title = exercises_for("02")[0].title
    assert f"02.1  {title}" in out and "answer  answer_02_1 = 1" in out
    assert "wrong   answer_02_1 = 2" in out and "misconception: why 02.1" in out and "fails with: nor three" in out
    assert cli.main(["answers", "02", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lab"] == "02" and data["exercises"][0]["title"] == title
    assert data == key_json("02") and format_key("02") == out.rstrip("\n")


def test_rhs_and_canonical():
    """The value of `answer_NN_M = …` as written; equal literals share one canonical spelling."""
    assert rhs("x = 1\nanswer_02_1 = ('a',\n 2)  # mine", "answer_02_1") == "('a',\n 2)"
    assert rhs("print('no assignment')") == "print('no assignment')"
    assert canonical("('a',\n 2)") == canonical('("a", 2)') == "('a', 2)"
    assert canonical("lab.pod( 'a1' )") == "lab.pod( 'a1' )"
