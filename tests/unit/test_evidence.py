"""Unit tests for labkit.observe.evidence: the journal of what a notebook's cells recorded, and the view graders read."""
from __future__ import annotations

import pytest

from labkit.observe.evidence import Evidence, Journal, Snapshot


def test_latest_matches_kind_and_attributes():
    """latest() returns the newest record of a lab with the kind and every attribute given."""
    j = Journal()
    j.record("demo", "step", "open 1", data=1, op="tcp-open", actor="a1")
    j.record("demo", "step", "open 2", data=2, op="tcp-open", actor="a2")
    j.record("other", "step", "open 3", data=3, op="tcp-open", actor="a1")
    assert j.latest("demo", "step", actor="a1").data == 1
    assert j.latest("demo", "step", op="tcp-open").data == 2
    assert j.latest("demo", "step", actor=lambda a: a.startswith("a")).data == 2
    assert j.latest("demo", "snapshot") is None


def test_reset_forgets_only_that_lab():
    """Nothing recorded before a lab's reset is evidence; other labs keep theirs."""
    j = Journal()
    j.record("demo", "clock", "advance", now=5)
    j.record("demo-snat", "clock", "advance", now=6)
    j.reset("demo")
    assert j.find("demo") == [] and len(j.find("demo-snat")) == 1


def test_after_and_order():
    """after() lists the matching records made after a given one, oldest first."""
    j = Journal()
    first = j.record("demo", "fault", "on", fault="x", on=True)
    j.record("demo", "step", "s1")
    j.record("demo", "fault", "off", fault="x", on=False)
    assert [r.title for r in j.after(first, "demo")] == ["s1", "off"]


def test_journal_keeps_a_bounded_number():
    """Only the newest `keep` records stay."""
    j = Journal(keep=3)
    for i in range(5):
        j.record("demo", "clock", str(i))
    assert [r.title for r in j] == ["2", "3", "4"]


def test_unknown_kind_is_refused():
    """A record's kind is one of KINDS."""
    with pytest.raises(ValueError, match="expected one of"):
        Journal().record("demo", "rows", "x")


def test_evidence_view_reads_its_lab_and_variants():
    """Evidence reads one lab's steps and snapshots; variant() reads the notebook's second lab."""
    j = Journal()
    j.record("nb", "step", "open", data="main-step", op="tcp-open")
    j.record("nb-snat", "step", "open", data="snat-step", op="tcp-open")
    j.record("nb", "snapshot", "after", data=Snapshot("after", 10, {"node-a": ["row"]}, {}))
    ev = Evidence("nb", j)
    assert ev.step(op="tcp-open") == "main-step" and ev.variant("snat").step(op="tcp-open") == "snat-step"
    assert ev.snapshot("after").rows("node-a") == ["row"] and ev.snapshot("nothing") is None
