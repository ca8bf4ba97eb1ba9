"""How a step reads in a notebook: one numbered hop list, the raw records folded, the CT diff in the row grammar.

The hop list is the picture's: item *n* is badge *n* of the path picture
(:mod:`labkit.notebook.svgpath`), repeated hops one item with ``×N``. Each
item carries what the record says: the packet (and what NAT made of it), the
trace tags (``[dsr-opt-added]``, ``[snat]``), the CT verdict and the drop
reason. The timestamped records themselves follow, folded under a
``<details>``.

The CT diff speaks the grammar of ``cilium-dbg bpf ct list global``
(:meth:`labkit.maps.ct.CtRow.line`): added and removed rows are their lines
(with the remaining seconds), changed rows name each changed field as the
grammar does, hex where it prints hex, flags by name with ``+``/``−``::

    >>> from labkit.maps.ct import CtEntry, CtKey4, CtRow
    >>> k = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, 0)
    >>> old = CtRow.of(k, CtEntry(flags=0x0010, lifetime=21700, tx_flags_seen=0x1a))
    >>> new = CtRow.of(k, CtEntry(flags=0x0013, lifetime=110, tx_flags_seen=0x1b))
    >>> changed_text(old, new, ("lifetime", "flags", "tx_flags_seen"), now=100)
    'expires=21700 → 110 (remaining: 21600 → 10 sec(s))  Flags=0x0010 → 0x0013 [ +RxClosing +TxClosing ]  TxFlagsSeen=0x1a → 0x1b'
"""
from __future__ import annotations

import html
import socket
from typing import Mapping, Sequence

from labkit.maps.ct import CtDiff, CtFlags, CtRow
from labkit.release import profile

__all__ = ["flag_change", "field_change", "changed_text", "diff_html", "records_html"]

#: Row-grammar names of CtRow fields, and whether the grammar prints them in hex.
_GRAMMAR = {
    "packets": ("Packets", False),
    "bytes": ("Bytes", False),
    "rx_flags_seen": ("RxFlagsSeen", True),
    "last_rx_report": ("LastRxReport", False),
    "tx_flags_seen": ("TxFlagsSeen", True),
    "last_tx_report": ("LastTxReport", False),
    "rev_nat": ("RevNAT", False),
    "src_sec_id": ("SourceSecurityID", False),
    "backend_id": ("BackendID", False),
}


def flag_change(old: int, new: int) -> str:
    """``Flags=0x0010 → 0x0013 [ +RxClosing +TxClosing ]``: the flag word in hex, then the names
    set (+) and cleared (−).

    >>> flag_change(0x0013, 0x0010)
    'Flags=0x0013 → 0x0010 [ −RxClosing −TxClosing ]'
    """
    gained = [f"+{n}" for n in CtFlags.names(new & ~old)]
    lost = [f"−{n}" for n in CtFlags.names(old & ~new)]
    names = " ".join(gained + lost)
    return f"Flags={old:#06x} → {new:#06x} [ {names + ' ' if names else ''}]"


def field_change(name: str, old: CtRow, new: CtRow, now: int | None = None) -> str:
    """One changed field of a CT row, as the row grammar names and prints it.

    >>> from labkit.maps.ct import CtEntry, CtKey4, CtRow
    >>> k = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, 0)
    >>> a, b = CtRow.of(k, CtEntry(packets=3, rx_flags_seen=0x12)), CtRow.of(k, CtEntry(packets=5, rx_flags_seen=0x13))
    >>> field_change("packets", a, b), field_change("rx_flags_seen", a, b)
    ('Packets=3 → 5', 'RxFlagsSeen=0x12 → 0x13')
    """
    before, after = getattr(old, name), getattr(new, name)
    if name == "flags":
        return flag_change(before, after)
    if name == "lifetime":
        remaining = f" (remaining: {before - now} → {after - now} sec(s))" if now is not None else ""
        return f"expires={before} → {after}{remaining}"
    if name == "ifindex":
        rel = profile(new.release)
        if rel.has("ct_list_nat_port"):
            return f"NatPort={socket.ntohs(before)} → {socket.ntohs(after)}"
        return f"IfIndex={before} → {after}"
    label, hexed = _GRAMMAR.get(name, (name, False))
    if hexed:
        return f"{label}={before:#04x} → {after:#04x}"
    return f"{label}={before} → {after}"


def changed_text(old: CtRow, new: CtRow, fields: Sequence[str], now: int | None = None) -> str:
    """The changed fields of a row, in the grammar's order, two spaces apart (see the module's example)."""
    return "  ".join(field_change(f, old, new, now) for f in fields)


_COLOURS = {"+": "#d4f7d4", "−": "#f7d4d4", "~": "#f7f3c8"}


def diff_html(diffs: Mapping[str, CtDiff], now: int) -> str:
    """The CT rows a step added (+), removed (−) and changed (~), one table row each: node, mark, then
    the row in the row grammar. Left-aligned, fixed column widths, the node never wrapped.

    >>> from labkit.maps.ct import CtEntry, CtKey4, CtRow, diff_rows
    >>> k = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, 0)
    >>> page = diff_html({"node-a": diff_rows([], [CtRow.of(k, CtEntry(lifetime=160))])}, now=100)
    >>> "remaining: 60 sec(s)" in page and "white-space:nowrap" in page
    True
    """
    rows = []
    for node, d in diffs.items():
        rows += [(node, "+", r.line(now)) for r in d.added]
        rows += [(node, "−", r.line(now)) for r in d.removed]
        for old, new, fields_ in d.changed:
            head = f"{new.proto_name} {new.dir} {new.flow()}{' related' if new.related else ''}"
            rows.append((node, "~", f"{head}  {changed_text(old, new, fields_, now)}"))
    if not rows:
        return "<p class='lk-diff'><i>No CT row changed.</i></p>"
    cell = "text-align:left;vertical-align:top;padding:1px 6px"
    body = "".join(
        f"<tr style='background:{_COLOURS[m]}'><td class='lk-node' style='{cell};white-space:nowrap'>"
        f"{html.escape(n)}</td><td style='{cell}'>{m}</td><td style='{cell}'><code>{html.escape(t)}</code></td></tr>"
        for n, m, t in rows
    )
    return ("<table class='lk-diff' style='font-size:11px;table-layout:fixed;width:100%;border-collapse:collapse'>"
            "<colgroup><col style='width:7em'><col style='width:1.5em'><col></colgroup>"
            f"<tr><th style='{cell}'>node</th><th style='{cell}'></th><th style='{cell}'>CT row "
            f"(cilium-dbg bpf ct list global)</th></tr>{body}</table>")


def records_html(lines: Sequence[str]) -> str:
    """The raw timestamped records, folded under a disclosure.

    >>> records_html(["a", "b"]).startswith("<details class='lk-records'><summary>2 trace records")
    True
    """
    text = html.escape("\n".join(lines)) if lines else "(no packets)"
    return (f"<details class='lk-records'><summary>{len(lines)} trace records (raw, timestamped)</summary>"
            f"<pre style='font-size:11px;white-space:pre'>{text}</pre></details>")
