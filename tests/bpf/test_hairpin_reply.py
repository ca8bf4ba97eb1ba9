"""The reply of a hairpin flow at node-a's pod programs (issue 30 item 15), frame by frame: from-container hands it
back to the pod untranslated with ipv4_local_delivery's L3 work done (ipv4_l3: TTL - 1, the pod's MAC as
destination, the node's as source; l3.h:52-69 and 156-175@82999990), and to-container reverse-NATs it with the
loopback flag (bpf_lxc.c:1870-1885, lb.h:1053-1085@82999990)."""
from __future__ import annotations

from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT
from labkit.maps.lb import BackendState

from .harness import A1, GW_MAC, LOOPBACK, VIP, pod_mac
from .packets import ACK, SYN, tcp

CP, VPORT = 40600, 80


def _mac(frame: bytes, off: int) -> str:
    return ":".join(f"{b:02x}" for b in frame[off:off + 6])


def _hairpin(native):
    native.service(VIP, VPORT, [(1, A1.ip, 8080, BackendState.ACTIVE)])
    fwd = native.run("cil_from_container", tcp(A1.ip, VIP, CP, VPORT, SYN))
    assert (fwd.pkt.src, fwd.pkt.dst) == (LOOPBACK, A1.ip)
    assert native.run("cil_to_container", tcp(LOOPBACK, A1.ip, CP, 8080, SYN)).retval == TC_ACT_OK


def test_from_container_delivers_the_reply_back_untranslated(native):
    """a1's SYN|ACK to 169.254.42.1 leaves from-container redirected (back into its pod's ingress), addresses and
    ports unchanged, TTL 64 → 63, MACs node → pod (bpf_lxc.c:1106-1119@82999990; Cilium's own check:
    bpf/tests/tc_nodeport_test.c:374-396@82999990)."""
    _hairpin(native)
    r = native.run("cil_from_container", tcp(A1.ip, LOOPBACK, 8080, CP, SYN | ACK))
    assert r.retval == TC_ACT_REDIRECT
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (A1.ip, 8080, LOOPBACK, CP)
    assert r.frame[14 + 8] == 63
    assert (_mac(r.frame, 0), _mac(r.frame, 6)) == (pod_mac(A1), GW_MAC)


def test_to_container_reverse_nats_the_reply(native):
    """At a1's ingress the reply becomes VIP:80 → a1:cp (bpf/tests/tc_nodeport_test.c:461-486@82999990)."""
    _hairpin(native)
    native.run("cil_from_container", tcp(A1.ip, LOOPBACK, 8080, CP, SYN | ACK))
    r = native.run("cil_to_container", tcp(A1.ip, LOOPBACK, 8080, CP, SYN | ACK))
    assert r.retval == TC_ACT_OK
    p = r.pkt
    assert (p.src, p.sport, p.dst, p.dport) == (VIP, VPORT, A1.ip, CP)
