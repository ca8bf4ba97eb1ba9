"""The bpf(2) system call, as much of it as labkit needs, through ctypes.

Reading and writing pinned maps does not need BCC (which is only the
compiler here), so ``labkit ct list`` stays fast and the same code reads a
real Cilium node's maps. Commands mirror the kernel's names:
``BPF_OBJ_GET`` is :func:`obj_get`, ``BPF_MAP_LOOKUP_BATCH`` is
:func:`lookup_batch`, and so on. Errors raise :class:`OSError` with the errno.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import select
import struct
from typing import Iterator

__all__ = [
    "MapInfo",
    "obj_get",
    "obj_pin",
    "prog_attach",
    "prog_detach",
    "map_create",
    "map_fd_by_id",
    "map_info",
    "lookup",
    "update",
    "delete",
    "next_key",
    "all_keys",
    "lookup_batch",
    "update_batch",
    "delete_batch",
    "RingBuffer",
    "ringbuf_producer_pos",
    "BPF_ANY",
    "BPF_NOEXIST",
    "BPF_MAP_TYPE_LPM_TRIE",
    "BPF_MAP_TYPE_HASH_OF_MAPS",
    "BPF_F_NO_PREALLOC",
    "BPF_EXIST",
]

_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine(), 321)
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, BPF_MAP_DELETE_ELEM, BPF_MAP_GET_NEXT_KEY = 1, 2, 3, 4
BPF_MAP_GET_FD_BY_ID = 14
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_LPM_TRIE, BPF_MAP_TYPE_HASH_OF_MAPS = 11, 13
BPF_F_NO_PREALLOC = 1
BPF_PROG_ATTACH, BPF_PROG_DETACH = 8, 9
BPF_OBJ_PIN, BPF_OBJ_GET, BPF_OBJ_GET_INFO_BY_FD = 6, 7, 15
BPF_MAP_LOOKUP_BATCH, BPF_MAP_UPDATE_BATCH, BPF_MAP_DELETE_BATCH = 24, 26, 27
BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2
_ATTR_SIZE = 128


def _sys(cmd: int, attr: ctypes.Array, what: str) -> int:
    ret = _libc.syscall(_SYS_BPF, cmd, ctypes.byref(attr), ctypes.c_uint(_ATTR_SIZE))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _attr(fmt: str, *values) -> ctypes.Array:
    buf = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def _addr(buf) -> int:
    return ctypes.addressof(buf) if buf is not None else 0


def obj_get(path: str) -> int:
    """Open a pinned map or program (``BPF_OBJ_GET``); returns a new fd."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    return _sys(BPF_OBJ_GET, _attr("=QII", ctypes.addressof(p), 0, 0), f"open pinned object {path}")


def obj_pin(fd: int, path: str) -> None:
    """Pin an object at ``path`` on bpffs (``BPF_OBJ_PIN``)."""
    p = ctypes.create_string_buffer(os.fsencode(path))
    _sys(BPF_OBJ_PIN, _attr("=QII", ctypes.addressof(p), fd, 0), f"pin at {path}")


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, name: str = "",
               flags: int = 0, inner_map_fd: int = 0) -> int:
    """``BPF_MAP_CREATE`` of an unpinned map; returns its fd (the map lives while something holds it).
    ``flags`` is ``map_flags`` (``BPF_F_NO_PREALLOC``, which an LPM trie requires); ``inner_map_fd`` the
    template of a map-in-map's inner maps. The kernel keeps the first 15 bytes of ``name``."""
    raw = name.encode()[:15]
    return _sys(BPF_MAP_CREATE, _attr("=IIIIIII16s", map_type, key_size, value_size, max_entries, flags,
                                      inner_map_fd, 0, raw), f"create map {name or '(unnamed)'}")


def map_fd_by_id(map_id: int) -> int:
    """``BPF_MAP_GET_FD_BY_ID``: an fd for the map with kernel id ``map_id`` (an inner map, say)."""
    return _sys(BPF_MAP_GET_FD_BY_ID, _attr("=III", map_id, 0, 0), f"open map id {map_id}")


def prog_attach(target_fd: int, prog_fd: int, attach_type: int, flags: int = 0) -> None:
    """``BPF_PROG_ATTACH``: put program ``prog_fd`` on a cgroup (``target_fd``)."""
    _sys(BPF_PROG_ATTACH, _attr("=IIIII", target_fd, prog_fd, attach_type, flags, 0), "prog attach")


def prog_detach(target_fd: int, prog_fd: int, attach_type: int) -> None:
    """``BPF_PROG_DETACH``: take program ``prog_fd`` off a cgroup (``target_fd``)."""
    _sys(BPF_PROG_DETACH, _attr("=IIII", target_fd, prog_fd, attach_type, 0), "prog detach")


class MapInfo(ctypes.Structure):
    """The head of ``struct bpf_map_info``."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("id", ctypes.c_uint32),
        ("key_size", ctypes.c_uint32),
        ("value_size", ctypes.c_uint32),
        ("max_entries", ctypes.c_uint32),
        ("map_flags", ctypes.c_uint32),
        ("name", ctypes.c_char * 16),
        ("ifindex", ctypes.c_uint32),
        ("btf_vmlinux_value_type_id", ctypes.c_uint32),
        ("netns_dev", ctypes.c_uint64),
        ("netns_ino", ctypes.c_uint64),
        ("btf_id", ctypes.c_uint32),
        ("btf_key_type_id", ctypes.c_uint32),
        ("btf_value_type_id", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("map_extra", ctypes.c_uint64),
    ]


def map_info(fd: int) -> MapInfo:
    """``BPF_OBJ_GET_INFO_BY_FD`` for a map."""
    info = MapInfo()
    _sys(BPF_OBJ_GET_INFO_BY_FD, _attr("=IIQ", fd, ctypes.sizeof(info), ctypes.addressof(info)), "map info")
    return info


def lookup(fd: int, key, value) -> bool:
    """Fill ``value`` for ``key``; False when the key is absent."""
    try:
        _sys(BPF_MAP_LOOKUP_ELEM, _attr("=IxxxxQQQ", fd, _addr(key), _addr(value), 0), "map lookup")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def update(fd: int, key, value, flags: int = BPF_ANY) -> None:
    """Write ``key`` → ``value`` (``BPF_ANY``, ``BPF_NOEXIST`` or ``BPF_EXIST``)."""
    _sys(BPF_MAP_UPDATE_ELEM, _attr("=IxxxxQQQ", fd, _addr(key), _addr(value), flags), "map update")


def delete(fd: int, key) -> bool:
    """Delete ``key``; False when it was already gone."""
    try:
        _sys(BPF_MAP_DELETE_ELEM, _attr("=IxxxxQQQ", fd, _addr(key), 0, 0), "map delete")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def next_key(fd: int, key, out) -> bool:
    """``BPF_MAP_GET_NEXT_KEY``: the key after ``key`` (None: the first); False at the end."""
    try:
        _sys(BPF_MAP_GET_NEXT_KEY, _attr("=IxxxxQQQ", fd, _addr(key), _addr(out), 0), "map next key")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise
    return True


def all_keys(fd: int, key_size: int) -> list[bytes]:
    """Every key of a map, one ``BPF_MAP_GET_NEXT_KEY`` at a time, as raw bytes."""
    keys, prev, cur = [], None, ctypes.create_string_buffer(key_size)
    while next_key(fd, prev, cur):
        keys.append(cur.raw)
        prev, cur = cur, ctypes.create_string_buffer(key_size)
    return keys


def lookup_batch(fd: int, keys, values, count: int, in_batch, out_batch) -> tuple[int, bool]:
    """``BPF_MAP_LOOKUP_BATCH``: up to ``count`` entries into the arrays.

    Returns ``(entries read, done)``; ``in_batch`` None starts from the top.
    ENOSPC (a bucket larger than ``count``) is raised for the caller to grow.
    """
    n = ctypes.c_uint32(count)
    attr = _attr("=QQQQII", _addr(in_batch), _addr(out_batch), _addr(keys), _addr(values), count, fd)
    try:
        _sys(BPF_MAP_LOOKUP_BATCH, attr, "map lookup batch")
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            n.value = struct.unpack_from("=I", attr, 32)[0]
            return n.value, True
        raise
    return struct.unpack_from("=I", attr, 32)[0], False


def update_batch(fd: int, keys, values, count: int) -> int:
    """``BPF_MAP_UPDATE_BATCH``: write ``count`` key/value pairs in one call; returns how many were written."""
    attr = _attr("=QQQQII", 0, 0, _addr(keys), _addr(values), count, fd)
    _sys(BPF_MAP_UPDATE_BATCH, attr, "map update batch")
    return struct.unpack_from("=I", attr, 32)[0]


def delete_batch(fd: int, keys, count: int) -> int:
    """``BPF_MAP_DELETE_BATCH``: delete ``count`` keys; returns how many went."""
    attr = _attr("=QQQQII", 0, 0, _addr(keys), 0, count, fd)
    try:
        _sys(BPF_MAP_DELETE_BATCH, attr, "map delete batch")
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
    return struct.unpack_from("=I", attr, 32)[0]


def ringbuf_producer_pos(fd: int) -> int:
    """How far the kernel has written into a ring buffer (read-only, any process)."""
    page = mmap.PAGESIZE
    m = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
    try:
        return struct.unpack_from("=Q", m, 0)[0]
    finally:
        m.close()


_RINGBUF_BUSY = 1 << 31
_RINGBUF_DISCARD = 1 << 30
_RINGBUF_HDR = 8


class RingBuffer:
    """Consumer side of a ``BPF_MAP_TYPE_RINGBUF`` map, read through mmap.

    The first page holds the consumer position (ours to write), the next the
    producer position, then the data area, mapped twice in a row so a record
    that wraps reads as one slice. Records are 8-byte aligned behind an 8-byte
    header whose length word carries BUSY and DISCARD bits.
    """

    def __init__(self, fd: int):
        self.fd = fd
        info = map_info(fd)
        self.size = info.max_entries
        page = mmap.PAGESIZE
        self._cons = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod = mmap.mmap(fd, page + 2 * self.size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self._data = memoryview(self._prod)[page:]
        self._poll = select.epoll()
        self._poll.register(fd, select.EPOLLIN)

    def records(self) -> Iterator[bytes]:
        """Every record available now, oldest first (advances the consumer)."""
        cons = struct.unpack_from("=Q", self._cons, 0)[0]
        prod = struct.unpack_from("=Q", self._prod, 0)[0]
        mask = self.size - 1
        while cons < prod:
            off = cons & mask
            length, _ = struct.unpack_from("=II", self._data, off)
            if length & _RINGBUF_BUSY:
                break
            size = length & ~(_RINGBUF_BUSY | _RINGBUF_DISCARD)
            if not length & _RINGBUF_DISCARD:
                yield bytes(self._data[off + _RINGBUF_HDR : off + _RINGBUF_HDR + size])
            cons += (size + _RINGBUF_HDR + 7) & ~7
            struct.pack_into("=Q", self._cons, 0, cons)
            if cons >= prod:
                prod = struct.unpack_from("=Q", self._prod, 0)[0]

    def wait(self, timeout: float) -> bool:
        """Block until the kernel signals new data or ``timeout`` seconds pass."""
        return bool(self._poll.poll(timeout))

    def consumer_pos(self) -> int:
        """How far this reader has consumed."""
        return struct.unpack_from("=Q", self._cons, 0)[0]

    def pending(self) -> int:
        """Bytes written by the kernel and not yet consumed."""
        cons = struct.unpack_from("=Q", self._cons, 0)[0]
        prod = struct.unpack_from("=Q", self._prod, 0)[0]
        return prod - cons

    def close(self) -> None:
        """Unmap and forget the poller (the fd stays the caller's)."""
        self._poll.close()
        self._data.release()
        self._prod.close()
        self._cons.close()
