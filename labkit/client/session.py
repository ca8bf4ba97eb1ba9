"""The lab a notebook works on: its name, its second labs, the current one.

:func:`labkit.nb.start` sets the current lab; :func:`labkit.client.checks.check` sends its answers about it.

    >>> lab_name() if "LABKIT_LAB" not in os.environ else "demo"
    'demo'
"""
from __future__ import annotations

import os

from labkit.client.lab import Lab
from labkit.errors import LabStateError, NotFoundError
from labkit.lab.inventory import VARIANTS

__all__ = ["VARIANTS", "lab_name", "current_lab", "set_current", "down_variants"]


_CURRENT: Lab | None = None


def lab_name() -> str:
    """``$LABKIT_LAB`` or ``demo``."""
    return os.environ.get("LABKIT_LAB", "demo")


def set_current(lab: Lab) -> Lab:
    """Make ``lab`` the one :func:`current_lab` returns; returns it."""
    global _CURRENT
    _CURRENT = lab
    return lab


def current_lab() -> Lab:
    """The lab :func:`labkit.nb.start` returned, or your running lab of this name."""
    if _CURRENT is not None:
        return _CURRENT
    try:
        return Lab.attach(lab_name())
    except Exception as exc:
        raise LabStateError(f"no lab yet: run the setup cell (lab = start()) first ({exc})") from None


def down_variants(name: str) -> None:
    """Take down your second labs of ``name`` (``<name>-<variant>``) that are still up."""
    mine = {lab["name"] for lab in Lab.list()}
    for v in VARIANTS:
        if f"{name}-{v}" in mine:
            try:
                Lab.cleanup(f"{name}-{v}")
            except NotFoundError:
                pass
