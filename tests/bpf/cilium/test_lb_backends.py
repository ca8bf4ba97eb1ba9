"""Cilium's backend-state scenarios: a flow that keeps its terminating backend (UDP, tc, ``snat``: bpf_host.c in
snat mode), and session affinity choosing the client's remembered backend (XDP, ``xdp_snat``).

Cilium's files: bpf/tests/tc_nodeport_lb_terminating_backend.c and session_affinity_test.c (@82999990).
Addresses are the lab's: the client ext 198.51.100.100, the frontend 203.0.113.10:80, the local backend a2
198.18.1.12:8080; session_affinity_test.c's 10.0.2.1 and 10.0.3.1 are b1 198.18.2.11 and b2 198.18.2.12 (both on
node-b), its client 10.0.0.1 is ext.
"""
from __future__ import annotations

import ctypes

from labkit.datapath import bpf as _bpf
from labkit.datapath.testrun import TC_ACT_OK
from labkit.maps.lb import (BackendState, Lb4AffinityKey, Lb4Backend, Lb4BackendKey, Lb4Key, Lb4Service,
                            LbAffinityVal, LookupScope, ServiceFlags)

from ..harness import B1, B2
from .peer import (BACKEND_PORT, CLIENT, CLIENT_PORT, FRONTEND, FRONTEND_PORT, IPPROTO_UDP, KERNEL_ROUTES,
                   LOCAL_BACKEND, add_service, frame_ip_header, ip_header, lab_difference, pktgen_tcp, pktgen_udp)
from .fibns import assert_xdp_tx

SVC_REV_NAT_ID = 2  #: tc_nodeport_lb_terminating_backend.c:34


def _assert_to_local_backend(r):
    assert r.retval == TC_ACT_OK, lab_difference(KERNEL_ROUTES)  # Cilium (ENABLE_HOST_ROUTING): redirect
    p = r.pkt
    assert (p.src, p.dst) == (CLIENT, LOCAL_BACKEND)  # :179-183, :283-287
    assert (p.sport, p.dport) == (CLIENT_PORT, BACKEND_PORT)  # :188-192, :292-296
    # :185, :289 0x4213 is TTL 63 after the host-routing redirect; labkit leaves TTL 64 to the kernel (LAB_DIFFERENCES)
    assert frame_ip_header(r.frame) == ip_header(CLIENT, LOCAL_BACKEND, proto=IPPROTO_UDP, ttl=64)
    assert p.l4_csum_ok


def test_terminating_backend_keeps_its_flow(snat):
    """tc_nodeport_lb_terminating_backend_0 then _1: a UDP flow is DNATed to the local backend; after the service
    loses its last active backend (count 0) and the backend turns terminating, the flow's next packet still goes
    to it (bpf/tests/tc_nodeport_lb_terminating_backend.c:141-195, 227-299@82999990)."""
    frame = pktgen_udp(CLIENT, FRONTEND, CLIENT_PORT, FRONTEND_PORT)
    add_service(snat, [(125, LOCAL_BACKEND, BACKEND_PORT, BackendState.ACTIVE)], rev_nat=SVC_REV_NAT_ID)  # :120-139
    _assert_to_local_backend(snat.run("cil_from_netdev", frame))
    # :232-237: lb_v4_upsert_service(count 0) and the backend BE_STATE_TERMINATING; slot 1 stays
    add_service(snat, [(125, LOCAL_BACKEND, BACKEND_PORT, BackendState.TERMINATING)], rev_nat=SVC_REV_NAT_ID, count=0)
    _assert_to_local_backend(snat.run("cil_from_netdev", frame))


REV_NAT_INDEX, BACKEND_ID1, BACKEND_ID2 = 123, 7, 42  # session_affinity_test.c:49-51
AFFINITY_MATCH_MAP = "cilium_lb_affinity_match"


def _affinity_setup(node) -> None:
    """session_affinity_test.c's SETUP (:114-175): heads in both scopes with SVC_FLAG_ROUTABLE|SVC_FLAG_AFFINITY,
    count 2 and affinity timeout 100 s, slots 1 and 2 (backends 7 and 42), the client's affinity entry for backend
    42 used now, and — where the build has the map — the lb_affinity_match entry that says 42 is still the
    service's."""
    flags = ServiceFlags.ROUTABLE | ServiceFlags.AFFINITY
    with node.map("cilium_lb4_services_v2", Lb4Key, Lb4Service) as svc:
        for scope in (LookupScope.INT, LookupScope.EXT):
            svc[Lb4Key.make(FRONTEND, FRONTEND_PORT, 0, scope=scope)] = Lb4Service.head(
                2, REV_NAT_INDEX, flags, affinity_timeout=100)
        head = Lb4Key.make(FRONTEND, FRONTEND_PORT, 0)
        for slot, bid in ((1, BACKEND_ID1), (2, BACKEND_ID2)):
            svc[head.with_slot(slot)] = Lb4Service.slot(bid, REV_NAT_INDEX)
    with node.map("cilium_lb4_backends_v3", Lb4BackendKey, Lb4Backend) as be:
        be[Lb4BackendKey(BACKEND_ID1)] = Lb4Backend.make(B1.ip, BACKEND_PORT, "TCP")
        be[Lb4BackendKey(BACKEND_ID2)] = Lb4Backend.make(B2.ip, BACKEND_PORT, "TCP")
    with node.map("cilium_lb4_affinity", Lb4AffinityKey, LbAffinityVal) as aff:
        # last_used = bpf_mono_now(): labkit's clock is the CT clock, seconds (bpf/lib/lb.h lb4_affinity_backend)
        aff[Lb4AffinityKey.make(CLIENT, REV_NAT_INDEX)] = LbAffinityVal(last_used=node.now(), backend_id=BACKEND_ID2)
    if AFFINITY_MATCH_MAP in node.build.loaded.maps:
        fd = node.build.map_fd(AFFINITY_MATCH_MAP)
        info = _bpf.map_info(fd)
        key = ctypes.create_string_buffer(BACKEND_ID2.to_bytes(4, "little") + REV_NAT_INDEX.to_bytes(2, "big"),
                                          info.key_size)
        _bpf.update(fd, key, ctypes.create_string_buffer(info.value_size))


def test_session_affinity(xdp_snat, fib):
    """session_affinity: a new flow from a client with a live affinity entry goes to that entry's backend (42, slot
    2) rather than to the slot selection would pick, and leaves XDP DNATed to it
    (bpf/tests/session_affinity_test.c:177-227@82999990). Cilium forces slot 1 with LB_SELECTION_FIRST; labkit
    selects at random, so 16 new flows (other client ports) must all go to backend 42."""
    _affinity_setup(xdp_snat)
    for i in range(16):
        r = fib.run_xdp(xdp_snat, pktgen_tcp(CLIENT, FRONTEND, 23445 + i, FRONTEND_PORT))
        assert_xdp_tx(r)  # :190 XDP_TX, :201-205 the FIB's MACs
        p = r.pkt
        assert p.dst == B2.ip  # :214
        assert p.dport == BACKEND_PORT  # :223
