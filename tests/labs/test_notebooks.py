"""The learner notebooks of labs/ on the real datapath: with the reference answers every
exercise passes, with the wrong ones every exercise fails saying what the answer key says
it should, and the committed notebooks hold only placeholders and no outputs
(``labkit grade`` is tested in test_grade.py).

Notebooks run with nbclient (kernel python3) in the lab ``nbtest`` (lab 03 also brings up
``nbtest-native``, lab 06 ``nbtest-socklb``, lab 07 ``nbtest-snat``).
Every lab is torn down when the module ends, and ``ip netns list`` must then show none of their
namespaces.
Executed notebooks are written only under pytest's tmp_path, never into the repository.
"""
from __future__ import annotations

import ast
import re

import nbformat
import pytest

from labkit.checks import exercises_for
from labkit.nb import VARIANTS

from labtag import tagged

try:
    from .notebooks import (NOTEBOOKS, answer_cells, cell_errors, cell_seconds, execute,
                            lab_netns, last_checks, load, load_answers, with_answers)
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from notebooks import (NOTEBOOKS, answer_cells, cell_errors, cell_seconds, execute,
                           lab_netns, last_checks, load, load_answers, with_answers)

pytestmark = pytest.mark.labs

LAB = tagged("nbtest")
#: Every lab these tests can bring up, torn down at the end of the module.
CREATED = tuple(f"{LAB}{suffix}" for suffix in ("", *(f"-{v}" for v in VARIANTS)))
LAB_IDS = sorted(NOTEBOOKS)
#: A notebook must run top to bottom within this many seconds (lab bring-up included).
BUDGET = 120
#: The setup cell: start() with the lab's datapath options, if any, as keywords (labs 01 and 02 count
#: packets with ct_accounting=True, lab 05 runs on cilium="1.20").
SETUP = re.compile(r"from labkit\.nb import \*\nlab = start\((\w+=[^,()]+(, \w+=[^,()]+)*)?\)")


@pytest.fixture(scope="module")
def nb_lab(datapath_ready):
    """The lab name the notebooks run in; every lab these tests made is torn down afterwards."""
    yield LAB
    problems = []
    for name in CREATED:
        try:
            from labkit.lab import Lab

            Lab.cleanup(name)
        except Exception as exc:  # report every lab, not only the first that failed
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    left = lab_netns(list(CREATED))
    assert not problems and not left, f"labs not torn down: {problems}; namespaces left: {left}"


def _run(lab_id: str, which: str, lab: str, tmp_path, override=None):
    log = tmp_path / "checks.jsonl"
    ran, seconds = execute(with_answers(load(lab_id), which, override), lab, log)
    nbformat.write(ran, tmp_path / f"executed-{lab_id}-{which}.ipynb")  # for post-mortems, outside the repo
    slow = ", ".join(f"cell {i} {s:.1f} s ({src[:40]!r})" for s, i, src in cell_seconds(ran)[:3])
    print(f"lab {lab_id}, {'reference' if which == 'answer' else which} answers: {seconds:.1f} s; slowest: {slow}")
    return ran, seconds, last_checks(log)


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_reference_answers_pass(lab_id, nb_lab, tmp_path):
    """With the reference answers the notebook runs without errors, in budget, and every exercise passes."""
    ran, seconds, last = _run(lab_id, "answer", nb_lab, tmp_path)
    assert cell_errors(ran) == []
    ids = [e.id for e in exercises_for(lab_id)]
    assert ids, f"no exercises registered for lab {lab_id}"
    not_passed = {ex: (last[ex]["message"] if ex in last else "never checked") for ex in ids
                  if not last.get(ex, {}).get("passed")}
    assert not_passed == {}
    assert seconds < BUDGET, f"lab {lab_id} took {seconds:.1f} s, over the {BUDGET} s budget"


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_wrong_answers_fail_with_their_message(lab_id, nb_lab, tmp_path):
    """With the wrong answers every exercise's last check fails with the answer key's message."""
    ran, _, last = _run(lab_id, "wrong", nb_lab, tmp_path)
    assert cell_errors(ran) == []
    answers = load_answers(lab_id)
    problems = {}
    for ex in (e.id for e in exercises_for(lab_id)):
        got = last.get(ex)
        if got is None:
            problems[ex] = "never checked"
        elif got["passed"]:
            problems[ex] = f"passed with {answers[ex]['wrong']!r}: {got['message']}"
        elif answers[ex]["wrong_message"] not in got["message"]:
            problems[ex] = f"expected {answers[ex]['wrong_message']!r} in {got['message']!r}"
    assert problems == {}


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_learner_notebook_is_clean(lab_id):
    """The committed notebook has the lab layout, a None placeholder in every answer cell and no outputs."""
    nb = load(lab_id)
    assert nb.metadata["labkit"] == {"lab": lab_id}
    assert nb.metadata["kernelspec"]["name"] == "python3"
    nbformat.validate(nb)

    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert "**What you will learn**" in first.source and re.search(r"\*\*Time\*\*: ~\d+ minutes", first.source)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    assert SETUP.fullmatch(nb.cells[code[0]].source), nb.cells[code[0]].source
    assert "Run this cell" in nb.cells[code[0] - 1].source

    for i in code:
        cell = nb.cells[i]
        assert cell.outputs == [] and cell.execution_count is None, f"cell {i} has outputs committed"

    exercises = exercises_for(lab_id)
    ids = [e.id for e in exercises]
    cells = answer_cells(nb)
    answers = load_answers(lab_id)
    assert list(cells) == ids and sorted(answers) == ids
    assert sum(not e.break_it for e in exercises) >= 3 and sum(e.break_it for e in exercises) >= 1
    for ex, cell in cells.items():
        var = "answer_" + ex.replace(".", "_")
        assert "answer" in cell.metadata.get("tags", [])
        [stmt] = ast.parse(cell.source).body
        assert isinstance(stmt, ast.Assign) and [t.id for t in stmt.targets] == [var]
        assert isinstance(stmt.value, ast.Constant) and stmt.value.value is None, f"{ex}: {cell.source!r}"
        i = nb.cells.index(cell)
        question = next(c for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
        assert f"Exercise {ex}" in question.source, f"{ex}: the markdown before the answer cell is not its question"
        assert nb.cells[i + 1].source == f'check("{ex}", {var})'
        for kind in ("answer", "wrong"):
            [ref] = ast.parse(answers[ex][kind]).body
            assert isinstance(ref, ast.Assign) and [t.id for t in ref.targets] == [var]
        assert answers[ex]["answer"] != answers[ex]["wrong"] and answers[ex]["wrong_message"]
        grader = next(e for e in exercises if e.id == ex).grade
        assert grader.__doc__ and "\n" not in grader.__doc__.strip(), f"{ex}: grader docstring is not one line"
        assert len(next(e for e in exercises if e.id == ex).hints) == 3
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    on = re.findall(r'lab\.fault\("([a-z-]+)"\)', text)
    off = re.findall(r'lab\.fault\("([a-z-]+)", on=False\)', text)
    assert on and on == off, f"break-it faults switched on {on} and off {off}"
