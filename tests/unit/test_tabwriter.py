"""labkit._tabwriter against Go's own text/tabwriter tests, and the Cilium CLI's set-up."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit import _tabwriter
from labkit._tabwriter import ALIGN_RIGHT, CILIUM, DEBUG, DISCARD_EMPTY_COLUMNS, TabWriter, tabwrite

# The cases of Go's src/text/tabwriter/tabwriter_test.go (golang/go), with their names, settings, src and expected
# output as there (data/go_tabwriter_cases.json). Left out: the cases that need the Escape character or FilterHTML
# (1b-1e, 7f, 7g, 9b, 13c), which labkit's port does not implement.
_FLAGS = {"AlignRight": ALIGN_RIGHT, "DiscardEmptyColumns": DISCARD_EMPTY_COLUMNS, "Debug": DEBUG}
GO_CASES = [(c["name"], c["minwidth"], c["tabwidth"], c["padding"], c["padchar"], sum(_FLAGS[f] for f in c["flags"]),
             c["src"], c["expected"])
            for c in json.loads((Path(__file__).parent / "data" / "go_tabwriter_cases.json").read_text())["cases"]]


@pytest.mark.parametrize("name, minwidth, tabwidth, padding, padchar, flags, src, expected", GO_CASES,
                         ids=[c[0] for c in GO_CASES])
def test_go_tabwriter_cases(name, minwidth, tabwidth, padding, padchar, flags, src, expected):
    """Each case of Go's tabwriter_test.go gives Go's output, written at once, byte by byte and in slices."""
    assert len(GO_CASES) == 40
    assert tabwrite(src, minwidth, tabwidth, padding, padchar, flags) == expected
    for step in (1, 2, 3, 5, 8):  # Go also writes byte by byte and in Fibonacci-sized slices
        w = TabWriter(minwidth, tabwidth, padding, padchar, flags)
        for i in range(0, len(src), step):
            w.write(src[i:i + step])
        w.flush()
        assert w.out == expected, step


def test_cilium_setup_pads_every_terminated_cell():
    """With Cilium's NewWriter(os.Stdout, 5, 0, 3, ' ', 0), a tab-terminated last cell is padded (trailing
    spaces), a last cell without a tab is not, and a short column is still 5 wide."""
    out = tabwrite("ID\tBackend\t\n1\t1 => 10.244.1.5:8080 (active)\t\n", **CILIUM)
    backend = "1 => 10.244.1.5:8080 (active)"  # 29 characters: the column is 29 + 3 wide
    assert out == "ID" + " " * 3 + "Backend" + " " * 25 + "\n" + "1" + " " * 4 + backend + " " * 3 + "\n"
    assert tabwrite("SERVICE ADDRESS\tBACKEND\nk\tv\t\n", **CILIUM) == (
        "SERVICE ADDRESS" + " " * 3 + "BACKEND\n" + "k" + " " * 17 + "v" + " " * 4 + "\n")  # v: minwidth 5


def test_columns_are_blocks_of_consecutive_lines():
    """A line without a cell in a column ends that column's block: the lines after it align anew."""
    assert tabwrite("aaaaaa\tb\t\nx\n" "c\td\t\n", **CILIUM) == (
        "aaaaaa" + " " * 3 + "b" + " " * 4 + "\nx\n" + "c" + " " * 4 + "d" + " " * 4 + "\n")


@pytest.mark.parametrize("args, match", [((-1, 0, 0), "minwidth"), ((0, 0, 0, "ab"), "one padding"),
                                         ((0, 0, 0, " ", 1), "FilterHTML")])
def test_rejects_what_go_rejects_or_labkit_lacks(args, match):
    """Negative sizes (Go panics), a padding string, and the unported HTML/escape flags are ValueErrors."""
    with pytest.raises(ValueError, match=match):
        TabWriter(*args)


