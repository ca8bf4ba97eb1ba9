"""Services reached from outside, at the node's uplink (bpf_host.c,
lib/nodeport.h, dsr.h, nat.h): the DSR option a load-balancing node inserts,
the backend node's reading and stripping of it and its reply SNAT, and snat
mode's NAT map rows and reverse translation (facts sheet §9).

A LoadBalancer VIP 203.0.113.10:80 (id 1); the client ext 198.51.100.100
outside the cluster; node-a load-balances. A DSR request *to* node-a targets
its pod a2; a request node-a forwards targets b2 on node-b.
"""
from __future__ import annotations

import socket

from labkit.constants import DropReason, TraceFlags
from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT
from labkit.maps.ct import CtFlags, CtResult
from labkit.maps.eps import IDENTITY_WORLD
from labkit.maps.lb import BackendState, ServiceFlags

from .harness import A2, B2, EXT, LB_VIP, NODE_IP, SVC_ID, VPORT, ip_of
from .packets import ACK, SYN, csum, tcp

ACTIVE = BackendState.ACTIVE
LB_FLAGS = ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE
CP, BP = 50000, 8080
TCP = socket.IPPROTO_TCP
#: 203.0.113.10:80 as Cilium's IPv4 DSR option carries it: type 0x9a, length 8, then port and address each
#: byte-swapped (bpf_htons/bpf_htonl applied to values already in network order; facts §9, Cilium's own test).
DSR_OPT = bytes([0x9A, 0x08, 0x50, 0x00, 0x0A, 0x71, 0x00, 0xCB])


def test_dsr_option_inserted_on_syn(native):
    """dsr mode, remote backend: the SYN leaves DNATed with option 0x9a len 8 carrying the VIP, ihl 7, checksums valid."""
    native.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    frame = tcp(EXT, LB_VIP, CP, VPORT, SYN)
    r = native.run("cil_from_netdev", frame)
    assert r.retval == TC_ACT_REDIRECT, "out of eth0 again (bpf_redirect_neigh)"
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (EXT, CP, B2.ip, BP)
    assert p.options == DSR_OPT and p.ihl == 7
    assert p.total_length == len(frame) - 14 + 8
    assert p.ip_csum_ok and p.l4_csum_ok
    assert r.event.flags & TraceFlags.DSR_OPT_ADDED


def test_dsr_lb_node_keeps_only_the_svc_entry(native):
    """The DSR load-balancing node keeps the SVC row and no OUT row; a later ACK goes out without the option."""
    native.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    native.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, SYN))
    rows = native.ct()
    assert [(x.dir, x.src, x.dst, x.backend_id) for x in rows] == [("SVC", EXT, LB_VIP, 1)]
    r = native.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, ACK))
    assert r.pkt.options == b"" and r.pkt.dst == B2.ip and r.pkt.l4_csum_ok


def dsr_request(flags: int = SYN, opt: bytes = DSR_OPT) -> bytes:
    """What the LB node sends node-a for its pod a2: DNATed, with the option."""
    return tcp(EXT, A2.ip, CP, BP, flags, options=opt)


def test_dsr_option_stripped_on_backend_node(native):
    """The backend's node reads the option, removes it (ihl 5, length -8, checksums valid) and lets the kernel deliver."""
    frame = dsr_request()
    r = native.run("cil_from_netdev", frame)
    assert r.retval == TC_ACT_OK
    p = r.pkt
    assert p.options == b"" and p.ihl == 5 and p.total_length == len(frame) - 14 - 8
    assert (p.src, p.sport, p.dst, p.dport) == (EXT, CP, A2.ip, BP)
    assert p.ip_csum_ok and p.l4_csum_ok
    assert r.event.flags & TraceFlags.DSR_OPT_STRIPPED


def test_dsr_backend_node_entries(native):
    """The option creates OUT {ext:cp -> a2:bp} DSRInternal (no RELATED twin) and NAT {a2:bp -> ext:cp OUT} → VIP:80."""
    native.run("cil_from_netdev", dsr_request())
    row = native.ct_row("OUT", EXT, CP, A2.ip, BP)
    assert row is not None, [x.line() for x in native.ct()]
    assert row.flags == CtFlags.DSR_INTERNAL and row.src_sec_id == IDENTITY_WORLD
    assert not [x for x in native.ct() if x.related]
    nat = native.nat_entry(A2.ip, BP, EXT, CP)
    assert nat is not None, [x.line() for x in native.nat()]
    assert (ip_of(nat.to_addr), socket.ntohs(nat.to_port)) == (LB_VIP, VPORT)


def test_dsr_reply_leaves_as_the_vip(native):
    """On the backend's node the reply leaves eth0 with VIP:80 as its source, straight to the client."""
    native.run("cil_from_netdev", dsr_request())
    r = native.run("cil_to_netdev", tcp(A2.ip, EXT, BP, CP, SYN | ACK))
    assert r.retval == TC_ACT_OK
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (LB_VIP, VPORT, EXT, CP)
    assert p.ip_csum_ok and p.l4_csum_ok
    assert r.event.ct_result == CtResult.REPLY


def test_bad_dsr_option_drops(native):
    """An IP option that is not a well-formed DSR option (wrong type, wrong length) is dropped with DROP_INVALID."""
    for opt in (bytes([0x9B]) + DSR_OPT[1:], bytes([0x9A, 0x0C]) + DSR_OPT[2:] + bytes(4)):
        r = native.run("cil_from_netdev", dsr_request(opt=opt))
        assert r.retval == TC_ACT_SHOT, opt.hex()
        assert r.event.drop_reason == DropReason.INVALID


# -- snat mode ---------------------------------------------------------------------------------
def test_snat_request_leaves_from_node_address(snat):
    """snat mode: the request leaves with node-a's address, the client's port kept (in range), checksums valid."""
    snat.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    r = snat.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, SYN))
    assert r.retval == TC_ACT_REDIRECT
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (NODE_IP, CP, B2.ip, BP)
    assert p.ip_csum_ok and p.l4_csum_ok
    assert r.event.flags & TraceFlags.SNAT


def test_snat_map_rows_and_out_entry(snat):
    """SNAT writes both NAT rows (OUT ext→b2 to node:port, IN b2→node back to ext) and a NodePort OUT row with the RevNAT."""
    snat.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    snat.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, SYN))
    out = snat.nat_entry(EXT, CP, B2.ip, BP, direction=0)
    back = snat.nat_entry(B2.ip, BP, NODE_IP, CP, direction=1)
    assert out is not None and back is not None, [x.line() for x in snat.nat()]
    assert (ip_of(out.to_addr), socket.ntohs(out.to_port)) == (NODE_IP, CP)
    assert (ip_of(back.to_addr), socket.ntohs(back.to_port)) == (EXT, CP)
    row = snat.ct_row("OUT", EXT, CP, B2.ip, BP)
    assert row is not None and row.flags == CtFlags.NODE_PORT and row.rev_nat == SVC_ID
    assert not [x for x in snat.ct() if x.related], "Cilium's nodeport_lb4 passes no related map"


def test_snat_port_out_of_range_is_remapped(snat):
    """A client port below 32768 is replaced by one in [32768, 65534] (v1.16's clamp)."""
    snat.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    p = snat.run("cil_from_netdev", tcp(EXT, LB_VIP, 1234, VPORT, SYN)).pkt
    assert p.src == NODE_IP and 32768 <= p.sport <= 65534


def test_snat_reply_is_translated_back(snat):
    """The backend's reply to node:port gets the client as destination and VIP:80 as source, and is sent back out."""
    snat.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    snat.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, SYN))
    r = snat.run("cil_from_netdev", tcp(B2.ip, NODE_IP, BP, CP, SYN | ACK))
    assert r.retval == TC_ACT_REDIRECT
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (LB_VIP, VPORT, EXT, CP)
    assert p.ip_csum_ok and p.l4_csum_ok
    assert r.event.flags & TraceFlags.REV_SNAT


# -- the LB node routes: TTL ------------------------------------------------------------------
def _ttl(frame: bytes) -> int:
    return frame[14 + 8]


def test_dsr_forward_decrements_ttl(native):
    """dsr mode: the forwarded SYN leaves with TTL 63 (64 in), IP checksum valid (fib_redirect_v4 → ipv4_l3 →
    ipv4_dec_ttl: bpf/lib/nodeport.h:2291@82999990, bpf/lib/fib.h:288@82999990, bpf/lib/ipv4.h:67@82999990)."""
    native.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    r = native.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, SYN))
    assert r.retval == TC_ACT_REDIRECT
    assert _ttl(r.frame) == 63
    assert r.pkt.ip_csum_ok and r.pkt.l4_csum_ok


def test_snat_forward_and_reply_decrement_ttl(snat):
    """snat mode: the request (tail_nodeport_nat_egress_ipv4's ipv4_l3, bpf/lib/nodeport.h:2722@82999990) and the
    reply sent back to the client (nodeport_rev_dnat_ingress_ipv4, bpf/lib/nodeport.h:2491@82999990) each lose one."""
    snat.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    r = snat.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, SYN))
    assert r.retval == TC_ACT_REDIRECT and _ttl(r.frame) == 63 and r.pkt.ip_csum_ok
    back = snat.run("cil_from_netdev", tcp(B2.ip, NODE_IP, BP, CP, SYN | ACK))
    assert back.retval == TC_ACT_REDIRECT and _ttl(back.frame) == 63 and back.pkt.ip_csum_ok


def test_ttl_one_is_dropped_ttl_exceeded(native):
    """A packet the LB node would forward with TTL 1 is dropped with DROP_TTL_EXCEEDED (-196): ipv4_dec_ttl's
    `if (ttl <= 1) return DROP_TTL_EXCEEDED` (bpf/lib/ipv4.h:64@82999990, bpf/lib/common.h:648@82999990)."""
    from .packets import eth, ipv4, tcp_segment

    native.service(LB_VIP, VPORT, [(1, B2.ip, BP, ACTIVE)], flags=LB_FLAGS)
    seg = tcp_segment(EXT, LB_VIP, CP, VPORT, SYN)
    r = native.run("cil_from_netdev", eth(ipv4(EXT, LB_VIP, TCP, seg, ttl=1)))
    assert r.retval == TC_ACT_SHOT
    assert r.event.drop_reason == DropReason.TTL_EXCEEDED


# -- a Service without backends: Cilium's own frame and checksums -----------------------------
def test_no_backend_answer_has_cilium_tests_checksums(native):
    """Cilium's tc_nodeport_lb4_no_backend scenario, frame as its pktgen builds it (bpf/tests/pktgen.h:47,58,97,
    411-413@82999990: 110.0.11.1:111 → 172.16.10.2:80, SYN, seq 123456 and window 65535 stored in host order, TCP
    checksum left 0, 20 bytes of "Should not change!!\\0"; bpf/tests/tc_nodeport_lb4_no_backend.c:63-70@82999990),
    the service counting one backend it does not have (:85): from-netdev redirects (:116) the ICMP answer with TTL
    64 (:133), IP checksum 0x4b8e (:136) and ICMP checksum 0x2de7 (:150)."""
    import struct

    smac, dmac = bytes.fromhex("deadbeefdeef"), bytes.fromhex("ce72a7038856")
    src, dst = socket.inet_aton("110.0.11.1"), socket.inet_aton("172.16.10.2")
    seg = (struct.pack("!HH", 111, 80) + struct.pack("<I", 123456) + bytes(4) + bytes([5 << 4, SYN])
           + struct.pack("<H", 65535) + bytes(4) + b"Should not change!!\x00")
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(seg), 0, 0, 64, TCP, 0, src, dst)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    native.service("172.16.10.2", 80, [], count=1, flags=LB_FLAGS)
    r = native.run("cil_from_netdev", dmac + smac + b"\x08\x00" + ip + seg)
    out = r.frame
    assert r.retval == TC_ACT_REDIRECT
    assert (out[0:6], out[6:12]) == (smac, dmac)
    assert (out[22], out[23]) == (64, socket.IPPROTO_ICMP)
    assert struct.unpack("!H", out[24:26])[0] == 0x4B8E
    assert (out[34], out[35]) == (3, 3)
    assert struct.unpack("!H", out[36:38])[0] == 0x2DE7
