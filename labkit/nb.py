"""What a notebook imports: start the lab, draw it, take steps, check answers.

    from labkit.nb import *
    lab = start()                 # the lab named by $LABKIT_LAB, else "demo"

``start`` is ``Lab.up`` with the name taken from the environment, so the
same notebook runs as a learner's ``demo`` lab and under tests or
``labkit grade`` in a lab of their own.
"""
from __future__ import annotations

import warnings

from labkit.config import DatapathConfig
from labkit.grading.checks import check
from labkit.lab import Lab
from labkit.net.topology import Topology
from labkit.lab.session import VARIANTS, current_lab, down_variants, lab_name, set_current
from labkit.notebook.hubbleview import observe

__all__ = ["start", "check", "current_lab", "lab_name", "show", "observe", "VARIANTS"]

# A venv that also sees the distribution's matplotlib warns that Axes3D cannot load; labkit draws none.
warnings.filterwarnings("ignore", message="Unable to import Axes3D")


def start(routing: str | None = None, socket_lb: str | None = None, variant: str | None = None,
          lb_mode: str | None = None, labels: dict | None = None, **options):
    """Bring up (or attach to) this notebook's lab, reset it, and make it the current one.

    ``variant`` names a second lab beside the main one (``<name>-<variant>``), for
    side-by-side comparisons such as tunnel vs native, socket LB vs per-packet LB, or
    ``lb_mode`` snat vs dsr. ``labels`` gives some pods other labels than ``app=<pod>``
    (``{"a2": {"app": "a1"}}``, as ``labkit up --label a2:app=a1``; lab 10). Other datapath
    options (``ct_tcp_size=64``, ``policy="default"``, ...) pass through.
    The garbage collector's timer is off unless ``gc_timer=True``: a learner reading at
    their own pace must not find rows collected that the lab is not about collecting.
    Starting the main lab takes down variant labs a restarted kernel left behind.
    """
    options.setdefault("gc_timer", False)
    _inline_figures()
    config = DatapathConfig()
    if routing is not None:
        config = config.with_options(routing=routing)
    if socket_lb is not None:
        config = config.with_options(socket_lb=socket_lb)
    if lb_mode is not None:
        config = config.with_options(lb_mode=lb_mode)
    if options:
        config = config.with_options(**options)
    name = f"{lab_name()}-{variant}" if variant else lab_name()
    if variant is None:
        down_variants(name)
    topology = Topology.default(name, labels=labels) if labels else None
    lab = Lab.up(name, config=config, topology=topology)
    lab.reset()
    if variant:
        return lab
    return set_current(lab)  # reset: every notebook starts from empty maps and the clock at offset 0


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
