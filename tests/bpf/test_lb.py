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


def test_service_without_backends_drops(native):
    """A service whose head counts 0 backends drops the packet with DROP_NO_SERVICE."""
    native.service(VIP, VPORT, [], count=0)
    r = native.run("cil_from_container", to_vip(SYN))
    assert r.retval == TC_ACT_SHOT
    assert r.event.drop_reason == DropReason.NO_SERVICE


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
    """Back in the pod: IN row with LBLoopback, v1.16's RevNAT and the pod's identity; the pod's reply goes back to it as VIP:80."""
    native.service(VIP, VPORT, [(1, A1.ip, BP, ACTIVE)])
    looped = native.run("cil_from_container", to_vip(SYN)).frame
    native.run("cil_to_container", looped)
    row = native.ct_row("IN", LOOPBACK, CP, A1.ip, BP)
    assert row is not None, [x.line() for x in native.ct()]
    assert row.flags & CtFlags.LB_LOOPBACK and row.rev_nat == SVC_ID and row.src_sec_id == A1.identity
    r = native.run("cil_from_container", tcp(A1.ip, LOOPBACK, BP, CP, SYN | ACK))
    assert r.retval == TC_ACT_REDIRECT, "handed straight back into the pod (bpf_redirect_peer)"
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (VIP, VPORT, A1.ip, CP)
    assert p.ip_csum_ok and p.l4_csum_ok
    assert (p.dst_mac, p.src_mac) == (pod_mac(A1), GW_MAC)
