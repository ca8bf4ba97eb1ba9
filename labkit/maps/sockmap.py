"""The sockhash of socket-level redirect, ``cilium_sock_ops`` (``labkit up --sockmap on``): its key, Cilium
1.4-1.13's ``struct sock_key`` (bpf/sockops/bpf_sockops.h). Keep in sync with bpf/lib/sockops_types.h
(tests/unit/test_layout.py compares the layouts).

The key is 44 packed bytes: each address in the first word of a 16-byte slot (room for IPv6), then
the family byte, three bytes of zero padding (no protocol: only TCP sockets reach these hooks), and the
ports as network-order 16-bit values in 32-bit fields. bpf_sockops.c stores a
socket under its *peer's* view (source = the peer), so one established pair of pods holds two keys, each
the other swapped:

    >>> k = SockKey.make("198.18.1.12", 8080, "198.18.1.11", 40000)
    >>> str(k), str(k.swapped()), len(bytes(k))
    ('198.18.1.12:8080 -> 198.18.1.11:40000 TCP', '198.18.1.11:40000 -> 198.18.1.12:8080 TCP', 44)

Reading the map from userspace gives keys only: the kernel answers a lookup of a sockhash with the
socket's cookie when the value is 8 bytes, and Cilium's value is 4 (``sizeof(int)``).
"""
from __future__ import annotations

import ctypes
import os
import socket

from labkit.addr import ipv4
from labkit.datapath import bpf as _bpf

__all__ = ["SockKey", "SOCKOPS_MAP", "SOCKOPS_MAP_SIZE", "sock_keys"]

#: Cilium's SOCK_OPS_MAP (bpf/sockops/sockops_config.h).
SOCKOPS_MAP = "cilium_sock_ops"
#: Cilium's SOCKOPS_MAP_SIZE (bpf/sockops/sockops_config.h).
SOCKOPS_MAP_SIZE = 65535
_ENDPOINT_KEY_IPV4 = 1


class SockKey(ctypes.LittleEndianStructure):
    """``struct sock_key`` (44 bytes, packed)."""

    _pack_ = 1
    _fields_ = [
        ("sip4", ctypes.c_uint32),  # network order
        ("pad1", ctypes.c_uint32),
        ("pad2", ctypes.c_uint32),
        ("pad3", ctypes.c_uint32),
        ("dip4", ctypes.c_uint32),  # network order
        ("pad4", ctypes.c_uint32),
        ("pad5", ctypes.c_uint32),
        ("pad6", ctypes.c_uint32),
        ("family", ctypes.c_uint8),
        ("pad7", ctypes.c_uint8),  # 0: Cilium's struct has no protocol byte (bpf/sockops/bpf_sockops.h:27@v1.13.0)
        ("pad8", ctypes.c_uint16),
        ("sport", ctypes.c_uint32),  # network-order port in the low 16 bits
        ("dport", ctypes.c_uint32),
    ]

    @classmethod
    def make(cls, src: str, sport: int, dst: str, dport: int) -> "SockKey":
        """The key of a TCP socket from ``src:sport`` to ``dst:dport``."""
        def addr(a: str) -> int:
            return int.from_bytes(socket.inet_aton(a), "little")

        return cls(sip4=addr(src), dip4=addr(dst), family=_ENDPOINT_KEY_IPV4,
                   sport=socket.htons(sport), dport=socket.htons(dport))

    def swapped(self) -> "SockKey":
        """The same connection seen from the other end."""
        return SockKey(sip4=self.dip4, dip4=self.sip4, family=self.family, sport=self.dport, dport=self.sport)

    def endpoints(self) -> tuple[str, int, str, int]:
        """``(source, source port, destination, destination port)`` in host terms."""
        return (ipv4(self.sip4), socket.ntohs(self.sport & 0xFFFF), ipv4(self.dip4), socket.ntohs(self.dport & 0xFFFF))

    def __eq__(self, other) -> bool:
        return isinstance(other, SockKey) and bytes(self) == bytes(other)

    def __hash__(self) -> int:
        return hash(bytes(self))

    def __str__(self) -> str:
        src, sport, dst, dport = self.endpoints()
        return f"{src}:{sport} -> {dst}:{dport} TCP"  # the sockhash holds TCP sockets only

    __repr__ = __str__


def sock_keys(path: str) -> list[SockKey]:
    """Every key of the pinned sockhash at ``path`` (``bpftool map dump pinned PATH`` lists the same)."""
    fd = _bpf.obj_get(path)
    try:
        return [SockKey.from_buffer_copy(raw) for raw in _bpf.all_keys(fd, ctypes.sizeof(SockKey))]
    finally:
        os.close(fd)
