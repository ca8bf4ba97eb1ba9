"""A step's display pieces (labkit.notebook.stepview): field changes in the row grammar, the diff table."""
from __future__ import annotations

import socket

from labkit.maps.ct import CtDiff, CtEntry, CtKey4, CtRow, diff_rows
from labkit.notebook import stepview

KEY = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, 0)


def test_flag_change_names_gained_and_lost():
    """Flags print as both hex words, then +name for each set bit and −name for each cleared one."""
    assert stepview.flag_change(0x0010, 0x0013) == "Flags=0x0010 → 0x0013 [ +RxClosing +TxClosing ]"
    assert stepview.flag_change(0x0018, 0x0011) == "Flags=0x0018 → 0x0011 [ +RxClosing −LBLoopback ]"
    assert stepview.flag_change(0x0010, 0x0010) == "Flags=0x0010 → 0x0010 [ ]"


def test_field_change_follows_release_grammar():
    """The u16 at offset 40 reads IfIndex= in 1.16 and NatPort= (host order) from 1.19 on."""
    old, new = CtRow.of(KEY, CtEntry(ifindex=0)), CtRow.of(KEY, CtEntry(ifindex=socket.htons(40001)))
    assert stepview.field_change("ifindex", old, new) == f"IfIndex=0 → {socket.htons(40001)}"
    old20, new20 = (CtRow.of(KEY, CtEntry(ifindex=0), release="1.20"),
                    CtRow.of(KEY, CtEntry(ifindex=socket.htons(40001)), release="1.20"))
    assert stepview.field_change("ifindex", old20, new20) == "NatPort=0 → 40001"
    a, b = CtRow.of(KEY, CtEntry(rev_nat_index=0)), CtRow.of(KEY, CtEntry(rev_nat_index=socket.htons(7)))
    assert stepview.field_change("rev_nat", a, b) == "RevNAT=0 → 7"


def test_diff_html_rows_marks_and_layout():
    """Added, removed and changed rows each get a table row with their mark; the table has fixed
    column widths and the row cell holds the row's line with its remaining seconds."""
    kept_old, kept_new = CtRow.of(KEY, CtEntry(packets=1)), CtRow.of(KEY, CtEntry(packets=2))
    gone = CtRow.of(CtKey4.make("198.18.1.11", "198.18.2.11", 40001, 8080, 6, 0), CtEntry(lifetime=500))
    new = CtRow.of(CtKey4.make("198.18.1.11", "198.18.2.11", 40002, 8080, 6, 0), CtEntry(lifetime=700))
    page = stepview.diff_html({"node-a": diff_rows([kept_old, gone], [kept_new, new])}, now=400)
    assert "table-layout:fixed" in page and "<colgroup>" in page
    assert page.count("<tr ") == 3
    assert ">+</td>" in page and ">−</td>" in page and ">~</td>" in page
    assert "expires=700 (remaining: 300 sec(s))" in page and "expires=500 (remaining: 100 sec(s))" in page
    assert "Packets=1 → 2" in page
    assert "No CT row changed" in stepview.diff_html({"node-a": CtDiff()}, now=0)


def test_records_html_escapes_and_folds():
    """Raw records sit inside <details>, escaped."""
    page = stepview.records_html(["a -> <b>"])
    assert page.startswith("<details") and "a -&gt; &lt;b&gt;" in page and page.endswith("</details>")
