"""DNS messages as the DNS proxy needs them (RFC 1035 §4): the question of a query, the A
records and their TTLs in an answer, and the REFUSED reply the proxy sends for a name its
DNS rule does not allow (Cilium v1.16 pkg/fqdn/dnsproxy/proxy.go ``ServeDNS`` answers a denied
query itself; ``--tofqdns-dns-reject-response-code`` defaults to ``refused``).

No third-party DNS library: the wire format is small, and a learner can read it here.

    >>> q = build_query(0x1234, "web.lab.example")
    >>> parse(q).question
    Question(name='web.lab.example.', qtype=1, qclass=1)
    >>> r = parse(refused(q))
    >>> r.id, r.rcode, r.is_response
    (4660, 5, True)
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field

from labkit.errors import LabkitError

__all__ = ["DnsError", "Question", "Answer", "Message", "parse", "build_query", "build_response", "refused",
           "TYPE_A", "RCODE_NOERROR", "RCODE_NXDOMAIN", "RCODE_REFUSED"]

TYPE_A, TYPE_CNAME, CLASS_IN = 1, 5, 1
RCODE_NOERROR, RCODE_NXDOMAIN, RCODE_REFUSED = 0, 3, 5
_HEADER = struct.Struct("!HHHHHH")
_QR, _RD, _RA = 0x8000, 0x0100, 0x0080


class DnsError(LabkitError, ValueError):
    """A DNS message that is not what RFC 1035 lays out."""


@dataclass(frozen=True)
class Question:
    name: str  #: with its final dot, lower-cased
    qtype: int
    qclass: int


@dataclass(frozen=True)
class Answer:
    name: str
    rtype: int
    ttl: int
    data: str  #: dotted address for A, target name for CNAME, hex otherwise


@dataclass
class Message:
    id: int
    flags: int
    questions: list[Question] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)

    @property
    def is_response(self) -> bool:
        return bool(self.flags & _QR)

    @property
    def rcode(self) -> int:
        return self.flags & 0xF

    @property
    def question(self) -> Question:
        if not self.questions:
            raise DnsError(f"DNS message {self.id}: expected one question, got none")
        return self.questions[0]

    def a_records(self) -> list[tuple[str, int]]:
        """(address, TTL) of every A record of the answer section."""
        return [(a.data, a.ttl) for a in self.answers if a.rtype == TYPE_A]


def _name(buf: bytes, off: int, hops: int = 0) -> tuple[str, int]:
    """A (possibly compressed, §4.1.4) name at ``off``; returns (name with final dot, offset after it)."""
    labels = []
    while True:
        if off >= len(buf):
            raise DnsError(f"DNS name at byte {off}: expected a label, got the end of a {len(buf)}-byte message")
        n = buf[off]
        if n & 0xC0 == 0xC0:
            if hops > 16 or off + 1 >= len(buf):
                raise DnsError(f"DNS name at byte {off}: expected a pointer to an earlier name, got a loop or a cut")
            ptr = ((n & 0x3F) << 8) | buf[off + 1]
            rest, _ = _name(buf, ptr, hops + 1)
            return ".".join(labels + [rest.rstrip(".")]).strip(".") + ".", off + 2
        if n & 0xC0:
            raise DnsError(f"DNS name at byte {off}: expected a label length < 64, got 0x{n:02x}")
        off += 1
        if n == 0:
            return (".".join(labels) + ".").lower() if labels else ".", off
        labels.append(buf[off:off + n].decode("ascii", "replace").lower())
        off += n


def _encode_name(name: str) -> bytes:
    out = b""
    for label in name.rstrip(".").split("."):
        if label:
            raw = label.encode("ascii")
            if len(raw) > 63:
                raise DnsError(f"DNS name {name!r}: expected labels of at most 63 bytes, got {len(raw)}")
            out += bytes([len(raw)]) + raw
    return out + b"\0"


def parse(buf: bytes) -> Message:
    """The header, questions and answer records of a DNS message (authority and additional
    sections are skipped)."""
    if len(buf) < _HEADER.size:
        raise DnsError(f"DNS message: expected at least 12 bytes of header, got {len(buf)}")
    mid, flags, qd, an, _, _ = _HEADER.unpack_from(buf)
    msg = Message(mid, flags)
    off = _HEADER.size
    for _ in range(qd):
        name, off = _name(buf, off)
        if off + 4 > len(buf):
            raise DnsError(f"DNS message {mid}: question {name}: expected type and class, got the end")
        qtype, qclass = struct.unpack_from("!HH", buf, off)
        off += 4
        msg.questions.append(Question(name, qtype, qclass))
    for _ in range(an):
        name, off = _name(buf, off)
        if off + 10 > len(buf):
            raise DnsError(f"DNS message {mid}: record {name}: expected 10 bytes of type/class/TTL/length, got the end")
        rtype, _, ttl, rdlen = struct.unpack_from("!HHIH", buf, off)
        off += 10
        rdata = buf[off:off + rdlen]
        if len(rdata) != rdlen:
            raise DnsError(f"DNS message {mid}: record {name}: expected {rdlen} bytes of data, got {len(rdata)}")
        if rtype == TYPE_A and rdlen == 4:
            data = str(ipaddress.IPv4Address(rdata))
        elif rtype == TYPE_CNAME:
            data = _name(buf, off)[0]
        else:
            data = rdata.hex()
        off += rdlen
        msg.answers.append(Answer(name, rtype, ttl, data))
    return msg


def build_query(mid: int, name: str, qtype: int = TYPE_A) -> bytes:
    """A recursive query for ``name`` (what ``dig`` or a resolver library sends)."""
    return _HEADER.pack(mid, _RD, 1, 0, 0, 0) + _encode_name(name) + struct.pack("!HH", qtype, CLASS_IN)


def build_response(query: bytes, answers: list[tuple[str, int]], rcode: int = RCODE_NOERROR) -> bytes:
    """An answer to ``query`` with A records ``[(address, ttl)]`` for its question's name.

    >>> parse(build_response(build_query(7, "a.lab.example"), [("198.51.100.101", 30)])).a_records()
    [('198.51.100.101', 30)]
    """
    q = parse(query)
    qn = q.question
    head = _HEADER.pack(q.id, _QR | (q.flags & _RD) | _RA | rcode, 1, len(answers), 0, 0)
    body = _encode_name(qn.name) + struct.pack("!HH", qn.qtype, qn.qclass)
    for addr, ttl in answers:
        body += b"\xc0\x0c" + struct.pack("!HHIH", TYPE_A, CLASS_IN, ttl, 4) + ipaddress.IPv4Address(addr).packed
    return head + body


def refused(query: bytes) -> bytes:
    """The REFUSED reply to ``query``: its id and question, no records (the proxy's answer to a
    name the DNS rule does not allow)."""
    return build_response(query, [], RCODE_REFUSED)
