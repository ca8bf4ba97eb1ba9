"""Service load balancing: Cilium's ``cilium_lb4_*`` keys and values, their
flags, and the ``cilium service list`` / ``cilium bpf lb list`` views.

Keep in sync with bpf/lib/lb_types.h (tests/unit/test_layout.py compares the
compiled BTF with these classes, tests/unit/test_constants.py the #defines).

One Service is several rows of ``cilium_lb4_services_v2``, all with the same
VIP, port and protocol: slot 0 is the *head* (how many active backends, the
service id), slots 1..count name one backend each, and terminating backends
follow after count, where the random pick ``slot = rand % count + 1`` never
lands. Byte orders are the kernel's: addresses, ports and ``rev_nat_index``
in network order, ``backend_slot``, ``backend_id`` and ``count`` in host order.

The protocol byte depends on the release (:mod:`labkit.release`, ``lb_proto_keys``):
Cilium v1.16's agent writes 0 (ANY) in every key and backend, 1.17+ writes the
L4 protocol (cilium/cilium#33434). The views print what that release prints.

    >>> key = Lb4Key.make("198.19.0.10", 80, 0)
    >>> head = Lb4Service.head(count=2, rev_nat_index=1)
    >>> str(key), head.head_text()
    ('198.19.0.10:80/ANY slot 0', 'head: count=2 rev_nat=1 flags=[ClusterIP, non-routable]')
    >>> bytes(key).hex(" "), bytes(head).hex(" ")
    ('c6 13 00 0a 00 50 00 00 00 00 00 00', '00 00 00 00 02 00 00 01 00 00 00 00')
    >>> str(Lb4Backend.make("198.18.2.11", 8080, "TCP"))
    '198.18.2.11:8080/TCP (active)'
"""
from __future__ import annotations

import ctypes
import enum
import os
import socket
import struct
from dataclasses import dataclass
from typing import Iterable

from labkit._tabwriter import CILIUM as _CILIUM_TABWRITER
from labkit._tabwriter import tabwrite
from labkit.addr import be32, ipv4
from labkit.errors import ConfigError
from labkit.datapath import bpf as _bpf
from labkit.maps.base import PinnedMap
from labkit.release import DEFAULT_RELEASE, profile

__all__ = [
    "Lb4Key",
    "Lb4Service",
    "Lb4Backend",
    "Lb4BackendKey",
    "Lb4ReverseNat",
    "Lb4RevNatKey",
    "Lb4AffinityKey",
    "LbAffinityVal",
    "LbAffinityMatch",
    "LbAffinityMatchValue",
    "Ipv4RevnatTuple",
    "Ipv4RevnatEntry",
    "ServiceFlags",
    "ServiceFlags2",
    "BackendState",
    "LookupScope",
    "LbBackendRow",
    "LbServiceRow",
    "LbSnapshot",
    "proto_number",
    "service_type",
    "flag_names",
    "l3n4_text",
    "SERVICES_MAP",
    "BACKENDS_MAP",
    "REVNAT_MAP",
    "AFFINITY_MAP",
    "AFFINITY_MATCH_MAP",
    "REVERSE_SK_MAP",
    "LB_MAPS",
    "MAGLEV_MAP",
    "MaglevLut",
    "PinnedMaglev",
]

SERVICES_MAP = "cilium_lb4_services_v2"
BACKENDS_MAP = "cilium_lb4_backends_v3"
REVNAT_MAP = "cilium_lb4_reverse_nat"
AFFINITY_MAP = "cilium_lb4_affinity"
AFFINITY_MATCH_MAP = "cilium_lb_affinity_match"
REVERSE_SK_MAP = "cilium_lb4_reverse_sk"
MAGLEV_MAP = "cilium_lb4_maglev"

_PROTOS = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP}
#: Cilium's u8proto names (pkg/u8proto): what `bpf lb list` prints after a key's or backend's port.
_PROTO_NAMES = {0: "ANY", 1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP"}


def proto_number(proto: str | int) -> int:
    """The IP protocol number the keys carry: TCP 6, UDP 17 (numbers pass through).

    >>> proto_number("tcp"), proto_number("UDP"), proto_number(6)
    (6, 17, 6)
    """
    if isinstance(proto, int):
        return proto
    try:
        return _PROTOS[proto.upper()]
    except KeyError:
        raise ValueError(f"protocol {proto!r}: expected TCP or UDP") from None


def _proto_name(proto: int) -> str:
    return _PROTO_NAMES.get(proto, str(proto))


# -- flags -----------------------------------------------------------------------
class ServiceFlags(enum.IntFlag):
    """``lb4_service.flags`` (``SVC_FLAG_*``). A ClusterIP service sets none of
    the type bits; without ROUTABLE Cilium calls it ``non-routable``."""

    EXTERNAL_IP = 0x01
    NODEPORT = 0x02
    EXT_LOCAL_SCOPE = 0x04
    HOSTPORT = 0x08
    AFFINITY = 0x10
    LOADBALANCER = 0x20
    ROUTABLE = 0x40
    SOURCE_RANGE = 0x80


class ServiceFlags2(enum.IntFlag):
    """``lb4_service.flags2`` (the second ``SVC_FLAG_*`` byte)."""

    LOCALREDIRECT = 0x01
    NAT_46X64 = 0x02
    L7LOADBALANCER = 0x04
    LOOPBACK = 0x08
    INT_LOCAL_SCOPE = 0x10
    TWO_SCOPES = 0x20


def service_type(flags: int, flags2: int = 0) -> str:
    """The Kubernetes type a head's flags spell, as Cilium names it.

    >>> service_type(0), service_type(ServiceFlags.NODEPORT), service_type(0, ServiceFlags2.LOCALREDIRECT)
    ('ClusterIP', 'NodePort', 'LocalRedirect')
    """
    if flags & ServiceFlags.EXTERNAL_IP:
        return "ExternalIPs"
    if flags & ServiceFlags.NODEPORT:
        return "NodePort"
    if flags & ServiceFlags.LOADBALANCER:
        return "LoadBalancer"
    if flags & ServiceFlags.HOSTPORT:
        return "HostPort"
    if flags2 & ServiceFlags2.LOCALREDIRECT:
        return "LocalRedirect"
    return "ClusterIP"


def flag_names(flags: int, flags2: int = 0) -> list[str]:
    """Cilium's ``ServiceFlags.String()`` words, in its order, then ``Unknown=0x..``.

    The order is v1.16's pkg/loadbalancer (flags | flags2 << 8 as one uint16): the type,
    ``Local``, ``InternalLocal``, ``two-scopes``, ``sessionAffinity``, ``non-routable``,
    ``check source-range``, ``46x64``, ``l7-load-balancer``, ``loopback``. (Later releases
    add words for bits labkit never writes: ``deny``, ``quarantined``, ``dsr``, and say
    ``delegate-if-local`` for the loopback bit outside HostPort.)

    >>> flag_names(ServiceFlags.AFFINITY)
    ['ClusterIP', 'sessionAffinity', 'non-routable']
    >>> flag_names(ServiceFlags.NODEPORT | ServiceFlags.EXT_LOCAL_SCOPE | ServiceFlags.ROUTABLE, ServiceFlags2.TWO_SCOPES)
    ['NodePort', 'Local', 'two-scopes']
    """
    out = [service_type(flags, flags2)]
    if flags & ServiceFlags.EXT_LOCAL_SCOPE:
        out.append("Local")
    if flags2 & ServiceFlags2.INT_LOCAL_SCOPE:
        out.append("InternalLocal")
    if flags2 & ServiceFlags2.TWO_SCOPES:
        out.append("two-scopes")
    if flags & ServiceFlags.AFFINITY:
        out.append("sessionAffinity")
    if not flags & ServiceFlags.ROUTABLE:
        out.append("non-routable")
    if flags & ServiceFlags.SOURCE_RANGE:
        out.append("check source-range")
    if flags2 & ServiceFlags2.NAT_46X64:
        out.append("46x64")
    if flags2 & ServiceFlags2.L7LOADBALANCER:
        out.append("l7-load-balancer")
    if flags2 & ServiceFlags2.LOOPBACK:
        out.append("loopback")
    unknown = flags2 & ~sum(ServiceFlags2) & 0xFF
    if unknown:
        out.append(f"Unknown=0x{unknown:02x}")
    return out


def l3n4_text(ip: str, port: int, proto: int | str, scope: int = 0, cilium: str = DEFAULT_RELEASE) -> str:
    """An address as Cilium's ``L3n4Addr.String()`` prints it in ``service list``: v1.16
    ``ip:port`` (pkg/loadbalancer: ``"%s:%d%s"``), 1.17+ ``ip:port/TCP``
    (``StringWithProtocol``); ``/i`` after it for the internal scope.

    >>> l3n4_text("198.19.0.10", 80, 6), l3n4_text("198.19.0.10", 80, 6, LookupScope.INT, cilium="1.20")
    ('198.19.0.10:80', '198.19.0.10:80/TCP/i')
    """
    name = proto if isinstance(proto, str) else _proto_name(proto)
    text = f"{ip}:{port}/{name}" if profile(cilium).has("lb_proto_keys") else f"{ip}:{port}"
    return text + ("/i" if scope == LookupScope.INT else "")


class BackendState(enum.IntEnum):
    """``lb4_backend.flags``: the backend's state (``BE_STATE_*``)."""

    ACTIVE = 0
    TERMINATING = 1
    QUARANTINED = 2
    MAINTENANCE = 3

    @property
    def label(self) -> str:
        """``active``, ``terminating``, ... as ``cilium service list`` prints it."""
        return self.name.lower()

    @classmethod
    def of(cls, value: int) -> str:
        """The label of a raw flags byte (``unknown(7)`` outside the enum).

        >>> BackendState.of(1), BackendState.of(9)
        ('terminating', 'unknown(9)')
        """
        try:
            return cls(value).label
        except ValueError:
            return f"unknown({value})"


class LookupScope(enum.IntEnum):
    """``lb4_key.scope`` (``LB_LOOKUP_SCOPE_*``): labkit writes EXT only."""

    EXT = 0
    INT = 1


# -- keys and values -------------------------------------------------------------
class Lb4Key(ctypes.LittleEndianStructure):
    """``struct lb4_key`` (12 bytes): one slot of a service frontend."""

    _fields_ = [
        ("address", ctypes.c_uint32),
        ("dport", ctypes.c_uint16),
        ("backend_slot", ctypes.c_uint16),
        ("proto", ctypes.c_uint8),
        ("scope", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
    ]

    @classmethod
    def make(cls, vip: str, port: int, proto: str | int = "TCP", slot: int = 0, scope: int = LookupScope.EXT) -> "Lb4Key":
        """The key of slot ``slot`` of ``vip:port/proto`` (address and port in network order).

        >>> k = Lb4Key.make("198.19.0.10", 80, "UDP", slot=2)
        >>> (k.vip, k.port, k.backend_slot, k.proto)
        ('198.19.0.10', 80, 2, 17)
        """
        return cls(address=be32(vip), dport=socket.htons(port), backend_slot=slot, proto=proto_number(proto),
                   scope=scope)

    def with_slot(self, slot: int) -> "Lb4Key":
        """The same frontend, another slot."""
        return type(self)(address=self.address, dport=self.dport, backend_slot=slot, proto=self.proto,
                          scope=self.scope)

    @property
    def vip(self) -> str:
        return ipv4(self.address)

    @property
    def port(self) -> int:
        return socket.ntohs(self.dport)

    @property
    def frontend(self) -> str:
        """``198.19.0.10:80/TCP``: address, port and the key's protocol byte (``ANY`` for 0, as
        Cilium v1.16 writes it). Labkit's raw view; the Cilium views use :func:`l3n4_text`."""
        return f"{self.vip}:{self.port}/{_proto_name(self.proto)}"

    @property
    def ident(self) -> tuple:
        """What all slots of one frontend share."""
        return (self.address, self.dport, self.proto, self.scope)

    def __str__(self) -> str:
        name = LookupScope(self.scope).name if self.scope in (0, 1) else self.scope
        scope = "" if self.scope == LookupScope.EXT else f" scope={name}"
        return f"{self.frontend} slot {self.backend_slot}{scope}"


class Lb4Service(ctypes.LittleEndianStructure):
    """``struct lb4_service`` (12 bytes). Slot 0: count, the affinity timeout (in the
    ``backend_id`` union member) and the service's flags; slots 1..: the backend id and
    flags 0. Every slot carries the service's ``rev_nat_index`` (network order), as
    Cilium's agent writes them (pkg/maps/lbmap ``upsertServiceProto``: a fresh value per
    slot with only the backend id and rev NAT set; the flags go on the head)."""

    _fields_ = [
        ("backend_id", ctypes.c_uint32),
        ("count", ctypes.c_uint16),
        ("rev_nat_index", ctypes.c_uint16),
        ("flags", ctypes.c_uint8),
        ("flags2", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
    ]

    @classmethod
    def head(cls, count: int, rev_nat_index: int, flags: int = 0, flags2: int = 0,
             affinity_timeout: int = 0) -> "Lb4Service":
        """Slot 0 of a service whose id is ``rev_nat_index`` (host order in, network order stored)."""
        return cls(backend_id=affinity_timeout, count=count, rev_nat_index=socket.htons(rev_nat_index),
                   flags=flags, flags2=flags2)

    @classmethod
    def slot(cls, backend_id: int, rev_nat_index: int) -> "Lb4Service":
        """Slot 1.. of a service: one backend (count 0 and flags 0, as Cilium writes it).

        >>> v = Lb4Service.slot(7, 1)
        >>> (v.backend_id, v.count, v.rev_nat, bytes(v)[6:8].hex(), v.flags, v.flags2)
        (7, 0, 1, '0001', 0, 0)
        """
        return cls(backend_id=backend_id, count=0, rev_nat_index=socket.htons(rev_nat_index))

    @property
    def rev_nat(self) -> int:
        """The service id, host order."""
        return socket.ntohs(self.rev_nat_index)

    @property
    def affinity_timeout(self) -> int:
        """Slot 0's reading of the ``backend_id`` union: session affinity timeout in seconds."""
        return self.backend_id

    @property
    def flag_names(self) -> list[str]:
        return flag_names(self.flags, self.flags2)

    def head_text(self) -> str:
        """``head: count=2 rev_nat=1 flags=[ClusterIP, non-routable]`` (+ ``affinity=…s``)."""
        affinity = f" affinity={self.backend_id}s" if self.flags & ServiceFlags.AFFINITY or self.backend_id else ""
        return f"head: count={self.count} rev_nat={self.rev_nat} flags=[{', '.join(self.flag_names)}]{affinity}"

    def __str__(self) -> str:
        return (f"backend_id={self.backend_id} count={self.count} rev_nat={self.rev_nat} "
                f"flags=[{', '.join(self.flag_names)}]")


class Lb4BackendKey(ctypes.LittleEndianStructure):
    """Key of ``cilium_lb4_backends_v3``: the backend id, a host-order ``__u32``."""

    _fields_ = [("backend_id", ctypes.c_uint32)]

    def __str__(self) -> str:
        return f"backend {self.backend_id}"


class Lb4Backend(ctypes.LittleEndianStructure):
    """``struct lb4_backend`` (12 bytes): where a backend id points."""

    _fields_ = [
        ("address", ctypes.c_uint32),
        ("port", ctypes.c_uint16),
        ("proto", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("cluster_id", ctypes.c_uint16),
        ("zone", ctypes.c_uint8),
        ("pad", ctypes.c_uint8),
    ]

    @classmethod
    def make(cls, ip: str, port: int, proto: str | int = "TCP", state: int = BackendState.ACTIVE) -> "Lb4Backend":
        """A backend at ``ip:port`` (network order stored); v1.16's agent gives ``proto`` 0."""
        return cls(address=be32(ip), port=socket.htons(port), proto=proto_number(proto), flags=state)

    @property
    def ip(self) -> str:
        return ipv4(self.address)

    @property
    def host_port(self) -> int:
        """The port, host order."""
        return socket.ntohs(self.port)

    @property
    def state(self) -> str:
        return BackendState.of(self.flags)

    @property
    def l4addr(self) -> str:
        """``198.18.2.11:8080/TCP``: the stored protocol byte by name (``ANY`` for 0)."""
        return f"{self.ip}:{self.host_port}/{_proto_name(self.proto)}"

    def __str__(self) -> str:
        return f"{self.l4addr} ({self.state})"


class Lb4RevNatKey(ctypes.LittleEndianStructure):
    """Key of ``cilium_lb4_reverse_nat``: the service id as a ``__u16`` in network order."""

    _fields_ = [("rev_nat_index", ctypes.c_uint16)]

    @classmethod
    def make(cls, service_id: int) -> "Lb4RevNatKey":
        """The key of service id ``service_id`` (host order in).

        >>> bytes(Lb4RevNatKey.make(1)).hex()
        '0001'
        """
        return cls(rev_nat_index=socket.htons(service_id))

    @property
    def rev_nat(self) -> int:
        return socket.ntohs(self.rev_nat_index)

    def __str__(self) -> str:
        return f"rev_nat {self.rev_nat}"


class Lb4ReverseNat(ctypes.LittleEndianStructure):
    """``struct lb4_reverse_nat`` (6 bytes, packed): what replies' source becomes again."""

    _pack_ = 1
    _fields_ = [
        ("address", ctypes.c_uint32),
        ("port", ctypes.c_uint16),
    ]

    @classmethod
    def make(cls, vip: str, port: int) -> "Lb4ReverseNat":
        return cls(address=be32(vip), port=socket.htons(port))

    @property
    def ip(self) -> str:
        return ipv4(self.address)

    @property
    def host_port(self) -> int:
        return socket.ntohs(self.port)

    def __str__(self) -> str:
        return f"{self.ip}:{self.host_port}"


class Lb4AffinityKey(ctypes.LittleEndianStructure):
    """``struct lb4_affinity_key`` (16 bytes, packed): a client of one service.

    ``rev_nat_id`` is copied from ``lb4_service.rev_nat_index`` and so is in
    network order; ``client_id`` holds the client's be32 address in its low bytes.

    >>> k = Lb4AffinityKey.make("198.18.1.11", 1)
    >>> bytes(k).hex(" ")
    'c6 12 01 0b 00 00 00 00 00 01 00 00 00 00 00 00'
    """

    _pack_ = 1
    _fields_ = [
        ("client_id", ctypes.c_uint64),
        ("rev_nat_id", ctypes.c_uint16),
        ("netns_cookie", ctypes.c_uint8),
        ("pad1", ctypes.c_uint8),
        ("pad2", ctypes.c_uint32),
    ]

    @classmethod
    def make(cls, client_ip: str, service_id: int) -> "Lb4AffinityKey":
        return cls(client_id=be32(client_ip), rev_nat_id=socket.htons(service_id))

    @property
    def rev_nat(self) -> int:
        return socket.ntohs(self.rev_nat_id)

    def __str__(self) -> str:
        client = f"cookie {self.client_id}" if self.netns_cookie else ipv4(self.client_id & 0xFFFFFFFF)
        return f"client {client} rev_nat {self.rev_nat}"


class LbAffinityVal(ctypes.LittleEndianStructure):
    """``struct lb_affinity_val`` (16 bytes, packed): the backend a client stuck to, and when."""

    _pack_ = 1
    _fields_ = [
        ("last_used", ctypes.c_uint64),
        ("backend_id", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]

    def __str__(self) -> str:
        return f"backend {self.backend_id} last_used={self.last_used}"


class LbAffinityMatch(ctypes.LittleEndianStructure):
    """``struct lb_affinity_match`` (8 bytes, packed): the key of ``cilium_lb_affinity_match``, one per backend
    of a service with session affinity (the value is one unused byte). ``rev_nat_id`` in network order, as
    the service's ``rev_nat_index``. Its dump reads ``"<backend id> <rev nat id>"`` (pkg/maps/lbmap
    ``AffinityMatchKey.String``).

    >>> k = LbAffinityMatch.make(1, 7)
    >>> bytes(k).hex(" "), str(k)
    ('07 00 00 00 00 01 00 00', '7 1')
    """

    _pack_ = 1
    _fields_ = [
        ("backend_id", ctypes.c_uint32),
        ("rev_nat_id", ctypes.c_uint16),
        ("pad", ctypes.c_uint16),
    ]

    @classmethod
    def make(cls, service_id: int, backend_id: int) -> "LbAffinityMatch":
        return cls(backend_id=backend_id, rev_nat_id=socket.htons(service_id))

    @property
    def rev_nat(self) -> int:
        return socket.ntohs(self.rev_nat_id)

    def __str__(self) -> str:
        return f"{self.backend_id} {self.rev_nat}"


class LbAffinityMatchValue(ctypes.LittleEndianStructure):
    """The value of ``cilium_lb_affinity_match``: one unused byte (Cilium's ``AffinityMatchValue``, ``__u8``)."""

    _fields_ = [("pad", ctypes.c_uint8)]

    def __str__(self) -> str:
        return ""


class Ipv4RevnatTuple(ctypes.LittleEndianStructure):
    """``struct ipv4_revnat_tuple`` (16 bytes, packed): a socket and the backend connect() chose."""

    _pack_ = 1
    _fields_ = [
        ("cookie", ctypes.c_uint64),
        ("address", ctypes.c_uint32),
        ("port", ctypes.c_uint16),
        ("pad", ctypes.c_uint16),
    ]

    @classmethod
    def make(cls, cookie: int, ip: str, port: int) -> "Ipv4RevnatTuple":
        return cls(cookie=cookie, address=be32(ip), port=socket.htons(port))

    def __str__(self) -> str:
        return f"cookie {self.cookie} {ipv4(self.address)}:{socket.ntohs(self.port)}"


class Ipv4RevnatEntry(ctypes.LittleEndianStructure):
    """``struct ipv4_revnat_entry`` (8 bytes, packed): the VIP getpeername() shows instead.
    ``rev_nat_index`` is copied from the service, network order."""

    _pack_ = 1
    _fields_ = [
        ("address", ctypes.c_uint32),
        ("port", ctypes.c_uint16),
        ("rev_nat_index", ctypes.c_uint16),
    ]

    @classmethod
    def make(cls, vip: str, port: int, service_id: int) -> "Ipv4RevnatEntry":
        return cls(address=be32(vip), port=socket.htons(port), rev_nat_index=socket.htons(service_id))

    def __str__(self) -> str:
        return f"{ipv4(self.address)}:{socket.ntohs(self.port)} rev_nat {socket.ntohs(self.rev_nat_index)}"


#: Every LB map a node pins: name → (key type, value type).
class MaglevLut:
    """One Maglev table as ``cilium_lb4_maglev`` holds it: M backend ids, the
    whole table in the single element of an inner array map.

    >>> lut = MaglevLut([1, 2, 1])
    >>> bytes(lut).hex(), MaglevLut.from_buffer_copy(bytes(lut)) == lut
    ('010000000200000001000000', True)
    """

    def __init__(self, backend_ids):
        self.backend_ids = tuple(int(b) for b in backend_ids)

    @classmethod
    def from_buffer_copy(cls, raw: bytes) -> "MaglevLut":
        return cls(struct.unpack(f"<{len(raw) // 4}I", bytes(raw)))

    def __bytes__(self) -> bytes:
        return struct.pack(f"<{len(self.backend_ids)}I", *self.backend_ids)

    def __eq__(self, other) -> bool:
        return isinstance(other, MaglevLut) and other.backend_ids == self.backend_ids

    def __len__(self) -> int:
        return len(self.backend_ids)

    def __str__(self) -> str:
        counts: dict[int, int] = {}
        for b in self.backend_ids:
            counts[b] = counts.get(b, 0) + 1
        share = ", ".join(f"backend {b}: {n}" for b, n in sorted(counts.items()))
        return f"M={len(self.backend_ids)} slots ({share})"


class PinnedMaglev:
    """``cilium_lb4_maglev``: service id → Maglev table, an outer hash of inner arrays.

    Writing a table creates an inner array map (one element of ``M * 4`` bytes,
    the shape the programs were compiled for) and stores its fd in the outer
    map; the kernel then holds it by reference, so nothing else needs to keep
    it. Reading follows the outer value (the inner map's id) back to the table.
    ``bpftool map dump pinned <path>`` shows the outer map's inner map ids.
    """

    def __init__(self, path: str, table_size: int):
        self.path = path
        self.table_size = table_size
        self.outer = PinnedMap(path, Lb4RevNatKey, ctypes.c_uint32)  #: service id → inner map (id read, fd written)

    def get(self, key: Lb4RevNatKey) -> MaglevLut | None:
        inner_id = self.outer.get(key)
        if inner_id is None:
            return None
        fd = _bpf.map_fd_by_id(inner_id.value)
        try:
            buf = ctypes.create_string_buffer(4 * self.table_size)
            if not _bpf.lookup(fd, ctypes.c_uint32(0), buf):
                return None
            return MaglevLut.from_buffer_copy(buf.raw)
        finally:
            os.close(fd)

    def __setitem__(self, key: Lb4RevNatKey, lut: MaglevLut) -> None:
        if len(lut) != self.table_size:
            raise ConfigError(f"{self.path}: a Maglev table of {len(lut)} slots, expected {self.table_size} "
                              f"(the lab's maglev_table_size)")
        fd = _bpf.map_create(_bpf.BPF_MAP_TYPE_ARRAY, 4, 4 * self.table_size, 1, "lb4_maglev_lut")
        try:
            raw = ctypes.create_string_buffer(bytes(lut), len(bytes(lut)))
            _bpf.update(fd, ctypes.c_uint32(0), raw)
            self.outer[key] = ctypes.c_uint32(fd)
        finally:
            os.close(fd)

    def delete(self, key: Lb4RevNatKey) -> bool:
        return self.outer.delete(key)

    def items(self) -> list[tuple[Lb4RevNatKey, MaglevLut]]:
        return [(k, v) for k in list(self.outer) if (v := self.get(k)) is not None]

    def clear(self) -> int:
        return sum(self.delete(k) for k, _ in self.items())

    def close(self) -> None:
        self.outer.close()

    def command(self) -> str:
        return self.outer.command()


LB_MAPS: dict[str, tuple[type, type]] = {
    SERVICES_MAP: (Lb4Key, Lb4Service),
    BACKENDS_MAP: (Lb4BackendKey, Lb4Backend),
    REVNAT_MAP: (Lb4RevNatKey, Lb4ReverseNat),
    AFFINITY_MAP: (Lb4AffinityKey, LbAffinityVal),
    AFFINITY_MATCH_MAP: (LbAffinityMatch, LbAffinityMatchValue),
    REVERSE_SK_MAP: (Ipv4RevnatTuple, Ipv4RevnatEntry),
    MAGLEV_MAP: (Lb4RevNatKey, MaglevLut),
}


# -- views -----------------------------------------------------------------------
@dataclass(frozen=True)
class LbBackendRow:
    """One backend slot of a service as a node's maps hold it."""

    slot: int
    backend_id: int
    address: str | None  #: None: the id is missing from cilium_lb4_backends_v3
    port: int
    proto: str  #: the backend's protocol byte by name (ANY on v1.16, where the agent writes 0)
    state: str  #: active, terminating, ...; after count always not active
    cilium: str = DEFAULT_RELEASE  #: whose `service list` grammar :meth:`text` follows

    @property
    def l4addr(self) -> str:
        """``198.18.2.11:8080`` (v1.16) or ``198.18.2.11:8080/TCP`` (1.17+), as `service list` prints it."""
        if self.address is None:
            return f"<backend {self.backend_id} missing from {BACKENDS_MAP}>"
        return l3n4_text(self.address, self.port, self.proto, cilium=self.cilium)

    def text(self, index: int) -> str:
        """``1 => 198.18.2.11:8080 (active)`` (``"%d => %s (%s)"``, cilium-dbg/cmd/service_list.go)."""
        return f"{index} => {self.l4addr} ({self.state})"

    def __str__(self) -> str:
        return self.text(self.slot)


@dataclass(frozen=True)
class LbServiceRow:
    """One frontend of a node's services map: its head and the slots that follow it."""

    id: int  #: rev_nat_index of the head, host order
    vip: str
    port: int
    proto: str  #: the key's protocol byte by name (ANY on v1.16)
    scope: int
    count: int
    flags: int
    flags2: int
    affinity_timeout: int
    backends: tuple[LbBackendRow, ...]  #: in slot order
    rev_nat: str | None  #: VIP:port from cilium_lb4_reverse_nat, None if missing
    cilium: str = DEFAULT_RELEASE

    @property
    def frontend(self) -> str:
        """``198.19.0.10:80`` (v1.16) or ``198.19.0.10:80/TCP`` (1.17+), ``/i`` for the internal scope."""
        return l3n4_text(self.vip, self.port, self.proto, self.scope, self.cilium)

    @property
    def type(self) -> str:
        return service_type(self.flags, self.flags2)

    def lines(self) -> list[list[str]]:
        """Cells of ``cilium service list``: ID, Frontend, Service Type, Backend (one row per backend).

        Backends are numbered in backend id order: the agent's API lists a service's backends
        sorted by id (pkg/loadbalancer ``SVC.GetModel``), not in slot order."""
        bes = [b.text(i) for i, b in enumerate(sorted(self.backends, key=lambda b: b.backend_id), start=1)]
        rows = [[str(self.id), self.frontend, self.type, bes[0] if bes else ""]]
        rows += [["", "", "", b] for b in bes[1:]]
        return rows

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "frontend": self.frontend,
            "vip": self.vip,
            "port": self.port,
            "protocol": self.proto,
            "scope": self.scope,
            "type": self.type,
            "count": self.count,
            "flags": flag_names(self.flags, self.flags2),
            "affinity_timeout": self.affinity_timeout,
            "rev_nat": self.rev_nat,
            "backends": [
                {"slot": b.slot, "backend_id": b.backend_id, "address": b.address, "port": b.port,
                 "protocol": b.proto, "state": b.state}
                for b in self.backends
            ],
        }

    def __str__(self) -> str:
        return "  ".join(c for c in self.lines()[0] if c)


def _bpf_key_text(key: Lb4Key, cilium: str) -> str:
    """``svcKey.String()`` of cilium-dbg's `bpf lb list`: ``ip:port`` (+``/i``) and the slot, `` (0)``
    (v1.16: pkg/maps/lbmap/ipv4.go:250-257, ``Service4Key.String``); 1.17+ with the protocol,
    ``ip:port/TCP`` (+``/i``) ``(0)``."""
    scope = "/i" if key.scope == LookupScope.INT else ""
    proto = f"/{_proto_name(key.proto)}" if profile(cilium).has("lb_proto_keys") else ""
    return f"{key.vip}:{key.port}{proto}{scope} ({key.backend_slot})"


def _bpf_value_text(key: Lb4Key, value: Lb4Service, backends: dict, cilium: str) -> str:
    """One entry's second column in `bpf lb list` (cilium-dbg/cmd/bpf_lb_list.go ``dumpSVC``)."""
    if key.backend_slot == 0:
        flags = ", ".join(flag_names(value.flags, value.flags2))
        extra = ""
        if value.flags2 & ServiceFlags2.L7LOADBALANCER:
            extra = f"(L7LB Proxy Port: {socket.ntohs(value.backend_id & 0xFFFF)})"
        return f"0.0.0.0:0 ({value.rev_nat}) (0) [{flags}] {extra}"
    be = backends.get(value.backend_id)
    if be is None:
        return f"backend {value.backend_id} not found"
    proto = f"/{_proto_name(be.proto)}" if profile(cilium).has("lb_proto_keys") else ""
    return f"{be.ip}:{be.host_port}{proto} ({value.rev_nat}) ({key.backend_slot})"


@dataclass(frozen=True)
class LbSnapshot:
    """The three service maps of one node, read at one moment, and the release whose
    grammar the views print (``cilium``).

    >>> snap = LbSnapshot.build("198.19.0.10", 80, "TCP", 1, [(1, "198.18.2.11", 8080), (2, "198.18.2.12", 8080)])
    >>> print("\\n".join(line.rstrip() for line in snap.lines()))
    ID   Frontend         Service Type   Backend
    1    198.19.0.10:80   ClusterIP      1 => 198.18.2.11:8080 (active)
                                         2 => 198.18.2.12:8080 (active)
    """

    services: tuple[tuple[Lb4Key, Lb4Service], ...]
    backends: tuple[tuple[Lb4BackendKey, Lb4Backend], ...]
    revnat: tuple[tuple[Lb4RevNatKey, Lb4ReverseNat], ...]
    cilium: str = DEFAULT_RELEASE

    @classmethod
    def of(cls, services: Iterable, backends: Iterable, revnat: Iterable,
           cilium: str = DEFAULT_RELEASE) -> "LbSnapshot":
        """From ``(key, value)`` pairs of the three maps (as ``PinnedMap.items()`` gives them)."""
        profile(cilium)  # ConfigError names the releases
        return cls(tuple(services), tuple(backends), tuple(revnat), cilium)

    @classmethod
    def build(cls, vip: str, port: int, proto: str, service_id: int, backends: list[tuple[int, str, int]],
              active: int | None = None, cilium: str = DEFAULT_RELEASE) -> "LbSnapshot":
        """The rows the agent of release ``cilium`` writes for one service (an example, or a test's
        expectation): protocol 0 in keys and backends on v1.16, ``proto`` on 1.17+."""
        wire = proto_number(proto) if profile(cilium).has("lb_proto_keys") else 0
        key = Lb4Key.make(vip, port, wire)
        count = len(backends) if active is None else active
        svc = [(key, Lb4Service.head(count, service_id))]
        svc += [(key.with_slot(i), Lb4Service.slot(bid, service_id)) for i, (bid, _, _) in enumerate(backends, 1)]
        bes = [(Lb4BackendKey(bid), Lb4Backend.make(ip, p, wire, BackendState.ACTIVE if i <= count else
                                                     BackendState.TERMINATING))
               for i, (bid, ip, p) in enumerate(backends, 1)]
        return cls(tuple(svc), tuple(bes), ((Lb4RevNatKey.make(service_id), Lb4ReverseNat.make(vip, port)),), cilium)

    def rows(self) -> list[LbServiceRow]:
        """Every frontend with a head, by id (external scope before internal): the slot 0 head,
        then slots 1..count and the terminating ones after it, up to the first missing slot."""
        slots = {(k.ident, k.backend_slot): v for k, v in self.services}
        backends = {k.backend_id: v for k, v in self.backends}
        revnat = {k.rev_nat: v for k, v in self.revnat}
        out = []
        for key, head in self.services:
            if key.backend_slot != 0:
                continue
            rows, slot = [], 1
            while (value := slots.get((key.ident, slot))) is not None:
                be = backends.get(value.backend_id)
                if be is None:
                    rows.append(LbBackendRow(slot, value.backend_id, None, 0, _proto_name(key.proto), "missing",
                                             self.cilium))
                else:
                    state = be.state
                    if slot > head.count and be.flags == BackendState.ACTIVE:
                        state = BackendState.TERMINATING.label  # uncounted: never picked
                    rows.append(LbBackendRow(slot, value.backend_id, be.ip, be.host_port, _proto_name(be.proto),
                                             state, self.cilium))
                slot += 1
            rn = revnat.get(head.rev_nat)
            out.append(LbServiceRow(
                id=head.rev_nat, vip=key.vip, port=key.port, proto=_proto_name(key.proto), scope=key.scope,
                count=head.count, flags=head.flags, flags2=head.flags2, affinity_timeout=head.affinity_timeout,
                backends=tuple(rows), rev_nat=str(rn) if rn is not None else None, cilium=self.cilium,
            ))
        return sorted(out, key=lambda r: (r.id, r.scope, r.vip, r.port, r.proto))

    def text(self) -> str:
        """``cilium service list`` as the CLI prints it (cilium-dbg/cmd/service_list.go): one Go
        tabwriter (minwidth 5, padding 3) over ``"ID\\tFrontend\\tService Type\\tBackend\\t"``, then per
        service ``"%d\\t%s\\t%s\\t%s\\t"`` with its first backend, ``"\\t\\t\\t%s\\t"`` per further backend
        (``"%d\\t%s\\t%s\\t\\t"`` without any), sorted by id. Every cell ends in a tab, so every line is
        padded to the last column's width: lines end in spaces."""
        lines = ["ID\tFrontend\tService Type\tBackend\t"]
        for row in self.rows():
            lines += ["\t".join(cells) + "\t" for cells in row.lines()]
        return tabwrite("".join(line + "\n" for line in lines), **_CILIUM_TABWRITER)

    def lines(self) -> list[str]:
        """:meth:`text` as lines (trailing spaces kept)."""
        return self.text().splitlines()

    def bpf_text(self) -> str:
        """``cilium-dbg bpf lb list`` (cilium-dbg/cmd/bpf_lb_list.go ``dumpSVC`` through helpers.go
        ``TablePrinter``): header ``"SERVICE ADDRESS\\tBACKEND ADDRESS (REVNAT_ID) (SLOT)\\n"`` (its second
        title has no tab: no padding), then per key string the entries, the first with the key,
        ``"%s\\t%s\\t\\n"``, the others with an empty first cell. The head reads
        ``0.0.0.0:0 (<revnat>) (0) [<flags>] `` (``"[%s] %s"`` with no L7LB proxy port leaves a
        trailing space), a slot ``<ip>:<port> (<revnat>) (<slot>)`` (1.17+: ``<ip>:<port>/TCP``), a
        slot whose backend is gone ``backend <id> not found``.

        The key string carries the slot, ``ip:port (slot)`` on v1.16 (``/i`` for the internal scope;
        ``ip:port/TCP (slot)`` from 1.17), so every entry is its own group and line.
        A node prints the groups in Go map order and the entries in BPF hash order, both
        unordered; labkit sorts them (frontend, then scope, then slot): one order a node can print.
        """
        lines = "SERVICE ADDRESS\tBACKEND ADDRESS (REVNAT_ID) (SLOT)\n"
        for name, entries in self._bpf_groups().items():
            lines += "".join(f"{name if i == 0 else ''}\t{entry}\t\n" for i, entry in enumerate(entries))
        return tabwrite(lines, **_CILIUM_TABWRITER)

    def _bpf_groups(self) -> dict[str, list[str]]:
        backends = {k.backend_id: v for k, v in self.backends}
        groups: dict[str, list[str]] = {}
        for key, value in sorted(self.services, key=lambda kv: (kv[0].address.to_bytes(4, "little"),
                                                                kv[0].port, kv[0].proto, kv[0].scope,
                                                                kv[0].backend_slot)):
            groups.setdefault(_bpf_key_text(key, self.cilium), []).append(
                _bpf_value_text(key, value, backends, self.cilium))
        return groups

    def bpf_lines(self) -> list[str]:
        """:meth:`bpf_text` as lines (trailing spaces kept)."""
        return self.bpf_text().splitlines()

    def bpf_json(self) -> dict[str, list[str]]:
        """What `bpf lb list -o json` marshals: key string -> its entries' texts (sorted as :meth:`bpf_text`)."""
        return self._bpf_groups()

    def raw_lines(self) -> list[str]:
        """Every entry of the three maps, sorted: services by frontend and slot, backends by id,
        reverse NAT by id (``# <map>`` before each)."""
        backends = {k.backend_id: v for k, v in self.backends}
        out = [f"# {SERVICES_MAP}"]
        for key, value in sorted(self.services, key=lambda kv: (kv[0].ident, kv[0].backend_slot)):
            if key.backend_slot == 0:
                out.append(f"{key} {value.head_text()}")
            else:
                be = backends.get(value.backend_id)
                where = str(be) if be is not None else f"missing from {BACKENDS_MAP}"
                out.append(f"{key} → backend {value.backend_id} [{where}] rev_nat={value.rev_nat}")
        out.append(f"# {BACKENDS_MAP}")
        out += [f"backend {k.backend_id} → {v}" for k, v in sorted(self.backends, key=lambda kv: kv[0].backend_id)]
        out.append(f"# {REVNAT_MAP}")
        out += [f"rev_nat {k.rev_nat} → {v}" for k, v in sorted(self.revnat, key=lambda kv: kv[0].rev_nat)]
        return out

    def to_json(self) -> list[dict]:
        """The services as plain data (what ``lb list --json`` prints)."""
        return [row.to_json() for row in self.rows()]

    def raw_json(self) -> dict:
        """Every entry of the three maps as plain data (``lb list --raw --json``)."""
        return {
            SERVICES_MAP: [
                {"vip": k.vip, "port": k.port, "protocol": _proto_name(k.proto), "scope": k.scope,
                 "slot": k.backend_slot, "backend_id": v.backend_id, "count": v.count, "rev_nat": v.rev_nat,
                 "flags": v.flags, "flags2": v.flags2}
                for k, v in sorted(self.services, key=lambda kv: (kv[0].ident, kv[0].backend_slot))
            ],
            BACKENDS_MAP: [
                {"backend_id": k.backend_id, "address": v.ip, "port": v.host_port, "protocol": _proto_name(v.proto),
                 "state": v.state, "cluster_id": v.cluster_id, "zone": v.zone}
                for k, v in sorted(self.backends, key=lambda kv: kv[0].backend_id)
            ],
            REVNAT_MAP: [
                {"rev_nat": k.rev_nat, "address": v.ip, "port": v.host_port}
                for k, v in sorted(self.revnat, key=lambda kv: kv[0].rev_nat)
            ],
        }
