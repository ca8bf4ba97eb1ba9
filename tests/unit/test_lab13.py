"""labkit.grading.exercises.lab13: the graders of lab 13 over fabricated evidence (recorded views of the Hubble
ring and the steps of the connections they show), no kernel: right answers pass, each misconception of the
answer key fails with its own message, a missing view asks for its cell, a view read with a monitor fault on is
not graded as the learner's mistake."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from labkit.grading.checks import registry
from labkit.grading.exercises import lab13
from labkit.notebook.hubbleview import ObserveView
from labkit.observe.evidence import Evidence, Journal

PORT = 40000


def flow(point: str, syn: bool = False) -> dict:
    return {"flow": {"trace_observation_point": point, "l4": {"TCP": {"flags": {"SYN": True} if syn else {"ACK": True}}}}}


def lost(n: int) -> dict:
    return {"lost_events": {"source": "PERF_EVENT_RING_BUFFER", "num_events_lost": str(n)}}


def view(title, level, responses, lab="demo", written=100, faults=(), port=PORT) -> ObserveView:
    return ObserveView(title, lab, level, {"port": port}, 4095, tuple(responses), 4095, written, tuple(faults))


def medium_flows() -> list[dict]:
    """16 flows: the handshake's 4 SYN/SYN-ACK flows and 12 others, at two points."""
    return [flow("TO_OVERLAY", syn=i < 2) for i in range(8)] + [flow("TO_ENDPOINT", syn=i < 2) for i in range(8)]


def none_flows() -> list[dict]:
    return [flow("TO_OVERLAY")] * 74 + [flow("FROM_OVERLAY")] * 37 + [flow("TO_ENDPOINT")] * 37


def low_flows() -> list[dict]:
    return [flow("TO_OVERLAY")] * 74 + [flow("TO_ENDPOINT")] * 37


def record_step(j: Journal, lab: str, records: int, reported: int, port: int = PORT) -> None:
    flows = [SimpleNamespace(event=SimpleNamespace(report=1 if i < reported else 0)) for i in range(records)]
    j.record(lab, "step", "a1 -> b1 TCP", SimpleNamespace(flows=flows), sport=port)


def record(j: Journal, v: ObserveView) -> None:
    j.record(v.lab, "observe", v.title, v, level=v.level, faults=v.faults)


def grade(ex: str, answer, j: Journal):
    return registry()[ex].grade(answer, Evidence("demo", j))


@pytest.fixture
def sections() -> Journal:
    """Every section's views as a healthy run records them."""
    j = Journal()
    record(j, view(lab13.AT_NONE, "none", none_flows()))
    record_step(j, "demo", 222, 16)
    record(j, view(lab13.AT_MEDIUM, "medium", medium_flows()))
    record(j, view(lab13.AT_LOW, "low", low_flows()))
    record(j, view(lab13.OLD_BEFORE, "none", [flow("TO_OVERLAY")] * 40, lab="demo-flood", port=41000))
    record(j, view(lab13.AFTER_FLOOD, "none", [lost(300), lost(25)] + [flow("TO_ENDPOINT")] * 4093,
                   lab="demo-flood", written=15000))
    record(j, view(lab13.OLD_AFTER, "none", [], lab="demo-flood", port=41000))
    record(j, view(lab13.OLD2_BEFORE, "medium", medium_flows(), lab="demo-flood", port=42000))
    record(j, view(lab13.OLD2_AFTER, "medium", medium_flows(), lab="demo-flood", port=42000))
    return j


def test_medium_count_passes_the_views_count_and_names_each_misconception(sections):
    """13.1: the medium view's flow count passes; the none view's count and the SYN flows' count fail with the key's
    messages."""
    assert grade("13.1", 16, sections).passed
    assert "that is what Hubble kept at none" in grade("13.1", 148, sections).message
    assert "more than the handshake's SYN and SYN-ACK" in grade("13.1", 4, sections).message
    assert not grade("13.1", "16", sections).passed


def test_medium_count_needs_its_cell_and_refuses_a_faulty_world():
    """13.1: no views asks for section 1's cell; a view read with hubble-no-aggregation on is not the learner's
    mistake (missing set, no try), whatever the answer."""
    j = Journal()
    assert grade("13.1", 16, j).missing == lab13.LEVELS
    record(j, view(lab13.AT_NONE, "none", none_flows(), faults=("hubble-no-aggregation",)))
    record_step(j, "demo", 222, 16)
    record(j, view(lab13.AT_MEDIUM, "medium", none_flows(), faults=("hubble-no-aggregation",)))
    out = grade("13.1", 148, j)
    assert not out.passed and out.missing == lab13.LEVELS and "hubble-no-aggregation" in out.message


def test_low_points_are_the_ones_gone(sections):
    """13.2: the points with flows at none and none at low pass (spelling forgiven); a point still there fails."""
    assert grade("13.2", ["from-overlay"], sections).passed
    assert "TO_OVERLAY flows are still in the view at low" in grade("13.2", ["TO_OVERLAY"], sections).message
    assert "some point is gone" in grade("13.2", [], sections).message


def test_flood_grades_the_bounded_ring_and_lost_history(sections):
    """13.3: (entries the whole ring's view printed, flows of the old connection left) passes; more than the ring
    holds, the flows alone, and the old connection kept fail with their messages."""
    assert grade("13.3", (4095, 0), sections).passed
    assert "no view prints more entries than the ring holds" in grade("13.3", (20000, 0), sections).message
    assert "EVENTS LOST lines are entries of the ring too" in grade("13.3", (4093, 0), sections).message
    assert "were overwritten" in grade("13.3", (4095, 40), sections).message


def test_flood_without_lost_events_is_not_graded():
    """13.3: a flood whose view has no EVENTS LOST line (monitor-no-lost) asks for the cell again."""
    j = Journal()
    record(j, view(lab13.OLD_BEFORE, "none", [flow("TO_OVERLAY")] * 40, lab="demo-flood"))
    record(j, view(lab13.AFTER_FLOOD, "none", [flow("TO_ENDPOINT")] * 4095, lab="demo-flood", written=15000,
                   faults=("monitor-no-lost",)))
    record(j, view(lab13.OLD_AFTER, "none", [], lab="demo-flood"))
    out = grade("13.3", (4095, 0), j)
    assert not out.passed and out.missing == lab13.FLOOD


def test_medium_flood_keeps_the_old_connection(sections):
    """13.4: the flows still shown pass; 0 and section 3's none count fail with their messages."""
    assert grade("13.4", 16, sections).passed
    assert "most of them asked for no report" in grade("13.4", 0, sections).message
    assert "section 3's connection at none" in grade("13.4", 40, sections).message


def test_break_it_needs_the_fault_and_names_the_level_the_view_looks_like(sections):
    """13.5: without a view read under the fault the check asks for the cell; with it, 'none' passes and
    'medium' fails with its message."""
    assert grade("13.5", "none", sections).missing == lab13.BREAK
    record_step(sections, "demo", 222, 16, port=43000)
    record(sections, view(lab13.BROKEN, "medium", none_flows(), faults=("hubble-no-aggregation",), port=43000))
    assert grade("13.5", "none", sections).passed
    assert "lab.monitor_aggregation() says medium" in grade("13.5", "medium", sections).message
    assert "which low leaves out" in grade("13.5", "low", sections).message
