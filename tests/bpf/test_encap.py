"""Routing across nodes: tunnel mode hands pods' packets to cilium_vxlan with
the destination node as tunnel endpoint (lib/encap.h); native mode's
to-netdev lets them out (bpf_host.c).

What a test run can and cannot show here: ``bpf_skb_set_tunnel_key`` works
(the key goes into the skb's metadata dst, which the test run then drops),
``bpf_redirect``/``bpf_redirect_peer``/``bpf_redirect_neigh`` only return
TC_ACT_REDIRECT (the device is never reached, so the target ifindex is not
checked); ``bpf_skb_get_tunnel_key`` fails, as a crafted packet never came
out of a tunnel device, so from-overlay's tunnel endpoint and VNI stay 0.
"""
from __future__ import annotations

from labkit.constants import DropReason, Verdict
from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT

from .harness import A1, A2, B1, TOPO, ip_of
from .packets import SYN, tcp

NODE_B_IP = TOPO.node("node-b").ip


def test_remote_pod_goes_into_the_tunnel(tunnel):
    """tunnel mode: a pod's packet to a pod on node-b is redirected to cilium_vxlan with node-b as tunnel endpoint."""
    r = tunnel.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_REDIRECT
    assert r.event.verdict == Verdict.REDIRECTED
    assert ip_of(r.event.tunnel_endpoint) == NODE_B_IP


def test_local_pod_stays_on_the_node(tunnel):
    """tunnel mode: a packet to a pod on the same node is handed to the kernel (TC_ACT_OK), no tunnel."""
    r = tunnel.run("cil_from_container", tcp(A1.ip, A2.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK and r.event.tunnel_endpoint == 0


def test_to_overlay_keys_the_node_own_packets(tunnel):
    """to-overlay: a packet the node's stack routed into the tunnel gets its endpoint from the ipcache; an unknown one drops."""
    r = tunnel.run("cil_to_overlay", tcp(TOPO.node("node-a").ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK and ip_of(r.event.tunnel_endpoint) == NODE_B_IP
    r = tunnel.run("cil_to_overlay", tcp(TOPO.node("node-a").ip, "192.0.2.1", 40000, 8080, SYN))
    assert r.retval == TC_ACT_SHOT and r.event.drop_reason == DropReason.NO_TUNNEL_ENDPOINT


def test_from_overlay_marks_decapsulated_packets(tunnel):
    """from-overlay passes a decapsulated packet on, marked for to-container (MARK_FROM_OVERLAY)."""
    r = tunnel.run("cil_from_overlay", tcp(B1.ip, A1.ip, 50000, 8080, SYN))
    assert r.retval == TC_ACT_OK
    assert r.ctx.mark & 0x40000000


def test_to_netdev_lets_pod_traffic_leave(native):
    """native mode: a pod's packet to another node passes to-netdev (TC_ACT_OK, forwarded)."""
    r = native.run("cil_to_netdev", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK and r.event.verdict == Verdict.FORWARDED
