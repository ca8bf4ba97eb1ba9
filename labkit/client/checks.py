"""``check("02.3", answer)`` in a notebook: the answer goes to labkitd, which grades it on the evidence it recorded
itself when the lab's cells ran (:func:`labkit.grading.checks.check`) and keeps the result; what comes back
shows as a banner, message, hint and, once revealed, the expected value.

An answer travels as plain data (strings, numbers, lists, tuples, sets, mappings): anything else is refused
here, before it is sent, with a line saying so. When ``LABKIT_GRADE_LOG`` names a file (``labkit grade``), each
result is also appended to it as a JSON line.
"""
from __future__ import annotations

from typing import Any

from labkit.client.door import default_door
from labkit.errors import LabkitError
from labkit.grading.checks import CheckResult, record_result

__all__ = ["check"]


def _plain(answer: Any, depth: int = 0) -> bool:
    if depth > 16:
        return False
    if answer is None or isinstance(answer, (bool, int, float, str, bytes)):
        return True
    if isinstance(answer, (list, tuple, set, frozenset)):
        return all(_plain(a, depth + 1) for a in answer)
    if isinstance(answer, dict):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in answer.items())
    return False


def check(exercise_id: str, answer: Any, lab=None, reveal: bool = False) -> CheckResult:
    """Grade ``answer`` to exercise ``exercise_id`` on what this notebook's lab recorded (labkitd grades it).

    ``reveal=True`` shows the expected value at once (it still counts as a try, and labkitd keeps that it was
    revealed)."""
    from labkit.client.session import _CURRENT, lab_name

    name = (lab.name if lab is not None else _CURRENT.name if _CURRENT is not None else lab_name())
    if not _plain(answer):
        result = CheckResult(str(exercise_id), "", False, f"an answer is plain data (text, numbers, lists, tuples, "
                             f"mappings), got {type(answer).__name__}: write what the cells showed", None, (), 0,
                             missing="the answer cell", answer=repr(answer)[:200])
    else:
        door = lab.door if lab is not None else default_door()
        try:
            data = door.call("check", name, exercise=str(exercise_id), answer=answer, reveal=bool(reveal))
            result = CheckResult.from_json(data)
        except LabkitError as exc:
            result = CheckResult(str(exercise_id), "", False, f"could not check this answer: {exc}", None, (), 0,
                                 answer=repr(answer)[:200])
    return record_result(result)
