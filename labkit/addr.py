"""IPv4 addresses as the datapath holds them: a ``__be32``.

The programs keep addresses in network byte order; a ctypes ``c_uint32`` field,
a BPF register and a ``-D`` macro read those four bytes in host order. These two
functions are the only place labkit converts between that number and the dotted
form:

    >>> ipv4(be32("198.18.1.11"))
    '198.18.1.11'
    >>> be32("198.18.1.11").to_bytes(4, "little") == bytes([198, 18, 1, 11])  # on a little-endian host
    True
"""
from __future__ import annotations

import socket
import struct

__all__ = ["be32", "ipv4"]


def be32(ip: str) -> int:
    """A dotted IPv4 address as the ``__be32`` a map field or register holds (network bytes, host-order read).

    >>> be32("0.0.0.0")
    0
    """
    return struct.unpack("=I", socket.inet_aton(ip))[0]


def ipv4(value: int) -> str:
    """The dotted form of a ``__be32`` read from a map row or trace record.

    >>> ipv4(be32("203.0.113.10"))
    '203.0.113.10'
    """
    return socket.inet_ntoa(struct.pack("=I", value))
