"""Cilium's hairpin flow: a pod reaching its own ClusterIP, SNATed to the service loopback address so the reply
comes back through the datapath, then reverse-translated; and a pod's request to a service without backends in a
build without SERVICE_NO_BACKEND_RESPONSE. On node-a's pod programs (``native``: bpf_lxc.c, cil_from_container and
cil_to_container).

Cilium's file: bpf/tests/tc_nodeport_test.c (@82999990), bpf_lxc.c with per-packet LB. Addresses are the lab's:
pod a1 198.18.1.11 in place of v4_pod_one, the ClusterIP 198.19.0.10:80 in place of v4_svc_one:80, and labkit's
loopback 169.254.42.1 (--ipv4-service-loopback-address's default) in place of the test header's IPV4_LOOPBACK
10.245.255.31; the ports are Cilium's (tcp_src_one 22330, tcp_dst_one 22331, tcp_src_two 33440).
"""
from __future__ import annotations

from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT
from labkit.maps.ct import CtFlags
from labkit.maps.lb import BackendState

from ..harness import A1, LOOPBACK, VIP
from .. import packets
from .peer import SAME_NODE_ROUTED, add_service, frame_ip_header, ip_header, lab_difference, pktgen_tcp

SRC_ONE, DST_ONE, SRC_TWO, SVC_PORT = 22330, 22331, 33440, 80  # pktgen.h:85-93
SYN_ACK = packets.SYN | packets.ACK  # the reply's flags (:332 sets ack on pktgen's default SYN)


def _forward(node):
    """hairpin_flow_1_forward_v4's SETUP: the service with a1 as its only backend (tc_nodeport_test.c:99-117)."""
    add_service(node, [(124, A1.ip, DST_ONE, BackendState.ACTIVE)], frontend=VIP)
    return node.run("cil_from_container", pktgen_tcp(A1.ip, VIP, SRC_ONE, SVC_PORT))


def test_hairpin_forward(native):
    """hairpin_flow_1_forward_v4: the request is DNATed to the pod and SNATed to the loopback address, the SVC entry
    exists and the OUT entry {loopback -> pod} has lb_loopback (bpf/tests/tc_nodeport_test.c:119-201@82999990)."""
    p = _forward(native).pkt
    assert (p.src, p.dst) == (LOOPBACK, A1.ip)  # :145-149
    assert (p.sport, p.dport) == (SRC_ONE, DST_ONE)  # :159-163
    assert native.ct_row("SVC", A1.ip, SRC_ONE, VIP, SVC_PORT) is not None  # :165-181
    out = native.ct_row("OUT", LOOPBACK, SRC_ONE, A1.ip, DST_ONE)  # :183-198
    assert out is not None and out.flags & CtFlags.LB_LOOPBACK


def test_hairpin_forward_delivery(native):
    """hairpin_flow_1_forward_v4's verdict and L3 checksum: Cilium redirects the request straight to the pod
    (ipv4_local_delivery) with TTL 63 (-0x4f02) (bpf/tests/tc_nodeport_test.c:138, 151@82999990); labkit hands it
    to the node's kernel, which routes it to the pod's veth and decrements the TTL there (LAB_DIFFERENCES), so the
    hook leaves TC_ACT_OK and TTL 64."""
    r = _forward(native)
    assert r.retval == TC_ACT_OK, lab_difference(SAME_NODE_ROUTED)
    assert frame_ip_header(r.frame) == ip_header(LOOPBACK, A1.ip, ttl=64)


def _to_pod(native):
    _forward(native)
    return native.run("cil_to_container", pktgen_tcp(LOOPBACK, A1.ip, SRC_ONE, DST_ONE))


def test_hairpin_forward_ingress(native):
    """hairpin_flow_2_forward_ingress_v4: at the pod's ingress the request passes unchanged (TTL 64: -0x5002) and
    the IN entry {loopback -> pod} has lb_loopback (bpf/tests/tc_nodeport_test.c:244-311@82999990)."""
    r = _to_pod(native)
    assert r.retval == TC_ACT_OK  # :263
    p = r.pkt
    assert (p.src, p.dst, p.sport, p.dport) == (LOOPBACK, A1.ip, SRC_ONE, DST_ONE)  # :270-288
    assert frame_ip_header(r.frame) == ip_header(LOOPBACK, A1.ip, ttl=64)  # :276
    row = native.ct_row("IN", LOOPBACK, SRC_ONE, A1.ip, DST_ONE)  # :290-308
    assert row is not None and row.flags & CtFlags.LB_LOOPBACK


def _reply(native):
    _to_pod(native)
    return native.run("cil_from_container", pktgen_tcp(A1.ip, LOOPBACK, DST_ONE, SRC_ONE, flags=SYN_ACK))


def test_hairpin_reverse(native):
    """hairpin_flow_3_reverse_v4: the pod's reply leaves from-container redirected, its addresses and ports
    unchanged (bpf/tests/tc_nodeport_test.c:355-399@82999990)."""
    r = _reply(native)
    assert r.retval == TC_ACT_REDIRECT  # :374
    p = r.pkt
    assert (p.src, p.dst) == (A1.ip, LOOPBACK)  # :381-385
    assert (p.sport, p.dport) == (DST_ONE, SRC_ONE)  # :392-396


def test_hairpin_reverse_ingress(native):
    """hairpin_flow_4_reverse_ingress_v4: at the pod's ingress the reply is reverse-NATed to come from the service,
    TTL 64 (0x402) (bpf/tests/tc_nodeport_test.c:442-489@82999990)."""
    _reply(native)
    r = native.run("cil_to_container", pktgen_tcp(A1.ip, LOOPBACK, DST_ONE, SRC_ONE, flags=SYN_ACK))
    assert r.retval == TC_ACT_OK  # :461
    p = r.pkt
    assert (p.src, p.dst) == (VIP, A1.ip)  # :468-472
    assert frame_ip_header(r.frame) == ip_header(VIP, A1.ip, ttl=64)  # :474
    assert (p.sport, p.dport) == (SVC_PORT, SRC_ONE)  # :482-486


def test_drop_no_backend(native_drop):
    """tc_drop_no_backend: built without SERVICE_NO_BACKEND_RESPONSE (--service-no-backend-response=drop), a
    request to a service counting no backend is dropped (bpf/tests/tc_nodeport_test.c:491-533@82999990)."""
    add_service(native_drop, [], count=0, frontend=VIP)  # :501
    r = native_drop.run("cil_from_container", pktgen_tcp(A1.ip, VIP, SRC_TWO, SVC_PORT))
    assert r.retval == TC_ACT_SHOT  # :530
