"""Whether labkitd answers, for the tests that reach labs through it (notebooks, the CLI, the door's own).

``make test`` starts labkitd when none runs (and stops it after); a developer runs ``sudo labkit daemon start``.
Without one such a test skips — and under CI=true fails, as every test that would skip must there.
"""
from __future__ import annotations

import os

import pytest

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

__all__ = ["require_door", "door_problem"]


def door_problem() -> str | None:
    """Why no labkitd can serve this run, or None."""
    from labkit.door import api
    from labkit.door.daemon import status

    if status() is None:
        return (f"no labkitd answers on {api.socket_path()}: `make test` starts one; by hand, "
                f"`sudo labkit daemon start`")
    return None


def require_door() -> None:
    """Skip (fail under CI=true) unless labkitd answers."""
    problem = door_problem()
    if problem:
        if CI:
            pytest.fail(f"CI=true and labkitd cannot serve the tests: {problem}")
        pytest.skip(problem)
