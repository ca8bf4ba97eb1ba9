"""NAT rows: Cilium's ``cilium_snat_v4_external`` map, its key and entry, and
the ``cilium-dbg bpf nat list`` line grammar.

Keep in sync with bpf/lib/nat_types.h (tests/unit/test_layout.py compares the
compiled BTF with these classes, tests/unit/test_constants.py the #defines).

The key is the CT key, ``struct ipv4_ct_tuple`` (14 bytes, packed), but the
NAT code fills it *without* the CT's port swap: ``saddr:sport`` is where the
packet comes from and ``daddr:dport`` where it goes. An OUT entry (egress)
rewrites the source of a leaving packet; an IN entry rewrites the destination
of the reply coming back. The entry holds the rewrite, ``to_addr:to_port``.

The NodePort code of bpf_host.c writes it: SNAT pairs in snat mode, the
frontend of a DSR flow on the backend's node (bpf/lib/nat.h).

``Created=`` is how long ago the entry was made, in seconds, as Cilium's
``NatEntry4.Dump`` prints it with the agent's clock source; a row read from a
lab carries the lab clock at the time it was read (``now``). Without it
Cilium prints the raw value, and so does labkit.

    >>> out = NatKey4.make("198.18.1.11", "203.0.113.7", 40000, 80, 6, TupleFlags.OUT)
    >>> print(NatRow.of(out, NatEntry.make("198.51.100.11", 40000, created=1200, needs_ct=1), now=1212).line())
    TCP OUT 198.18.1.11:40000 -> 203.0.113.7:80 XLATE_SRC 198.51.100.11:40000 Created=12sec ago NeedsCT=1
    >>> back = NatKey4.make("203.0.113.7", "198.51.100.11", 80, 40000, 6, TupleFlags.IN)
    >>> print(NatRow.of(back, NatEntry.make("198.18.1.11", 40000, created=1200, needs_ct=1)).line())
    TCP IN 203.0.113.7:80 -> 198.51.100.11:40000 XLATE_DST 198.18.1.11:40000 Created=? (raw 1200) NeedsCT=1
"""
from __future__ import annotations

import ctypes
import enum
import socket
from dataclasses import asdict, dataclass, field
from typing import Iterable

from labkit.addr import be32, ipv4
from labkit.maps.ct import CtDiff, CtKey4, TupleFlags, diff_rows, proto_name

__all__ = [
    "NatKey4",
    "NatEntry",
    "NatDir",
    "NatRow",
    "diff_nat_rows",
    "NAT_MAP",
    "NAT_MAP_SIZE",
]

#: The node's IPv4 NAT map (Cilium's name).
NAT_MAP = "cilium_snat_v4_external"
#: Its max entries: Cilium's ``--bpf-nat-global-max`` default (NAT_MAP_SIZE in nat_types.h).
NAT_MAP_SIZE = 524288


class NatDir(enum.IntEnum):
    """Direction of a NAT entry (Cilium's ``enum nat_dir``): the key's TUPLE_F_OUT / TUPLE_F_IN."""

    EGRESS = 0
    INGRESS = 1


class NatKey4(ctypes.LittleEndianStructure):
    """``struct ipv4_ct_tuple`` as the NAT map uses it: the CT key's 14 bytes and
    member names (the layout is CtKey4's), but with the ports **not** swapped.

    ``saddr``/``sport`` are the packet's source, ``daddr``/``dport`` its
    destination, all in network byte order; ``flags`` is TUPLE_F_OUT (0) for
    egress entries and TUPLE_F_IN (1) for ingress ones. A separate class from
    CtKey4 so that a NAT key is never decoded with the CT's swapped reading.

    >>> k = NatKey4.make("198.18.1.11", "203.0.113.7", 40000, 80, 6)
    >>> bytes(k).hex(" ")
    'cb 00 71 07 c6 12 01 0b 00 50 9c 40 06 00'
    """

    _pack_ = 1
    _fields_ = CtKey4._fields_

    @classmethod
    def make(cls, src: str, dst: str, sport: int, dport: int, proto: int,
             flags: int = TupleFlags.OUT) -> "NatKey4":
        """The key of a packet ``src:sport -> dst:dport`` as it is stored:
        saddr=src, daddr=dst, sport=sport, dport=dport (no swap)."""
        return cls(daddr=be32(dst), saddr=be32(src), dport=socket.htons(dport), sport=socket.htons(sport),
                   nexthdr=proto, flags=flags)

    def raw(self) -> bytes:
        """The 14 key bytes."""
        return bytes(self)


class NatEntry(ctypes.LittleEndianStructure):
    """``struct ipv4_nat_entry`` (40 bytes). ``to_addr``/``to_port`` are in network
    byte order; ``created`` is in seconds of the lab clock."""

    _fields_ = [
        ("created", ctypes.c_uint64),
        ("needs_ct", ctypes.c_uint64),
        ("pad1", ctypes.c_uint64),
        ("pad2", ctypes.c_uint64),
        ("to_addr", ctypes.c_uint32),
        ("to_port", ctypes.c_uint16),
        ("pad3", ctypes.c_uint16),
    ]

    @classmethod
    def make(cls, to_addr: str, to_port: int, created: int = 0, needs_ct: int = 0) -> "NatEntry":
        """An entry rewriting to ``to_addr:to_port`` (the source for OUT keys, the destination for IN)."""
        return cls(created=created, needs_ct=needs_ct, to_addr=be32(to_addr), to_port=socket.htons(to_port))


@dataclass(frozen=True)
class NatRow:
    """One NAT entry, decoded: what ``nat list`` prints and ``--json`` returns.

    ``src``/``dst`` are the packet's source and destination as the key holds
    them (no swap); ``to_addr:to_port`` replaces the source (OUT) or the
    destination (IN). Ports and addresses are in host form.
    """

    proto: int
    dir: str  #: OUT or IN
    src: str
    sport: int
    dst: str
    dport: int
    to_addr: str
    to_port: int
    created: int  #: lab-clock seconds
    needs_ct: int
    key: bytes = field(repr=False, compare=False)
    now: int | None = field(default=None, repr=False, compare=False)  #: the lab clock when it was read

    @classmethod
    def of(cls, key: NatKey4, entry: NatEntry, now: int | None = None) -> "NatRow":
        """Decode a key/entry pair read from the NAT map at lab-clock second ``now``."""
        return cls(
            proto=key.nexthdr,
            dir="IN" if key.flags & TupleFlags.IN else "OUT",
            src=ipv4(key.saddr),
            sport=socket.ntohs(key.sport),
            dst=ipv4(key.daddr),
            dport=socket.ntohs(key.dport),
            to_addr=ipv4(entry.to_addr),
            to_port=socket.ntohs(entry.to_port),
            created=entry.created,
            needs_ct=entry.needs_ct,
            key=bytes(key),
            now=now,
        )

    # -- reading ----------------------------------------------------------
    @property
    def proto_name(self) -> str:
        """TCP, UDP, ICMP, ..."""
        return proto_name(self.proto)

    @property
    def xlate(self) -> str:
        """What the entry rewrites: ``SRC`` for OUT entries, ``DST`` for IN entries."""
        return "DST" if self.dir == "IN" else "SRC"

    @property
    def related(self) -> bool:
        """Always False: NAT keys have no RELATED twin (here so :class:`CtDiff` can print NAT rows)."""
        return False

    @property
    def ident(self) -> tuple:
        """What makes a row the same row across two dumps: its map and key."""
        return (NAT_MAP, self.key)

    def flow(self) -> str:
        """``198.18.1.11:40000 -> 203.0.113.7:80``"""
        return f"{self.src}:{self.sport} -> {self.dst}:{self.dport}"

    def line(self) -> str:
        """The row in ``cilium-dbg bpf nat list`` grammar: the key (``TupleKey4Global.Dump``, no
        port swap) then ``XLATE_%s %s:%d Created=%s NeedsCT=%d`` (``NatEntry4.Dump``)."""
        created = f"{self.now - self.created}sec ago" if self.now is not None else f"? (raw {self.created})"
        return (f"{self.proto_name} {self.dir} {self.flow()} XLATE_{self.xlate} {self.to_addr}:{self.to_port} "
                f"Created={created} NeedsCT={self.needs_ct}")

    def to_json(self) -> dict:
        """Plain data: proto (by name), dir, src, sport, dst, dport, xlate, to_addr, to_port, created, needs_ct."""
        data = asdict(self)
        data.pop("key")
        data["proto"] = self.proto_name
        data["xlate"] = self.xlate
        data.pop("now")
        if self.now is not None:
            data["age"] = self.now - self.created
        return data

    def __str__(self) -> str:
        return self.line()


_NAT_DIFF_FIELDS = ("to_addr", "to_port", "created", "needs_ct")


def diff_nat_rows(before: Iterable[NatRow], after: Iterable[NatRow]) -> CtDiff:
    """Rows added, removed and changed between two NAT dumps (keyed by key), as a
    :class:`~labkit.maps.ct.CtDiff` whose ``lines()`` print ``+``/``-``/``~`` like CT diffs.

    >>> k = NatKey4.make("198.18.1.11", "203.0.113.7", 40000, 80, 6)
    >>> a = NatRow.of(k, NatEntry.make("198.51.100.11", 40000))
    >>> b = NatRow.of(k, NatEntry.make("198.51.100.11", 40001))
    >>> diff_nat_rows([a], [b]).lines()
    ['~ TCP OUT 198.18.1.11:40000 -> 203.0.113.7:80: to_port 40000→40001']
    >>> diff_nat_rows([a], []).lines()[0][:2], bool(diff_nat_rows([a], [a]))
    ('- ', False)
    """
    return diff_rows(before, after, _NAT_DIFF_FIELDS)
