"""Lab names for tests, with an optional tag so that two test runs on one machine never share a lab.

``LABKIT_TEST_TAG=-x`` makes every test lab ``<name>-x`` (lab names take up to 24 characters);
unset, names are as written. Under pytest-xdist each worker adds its number (``-w0``, ``-w1``): two workers
never share a lab either.

    >>> tagged("dptest") == "dptest" + TAG
    True
"""
from __future__ import annotations

import os

__all__ = ["TAG", "tagged"]

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest-xdist
TAG = os.environ.get("LABKIT_TEST_TAG", "") + (f"-w{_WORKER[2:]}" if _WORKER.startswith("gw") else "")


def tagged(name: str) -> str:
    """``name`` with this run's tag."""
    return name + TAG
