"""Connection-tracking rows: Cilium's CT key and entry, their flags, and the
``cilium-dbg bpf ct list global`` line grammar.

Keep in sync with bpf/lib/ct_types.h (tests/unit/test_layout.py compares the
compiled BTF with these classes).

    >>> key = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, TupleFlags.OUT)
    >>> entry = CtEntry(lifetime=100, flags=CtFlags.SEEN_NON_SYN, packets=3, bytes=222,
    ...                 tx_flags_seen=0x12, rx_flags_seen=0x12, src_sec_id=256)
    >>> print(CtRow.of(key, entry).line() + "|")  # doctest: +NORMALIZE_WHITESPACE
    TCP OUT 198.18.1.11:40000 -> 198.18.2.11:8080 expires=100 Packets=3 Bytes=222 RxFlagsSeen=0x12
    LastRxReport=0 TxFlagsSeen=0x12 LastTxReport=0 Flags=0x0010 [ SeenNonSyn ] RevNAT=0
    SourceSecurityID=256 IfIndex=0 BackendID=0 |

The grammar is the chosen release's (:mod:`labkit.release`): 1.18 drops
``IfIndex=``, 1.19 adds ``NatPort=`` at the end.

    >>> print(CtRow.of(key, entry, release="1.20").line()[-40:] + "|")
    rceSecurityID=256 BackendID=0 NatPort=0 |
"""
from __future__ import annotations

import ctypes
import enum
import operator
import socket
from dataclasses import asdict, dataclass, field, fields
from typing import Iterable

from labkit.addr import be32, ipv4
from labkit.release import DEFAULT_RELEASE, profile

__all__ = [
    "CtKey4",
    "CtEntry",
    "TupleFlags",
    "CtFlags",
    "TcpFlags",
    "CtResult",
    "CtDir",
    "CtRow",
    "CtDiff",
    "diff_rows",
    "proto_name",
    "list_text",
    "CT_MAPS",
]

#: The two CT maps of a node: TCP, and everything else (with the RELATED twins).
CT_MAPS = ("cilium_ct4_global", "cilium_ct_any4_global")
_PROTO_NAMES = {0: "ANY", 1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}


def proto_name(proto: int) -> str:
    """Cilium's name for an IP protocol number (the number itself otherwise).

    >>> proto_name(6), proto_name(47)
    ('TCP', '47')
    """
    return _PROTO_NAMES.get(proto, str(proto))


def _ntohs(v: int) -> int:
    return socket.ntohs(v)


class TupleFlags(enum.IntFlag):
    """``ipv4_ct_tuple.flags``: OUT is 0, so a key is OUT unless IN or SERVICE is set."""

    OUT = 0
    IN = 1
    RELATED = 2
    SERVICE = 4


_IN, _RELATED, _SERVICE = int(TupleFlags.IN), int(TupleFlags.RELATED), int(TupleFlags.SERVICE)


class CtDir(enum.IntEnum):
    """Direction of a lookup (``enum ct_dir``)."""

    EGRESS = 0
    INGRESS = 1
    SERVICE = 2


class CtResult(enum.IntEnum):
    """Result of a lookup (``enum ct_status``); NONE: the hook did no lookup."""

    NEW = 0
    ESTABLISHED = 1
    REPLY = 2
    RELATED = 3
    NONE = 0xFF


class CtFlags(enum.IntFlag):
    """The flag word of ``ct_entry``, named as ``cilium-dbg bpf ct list`` prints them."""

    RX_CLOSING = 0x0001
    TX_CLOSING = 0x0002
    NAT64 = 0x0004
    LB_LOOPBACK = 0x0008
    SEEN_NON_SYN = 0x0010
    NODE_PORT = 0x0020
    PROXY_REDIRECT = 0x0040
    DSR_INTERNAL = 0x0080
    FROM_L7LB = 0x0100
    FROM_TUNNEL = 0x0400

    @classmethod
    def names(cls, value: int) -> list[str]:
        """Cilium's names in Cilium's order, then ``Unknown=0x....`` for bits above the last
        flag; the reserved bit 0x0200 is never named (Cilium's ``flagsString`` masks it).

        >>> CtFlags.names(0x001B)
        ['RxClosing', 'TxClosing', 'LBLoopback', 'SeenNonSyn']
        >>> CtFlags.names(0x0200), CtFlags.names(0x0810)
        ([], ['SeenNonSyn', 'Unknown=0x0800'])
        """
        out = [name for bit, name in _CT_FLAG_NAMES if value & bit]
        unknown = value & ~(_MAX_FLAGS - 1) & 0xFFFF
        if unknown:
            out.append(f"Unknown={unknown:#06x}")
        return out


#: Cilium's MaxFlags (pkg/maps/ctmap): one past the last flag bit, FromTunnel.
_MAX_FLAGS = 0x0800
_CT_FLAG_NAMES = [
    (CtFlags.RX_CLOSING, "RxClosing"),
    (CtFlags.TX_CLOSING, "TxClosing"),
    (CtFlags.NAT64, "Nat64"),
    (CtFlags.LB_LOOPBACK, "LBLoopback"),
    (CtFlags.SEEN_NON_SYN, "SeenNonSyn"),
    (CtFlags.NODE_PORT, "NodePort"),
    (CtFlags.PROXY_REDIRECT, "ProxyRedirect"),
    (CtFlags.DSR_INTERNAL, "DSRInternal"),
    (CtFlags.FROM_L7LB, "FromL7LB"),
    (CtFlags.FROM_TUNNEL, "FromTunnel"),
]


class TcpFlags(enum.IntFlag):
    """The TCP flag byte, as seen in ``RxFlagsSeen``/``TxFlagsSeen``."""

    FIN = 0x01
    SYN = 0x02
    RST = 0x04
    PSH = 0x08
    ACK = 0x10
    URG = 0x20
    ECE = 0x40
    CWR = 0x80

    @classmethod
    def text(cls, value: int) -> str:
        """``SYN|ACK`` style, ``-`` for none.

        >>> TcpFlags.text(0x12)
        'SYN|ACK'
        """
        names = [f.name for f in cls if value & f]
        return "|".join(names) if names else "-"


class CtKey4(ctypes.LittleEndianStructure):
    """``struct ipv4_ct_tuple`` (14 bytes, packed). Addresses and ports are
    stored in network byte order exactly as the kernel holds them."""

    _pack_ = 1
    _fields_ = [
        ("daddr", ctypes.c_uint32),
        ("saddr", ctypes.c_uint32),
        ("dport", ctypes.c_uint16),
        ("sport", ctypes.c_uint16),
        ("nexthdr", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
    ]

    @classmethod
    def make(cls, src: str, dst: str, sport: int, dport: int, proto: int, flags: int) -> "CtKey4":
        """The stored key of a flow ``src:sport -> dst:dport`` (initiator first), for
        OUT/IN rows: daddr=src, saddr=dst, dport field=dst port, sport field=src port."""
        return cls(be32(src), be32(dst), socket.htons(dport), socket.htons(sport), proto, flags)

    def raw(self) -> bytes:
        """The 14 key bytes."""
        return bytes(self)


class CtEntry(ctypes.LittleEndianStructure):
    """``struct ct_entry`` (56 bytes). rev_nat_index is in network byte order."""

    _fields_ = [
        ("reserved0", ctypes.c_uint64),
        ("backend_id", ctypes.c_uint64),
        ("packets", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("lifetime", ctypes.c_uint32),
        ("flags", ctypes.c_uint16),
        ("rev_nat_index", ctypes.c_uint16),
        ("ifindex", ctypes.c_uint16),
        ("tx_flags_seen", ctypes.c_uint8),
        ("rx_flags_seen", ctypes.c_uint8),
        ("src_sec_id", ctypes.c_uint32),
        ("last_tx_report", ctypes.c_uint32),
        ("last_rx_report", ctypes.c_uint32),
    ]


@dataclass(frozen=True)
class CtRow:
    """One CT entry, decoded: what ``ct list`` prints and ``--json`` returns.

    ``src``/``dst`` read initiator → responder, as Cilium prints them.
    """

    map: str
    proto: int
    dir: str  #: OUT, IN or SVC
    related: bool
    src: str
    sport: int
    dst: str
    dport: int
    lifetime: int
    flags: int
    rev_nat: int  #: host byte order
    backend_id: int
    packets: int
    bytes: int
    tx_flags_seen: int
    rx_flags_seen: int
    last_tx_report: int
    last_rx_report: int
    src_sec_id: int
    ifindex: int  #: the u16 at offset 40: IfIndex in 1.16, reserved in 1.18, NatPort (network order) in 1.19+
    key: bytes = field(repr=False, compare=False)
    release: str = field(default=DEFAULT_RELEASE, repr=False, compare=False)  #: whose grammar line() prints

    @classmethod
    def of(cls, key: CtKey4, entry: CtEntry, map_name: str = "", release: str = DEFAULT_RELEASE) -> "CtRow":
        """Decode a key/entry pair read from ``map_name``, to print in ``release``'s grammar."""
        flags = key.flags  # as a plain int: a live table decodes a thousand rows per refresh
        if flags & _SERVICE:
            direction = "SVC"
            src, sport, dst, dport = key.saddr, key.dport, key.daddr, key.sport
        else:
            direction = "IN" if flags & _IN else "OUT"
            src, sport, dst, dport = key.daddr, key.sport, key.saddr, key.dport
        if not map_name:
            map_name = CT_MAPS[0] if key.nexthdr == socket.IPPROTO_TCP else CT_MAPS[1]
        return cls._made({
            "map": map_name, "proto": key.nexthdr, "dir": direction, "related": bool(flags & _RELATED),
            "src": ipv4(src), "sport": _ntohs(sport), "dst": ipv4(dst), "dport": _ntohs(dport),
            "lifetime": entry.lifetime, "flags": entry.flags, "rev_nat": _ntohs(entry.rev_nat_index),
            "backend_id": entry.backend_id, "packets": entry.packets, "bytes": entry.bytes,
            "tx_flags_seen": entry.tx_flags_seen, "rx_flags_seen": entry.rx_flags_seen,
            "last_tx_report": entry.last_tx_report, "last_rx_report": entry.last_rx_report,
            "src_sec_id": entry.src_sec_id, "ifindex": entry.ifindex, "key": key.raw(), "release": release,
        })

    @classmethod
    def from_fields(cls, values: dict) -> "CtRow":
        """A row from ``values``, a dict of every field (as :meth:`of` and labkitd's wire make them), made without
        the frozen dataclass's per-field ``object.__setattr__``: a live table builds a thousand rows a refresh.

        >>> row = CtRow.of(CtKey4.make("10.0.0.1", "10.0.0.2", 1000, 80, 6, 0), CtEntry(lifetime=60))
        >>> CtRow.from_fields(dict(row.__dict__)) == row
        True
        """
        if len(values) != len(_ROW_FIELDS) or values.keys() != _ROW_FIELDS:
            missing, extra = _ROW_FIELDS - values.keys(), values.keys() - _ROW_FIELDS
            raise TypeError(f"CtRow: expected every field of the row, got {sorted(missing)} missing and "
                            f"{sorted(extra)} unknown")
        return cls._made(values)

    @classmethod
    def _made(cls, values: dict) -> "CtRow":
        """A row from ``values``, which holds every field (the callers make sure of it)."""
        row = object.__new__(cls)
        row.__dict__.update(values)
        return row

    # -- reading ----------------------------------------------------------
    @property
    def proto_name(self) -> str:
        """TCP, UDP, ICMP, ..."""
        return proto_name(self.proto)

    @property
    def flag_names(self) -> list[str]:
        """Names of the set flags, in Cilium's order."""
        return CtFlags.names(self.flags)

    @property
    def ident(self) -> tuple:
        """What makes a row the same row across two dumps: its map and key."""
        return (self.map, self.key)

    def remaining(self, now: int) -> int:
        """Seconds until expiry on the lab clock (negative once expired)."""
        return self.lifetime - now

    def expired(self, now: int) -> bool:
        """True once the lab clock has passed the lifetime (the GC may delete it)."""
        return self.lifetime < now

    def flow(self) -> str:
        """``198.18.1.11:40000 -> 198.18.2.11:8080``"""
        return f"{self.src}:{self.sport} -> {self.dst}:{self.dport}"

    def line(self, now: int | None = None) -> str:
        """The row in ``cilium-dbg bpf ct list global`` grammar of the row's release, with the
        trailing space Cilium's format leaves; ``now`` adds the remaining time (``-d``).

        Cilium's format (pkg/maps/ctmap/types.go, ``CtEntry.StringWithTimeDiff``), v1.16:
        ``expires=%d%s Packets=%d Bytes=%d RxFlagsSeen=%#02x LastRxReport=%d TxFlagsSeen=%#02x
        LastTxReport=%d %s RevNAT=%d SourceSecurityID=%d IfIndex=%d BackendID=%d \\n``; 1.18 drops
        ``IfIndex=``, 1.19 appends ``NatPort=%d`` (cilium/cilium#43017).
        """
        remaining = f" (remaining: {self.remaining(now)} sec(s))" if now is not None else ""
        related = "related " if self.related else ""
        names = " ".join(self.flag_names)
        rel = profile(self.release)
        ifindex = "" if rel.has("ct_list_no_ifindex") else f"IfIndex={self.ifindex} "
        nat_port = f"NatPort={socket.ntohs(self.ifindex)} " if rel.has("ct_list_nat_port") else ""
        return (
            f"{self.proto_name} {self.dir} {self.flow()} {related}expires={self.lifetime}{remaining} "
            f"Packets={self.packets} Bytes={self.bytes} RxFlagsSeen={self.rx_flags_seen:#04x} "
            f"LastRxReport={self.last_rx_report} TxFlagsSeen={self.tx_flags_seen:#04x} "
            f"LastTxReport={self.last_tx_report} Flags={self.flags:#06x} [ {names + ' ' if names else ''}] "
            f"RevNAT={self.rev_nat} SourceSecurityID={self.src_sec_id} {ifindex}"
            f"BackendID={self.backend_id} {nat_port}"
        )

    def to_json(self, now: int | None = None) -> dict:
        """Plain data: proto, dir, src, dst, flags by name, rev_nat, backend_id, packets,
        bytes, expires, related (and remaining/expired when ``now`` is given)."""
        data = asdict(self)
        data.pop("key")
        data["proto"] = self.proto_name
        data["flags"] = self.flag_names
        data["flags_raw"] = self.flags
        data["expires"] = data.pop("lifetime")
        data["rx_flags_seen"] = TcpFlags.text(self.rx_flags_seen)
        data["tx_flags_seen"] = TcpFlags.text(self.tx_flags_seen)
        if now is not None:
            data["remaining"] = self.remaining(now)
            data["expired"] = self.expired(now)
        return data

    def __str__(self) -> str:
        return self.line()


#: every field of a CtRow (:meth:`CtRow.from_fields` checks a dict against it)
_ROW_FIELDS = frozenset(f.name for f in fields(CtRow))


def list_text(maps: "Iterable[Iterable[CtRow]]", now: int | None = None) -> str:
    """What ``cilium-dbg bpf ct list global`` prints for the given maps, in order: each row
    on its line, and a blank line after each map (Cilium prints each map's dump with
    ``fmt.Println``), an empty map being just that blank line.

    >>> k = CtKey4.make("198.18.1.11", "198.18.2.11", 1, 2, 17, 0)
    >>> list_text([[], [CtRow.of(k, CtEntry())]]).count("\\n"), list_text([[], []])
    (3, '\\n\\n')
    """
    return "".join("".join(row.line(now) + "\n" for row in rows) + "\n" for rows in maps)


@dataclass(frozen=True)
class CtDiff:
    """What changed between two dumps: rows added, removed, and changed fields."""

    added: tuple[CtRow, ...] = ()
    removed: tuple[CtRow, ...] = ()
    changed: tuple[tuple[CtRow, CtRow, tuple[str, ...]], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def lines(self) -> list[str]:
        """``+`` added, ``-`` removed, ``~`` changed (with the fields that moved)."""
        out = [f"+ {r.line()}" for r in self.added]
        out += [f"- {r.line()}" for r in self.removed]
        for old, new, fields in self.changed:
            moved = ", ".join(f"{f} {getattr(old, f)}→{getattr(new, f)}" for f in fields)
            out.append(f"~ {new.proto_name} {new.dir} {new.flow()}{' related' if new.related else ''}: {moved}")
        return out


_DIFF_FIELDS = (
    "lifetime",
    "flags",
    "rev_nat",
    "backend_id",
    "packets",
    "bytes",
    "tx_flags_seen",
    "rx_flags_seen",
    "last_tx_report",
    "last_rx_report",
    "src_sec_id",
    "ifindex",
)


def diff_rows(before: Iterable[CtRow], after: Iterable[CtRow], fields: tuple[str, ...] = _DIFF_FIELDS) -> CtDiff:
    """Rows added, removed and changed between two snapshots (keyed by ``ident``); ``fields`` are
    the ones compared (other row families, e.g. NAT rows, pass their own).

    >>> k = CtKey4.make("198.18.1.11", "198.18.2.11", 1, 2, 17, 0)
    >>> a, b = CtRow.of(k, CtEntry(packets=1)), CtRow.of(k, CtEntry(packets=2))
    >>> diff_rows([a], [b]).lines()
    ['~ UDP OUT 198.18.1.11:1 -> 198.18.2.11:2: packets 1→2']
    """
    old = {r.ident: r for r in before}
    new = {r.ident: r for r in after}
    added = tuple(new[k] for k in new if k not in old)
    removed = tuple(old[k] for k in old if k not in new)
    changed = []
    values = operator.attrgetter(*fields)  # one C call a row: most rows of a refresh did not change
    for k in new:
        if k in old and values(old[k]) != values(new[k]):
            fields_ = tuple(f for f in fields if getattr(old[k], f) != getattr(new[k], f))
            changed.append((old[k], new[k], fields_))
    return CtDiff(added, removed, tuple(changed))
