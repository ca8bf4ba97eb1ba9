"""Graded exercises whose checks read the live datapath.

In a notebook::

    answer_02_3 = ["IN"]            # the learner's answer
    check("02.3", answer_02_3)      # renders pass/fail, a message, a hint, a row-level diff

An exercise is a function registered with :func:`exercise`; it gets the
learner's answer and the running :class:`~labkit.lab.Lab`, reads maps and
flows, and returns an :class:`Outcome`. :func:`check` never shows a traceback
first: whatever goes wrong becomes a failed result with a message. Wrong
answers earn a hint ladder — a nudge, then where to look, then (from the
third try) the answer itself. Exercises live in :mod:`labkit.exercises`, one
module per lab; reference answers live apart, in ``labs/answers/``.

When ``LABKIT_GRADE_LOG`` names a file, every result is appended to it as a
JSON line; ``labkit grade`` reads those to score handed-in notebooks.
"""
from __future__ import annotations

import html
import importlib
import json
import os
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

__all__ = ["Outcome", "CheckResult", "Exercise", "exercise", "check", "exercises_for", "registry",
           "compare_rows", "reset_attempts"]


@dataclass(frozen=True)
class Outcome:
    """What an exercise's grader decided."""

    passed: bool
    message: str
    diff: tuple[tuple[str, str, str], ...] = ()  #: (mark, expected, got) rows; mark is '=', '-' or '+'


@dataclass(frozen=True)
class Exercise:
    """One graded question."""

    id: str  #: "02.3": lab 02, exercise 3
    title: str
    grade: Callable[[Any, Any], Outcome] = field(repr=False)
    hints: tuple[str, ...] = ()  #: nudge, where to look, the answer
    break_it: bool = False  #: a diagnose-the-fault exercise

    @property
    def lab(self) -> str:
        return self.id.split(".")[0]


_REGISTRY: dict[str, Exercise] = {}
_ATTEMPTS: dict[str, int] = {}


def exercise(id: str, title: str, hints: Iterable[str] = (), break_it: bool = False):
    """Register ``fn(answer, lab) -> Outcome`` as exercise ``id``."""

    def register(fn: Callable[[Any, Any], Outcome]) -> Callable[[Any, Any], Outcome]:
        if id in _REGISTRY and _REGISTRY[id].grade is not fn:
            raise ValueError(f"exercise '{id}' is registered twice")
        _REGISTRY[id] = Exercise(id, title, fn, tuple(hints), break_it)
        return fn

    return register


def registry() -> dict[str, Exercise]:
    """Every exercise, loading :mod:`labkit.exercises` on first use."""
    from . import exercises

    for mod in pkgutil.iter_modules(exercises.__path__):
        importlib.import_module(f"{exercises.__name__}.{mod.name}")
    return dict(_REGISTRY)


def exercises_for(lab_id: str) -> list[Exercise]:
    """The exercises of one lab, in order."""
    return sorted((e for e in registry().values() if e.lab == lab_id), key=lambda e: [int(x) for x in e.id.split(".")])


def reset_attempts(exercise_id: str | None = None) -> None:
    """Forget attempts (all, or one exercise's), restarting the hint ladder."""
    if exercise_id is None:
        _ATTEMPTS.clear()
    else:
        _ATTEMPTS.pop(exercise_id, None)


@dataclass(frozen=True)
class CheckResult:
    """A graded answer: renders as a banner, message, hint and row-level diff."""

    exercise: str
    title: str
    passed: bool
    message: str
    hint: str | None
    diff: tuple[tuple[str, str, str], ...]
    attempt: int

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        out = [f"{'PASS' if self.passed else 'FAIL'} {self.exercise} {self.title}: {self.message}"]
        if self.hint:
            out.append(f"hint: {self.hint}")
        for mark, expected, got in self.diff:
            out.append(f"  {mark} expected: {expected}   got: {got}")
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        colour, word = ("#1a7f37", "✔ correct") if self.passed else ("#cf222e", "✘ not yet")
        parts = [
            f"<div style='border-left:6px solid {colour};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{colour}'>{word}</b> — <b>{html.escape(self.exercise)}</b> {html.escape(self.title)}"
            f"<div>{html.escape(self.message)}</div>"
        ]
        if self.hint:
            parts.append(f"<div style='color:#555'><b>Hint (try {self.attempt}):</b> {html.escape(self.hint)}</div>")
        if self.diff:
            rows = "".join(
                f"<tr style='background:{ {'=': '#fff', '-': '#f7d4d4', '+': '#d4f7d4'}[m] }'><td>{m}</td>"
                f"<td><code>{html.escape(e)}</code></td><td><code>{html.escape(g)}</code></td></tr>"
                for m, e, g in self.diff
            )
            parts.append(f"<table style='font-size:11px'><tr><th></th><th>expected</th><th>yours</th></tr>{rows}</table>")
        parts.append("</div>")
        return "".join(parts)


def check(exercise_id: str, answer: Any, lab=None) -> CheckResult:
    """Grade ``answer`` to exercise ``exercise_id`` against the live lab."""
    ex = registry().get(exercise_id)
    if ex is None:
        known = ", ".join(sorted(registry()))
        result = CheckResult(exercise_id, "", False, f"no exercise '{exercise_id}' (exercises: {known})", None, (), 0)
        _record(result)
        return result
    if answer is None:  # the placeholder: not an attempt, no hint spent
        result = CheckResult(ex.id, ex.title, False, "no answer yet: replace None with your answer, then run this cell",
                             None, (), _ATTEMPTS.get(exercise_id, 0))
        _record(result)
        return result
    attempt = _ATTEMPTS[exercise_id] = _ATTEMPTS.get(exercise_id, 0) + 1
    try:
        if lab is None:
            from .nb import current_lab

            lab = current_lab()
        outcome = ex.grade(answer, lab)
        if not isinstance(outcome, Outcome):
            raise TypeError(f"grader returned {type(outcome).__name__}, expected Outcome")
    except Exception as exc:  # never a traceback first: say what went wrong
        outcome = Outcome(False, f"could not check this answer: {type(exc).__name__}: {exc}")
    hint = None
    if not outcome.passed and ex.hints:
        hint = ex.hints[min(attempt, len(ex.hints)) - 1]
    result = CheckResult(ex.id, ex.title, outcome.passed, outcome.message, hint, tuple(outcome.diff), attempt)
    _record(result)
    return result


def _record(result: CheckResult) -> None:
    path = os.environ.get("LABKIT_GRADE_LOG")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"exercise": result.exercise, "passed": result.passed, "message": result.message,
                            "attempt": result.attempt}) + "\n")


def compare_rows(expected: Iterable[str], got: Iterable[str], what: str) -> Outcome:
    """Compare two collections of row strings (order ignored) with a row-level diff.

    >>> compare_rows(["TCP IN", "ICMP IN related"], ["TCP IN"], "rows on node-b").passed
    False
    """
    exp, have = sorted(set(map(str, expected))), sorted(set(map(str, got)))
    diff = [("=", e, e) for e in exp if e in have]
    diff += [("-", e, "(missing)") for e in exp if e not in have]
    diff += [("+", "(not expected)", g) for g in have if g not in exp]
    if exp == have:
        return Outcome(True, f"{what}: all {len(exp)} match.", tuple(diff))
    missing, extra = sum(1 for d in diff if d[0] == "-"), sum(1 for d in diff if d[0] == "+")
    return Outcome(False, f"{what}: {missing} missing, {extra} not expected.", tuple(diff))
