"""Mutants of the learner notebooks, for proving that every check grades what the learner's cells did.

A notebook marks its cells in ``metadata.labkit``: ``answer``/``check`` (the exercise id), ``evidence``
(the ids whose evidence the cell records: its traffic, snapshot or clock move) and ``fault`` (the cell of
a break-it exercise that switches its fault on). The answer key (``instructor/answers/NN.json``) gives
per exercise the reference answer and at least two wrong ones, each with the message it must fail with.

Each mutant is one notebook execution carrying every mutation of one kind for the whole lab, with what
each exercise's checks must then say:

- ``paced``: reference answers, each checked after a 6-minute pause (the lab clock moved 360 s: the time
  the datapath and the GC see) -> every exercise passes; then, with every cell run (as after Run All),
  each exercise answered again at the end: each wrong answer, then the reference -> each wrong one fails
  with its message, the reference passes;
- ``no-evidence``: reference answers, every evidence cell removed -> every exercise says which cell to
  run (no try spent);
- ``fault-N``: reference answers, each exercise's fault switched on around its own cells (rounds keep
  two exercises' cells apart), and the fault cell of each break-it exercise removed -> none passes.

A cell marked ``measure`` is a measurement no exercise reads (lab 09's kube-proxy scaling, lab 08's
timed scans): it leaves nothing a later cell uses, so only ``paced`` (the notebook as a learner runs
it) runs it; the other mutants drop it, which changes no exercise's cells or evidence.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

__all__ = ["Mutant", "ANSWERS_DIR", "load_key", "mutants", "judge", "PAUSE"]

ANSWERS_DIR = Path(__file__).resolve().parents[2] / "instructor" / "answers"
PAUSE = 360  #: seconds of the pause before each check in the ``paced`` mutant


def load_key(lab: str) -> dict:
    """The answer key of ``lab``: exercise id -> {"answer": source, "wrong": [{"answer", "message"}, ...]}."""
    return json.loads((ANSWERS_DIR / f"{lab}.json").read_text())


@dataclass
class Mutant:
    """One mutated notebook and what each exercise's logged checks must say."""

    lab: str
    name: str
    nb: nbformat.NotebookNode
    #: exercise -> what its last len(list) logged results must be, in order: "pass"; "fail" (a counted try);
    #: "fail:<message>" (with that message); "missing" (the evidence was not there, no try); "nopass"
    #: (not passed, either way: a fault makes the recorded world wrong, and a check must not blame the answer)
    expect: dict[str, list[str]] = field(default_factory=dict)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("labkit", {})


def _code(source: str, **labkit) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    if labkit:
        cell.metadata["labkit"] = labkit
    return cell


def _with_answers(nb, key: dict, which: str = "answer"):
    out = copy.deepcopy(nb)
    for cell in out.cells:
        ex = _meta(cell).get("answer")
        if ex:
            cell.source = key[ex]["answer"] if which == "answer" else cell.source
    return out


def _index(nb, what: str) -> dict[str, list[int]]:
    """Exercise id -> indices of the cells marked ``what`` for it."""
    out: dict[str, list[int]] = {}
    for i, cell in enumerate(nb.cells):
        value = _meta(cell).get(what)
        for ex in ([value] if isinstance(value, str) else value or []):
            out.setdefault(ex, []).append(i)
    return out


def paced(lab: str, nb, key: dict) -> Mutant:
    """Reference answers in place, each check after a six-minute pause; then, once every cell has run (as after
    Run All), each exercise answered again at the end: every wrong answer, then the reference."""
    out = _with_answers(nb, key)
    cells = []
    for cell in out.cells:
        if _meta(cell).get("check"):
            cells.append(_code(f"lab.clock.advance({PAUSE})  # a learner reading for six minutes"))
        cells.append(cell)
    expect = {}
    for ex, entry in key.items():
        var = f"answer_{ex.replace('.', '_')}"
        tries = [w["answer"] for w in entry["wrong"]] + [entry["answer"]]
        source = ["from labkit.nb import check"]
        for src in tries:
            source += [src, f"display(check({ex!r}, {var}))"]
        cells.append(_code("\n".join(source)))
        expect[ex] = ["pass"] + [f"fail:{w['message']}" for w in entry["wrong"]] + ["pass"]
    out.cells = cells
    return Mutant(lab, "paced", out, expect)


def _without_measurements(nb):
    """``nb`` without its cells marked ``measure`` (see the module's docstring)."""
    out = copy.deepcopy(nb)
    out.cells = [c for c in out.cells if not _meta(c).get("measure")]
    return out


def no_evidence(lab: str, nb, key: dict) -> Mutant:
    out = _with_answers(_without_measurements(nb), key)
    evidence = _index(out, "evidence")
    drop = {i for idx in evidence.values() for i in idx}
    out.cells = [c for i, c in enumerate(out.cells) if i not in drop]
    return Mutant(lab, "no-evidence", out, {ex: ["missing"] for ex in key if ex in evidence})


# A mutant's fault is on in every lab of the notebook, the second labs (started later, or reset) included:
# Lab.reset re-applies the mutation's faults, and the labs already up get them at once.
_FAULT_ON = """# mutation: {ex}'s fault, in every lab of this notebook
from labkit.client import Lab as _Lab
from labkit.nb import VARIANTS as _VARIANTS
_MUTATION_FAULTS = globals().get("_MUTATION_FAULTS", set()) | {{{fault!r}}}
if not getattr(_Lab, "_mutation_reset", None):
    _Lab._mutation_reset = _Lab.reset
    def _reset(self):
        _Lab._mutation_reset(self)
        for _f in _MUTATION_FAULTS:
            self.fault(_f)
    _Lab.reset = _reset
def _notebook_labs():
    names = [lab.name] + [f"{{lab.name}}-{{v}}" for v in _VARIANTS]
    up = {{l["name"] for l in _Lab.list()}}
    return [_Lab.attach(n) for n in names if n in up]
for _l in _notebook_labs():
    _l.fault({fault!r})"""
_FAULT_OFF = """_MUTATION_FAULTS = _MUTATION_FAULTS - {{{fault!r}}}
for _l in _notebook_labs():
    _l.fault({fault!r}, on=False)"""


def faults(lab: str, nb, key: dict, exercises) -> list[Mutant]:
    """The fault mutants: rounds of exercises whose cells (first evidence cell to check cell) do not overlap."""
    base = _with_answers(_without_measurements(nb), key)
    evidence, checks, fault_cells = _index(base, "evidence"), _index(base, "check"), _index(base, "fault")
    spans = []
    for ex in exercises:
        if ex.break_it and ex.id in fault_cells:
            spans.append((ex.id, None, fault_cells[ex.id][0], fault_cells[ex.id][0]))
        elif ex.fault and ex.id in evidence and ex.id in checks:
            spans.append((ex.id, ex.fault, min(evidence[ex.id]), max(checks[ex.id])))
    rounds: list[list[tuple]] = []
    for span in sorted(spans, key=lambda s: s[2]):
        for r in rounds:
            if all(span[2] > s[3] or span[3] < s[2] for s in r):
                r.append(span)
                break
        else:
            rounds.append([span])
    mutants = []
    for n, r in enumerate(rounds, 1):
        out = copy.deepcopy(base)
        before: dict[int, list] = {}
        after: dict[int, list] = {}
        drop = set()
        for ex, fault, first, last in r:
            if fault is None:
                drop.add(first)  # the break-it exercise's own fault cell: never switched on
            else:
                before.setdefault(first, []).append(_code(_FAULT_ON.format(fault=fault, ex=ex)))
                after.setdefault(last, []).append(_code(_FAULT_OFF.format(fault=fault)))
        cells = []
        for i, cell in enumerate(out.cells):
            cells += before.get(i, [])
            if i not in drop:
                cells.append(cell)
            cells += after.get(i, [])
        out.cells = cells
        mutants.append(Mutant(lab, f"fault-{n}", out, {ex: ["nopass"] for ex, *_ in r}))
    return mutants


def mutants(lab: str, nb, exercises) -> list[Mutant]:
    """Every mutant of lab ``lab``'s notebook ``nb``."""
    key = load_key(lab)
    return [paced(lab, nb, key), no_evidence(lab, nb, key), *faults(lab, nb, key, exercises)]


def judge(mutant: Mutant, log: list[dict]) -> dict[str, str]:
    """What went wrong: exercise -> explanation, for every exercise whose logged checks do not say what
    the mutant expects (empty when the graders held)."""
    problems = {}
    for ex, want in mutant.expect.items():
        got = [r for r in log if r["exercise"] == ex][-len(want):]
        if len(got) < len(want):
            problems[ex] = f"expected {len(want)} checks, {len(got)} logged"
            continue
        for w, g in zip(want, got):
            kind, _, message = w.partition(":")
            ok = {"pass": g["passed"], "missing": not g["passed"] and bool(g.get("missing")),
                  "fail": not g["passed"] and not g.get("missing"), "nopass": not g["passed"]}[kind]
            if ok and message and message not in g["message"]:
                ok = False
            if not ok:
                problems[ex] = f"wanted {w!r}, got passed={g['passed']} missing={g.get('missing')!r} " \
                               f"answer={g.get('answer')!r}: {g['message']!r}"
                break
    return problems
