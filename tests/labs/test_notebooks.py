"""The learner notebooks of labs/ as committed: the lab layout, a None placeholder in every answer cell, check
cells that work before the setup cell, every exercise's evidence cells and section titles, the answer key and
no outputs. (Running them is tests/labs/test_mutations.py's job, grading them test_grade.py's.)"""
from __future__ import annotations

import ast
import re

import nbformat
import pytest

from labkit.grading.checks import exercises_for

try:
    from .mutate import load_key
    from .notebooks import NOTEBOOKS, answer_cells, load
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from mutate import load_key
    from notebooks import NOTEBOOKS, answer_cells, load

LAB_IDS = sorted(NOTEBOOKS)
#: The setup cell: start() with the lab's datapath options, if any, as keywords (labs 01 and 02 count
#: packets with ct_accounting=True, lab 05 runs on cilium="1.20").
SETUP = re.compile(r"from labkit\.nb import \*\nlab = start\((\w+=[^,()]+(, \w+=[^,()]+)*)?\)")


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("labkit", {})


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


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_exercise_cells(lab_id):
    """Every exercise has its question, an answer cell holding None, a check cell that imports check itself
    (so that it answers before the setup cell too), evidence cells, and section titles that exist."""
    nb = load(lab_id)
    exercises = exercises_for(lab_id)
    ids = [e.id for e in exercises]
    cells = answer_cells(nb)
    assert list(cells) == ids
    assert sum(not e.break_it for e in exercises) >= 3 and sum(e.break_it for e in exercises) >= 1
    headings = {line[3:].strip() for c in nb.cells if c.cell_type == "markdown"
                for line in c.source.splitlines() if line.startswith("## ")}
    evidence = {ex for c in nb.cells for ex in (_meta(c).get("evidence") or [])}
    for e in exercises:
        cell = cells[e.id]
        var = "answer_" + e.id.replace(".", "_")
        assert "answer" in cell.metadata.get("tags", [])
        [stmt] = ast.parse(cell.source).body
        assert isinstance(stmt, ast.Assign) and [t.id for t in stmt.targets] == [var]
        assert isinstance(stmt.value, ast.Constant) and stmt.value.value is None, f"{e.id}: {cell.source!r}"
        i = nb.cells.index(cell)
        question = next(c for c in reversed(nb.cells[:i]) if c.cell_type == "markdown")
        assert f"Exercise {e.id}" in question.source, f"{e.id}: the markdown before the answer cell is not its question"
        # the check follows the answer (lab 07's prediction has the cell that sends the datagram in between)
        check = next(c for c in nb.cells[i + 1:] if _meta(c).get("check") == e.id)
        assert check.source == f'from labkit.nb import check\ncheck("{e.id}", {var})'
        assert nb.cells.index(check) <= i + 2, f"{e.id}: the check cell is not right after the answer cell"
        assert e.id in evidence, f"{e.id}: no cell records its evidence (metadata.labkit.evidence)"
        assert e.cells and set(e.cells) <= headings, f"{e.id}: cells {e.cells} are not section titles of the notebook"
        assert e.grade.__doc__, f"{e.id}: the grader says in its docstring what it grades"
        if e.break_it:
            assert any(_meta(c).get("fault") == e.id for c in nb.cells), f"{e.id}: no fault cell"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    on = re.findall(r'lab\.fault\("([a-z-]+)"\)', text)
    off = re.findall(r'lab\.fault\("([a-z-]+)", on=False\)', text)
    assert on and on == off, f"break-it faults switched on {on} and off {off}"


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_answer_key(lab_id):
    """The lab's key (instructor/answers) assigns each answer variable, reference and wrong ones alike."""
    key = load_key(lab_id)
    assert sorted(key) == [e.id for e in exercises_for(lab_id)]
    for ex, entry in key.items():
        var = "answer_" + ex.replace(".", "_")
        for src in [entry["answer"]] + [w["answer"] for w in entry["wrong"]]:
            assigns = [s for s in ast.parse(src).body if isinstance(s, ast.Assign)]
            assert assigns and [t.id for t in assigns[-1].targets] == [var], f"{ex}: {src!r}"
        assert entry["answer"] not in [w["answer"] for w in entry["wrong"]]
        assert all(w.get("misconception") for w in entry["wrong"]), f"{ex}: a wrong answer without its misconception"
