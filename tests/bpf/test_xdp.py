"""NodePort in XDP (bpf/bpf_xdp.c, lib/xdp.h, lib/nodeport_xdp.h) under BPF_PROG_TEST_RUN: the frame
cil_xdp_entry leaves equals the one cil_from_netdev leaves for the same input (MACs aside: XDP takes them from
bpf_fib_lookup), both programs make the same CT and NAT rows in the same maps (one build holds both), and
malformed frames and services without backends are dropped in XDP with their reasons.

Cilium's facts: bpf_xdp.c's cil_xdp_entry runs nodeport_lb4 (bpf/lib/nodeport.h under IS_BPF_XDP); a packet to
no service leaves with XFER_PKT_NO_SVC (lib/common.h, "XDP to SKB transferred meta data") set by nodeport_lb4 at
skip_service_lookup; lb4_local answers DROP_NO_SERVICE for a service with no backends (lib/lb.h).

In a test run the program's ingress device is lo of the test's namespace, so what bpf_fib_lookup answers for the
backend (a route out of some device, or none: DROP_NO_FIB) depends on the machine; a test-run XDP_TX or
XDP_REDIRECT sends nothing. The tests check the frame as translated, which is final before the lookup.
"""
from __future__ import annotations

import socket

from labkit.constants import DropReason, Hook, TraceFlags, Verdict
from labkit.maps.ct import CtFlags
from labkit.maps.lb import BackendState, ServiceFlags

from .harness import B2, EXT, LB_VIP, NODE_IP, VPORT
from .packets import SYN, ACK, eth, ipv4, tcp, tcp_segment, udp
from .test_malformed import cut_header

XDP_DROP, XDP_PASS, XDP_TX = 1, 2, 3
ACTIVE = BackendState.ACTIVE
LB_FLAGS = ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE
CP, BP = 50000, 8080
IPPROTO_TCP = socket.IPPROTO_TCP


def _rows(node) -> list[tuple]:
    """CT rows without their lifetimes and report stamps (seconds of the clock when the packet passed)."""
    return sorted((r.map, r.dir, r.related, r.src, r.sport, r.dst, r.dport, r.flags, r.rev_nat, r.backend_id,
                   r.packets, r.bytes, r.tx_flags_seen, r.rx_flags_seen, r.src_sec_id) for r in node.ct())


def _nat(node) -> list[tuple]:
    return sorted((r.dir, r.src, r.sport, r.dst, r.dport, r.to_addr, r.to_port) for r in node.nat())


def _both(node, frames: list[bytes]):
    """Run ``frames`` through cil_xdp_entry, then (maps reset) through cil_from_netdev: both outcomes and rows."""
    node.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    xdp = [node.run_xdp(f) for f in frames]
    xdp_state = (_rows(node), _nat(node))
    node.reset()
    node.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    tc = [node.run("cil_from_netdev", f) for f in frames]
    return xdp, tc, xdp_state, (_rows(node), _nat(node))


def test_dsr_frames_and_rows_equal_tc(xdp):
    """dsr, remote backend: SYN then ACK to the LB VIP leave XDP as tc leaves them (DNAT to b2:8080, the DSR option
    on the SYN only, checksums valid, byte for byte after the MACs), with the same SVC row and nothing else."""
    frames = [tcp(EXT, LB_VIP, CP, VPORT, SYN), tcp(EXT, LB_VIP, CP, VPORT, ACK, payload=b"hello")]
    xr, tr, xstate, tstate = _both(xdp, frames)
    for x, t in zip(xr, tr):
        assert x.frame[12:] == t.frame[12:], "the frame after the MACs"
        assert x.pkt.ip_csum_ok and x.pkt.l4_csum_ok and (x.pkt.dst, x.pkt.dport) == (B2.ip, BP)
        assert x.event.hook == Hook.XDP and (x.event.verdict == Verdict.REDIRECTED
                                             or x.event.drop_reason == DropReason.NO_FIB)  # see the docstring
    assert xr[0].pkt.ihl == 7 and xr[0].event.flags & TraceFlags.DSR_OPT_ADDED and xr[1].pkt.ihl == 5
    assert xstate == tstate and [r[1] for r in xstate[0]] == ["SVC"] and xstate[1] == []


def test_snat_frames_and_rows_equal_tc(xdp_snat):
    """snat, remote backend: the SYN leaves XDP SNATed to node-a with the same NAT port, CT OUT [NodePort] row and
    NAT pair as tc makes (the port is the client's, kept when free: Cilium's snat_v4_new_mapping)."""
    xr, tr, xstate, tstate = _both(xdp_snat, [tcp(EXT, LB_VIP, CP, VPORT, SYN)])
    assert xr[0].frame[12:] == tr[0].frame[12:]
    p = xr[0].pkt
    assert (p.src, p.sport, p.dst, p.dport) == (NODE_IP, CP, B2.ip, BP) and p.ip_csum_ok and p.l4_csum_ok
    assert xstate == tstate
    out = [r for r in xstate[0] if r[1] == "OUT"]
    assert len(out) == 1 and out[0][7] & CtFlags.NODE_PORT
    assert [n[0] for n in xstate[1]] == ["IN", "OUT"]


def test_udp_checksum_rewritten_like_tc(xdp_snat):
    """A UDP datagram's checksum is updated for the new destination and source as tc's bpf_l4_csum_replace does."""
    xr, tr, _, _ = _both(xdp_snat, [udp(EXT, LB_VIP, CP, VPORT, b"query")])
    assert xr[0].frame[12:] == tr[0].frame[12:] and xr[0].pkt.l4_csum_ok


def test_no_backend_answered_in_xdp_as_tc_answers(xdp):
    """A LoadBalancer without backends: cil_xdp_entry answers with ICMP port unreachable and sends it back out
    (XDP_TX: Cilium's XDP build tail-calls the same tail_no_service_ipv4, whose ctx_redirect to the ingress device
    is XDP_TX, bpf/lib/lb.h:1768-1822@82999990, bpf/include/bpf/ctx/xdp.h:343-349@82999990); the frame after the
    MACs equals tc's answer, the record is REDIRECTED with reason DROP_NO_SERVICE at hook xdp, and no CT row."""
    from labkit.constants import TraceFlags

    xdp.service(LB_VIP, VPORT, [], flags=LB_FLAGS)
    for frame in (tcp(EXT, LB_VIP, CP, VPORT, SYN), tcp(EXT, LB_VIP, CP, VPORT, SYN, payload=bytes(range(50)))):
        r = xdp.run_xdp(frame)
        assert r.retval == XDP_TX
        assert (r.event.hook, r.event.verdict, r.event.drop_reason) == (Hook.XDP, Verdict.REDIRECTED,
                                                                        DropReason.NO_SERVICE)
        assert r.event.flags & TraceFlags.NO_BACKEND_REPLY
        t = xdp.run("cil_from_netdev", frame)
        assert r.frame == t.frame and r.frame[34] == 3 and r.frame[35] == 3
    assert xdp.ct() == []


def test_malformed_dropped_with_tc_reasons(xdp):
    """A cut IPv4 header, a cut TCP header and a fragment are XDP_DROP with DROP_INVALID, DROP_CT_INVALID_HDR and
    DROP_FRAG_NOSUPPORT: the reasons cil_from_netdev gives them (test_malformed.py)."""
    cases = {
        DropReason.INVALID: cut_header(),
        DropReason.CT_INVALID_HDR: eth(ipv4(EXT, LB_VIP, IPPROTO_TCP, tcp_segment(EXT, LB_VIP, CP, VPORT, SYN)[:10])),
        DropReason.FRAG_NOSUPPORT: eth(ipv4(EXT, LB_VIP, IPPROTO_TCP, tcp_segment(EXT, LB_VIP, CP, VPORT, SYN),
                                        frag=0x2000)),
    }
    for reason, frame in cases.items():
        r = xdp.run_xdp(frame)
        assert r.retval == XDP_DROP and (r.event.hook, r.event.drop_reason) == (Hook.XDP, reason), reason.name
        assert xdp.run("cil_from_netdev", frame).event.drop_reason == reason
    assert xdp.ct() == []


def test_no_service_passes_untraced_with_the_marker(xdp):
    """A packet to no frontend (ext to node-a's own address) passes to the stack unchanged and untraced, with
    XFER_PKT_NO_SVC (1) in the 4 metadata bytes before it (the test run hands back data_meta onwards)."""
    frame = tcp(EXT, NODE_IP, CP, 22, SYN)
    r = xdp.run_xdp(frame)
    assert (r.retval, r.events) == (XDP_PASS, [])
    assert r.frame == (1).to_bytes(4, "little") + frame


def test_xdp_forward_decrements_ttl(xdp_snat):
    """The frame XDP sends on has TTL 63 (64 in) and a valid IP checksum, as tc's: Cilium's XDP build runs the same
    fib_redirect_v4 / ipv4_l3 (bpf/lib/fib.h:288@82999990, bpf/lib/ipv4.h:67@82999990); TTL 1 is XDP_DROP with
    DROP_TTL_EXCEEDED (bpf/lib/ipv4.h:64@82999990)."""
    xdp_snat.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    r = xdp_snat.run_xdp(tcp(EXT, LB_VIP, CP, VPORT, SYN))
    assert r.frame[14 + 8] == 63
    assert r.pkt.ip_csum_ok and r.pkt.l4_csum_ok
    seg = tcp_segment(EXT, LB_VIP, CP + 1, VPORT, SYN)
    r = xdp_snat.run_xdp(eth(ipv4(EXT, LB_VIP, IPPROTO_TCP, seg, ttl=1)))
    assert r.retval == XDP_DROP
    assert r.event.drop_reason == DropReason.TTL_EXCEEDED
