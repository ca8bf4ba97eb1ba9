"""The step display as a learner sees it in JupyterLab (headless Chromium, Run All on the lab notebooks as
committed, in the shared server and browser of tests/labs/conftest.py): lab 04's break-it step groups its SYN retries with a
hop count (and its ClusterIP step draws no loop), lab 05's hairpin step draws its loops, lab 07's DSR step shows
its trace tags in the numbered list, outside the folded raw records. Lab 02's close step (the diff in the row
grammar, the node never wrapped) is checked in test_browser.py's lab 02 run, which already runs that notebook.

Screenshots of each checked cell: test-artifacts/views-<lab>-<what>.png; server and browser logs in
test-artifacts/browser-logs/.
"""
from __future__ import annotations

import contextlib

import nbformat
import pytest

try:
    from .browser import REPO, NotebookRunError, page_problems, run_all_cells, step_view_facts
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from browser import REPO, NotebookRunError, page_problems, run_all_cells, step_view_facts

pytestmark = pytest.mark.labs

ARTIFACTS = REPO / "test-artifacts"
RUN_TIMEOUT = 240


def _cell_index(nb, first_line: str) -> int:
    found = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith(first_line)]
    assert len(found) == 1, f"expected one code cell starting {first_line!r}, found {found}"
    return found[0]


def _check_retries(facts: dict) -> list[str]:
    """Lab 04's break-it step: the reverse NAT skipped, a1 retries its SYN; each retried hop is one item ×N."""
    problems = []
    counts = [g for g in facts["groups"] if g > 1]
    if not counts:
        problems.append(f"no hop grouped with a ×N count in the numbered list: {facts['items'][:6]}")
    if not facts["badge_counts"]:
        problems.append("no ×N badge on the picture")
    return problems


def _check_hairpin(facts: dict) -> list[str]:
    """Lab 05's hairpin step: the packets that come back to lxc-a1 are drawn as loops, visible on the page."""
    if facts["loops_visible"] < 1:
        return [f"no loop drawn on the hairpin step's picture (loops in the page: {facts['loops']}, visible: "
                f"{facts['loops_visible']})"]
    return []


def _check_no_loop(facts: dict) -> list[str]:
    """A step with no hairpin (lab 04's a1 -> ClusterIP -> a backend on node-b) draws no loop."""
    return [f"{facts['loops']} loop(s) drawn on a step without a hairpin"] if facts["loops"] else []


def _check_dsr(facts: dict) -> list[str]:
    """Lab 07's DSR step: the trace tags are in the numbered list (not only in the folded raw records)."""
    problems = []
    for tag in ("[dsr-opt-added]", "[dsr-opt-stripped]"):
        if not any(tag in item for item in facts["items"]):
            problems.append(f"{tag} not in the numbered hop list: {facts['items']}")
        if tag in facts["records_visible_text"]:
            problems.append(f"{tag} shows in the raw records, which should be folded")
    return problems


#: notebook id, file, and per checked step: (a name, the first line of its cell, the check).
NOTEBOOK_CHECKS = (
    ("04", "04-clusterip.ipynb", [("clusterip", 'conn = lab.pod("a1").tcp("web", 80)', _check_no_loop),
                                  ("retries", 'lab.services.remove("web")', _check_retries)]),
    ("05", "05-hairpin.ipynb", [("hairpin", 'conn = lab.pod("a1").tcp("self", 80)', _check_hairpin)]),
    ("07", "07-external.ipynb", [("dsr", 'ext = lab.external("ext")', _check_dsr)]),
)


def test_step_views_in_jupyterlab(jupyter):
    """Labs 04, 05 and 07 run in JupyterLab; their retry, hairpin and DSR steps show what issue 16 promises."""
    problems: dict[str, list[str]] = {}
    shots = []
    for lab_id, notebook, checks in NOTEBOOK_CHECKS:
        nb = nbformat.read(jupyter.labs / notebook, as_version=4)
        try:
            run_all_cells(jupyter.driver, jupyter.url, jupyter.token, notebook, timeout=RUN_TIMEOUT)
        except NotebookRunError as exc:
            problems[lab_id] = [f"Run All: {exc}"]
            continue
        problems[lab_id] = [f"page: {p}" for p in page_problems(jupyter.driver)]
        for what, first_line, check in checks:
            index = _cell_index(nb, first_line)
            facts = step_view_facts(jupyter.driver, index)
            shot = ARTIFACTS / f"views-{lab_id}-{what}.png"
            with contextlib.suppress(Exception):
                facts["element"].screenshot(str(shot))
                shots.append(shot)
            problems[lab_id] += [f"{what} (cell {index}): {p}" for p in check(facts)]
        jupyter.stop_kernels()  # the next notebook's start() rebuilds the lab for its options
    bad = {k: v for k, v in problems.items() if v}
    assert not bad, f"step views in JupyterLab (screenshots: {[str(s) for s in shots]}): {bad}"
    assert len(shots) == sum(len(c) for _, _, c in NOTEBOOK_CHECKS), f"a screenshot per checked step: {shots}"
