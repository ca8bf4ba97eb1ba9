"""The answer key: each exercise's reference answer and the wrong answers it must fail, for instructors.

The key lives outside the folder JupyterLab serves (``labs/``), in ``instructor/answers/NN.json``
(instructor/GRADING.md gives the format)::

    {"02.1": {"answer": "answer_02_1 = ['SYN', 'ACK']",
              "wrong": [{"answer": "answer_02_1 = ['SYN']", "misconception": "…", "message": "…"}, …]}}

A key still in the old format (``labs/answers/NN.json``: one ``wrong`` source and its
``wrong_message``) is read as one wrong answer without a misconception. ``$LABKIT_ANSWERS`` names
another folder of keys (a labkit installed without its instructor tree).

    labkit answers 02            # the key of lab 02, readable
    labkit answers 02 --json

An answer is a cell's source, ``answer_02_1 = ['SYN', 'ACK']``; :func:`rhs` takes its right-hand
side and :func:`canonical` a spelling that groups equal answers (``["SYN","ACK"]`` and
``['SYN', 'ACK']`` are one answer).
"""
from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.errors import ConfigError, NotFoundError
from labkit.grading.checks import exercises_for

__all__ = ["WrongAnswer", "KeyEntry", "answers_dirs", "key_path", "load_key", "lab_id", "rhs", "canonical",
           "format_key", "key_json"]

_REPO = Path(__file__).resolve().parents[2]
#: Where keys are looked for, in order: the instructor's tree, then the old place inside labs/.
ANSWERS_DIR = _REPO / "instructor" / "answers"
OLD_ANSWERS_DIR = _REPO / "labs" / "answers"


@dataclass(frozen=True)
class WrongAnswer:
    """A wrong answer the check must fail, the misconception behind it and (part of) its message."""

    answer: str
    misconception: str = ""
    message: str = ""


@dataclass(frozen=True)
class KeyEntry:
    """One exercise's line of the key."""

    exercise: str
    answer: str  #: the answer cell's source, ``answer_02_1 = ['SYN', 'ACK']``
    wrong: tuple[WrongAnswer, ...] = ()


def lab_id(value: str) -> str:
    """``"2"``, ``"02"`` or ``"lab02"`` → ``"02"``.

    >>> lab_id("2"), lab_id("lab07")
    ('02', '07')
    """
    m = re.fullmatch(r"(?:lab)?0*(\d{1,2})", str(value).strip().lower())
    if not m:
        raise ConfigError(f"lab {value!r}: expected a lab number such as 02")
    return m.group(1).zfill(2)


def answers_dirs() -> list[Path]:
    """The folders keys are read from: ``$LABKIT_ANSWERS`` if set, else instructor/answers then labs/answers."""
    env = os.environ.get("LABKIT_ANSWERS")
    return [Path(env)] if env else [ANSWERS_DIR, OLD_ANSWERS_DIR]


def key_path(lab: str) -> Path:
    """The key file of ``lab``; NotFoundError names every place looked in."""
    tried = [d / f"{lab_id(lab)}.json" for d in answers_dirs()]
    for path in tried:
        if path.exists():
            return path
    raise NotFoundError(f"answer key of lab {lab_id(lab)} not found (looked for {', '.join(map(str, tried))})")


def load_key(lab: str) -> dict[str, KeyEntry]:
    """Exercise id → :class:`KeyEntry` for ``lab``, in exercise order, from either key format."""
    path = key_path(lab)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"answer key {path}: not JSON ({exc})") from None
    out = {}
    for ex in sorted(raw, key=_order):
        entry = raw[ex]
        wrong = entry.get("wrong", [])
        if isinstance(wrong, str):  # the old format: one wrong source, its message beside it
            wrong = [{"answer": wrong, "message": entry.get("wrong_message", "")}]
        out[ex] = KeyEntry(ex, entry["answer"], tuple(
            WrongAnswer(w["answer"], w.get("misconception", ""), w.get("message", "")) for w in wrong))
    return out


def _order(exercise: str) -> list[int]:
    return [int(x) if x.isdigit() else 0 for x in exercise.split(".")]


def rhs(source: str, var: str | None = None) -> str:
    """The right-hand side of the (last) assignment to ``var`` (any name if None) in a cell's source, as
    written; the whole source, stripped, when the cell assigns nothing readable.

    >>> rhs("answer_02_1 = ['SYN',  'ACK']  # the handshake", "answer_02_1")
    "['SYN',  'ACK']"
    >>> rhs("answer_02_1 = None  # your answer")
    'None'
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        name = re.escape(var) if var else r"[A-Za-z_]\w*"
        m = re.search(rf"^\s*{name}\s*=(?!=)(.*)$", source, re.M | re.S)
        return (m.group(1) if m else source).strip()
    value = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and (var is None or t.id == var)
                                                for t in node.targets):
            value = node.value
    if value is None:
        return source.strip()
    return (ast.get_source_segment(source, value) or "").strip()


def canonical(answer: str) -> str:
    """One spelling per answer: a Python literal as its repr, anything else with spaces collapsed.

    >>> canonical('["SYN","ACK"]') == canonical("['SYN', 'ACK']")
    True
    """
    try:
        return repr(ast.literal_eval(answer))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return " ".join(answer.split())


def key_json(lab: str) -> dict:
    """The key of ``lab`` with each exercise's title: what ``labkit answers --json`` prints."""
    titles = {e.id: e.title for e in exercises_for(lab_id(lab))}
    return {"lab": lab_id(lab), "file": str(key_path(lab)),
            "exercises": [{"exercise": e.exercise, "title": titles.get(e.exercise, ""), "answer": e.answer,
                           "wrong": [asdict(w) for w in e.wrong]} for e in load_key(lab).values()]}


def format_key(lab: str) -> str:
    """The key of ``lab``, for reading: per exercise its title, the reference answer and each wrong answer
    with its misconception and the message it fails with."""
    data = key_json(lab)
    lines = [f"Lab {data['lab']}: answer key ({data['file']})"]
    for e in data["exercises"]:
        lines += ["", f"{e['exercise']}  {e['title']}".rstrip(), f"  answer  {e['answer']}"]
        for w in e["wrong"]:
            lines.append(f"  wrong   {w['answer']}")
            if w["misconception"]:
                lines.append(f"          misconception: {w['misconception']}")
            if w["message"]:
                lines.append(f"          fails with: {w['message']}")
    return "\n".join(lines)
