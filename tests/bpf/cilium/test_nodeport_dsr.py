"""Cilium's NodePort DSR scenarios at the load-balancing node and at the backend's node, on node-a's programs
built in dsr mode (``native``: --bpf-lb-mode=dsr, dispatch by IPv4 option) and with XDP acceleration (``xdp``).

Cilium's files: bpf/tests/tc_nodeport_lb4_dsr_lb.c, tc_nodeport_lb4_dsr_backend.c, xdp_nodeport_lb4_dsr_lb.c
(@82999990). Addresses are the lab's in place of Cilium's (peer.py's table): the client ext 198.51.100.100:111,
the frontend 203.0.113.10:80, the remote backend b2 198.18.2.12:8080 and the local backend a2 198.18.1.12:8080.

The XDP runs go through the FIB namespace (fibns.py), so that the FIB answers as on node-a and Cilium's verdict and
MAC checks translate. Not translated, and why: the tc CHECKs' MACs, which Cilium's mocked fib_lookup wrote; labkit's
tc programs forward with bpf_redirect_neigh (the kernel writes the MACs after the program). At the backend's node
Cilium (ENABLE_HOST_ROUTING) redirects the request into the pod with the option kept and the TTL decremented; labkit
hands it to the node's kernel (TC_ACT_OK, TTL left for the kernel's forwarding) with the option removed — both in
LAB_DIFFERENCES ("traffic reaching a node is routed to the pod by the node's kernel", "in dsr mode the backend's
node removes the DSR IPv4 option")."""
from __future__ import annotations

from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT
from labkit.maps.ct import CtFlags
from labkit.maps.lb import BackendState

from ..harness import ip_of
from .peer import (BACKEND_PORT, CLIENT, CLIENT_2, CLIENT_PORT, DSR_OPTION_REMOVED, FRONTEND, FRONTEND_PORT,
                   KERNEL_ROUTES, LOCAL_BACKEND, REMOTE_BACKEND, add_service, dsr_option, frame_ip_header, ip_header,
                   lab_difference, pktgen_tcp, ttl)
from .. import packets
from .fibns import assert_xdp_tx

ACTIVE = BackendState.ACTIVE
OPT = dsr_option(FRONTEND, FRONTEND_PORT)


def _dsr_fwd(node, run):
    add_service(node, [(124, REMOTE_BACKEND, BACKEND_PORT, ACTIVE)])
    return run(pktgen_tcp(CLIENT, FRONTEND, CLIENT_PORT, FRONTEND_PORT))


def _assert_dsr_fwd(r):
    p = r.pkt
    assert (p.src, p.dst) == (CLIENT, REMOTE_BACKEND)  # tc_nodeport_lb4_dsr_lb.c:173-177
    assert p.options == OPT  # type, len 8, port and address as __bpf_ntohs/__bpf_ntohl: :182-189
    assert (p.sport, p.dport) == (CLIENT_PORT, BACKEND_PORT)  # :191-195
    assert p.ip_csum_ok and p.l4_csum_ok


def test_dsr_fwd(native):
    """tc_nodeport_dsr_fwd: a request load-balanced to a remote DSR backend is DNATed, gets the DSR option and is
    redirected back out (bpf/tests/tc_nodeport_lb4_dsr_lb.c:130-198@82999990)."""
    r = _dsr_fwd(native, lambda f: native.run("cil_from_netdev", f))
    assert r.retval == TC_ACT_REDIRECT  # :150
    _assert_dsr_fwd(r)


def test_dsr_fwd_l3_header(native):
    """tc_nodeport_dsr_fwd's L3 checksum 0x434a is the header with the option and TTL 63: the lab's frame carries
    that header, rebuilt with the lab's addresses (bpf/tests/tc_nodeport_lb4_dsr_lb.c:179@82999990)."""
    r = _dsr_fwd(native, lambda f: native.run("cil_from_netdev", f))
    assert frame_ip_header(r.frame) == ip_header(CLIENT, REMOTE_BACKEND, ttl=63, options=OPT)


def test_xdp_dsr_fwd(xdp, fib):
    """xdp_nodeport_dsr_fwd: the same request in XDP is DNATed, gets the DSR option and is sent back out of the
    device it came in on, with the FIB's MACs (bpf/tests/xdp_nodeport_lb4_dsr_lb.c:126-194@82999990)."""
    r = _dsr_fwd(xdp, lambda f: fib.run_xdp(xdp, f))
    assert_xdp_tx(r)  # :146 fib_ok, :164-167 MACs
    _assert_dsr_fwd(r)  # :169-191


def test_xdp_dsr_fwd_l3_header(xdp, fib):
    """xdp_nodeport_dsr_fwd's L3 checksum 0x434a: TTL 63 with the option
    (bpf/tests/xdp_nodeport_lb4_dsr_lb.c:176@82999990)."""
    r = _dsr_fwd(xdp, lambda f: fib.run_xdp(xdp, f))
    assert frame_ip_header(r.frame) == ip_header(CLIENT, REMOTE_BACKEND, ttl=63, options=OPT)


# -- at the backend's node ------------------------------------------------------------------------
def _dsr_request(client: str) -> bytes:
    """What the LB node sends: DNATed to the local backend a2, the option after the header
    (bpf/tests/tc_nodeport_lb4_dsr_backend.c:114-164@82999990)."""
    return pktgen_tcp(client, LOCAL_BACKEND, CLIENT_PORT, BACKEND_PORT, options=OPT)


def _assert_backend_rows(node, client: str):
    """The CT entry for the flow, looked up with the request's tuple reversed (the OUT entry), has dsr_internal; the
    SNAT entry {backend:8080 -> client:111} translates to the frontend (tc_nodeport_lb4_dsr_backend.c:248-276)."""
    row = node.ct_row("OUT", client, CLIENT_PORT, LOCAL_BACKEND, BACKEND_PORT)
    assert row is not None, [x.line() for x in node.ct()]
    assert row.flags & CtFlags.DSR_INTERNAL
    nat = node.nat_entry(LOCAL_BACKEND, BACKEND_PORT, client, CLIENT_PORT)
    assert nat is not None, [x.line() for x in node.nat()]
    assert (ip_of(nat.to_addr), packets.socket.ntohs(nat.to_port)) == (FRONTEND, FRONTEND_PORT)


def _assert_backend_request(r, client: str):
    lab_difference(KERNEL_ROUTES), lab_difference(DSR_OPTION_REMOVED)
    p = r.pkt
    assert r.retval == TC_ACT_OK, lab_difference(KERNEL_ROUTES)  # Cilium (ENABLE_HOST_ROUTING): redirect
    assert (p.src, p.dst) == (client, LOCAL_BACKEND)  # :224-228
    assert (p.sport, p.dport) == (CLIENT_PORT, BACKEND_PORT)  # :242-246
    # :230 checks the header Cilium delivers (TTL 63, option kept); labkit leaves TTL 64 for the kernel's
    # forwarding and strips the option (LAB_DIFFERENCES), so its header is the request's without the option
    assert frame_ip_header(r.frame) == ip_header(client, LOCAL_BACKEND, ttl=64)
    assert ttl(r.frame) == 64 and p.ip_csum_ok and p.l4_csum_ok


def test_dsr_backend(native):
    """tc_nodeport_dsr_backend: the backend's node passes the DSR request on to the pod unchanged in addresses and
    ports, and creates the dsr_internal CT entry and the SNAT entry from the option
    (bpf/tests/tc_nodeport_lb4_dsr_backend.c:181-279@82999990)."""
    r = native.run("cil_from_netdev", _dsr_request(CLIENT))
    _assert_backend_request(r, CLIENT)
    _assert_backend_rows(native, CLIENT)


def test_dsr_backend_reply(native):
    """tc_nodeport_dsr_backend_reply: the backend's reply leaves to-netdev (CTX_ACT_OK) rev-DNATed to the frontend,
    TTL 64 (the checksum 0x4baa) (bpf/tests/tc_nodeport_lb4_dsr_backend.c:380-384@82999990, check_reply :307-360)."""
    native.run("cil_from_netdev", _dsr_request(CLIENT))
    r = native.run("cil_to_netdev", pktgen_tcp(LOCAL_BACKEND, CLIENT, BACKEND_PORT, CLIENT_PORT))
    assert r.retval == TC_ACT_OK  # :325
    p = r.pkt
    assert (p.src, p.dst) == (FRONTEND, CLIENT)  # :344-348
    assert frame_ip_header(r.frame) == ip_header(FRONTEND, CLIENT, ttl=64)  # :350
    assert (p.sport, p.dport) == (FRONTEND_PORT, CLIENT_PORT)  # :353-357
    assert p.l4_csum_ok


def test_dsr_backend_redirect(native):
    """tc_nodeport_dsr_backend_redirect: the same for a second client
    (bpf/tests/tc_nodeport_lb4_dsr_backend.c:450-548@82999990); its reply's redirect to another device (:589) is
    declared (DECLARED_CHECKS)."""
    r = native.run("cil_from_netdev", _dsr_request(CLIENT_2))
    _assert_backend_request(r, CLIENT_2)
    _assert_backend_rows(native, CLIENT_2)
