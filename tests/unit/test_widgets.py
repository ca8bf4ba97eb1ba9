"""The live CT table: the pure HTML renderer (highlighting, filters, columns, expiry, escaping)
and the ipywidgets CtTable around it (refresh, filters, column chooser, timer thread, errors,
what a page shows once its kernel has stopped)."""
from __future__ import annotations

import random
import socket
import statistics
import threading
import time
from dataclasses import replace
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest

pytest.importorskip("ipywidgets")

import labkit.notebook.widgets as widgets  # noqa: E402
from labkit.errors import LabStateError, NotFoundError  # noqa: E402
from labkit.maps.ct import CT_MAPS, CtEntry, CtKey4, CtRow, TupleFlags  # noqa: E402
from labkit.notebook.widgets import COLUMNS, STOPPED_NOTICE, CtTable, Filters, render_table, watch  # noqa: E402

C, S = "198.18.1.11", "198.18.2.11"
NOW = 1000


def row(src=C, sport=40000, dst=S, dport=8080, proto=6, tflags=TupleFlags.OUT, map_name="", **entry) -> CtRow:
    """A fabricated CT row (``tflags``: the key's tuple flags); entry fields default to a live, established flow."""
    values = dict(lifetime=NOW + 100, flags=0x10, packets=3, bytes=222, tx_flags_seen=0x12, rx_flags_seen=0x12)
    values.update(entry)
    return CtRow.of(CtKey4.make(src, dst, sport, dport, proto, tflags), CtEntry(**values), map_name)


class _Table(HTMLParser):
    """The body rows of a rendered table: row classes and (text, classes, title) per cell; the header's names."""

    def __init__(self, html: str):
        super().__init__()
        self.rows: list[dict] = []
        self.header_rows = 0
        self.header: list[str] = []
        self._in_body = False
        self._cell = None
        self._th = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "th":
            self._th = ""
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr":
            if self._in_body:
                self.rows.append({"classes": set((a.get("class") or "").split()), "cells": []})
            else:
                self.header_rows += 1
        elif tag == "td" and self._in_body:
            self._cell = ["", set((a.get("class") or "").split()), a.get("title")]

    def handle_endtag(self, tag):
        if tag == "th":
            self.header.append(self._th)
            self._th = None
        elif tag == "tbody":
            self._in_body = False
        elif tag == "td" and self._cell is not None:
            self.rows[-1]["cells"].append(tuple(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[0] += data
        elif self._th is not None:
            self._th += data


COL = {name: i for i, name in enumerate(widgets._COLUMNS)}


def parse(html: str) -> list[dict]:
    return _Table(html).rows


def flows(html: str) -> list[str]:
    """``src dst`` of each body row, in order."""
    return [f"{r['cells'][COL['src']][0]} {r['cells'][COL['dst']][0]}" for r in parse(html)]


def by_src(html: str) -> dict[str, dict]:
    return {r["cells"][COL["src"]][0]: r for r in parse(html)}


# -- render_table ----------------------------------------------------------------------------

def test_one_tr_per_row_plus_header():
    """Each row is one <tr> in the body, below exactly one header row with every column."""
    rows = [row(sport=40000 + i) for i in range(7)]
    html = render_table(rows, now=NOW)
    assert html.count("<tr") == 8
    table = _Table(html)
    assert table.header_rows == 1 and len(table.rows) == 7
    assert all(len(r["cells"]) == len(widgets._COLUMNS) for r in table.rows)
    for name in ("proto", "dir", "src", "dst", "flags", "rx seen", "tx seen", "packets", "bytes",
                 "expires", "remaining", "rev nat", "backend"):
        assert f">{name}</th>" in html


def test_cells_show_the_row():
    """The cells read proto, dir, flows, flag names, SYN|ACK flags, counters, lifetimes, rev nat, backend."""
    r = row(proto=6, tflags=TupleFlags.IN, rev_nat_index=0x0300, backend_id=7, lifetime=NOW + 42)
    cells = [c[0] for c in parse(render_table([r], now=NOW))[0]["cells"]]
    assert cells == ["TCP", "IN", f"{C}:40000", f"{S}:8080", "SeenNonSyn", "SYN|ACK", "SYN|ACK",
                     "3", "222", str(NOW + 42), "42 s", "3", "7"]
    related = parse(render_table([row(proto=17, tflags=TupleFlags.OUT | TupleFlags.RELATED)]))[0]
    assert related["cells"][COL["dir"]][0] == "OUT related"
    assert related["cells"][COL["remaining"]][0] == ""  # no clock given


def test_stable_order():
    """Rows sort by map, dir, src, sport, dst, dport whatever order the dump had."""
    rows = [
        row("198.18.1.9", 2, proto=17),
        row("198.18.1.10", 1, tflags=TupleFlags.IN),
        row("198.18.1.10", 1),
        row("198.18.1.9", 5),
        row("198.18.1.9", 3, dst="198.18.2.12"),
        row("198.18.1.9", 3, dst="198.18.2.11"),
        row("198.18.1.9", 1, tflags=TupleFlags.SERVICE),
    ]
    expected = [
        "198.18.1.9:3 198.18.2.11:8080",  # TCP map, OUT, src numerically before .10
        "198.18.1.9:3 198.18.2.12:8080",
        "198.18.1.9:5 198.18.2.11:8080",
        "198.18.1.10:1 198.18.2.11:8080",
        "198.18.1.10:1 198.18.2.11:8080",  # IN after OUT
        "198.18.2.11:8080 198.18.1.9:1",  # SVC last
        "198.18.1.9:2 198.18.2.11:8080",  # the other map (UDP) after the TCP map
    ]
    for _ in range(5):
        random.shuffle(rows)
        html = render_table(rows)
        assert flows(html) == expected
        assert [r["cells"][COL["dir"]][0] for r in parse(html)][3:6] == ["OUT", "IN", "SVC"]


def test_no_previous_no_highlight():
    """Without previous rows nothing is marked added, changed or removed."""
    html = render_table([row(sport=1), row(sport=2)], now=NOW)
    assert all(r["classes"] == set() for r in parse(html))
    assert 'class="lk-added' not in html and 'class="lk-changed' not in html


def test_added_changed_removed_rows():
    """Exactly the new row is lk-added, the moved one lk-changed (moved cells lk-diff), the gone one lk-removed."""
    same, moved, gone = row(C, 1), row(C, 2), row(C, 3)
    moved_now = row(C, 2, packets=4, bytes=300)
    new = row(C, 4)
    html = render_table([same, moved_now, new], previous=[same, moved, gone], now=NOW)
    rows = by_src(html)
    assert rows[f"{C}:1"]["classes"] == set()
    assert rows[f"{C}:2"]["classes"] == {"lk-changed"}
    assert rows[f"{C}:3"]["classes"] == {"lk-removed"}
    assert rows[f"{C}:4"]["classes"] == {"lk-added"}
    assert html.count("<tr") == 5  # the gone row is there once, struck through
    diff_cells = {i for i, cell in enumerate(rows[f"{C}:2"]["cells"]) if "lk-diff" in cell[1]}
    assert diff_cells == {COL["packets"], COL["bytes"]}
    assert rows[f"{C}:2"]["cells"][COL["packets"]][2] == "was 3"
    assert "line-through" in html  # the style strikes lk-removed rows
    # Next refresh: the gone row has been shown once and disappears.
    again = render_table([same, moved_now, new], previous=[same, moved_now, new], now=NOW)
    assert f"{C}:3" not in by_src(again)
    assert all(r["classes"] == set() for r in parse(again))


def test_changed_lifetime_emphasises_expiry_cells():
    """A lifetime refresh marks the expires and remaining cells."""
    before, after = row(lifetime=NOW + 10), row(lifetime=NOW + 70)
    cells = parse(render_table([after], previous=[before], now=NOW))[0]["cells"]
    assert {i for i, c in enumerate(cells) if "lk-diff" in c[1]} == {COL["expires"], COL["remaining"]}
    assert cells[COL["remaining"]][2] == "was 10 s"


def test_filter_text():
    """Text matches 'src:sport dst:dport' or the CT line, case-insensitively, and ignores blanks."""
    udp = row("198.18.1.12", 40001, dport=53, proto=17, flags=0, packets=9, tx_flags_seen=0, rx_flags_seen=0)
    rows = [row("198.18.1.11", 40000), udp]
    assert flows(render_table(rows, filters=Filters(text="1.12:"))) == ["198.18.1.12:40001 198.18.2.11:53"]
    assert len(parse(render_table(rows, filters=Filters(text=":8080")))) == 1
    assert len(parse(render_table(rows, filters=Filters(text="40000 198.18.2.11")))) == 1
    assert len(parse(render_table(rows, filters=Filters(text="seennonsyn")))) == 1  # from the CT line
    assert len(parse(render_table(rows, filters=Filters(text="Packets=9")))) == 1
    assert len(parse(render_table(rows, filters=Filters(text="   ")))) == 2
    html = render_table(rows, filters=Filters(text="10.0.0.1"))
    assert html.count("<tr") == 1 and "no rows match the filters" in html


def test_filter_proto_and_related():
    """Proto keeps one protocol; hide_related drops the RELATED twins (also among removed rows)."""
    tcp, udp, icmp = row(sport=1), row(sport=2, proto=17), row(sport=0, dport=0, proto=1)
    twin = row(sport=2, proto=17, tflags=TupleFlags.OUT | TupleFlags.RELATED)
    gone_twin = row(sport=3, proto=17, tflags=TupleFlags.RELATED)
    rows = [tcp, udp, icmp, twin]
    protos = lambda html: sorted(r["cells"][COL["proto"]][0] for r in parse(html))  # noqa: E731
    assert protos(render_table(rows, filters=Filters(proto="TCP"))) == ["TCP"]
    assert protos(render_table(rows, filters=Filters(proto="udp"))) == ["UDP", "UDP"]
    assert protos(render_table(rows, filters=Filters(proto="ICMP"))) == ["ICMP"]
    assert protos(render_table(rows, filters=Filters(proto=None))) == ["ICMP", "TCP", "UDP", "UDP"]
    html = render_table(rows, previous=rows + [gone_twin], filters=Filters(hide_related=True))
    assert len(parse(html)) == 3 and "related" not in "".join(c[0] for r in parse(html) for c in r["cells"])
    html = render_table(rows, previous=rows + [gone_twin], filters=Filters(proto="UDP"))
    assert [r["classes"] for r in parse(html)].count({"lk-removed"}) == 1


def test_filters_normalise():
    """Filters strip the text and take 'All'/blank as no protocol and names in any case."""
    assert Filters("  a ", "all") == Filters("a", None)
    assert Filters(proto="tcp").proto == "TCP" and not Filters().active and Filters(hide_related=True).active


def test_expired_rows_grey():
    """Rows past their lifetime on the lab clock say 'expired' and are lk-expired; others show seconds left."""
    live, edge, dead = row(sport=1, lifetime=NOW + 5), row(sport=2, lifetime=NOW), row(sport=3, lifetime=NOW - 30)
    rows = by_src(render_table([live, edge, dead], now=NOW))
    assert rows[f"{C}:1"]["cells"][COL["remaining"]][0] == "5 s" and "lk-expired" not in rows[f"{C}:1"]["classes"]
    assert rows[f"{C}:2"]["cells"][COL["remaining"]][0] == "0 s" and "lk-expired" not in rows[f"{C}:2"]["classes"]
    assert rows[f"{C}:3"]["classes"] == {"lk-expired"}
    assert rows[f"{C}:3"]["cells"][COL["remaining"]][:1] == ("expired",)
    assert rows[f"{C}:3"]["cells"][COL["remaining"]][2] == "expired 30 s ago"
    html = render_table([dead], now=NOW)
    assert ".lk-ct tr.lk-expired td{color:" in html  # grey, by the scoped style


def test_html_escaped():
    """Text that looks like markup is escaped, never passed through."""
    evil = replace(row(), src='<img src=x onerror="alert(1)">', dir="<b>IN</b>")
    html = render_table([evil], previous=[], now=NOW)
    assert "<img" not in html and "<b>IN" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;:40000" in html and "&lt;b&gt;IN&lt;/b&gt;" in html
    assert parse(html)[0]["cells"][COL["src"]][0] == '<img src=x onerror="alert(1)">:40000'


def test_style_is_scoped():
    """The <style> only has selectors under the lk-ct class, and the table sits inside it."""
    html = render_table([row()])
    style = html[html.index("<style>") + 7:html.index("</style>")]
    selectors = [s.strip() for rule in style.split("}") if "{" in rule for s in rule.split("{")[0].split(",")]
    assert selectors and all(s.startswith(".lk-ct") for s in selectors)
    assert '<div class="lk-ct"><table>' in html


def test_columns_choose_what_is_rendered():
    """columns= renders only those columns (header and cells, in table order); the rows stay the same."""
    rows = [row(sport=1, backend_id=7), row(sport=2, proto=17)]
    html = render_table(rows, now=NOW, columns=["backend", "src", "proto"])
    table = _Table(html)
    assert table.header == ["proto", "src", "backend"]
    assert [[c[0] for c in r["cells"]] for r in table.rows] == [["TCP", f"{C}:1", "7"], ["UDP", f"{C}:2", "0"]]
    for hidden in ("dst", "flags", "packets", "remaining"):
        assert f">{hidden}</th>" not in html
    assert f"{S}:8080" not in html and "100 s" not in html  # the hidden cells are not in the page at all
    assert len(_Table(render_table(rows, columns=[])).rows) == 2 and "every column is hidden" in render_table(
        rows, columns=[])


def test_columns_default_to_all():
    """Without columns= (or with None) every column of COLUMNS is rendered, in order."""
    assert _Table(render_table([row()])).header == list(COLUMNS)
    assert render_table([row()], now=NOW, columns=None) == render_table([row()], now=NOW)
    assert render_table([row()], now=NOW, columns=COLUMNS) == render_table([row()], now=NOW)


def test_columns_unknown_name_refused():
    """A column name the table does not have is refused, naming it and the columns there are."""
    with pytest.raises(NotFoundError, match=r"no column 'port'.*expected some of proto, dir, src"):
        render_table([row()], columns=["src", "port"])


def test_columns_keep_highlighting():
    """With columns hidden, the moved cells still shown keep their emphasis and the row its class."""
    before, after = row(sport=1), row(sport=1, packets=9)
    [r] = parse(render_table([after], previous=[before], now=NOW, columns=["src", "packets"]))
    assert r["classes"] == {"lk-changed"}
    assert [(c[0], "lk-diff" in c[1]) for c in r["cells"]] == [(f"{C}:1", False), ("9", True)]


def test_empty_dump():
    """No rows: only the header row and a note."""
    html = render_table([], now=NOW)
    assert html.count("<tr") == 1 and "no CT entries" in html


# -- speed: fabricated rows, render_table's timing ------------------------------------------

def _fabricate(n: int, lifetime: int = 1100, packets: int = 1) -> list[CtRow]:
    """``n`` rows of both maps: TCP OUT/IN pairs, UDP and ICMP flows, some RELATED twins."""
    rows = []
    for i in range(n):
        kind = i % 4
        proto = (6, 6, 17, 1)[kind]
        flags = TupleFlags.IN if kind == 1 else TupleFlags.OUT
        if kind == 2 and i % 8 == 2:
            flags |= TupleFlags.RELATED
        src = f"198.18.{1 + i % 2}.{10 + i % 200}"
        key = CtKey4.make(src, "198.18.3.11", 30000 + i, 8080 if proto != 1 else 0, proto, flags)
        entry = CtEntry(lifetime=lifetime + i % 300 - 150, flags=0x10 if proto == 6 else 0, packets=packets + i,
                        bytes=(packets + i) * 66, tx_flags_seen=0x1A if proto == 6 else 0,
                        rx_flags_seen=0x12 if proto == 6 else 0, rev_nat_index=socket.htons(i % 5))
        rows.append(CtRow.of(key, entry))
    return rows


def time_render(n: int = 1000, runs: int = 7) -> float:
    """Median seconds :func:`render_table` takes for ``n`` fabricated rows against a previous
    dump (a tenth of them changed, a few added and removed), over ``runs`` runs."""
    previous = _fabricate(n + n // 50)[n // 100:]  # some rows only before, some only now
    rows = [r if i % 10 else _fabricate_changed(r) for i, r in enumerate(_fabricate(n))]
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        render_table(rows, previous=previous, now=1000)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _fabricate_changed(row: CtRow) -> CtRow:
    return replace(row, packets=row.packets + 1, bytes=row.bytes + 66, lifetime=row.lifetime + 60)


def test_time_render_measures():
    """time_render returns a median in seconds (its speed is for make bench, not asserted)."""
    assert 0 < time_render(50, runs=2) < 10


# -- CtTable ---------------------------------------------------------------------------------

class FakeLab:
    """Just what CtTable reads: ct(node), clock.now(), ct_command(node), topology.node(name)."""

    def __init__(self, *dumps, now=NOW):
        self.dumps = list(dumps) or [[]]
        self.calls = 0
        self.now = now
        self.error: Exception | None = None
        self.called = threading.Event()  #: set by every ct() call
        self._cond = threading.Condition()
        self.clock = SimpleNamespace(now=lambda: self.now)
        nodes = {"node-a": SimpleNamespace(name="node-a", ip="198.51.100.11")}

        def node(name):
            if name not in nodes:
                raise NotFoundError(f"node '{name}' not found in lab 'demo' (nodes: node-a)")
            return nodes[name]

        self.topology = SimpleNamespace(node=node)

    def ct(self, node):
        with self._cond:
            self.calls += 1
            self._cond.notify_all()
        self.called.set()
        if self.error is not None:
            raise self.error
        return list(self.dumps[min(self.calls, len(self.dumps)) - 1])

    def wait_calls(self, n: int, timeout: float = 5) -> bool:
        """Wait until ct() has been called ``n`` times in all."""
        with self._cond:
            return self._cond.wait_for(lambda: self.calls >= n, timeout)

    def ct_command(self, node):
        return [f"bpftool map dump pinned /sys/fs/bpf/labkit/demo/{node}/{m}" for m in CT_MAPS]


@pytest.fixture
def tables():
    made = []
    yield made
    for t in made:
        t.close()


def make(tables, lab, node="node-a", **kw) -> CtTable:
    t = CtTable(lab, node, **kw)
    tables.append(t)
    return t


def test_table_layout(tables):
    """The VBox holds header, filter controls, the column chooser, a fixed-height table scrolling both ways
    inside the box's width, and the status line."""
    t = make(tables, FakeLab())
    assert t.widget.children == (t.header, t.controls, t.chooser, t.table, t.status)
    assert t.table.layout.height == widgets.TABLE_HEIGHT and t.table.layout.overflow == "auto"
    assert t.table.layout.width == "auto" and t.table.layout.min_width == "0"  # the box's width, margins inside
    assert t.widget.layout.max_width == "100%"
    assert t.text.placeholder == "address or port"
    assert [label for label, _ in t.proto.options] == ["All", "TCP", "UDP", "ICMP"] and t.proto.value is None
    assert t.hide_related.description == "hide RELATED twins"
    assert "node-a" in t.header.value and "bpftool map dump pinned /sys/fs/bpf/labkit/demo/node-a/" in t.header.value
    assert all(m in t.header.value for m in CT_MAPS) and "monospace" in t.header.value


def test_table_unknown_node():
    """A node the topology does not have is refused by name."""
    with pytest.raises(NotFoundError, match="node-z"):
        CtTable(FakeLab(), "node-z")


def test_refresh_updates_table_and_status(tables):
    """refresh() renders the dump with the lab clock, and highlights what moved since the refresh before."""
    first = [row(sport=1), row(sport=2), row(sport=3, lifetime=NOW - 1)]
    second = [row(sport=1), row(sport=2, packets=4), row(sport=4)]
    lab = FakeLab(first, second)
    t = make(tables, lab)
    assert t.refresh() is True and lab.calls == 1
    assert len(parse(t.table.value)) == 3 and all(not (r["classes"] - {"lk-expired"}) for r in parse(t.table.value))
    assert "3 of 3 rows shown" in t.status.value and f"lab clock {NOW} s" in t.status.value
    assert f"now = {NOW} s" in t.header.value
    lab.now = NOW + 5
    assert t.refresh() is True
    rows = by_src(t.table.value)
    assert rows[f"{C}:1"]["classes"] == set()
    assert rows[f"{C}:2"]["classes"] == {"lk-changed"}
    assert rows[f"{C}:3"]["classes"] == {"lk-removed", "lk-expired"}
    assert rows[f"{C}:4"]["classes"] == {"lk-added"}
    assert "3 of 3 rows shown" in t.status.value and "+1 added, ~1 changed, -1 removed" in t.status.value
    assert f"now = {NOW + 5} s" in t.header.value and t.rows == second
    t.refresh()  # nothing moved since: no highlighting left
    assert all(r["classes"] == set() for r in parse(t.table.value))


def test_filter_change_rerenders_without_reading(tables):
    """Changing a filter re-renders the last rows (and keeps their highlighting) without calling lab.ct."""
    before = [row(sport=1), row(sport=2, proto=17)]
    after = [row(sport=1, packets=9), row(sport=2, proto=17), row(sport=3, proto=17, tflags=TupleFlags.RELATED)]
    lab = FakeLab(before, after)
    t = make(tables, lab)
    t.refresh()
    t.refresh()
    assert lab.calls == 2
    t.proto.value = "UDP"
    assert len(parse(t.table.value)) == 2 and "2 of 3 rows shown" in t.status.value
    t.hide_related.value = True
    assert len(parse(t.table.value)) == 1 and "1 of 3 rows shown" in t.status.value
    t.proto.value = None
    t.text.value = ":1 "
    rows = parse(t.table.value)
    assert len(rows) == 1 and rows[0]["classes"] == {"lk-changed"}
    assert t.filters == Filters(":1", None, True)
    assert lab.calls == 2


def test_start_stop_thread(tables):
    """start() refreshes on a daemon thread until stop(), which joins it."""
    lab = FakeLab([row()])
    t = make(tables, lab)
    t.start(0.01)
    assert t.running and t._thread.daemon and "auto-refresh every 0.01 s" in t.status.value
    assert lab.called.wait(5), "the timer never read the CT maps"
    thread = t._thread
    t.stop()
    assert not thread.is_alive() and not t.running
    assert t.refresh_count >= 1 and "1 of 1 rows shown" in t.status.value
    assert "auto-refresh" not in t.status.value
    calls = lab.calls
    lab.called.clear()
    assert not lab.called.wait(0.05) and lab.calls == calls  # stopped means stopped
    t.stop()  # a second stop is harmless


def test_start_refuses_bad_interval(tables):
    """An interval must be a positive number of seconds."""
    t = make(tables, FakeLab())
    for bad in (0, -1, "1", True):
        with pytest.raises(ValueError):
            t.start(bad)
    assert not t.running


def test_refresh_error_in_status(tables, capsys):
    """A failing read keeps the last table, reports in the status line, prints nothing, and clears on success."""
    lab = FakeLab([row(sport=1)])
    t = make(tables, lab)
    t.refresh()
    table_html = t.table.value
    lab.error = LabStateError("lab 'demo' is 'down', expected <up>")
    assert t.refresh() is False
    assert t.table.value == table_html and isinstance(t.last_error, LabStateError)
    assert "refresh failed" in t.status.value and "LabStateError: lab &#x27;demo&#x27;" in t.status.value
    assert "&lt;up&gt;" in t.status.value and "1 of 1 rows shown" in t.status.value
    lab.error = None
    assert t.refresh() is True and "refresh failed" not in t.status.value and t.last_error is None
    assert capsys.readouterr() == ("", "")


def test_timer_error_in_status(tables, capsys):
    """An error in a timer refresh lands in the status line, not on stdout/stderr, and the timer goes on."""
    lab = FakeLab()
    lab.error = OSError("map gone")
    t = make(tables, lab)
    t.start(0.01)
    assert lab.called.wait(5)
    assert lab.wait_calls(3), "the timer stopped after an error"
    t.stop()
    assert "refresh failed" in t.status.value and "OSError: map gone" in t.status.value
    assert capsys.readouterr() == ("", "")


def test_close(tables):
    """close() stops the timer and closes every widget; later refreshes do nothing."""
    lab = FakeLab([row()])
    t = make(tables, lab)
    t.start(0.01)
    assert lab.called.wait(5)
    thread = t._thread
    t.close()
    assert t.closed and not thread.is_alive()
    assert all(w.comm is None for w in (t.widget, t.table, t.text, t.proto, t.hide_related, t.header, t.status))
    calls = lab.calls
    assert t.refresh() is False and lab.calls == calls
    with pytest.raises(RuntimeError):
        t.start(1)
    t.close()  # twice is fine


def test_repr_mimebundle_is_the_widget(tables):
    """A cell ending in the table displays its VBox."""
    t = make(tables, FakeLab())
    bundle = t._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == t.widget.model_id
    assert "CtTable(node='node-a'" in repr(t)


def test_watch(tables):
    """watch() refreshes once; with an interval it also starts the timer."""
    lab = FakeLab([row()])
    t = watch(lab, "node-a")
    tables.append(t)
    assert lab.calls == 1 and not t.running and len(parse(t.table.value)) == 1
    t2 = watch(lab, "node-a", interval=0.01)
    tables.append(t2)
    assert t2.running and t2.interval == 0.01
    assert lab.wait_calls(3), "the timer of the watched table never refreshed"
    t2.stop()
    assert not t2.running


# -- the column chooser, state kept across refreshes ------------------------------------------

def test_chooser_shows_every_column_by_default(tables):
    """The chooser has one ticked box per column, folded, and the first refresh renders all of them."""
    t = make(tables, FakeLab([row()]))
    assert list(t.column_boxes) == list(COLUMNS) and all(b.value for b in t.column_boxes.values())
    assert t.chooser.children[0].children == tuple(t.column_boxes.values())
    assert t.chooser.selected_index is None and t.chooser.titles == ("columns: 13 of 13 shown",)
    assert t.columns == COLUMNS
    t.refresh()
    assert _Table(t.table.value).header == list(COLUMNS)


def test_chooser_hides_columns_without_reading(tables):
    """Unticking a column takes it out of the table (rows and row count unchanged) without reading the maps."""
    lab = FakeLab([row(sport=1), row(sport=2)])
    t = make(tables, lab)
    t.refresh()
    t.column_boxes["backend"].value = False
    t.column_boxes["rev nat"].value = False
    table = _Table(t.table.value)
    assert table.header == [c for c in COLUMNS if c not in ("backend", "rev nat")]
    assert len(table.rows) == 2 and all(len(r["cells"]) == 11 for r in table.rows)
    assert t.columns == tuple(c for c in COLUMNS if c not in ("backend", "rev nat"))
    assert t.chooser.titles == ("columns: 11 of 13 shown",) and "2 of 2 rows shown" in t.status.value
    assert lab.calls == 1
    t.columns = ["src", "dst"]  # the same from code
    assert [b for b, box in t.column_boxes.items() if box.value] == ["src", "dst"]
    assert _Table(t.table.value).header == ["src", "dst"]
    t.columns = None
    assert _Table(t.table.value).header == list(COLUMNS)
    with pytest.raises(NotFoundError):
        t.columns = ["nope"]


def test_columns_setter_renders_once(tables):
    """Setting columns from code re-renders the table once, not once per checkbox it changes."""
    t = make(tables, FakeLab([row()]))
    t.refresh()
    renders = []
    original = t._render
    t._render = lambda: (renders.append(1), original())[1]
    t.columns = ["src"]
    assert len(renders) == 1 and _Table(t.table.value).header == ["src"]
    t.column_boxes["dst"].value = True  # a click in the chooser: one render too
    assert len(renders) == 2 and _Table(t.table.value).header == ["src", "dst"]


def test_refresh_keeps_filters_and_columns(tables):
    """A refresh (by hand or by the timer) keeps the filter values and the chosen columns and applies them."""
    first = [row(sport=1), row(sport=2, proto=17)]
    second = first + [row(sport=3, proto=17), row(sport=4)]
    lab = FakeLab(first, second)
    t = make(tables, lab)
    t.refresh()
    t.proto.value = "UDP"
    t.text.value = "198.18"
    t.hide_related.value = True
    t.columns = ["proto", "src", "packets"]
    assert t.refresh() is True and lab.calls == 2
    assert (t.proto.value, t.text.value, t.hide_related.value) == ("UDP", "198.18", True)
    assert t.columns == ("proto", "src", "packets")
    table = _Table(t.table.value)
    assert table.header == ["proto", "src", "packets"]
    assert sorted(r["cells"][1][0] for r in table.rows) == [f"{C}:2", f"{C}:3"]
    assert "2 of 4 rows shown" in t.status.value
    t.start(0.01)
    assert lab.wait_calls(4)
    t.stop()
    assert t.columns == ("proto", "src", "packets") and t.filters == Filters("198.18", "UDP", True)
    assert _Table(t.table.value).header == ["proto", "src", "packets"]


# -- a table whose kernel has stopped --------------------------------------------------------

def test_stopped_notice_shows_only_when_disconnected(tables):
    """The header carries the stopped-kernel notice, hidden by default and shown by the class ipywidgets
    puts on a view without a live kernel (jupyter-widgets-disconnected)."""
    t = make(tables, FakeLab([row()]))
    t.refresh()
    header = t.header.value
    assert STOPPED_NOTICE in header and "re-run this cell" in STOPPED_NOTICE
    assert "kernel that has stopped" in STOPPED_NOTICE
    assert ".lk-ct-stopped{display:none}" in header
    assert ".jupyter-widgets-disconnected .lk-ct-stopped{display:block" in header
    assert header.index('<div class="lk-ct-stopped">') < header.index("CT table of node-a")
    # in place of ipywidgets' broken-link icon on each widget of the box; the auto-refresh note goes
    assert "lk-ct-box" in t.widget._dom_classes
    assert ".lk-ct-box .jupyter-widgets-disconnected::before{display:none}" in header
    assert ".jupyter-widgets-disconnected .lk-ct-live-only{display:none}" in header
    assert (".lk-ct-box.jupyter-widgets-disconnected input,.lk-ct-box.jupyter-widgets-disconnected select"
            "{pointer-events:none" in header)  # dead controls take no clicks
    t.start(60)
    assert '<span class="lk-ct-live-only"> · auto-refresh every 60 s</span>' in t.status.value


def test_mimebundle_fallback_is_the_last_table_and_the_notice(tables):
    """The cell's text/html output (drawn where the widget cannot be) says the kernel has stopped and to
    re-run the cell, over the table as shown when displayed (its filters and columns), beside the widget view."""
    lab = FakeLab([row(sport=1), row(sport=2, proto=17)])
    t = make(tables, lab)
    t.refresh()
    t.proto.value = "UDP"
    t.columns = ["proto", "src", "packets"]
    bundle = t._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == t.widget.model_id
    html = bundle["text/html"]
    assert STOPPED_NOTICE in html and html.index(STOPPED_NOTICE) < html.index("<table>")
    assert "lk-ct-stopped-static" in html and 'class="lk-ct-stopped"' not in html  # shown, not hidden by CSS
    table = _Table(html)
    assert table.header == ["proto", "src", "packets"]
    assert [[c[0] for c in r["cells"]] for r in table.rows] == [["UDP", f"{C}:2", "3"]]
    assert "CT table of node-a" in html and "1 of 2 rows shown" in html
    assert "text/plain" in bundle
    t.start(60)  # a static copy never says it refreshes
    assert "auto-refresh" in t.status.value and "auto-refresh" not in t._repr_mimebundle_()["text/html"]
