"""The server's save hook that keeps widget outputs drawable: state taken back from the file being replaced,
else the output's own text/html, never a failed save."""
from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

pytest.importorskip("ipywidgets")

from ipywidgets.embed import dependency_state  # noqa: E402

from labkit.notebook.widgets import STOPPED_NOTICE, CtTable  # noqa: E402
from labkit.notebook.widgetstate import STATE_MIME, VIEW_MIME, keep_widget_state, mend  # noqa: E402


class _Lab:
    """What CtTable reads, with no rows."""

    clock = SimpleNamespace(now=lambda: 1000)
    topology = SimpleNamespace(node=lambda name: SimpleNamespace(ip="198.51.100.11"))

    def ct(self, node):
        return []

    def ct_command(self, node):
        return [f"bpftool map dump pinned /sys/fs/bpf/labkit/demo/{node}/cilium_ct4_global"]


@pytest.fixture
def table():
    t = CtTable(_Lab(), "node-a")
    t.refresh()
    yield t
    t.close()


def _notebook(bundle: dict, state: dict | None) -> dict:
    """A notebook as JupyterLab saves it: one cell showing ``bundle``, ``state`` in its metadata (None: no entry)."""
    meta = {"kernelspec": {"name": "python3"}}
    if state is not None:
        meta["widgets"] = {STATE_MIME: {"version_major": 2, "version_minor": 0, "state": state}}
    output = {"output_type": "execute_result", "execution_count": 3, "data": bundle, "metadata": {}}
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": meta,
            "cells": [{"cell_type": "code", "source": "table", "metadata": {}, "outputs": [output]}]}


def _bundle(t: CtTable) -> dict:
    return json.loads(json.dumps(t._repr_mimebundle_()))  # as it travels: plain JSON


def test_state_taken_back_from_the_file_it_replaces(table):
    """A widget output without state in the save gets its state, and every model it holds, from the saved file."""
    bundle = _bundle(table)
    full = json.loads(json.dumps(dependency_state([table.widget], drop_defaults=True)))
    assert table.widget.model_id in full and len(full) > 10  # box, children, layouts, styles
    saved = _notebook(copy.deepcopy(bundle), full)
    nb = _notebook(bundle, {})  # what JupyterLab sends after a kernel restart: no live widgets, no state
    assert mend(nb, saved) == {"restored": [table.widget.model_id], "static": []}
    assert nb["metadata"]["widgets"][STATE_MIME]["state"] == full
    assert VIEW_MIME in nb["cells"][0]["outputs"][0]["data"]  # still drawn as the widget


def test_state_entry_made_when_the_save_has_none(table):
    """A save without any widget metadata gets the entry made for the state it takes back."""
    full = json.loads(json.dumps(dependency_state([table.widget], drop_defaults=True)))
    nb = _notebook(_bundle(table), None)
    mend(nb, _notebook(_bundle(table), full))
    assert nb["metadata"]["widgets"][STATE_MIME]["version_major"] == 2
    assert nb["metadata"]["widgets"][STATE_MIME]["state"] == full


def test_text_html_drawn_when_no_state_is_left(table):
    """With no state anywhere, the output keeps only its text/html (the notice over the last table) and text/plain."""
    nb = _notebook(_bundle(table), {})
    assert mend(nb, _notebook(_bundle(table), {})) == {"restored": [], "static": [table.widget.model_id]}
    data = nb["cells"][0]["outputs"][0]["data"]
    assert sorted(data) == ["text/html", "text/plain"] and STOPPED_NOTICE in data["text/html"]
    assert mend(nb, None) == {"restored": [], "static": []}  # nothing left to do


def test_part_of_a_widget_is_not_restored(table):
    """A saved state missing one of the widget's models is not used: the output falls back to its text/html."""
    full = json.loads(json.dumps(dependency_state([table.widget], drop_defaults=True)))
    del full[table.table.model_id]
    nb = _notebook(_bundle(table), {})
    assert mend(nb, _notebook(_bundle(table), full)) == {"restored": [], "static": [table.widget.model_id]}
    assert nb["metadata"]["widgets"][STATE_MIME]["state"] == {}


def test_other_outputs_left_alone(table):
    """Widgets whose state is being saved, and widgets without state or text/html, are not touched."""
    import ipywidgets as w

    full = json.loads(json.dumps(dependency_state([table.widget], drop_defaults=True)))
    nb = _notebook(_bundle(table), full)
    before = copy.deepcopy(nb)
    assert mend(nb, None) == {"restored": [], "static": []} and nb == before
    slider = w.IntSlider()
    try:
        plain = _notebook(json.loads(json.dumps(slider._repr_mimebundle_())), {})
        before = copy.deepcopy(plain)
        assert mend(plain, None) == {"restored": [], "static": []} and plain == before
    finally:
        slider.close()


def test_hook_reads_the_file_being_replaced(table, tmp_path):
    """keep_widget_state mends a notebook model against the file at its path (through the contents manager)."""
    full = json.loads(json.dumps(dependency_state([table.widget], drop_defaults=True)))
    (tmp_path / "lab.ipynb").write_text(json.dumps(_notebook(_bundle(table), full)))
    manager = SimpleNamespace(_get_os_path=lambda path: str(tmp_path / path))
    model = {"type": "notebook", "content": _notebook(_bundle(table), {})}
    keep_widget_state(model=model, path="lab.ipynb", contents_manager=manager)
    assert model["content"]["metadata"]["widgets"][STATE_MIME]["state"] == full
    fresh = {"type": "notebook", "content": _notebook(_bundle(table), {})}
    keep_widget_state(model=fresh, path="new.ipynb", contents_manager=manager)  # no file yet: its text/html
    assert VIEW_MIME not in fresh["content"]["cells"][0]["outputs"][0]["data"]


def test_hook_reads_nothing_when_every_state_is_there(table, tmp_path):
    """A save whose widgets all have their state (the usual one) is left as sent without reading the file."""
    full = json.loads(json.dumps(dependency_state([table.widget], drop_defaults=True)))
    asked = []
    manager = SimpleNamespace(_get_os_path=lambda path: asked.append(path) or str(tmp_path / path))
    model = {"type": "notebook", "content": _notebook(_bundle(table), full)}
    before = copy.deepcopy(model)
    keep_widget_state(model=model, path="lab.ipynb", contents_manager=manager)
    assert model == before and asked == []


def test_hook_never_fails_a_save(tmp_path, caplog):
    """Files that are not notebooks, unreadable saved files and odd content pass through without an exception."""
    manager = SimpleNamespace(_get_os_path=lambda path: str(tmp_path / path))
    (tmp_path / "bad.ipynb").write_text("{not json")
    text = {"type": "file", "content": "hello"}
    keep_widget_state(model=text, path="notes.txt", contents_manager=manager)
    assert text == {"type": "file", "content": "hello"}
    odd = {"type": "notebook", "content": {"cells": [{"outputs": ["not a dict"]}, {"outputs": None}], "metadata": None}}
    keep_widget_state(model=odd, path="bad.ipynb", contents_manager=manager)
    weird = {"type": "notebook", "content": {"cells": 5}}
    keep_widget_state(model=weird, path="bad.ipynb", contents_manager=manager)
    assert "widget state hook failed" in caplog.text  # logged, not raised
