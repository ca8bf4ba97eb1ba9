"""What a notebook imports: start the lab, draw it, take steps, check answers.

    from labkit.nb import *
    lab = start()                 # the lab named by $LABKIT_LAB, else "demo"

``start`` is ``Lab.up`` with the name taken from the environment, so the
same notebook runs as a learner's ``demo`` lab and under tests or
``labkit grade`` in a lab of their own.
"""
from __future__ import annotations

import os

from .checks import check
from .errors import LabStateError

__all__ = ["start", "check", "current_lab", "lab_name", "show"]

_CURRENT = None


def lab_name() -> str:
    """``$LABKIT_LAB`` or ``demo``."""
    return os.environ.get("LABKIT_LAB", "demo")


def start(routing: str | None = None, **options):
    """Bring up (or attach to) this notebook's lab, reset it, and make it the current one."""
    global _CURRENT
    from .lab import Lab

    _CURRENT = Lab.up(lab_name(), routing=routing, **options)
    _CURRENT.reset()  # every notebook starts from empty CT maps and the clock at offset 0
    return _CURRENT


def current_lab():
    """The lab :func:`start` returned, or the running lab of this name."""
    if _CURRENT is not None:
        return _CURRENT
    from .lab import Lab

    try:
        return Lab.attach(lab_name())
    except Exception as exc:
        raise LabStateError(f"no lab yet: run the setup cell (lab = start()) first ({exc})") from None


def show(obj) -> None:
    """Display a step, table or figure (IPython's display, imported lazily)."""
    from IPython.display import display

    display(obj)
