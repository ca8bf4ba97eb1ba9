"""The lab clock: CLOCK_MONOTONIC seconds plus an offset, the same clock the
BPF programs use for CT lifetimes (bpf/lib/clock.h).

Moving it forward (``lab.clock.advance(60)``, ``labkit clock advance 60``)
writes the new offset into every node's ``labkit_config`` map, so lifetimes
visibly run out without waiting. It never moves backwards except on reset.

    >>> mono_seconds() >= 0
    True
"""
from __future__ import annotations

import time
from typing import Callable

from labkit.errors import ConfigError

__all__ = ["LabClock", "mono_seconds"]


def mono_seconds() -> int:
    """Whole seconds of CLOCK_MONOTONIC, as ``bpf_ktime_get_ns() / 1e9``."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1_000_000_000


class LabClock:
    """A lab's clock; ``offset`` is read and written through the given callables."""

    def __init__(self, read_offset: Callable[[], int], write_offset: Callable[[int], None],
                 on_advance: Callable[[int, int], None] | None = None):
        self._read = read_offset
        self._write = write_offset
        self._on_advance = on_advance  #: told (seconds, new now) after every advance

    @property
    def offset(self) -> int:
        """Seconds the lab clock is ahead of CLOCK_MONOTONIC."""
        return self._read()

    def now(self) -> int:
        """The lab clock now, in the unit of CT lifetimes."""
        return mono_seconds() + self._read()

    def advance(self, seconds: int) -> int:
        """Move the clock forward by ``seconds`` (a whole number ≥ 0); returns the new now."""
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
            raise ConfigError(f"clock advance: expected whole seconds >= 0, got {seconds!r}")
        self._write(self._read() + seconds)
        now = self.now()
        if self._on_advance is not None:
            self._on_advance(seconds, now)
        return now

    def __repr__(self) -> str:
        return f"LabClock(now={self.now()}, offset={self.offset})"
