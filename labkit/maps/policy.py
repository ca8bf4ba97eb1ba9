"""Per-endpoint policy map rows: Cilium v1.16's ``struct policy_key`` (an LPM-trie key)
and ``struct policy_entry``, their flags, and the ``cilium-dbg bpf policy get`` table.
Keep in sync with bpf/lib/policy_types.h (tests/unit/test_layout.py compares the layouts).

The key is 12 bytes: ``prefixlen`` (the LPM header), then identity, direction
(egress bit), protocol and destination port (network byte order). The first 40 bits
after the header (identity + direction byte) are always matched
(:data:`STATIC_PREFIX_BITS`); the protocol adds 8, a port up to 16 more, so a
wildcard is simply a shorter prefix: 0 for the identity means "any identity" by
value, not by prefix.

    >>> k = PolicyKey.make(256, Direction.INGRESS, proto=6, dport=8080)
    >>> k.prefixlen, k.port_proto(), len(bytes(k))
    (64, '8080/TCP', 12)
    >>> e = PolicyEntry.allow(k)
    >>> int(e.flags), str(e.flags)
    (0, 'Allow')
    >>> str(PolicyEntry.deny(PolicyKey.make(0, Direction.EGRESS)).flags)
    'Deny, WildcardProtocol, WildcardPort'
"""
from __future__ import annotations

import ctypes
import enum
import socket
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from labkit._tabwriter import tabwrite

__all__ = [
    "Direction",
    "PolicyFlags",
    "AuthType",
    "PolicyKey",
    "PolicyEntry",
    "PolicyRow",
    "policy_get_lines",
    "sort_rows",
    "STATIC_PREFIX_BITS",
    "NEXTHDR_BITS",
    "DPORT_BITS",
    "FULL_PREFIX_BITS",
    "POLICY_MAP_PREFIX",
    "POLICY_MAP_MAX_ENTRIES",
]

#: pkg/maps/policymap: sizeof(PolicyKey) - sizeof(Prefixlen) in bits, minus the L4 part.
NEXTHDR_BITS = 8
DPORT_BITS = 16
FULL_PREFIX_BITS = NEXTHDR_BITS + DPORT_BITS
STATIC_PREFIX_BITS = (12 - 4) * 8 - FULL_PREFIX_BITS  # 40: identity + the direction byte
#: MapName: one map per endpoint, ``cilium_policy_<endpoint id>`` (five digits on bpffs).
POLICY_MAP_PREFIX = "cilium_policy_"
#: MaxEntries default (policy-map-max-entries).
POLICY_MAP_MAX_ENTRIES = 16384

_PROTO_NAMES = {0: "ANY", 1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}


class Direction(enum.IntEnum):
    """pkg/policy/trafficdirection: the key's egress bit."""

    INGRESS = 0
    EGRESS = 1

    def __str__(self) -> str:
        return self.name.capitalize()


class PolicyFlags(enum.IntFlag):
    """The flag byte of ``policy_entry`` (deny:1, wildcard_protocol:1, wildcard_dport:1)."""

    DENY = 1
    WILDCARD_PROTOCOL = 2
    WILDCARD_DPORT = 4

    def __str__(self) -> str:
        # policymap.go policyEntryFlags.String
        out = ["Deny" if self & PolicyFlags.DENY else "Allow"]
        if self & PolicyFlags.WILDCARD_PROTOCOL:
            out.append("WildcardProtocol")
        if self & PolicyFlags.WILDCARD_DPORT:
            out.append("WildcardPort")
        return ", ".join(out)


class AuthType(enum.IntEnum):
    """pkg/policy AuthType, printed in the AUTH TYPE column."""

    DISABLED = 0
    SPIRE = 1
    ALWAYS_FAIL = 2

    def __str__(self) -> str:
        return {0: "disabled", 1: "spire", 2: "test-always-fail"}[self.value]


def _port_mask_bits(mask: int) -> int:
    """Bits a port mask fixes: 0xffff → 16, 0xff00 → 8 (16 minus its trailing zeros)."""
    if mask == 0:
        return 0
    return DPORT_BITS - ((mask & -mask).bit_length() - 1)


class PolicyKey(ctypes.LittleEndianStructure):
    """``struct policy_key`` (12 bytes): bpf_lpm_trie_key header, sec_label, egress bit,
    protocol, dport (network byte order)."""

    _pack_ = 1
    _fields_ = [
        ("prefixlen", ctypes.c_uint32),
        ("sec_label", ctypes.c_uint32),
        ("egress", ctypes.c_uint8),
        ("protocol", ctypes.c_uint8),
        ("dport_be", ctypes.c_uint16),
    ]

    @classmethod
    def make(cls, identity: int, direction: Direction, proto: int = 0, dport: int = 0,
             mask: int = 0xFFFF) -> "PolicyKey":
        """policymap.NewKey: prefix 40, +8 when the protocol or port is given, + the mask's
        bits when a port is given.

        >>> PolicyKey.make(0, Direction.INGRESS).prefixlen, PolicyKey.make(0, Direction.INGRESS, 6).prefixlen
        (40, 48)
        >>> PolicyKey.make(0, Direction.INGRESS, 6, 0x0100, 0xff00).port_proto()
        '256-511/TCP'
        """
        prefix = STATIC_PREFIX_BITS
        if proto or dport:
            prefix += NEXTHDR_BITS
            if dport:
                prefix += _port_mask_bits(mask)
        return cls(prefixlen=prefix, sec_label=identity, egress=int(direction), protocol=proto,
                   dport_be=socket.htons(dport))

    @classmethod
    def from_bytes(cls, raw: bytes) -> "PolicyKey":
        """The key from its 12 bytes."""
        return cls.from_buffer_copy(raw)

    @property
    def dport(self) -> int:
        """Destination port, host order."""
        return socket.ntohs(self.dport_be)

    @property
    def direction(self) -> Direction:
        return Direction(self.egress & 1)

    @property
    def l4_prefix(self) -> int:
        """Prefix bits past the identity and direction: 0 (any), 8 (protocol), 9-24 (port)."""
        return self.prefixlen - STATIC_PREFIX_BITS

    def port_mask(self) -> int:
        """The port mask the prefix stands for (0 when the port is wildcarded)."""
        bits = self.l4_prefix - NEXTHDR_BITS
        return 0 if bits <= 0 else (0xFFFF << (DPORT_BITS - bits)) & 0xFFFF

    def port_proto(self) -> str:
        """policymap.go PortProtoString: ``ANY``, ``TCP``, ``80/TCP`` or ``256-511/TCP``."""
        proto = _PROTO_NAMES.get(self.protocol, str(self.protocol))
        plen = self.l4_prefix
        if plen in (0, NEXTHDR_BITS):
            return proto
        if NEXTHDR_BITS < plen < FULL_PREFIX_BITS:
            span = 0xFFFF >> (plen - NEXTHDR_BITS)
            return f"{self.dport}-{self.dport + span}/{proto}"
        if plen == FULL_PREFIX_BITS:
            return f"{self.dport}/{proto}"
        return f"<INVALID PREFIX LENGTH: {plen}>"

    def tuple(self) -> tuple[int, int, int, int, int]:
        """(identity, direction, protocol, port, prefixlen): a hashable, comparable form."""
        return (self.sec_label, self.egress, self.protocol, self.dport, self.prefixlen)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicyKey) and bytes(self) == bytes(other)

    def __hash__(self) -> int:
        return hash(bytes(self))

    def __repr__(self) -> str:
        return f"PolicyKey({self})"

    def __str__(self) -> str:
        # policymap.go PolicyKey.String: "<Direction>: <identity> <port/proto>"
        return f"{self.direction}: {self.sec_label} {self.port_proto()}"


class PolicyEntry(ctypes.LittleEndianStructure):
    """``struct policy_entry`` (24 bytes): proxy_port (network order), the flag byte,
    auth_type, two pads, then the packet and byte counters the datapath increments."""

    _fields_ = [
        ("proxy_port_be", ctypes.c_uint16),
        ("flag_bits", ctypes.c_uint8),
        ("auth_type", ctypes.c_uint8),
        ("pad1", ctypes.c_uint16),
        ("pad2", ctypes.c_uint16),
        ("packets", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
    ]

    @staticmethod
    def _wildcards(key: PolicyKey) -> PolicyFlags:
        flags = PolicyFlags(0)
        if key.protocol == 0:
            flags |= PolicyFlags.WILDCARD_PROTOCOL
        if key.dport_be == 0:
            flags |= PolicyFlags.WILDCARD_DPORT
        return flags

    @classmethod
    def allow(cls, key: PolicyKey, proxy_port: int = 0, auth_type: int = 0) -> "PolicyEntry":
        """newAllowEntry: the wildcard bits follow the key's protocol and port."""
        return cls(proxy_port_be=socket.htons(proxy_port), flag_bits=int(cls._wildcards(key)),
                   auth_type=auth_type)

    @classmethod
    def deny(cls, key: PolicyKey) -> "PolicyEntry":
        """newDenyEntry: deny bit, wildcard bits, no proxy port, no auth."""
        return cls(flag_bits=int(PolicyFlags.DENY | cls._wildcards(key)))

    @classmethod
    def from_bytes(cls, raw: bytes) -> "PolicyEntry":
        return cls.from_buffer_copy(raw)

    @property
    def flags(self) -> PolicyFlags:
        return PolicyFlags(self.flag_bits)

    @property
    def is_deny(self) -> bool:
        return bool(self.flag_bits & PolicyFlags.DENY)

    @property
    def proxy_port(self) -> int:
        return socket.ntohs(self.proxy_port_be)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PolicyEntry) and bytes(self) == bytes(other)

    def __repr__(self) -> str:
        return f"PolicyEntry({self.flags}, proxy_port={self.proxy_port}, packets={self.packets}, bytes={self.bytes})"


@dataclass(frozen=True)
class PolicyRow:
    """One row of an endpoint's policy map."""

    key: PolicyKey
    entry: PolicyEntry


def sort_rows(rows: Iterable[PolicyRow]) -> list[PolicyRow]:
    """PolicyEntriesDump.Less: denies first, then ingress before egress, then by identity."""
    return sorted(rows, key=lambda r: (not r.entry.is_deny, r.key.egress, r.key.sec_label))


def policy_get_lines(rows: Iterable[PolicyRow], labels: Callable[[int], Sequence[str]] | None = None,
                     numeric: bool = False) -> list[str]:
    """``cilium-dbg bpf policy get <ep>`` (cilium-dbg/cmd/bpf_policy_get.go formatMap, v1.16):
    POLICY, DIRECTION, LABELS (or IDENTITY with ``-n``), PORT/PROTO, PROXY PORT, AUTH TYPE,
    BYTES, PACKETS, PREFIX; an identity with several labels takes one line per label.
    ``labels(identity)`` gives an identity's printable labels (``reserved:unknown`` for 0).

    >>> k = PolicyKey.make(0, Direction.INGRESS)
    >>> for line in policy_get_lines([PolicyRow(k, PolicyEntry.allow(k))], lambda i: ["reserved:unknown"]):
    ...     print(line.rstrip())
    POLICY   DIRECTION   LABELS (source:key[=value])   PORT/PROTO   PROXY PORT   AUTH TYPE   BYTES   PACKETS   PREFIX
    Allow    Ingress     reserved:unknown              ANY          NONE         disabled    0       0         0
    """
    rows = sort_rows(rows)
    title = "IDENTITY" if numeric else "LABELS (source:key[=value])"
    text = f"POLICY\tDIRECTION\t{title}\tPORT/PROTO\tPROXY PORT\tAUTH TYPE\tBYTES\tPACKETS\tPREFIX\t\n"
    for row in rows:
        k, e = row.key, row.entry
        policy = "Deny" if e.is_deny else "Allow"
        proxy = str(e.proxy_port) if e.proxy_port else "NONE"
        auth = str(AuthType(e.auth_type)) if e.auth_type in (0, 1, 2) else f"Unknown-auth-type-{e.auth_type}"
        tail = f"{k.port_proto()}\t{proxy}\t{auth}\t{e.bytes}\t{e.packets}\t{k.l4_prefix}\t\n"
        lbls = [] if numeric or labels is None else list(labels(k.sec_label))
        if not lbls:
            text += f"{policy}\t{k.direction}\t{k.sec_label}\t{tail}"
            continue
        text += f"{policy}\t{k.direction}\t{lbls[0]}\t{tail}"
        for extra in lbls[1:]:
            text += f"\t\t{extra}\t\t\t\t\t\t\t\n"
    return tabwrite(text).splitlines()
