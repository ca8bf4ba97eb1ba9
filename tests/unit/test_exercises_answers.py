"""How labs 01, 02, 06 and 09 read answers (no lab: the graders' readers and the answer keys): an answer naming several
possibilities where one is asked for is refused with "name one", and no reference answer of these labs is anything
but what a learner types (a literal), nor does a hint before the third give it away."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from labkit.grading.checks import exercises_for
from labkit.grading.exercises import lab01, lab06, lab09

KEYS = Path(__file__).resolve().parents[2] / "instructor" / "answers"


@pytest.mark.parametrize("answer", ["IN OUT related", "related or IN", ["IN", "OUT", "related"], "related, ICMP",
                                    ("related", "OUT")])
def test_01_4_several_kinds_of_row_are_not_an_answer(answer):
    """01.4: a list of row kinds, or words for several kinds, is read as several kinds (the grader says 'name one')
    instead of passing because 'related' is among them."""
    assert lab01._several_kinds(answer)


@pytest.mark.parametrize("answer", ["related", "RELATED twins (ports 0)", "ICMP IN related", ["related"], "IN"])
def test_01_4_one_kind_of_row_is_an_answer(answer):
    """01.4: one word, or the one kind as the CT line spells it, is graded as an answer."""
    assert not lab01._several_kinds(answer)


@pytest.mark.parametrize("value", ["ECONNREFUSED or ETIMEDOUT", ["EHOSTUNREACH", "ECONNREFUSED", "ETIMEDOUT"],
                                   "refused / no route to host"])
def test_06_4_several_errors_are_not_an_answer(value):
    """06.4: a value naming several errnos reads as several (the substring match used to take the first it found)."""
    assert lab06._failure(value) == lab06.SEVERAL


def test_06_4_one_error_in_any_spelling():
    """06.4: one errno, by name, number or strerror text, is read as that errno."""
    assert [lab06._failure(v) for v in ("ECONNREFUSED", "Connection refused (111)", "No route to host")] == [
        "ECONNREFUSED", "ECONNREFUSED", "EHOSTUNREACH"]


def test_06_2_vip_and_backend_at_once_is_not_an_answer():
    """06.2: 'VIP or backend' names both destinations."""
    assert lab06._vip_or_backend("VIP or backend", "198.19.0.10", {}) == lab06.SEVERAL
    assert lab06._vip_or_backend("the VIP", "198.19.0.10", {}) == "VIP"


def test_09_2_reads_a_part_of_the_conntrack_entry():
    """09.2 asks which part of the entry names the backend: spellings of one part, several parts, an address."""
    assert [lab09._part(a) for a in ("reply src", "the source of the reply tuple", ("Reply", "Source"))] == [
        "reply src"] * 3
    assert lab09._part("reply src or original dst") == lab09.SEVERAL
    assert lab09._part("198.18.2.11:8080") is None


def _literal(source: str):
    return ast.literal_eval(ast.parse(source).body[-1].value)


@pytest.mark.parametrize("lab_id", ["01", "02", "06", "09"])
def test_reference_answers_are_what_a_learner_types(lab_id):
    """Every reference answer of the lab is a literal read off the screen: none recomputes the value from what a run
    recorded (09.2 and 09.4 did, because a literal failed the regrade half the time)."""
    key = json.loads((KEYS / f"{lab_id}.json").read_text())
    for ex, entry in key.items():
        try:
            _literal(entry["answer"])
        except ValueError:
            pytest.fail(f"{ex}: the reference answer is not a literal: {entry['answer']}")


@pytest.mark.parametrize("lab_id", ["01", "02", "06", "09"])
def test_first_two_hints_do_not_give_the_answer(lab_id):
    """The hints of tries 1 and 2 never contain the reference answer (only the third, the reveal, does)."""
    key = json.loads((KEYS / f"{lab_id}.json").read_text())
    for ex in exercises_for(lab_id):
        value = _literal(key[ex.id]["answer"])
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        for hint in ex.hints[:2]:
            assert not [v for v in items if str(v) in hint], f"{ex.id}: {hint!r} gives away {value!r}"
