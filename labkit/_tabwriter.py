"""Go's ``text/tabwriter``, cell for cell: how the Cilium CLI lines up its tables.

Cilium's ``cilium-dbg`` prints its tables through ``tabwriter.NewWriter(os.Stdout,
5, 0, 3, ' ', 0)`` (:data:`CILIUM`). Go's rules, which this module follows:

- text is cut into *cells* by ``\\t`` (and ``\\v``, a "soft" tab); ``\\n`` ends a
  line, ``\\f`` ends a line and flushes;
- only tab-*terminated* cells are aligned: the text after a line's last tab is
  a cell of no column and is written as it is, without padding;
- a column is a block of consecutive lines that all have a terminated cell at
  that position; its width is the widest cell plus ``padding``, at least
  ``minwidth``; every cell of the block, the last one of a line included, is
  padded to it. A line ``"a\\tb\\t\\n"`` therefore ends in spaces.

Widths count characters (Go counts runes). Not ported: the Escape character and
the FilterHTML and StripEscape flags (no Cilium table uses them).

    >>> print(tabwrite("ID\\tFrontend\\t\\n1\\t198.19.0.10:80\\t\\n").replace(" ", "."))
    ID...Frontend.........
    1....198.19.0.10:80...
    <BLANKLINE>
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TabWriter", "tabwrite", "CILIUM", "ALIGN_RIGHT", "DISCARD_EMPTY_COLUMNS", "TAB_INDENT", "DEBUG"]

# Go's flag bits (text/tabwriter: FilterHTML = 1, StripEscape = 2 are not supported).
ALIGN_RIGHT = 1 << 2
DISCARD_EMPTY_COLUMNS = 1 << 3
TAB_INDENT = 1 << 4
DEBUG = 1 << 5
_UNSUPPORTED = 0b11

#: ``tabwriter.NewWriter(os.Stdout, 5, 0, 3, ' ', 0)``: what cilium-dbg's tables use
#: (cilium-dbg/cmd/service_list.go, cilium-dbg/cmd/helpers.go TablePrinter).
CILIUM = {"minwidth": 5, "tabwidth": 0, "padding": 3, "padchar": " ", "flags": 0}


@dataclass
class _Cell:
    text: str = ""
    htab: bool = False  # terminated by '\t' (not '\v')

    @property
    def width(self) -> int:
        return len(self.text)


class TabWriter:
    """One Go ``tabwriter.Writer``: :meth:`write` text, :meth:`flush`, read :attr:`out`.

    >>> w = TabWriter(minwidth=8, tabwidth=0, padding=1, padchar=".")
    >>> w.write("e) foo\\tbar\\t\\n"); w.flush(); w.out
    'e) foo..bar.....\\n'
    """

    def __init__(self, minwidth: int, tabwidth: int, padding: int, padchar: str = " ", flags: int = 0):
        if minwidth < 0 or tabwidth < 0 or padding < 0:
            raise ValueError(f"tabwriter: expected minwidth, tabwidth and padding >= 0, got "
                             f"{minwidth}, {tabwidth}, {padding}")
        if len(padchar) != 1:
            raise ValueError(f"tabwriter: expected one padding character, got {padchar!r}")
        if flags & _UNSUPPORTED:
            raise ValueError("tabwriter: FilterHTML and StripEscape are not supported")
        self.minwidth, self.tabwidth, self.padding, self.padchar = minwidth, tabwidth, padding, padchar
        self.flags = flags & ~ALIGN_RIGHT if padchar == "\t" else flags  # tab padding aligns left
        self.out = ""
        self._reset()

    def _reset(self) -> None:
        self._lines: list[list[_Cell]] = [[]]
        self._cell = _Cell()
        self._widths: list[int] = []

    def write(self, text: str) -> None:
        """Add text; lines are written out whenever no later line can change them."""
        for ch in text:
            if ch not in "\t\v\n\f":
                self._cell.text += ch
                continue
            self._cell.htab = ch == "\t"
            line = self._lines[-1]
            line.append(self._cell)
            self._cell = _Cell()
            if ch in "\n\f":
                self._lines.append([])
                # A line of one cell takes part in no column: what came before is final.
                if ch == "\f" or len(line) == 1:
                    self.flush()
                    if ch == "\f" and self.flags & DEBUG:
                        self.out += "---\n"

    def flush(self) -> None:
        """Write out everything buffered (a trailing cell without a tab ends the last line)."""
        if self._cell.text:
            self._lines[-1].append(self._cell)
            self._cell = _Cell()
        self._format(0, len(self._lines))
        self._reset()

    def _format(self, line0: int, line1: int) -> None:
        column = len(self._widths)
        this = line0
        while this < line1:
            if column < len(self._lines[this]) - 1:
                # A cell in this column: write the lines above it, then measure the block.
                self._write_lines(line0, this)
                line0 = this
                width, discardable = self.minwidth, True
                while this < line1 and column < len(self._lines[this]) - 1:
                    c = self._lines[this][column]
                    width = max(width, c.width + self.padding)
                    discardable = discardable and c.width == 0 and not c.htab
                    this += 1
                if discardable and self.flags & DISCARD_EMPTY_COLUMNS:
                    width = 0
                self._widths.append(width)
                self._format(line0, this)  # the columns right of this one
                self._widths.pop()
                line0 = this
            else:
                this += 1
        self._write_lines(line0, line1)

    def _write_lines(self, line0: int, line1: int) -> None:
        for i in range(line0, line1):
            use_tabs = bool(self.flags & TAB_INDENT)
            for j, c in enumerate(self._lines[i]):
                if j > 0 and self.flags & DEBUG:
                    self.out += "|"
                if not c.text:
                    if j < len(self._widths):
                        self._pad(0, self._widths[j], use_tabs)
                    continue
                use_tabs = False
                if self.flags & ALIGN_RIGHT:
                    if j < len(self._widths):
                        self._pad(c.width, self._widths[j], False)
                    self.out += c.text
                else:
                    self.out += c.text
                    if j < len(self._widths):
                        self._pad(c.width, self._widths[j], False)
            if i + 1 < len(self._lines):
                self.out += "\n"

    def _pad(self, textw: int, cellw: int, use_tabs: bool) -> None:
        if self.padchar == "\t" or use_tabs:
            if self.tabwidth == 0:
                return  # tabs have no width: no padding possible
            cellw = (cellw + self.tabwidth - 1) // self.tabwidth * self.tabwidth
            self.out += "\t" * ((cellw - textw + self.tabwidth - 1) // self.tabwidth)
            return
        self.out += self.padchar * (cellw - textw)


def tabwrite(text: str, minwidth: int = 5, tabwidth: int = 0, padding: int = 3, padchar: str = " ",
             flags: int = 0) -> str:
    """``text`` through a fresh writer, flushed; the defaults are :data:`CILIUM`'s.

    >>> tabwrite("a\\tb\\tc\\n" "aa\\tbbb\\tcccc\\n" "aaa\\tbbbb\\n", 2, 0, 0, " ")
    'a  b  c\\naa bbbcccc\\naaabbbb\\n'
    """
    w = TabWriter(minwidth, tabwidth, padding, padchar, flags)
    w.write(text)
    w.flush()
    return w.out
