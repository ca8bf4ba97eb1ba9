"""Graded exercises whose checks grade what the learner's own cells showed.

In a notebook::

    answer_02_3 = ["RxClosing", "TxClosing", "SeenNonSyn"]    # the learner's answer
    check("02.3", answer_02_3)                                # pass/fail, a message, a hint

An exercise is a function registered with :func:`exercise`; it gets the learner's answer and the
:class:`~labkit.observe.evidence.Evidence` of the notebook's lab — the steps, snapshots, clock moves and GC runs
its cells recorded when they ran — and returns an :class:`Outcome`. Graders never read the live maps:
a learner who answers after Run All, after a pause, or after later cells moved the lab on is graded on
what their cells showed. When the cells a question is about never ran, the check says which cell to
run (by its title) and that costs no try.

Wrong answers climb a hint ladder: the first try says where to look, the second narrows it, only the
third (or ``check(..., reveal=True)``) shows the expected value; no message shows it before. Only a readable
answer that has not been given before costs a try: a malformed one (:meth:`Outcome.unreadable`: the wrong type,
words the grader cannot place, or a grader that could not read it at all) and a wrong answer given again, identical,
are graded and answered but not counted. :func:`check` never shows a traceback first: whatever goes wrong becomes a
failed result with a message.

Each result is displayed with a machine-readable part (MIME type :data:`CHECK_MIME`: exercise, passed,
try number, the answer) that a saved notebook keeps, so ``labkit grade`` can report the learner's own
tries; when ``LABKIT_GRADE_LOG`` names a file, every result is also appended to it as a JSON line.
Exercises live in :mod:`labkit.grading.exercises`, one module per lab; reference answers live apart, in the
instructor's tree.
"""
from __future__ import annotations

import functools
import hashlib
import html
import importlib
import inspect
import json
import os
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from labkit.grading import exercises
from labkit.observe.evidence import Evidence

__all__ = ["Outcome", "CheckResult", "Exercise", "exercise", "check", "exercises_for", "registry",
           "compare_rows", "reset_attempts", "set_attempts", "CHECK_MIME", "attempts", "NO_ANSWER", "unanswered",
           "record_result", "remember_wrong", "answer_key", "NOT_A_TRY"]

#: The MIME type of a check result's machine-readable part (kept in a saved notebook's outputs).
CHECK_MIME = "application/vnd.labkit.check+json"


@dataclass(frozen=True)
class Outcome:
    """What an exercise's grader decided.

    ``message`` must not give the expected value away: it says what the learner's cells showed and what
    is wrong with the answer. ``reveal`` says the expected value; it is shown from the third try on (or
    with ``reveal=True``), as is ``diff``. ``missing`` names the cell (by its title) whose evidence the
    grader needed and did not find: such a result is not a try. ``malformed``: the answer could not be read as
    an answer to this question (wrong type, unparsable, several possibilities where one is asked for): not a try
    either.
    """

    passed: bool
    message: str
    diff: tuple[tuple[str, str, str], ...] = ()  #: (mark, expected, got) rows; mark is '=', '-' or '+'
    reveal: str | None = None
    missing: str | None = None
    malformed: bool = False

    @classmethod
    def unreadable(cls, message: str) -> "Outcome":
        """The answer is not one this question can grade (say what was expected): it costs no try.

        >>> Outcome.unreadable("expected a whole number of seconds, got 'ten'.").malformed
        True
        """
        return cls(False, message, malformed=True)

    @classmethod
    def needs(cls, cell: str, what: str = "") -> "Outcome":
        """The evidence is not there: run the cell titled ``cell`` (``what`` says what it records)."""
        more = f" ({what})" if what else ""
        return cls(False, f"nothing to grade yet: run the cell under '{cell}'{more}, then this check again.",
                   missing=cell)


#: What a check says while the answer cell still holds its placeholder.
NO_ANSWER = "no answer yet: replace None in the answer cell with your answer, run it, then run this check again."


def unanswered(answer: Any) -> Outcome | None:
    """A failed Outcome while the answer is still a placeholder (``...``, an empty string), else None.

    >>> unanswered("  ").missing, unanswered(0)
    ('the answer cell', None)
    """
    if answer is None or answer is Ellipsis or (isinstance(answer, str) and not answer.strip()):
        return Outcome(False, NO_ANSWER, missing="the answer cell")
    return None


@dataclass(frozen=True)
class Exercise:
    """One graded question."""

    id: str  #: "02.3": lab 02, exercise 3
    title: str
    grade: Callable[[Any, Any], Outcome] = field(repr=False)
    hints: tuple[str, ...] = ()  #: where to look, narrower, the answer
    break_it: bool = False  #: a diagnose-the-fault exercise
    fault: str | None = None  #: the datapath fault that breaks what this exercise is about (mutation tests)
    cells: tuple[str, ...] = ()  #: titles of the cells whose evidence the grader reads

    @property
    def lab(self) -> str:
        return self.id.split(".")[0]


_REGISTRY: dict[str, Exercise] = {}
#: (lab, exercise) -> tries spent; labkitd keeps them per lab, across a notebook's kernel restarts
_ATTEMPTS: dict[tuple[str, str], int] = {}
#: (lab, exercise) -> {answer_key(wrong answer): the try it was given at}: the same wrong answer again is free
_WRONG: dict[tuple[str, str], dict[str, int]] = {}
#: What a result that was not counted says after its message.
NOT_A_TRY = "(not counted as a try)"


def exercise(id: str, title: str, hints: Iterable[str] = (), break_it: bool = False, fault: str | None = None,
             cells: Iterable[str] = ()):
    """Register ``fn(answer, ev) -> Outcome`` as exercise ``id``.

    ``fault`` names the datapath fault (:class:`labkit.maps.config.Fault`) that, switched on while the
    exercise's cells run, must make the right answer fail; ``cells`` the titles of those cells. ``fn`` sees
    only real answers: a placeholder (:func:`unanswered`) is answered before it is called.
    """

    def register(fn: Callable[[Any, Any], Outcome]) -> Callable[[Any, Any], Outcome]:
        if id in _REGISTRY and getattr(_REGISTRY[id].grade, "__wrapped__", None) is not fn:
            raise ValueError(f"exercise '{id}' is registered twice")

        @functools.wraps(fn)
        def grade(answer: Any, ev: Any) -> Outcome:
            return unanswered(answer) or fn(answer, ev)

        _REGISTRY[id] = Exercise(id, title, grade, tuple(hints), break_it, fault, tuple(cells))
        return grade

    return register


def registry() -> dict[str, Exercise]:
    """Every exercise, loading :mod:`labkit.grading.exercises` on first use."""
    for mod in pkgutil.iter_modules(exercises.__path__):
        importlib.import_module(f"{exercises.__name__}.{mod.name}")
    return dict(_REGISTRY)


def exercises_for(lab_id: str) -> list[Exercise]:
    """The exercises of one lab, in order."""
    return sorted((e for e in registry().values() if e.lab == lab_id), key=lambda e: [int(x) for x in e.id.split(".")])


def reset_attempts(exercise_id: str | None = None, lab: str | None = None) -> None:
    """Forget tries (all, or one exercise's; of every lab, or of ``lab``), restarting the hint ladder."""
    for table in (_ATTEMPTS, _WRONG):
        for key in list(table):
            if (exercise_id is None or key[1] == exercise_id) and (lab is None or key[0] == lab):
                del table[key]


def attempts(exercise_id: str, lab: str = "") -> int:
    """Tries spent on an exercise (in lab ``lab``)."""
    return _ATTEMPTS.get((lab, exercise_id), 0)


def set_attempts(exercise_id: str, n: int, lab: str = "") -> None:
    """Set the tries spent (labkitd taking back a lab's kept results)."""
    _ATTEMPTS[(lab, exercise_id)] = n


def remember_wrong(exercise_id: str, key: str, attempt: int, lab: str = "") -> None:
    """Note that the wrong answer whose :func:`answer_key` is ``key`` was try ``attempt`` (labkitd taking back a
    lab's kept results): giving it again costs no try."""
    _WRONG.setdefault((lab, exercise_id), {}).setdefault(key, attempt)


def _plain_form(answer: Any) -> Any:
    if isinstance(answer, (set, frozenset)):
        return ["<set>", *sorted((_plain_form(a) for a in answer), key=repr)]
    if isinstance(answer, (list, tuple)):
        return [_plain_form(a) for a in answer]
    if isinstance(answer, dict):
        return sorted(([_plain_form(k), _plain_form(v)] for k, v in answer.items()), key=repr)
    if isinstance(answer, str):
        return " ".join(answer.split())
    return [type(answer).__name__, repr(answer)]


def answer_key(answer: Any) -> str:
    """What makes two answers the same answer: equal values, a set or a dict in any order, a string's spacing
    forgiven (the same cell run twice gives the same key).

    >>> answer_key({"b", "a"}) == answer_key({"a", "b"}), answer_key(" 10 s") == answer_key("10  s")
    (True, True)
    >>> answer_key(10) == answer_key("10"), answer_key(1) == answer_key(True)
    (False, False)
    """
    text = json.dumps(_plain_form(answer), separators=(",", ":"))
    return text if len(text) <= 256 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class CheckResult:
    """A graded answer: renders as a banner, message, hint and (once revealed) the expected value."""

    exercise: str
    title: str
    passed: bool
    message: str
    hint: str | None
    diff: tuple[tuple[str, str, str], ...]
    attempt: int  #: tries so far (a missing-evidence result or a placeholder answer is not one)
    missing: str | None = None  #: the cell to run first, when the evidence was not there
    reveal: str | None = None  #: the expected value, from the third try or with reveal=True
    answer: str = ""  #: repr of the answer checked
    charged: bool = False  #: this result was a try (a new, readable answer, graded on evidence that was there)
    key: str = ""  #: answer_key() of the answer, for a wrong answer that counted: the same one again is free

    def __bool__(self) -> bool:
        return self.passed

    def to_json(self, full: bool = False) -> dict:
        """What a saved notebook and the grade log keep of the result; ``full``: everything, for
        :meth:`from_json` (what labkitd answers a check with)."""
        data = {"exercise": self.exercise, "passed": self.passed, "attempt": self.attempt, "missing": self.missing,
                "answer": self.answer, "message": self.message}
        if full:
            data.update(title=self.title, hint=self.hint, diff=[list(d) for d in self.diff], reveal=self.reveal,
                        charged=self.charged, key=self.key)
        return data

    @classmethod
    def from_json(cls, data: dict) -> "CheckResult":
        """The result :meth:`to_json` (``full``) described."""
        return cls(str(data["exercise"]), str(data.get("title", "")), bool(data["passed"]), str(data["message"]),
                   data.get("hint"), tuple(tuple(d) for d in data.get("diff") or ()), int(data.get("attempt") or 0),
                   data.get("missing"), data.get("reveal"), str(data.get("answer", "")),
                   bool(data.get("charged", False)), str(data.get("key") or ""))

    def __str__(self) -> str:
        out = [f"{'PASS' if self.passed else 'FAIL'} {self.exercise} {self.title}: {self.message}"]
        if self.hint:
            out.append(f"hint: {self.hint}")
        if self.reveal:
            out.append(f"expected: {self.reveal}")
        for mark, expected, got in self.diff:
            out.append(f"  {mark} expected: {expected}   got: {got}")
        return "\n".join(out)

    __repr__ = __str__

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/plain": str(self), "text/html": self._html(), CHECK_MIME: self.to_json()}

    def _html(self) -> str:
        if self.passed:
            colour, word = "#1a7f37", "✔ correct"
        elif self.missing:
            colour, word = "#9a6700", "… nothing to grade yet"
        else:
            colour, word = "#cf222e", "✘ not yet"
        parts = [
            f"<div style='border-left:6px solid {colour};padding:4px 10px;margin:4px 0'>"
            f"<b style='color:{colour}'>{word}</b> — <b>{html.escape(self.exercise)}</b> {html.escape(self.title)}"
            f"<div>{html.escape(self.message)}</div>"
        ]
        if self.hint:
            parts.append(f"<div style='color:#555'><b>Hint (try {self.attempt}):</b> {html.escape(self.hint)}</div>")
        if self.reveal:
            parts.append(f"<div><b>Expected:</b> {html.escape(self.reveal)}</div>")
        if self.diff:
            rows = "".join(
                f"<tr style='background:{ {'=': '#fff', '-': '#f7d4d4', '+': '#d4f7d4'}[m] }'><td>{m}</td>"
                f"<td><code>{html.escape(e)}</code></td><td><code>{html.escape(g)}</code></td></tr>"
                for m, e, g in self.diff
            )
            parts.append(f"<table style='font-size:11px'><tr><th></th><th>expected</th><th>yours</th></tr>{rows}</table>")
        parts.append("</div>")
        return "".join(parts)


#: From this try on a wrong answer shows the expected value.
REVEAL_AT = 3


def check(exercise_id: str, answer: Any, lab=None, reveal: bool = False) -> CheckResult:
    """Grade ``answer`` to exercise ``exercise_id`` on what lab ``lab``'s cells recorded (labkitd calls this with the
    lab the answer is about; without one the check names the setup cell).

    ``reveal=True`` shows the expected value at once (it still counts as a try). A malformed answer
    (:meth:`Outcome.unreadable`, or one the grader could not read at all) and a wrong answer identical to an earlier
    wrong one are answered but cost no try: their result keeps the count as it was."""
    ex = registry().get(exercise_id)
    where = lab.name if lab is not None else ""
    if ex is None:
        known = ", ".join(sorted(registry()))
        return record_result(CheckResult(exercise_id, "", False, f"no exercise '{exercise_id}' (exercises: {known})",
                                         None, (), 0))
    if answer is None:  # the placeholder: not a try, no hint spent
        return record_result(CheckResult(ex.id, ex.title, False, "no answer yet: replace None with your answer, "
                                         "then run this cell", None, (), attempts(ex.id, where)))
    try:
        outcome = _grade(ex, answer, lab)
    except Exception as exc:  # never a traceback first: say what went wrong (the answer could not be read: no try)
        outcome = Outcome.unreadable(f"could not check this answer: {type(exc).__name__}: {exc}")
    if outcome.missing:
        return record_result(CheckResult(ex.id, ex.title, False, outcome.message, None, (), attempts(ex.id, where),
                                         missing=outcome.missing, answer=_short(answer)))
    if outcome.malformed and not outcome.passed:
        return record_result(CheckResult(ex.id, ex.title, False, f"{outcome.message} {NOT_A_TRY}", None, (),
                                         attempts(ex.id, where), answer=_short(answer)))
    key = answer_key(answer)
    given = _WRONG.get((where, ex.id), {}).get(key)
    message, charged = outcome.message, True
    if not outcome.passed and given is not None:  # the same wrong answer again: answered, not counted
        attempt, charged = attempts(ex.id, where), False
        message = f"{message} You gave this answer at try {given} {NOT_A_TRY}."
    else:
        attempt = _ATTEMPTS[(where, ex.id)] = attempts(ex.id, where) + 1
        if not outcome.passed:
            remember_wrong(ex.id, key, attempt, lab=where)
    show = outcome.passed or reveal or attempt >= REVEAL_AT
    hint = None
    if not outcome.passed and ex.hints and attempt:  # three hints: where to look, narrower, the answer (try 3)
        hint = ex.hints[min(attempt if not reveal else REVEAL_AT, len(ex.hints)) - 1]
    return record_result(CheckResult(ex.id, ex.title, outcome.passed, message, hint,
                                     tuple(outcome.diff) if show else (), attempt,
                                     reveal=(outcome.reveal if show and not outcome.passed else None),
                                     answer=_short(answer), charged=charged,
                                     key=key if charged and not outcome.passed else ""))


def _grade(ex: Exercise, answer: Any, lab) -> Outcome:
    if lab is None:
        return Outcome.needs("Run this cell", "lab = start(): it brings the lab up and records what follows")
    params = list(inspect.signature(ex.grade).parameters)
    attach = getattr(type(lab), "attach", None)
    second = lab if len(params) > 1 and params[1] == "lab" else Evidence(lab.name, facts=lab, facts_of=attach)
    outcome = ex.grade(answer, second)
    if not isinstance(outcome, Outcome):
        raise TypeError(f"grader returned {type(outcome).__name__}, expected Outcome")
    return outcome


def _short(answer: Any) -> str:
    text = repr(answer)
    return text if len(text) <= 200 else text[:197] + "..."


def record_result(result: CheckResult) -> CheckResult:
    """Append ``result`` to the file ``LABKIT_GRADE_LOG`` names, if any (``labkit grade``'s log); returns it."""
    path = os.environ.get("LABKIT_GRADE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(result.to_json()) + "\n")
    return result


def compare_rows(expected: Iterable[str], got: Iterable[str], what: str) -> Outcome:
    """Compare two collections of row strings (order ignored) with a row-level diff; the message counts
    what is missing and what is extra without naming the expected rows.

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
    return Outcome(False, f"{what}: {missing} missing, {extra} not expected.", tuple(diff),
                   reveal=", ".join(exp) or "(none)")
