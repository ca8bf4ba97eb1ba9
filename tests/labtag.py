"""Lab names for tests, with an optional tag so that two test runs on one machine never share a lab.

``LABKIT_TEST_TAG=-x`` makes every test lab ``<name>-x`` (lab names take up to 24 characters);
unset, names are as written.

    >>> tagged("dptest") == "dptest" + TAG
    True
"""
from __future__ import annotations

import os

__all__ = ["TAG", "tagged"]

TAG = os.environ.get("LABKIT_TEST_TAG", "")


def tagged(name: str) -> str:
    """``name`` with this run's tag."""
    return name + TAG
