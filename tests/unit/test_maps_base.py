"""Cilium's CT dump batch size: 2^ceil(log2(sqrt(2 * max_entries)))."""
from __future__ import annotations

import math

import pytest

from labkit.maps.base import batch_chunk


def cilium_chunk(max_entries: int) -> int:
    """Cilium's rule, computed with exact integers: ceil(log2(sqrt(x))) = ceil(ceil(log2 x) / 2)."""
    x = 2 * max_entries
    ceil_log2 = (x - 1).bit_length()  # ceil(log2 x) for x >= 1
    return 2 ** -(-ceil_log2 // 2)


@pytest.mark.parametrize("max_entries,expected", [(524288, 1024), (262144, 1024)])
def test_cilium_default_sizes(max_entries, expected):
    """Cilium's default CT maps are dumped 1024 entries per batch."""
    assert batch_chunk(max_entries) == expected


@pytest.mark.parametrize("max_entries", [1, 2, 3, 16, 100, 1000, 4096, 65535, 65536, 65537, 100_000, 16_777_216])
def test_rule(max_entries):
    """batch_chunk follows the rule for sizes on and off powers of two."""
    assert batch_chunk(max_entries) == cilium_chunk(max_entries)


@pytest.mark.parametrize("max_entries", [3, 100, 1000, 65535, 100_000])
def test_rule_floating_point(max_entries):
    """Off exact powers of two, the rule evaluated literally in floating point agrees."""
    assert batch_chunk(max_entries) == 2 ** math.ceil(math.log2(math.sqrt(2 * max_entries)))


def test_chunk_covers_sqrt():
    """The chunk is the smallest power of two whose square holds 2*max entries."""
    for m in range(1, 3000):
        n = batch_chunk(m)
        assert n & (n - 1) == 0 and n * n >= 2 * m and (n // 2) ** 2 < 2 * m
