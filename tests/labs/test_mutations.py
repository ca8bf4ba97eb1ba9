"""Mutation tests of every lab's checks (tests/labs/mutate.py says which mutants and what each must make the
checks say): a right answer passes however late or slowly it comes, a wrong one fails with its own message,
a check without its cells' evidence says which cell to run, and no check passes on a lab whose datapath did
not do the thing. Mutants run two at a time, each in a lab of its own that is torn down after it."""
from __future__ import annotations

import ast
import os
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
import pytest

from labkit.grading.checks import exercises_for
from labkit.nb import VARIANTS

from labtag import tagged

try:
    from .mutate import judge, load_key, mutants
    from .notebooks import NOTEBOOKS, cell_errors, execute, lab_netns, load, read_log
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from mutate import judge, load_key, mutants
    from notebooks import NOTEBOOKS, cell_errors, execute, lab_netns, load, read_log

# One module fixture runs every lab's mutants, two at a time: longer than pytest's per-test limit.
pytestmark = [pytest.mark.labs, pytest.mark.timeout(3600)]
JOBS = int(os.environ.get("LABKIT_TEST_JOBS", "2"))
#: LABKIT_MUTATE_LABS=02,07 limits the run to some labs (while writing their exercises); all by default.
LAB_IDS = sorted(os.environ.get("LABKIT_MUTATE_LABS", "").replace(",", " ").split() or NOTEBOOKS)


def _run(args) -> tuple[list[dict], list[str], float]:
    """One mutant in a lab of its own (then taken down with its variants): (logged checks, cell errors, seconds)."""
    path, lab, log = args
    from labkit.lab import Lab

    try:
        ran, seconds = execute(nbformat.read(path, as_version=4), lab, Path(log))
        return read_log(Path(log)), cell_errors(ran), seconds
    finally:
        for name in (lab, *(f"{lab}-{v}" for v in VARIANTS)):
            Lab.cleanup(name)


def _weight(m) -> tuple[int, int]:
    """How long a mutant's run may take, to start the longest first: the labs its notebook starts, then its code
    cells: a notebook that starts a second lab and has 50 code cells weighs (2, 50). The same mutants run, only
    in another order."""
    code = [c.source for c in m.nb.cells if c.cell_type == "code"]
    return sum(len(re.findall(r"\bstart\(", src)) for src in code), len(code)


@pytest.fixture(scope="module")
def results(door_ready, tmp_path_factory):
    """Every lab's mutants, executed: (lab, mutant name) -> (mutant, logged checks, cell errors, seconds)."""
    tmp = tmp_path_factory.mktemp("mutants")
    jobs, made = [], {}
    for lab_id in LAB_IDS:
        for k, m in enumerate(mutants(lab_id, load(lab_id), exercises_for(lab_id))):
            path = tmp / f"{lab_id}-{m.name}.ipynb"
            nbformat.write(m.nb, path)
            jobs.append((str(path), tagged(f"mu{lab_id}x{k}"), str(tmp / f"{lab_id}-{m.name}.jsonl")))
            made[(lab_id, m.name)] = m
    weights = [_weight(m) for m in made.values()]
    order = sorted(range(len(jobs)), key=lambda i: weights[i], reverse=True)
    with ProcessPoolExecutor(max_workers=JOBS) as pool:  # the longest first: no long one is left to run alone
        ran = dict(zip(order, pool.map(_run, [jobs[i] for i in order])))
    out = {key: (m, *ran[i]) for i, (key, m) in enumerate(made.items())}
    for (lab_id, name), (_, _, _, seconds) in sorted(out.items()):
        print(f"lab {lab_id} mutant {name}: {seconds:.1f} s")
    left = lab_netns([j[1] for j in jobs])
    assert not left, f"mutant labs left behind: {left}"
    return out


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_every_exercise_has_a_key_with_two_wrong_answers(lab_id):
    """The answer key holds each exercise's reference answer and at least two wrong ones with their messages,
    and each exercise has three hints and a fault (or is a break-it exercise with a fault cell)."""
    key = load_key(lab_id)
    exercises = exercises_for(lab_id)
    assert sorted(key) == sorted(e.id for e in exercises)
    for e in exercises:
        assert len(key[e.id]["wrong"]) >= 2 and all(w["message"] for w in key[e.id]["wrong"]), e.id
        assert len(e.hints) == 3, f"{e.id}: three hints (where to look, narrower, the answer)"
        assert e.fault or e.break_it, f"{e.id}: no fault to prove the check reads the datapath"


def _assigned(source: str) -> set[str]:
    """Names a cell's code binds at top level (assignments, imports, defs, for targets)."""
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%")))
    names = set()
    for node in tree.body:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                names.add(sub.id)
            elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return names


def _used(source: str) -> set[str]:
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%")))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_measurement_cells_leave_nothing_the_exercises_use(lab_id):
    """A cell marked ``measure`` (run only by the paced mutant) is no exercise's evidence, answer, check or fault
    cell, and no later cell reads a name it binds unless an earlier cell bound it too."""
    nb = load(lab_id)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    for k, cell in enumerate(cells):
        meta = cell.get("metadata", {}).get("labkit", {})
        if not meta.get("measure"):
            continue
        assert set(meta) == {"measure"}, f"lab {lab_id} cell {k}: a measurement cell carries {sorted(meta)}"
        bound_before = set().union(*(_assigned(c.source) for c in cells[:k] if not
                                     c.get("metadata", {}).get("labkit", {}).get("measure")))
        own = _assigned(cell.source) - bound_before
        for later in cells[k + 1:]:
            if later.get("metadata", {}).get("labkit", {}).get("measure"):
                continue
            leaked = own & _used(later.source)
            assert not leaked, f"lab {lab_id}: a cell after measurement cell {k} reads {sorted(leaked)}"


@pytest.mark.parametrize("lab_id", LAB_IDS)
def test_checks_hold_under_every_mutant(lab_id, results):
    """Every mutant of the lab makes each exercise's checks say what the mutant expects."""
    problems = {}
    for (lab, name), (mutant, log, errors, _) in results.items():
        if lab != lab_id:
            continue
        for ex, why in judge(mutant, log).items():
            problems[f"{name} {ex}"] = why
        if name == "paced" and errors:
            problems[f"{name} cells"] = errors
    assert problems == {}
