"""labkit.door.wire: typed objects cross the door and come back equal; a client's data is plain data only."""
from __future__ import annotations

import dataclasses
import subprocess

import pytest

from labkit.agent.gc import GcRun, MapScan
from labkit.door.wire import from_json, plain_from_json, to_json
from labkit.errors import RequestError
from labkit.maps.lb import LbSnapshot, MaglevLut
from labkit.observe.evidence import Snapshot
from tracefixtures import recorded_steps


def roundtrip(value, context=None):
    import json

    return from_json(json.loads(json.dumps(to_json(value))), context)


def test_plain_values_keep_their_types():
    """Tuples stay tuples, sets sets, bytes bytes, and mappings with other than string keys keep their keys."""
    value = {"t": (60, 8000), "s": {"a", "b"}, "b": b"\x00\xff", "m": {1: "x", (2, 3): [4]}, "n": None,
             "f": 1.5, "$odd": True}
    assert roundtrip(value) == value
    assert isinstance(roundtrip((1, [2, (3,)]))[1][1], tuple)


def test_steps_come_back_with_their_rows_flows_and_attrs():
    """A recorded step crosses as the same Step: flows (raw trace records), rows before and after, diff, result."""
    step = recorded_steps("a1-b1")[0]
    step.flows = [dataclasses.replace(f, wall=1.7e9 + i / 7) for i, f in enumerate(step.flows)]  # as decode() fixes it
    back = roundtrip(step, {"lab": step.lab})
    assert back.title == step.title and back.lab is step.lab and back.now == step.now
    assert [bytes(f.event) for f in back.flows] == [bytes(f.event) for f in step.flows]
    assert [(f.node, f.device) for f in back.flows] == [(f.node, f.device) for f in step.flows]
    assert back.before == step.before and back.after == step.after
    assert [r.key for rows in back.after.values() for r in rows] == [r.key for rows in step.after.values() for r in rows]
    assert back.diff_lines() == step.diff_lines() and back.lines() == step.lines()
    assert back.result == step.result and back.attrs == step.attrs


def test_snapshots_gc_runs_lb_maps_and_processes_come_back_equal():
    """Snapshot, GcRun (with MapScans), LbSnapshot, MaglevLut and CompletedProcess round-trip to equal objects."""
    step = recorded_steps("a1-b1")[0]
    snap = Snapshot("after", 100, step.after, {}, extra={"note": 1}, iptables="*nat\n")
    assert roundtrip(snap) == snap
    run = GcRun(10, "batch", (MapScan("node-a", "cilium_ct4_global", 3, 1, 0.001, 524288),), 0.01, 300, 150)
    assert roundtrip(run) == run and roundtrip(run).lines() == run.lines()
    lb = LbSnapshot.build("198.19.0.10", 80, "TCP", 1, [(1, "198.18.2.11", 8080), (2, "198.18.2.12", 8080)])
    assert roundtrip(lb).lines() == lb.lines() and roundtrip(lb).raw_lines() == lb.raw_lines()
    assert roundtrip(MaglevLut([1, 2, 1])) == MaglevLut([1, 2, 1])
    done = subprocess.CompletedProcess(["ls"], 0, "out", "err")
    back = roundtrip(done)
    assert (back.args, back.returncode, back.stdout, back.stderr) == (["ls"], 0, "out", "err")


def test_unknown_objects_are_not_sent():
    """An object of a class the wire does not know is a TypeError on the sending side."""
    with pytest.raises(TypeError, match="cannot send"):
        to_json(object())


@pytest.mark.parametrize("data, says", [
    ({"$c": "CtRow", "v": []}, "object of class 'CtRow'"),
    ({"$c": "Step", "v": {}}, "object of class 'Step'"),
    ({"$s": [[1], [2]]}, "unhashable"),
    ({"$b": "zz"}, "not hex"),
    ({"$m": [[1]]}, "not a \\[key, value\\] pair"),
])
def test_a_clients_data_is_plain_data_only(data, says):
    """labkitd never builds an object of a class from what a client sent."""
    with pytest.raises(RequestError, match=says):
        plain_from_json(data)


def test_a_clients_data_is_bounded():
    """Nesting deeper than 16 or more than 100,000 items in all is refused."""
    deep = []
    for _ in range(40):
        deep = [deep]
    with pytest.raises(RequestError, match="nesting"):
        plain_from_json(deep)
    with pytest.raises(RequestError, match="items"):
        plain_from_json(list(range(200_000)))
    assert plain_from_json({"$t": [1, {"$s": ["a"]}]}) == (1, {"a"})
