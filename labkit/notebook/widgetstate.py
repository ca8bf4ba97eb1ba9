"""Keep a notebook's widget outputs drawable when JupyterLab saves it: a save hook for Jupyter's server.

JupyterLab (ipywidgets 8.1, with labkit's ``saveState`` default on) writes the widget state of a
notebook into its metadata at every save, but only of the widgets that still have a live kernel.
So a notebook saved after its kernel restarted, or saved again after it was opened without running
(JupyterLab marks a reopened notebook changed, so its autosave does that within minutes), loses the
state of every widget it shows, and the next time it is opened each one reads "Error displaying
widget: model not found" (jupyter-widgets/ipywidgets#3888).

:func:`keep_widget_state` runs in the server before each notebook is written
(``ContentsManager.pre_save_hook``: vagrant/jupyter-server-labkit.json, which provision.sh merges into
the venv's jupyter_server_config.json). For each widget output whose model is not in the state
being saved it:

1. takes the model's state, and that of the widgets it holds, from the file being replaced, when
   that file has it (the last save made while the kernel was alive);
2. otherwise, when the output carries its own ``text/html`` (a live CT table's is the table as it
   was with "re-run this cell" above it), drops the widget view from that output, so JupyterLab
   draws the HTML instead of an error.

Other outputs and widgets are left alone. :func:`mend` is the same on plain dicts.

>>> view = {"application/vnd.jupyter.widget-view+json": {"model_id": "m1", "version_major": 2},
...         "text/html": "<b>re-run this cell</b>", "text/plain": "CtTable"}
>>> nb = {"metadata": {}, "cells": [{"cell_type": "code", "outputs": [
...     {"output_type": "display_data", "data": dict(view), "metadata": {}}]}]}
>>> mend(nb, None)
{'restored': [], 'static': ['m1']}
>>> sorted(nb["cells"][0]["outputs"][0]["data"])
['text/html', 'text/plain']
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

__all__ = ["VIEW_MIME", "STATE_MIME", "mend", "keep_widget_state"]

#: The MIME type of a widget view in an output, and of the widget state in a notebook's metadata.
VIEW_MIME = "application/vnd.jupyter.widget-view+json"
STATE_MIME = "application/vnd.jupyter.widget-state+json"

_REF = re.compile(r"IPY_MODEL_([0-9a-fA-F-]+)")
_log = logging.getLogger(__name__)


def _views(nb: dict):
    """(output data, model id) of every widget view among the notebook's outputs."""
    for cell in nb.get("cells") or ():
        for output in cell.get("outputs") or ():
            data = output.get("data") if isinstance(output, dict) else None
            view = data.get(VIEW_MIME) if isinstance(data, dict) else None
            if isinstance(view, dict) and view.get("model_id"):
                yield data, view["model_id"]


def _state(nb: dict | None) -> dict:
    widgets = ((nb or {}).get("metadata") or {}).get("widgets") or {}
    state = (widgets.get(STATE_MIME) or {}).get("state")
    return state if isinstance(state, dict) else {}


def _attach_state(nb: dict) -> dict:
    """The notebook's widget state dict, made (empty) when the metadata has none."""
    widgets = nb.setdefault("metadata", {}).setdefault("widgets", {})
    entry = widgets.setdefault(STATE_MIME, {"version_major": 2, "version_minor": 0, "state": {}})
    if not isinstance(entry.get("state"), dict):
        entry["state"] = {}
    return entry["state"]


def _with_children(model_id: str, state: dict) -> dict | None:
    """The state of ``model_id`` and of every model it refers to (children, layouts, styles), as ``state``
    has them; None when one of them is missing there (restoring part of a widget would only move the error).

    >>> state = {"a": {"state": {"children": ["IPY_MODEL_b"]}}, "b": {"state": {"layout": "IPY_MODEL_c"}}}
    >>> _with_children("a", state) is None, sorted(_with_children("a", {**state, "c": {"state": {}}}))
    (True, ['a', 'b', 'c'])
    """
    found: dict = {}
    todo = [model_id]
    while todo:
        mid = todo.pop()
        if mid in found:
            continue
        if mid not in state or not isinstance(state[mid], dict):
            return None
        found[mid] = state[mid]
        todo.extend(_REF.findall(json.dumps(state[mid].get("state", {}))))
    return found


def mend(nb: dict, saved: dict | None) -> dict:
    """Make every widget output of ``nb`` drawable, in place; ``saved``: the notebook the save replaces (or None).

    Returns ``{"restored": [...], "static": [...]}``, the model ids taken from ``saved`` and the ones
    whose output now shows its ``text/html`` instead. A widget whose state is in neither and whose
    output has no ``text/html`` stays as it is.
    """
    state = _state(nb)
    old = _state(saved)
    restored: list[str] = []
    static: list[str] = []
    for data, mid in list(_views(nb)):
        if mid in state:
            continue
        models = _with_children(mid, old)
        if models is not None:
            state = _attach_state(nb)  # the metadata entry is made only when something goes in it
            for key, value in models.items():
                state.setdefault(key, value)
            restored.append(mid)
        elif "text/html" in data:
            del data[VIEW_MIME]
            static.append(mid)
    return {"restored": restored, "static": static}


def keep_widget_state(model: dict, path: str, contents_manager: Any = None, **kwargs) -> None:
    """Jupyter server ``pre_save_hook``: :func:`mend` a notebook being saved against the file it replaces.

    The file is read only when some widget output lacks its state. Never raises: a notebook it
    cannot read is saved as JupyterLab sent it.

    >>> keep_widget_state({"type": "file", "content": "x"}, "notes.txt")   # only notebooks are looked at
    """
    log = getattr(contents_manager, "log", None) or _log  # the server's log, where it has one
    try:
        if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
            return
        state = _state(model["content"])
        if all(mid in state for _, mid in _views(model["content"])):
            return  # every widget shown has its state: the usual save, the file is not read
        saved = None
        os_path = None
        if contents_manager is not None:
            getter = getattr(contents_manager, "_get_os_path", None)
            os_path = getter(path) if getter else os.path.join(getattr(contents_manager, "root_dir", ""), path)
        if os_path and os.path.isfile(os_path):
            try:
                with open(os_path, encoding="utf-8") as f:
                    saved = json.load(f)
            except (OSError, ValueError):
                saved = None
        done = mend(model["content"], saved)
        if done["restored"] or done["static"]:
            log.info("labkit: %s: widget state kept for %d widget(s) from the last save, %d shown as their "
                      "HTML (no state left)", path, len(done["restored"]), len(done["static"]))
    except Exception:  # noqa: BLE001 -- a save must never fail because of this hook
        log.exception("labkit: %s: widget state hook failed; saved as sent", path)
