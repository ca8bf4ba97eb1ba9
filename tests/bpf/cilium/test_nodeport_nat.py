"""Cilium's NodePort scenarios in SNAT mode (no DSR): the load-balancing node with a local and a remote backend,
its reverse translation of replies, and the backend's node receiving an SNATed request — in tc (``snat``:
node-a's bpf_host.c built with --bpf-lb-mode=snat) and in XDP (``xdp_snat``).

Cilium's files: bpf/tests/tc_nodeport_lb4_nat_lb.c, tc_nodeport_lb4_nat_backend.c, xdp_nodeport_lb4_nat_lb.c,
xdp_nodeport_lb4_nat_backend.c (@82999990). Addresses are the lab's (peer.py): the client ext
198.51.100.100:111, the frontend 203.0.113.10:80, node-a 198.51.100.11 as the LB, the local backend a2
198.18.1.12:8080, the remote backend b2 198.18.2.12:8080; in the *_backend.c files the LB is node-b 198.51.100.12
(port 222) and the node under test, node-a, holds the backend a2.

The XDP runs that forward go through the FIB namespace (fibns.py), so that Cilium's verdict and MAC checks
translate. Not translated, and why: the tc CHECKs' MACs (Cilium mocks fib_lookup; labkit's tc forwards with
bpf_redirect_neigh, the kernel writing the MACs after the program). For a
backend on the node itself Cilium (ENABLE_HOST_ROUTING) redirects into the pod and so decrements the TTL there
(0x4212, 0xa712 are TTL 63 headers); labkit hands the request to the node's kernel (TC_ACT_OK, TTL 64: the kernel's
forwarding decrements it) — LAB_DIFFERENCES, "traffic reaching a node is routed to the pod by the node's kernel".
"""
from __future__ import annotations

from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT
from labkit.maps.lb import BackendState

from .peer import (BACKEND_PORT, CLIENT, CLIENT_2, CLIENT_PORT, FRONTEND, FRONTEND_PORT, IPPROTO_UDP,
                   KERNEL_ROUTES, LB_IP, LOCAL_BACKEND, REMOTE_BACKEND, REMOTE_LB_IP, add_service, frame_ip_header,
                   ip_header, lab_difference, pktgen_tcp, pktgen_udp)
from .fibns import XDP_PASS, assert_xdp_tx

ACTIVE = BackendState.ACTIVE
LB_PORT = 222  #: tc_nodeport_lb4_nat_backend.c:30
XFER_PKT_NO_SVC = 1  #: bpf/lib/common.h's XDP-to-skb metadata bit


def _local_backend(node, client: str = CLIENT):
    """SETUP tc_nodeport_local_backend: service (rev NAT 1) with the local backend 124
    (tc_nodeport_lb4_nat_lb.c:178-197), then the client's request."""
    add_service(node, [(124, LOCAL_BACKEND, BACKEND_PORT, ACTIVE)])
    return node.run("cil_from_netdev", pktgen_tcp(client, FRONTEND, CLIENT_PORT, FRONTEND_PORT))


def _assert_local_backend(r, client: str):
    assert r.retval == TC_ACT_OK, lab_difference(KERNEL_ROUTES)  # Cilium (ENABLE_HOST_ROUTING): redirect
    p = r.pkt
    assert (p.src, p.dst) == (client, LOCAL_BACKEND)  # tc_nodeport_lb4_nat_lb.c:237-241: DNATed, not SNATed
    assert (p.sport, p.dport) == (CLIENT_PORT, BACKEND_PORT)  # :246-250
    assert frame_ip_header(r.frame) == ip_header(client, LOCAL_BACKEND, ttl=64)  # :243 less the host-routing TTL
    assert p.l4_csum_ok


def test_local_backend(snat):
    """tc_nodeport_local_backend: a request to a local backend is DNATed, not SNATed
    (bpf/tests/tc_nodeport_lb4_nat_lb.c:199-253@82999990)."""
    _assert_local_backend(_local_backend(snat), CLIENT)


def test_local_backend_reply(snat):
    """tc_nodeport_local_backend_reply: the local backend's reply is rev-DNATed at to-netdev and passed on,
    TTL 64 (0x4baa) (bpf/tests/tc_nodeport_lb4_nat_lb.c:292-345@82999990)."""
    _local_backend(snat)
    r = snat.run("cil_to_netdev", pktgen_tcp(LOCAL_BACKEND, CLIENT, BACKEND_PORT, CLIENT_PORT))
    assert r.retval == TC_ACT_OK  # :311
    p = r.pkt
    assert (p.src, p.dst) == (FRONTEND, CLIENT)  # :330-334
    assert frame_ip_header(r.frame) == ip_header(FRONTEND, CLIENT, ttl=64)  # :336
    assert (p.sport, p.dport) == (FRONTEND_PORT, CLIENT_PORT) and p.l4_csum_ok  # :339-343


def test_local_backend_redirect(snat):
    """tc_nodeport_local_backend_redirect: the same request from a second client
    (bpf/tests/tc_nodeport_lb4_nat_lb.c:387-441@82999990); its reply's multi-device redirect (:482) is declared."""
    _assert_local_backend(_local_backend(snat, CLIENT_2), CLIENT_2)


def test_udp_local_backend(snat):
    """tc_nodeport_udp_local_backend: a UDP request to a local backend (rev NAT 2, backend 125) is DNATed, not
    SNATed (bpf/tests/tc_nodeport_lb4_nat_lb.c:569-638@82999990)."""
    add_service(snat, [(125, LOCAL_BACKEND, BACKEND_PORT, ACTIVE)], rev_nat=2)
    r = snat.run("cil_from_netdev", pktgen_udp(CLIENT, FRONTEND, CLIENT_PORT, FRONTEND_PORT))
    assert r.retval == TC_ACT_OK, lab_difference(KERNEL_ROUTES)  # :603
    p = r.pkt
    assert (p.src, p.dst) == (CLIENT, LOCAL_BACKEND)  # :623-626
    assert frame_ip_header(r.frame) == ip_header(CLIENT, LOCAL_BACKEND, proto=IPPROTO_UDP, ttl=64)  # :629
    assert (p.sport, p.dport) == (CLIENT_PORT, BACKEND_PORT) and p.l4_csum_ok  # :632-635


def _nat_fwd(node, run):
    """SETUP tc_nodeport_nat_fwd: the remote backend 124 (tc_nodeport_lb4_nat_lb.c:671-686), then the request."""
    add_service(node, [(124, REMOTE_BACKEND, BACKEND_PORT, ACTIVE)])
    return run(pktgen_tcp(CLIENT, FRONTEND, CLIENT_PORT, FRONTEND_PORT))


def _assert_nat_fwd(r):
    p = r.pkt
    assert (p.src, p.dst) == (LB_IP, REMOTE_BACKEND)  # :727-731: SNATed to the LB, DNATed to the backend
    assert p.sport != CLIENT_PORT, "client port 111 is below the SNAT range: remapped"  # :736
    assert p.dport == BACKEND_PORT  # :739
    assert frame_ip_header(r.frame) == ip_header(LB_IP, REMOTE_BACKEND, ttl=63)  # :733 0xa711, TTL 63
    assert p.l4_csum_ok


def test_nat_fwd(snat):
    """tc_nodeport_nat_fwd: a request load-balanced to a remote backend is DNATed and SNATed to the LB's address,
    TTL 63, and redirected back out (bpf/tests/tc_nodeport_lb4_nat_lb.c:688-748@82999990)."""
    r = _nat_fwd(snat, lambda f: snat.run("cil_from_netdev", f))
    assert r.retval == TC_ACT_REDIRECT  # :708
    _assert_nat_fwd(r)


def test_nat_fwd_reply(snat):
    """tc_nodeport_nat_fwd_reply: the remote backend's reply to the LB's NAT port is rev-SNATed and rev-DNATed back
    to the client and redirected out (bpf/tests/tc_nodeport_lb4_nat_lb.c:853-857@82999990, check_reply :783-833)."""
    nat_port = _nat_fwd(snat, lambda f: snat.run("cil_from_netdev", f)).pkt.sport  # the CHECK's settings map, :745
    r = snat.run("cil_from_netdev", pktgen_tcp(REMOTE_BACKEND, LB_IP, BACKEND_PORT, nat_port))
    assert r.retval == TC_ACT_REDIRECT  # :801
    p = r.pkt
    assert (p.src, p.dst) == (FRONTEND, CLIENT)  # :820-824
    assert (p.sport, p.dport) == (FRONTEND_PORT, CLIENT_PORT)  # :826-830
    assert p.ip_csum_ok and p.l4_csum_ok


def test_nat_backend(snat):
    """tc_nodeport_nat_backend: at the backend's node an SNATed request from the LB is left alone and passed on to
    the pod (bpf/tests/tc_nodeport_lb4_nat_backend.c:112-166@82999990)."""
    add_service(snat, [(124, LOCAL_BACKEND, BACKEND_PORT, ACTIVE)])  # :97-99
    r = snat.run("cil_from_netdev", pktgen_tcp(REMOTE_LB_IP, LOCAL_BACKEND, LB_PORT, BACKEND_PORT))
    assert r.retval == TC_ACT_OK, lab_difference(KERNEL_ROUTES)  # Cilium (ENABLE_HOST_ROUTING): redirect
    p = r.pkt
    assert (p.src, p.dst) == (REMOTE_LB_IP, LOCAL_BACKEND)  # :150-154
    assert (p.sport, p.dport) == (LB_PORT, BACKEND_PORT)  # :159-163
    assert frame_ip_header(r.frame) == ip_header(REMOTE_LB_IP, LOCAL_BACKEND, ttl=64)  # :156 less host routing


# -- XDP --------------------------------------------------------------------------------------------
def _xdp_passed_up(r, frame_in: bytes) -> bytes:
    """An XDP_PASS frame with XFER_PKT_NO_SVC in the 4 metadata bytes before it (the test run hands back data_meta
    onwards): the frame without them."""
    assert r.retval == XDP_PASS  # CTX_ACT_OK in XDP
    assert len(r.frame) == len(frame_in) + 4, "4 bytes of metadata before the frame"
    meta = int.from_bytes(r.frame[:4], "little")
    assert meta & XFER_PKT_NO_SVC == XFER_PKT_NO_SVC
    return r.frame[4:]


def test_xdp_local_backend(xdp_snat):
    """xdp_nodeport_local_backend: XDP DNATs a request to a local backend, does not SNAT it, and passes it up to tc
    with XFER_PKT_NO_SVC; MACs and TTL (64: 0x4112) untouched (bpf/tests/xdp_nodeport_lb4_nat_lb.c:157-217@82999990)."""
    add_service(xdp_snat, [(124, LOCAL_BACKEND, BACKEND_PORT, ACTIVE)])
    frame = pktgen_tcp(CLIENT, FRONTEND, CLIENT_PORT, FRONTEND_PORT)
    out = _xdp_passed_up(xdp_snat.run_xdp(frame), frame)  # :192-194
    assert out[:12] == frame[:12], "MACs unchanged"  # :196-199
    assert frame_ip_header(out) == ip_header(CLIENT, LOCAL_BACKEND, ttl=64)  # :201-207
    assert out[34:38] == CLIENT_PORT.to_bytes(2, "big") + BACKEND_PORT.to_bytes(2, "big")  # :210-214


def test_xdp_nat_fwd(xdp_snat, fib):
    """xdp_nodeport_nat_fwd: XDP DNATs and SNATs a request to a remote backend, TTL 63 (0xa711), and sends it
    back out (bpf/tests/xdp_nodeport_lb4_nat_lb.c:267-327@82999990)."""
    r = _nat_fwd(xdp_snat, lambda f: fib.run_xdp(xdp_snat, f))
    assert_xdp_tx(r)  # :287 fib_ok, :301-304 MACs
    _assert_nat_fwd(r)  # :306-319


def test_xdp_nat_backend(xdp_snat):
    """xdp_nodeport_nat_backend: at the backend's node XDP leaves the SNATed request alone and passes it up with
    XFER_PKT_NO_SVC, TTL 64 (0xa612) (bpf/tests/xdp_nodeport_lb4_nat_backend.c:106-166@82999990)."""
    add_service(xdp_snat, [(124, LOCAL_BACKEND, BACKEND_PORT, ACTIVE)])  # :91-93
    frame = pktgen_tcp(REMOTE_LB_IP, LOCAL_BACKEND, LB_PORT, BACKEND_PORT)
    out = _xdp_passed_up(xdp_snat.run_xdp(frame), frame)  # :141-143
    assert out == frame, "unchanged"  # :145-163
    assert frame_ip_header(out) == ip_header(REMOTE_LB_IP, LOCAL_BACKEND, ttl=64)  # :157
