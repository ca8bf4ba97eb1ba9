"""Pinned BPF maps as Python mappings of typed keys and values.

:class:`PinnedMap` is a :class:`collections.abc.MutableMapping` (``m[key]``,
``del m[key]``, ``key in m``, ``len(m)``, iteration over keys) with BCC's batch
verbs besides (``bcc/table.py``): :meth:`~PinnedMap.items_lookup_batch` and
:meth:`~PinnedMap.items_delete_batch`.

    >>> from labkit.maps.ct import CtKey4, CtEntry
    >>> m = PinnedMap("/sys/fs/bpf/labkit/demo/node-a/cilium_ct4_global", CtKey4, CtEntry)  # doctest: +SKIP
    >>> for key, entry in m.items(): ...                                                 # doctest: +SKIP

The same map on the command line: ``bpftool map dump pinned <path>``.
:meth:`~PinnedMap.items` reads with ``BPF_MAP_LOOKUP_BATCH`` (one syscall per
chunk, as Cilium 1.18 does) and falls back to one lookup per key where batches
are not supported.
"""
from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import MutableMapping
from typing import Generic, Iterable, Iterator, TypeVar

from labkit.datapath import bpf as _bpf
from labkit.errors import DatapathError, NotFoundError

__all__ = ["PinnedMap", "batch_chunk", "open_pinned"]

_NO_BATCH = (errno.EINVAL, 524)  # 524: the kernel's ENOTSUPP, batch ops not implemented
K = TypeVar("K", bound=ctypes.Structure)
V = TypeVar("V", bound=ctypes.Structure)


def batch_chunk(max_entries: int) -> int:
    """Cilium's batch size: 2^ceil(log2(sqrt(2·max))), e.g. 1024 for 524288.

    >>> batch_chunk(524288), batch_chunk(262144), batch_chunk(16)
    (1024, 1024, 8)
    """
    n = 1
    while n * n < 2 * max_entries:
        n *= 2
    return n


def open_pinned(path: str) -> int:
    """An fd for the map pinned at ``path``; NotFoundError when nothing is pinned there."""
    try:
        return _bpf.obj_get(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise NotFoundError(f"pinned map {path} does not exist (is the lab up?)") from None
        raise DatapathError(f"pinned map {path}: cannot open ({exc.strerror})") from None


class PinnedMap(MutableMapping, Generic[K, V]):
    """A pinned map whose keys and values are the given ctypes structures (or ctypes scalars)."""

    _by_name = False  # opened from an fd (from_fd), not a pin

    def __init__(self, path: str, key_type: type[K], value_type: type[V]):
        self._adopt(open_pinned(path), path, key_type, value_type)

    @classmethod
    def from_fd(cls, fd: int, key_type: type[K], value_type: type[V], name: str = "") -> "PinnedMap[K, V]":
        """The map behind ``fd`` (an unpinned map, e.g. a loaded program's), over its own copy of the fd.

        Its :meth:`command` names it by map name, as nothing is pinned.
        """
        self = cls.__new__(cls)
        self._by_name = True
        self._adopt(os.dup(fd), f"(fd {fd}{' ' + name if name else ''})", key_type, value_type)
        return self

    def _adopt(self, fd: int, path: str, key_type: type[K], value_type: type[V]) -> None:
        self.path = path
        self.key_type = key_type
        self.value_type = value_type
        self.fd = fd
        info = _bpf.map_info(self.fd)
        self.name = info.name.decode()
        self.max_entries = info.max_entries
        self.map_type = info.type
        if (info.key_size, info.value_size) != (ctypes.sizeof(key_type), ctypes.sizeof(value_type)):
            os.close(self.fd)
            raise DatapathError(
                f"{'map' if self._by_name else 'pinned map'} {path}: key/value sizes {info.key_size}/{info.value_size} bytes, expected "
                f"{ctypes.sizeof(key_type)}/{ctypes.sizeof(value_type)} for {key_type.__name__}/{value_type.__name__}"
            )

    # -- the mapping verbs ---------------------------------------------------
    def get(self, key: K, default: V | None = None) -> V | None:
        """The value for ``key`` (one ``BPF_MAP_LOOKUP_ELEM``), or ``default``."""
        value = self.value_type()
        return value if _bpf.lookup(self.fd, key, value) else default

    def __getitem__(self, key: K) -> V:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        _bpf.update(self.fd, key, value)

    def __delitem__(self, key: K) -> None:
        if not _bpf.delete(self.fd, key):
            raise KeyError(key)

    def delete(self, key: K) -> bool:
        """Delete ``key``; False if it was not there."""
        return _bpf.delete(self.fd, key)

    def update_many(self, pairs: list[tuple[K, V]]) -> int:
        """Write every (key, value) with ``BPF_MAP_UPDATE_BATCH``, in order, a chunk per syscall (one
        ``BPF_MAP_UPDATE_ELEM`` each where the map has no batch operations); returns how many."""
        chunk = batch_chunk(self.max_entries)
        done = 0
        while done < len(pairs):
            part = pairs[done:done + chunk]
            keys = (self.key_type * len(part))(*(k for k, _ in part))
            values = (self.value_type * len(part))(*(v for _, v in part))
            try:
                _bpf.update_batch(self.fd, keys, values, len(part))
            except OSError as exc:
                if exc.errno not in _NO_BATCH:
                    raise
                for k, v in part:
                    _bpf.update(self.fd, k, v)
            done += len(part)
        return done

    def __iter__(self) -> Iterator[K]:
        """Keys one ``BPF_MAP_GET_NEXT_KEY`` at a time."""
        prev, cur = None, self.key_type()
        while _bpf.next_key(self.fd, prev, cur):
            yield cur
            prev, cur = cur, self.key_type()

    def __len__(self) -> int:
        return len(self.items())

    __eq__ = object.__eq__  # a map handle is equal only to itself, as before it was a Mapping
    __hash__ = object.__hash__

    def items(self) -> list[tuple[K, V]]:
        """Every entry, read in batches (per key where batches are unsupported)."""
        try:
            return list(self.items_lookup_batch())
        except OSError as exc:
            if exc.errno not in _NO_BATCH:
                raise
        return self.items_per_key()

    def raw_items(self) -> dict[bytes, bytes]:
        """Every entry as raw bytes, key → value, read in batches (no structure built per entry: what a
        byte-for-byte comparison of a big map needs)."""
        ksz, vsz = ctypes.sizeof(self.key_type), ctypes.sizeof(self.value_type)
        out: dict[bytes, bytes] = {}
        try:
            for keys, values, n in self.lookup_batches():
                kb, vb = bytes(keys)[:n * ksz], bytes(values)[:n * vsz]
                out.update(zip((kb[i:i + ksz] for i in range(0, n * ksz, ksz)),
                               (vb[i:i + vsz] for i in range(0, n * vsz, vsz))))
        except OSError as exc:
            if exc.errno not in _NO_BATCH:
                raise
            out = {bytes(k): bytes(v) for k, v in self.items_per_key()}
        return out

    def items_per_key(self) -> list[tuple[K, V]]:
        """Every entry with one lookup syscall per key (the pre-1.18 way)."""
        return [(k, v) for k in list(self) if (v := self.get(k)) is not None]

    # -- BCC's batch verbs ---------------------------------------------------
    def lookup_batches(self) -> Iterator[tuple[ctypes.Array, ctypes.Array, int]]:
        """The map chunk by chunk, one ``BPF_MAP_LOOKUP_BATCH`` each: (keys, values, how many are filled).

        Chunks are Cilium's size (:func:`batch_chunk`), doubled when one hash bucket holds more
        (ENOSPC). Where batches are unsupported the kernel's EINVAL/ENOTSUPP is raised.
        """
        chunk = batch_chunk(self.max_entries)
        token_size = max(ctypes.sizeof(self.key_type), 8)
        in_batch, out_batch = None, ctypes.create_string_buffer(token_size)
        while True:
            keys = (self.key_type * chunk)()
            values = (self.value_type * chunk)()
            try:
                n, done = _bpf.lookup_batch(self.fd, keys, values, chunk, in_batch, out_batch)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:  # one bucket holds more than a chunk
                    chunk *= 2
                    continue
                raise
            yield keys, values, n
            if done:
                return
            in_batch = ctypes.create_string_buffer(out_batch.raw, token_size)

    def items_lookup_batch(self) -> Iterator[tuple[K, V]]:
        """Every entry, read with ``BPF_MAP_LOOKUP_BATCH`` (BCC's name)."""
        for keys, values, n in self.lookup_batches():
            for i in range(n):
                yield keys[i], values[i]

    def items_delete_batch(self, keys: Iterable[K | bytes] | None = None) -> int:
        """Delete ``keys`` (every key when None) with one ``BPF_MAP_DELETE_BATCH`` (BCC's name), one
        delete per key where batches are unsupported; returns how many were deleted. A key may be
        given as its raw bytes."""
        raw = [bytes(k) for k in (self if keys is None else keys)]
        if not raw:
            return 0
        size = ctypes.sizeof(self.key_type)
        try:
            return _bpf.delete_batch(self.fd, ctypes.create_string_buffer(b"".join(raw), size * len(raw)), len(raw))
        except OSError as exc:
            if exc.errno not in _NO_BATCH:
                raise
        return sum(_bpf.delete(self.fd, ctypes.create_string_buffer(k, size)) for k in raw)

    def clear(self) -> int:
        """Delete every entry; returns how many were deleted."""
        return self.items_delete_batch([k for k, _ in self.items()])

    def close(self) -> None:
        """Close the map's fd."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "PinnedMap[K, V]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def command(self) -> str:
        """The real tool that shows this map."""
        if self._by_name:
            return f"bpftool map dump name {self.name}"
        return f"bpftool map dump pinned {self.path}"
