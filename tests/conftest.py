"""What every tier shares: the CI gate and the tier markers.

`make test` runs the tests on every core (pytest-xdist, ``-n auto --dist loadfile``): a file's tests stay
on one worker (its shared labs come up once), and each worker's labs carry its own name (tests/labtag.py).

A test under tests/datapath is marked ``datapath``, one under tests/bpf ``bpf`` and one under
tests/labs ``labs``, so ``pytest -m "not datapath and not bpf and not labs"`` runs what needs no root. Tests that need the
kernel datapath ask for ``datapath_ready``: without root or BPF they skip, and with
CI=true they fail instead, so a green CI run means the kernel datapath ran.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_TIERS = {"datapath": "datapath", "bpf": "bpf", "labs": "labs"}  # directory under tests/ -> marker
#: Files that take minutes (every lab's notebook runs and mutants, the browser tests, the bench's smoke run):
#: started first, so that none is left to run alone at the end.
LONGEST_FIRST = ["tests/labs/test_mutations.py", "tests/labs/test_notebooks.py", "tests/labs/test_browser.py",
                 "tests/datapath/test_bench_smoke.py", "tests/labs/test_browser_views.py",
                 "tests/labs/test_grade_notebooks.py"]


def _file(item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    """Mark each test with its tier (the directory it lives in under tests/); put the files that take minutes
    first, for ``pytest -n N --dist loadfile`` (make test) hands out whole files in this order."""
    here = Path(__file__).parent
    items.sort(key=lambda item: LONGEST_FIRST.index(_file(item)) if _file(item) in LONGEST_FIRST else len(LONGEST_FIRST))
    for item in items:
        try:
            tier = Path(item.fspath).relative_to(here).parts[0]
        except ValueError:
            continue
        if tier in _TIERS:
            item.add_marker(getattr(pytest.mark, _TIERS[tier]))


def _datapath_problem() -> str | None:
    if os.geteuid() != 0:
        return "datapath and lab tests need root"
    try:
        from labkit.datapath.doctor import require_datapath
        from labkit.errors import LabkitError
    except ImportError as exc:
        return f"labkit cannot be imported: {exc}"
    try:
        require_datapath()
    except LabkitError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def datapath_ready():
    """Root and a working BPF datapath, or skip (fail when CI=true)."""
    problem = _datapath_problem()
    if problem:
        if CI:
            pytest.fail(f"CI=true and the datapath cannot run: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="session")
def door_ready(datapath_ready):
    """Root, the datapath, and a labkitd answering on its socket (``make test`` starts one), or skip (fail when
    CI=true): what the tests that reach labs through the door need."""
    from doorcheck import require_door

    require_door()
