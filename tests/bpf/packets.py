"""Crafted Ethernet/IPv4/TCP/UDP frames for the BPF unit tier, and a parser for
what the programs hand back.

Every checksum is computed (RFC 791 header checksum, RFC 793/768 checksum over
the pseudo-header), so a test can assert that a translated packet still
carries valid checksums:

    >>> f = tcp("198.18.1.11", "198.19.0.10", 40000, 80, SYN)
    >>> p = parse(f)
    >>> (p.src, p.dst, p.sport, p.dport, p.flags, p.ip_csum_ok, p.l4_csum_ok)
    ('198.18.1.11', '198.19.0.10', 40000, 80, 2, True, True)
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

__all__ = ["FIN", "SYN", "RST", "PSH", "ACK", "POD_MAC", "GW_MAC", "eth", "ipv4", "tcp", "udp", "icmp_echo",
           "parse", "Parsed", "csum"]

FIN, SYN, RST, PSH, ACK = 0x01, 0x02, 0x04, 0x08, 0x10
POD_MAC = "02:00:00:00:01:0b"  # what a pod's eth0 would have
GW_MAC = "02:00:00:00:ff:01"  # the host veth, the pod's gateway
IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP = 1, 6, 17


def csum(data: bytes) -> int:
    """The Internet checksum (ones' complement of the ones' complement sum of 16-bit words)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _mac(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def eth(payload: bytes, dst: str = GW_MAC, src: str = POD_MAC, ethertype: int = 0x0800) -> bytes:
    """An Ethernet II frame."""
    return _mac(dst) + _mac(src) + struct.pack("!H", ethertype) + payload


def ipv4(src: str, dst: str, proto: int, payload: bytes, options: bytes = b"", frag: int = 0,
         ident: int = 1, ttl: int = 64, total_length: int | None = None) -> bytes:
    """An IPv4 packet; ``frag`` is the flags/fragment-offset word (0x2000 = MF)."""
    assert len(options) % 4 == 0
    ihl = 5 + len(options) // 4
    length = total_length if total_length is not None else ihl * 4 + len(payload)
    hdr = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, length, ident, frag, ttl, proto, 0,
                      socket.inet_aton(src), socket.inet_aton(dst)) + options
    hdr = hdr[:10] + struct.pack("!H", csum(hdr)) + hdr[12:]
    return hdr + payload


def _pseudo(src: str, dst: str, proto: int, length: int) -> bytes:
    return socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, proto, length)


def tcp_segment(src: str, dst: str, sport: int, dport: int, flags: int, seq: int = 1000, ack: int = 0,
                payload: bytes = b"") -> bytes:
    """A TCP segment with a correct checksum over the pseudo-header."""
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq, ack, 5 << 4, flags, 65535, 0, 0)
    seg = hdr + payload
    c = csum(_pseudo(src, dst, IPPROTO_TCP, len(seg)) + seg)
    return seg[:16] + struct.pack("!H", c) + seg[18:]


def udp_datagram(src: str, dst: str, sport: int, dport: int, payload: bytes = b"hi") -> bytes:
    """A UDP datagram with a correct checksum over the pseudo-header."""
    seg = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    c = csum(_pseudo(src, dst, IPPROTO_UDP, len(seg)) + seg) or 0xFFFF
    return seg[:6] + struct.pack("!H", c) + seg[8:]


def tcp(src: str, dst: str, sport: int, dport: int, flags: int, payload: bytes = b"", options: bytes = b"",
        **eth_kw) -> bytes:
    """An Ethernet frame carrying one TCP segment."""
    return eth(ipv4(src, dst, IPPROTO_TCP, tcp_segment(src, dst, sport, dport, flags, payload=payload),
                    options=options), **eth_kw)


def udp(src: str, dst: str, sport: int, dport: int, payload: bytes = b"hi", options: bytes = b"", **eth_kw) -> bytes:
    """An Ethernet frame carrying one UDP datagram."""
    return eth(ipv4(src, dst, IPPROTO_UDP, udp_datagram(src, dst, sport, dport, payload), options=options),
               **eth_kw)


def icmp_echo(src: str, dst: str, ident: int = 7, seq: int = 1, **eth_kw) -> bytes:
    """An Ethernet frame carrying an ICMP echo request."""
    body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"ping"
    body = body[:2] + struct.pack("!H", csum(body)) + body[4:]
    return eth(ipv4(src, dst, IPPROTO_ICMP, body), **eth_kw)


@dataclass(frozen=True)
class Parsed:
    """A frame as the tests read it back."""

    dst_mac: str
    src_mac: str
    ihl: int  #: header length in 32-bit words
    total_length: int
    proto: int
    src: str
    dst: str
    options: bytes
    sport: int
    dport: int
    flags: int  #: TCP flag byte (0 for UDP)
    ip_csum_ok: bool
    l4_csum_ok: bool
    payload: bytes  #: the L4 payload


def parse(frame: bytes) -> Parsed:
    """Decode an Ethernet/IPv4/TCP-or-UDP frame and check both checksums."""
    macs = [":".join(f"{b:02x}" for b in frame[i:i + 6]) for i in (0, 6)]
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4  # bytes
    total, proto = struct.unpack_from("!H", ip, 2)[0], ip[9]
    src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
    l4 = ip[ihl:total]
    sport, dport = struct.unpack_from("!HH", l4, 0)
    flags = l4[13] if proto == IPPROTO_TCP else 0
    hlen = (l4[12] >> 4) * 4 if proto == IPPROTO_TCP else 8
    l4_ok = csum(_pseudo(src, dst, proto, len(l4)) + l4) == 0
    return Parsed(macs[0], macs[1], ihl // 4, total, proto, src, dst, bytes(ip[20:ihl]), sport, dport, flags,
                  csum(ip[:ihl]) == 0, l4_ok, bytes(l4[hlen:]))
