"""labkit.observe.ring: the Hubble ring file keeps the newest 2^n-1 entries in 2^n slots, as Hubble's
ring (pkg/hubble/container/ring.go: NewRing rounds up to a power of two, ``read`` refuses the slot
being written), and tells a reader how many entries it missed."""
from __future__ import annotations

import pytest

from labkit.observe.ring import SLOT_FLOW, SLOT_LOST, SLOT_SIZE, HubbleRing, Slot
from tracefixtures import syn_event


def _lost(n: int) -> Slot:
    return Slot(kind=SLOT_LOST, node_id=1, lost=n)


@pytest.mark.parametrize("capacity", [0, 2, 4, 4096])
def test_capacity_must_be_one_less_than_a_power_of_two(tmp_path, capacity):
    """Capacities that are not 2^n-1 are refused, naming the value."""
    with pytest.raises(ValueError, match=f"got {capacity}"):
        HubbleRing.create(tmp_path / "r", capacity)


def test_file_is_bounded_to_capacity_plus_one_slots(tmp_path):
    """The default ring's file is 64 header bytes and 4096 slots, however much is written."""
    ring = HubbleRing.create(tmp_path / "r")
    for n in range(5000):
        ring.append(_lost(n))
    assert ring.capacity == 4095
    assert (tmp_path / "r").stat().st_size == 64 + 4096 * SLOT_SIZE


def test_keeps_the_newest_capacity_entries_in_order(tmp_path):
    """After 10 appends to a ring of 7, a reader sees entries 3..9, oldest first."""
    ring = HubbleRing.create(tmp_path / "r", 7)
    for n in range(10):
        ring.append(_lost(n))
    reader = HubbleRing.open(tmp_path / "r")
    assert [s.lost for s in reader.entries()] == [3, 4, 5, 6, 7, 8, 9]
    assert [s.seq for s in reader.entries()] == list(range(3, 10))


def test_reader_is_told_how_many_entries_were_overwritten(tmp_path):
    """A reader at sequence 1 after 10 appends to a ring of 7 missed entries 1 and 2."""
    ring = HubbleRing.create(tmp_path / "r", 7)
    for n in range(10):
        ring.append(_lost(n))
    slots, skipped = HubbleRing.open(tmp_path / "r").read(1)
    assert (skipped, [s.lost for s in slots]) == (2, [3, 4, 5, 6, 7, 8, 9])
    slots, skipped = HubbleRing.open(tmp_path / "r").read(8)
    assert (skipped, [s.lost for s in slots]) == (0, [8, 9])


def test_flow_entries_keep_the_record(tmp_path):
    """A flow entry returns the trace record byte for byte."""
    ring = HubbleRing.create(tmp_path / "r", 3)
    ev = syn_event(report=1, obs_point=4)
    ring.append(Slot(kind=SLOT_FLOW, node_id=1, wall_ns=5, event=ev))
    (slot,) = HubbleRing.open(tmp_path / "r").entries()
    assert (slot.kind, slot.wall_ns, bytes(slot.event)) == (SLOT_FLOW, 5, bytes(ev))


def test_a_restarted_writer_continues_the_same_ring(tmp_path):
    """create() on an existing ring of the same capacity keeps its entries; another capacity starts afresh."""
    ring = HubbleRing.create(tmp_path / "r", 3)
    ring.append(_lost(1))
    ring.close()
    again = HubbleRing.create(tmp_path / "r", 3)
    again.append(_lost(2))
    assert [s.lost for s in HubbleRing.open(tmp_path / "r").entries()] == [1, 2]
    again.close()
    HubbleRing.create(tmp_path / "r", 7).close()
    assert HubbleRing.open(tmp_path / "r").entries() == []


def test_open_refuses_a_file_that_is_not_a_ring(tmp_path):
    """A file without the ring's header is a LabStateError naming the path."""
    from labkit.errors import LabStateError

    (tmp_path / "r").write_bytes(b"x" * 100)
    with pytest.raises(LabStateError, match="labkit ring file"):
        HubbleRing.open(tmp_path / "r")
