"""Cilium's no-backend scenarios with the v1.16 default --service-no-backend-response=reject
(SERVICE_NO_BACKEND_RESPONSE): a request to a service whose backend slot is missing is answered, at the hook that
saw it, by an ICMP destination unreachable (port unreachable) sent back out of the device it came in on.

Cilium's files: bpf/tests/tc_nodeport_lb4_no_backend.c (bpf_host's from-netdev) and tc_lxc_lb4_no_backend.c
(bpf_lxc's from-container) (@82999990); the reply is bpf/lib/lb.h's ``__tail_no_service_ipv4`` (lb.h:1718-1823),
modelled by ``peer.icmp_port_unreachable`` (test_tier.py shows the model gives Cilium's 0x4b8e and 0x2de7 for
Cilium's packet). Addresses are the lab's: from outside, ext 198.51.100.100:111 to the frontend 203.0.113.10:80;
from a pod, a1 198.18.1.11:111 to the ClusterIP 198.19.0.10:80. The MACs are the request's swapped (lb.h:1794-1796),
which Cilium's CHECK states as client_mac and lb_mac.
"""
from __future__ import annotations

from labkit.datapath.testrun import TC_ACT_REDIRECT

from ..harness import A1, VIP
from .peer import CLIENT, CLIENT_PORT, FRONTEND, FRONTEND_PORT, add_service, icmp_port_unreachable, pktgen_tcp


def _assert_icmp_reply(r, frame: bytes, frontend: str, client: str):
    assert r.retval == TC_ACT_REDIRECT  # the CHECKs' CTX_ACT_REDIRECT
    out = r.frame
    assert out[0:6] == frame[6:12] and out[6:12] == frame[0:6], "MACs swapped"  # client_mac, lb_mac
    assert out[12:14] == b"\x08\x00"  # ETH_P_IP
    # ihl 5, version 4, tos 0, ttl 64, ICMP, the L3 checksum, type 3 code 3 and the ICMP checksum: the whole packet
    assert out[14:] == icmp_port_unreachable(frame, frontend, client)


def test_nodeport_no_backend(snat):
    """tc_nodeport_no_backend: a request from outside to a frontend without a backend is answered with ICMP port
    unreachable out of the device it came in on (bpf/tests/tc_nodeport_lb4_no_backend.c:96-153@82999990)."""
    add_service(snat, [], count=1)  # :85: the head counts 1 backend, no slot exists
    frame = pktgen_tcp(CLIENT, FRONTEND, CLIENT_PORT, FRONTEND_PORT)
    _assert_icmp_reply(snat.run("cil_from_netdev", frame), frame, FRONTEND, CLIENT)


def test_lxc_no_backend(native):
    """tc_lxc_no_backend: a pod's request to a service without a backend is answered with ICMP port unreachable
    back into the pod (bpf/tests/tc_lxc_lb4_no_backend.c:92-149@82999990)."""
    add_service(native, [], count=1, frontend=VIP)  # :81
    frame = pktgen_tcp(A1.ip, VIP, CLIENT_PORT, FRONTEND_PORT)
    _assert_icmp_reply(native.run("cil_from_container", frame), frame, VIP, A1.ip)
