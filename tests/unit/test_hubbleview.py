"""labkit.notebook.hubbleview: a recorded view of the Hubble ring (what `labkit observe` printed), its counts and
the two commands shown beside it, on fabricated ring entries (no kernel)."""
from __future__ import annotations

from labkit.net.topology import Topology
from labkit.notebook.hubbleview import ObserveView, commands
from labkit.observe.hubble import Names, response
from labkit.observe.ring import SLOT_FLOW, SLOT_LOST, Slot
from tracefixtures import syn_event, tup

NAMES = Names.from_topology(Topology.default("demo"))
WALL = 1796178601_123456789


def _flow(obs_point: int, hook: int = 1) -> dict:
    return response(Slot(kind=SLOT_FLOW, node_id=1, wall_ns=WALL, event=syn_event(hook=hook, obs_point=obs_point,
                                                                                  report=3)), NAMES)


def _lost(n: int) -> dict:
    return response(Slot(kind=SLOT_LOST, node_id=1, wall_ns=WALL, lost=n, lost_total=n), NAMES)


def _view(responses, written=5000, capacity=4095, level="none") -> ObserveView:
    return ObserveView("after the flood", "demo-flood", level, {"port": 40000}, capacity, tuple(responses),
                       capacity, written, ())


def test_counts_flows_lost_records_and_overwritten_entries():
    """flows leave lost-event entries out, lost adds their counts, overwritten is what was written beyond capacity."""
    view = _view([_lost(300), _flow(4), _flow(0), _lost(25)])
    assert len(view.flows) == 2 and len(view.lost_entries) == 2
    assert view.lost == 325 and view.overwritten == 5000 - 4095
    assert _view([], written=12).overwritten == 0


def test_points_count_observation_points():
    """points() counts flows by their trace_observation_point, as Hubble's JSON names them."""
    view = _view([_flow(4), _flow(4), _flow(0), _flow(9)])
    assert view.points() == {"TO_OVERLAY": 2, "TO_ENDPOINT": 1, "FROM_OVERLAY": 1}


def test_commands_mirror_hubble_observe():
    """The labkit command names the lab and the same flags as the hubble observe command it mirrors."""
    lab_cmd, hubble_cmd = commands("demo", {"from_pod": "a1", "port": 40000}, 4095)
    assert lab_cmd == "labkit --lab demo observe --from-pod a1 --port 40000 --last 4095"
    assert hubble_cmd == "hubble observe --from-pod a1 --port 40000 --last 4095"


def test_text_shows_commands_compact_lines_and_folds_long_views():
    """str() starts with both commands, prints compact lines with the node name, and folds beyond SHOWN lines."""
    text = str(_view([_lost(7)] + [_flow(4)] * 100))
    lines = text.splitlines()
    assert lines[0] == "$ labkit --lab demo-flood observe --port 40000 --last 4095"
    assert lines[1] == "  (on a Cilium node: hubble observe --port 40000 --last 4095)"
    assert lines[2] == "EVENTS LOST: PERF_EVENT_RING_BUFFER CPU(0) 7"
    assert "... 61 more ..." in text and " [node-a]: default/a1:40000 " in lines[3]
    assert lines[-1].endswith("1 EVENTS LOST lines (7 records); aggregation none; the ring keeps 4095, 5000 written so far")
