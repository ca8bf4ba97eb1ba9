"""labkit.maps.base.PinnedMap on a real (unpinned) hash map: the MutableMapping verbs and BCC's batch verbs."""
from __future__ import annotations

import ctypes
import os
from collections.abc import MutableMapping

import pytest

from labkit.datapath import bpf as _bpf
from labkit.maps.base import PinnedMap
from labkit.maps.ct import CtEntry, CtKey4

_HASH = 1  # BPF_MAP_TYPE_HASH


@pytest.fixture
def ct(_require_bpf):
    fd = _bpf.map_create(_HASH, ctypes.sizeof(CtKey4), ctypes.sizeof(CtEntry), 4096, "lk_test_ct")
    m = PinnedMap.from_fd(fd, CtKey4, CtEntry, "lk_test_ct")
    os.close(fd)
    yield m
    m.close()


def _keys(n: int) -> list[CtKey4]:
    return [CtKey4.make("198.18.1.11", "198.18.2.11", 1000 + i, 80, 6, 0) for i in range(n)]


def test_mapping_verbs(ct):
    """m[k] = v, m[k], k in m, get with a default, del, pop and len behave as a dict's."""
    keys = _keys(3)
    for i, k in enumerate(keys):
        ct[k] = CtEntry(lifetime=i)
    assert isinstance(ct, MutableMapping) and len(ct) == 3 and keys[1] in ct and ct[keys[1]].lifetime == 1
    assert ct.get(CtKey4()) is None and ct.get(CtKey4(), "none") == "none"
    del ct[keys[1]]
    assert keys[1] not in ct and ct.delete(keys[1]) is False and ct.pop(keys[2]).lifetime == 2 and len(ct) == 1
    with pytest.raises(KeyError):
        ct[keys[1]]


def test_batch_reads_match_per_key_reads(ct):
    """items_lookup_batch, items and items_per_key see the same entries, across several chunks."""
    for i, k in enumerate(_keys(3000)):
        ct[k] = CtEntry(lifetime=i)
    per_key = sorted((bytes(k), bytes(v)) for k, v in ct.items_per_key())
    assert len(per_key) == 3000 and len(list(ct)) == 3000
    assert sorted((bytes(k), bytes(v)) for k, v in ct.items_lookup_batch()) == per_key
    assert sorted((bytes(k), bytes(v)) for k, v in ct.items()) == per_key


def test_items_delete_batch(ct):
    """items_delete_batch deletes the keys given (objects or raw bytes), or every key; clear counts what went."""
    keys = _keys(100)
    for k in keys:
        ct[k] = CtEntry(lifetime=1)
    assert ct.items_delete_batch(keys[:10]) == 10 and ct.items_delete_batch([bytes(k) for k in keys[10:20]]) == 10
    assert ct.items_delete_batch([]) == 0 and len(ct) == 80
    assert ct.clear() == 80 and len(ct) == 0
    ct[keys[0]] = CtEntry(lifetime=1)
    assert ct.items_delete_batch() == 1 and len(ct) == 0
