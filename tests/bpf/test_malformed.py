"""Malformed input: every hook parses with bounds-checked loads
(lib/parse.h), so a short or odd header is a drop with Cilium's reason at the
one exit label, reported in the trace record — never a verifier puzzle or a
packet passed on half-read.

BPF_PROG_TEST_RUN itself refuses (EINVAL) an IPv4 frame shorter than the
Ethernet header plus 20 bytes, so the shortest truncated header a test can
hand the programs is a header whose length field promises more than the
frame holds.
"""
from __future__ import annotations

import struct

from labkit.constants import DropReason, Verdict
from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_SHOT

from .harness import A1, B1, EXT, NODE_IP
from .packets import SYN, eth, ipv4, tcp, tcp_segment

IPPROTO_TCP, IPPROTO_GRE = 6, 47


def assert_drop(r, reason: DropReason) -> None:
    assert r.retval == TC_ACT_SHOT
    assert r.event.verdict == Verdict.DROPPED and r.event.drop_reason == reason, \
        f"verdict {r.event.verdict}, reason {r.event.drop_reason}: expected a drop with {reason.name}"


def cut_header() -> bytes:
    """An IPv4 header cut short: ihl 6 (24 bytes) in a 20-byte packet."""
    frame = bytearray(eth(ipv4(A1.ip, B1.ip, IPPROTO_TCP, b"")))
    frame[14] = 0x46
    return bytes(frame)


def test_truncated_ip_header_drops(native):
    """A frame whose IPv4 header is cut short is dropped with DROP_INVALID."""
    assert_drop(native.run("cil_from_container", cut_header()), DropReason.INVALID)


def test_header_length_below_five_drops(native):
    """An IPv4 header claiming fewer than 5 words is dropped with DROP_INVALID."""
    frame = bytearray(tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    frame[14] = 0x44
    assert_drop(native.run("cil_from_container", bytes(frame)), DropReason.INVALID)


def test_options_past_the_packet_drop(native):
    """An IPv4 header whose options run past the end of the packet is dropped with DROP_INVALID."""
    frame = bytearray(eth(ipv4(A1.ip, B1.ip, IPPROTO_TCP, b"")))
    frame[14] = 0x4F  # 60 bytes of header in a 20-byte packet
    assert_drop(native.run("cil_from_container", bytes(frame)), DropReason.INVALID)


def test_truncated_tcp_header_drops(native):
    """A TCP header shorter than its 14 bytes of ports and flags is dropped with DROP_CT_INVALID_HDR."""
    seg = tcp_segment(A1.ip, B1.ip, 40000, 8080, SYN)[:10]
    assert_drop(native.run("cil_from_container", eth(ipv4(A1.ip, B1.ip, IPPROTO_TCP, seg))),
                DropReason.CT_INVALID_HDR)


def test_fragments_drop_at_pod_and_uplink(native):
    """First and later IP fragments are dropped with DROP_FRAG_NOSUPPORT, from a pod and from the fabric."""
    seg = tcp_segment(A1.ip, B1.ip, 40000, 8080, SYN)
    first = eth(ipv4(A1.ip, B1.ip, IPPROTO_TCP, seg, frag=0x2000))
    later = eth(ipv4(A1.ip, B1.ip, IPPROTO_TCP, seg[:8], frag=0x0003))
    for frame in (first, later):
        assert_drop(native.run("cil_from_container", frame), DropReason.FRAG_NOSUPPORT)
    inbound = eth(ipv4(EXT, NODE_IP, IPPROTO_TCP, seg, frag=0x2000))
    assert_drop(native.run("cil_from_netdev", inbound), DropReason.FRAG_NOSUPPORT)


def test_spoofed_pod_source_drops(native):
    """A pod sending with an address that is not its own (not in cilium_lxc) is dropped with DROP_INVALID_SIP."""
    assert_drop(native.run("cil_from_container", tcp("198.18.1.99", B1.ip, 40000, 8080, SYN)), DropReason.INVALID_SIP)


def test_unknown_l4_protocol_drops(native):
    """A pod's packet of a protocol conntrack does not know (GRE) is dropped with DROP_CT_UNKNOWN_PROTO."""
    assert_drop(native.run("cil_from_container", eth(ipv4(A1.ip, B1.ip, IPPROTO_GRE, bytes(8)))),
                DropReason.CT_UNKNOWN_PROTO)


def test_non_ipv4_passes_untraced(native):
    """An ARP frame is not the datapath's business: TC_ACT_OK, untouched, no trace record."""
    frame = eth(bytes(28), ethertype=0x0806)
    r = native.run("cil_from_container", frame)
    assert (r.retval, r.frame, r.events) == (TC_ACT_OK, frame, [])


def test_node_own_malformed_packet_passes(native):
    """to-netdev reports the node's own malformed packet but leaves it to the kernel (TC_ACT_OK)."""
    r = native.run("cil_to_netdev", cut_header())
    assert r.retval == TC_ACT_OK
    assert r.event.verdict == Verdict.FORWARDED and r.event.drop_reason == DropReason.INVALID
