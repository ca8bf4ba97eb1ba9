"""What a notebook imports: start the lab, draw it, take steps, check answers.

    from labkit.nb import *
    lab = start()                 # the lab named by $LABKIT_LAB, else "demo"

``start`` is ``Lab.up`` with the name taken from the environment, so the
same notebook runs as a learner's ``demo`` lab and under tests or
``labkit grade`` in a lab of their own.
"""
from __future__ import annotations

import os
import warnings

from .checks import check
from .errors import LabStateError

__all__ = ["start", "check", "current_lab", "lab_name", "show"]

_CURRENT = None
# A venv that also sees the distribution's matplotlib warns that Axes3D cannot load; labkit draws none.
warnings.filterwarnings("ignore", message="Unable to import Axes3D")


def lab_name() -> str:
    """``$LABKIT_LAB`` or ``demo``."""
    return os.environ.get("LABKIT_LAB", "demo")


def start(routing: str | None = None, **options):
    """Bring up (or attach to) this notebook's lab, reset it, and make it the current one."""
    global _CURRENT
    from .lab import Lab

    _inline_figures()
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


def _inline_figures() -> None:
    """In IPython, show matplotlib figures (``viz.draw``) inline."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "run_line_magic"):
        try:
            shell.run_line_magic("matplotlib", "inline")
        except Exception:
            pass
