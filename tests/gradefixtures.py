"""Fabricated hand-ins and scores for the tests of ``labkit grade`` (no lab, no kernel).

    nb = handed_in("02", answers={"02.1": "['SYN']"}, saved={"02.1": [1, 2]})   # two saved check results
    scores = class_scores()                                                    # three learners, labs 02 and 03
"""
from __future__ import annotations

import json

import nbformat

from labkit.grading.checks import CHECK_MIME, exercises_for
from labkit.grading.grade import ExerciseScore, NotebookScore

__all__ = ["handed_in", "check_output", "notebook_score", "class_scores"]


def check_output(exercise: str, attempt: int, passed: bool = False, answer: str = "", as_text: bool = False) -> dict:
    """A check cell's saved output: the display data a CheckResult leaves in a notebook."""
    rec = {"exercise": exercise, "passed": passed, "attempt": attempt, "missing": None, "answer": answer,
           "message": "PASS" if passed else "wrong"}
    return nbformat.v4.new_output("display_data", data={"text/plain": f"{exercise} try {attempt}",
                                                        CHECK_MIME: json.dumps(rec) if as_text else rec})


def handed_in(lab: str = "02", answers: dict[str, str] | None = None, saved: dict[str, list[int]] | None = None,
              learner: str | None = None, metadata: bool = True) -> nbformat.NotebookNode:
    """Lab ``lab`` as a learner hands it in: per exercise an answer cell (``answers[ex]`` as its right-hand
    side, else ``None``) and a check cell whose outputs are the saved results of ``saved[ex]`` attempts
    (one output each, in order); ``metadata=False`` leaves the cells without ``metadata.labkit``."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["labkit"] = {"lab": lab, **({"learner": learner} if learner else {})}
    nb.cells.append(nbformat.v4.new_code_cell("from labkit.nb import *\nlab = start()"))
    for ex in exercises_for(lab):
        var = "answer_" + ex.id.replace(".", "_")
        cell = nbformat.v4.new_code_cell(f"{var} = {(answers or {}).get(ex.id, 'None')}  # your answer")
        check = nbformat.v4.new_code_cell(f'from labkit.nb import check\ncheck("{ex.id}", {var})')
        if metadata:
            cell.metadata["labkit"] = {"answer": ex.id}
            check.metadata["labkit"] = {"check": ex.id}
        check.outputs = [check_output(ex.id, n) for n in (saved or {}).get(ex.id, [])]
        nb.cells += [nbformat.v4.new_markdown_cell(f"### Exercise {ex.id}"), cell, check]
    return nb


def notebook_score(learner: str, lab: str, results: dict[str, tuple[str, str | None, int]],
                   path: str | None = None) -> NotebookScore:
    """A scored notebook: ``results[ex] = (status, answer, tries)``; exercises not named are unanswered."""
    s = NotebookScore(path or f"{learner}/{lab}.ipynb", lab, learner)
    for ex in exercises_for(lab):
        status, answer, tries = results.get(ex.id, ("unanswered", None, 0))
        s.exercises.append(ExerciseScore(ex.id, ex.title, status == "passed", status,
                                         "ok" if status == "passed" else f"{status} message", tries, answer))
    return s


def class_scores() -> list[NotebookScore]:
    """alice hands in labs 02 and 03 (all passed but 02.2), bob lab 02 (02.1 wrong, like carol's, 02.2
    unanswered), carol lab 02 (02.1 wrong, 02.3's evidence missing)."""
    ids02 = [e.id for e in exercises_for("02")]
    ids03 = [e.id for e in exercises_for("03")]
    alice02 = {ex: ("passed", "1", 1) for ex in ids02}
    alice02["02.2"] = ("failed", "(60, 60)", 3)
    bob = {ex: ("passed", "1", 2) for ex in ids02}
    bob["02.1"] = ("failed", "['SYN']", 4)
    del bob["02.2"]
    carol = {ex: ("passed", "1", 1) for ex in ids02}
    carol["02.1"] = ("failed", '["SYN"]', 1)
    carol["02.3"] = ("missing evidence", "['RxClosing']", 0)
    return [notebook_score("alice", "02", alice02), notebook_score("bob", "02", bob),
            notebook_score("alice", "03", {ex: ("passed", "1", 1) for ex in ids03}),
            notebook_score("carol", "02", carol)]
