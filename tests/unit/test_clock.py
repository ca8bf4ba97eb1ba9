"""The lab clock: CLOCK_MONOTONIC seconds plus an offset that only moves forward."""
from __future__ import annotations

import time

import pytest

from labkit.clock import LabClock, mono_seconds


class Store:
    """An offset cell standing in for the labkit_config map."""

    def __init__(self, offset: int = 0):
        self.offset = offset
        self.writes: list[int] = []

    def read(self) -> int:
        return self.offset

    def write(self, value: int) -> None:
        self.writes.append(value)
        self.offset = value


def test_mono_seconds_is_whole_monotonic_seconds():
    """mono_seconds() is CLOCK_MONOTONIC truncated to whole seconds."""
    before = int(time.clock_gettime(time.CLOCK_MONOTONIC))
    now = mono_seconds()
    after = int(time.clock_gettime(time.CLOCK_MONOTONIC))
    assert isinstance(now, int) and before <= now <= after


def test_now_adds_offset():
    """now() is monotonic seconds plus the stored offset."""
    store = Store(1000)
    clock = LabClock(store.read, store.write)
    lo = mono_seconds() + 1000
    n = clock.now()
    hi = mono_seconds() + 1000
    assert lo <= n <= hi
    assert clock.offset == 1000


def test_advance_writes_new_offset():
    """advance(s) writes offset+s and returns the new now."""
    store = Store(5)
    clock = LabClock(store.read, store.write)
    lo = mono_seconds() + 65
    n = clock.advance(60)
    assert store.writes == [65] and clock.offset == 65
    assert lo <= n <= mono_seconds() + 65
    clock.advance(0)
    assert store.writes == [65, 65]


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, None])
def test_advance_rejects_non_whole_or_negative(bad):
    """advance only takes whole seconds >= 0; the offset is left alone otherwise."""
    store = Store(3)
    clock = LabClock(store.read, store.write)
    with pytest.raises(ValueError):
        clock.advance(bad)
    assert store.writes == [] and store.offset == 3


def test_repr_shows_offset():
    """repr names the offset."""
    store = Store(42)
    assert "offset=42" in repr(LabClock(store.read, store.write))
