"""What a notebook imports: start the lab, draw it, take steps, check answers.

    from labkit.nb import *
    lab = start()                 # the lab named by $LABKIT_LAB, else "demo"

``start`` is ``Lab.up`` with the name taken from the environment, so the
same notebook runs as a learner's ``demo`` lab and under tests or
``labkit grade`` in a lab of their own. Everything here is the unprivileged
side (:mod:`labkit.client`): the lab is built, run and read by labkitd, and
this kernel holds no root and no capability.
"""
from __future__ import annotations

import warnings

from labkit.client.checks import check
from labkit.client.lab import Lab
from labkit.client.session import VARIANTS, current_lab, down_variants, lab_name, set_current

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
    for key, value in (("routing", routing), ("socket_lb", socket_lb), ("lb_mode", lb_mode)):
        if value is not None:
            options[key] = value
    name = f"{lab_name()}-{variant}" if variant else lab_name()
    if variant is None:
        down_variants(name)
    lab = Lab.up(name, labels=labels, **options)
    lab.reset()
    if variant:
        return lab
    return set_current(lab)  # reset: every notebook starts from empty maps and the clock at offset 0


def observe(lab, title: str, last: int | None = None, from_pod: str | None = None, to_pod: str | None = None,
            verdict: str | None = None, protocol: str | None = None, port: int | None = None):
    """Read ``lab``'s Hubble ring as ``labkit observe`` does, keep the last ``last`` matching entries (all the
    ring holds with None); labkitd records the view as evidence under ``title``
    (:class:`labkit.notebook.hubbleview.ObserveView`).

        >>> view = observe(lab, "one connection at medium", port=conn.sport)   # doctest: +SKIP
    """
    filters = {k: v for k, v in dict(from_pod=from_pod, to_pod=to_pod, verdict=verdict, protocol=protocol,
                                     port=port).items() if v is not None}
    return lab.observe(title, last=last, **filters)


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
