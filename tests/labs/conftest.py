"""Lab tier: notebooks that run on the real datapath, as root.

Tests that build labs ask for ``datapath_ready``; with CI=true a test that
cannot run (no root, no BPF) fails instead of skipping, as in tests/datapath.
"""
from __future__ import annotations

import os

import pytest

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _datapath_problem() -> str | None:
    if os.geteuid() != 0:
        return "lab notebooks need root"
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
            pytest.fail(f"CI=true and the lab notebooks cannot run: {problem}")
        pytest.skip(problem)
