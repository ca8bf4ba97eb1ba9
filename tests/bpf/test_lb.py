"""Per-packet Service load balancing at from-container (bpf_lxc.c, lib/lb.h):
the SVC row and the backend choice, DNAT with valid checksums, reverse NAT of
the replies at to-container, and the hairpin case (facts sheet §5-7, §10).

The service is a ClusterIP 198.19.0.10:80 (id 1); the client is pod a1.
"""
from __future__ import annotations

import socket

from labkit.constants import DropReason
from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT
from labkit.maglev import flow_slot
from labkit.maps.ct import CtFlags, CtResult, TcpFlags
from labkit.maps.lb import BackendState

from .harness import A1, B1, B2, LOOPBACK, SVC_ID, VIP, VPORT, GW_MAC, pod_mac
from .packets import ACK, SYN, parse, tcp

ACTIVE, TERMINATING = BackendState.ACTIVE, BackendState.TERMINATING
CP, BP = 40000, 8080
M = 16381  #: Cilium's default Maglev table size, the build's LB_MAGLEV_LUT_SIZE


def to_vip(flags: int, sport: int = CP) -> bytes:
    return tcp(A1.ip, VIP, sport, VPORT, flags)


def test_clusterip_dnat_to_backend(native):
    """A SYN to the ClusterIP leaves DNATed to the backend (source untouched, IP and TCP checksums still valid)."""
    native.service(VIP, VPORT, [(1, B1.ip, BP, ACTIVE)])
    r = native.run("cil_from_container", to_vip(SYN))
    assert r.retval == TC_ACT_OK
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (A1.ip, CP, B1.ip, BP)
    assert p.ip_csum_ok and p.l4_csum_ok
    assert r.event.svc_ct_result == CtResult.NEW


def test_svc_entry_and_out_entry_carry_the_service(native):
    """The first packet creates SVC {a1:cp -> VIP:80} with BackendID and RevNAT, and the OUT row to the backend carries the RevNAT."""
    native.service(VIP, VPORT, [(1, B1.ip, BP, ACTIVE)])
    native.run("cil_from_container", to_vip(SYN))
    svc = native.ct_row("SVC", A1.ip, CP, VIP, VPORT)
    assert svc is not None, [x.line() for x in native.ct()]
    assert (svc.backend_id, svc.rev_nat, svc.tx_flags_seen) == (1, SVC_ID, TcpFlags.SYN)
    assert not svc.flags & CtFlags.LB_LOOPBACK
    out = native.ct_row("OUT", A1.ip, CP, B1.ip, BP)
    assert out is not None and out.rev_nat == SVC_ID and out.backend_id == 0
    # Cilium passes no related map for the SVC entry: the only twin is the OUT row's
    twins = [x for x in native.ct() if x.related]
    assert [(t.dir, t.src, t.dst) for t in twins] == [("OUT", A1.ip, B1.ip)]


def test_established_flow_keeps_its_backend(native):
    """Later packets of a flow find the SVC row and go to the same backend, whichever of two it was."""
    native.service(VIP, VPORT, [(1, B1.ip, BP, ACTIVE), (2, B2.ip, BP, ACTIVE)])
    first = native.run("cil_from_container", to_vip(SYN)).pkt.dst
    chosen = native.ct_row("SVC", A1.ip, CP, VIP, VPORT).backend_id
    assert {1: B1.ip, 2: B2.ip}[chosen] == first
    for _ in range(8):
        r = native.run("cil_from_container", to_vip(ACK))
        assert r.pkt.dst == first and r.event.svc_ct_result == CtResult.ESTABLISHED


def test_random_selection_uses_every_active_backend(native):
    """New flows pick slot = rand % count + 1: over 32 flows both backends of two are chosen, and only they."""
    native.service(VIP, VPORT, [(1, B1.ip, BP, ACTIVE), (2, B2.ip, BP, ACTIVE)])
    seen = {native.run("cil_from_container", to_vip(SYN, sport=41000 + i)).pkt.dst for i in range(32)}
    assert seen == {B1.ip, B2.ip}


def test_new_flows_skip_terminating_backend(native):
    """A terminating backend (listed after count) gets no new flow."""
    native.service(VIP, VPORT, [(1, B1.ip, BP, ACTIVE), (2, B2.ip, BP, TERMINATING)])
    seen = {native.run("cil_from_container", to_vip(SYN, sport=42000 + i)).pkt.dst for i in range(32)}
    assert seen == {B1.ip}


def _icmp_reject_checks(r, frame: bytes, client: str, frontend: str, client_mac: str, node_mac: str) -> None:
    """The answer Cilium's __tail_no_service_ipv4 builds (bpf/lib/lb.h:1718-1822@82999990), checked field by field
    against the frame that went in: MACs swapped (lb.h:1788-1790), IPv4 ihl 5, the client's TOS, id 0, TTL 64 (IPDEFTTL),
    protocol ICMP, frontend → client (lb.h:1793-1806), ICMP type 3 code 3 (lb.h:1810-1811), and as its payload the
    frame from the IPv4 header on, cut or padded to sample_len = min(frame length, 64) bytes (lb.h:1753-1756:
    ctx_adjust_troom by sample_len + ETH_HLEN - ctx_full_len), both checksums valid."""
    import struct

    from .packets import csum

    out = r.frame
    assert r.retval == TC_ACT_REDIRECT
    macs = [":".join(f"{b:02x}" for b in out[i:i + 6]) for i in (0, 6)]
    assert macs == [client_mac, node_mac] and out[12:14] == b"\x08\x00"
    ip, icmp = out[14:34], out[34:42]
    sample_len = min(len(frame), 64)
    sample = (frame[14:] + bytes(14))[:sample_len]
    assert ip[0] == 0x45 and ip[1] == frame[15] and struct.unpack("!HHHBB", ip[2:10]) == (28 + sample_len, 0, 0, 64, 1)
    assert (socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])) == (frontend, client)
    assert csum(ip) == 0
    assert (icmp[0], icmp[1], icmp[4:8]) == (3, 3, bytes(4))
    assert out[42:] == sample and len(out) == 42 + sample_len
    assert csum(icmp + sample) == 0


def test_service_without_backends_answers_icmp_port_unreachable(native):
    """A ClusterIP whose head counts 0 backends: with v1.16's default --service-no-backend-response=reject
    (SERVICE_NO_BACKEND_RESPONSE) bpf_lxc tail-calls tail_no_service_ipv4 on DROP_NO_SERVICE (bpf/bpf_lxc.c:121-124@82999990)
    and the SYN comes back to the pod as ICMP port unreachable from the VIP; the record is REDIRECTED with reason
    DROP_NO_SERVICE, not reported (the tail call sends no notification, bpf/lib/lb.h:1825-1836@82999990), and no CT
    row is written (lb4_local jumps to no_service before creating the SVC entry, bpf/lib/lb.h:1546-1547@82999990)."""
    from labkit.constants import TraceFlags, Verdict
    from labkit.observe.trace import Report

    native.service(VIP, VPORT, [], count=0)
    frame = to_vip(SYN)
    r = native.run("cil_from_container", frame)
    _icmp_reject_checks(r, frame, A1.ip, VIP, parse(frame).src_mac, parse(frame).dst_mac)
    ev = r.event
    assert (ev.verdict, ev.drop_reason) == (Verdict.REDIRECTED, DropReason.NO_SERVICE)
    assert ev.flags & TraceFlags.NO_BACKEND_REPLY and not ev.report & Report.REPORTED
    assert native.ct() == []
    # a frame longer than 64 bytes: the sample is its first 64 bytes
    long = tcp(A1.ip, VIP, CP + 1, VPORT, SYN, payload=bytes(range(60)))
    _icmp_reject_checks(native.run("cil_from_container", long), long, A1.ip, VIP, parse(long).src_mac,
                        parse(long).dst_mac)


def test_loadbalancer_without_backends_answers_the_outside_client(native):
    """At from-netdev a LoadBalancer VIP without backends answers ext with ICMP port unreachable from the VIP, sent
    back out of eth0 (nodeport_svc_lb4's tail call on DROP_NO_SERVICE, bpf/lib/nodeport.h:2849-2856@82999990)."""
    from labkit.maps.lb import ServiceFlags

    from .harness import EXT, LB_VIP

    native.service(LB_VIP, VPORT, [], count=0, flags=ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE)
    frame = tcp(EXT, LB_VIP, CP, VPORT, SYN)
    r = native.run("cil_from_netdev", frame)
    _icmp_reject_checks(r, frame, EXT, LB_VIP, parse(frame).src_mac, parse(frame).dst_mac)
    assert native.ct() == []


def test_maglev_table_picks_the_flows_slot_at_the_uplink(native):
    """At from-netdev (a LoadBalancer frontend) the backend is lut[jhash(saddr, ports, proto, seed) % M], the
    destination left out."""
    from labkit.maps.lb import ServiceFlags

    from .harness import EXT, LB_VIP

    slot = flow_slot(EXT, CP, VPORT, socket.IPPROTO_TCP, M)
    lut = [2] * M
    lut[slot] = 1
    native.service(LB_VIP, VPORT, [(1, B1.ip, BP, ACTIVE), (2, B2.ip, BP, ACTIVE)], maglev=lut,
                   flags=ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE)
    r = native.run("cil_from_netdev", tcp(EXT, LB_VIP, CP, VPORT, SYN))
    assert r.pkt.dst == B1.ip
    assert native.ct_row("SVC", EXT, CP, LB_VIP, VPORT).backend_id == 1


def test_pods_select_at_random_even_with_a_maglev_table(native):
    """A pod's flows ignore a Maglev table: bpf_lxc is compiled with LB_SELECTION_RANDOM (bpf/bpf_lxc.c:41-42@82999990,
    "force bpf_lxc to use the random backend selection algorithm for in-cluster traffic"); over 32 flows both
    backends are picked although the table names only backend 2."""
    native.service(VIP, VPORT, [(1, B1.ip, BP, ACTIVE), (2, B2.ip, BP, ACTIVE)], maglev=[2] * M)
    seen = {native.run("cil_from_container", to_vip(SYN, sport=43000 + i)).pkt.dst for i in range(32)}
    assert seen == {B1.ip, B2.ip}


def test_reply_is_reverse_translated(native):
    """The backend's reply at to-container (CT_REPLY of the OUT row) gets VIP:80 back as its source, checksums valid."""
    native.service(VIP, VPORT, [(1, B1.ip, BP, ACTIVE)])
    native.run("cil_from_container", to_vip(SYN))
    r = native.run("cil_to_container", tcp(B1.ip, A1.ip, BP, CP, SYN | ACK))
    assert r.retval == TC_ACT_OK
    assert r.event.ct_result == CtResult.REPLY and r.event.rev_nat_index == SVC_ID
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (VIP, VPORT, A1.ip, CP)
    assert p.ip_csum_ok and p.l4_csum_ok


def test_hairpin_snat_to_loopback(native):
    """A pod reaching itself through its service leaves as 169.254.42.1:cp -> pod:8080; SVC without, OUT with LBLoopback."""
    native.service(VIP, VPORT, [(1, A1.ip, BP, ACTIVE)])
    r = native.run("cil_from_container", to_vip(SYN))
    assert r.retval == TC_ACT_OK
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (LOOPBACK, CP, A1.ip, BP)
    assert p.ip_csum_ok and p.l4_csum_ok
    svc = native.ct_row("SVC", A1.ip, CP, VIP, VPORT)
    assert svc is not None and not svc.flags & CtFlags.LB_LOOPBACK
    out = native.ct_row("OUT", LOOPBACK, CP, A1.ip, BP)
    assert out is not None, [x.line() for x in native.ct()]
    assert out.flags & CtFlags.LB_LOOPBACK and out.rev_nat == SVC_ID


def test_hairpin_in_entry_and_reply(native):
    """Back in the pod: IN row with LBLoopback, v1.16's RevNAT and the pod's identity; the pod's reply is handed back
    to it untranslated (bpf_lxc.c:1106-1119@82999990, ipv4_local_delivery) and its ingress makes it VIP:80 -> a1
    (bpf_lxc.c:1870-1885@82999990, lb4_rev_nat with the loopback flag)."""
    native.service(VIP, VPORT, [(1, A1.ip, BP, ACTIVE)])
    looped = native.run("cil_from_container", to_vip(SYN)).frame
    native.run("cil_to_container", looped)
    row = native.ct_row("IN", LOOPBACK, CP, A1.ip, BP)
    assert row is not None, [x.line() for x in native.ct()]
    assert row.flags & CtFlags.LB_LOOPBACK and row.rev_nat == SVC_ID and row.src_sec_id == A1.identity
    r = native.run("cil_from_container", tcp(A1.ip, LOOPBACK, BP, CP, SYN | ACK))
    assert r.retval == TC_ACT_REDIRECT, "handed straight back into the pod's ingress (bpf_redirect)"
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (A1.ip, BP, LOOPBACK, CP)
    assert p.ip_csum_ok and p.l4_csum_ok
    assert (p.dst_mac, p.src_mac) == (pod_mac(A1), GW_MAC)
    back = native.run("cil_to_container", r.frame)
    q = back.pkt
    assert (q.src, q.sport, q.dst, q.dport) == (VIP, VPORT, A1.ip, CP)
    assert q.ip_csum_ok and q.l4_csum_ok


def test_affinity_keeps_a_backend_only_while_the_agent_matches_it(native):
    """Session affinity asks cilium_lb_affinity_match, not the backend's state (bpf/lib/lb.h:1413-1432@82999990,
    __lb4_affinity_backend_id): a client's remembered backend that is terminating but still matched keeps its new
    flows; one no longer matched (the agent took it out of the service; its backend row may live on for another
    service) loses the entry, and the flow gets one of the service's backends, which the entry then remembers."""
    from labkit.maps.lb import (Lb4AffinityKey, Lb4Backend, Lb4BackendKey, Lb4Key, Lb4Service, LbAffinityMatch,
                                LbAffinityMatchValue, LbAffinityVal, ServiceFlags)

    def setup(slots, matched, flags1):
        native.reset()
        head = Lb4Key.make(VIP, VPORT, 0)
        with native.map("cilium_lb4_services_v2", Lb4Key, Lb4Service) as m:
            m[head] = Lb4Service.head(1, SVC_ID, ServiceFlags.AFFINITY, 0, 60)
            for slot, bid in enumerate(slots, start=1):
                m[head.with_slot(slot)] = Lb4Service.slot(bid, SVC_ID)
        with native.map("cilium_lb4_backends_v3", Lb4BackendKey, Lb4Backend) as m:
            m[Lb4BackendKey(1)] = Lb4Backend.make(B1.ip, BP, 0, flags1)
            m[Lb4BackendKey(2)] = Lb4Backend.make(B2.ip, BP, 0, ACTIVE)
        with native.map("cilium_lb_affinity_match", LbAffinityMatch, LbAffinityMatchValue) as m:
            for bid in matched:
                m[LbAffinityMatch.make(SVC_ID, bid)] = LbAffinityMatchValue()
        with native.map("cilium_lb4_affinity", Lb4AffinityKey, LbAffinityVal) as m:
            m[Lb4AffinityKey.make(A1.ip, SVC_ID)] = LbAffinityVal(last_used=native.now(), backend_id=1)

    def remembered():
        with native.map("cilium_lb4_affinity", Lb4AffinityKey, LbAffinityVal) as m:
            return m[Lb4AffinityKey.make(A1.ip, SVC_ID)].backend_id

    # terminating (listed after count), still matched: the client keeps it
    setup([2, 1], [1, 2], TERMINATING)
    assert {native.run("cil_from_container", to_vip(SYN, sport=44000 + i)).pkt.dst for i in range(8)} == {B1.ip}
    # active but no longer the service's (no match row, not in its slots): the entry goes, b2 is chosen and kept
    setup([2], [2], ACTIVE)
    assert native.run("cil_from_container", to_vip(SYN, sport=44100)).pkt.dst == B2.ip
    assert remembered() == 2
