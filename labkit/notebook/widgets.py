"""A live connection-tracking table for JupyterLab: what is in a node's CT maps,
what appeared, what changed and what went away since the last look.

Two layers:

* :func:`render_table` is a pure function, CT rows in, one HTML ``<table>`` out.
  ``previous`` (the rows of the last refresh) switches on highlighting, matched
  by :attr:`CtRow.ident <labkit.maps.ct.CtRow.ident>`: new rows green
  (``lk-added``), changed rows yellow (``lk-changed``) with the moved cells in
  bold, rows gone since then once more, struck through (``lk-removed``).
  Rows past their lifetime on the lab clock are grey (``lk-expired``).
  ``columns`` leaves out columns (a view choice: the rows stay the same).
* :class:`CtTable` wraps it in core ipywidgets: a header with the node, the lab
  clock and the real command that shows the same maps, filter controls, a column
  chooser, the table (fixed height, it scrolls on its own both ways inside its
  box and keeps its scroll position across refreshes) and a status line.
  :func:`watch` builds one and refreshes it. Refreshes keep the filters and the
  chosen columns.

A table outlives its kernel on the page: after a kernel restart, or in a
notebook saved with its widget state and opened again, JupyterLab still draws
the last table from the saved widget state, and a line above it says the table
belongs to a kernel that has stopped and to re-run the cell (it shows only
while the widget has no live kernel behind it). Where no widget can be drawn at
all (an untrusted notebook, a static viewer, a notebook whose widget state was
never saved while its kernel lived: :mod:`labkit.notebook.widgetstate`) the
cell's ``text/html`` output shows the same sentence above the table as it was
when it was displayed.

In a notebook::

    >>> table = lab.watch("node-a")             # doctest: +SKIP
    >>> table                                   # doctest: +SKIP
    >>> table.start(1.0)                        # doctest: +SKIP
    >>> table.stop()                            # doctest: +SKIP

Without a kernel, the table is plain HTML:

    >>> from labkit.maps.ct import CtEntry, CtKey4, CtRow
    >>> key = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, 0)
    >>> old = CtRow.of(key, CtEntry(lifetime=1100, packets=1))
    >>> new = CtRow.of(key, CtEntry(lifetime=1100, packets=2))
    >>> html = render_table([new], previous=[old], now=1000)
    >>> html.count("<tr"), html.count('<tr class="lk-changed"'), '>100 s</td>' in html
    (2, 1, True)
"""
from __future__ import annotations

import functools
import html as _html
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from labkit.errors import NotFoundError
from labkit.maps.ct import CT_MAPS, CtFlags, CtRow, TcpFlags, diff_rows

__all__ = ["Filters", "render_table", "CtTable", "watch", "COLUMNS", "PROTO_CHOICES", "TABLE_HEIGHT",
           "STOPPED_NOTICE"]

#: Choices of the protocol filter: (label, value) pairs, value None for all.
PROTO_CHOICES = (("All", None), ("TCP", "TCP"), ("UDP", "UDP"), ("ICMP", "ICMP"))
#: Height of the scrolling table area of :class:`CtTable`.
TABLE_HEIGHT = "320px"

_COLUMNS = (
    "proto", "dir", "src", "dst", "flags", "rx seen", "tx seen",
    "packets", "bytes", "expires", "remaining", "rev nat", "backend",
)
#: The table's column names, in order (what ``columns`` of :func:`render_table` chooses from).
COLUMNS = _COLUMNS
#: What a table whose kernel has stopped says above its last rows.
STOPPED_NOTICE = ("This table belongs to a kernel that has stopped: the rows below are the last ones it showed "
                  "and they no longer change. To see a live table, re-run this cell.")
# Which columns show a CtRow field (diff_rows' field names), for the changed-cell emphasis.
_FIELD_COLUMNS = {
    "flags": (4,),
    "rx_flags_seen": (5,),
    "tx_flags_seen": (6,),
    "packets": (7,),
    "bytes": (8,),
    "lifetime": (9, 10),
    "rev_nat": (11,),
    "backend_id": (12,),
}
_NUMERIC = frozenset({7, 8, 9, 10, 11, 12})
_DIR_ORDER = {"OUT": 0, "IN": 1, "SVC": 2}
_MAP_ORDER = {name: i for i, name in enumerate(CT_MAPS)}

# Scoped by the lk-ct class: the style lands in the page once the HTML is shown.
_STYLE = """<style>
.lk-ct{line-height:1.35;font-size:var(--jp-code-font-size,12px)}
.lk-ct table{border-collapse:collapse;min-width:100%;font-family:var(--jp-code-font-family,monospace)}
.lk-ct th,.lk-ct td{padding:1px 8px;text-align:left;white-space:nowrap;
  border-bottom:1px solid var(--jp-border-color2,#e0e0e0)}
.lk-ct th{position:sticky;top:0;z-index:1;background:var(--jp-layout-color2,#eee);font-weight:600}
.lk-ct td.lk-num,.lk-ct th.lk-num{text-align:right}
.lk-ct tr.lk-added td{background:rgba(46,160,67,.22)}
.lk-ct tr.lk-changed td{background:rgba(212,167,44,.25)}
.lk-ct tr.lk-changed td.lk-diff{font-weight:700;background:rgba(212,167,44,.5)}
.lk-ct tr.lk-removed td{text-decoration:line-through;opacity:.6;background:rgba(248,81,73,.12)}
.lk-ct tr.lk-expired td{color:var(--jp-ui-font-color3,#999)}
.lk-ct .lk-rel{font-size:85%;color:var(--jp-ui-font-color2,#666)}
.lk-ct .lk-empty{padding:6px 8px;color:var(--jp-ui-font-color2,#666);font-style:italic}
</style>"""

_ALL = tuple(range(len(_COLUMNS)))


@functools.lru_cache(maxsize=64)
def _head(shown: tuple[int, ...]) -> str:
    return ('<thead><tr>'
            + "".join(f'<th class="lk-num">{_COLUMNS[i]}</th>' if i in _NUMERIC else f"<th>{_COLUMNS[i]}</th>"
                      for i in shown)
            + "</tr></thead>")


def _column_indexes(columns: Iterable[str] | None) -> tuple[int, ...]:
    """Indexes of the named columns in table order (None: all); a name the table lacks is refused.

    >>> _column_indexes(["src", "proto"]), _column_indexes(None) == tuple(range(len(COLUMNS)))
    ((0, 2), True)
    """
    if columns is None:
        return _ALL
    names = [columns] if isinstance(columns, str) else list(columns)
    unknown = [n for n in names if n not in _COLUMNS]
    if unknown:
        raise NotFoundError(f"CT table: no column {', '.join(map(repr, unknown))}; expected some of {', '.join(_COLUMNS)}")
    wanted = set(names)
    return tuple(i for i, name in enumerate(_COLUMNS) if name in wanted)


@dataclass(frozen=True)
class Filters:
    """Which rows to show.

    ``text``: case-insensitive substring of ``"src:sport dst:dport"`` or of the
    row's ``ct list`` line (blank: any); ``proto``: None (all) or a protocol
    name such as ``'TCP'``, ``'UDP'``, ``'ICMP'``; ``hide_related``: leave out
    the RELATED twins (the ``related`` rows of ``cilium_ct_any4_global``).

    >>> Filters(text=" 8080 ", proto="tcp")
    Filters(text='8080', proto='TCP', hide_related=False)
    """

    text: str = ""
    proto: str | None = None
    hide_related: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", (self.text or "").strip())
        proto = (self.proto or "").strip().upper()
        object.__setattr__(self, "proto", None if proto in ("", "ALL") else proto)

    @property
    def active(self) -> bool:
        """True when some row could be left out."""
        return bool(self.text or self.proto or self.hide_related)

    def match(self, row: CtRow) -> bool:
        """Whether ``row`` passes.

        >>> from labkit.maps.ct import CtEntry, CtKey4, CtRow
        >>> row = CtRow.of(CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, 0), CtEntry())
        >>> Filters("2.11:8080").match(row), Filters(proto="UDP").match(row)
        (True, False)
        """
        if self.proto is not None and row.proto_name.upper() != self.proto:
            return False
        if self.hide_related and row.related:
            return False
        if self.text:
            needle = self.text.lower()
            if needle in f"{row.src}:{row.sport} {row.dst}:{row.dport}".lower():
                return True
            return needle in row.line().lower()
        return True


@dataclass(frozen=True)
class _Stats:
    total: int = 0  #: rows in the dump
    shown: int = 0  #: rows of the dump that pass the filters
    added: int = 0
    changed: int = 0
    removed: int = 0  #: gone since the previous dump (shown struck through)


@functools.lru_cache(maxsize=4096)
def _ct_flags_text(value: int) -> str:
    return " ".join(CtFlags.names(value)) or "-"


@functools.lru_cache(maxsize=1024)
def _tcp_flags_text(value: int) -> str:
    return TcpFlags.text(value)


def _ip_order(ip: str) -> tuple:
    try:
        return (0, socket.inet_aton(ip))
    except OSError:
        return (1, ip)


def _order(row: CtRow) -> tuple:
    return (
        _MAP_ORDER.get(row.map, len(_MAP_ORDER)), row.map,
        _DIR_ORDER.get(row.dir, len(_DIR_ORDER)), row.dir,
        _ip_order(row.src), row.sport, _ip_order(row.dst), row.dport,
        row.related, row.proto, row.key,
    )


#: html.escape remembered: a table's cells repeat a few protocol names, directions, flags and addresses
_escaped = functools.lru_cache(maxsize=8192)(_html.escape)


def _cells(row: CtRow, now: int | None) -> list[str]:
    """Cell contents of one row, already escaped (the remaining cell carries its own markup)."""
    esc = _escaped
    direction = esc(row.dir)
    if row.related:
        direction += ' <span class="lk-rel">related</span>'
    if now is None:
        remaining = ""
    else:
        left = row.lifetime - now
        remaining = f"{left} s" if left >= 0 else "expired"
    return [
        esc(row.proto_name),
        direction,
        f"{esc(row.src)}:{row.sport}",
        f"{esc(row.dst)}:{row.dport}",
        esc(_ct_flags_text(row.flags)),
        _tcp_flags_text(row.rx_flags_seen),
        _tcp_flags_text(row.tx_flags_seen),
        str(row.packets),
        str(row.bytes),
        str(row.lifetime),
        remaining,
        str(row.rev_nat),
        str(row.backend_id),
    ]


def _was(old: CtRow, column: int, now: int | None) -> str:
    """``was …`` tooltip of a changed cell."""
    if column == 10:
        return "" if now is None else f"was {old.lifetime - now} s"
    return "was " + _cells(old, None)[column]


def _render(
    rows: Sequence[CtRow],
    previous: Iterable[CtRow] | None,
    now: int | None,
    filters: Filters | None,
    shown_columns: tuple[int, ...] = _ALL,
) -> tuple[str, _Stats]:
    filters = filters or Filters()
    keep = filters.match if filters.active else None
    added: set = set()
    changed: dict = {}
    removed: Sequence[CtRow] = ()
    if previous is not None:
        diff = diff_rows(previous, rows)
        added = {r.ident for r in diff.added}
        changed = {new.ident: (old, fields) for old, new, fields in diff.changed}
        removed = diff.removed
    shown = [r for r in rows if keep(r)] if keep else list(rows)
    gone = [r for r in removed if keep(r)] if keep else list(removed)
    items = [(r, False) for r in shown] + [(r, True) for r in gone]
    items.sort(key=lambda item: _order(item[0]))

    out = [_STYLE, '<div class="lk-ct"><table>', _head(shown_columns), "<tbody>"]
    plain = {i: ' class="lk-num"' if i in _NUMERIC else "" for i in shown_columns}  #: a cell's attributes
    n_added = n_changed = 0
    for row, is_gone in items:
        classes = []
        diff_cols: dict[int, str] = {}
        ident = row.ident
        if is_gone:
            classes.append("lk-removed")
        elif ident in added:
            classes.append("lk-added")
            n_added += 1
        elif ident in changed:
            classes.append("lk-changed")
            n_changed += 1
            old, fields = changed[ident]
            for f in fields:
                for col in _FIELD_COLUMNS.get(f, ()):
                    diff_cols[col] = _was(old, col, now)
        expired = now is not None and row.lifetime < now
        if expired:
            classes.append("lk-expired")
        out.append(f'<tr class="{" ".join(classes)}">' if classes else "<tr>")
        cells = _cells(row, now)
        if not diff_cols and not expired and not is_gone:  # most rows of a refresh: no cell carries a title
            out.append("".join(f"<td{plain[i]}>{cells[i]}</td>" for i in shown_columns))
            out.append("</tr>")
            continue
        for i in shown_columns:
            text = cells[i]
            cls = []
            if i in _NUMERIC:
                cls.append("lk-num")
            if i in diff_cols:
                cls.append("lk-diff")
            title = diff_cols.get(i, "")
            if i == 10 and expired:
                title = f"expired {now - row.lifetime} s ago" + (f"; {title}" if title else "")
            if i == 0 and is_gone:
                title = "gone since the last refresh"
            attrs = (f' class="{" ".join(cls)}"' if cls else "") + (f' title="{_html.escape(title)}"' if title else "")
            out.append(f"<td{attrs}>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table>")
    if not shown_columns:
        out.append('<div class="lk-empty">every column is hidden: choose some in "columns"</div>')
    elif not items:
        why = "no rows match the filters" if rows else "no CT entries"
        out.append(f'<div class="lk-empty">{why}</div>')
    out.append("</div>")
    stats = _Stats(total=len(rows), shown=len(shown), added=n_added, changed=n_changed, removed=len(gone))
    return "".join(out), stats


def render_table(
    rows: Iterable[CtRow],
    previous: Iterable[CtRow] | None = None,
    now: int | None = None,
    filters: Filters | None = None,
    columns: Iterable[str] | None = None,
) -> str:
    """HTML of a CT table: a scoped ``<style>``, then one ``<tr>`` per shown row below the header row.

    Columns: proto, dir (with ``related`` for RELATED twins), src, dst, flags (names),
    rx seen, tx seen (``SYN|ACK`` style), packets, bytes, expires (the lifetime on the
    lab clock), remaining (``lifetime - now``; ``expired`` and the row grey once
    negative; blank without ``now``), rev nat, backend. Rows sort by map (TCP map
    first), dir (OUT, IN, SVC), src, sport, dst, dport.

    ``previous``: the rows of the last refresh; with it, rows are marked ``lk-added``
    (green), ``lk-changed`` (yellow, moved cells ``lk-diff`` with a ``was …``
    tooltip) or, for rows no longer there, shown once more as ``lk-removed``
    (struck through). Without it nothing is highlighted. ``filters`` apply to all
    of these. ``columns``: the names (of :data:`COLUMNS`) of the columns to show,
    in table order whatever order they are given in (None: all); the rows are the
    same whichever are shown. Every text is HTML-escaped.

    >>> from labkit.maps.ct import CtEntry, CtKey4, CtRow
    >>> def row(sport, proto=6, lifetime=1100):
    ...     key = CtKey4.make("198.18.1.11", "198.18.2.11", sport, 8080, proto, 0)
    ...     return CtRow.of(key, CtEntry(lifetime=lifetime, tx_flags_seen=0x02))
    >>> a, b, c = row(40000), row(40001), row(40002, lifetime=900)
    >>> html = render_table([a, c], previous=[a, b], now=1000)
    >>> html.count("<tr"), html.count('<tr class="lk-added'), html.count('<tr class="lk-removed')
    (4, 1, 1)
    >>> html.count(' lk-expired"'), html.count(">expired</td>")
    (1, 1)
    >>> render_table([a, c], filters=Filters(text=":40002")).count("<tr")
    2
    >>> narrow = render_table([a, c], columns=["src", "dst"])
    >>> narrow.count("</th>"), narrow.count("</td>"), ">proto</th>" in narrow
    (2, 4, False)
    """
    html, _ = _render(list(rows), previous, now, filters, _column_indexes(columns))
    return html


# -- the live widget --------------------------------------------------------------------

_MONO = "font-family:var(--jp-code-font-family,monospace);font-size:var(--jp-code-font-size,12px)"

# The notice over a table whose kernel has stopped. ipywidgets marks the element of every view whose
# model has no live kernel connection with the class jupyter-widgets-disconnected (after a kernel
# restart, and for every view drawn from widget state saved in the notebook): only then it shows,
# in place of ipywidgets' own broken-link icon on each widget of the table; what only a live table
# does (the auto-refresh note) is hidden, and the filter controls and column boxes, which no kernel
# would answer any more, are greyed and take no clicks.
_BOX_CLASS = "lk-ct-box"
_STOPPED_CSS = (
    "<style>.lk-ct-stopped{display:none}"
    f".{_BOX_CLASS} .jupyter-widgets-disconnected::before{{display:none}}"
    ".jupyter-widgets-disconnected .lk-ct-live-only{display:none}"
    f".{_BOX_CLASS}.jupyter-widgets-disconnected input,.{_BOX_CLASS}.jupyter-widgets-disconnected select"
    "{pointer-events:none;opacity:.5}"
    ".jupyter-widgets-disconnected .lk-ct-stopped{display:block;margin:4px 0;padding:4px 8px;"
    "border-left:4px solid var(--jp-warn-color0,#e65100);background:var(--jp-warn-color3,#fff3e0);"
    "color:var(--jp-ui-font-color0,#000);font-weight:600;line-height:1.4}</style>"
)
_STOPPED_DIV = f'<div class="lk-ct-stopped">{_html.escape(STOPPED_NOTICE)}</div>'


class CtTable:
    """A live CT table of one node, built from core ipywidgets.

    ``refresh()`` reads ``lab.ct(node)`` and ``lab.clock.now()`` and only sets widget
    values (safe from the timer thread; it never prints). It never raises either: a
    failed read leaves the last table in place and puts the error in the status line
    (and in :attr:`last_error`). Changing a filter, or a column in the "columns"
    chooser (:attr:`column_boxes`, all ticked at first), re-renders the rows of the
    last refresh without reading the maps; refreshes keep both. The table scrolls
    both ways inside its own box, so a narrow notebook reaches every column.
    ``interval`` is the default period of :meth:`start`; nothing runs until
    :meth:`start` (or :func:`watch`) is called.

    Its ``text/html`` output (what a page shows where the widget cannot be drawn)
    is :data:`STOPPED_NOTICE` over the table as it was when displayed.

    >>> table = CtTable(lab, "node-a")          # doctest: +SKIP
    >>> table.refresh()                         # doctest: +SKIP
    True
    >>> table                                   # doctest: +SKIP
    """

    def __init__(self, lab: Any, node: str, interval: float | None = None):
        import ipywidgets as w

        self.lab = lab
        self.node = node
        self.interval = interval
        topo_node = lab.topology.node(node)  # NotFoundError (listing the nodes) for a wrong name
        self._node_ip = getattr(topo_node, "ip", None)
        self._commands = list(lab.ct_command(node))
        self._lock = threading.RLock()
        self._rows: list[CtRow] | None = None
        self._previous: list[CtRow] | None = None
        self._now: int | None = None
        self._refreshed_at: float | None = None
        self._stats = _Stats()
        self._thread: threading.Thread | None = None
        self._stop_event: threading.Event | None = None
        self._running_interval: float | None = None
        self._closed = False
        self._batch = False  # True while the columns setter ticks boxes
        #: The exception of the last failed refresh (None after a good one).
        self.last_error: BaseException | None = None
        self._error_at: float | None = None
        #: How many refreshes read the maps successfully.
        self.refresh_count = 0

        self.header = w.HTML(layout=w.Layout(width="auto"))
        self.text = w.Text(
            placeholder="address or port", description="filter", continuous_update=True,
            layout=w.Layout(width="260px"),
        )
        self.proto = w.Dropdown(options=list(PROTO_CHOICES), index=0, description="proto",  # "All", value None
                                layout=w.Layout(width="160px"))
        self.hide_related = w.Checkbox(value=False, description="hide RELATED twins", indent=False,
                                       layout=w.Layout(width="auto"))
        #: One checkbox per column of :data:`COLUMNS`, by name: ticked, the column is shown.
        self.column_boxes = {
            name: w.Checkbox(value=True, description=name, indent=False, layout=w.Layout(width="auto"))
            for name in _COLUMNS
        }
        self.chooser = w.Accordion(
            children=[w.HBox(list(self.column_boxes.values()), layout=w.Layout(flex_flow="row wrap"))],
            selected_index=None,
        )
        # The fixed height and overflow live on the widget's own element, which survives value
        # updates, so the browser keeps the scroll position while the rows are replaced. Its
        # width is the box's less its margins (auto; min_width 0: never its content's), so rows wider
        # than the notebook scroll sideways inside it and the box never reaches past the cell's output.
        self.table = w.HTML(layout=w.Layout(height=TABLE_HEIGHT, overflow="auto", width="auto", min_width="0",
                                            border="1px solid var(--jp-border-color2, #ddd)"))
        self.status = w.HTML(layout=w.Layout(width="auto"))
        self.controls = w.HBox([self.text, self.proto, self.hide_related], layout=w.Layout(flex_flow="row wrap"))
        self._box = w.VBox([self.header, self.controls, self.chooser, self.table, self.status],
                           layout=w.Layout(width="100%", max_width="100%", min_width="0"))
        self._box.add_class(_BOX_CLASS)
        for control in (self.text, self.proto, self.hide_related):
            control.observe(self._on_filter, names="value")
        for box in self.column_boxes.values():
            box.observe(self._on_filter, names="value")
        self._update_chooser_title()
        self._update_header()
        self._render_empty()
        self._update_status()

    # -- reading ------------------------------------------------------------------------
    @property
    def widget(self):
        """The ipywidgets VBox (header, filters, column chooser, table, status)."""
        return self._box

    @property
    def columns(self) -> tuple[str, ...]:
        """The names of the shown columns, in table order (the chooser's ticked boxes)."""
        return tuple(name for name, box in self.column_boxes.items() if box.value)

    @columns.setter
    def columns(self, names: Iterable[str] | None) -> None:
        """Show these columns (None: all), as ticking them in the chooser would."""
        shown = {_COLUMNS[i] for i in _column_indexes(names)}
        with self._lock:
            self._batch = True  # one re-render for all the boxes, not one per box
            try:
                for name, box in self.column_boxes.items():
                    box.value = name in shown
            finally:
                self._batch = False
            self._on_filter()

    @property
    def filters(self) -> Filters:
        """The filters as the controls set them."""
        return Filters(self.text.value, self.proto.value, bool(self.hide_related.value))

    @property
    def rows(self) -> list[CtRow]:
        """The rows of the last good refresh (all of them, unfiltered)."""
        return list(self._rows or [])

    @property
    def running(self) -> bool:
        """True while the timer thread refreshes."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def _repr_mimebundle_(self, **kwargs):
        bundle = self._box._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):  # a frontend that cannot draw the widget shows the last table instead
            bundle = {**bundle, "text/html": self.static_html()}
        return bundle

    def static_html(self) -> str:
        """The table as it is now, as plain HTML under :data:`STOPPED_NOTICE`: the cell's ``text/html`` output.

        >>> "re-run this cell" in CtTable(lab, "node-a").static_html()   # doctest: +SKIP
        True
        """
        with self._lock:
            notice = (f'<div class="lk-ct-stopped-static" style="margin:4px 0;padding:4px 8px;'
                      f'border-left:4px solid #e65100;font-weight:600">{_html.escape(STOPPED_NOTICE)}</div>')
            status = re.sub(r'<span class="lk-ct-live-only">.*?</span>', "", self.status.value)
            rows = (f'<div style="max-height:{TABLE_HEIGHT};overflow:auto;border:1px solid #ddd">'
                    f'{self.table.value}</div>')
            return f'<div class="lk-ct-static">{notice}{self._header_html()}{rows}{status}</div>'

    def __repr__(self) -> str:
        n = "-" if self._rows is None else len(self._rows)
        return f"CtTable(node={self.node!r}, rows={n}, running={self.running})"

    # -- refreshing ---------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read the node's CT maps and the lab clock, re-render; False (error in the status line) on failure."""
        with self._lock:
            if self._closed:
                return False
            try:
                rows = list(self.lab.ct(self.node))
                now = self.lab.clock.now()
                self._previous = self._rows
                self._rows, self._now, self._refreshed_at = rows, now, time.time()
                self.last_error = None
                self.refresh_count += 1
                self._render()
                self._update_header()
            except Exception as exc:  # noqa: BLE001 -- shown to the student instead of raised
                self.last_error, self._error_at = exc, time.time()
            self._update_status()
            return self.last_error is None

    def _on_filter(self, change=None) -> None:
        with self._lock:
            if self._closed or self._batch:
                return
            self._update_chooser_title()
            if self._rows is not None:
                self._render()
            else:
                self._render_empty()
            self._update_status()

    def _render(self) -> None:
        shown = _column_indexes(self.columns)
        html, self._stats = _render(self._rows or [], self._previous, self._now, self.filters, shown)
        self.table.value = html

    def _render_empty(self) -> None:
        self.table.value = _STYLE + '<div class="lk-ct"><div class="lk-empty">not read yet: call refresh()</div></div>'

    def _update_chooser_title(self) -> None:
        self.chooser.set_title(0, f"columns: {len(self.columns)} of {len(_COLUMNS)} shown")

    def _header_html(self) -> str:
        esc = _html.escape
        ip = f" ({esc(self._node_ip)})" if self._node_ip else ""
        now = "not read yet" if self._now is None else f"now = {self._now} s"
        cmds = "\n".join(esc(c) for c in self._commands)
        return (
            f'<div style="line-height:1.4"><b>CT table of {esc(self.node)}</b>{ip} · lab clock {now}</div>'
            f'<pre style="{_MONO};line-height:1.3;margin:2px 0;white-space:pre-wrap">{cmds}</pre>'
        )

    def _update_header(self) -> None:
        self.header.value = _STOPPED_CSS + _STOPPED_DIV + self._header_html()

    def _update_status(self) -> None:
        s = self._stats
        parts = []
        if self._rows is None:
            parts.append("no rows read yet")
        else:
            parts.append(f"{s.shown} of {s.total} rows shown")
            if self._previous is not None:
                parts.append(f"+{s.added} added, ~{s.changed} changed, -{s.removed} removed since the refresh before")
            stamp = time.strftime("%H:%M:%S", time.localtime(self._refreshed_at))
            parts.append(f"refreshed {stamp} (lab clock {self._now} s)")
        text = _html.escape(" · ".join(parts))
        if self._running_interval is not None and self.running:  # not said once the kernel has stopped
            text += f'<span class="lk-ct-live-only"> · auto-refresh every {self._running_interval:g} s</span>'

        if self.last_error is not None:
            err = f"{type(self.last_error).__name__}: {self.last_error}"
            stamp = time.strftime("%H:%M:%S", time.localtime(self._error_at))
            text += (
                f'<br><span class="lk-error" style="color:var(--jp-error-color1,#d32f2f)">'
                f"refresh failed at {stamp}: {_html.escape(err)}</span>"
            )
        self.status.value = f'<div style="{_MONO};line-height:1.4">{text}</div>'

    # -- the timer ----------------------------------------------------------------------
    def start(self, interval: float | None = None) -> "CtTable":
        """Refresh every ``interval`` seconds (default: the constructor's, else 1.0) on a daemon thread."""
        interval = interval if interval is not None else (self.interval if self.interval is not None else 1.0)
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ValueError(f"CtTable.start: expected an interval in seconds > 0, got {interval!r}")
        if self._closed:
            raise RuntimeError(f"CtTable of {self.node}: closed; make a new one with watch()")
        self.stop()
        stop = threading.Event()
        thread = threading.Thread(
            target=self._run, args=(stop, float(interval)), name=f"labkit-ct-{self.node}", daemon=True
        )
        with self._lock:
            self._stop_event, self._thread, self._running_interval = stop, thread, float(interval)
        thread.start()
        with self._lock:
            self._update_status()
        return self

    def _run(self, stop: threading.Event, interval: float) -> None:
        while not stop.wait(interval):
            self.refresh()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the timer and wait (up to ``timeout`` s) for its thread to end; no-op when not running."""
        with self._lock:
            stop, thread = self._stop_event, self._thread
            self._stop_event = self._thread = self._running_interval = None
        if stop is None:
            return
        stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            if not self._closed:
                self._update_status()

    def close(self) -> None:
        """Stop the timer and close the widgets; the table cannot be used afterwards."""
        self.stop()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            boxes = tuple(self.column_boxes.values())
            for control in (self.text, self.proto, self.hide_related) + boxes:
                control.unobserve(self._on_filter, names="value")
            for wid in (self.header, self.text, self.proto, self.hide_related, *boxes, self.chooser.children[0],
                        self.chooser, self.table, self.status, self.controls, self._box):
                wid.close()


def watch(lab: Any, node: str, interval: float | None = None) -> CtTable:
    """A :class:`CtTable` of ``node``, refreshed once; with ``interval`` its timer is started too.

    >>> table = watch(lab, "node-a", interval=1.0)   # doctest: +SKIP
    """
    table = CtTable(lab, node, interval=interval)
    table.refresh()
    if interval is not None:
        table.start(interval)
    return table
