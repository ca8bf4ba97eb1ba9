"""Which trace records a hook reports, and as which observation point (bpf/lib/trace.h
``trace_obs_point``, ``trace_reported``, ``trace_emit_at``), on node-a's compiled programs run
by BPF_PROG_TEST_RUN. Every record still reaches labkit_events (the step's path); what is pinned
here is what Cilium v1.16.0 would have sent to its monitor, i.e. what reaches the Hubble ring.

Facts, from Cilium's source at v1.16.0 (commit 82999990):

- a packet from a pod to a pod of the same node: bpf_lxc.c:1143@82999990 (handle_ipv4_from_lxc)
  returns ``ipv4_local_delivery`` (bpf/lib/l3.h:156@82999990), so from-container sends no
  TRACE_TO_STACK; the destination's policy program sends the one TRACE_TO_LXC
  (bpf_lxc.c:1976@82999990). cil_from_container's own notification is TRACE_FROM_LXC with
  TRACE_REASON_UNKNOWN as the packet enters (bpf_lxc.c:1451@82999990), which emit_trace_notify
  drops from TRACE_AGGREGATE_RX on (bpf/lib/trace.h:161-187@82999990);
- cil_to_overlay sends drop notifications only (bpf/bpf_overlay.c:742-801@82999990: its one
  notification is send_drop_notify_error_ext at :799);
- bpf_xdp.c sends drop notifications only (bpf/bpf_xdp.c:196, :208, :277, :287@82999990, every
  notification of the file);
- an allowed packet whose policy entry names a proxy port: TRACE_TO_PROXY
  (bpf_lxc.c:1073@82999990) and a policy verdict whose value is the proxy port
  (bpf/lib/policy_log.h:78-79@82999990), which Hubble decodes as REDIRECTED
  (pkg/hubble/parser/threefour/parser.go:293-295@82999990);
- policy verdicts only in a direction the endpoint enforces: send_policy_verdict_notify returns
  unless ``POLICY_VERDICT_LOG_FILTER & dir`` (bpf/lib/policy_log.h:40-48, :74@82999990), the
  filter being 0x1 with ingress enforced | 0x2 with egress enforced
  (pkg/endpoint/bpf.go:1538-1547@82999990).

Observation points by flow.proto's numbers (api/v1/flow/flow.proto:160-175@82999990; 0 is
TRACE_TO_LXC, which Hubble prints as TO_ENDPOINT).
"""
from __future__ import annotations

import ctypes
import socket

from labkit.constants import DropReason, Hook, Verdict
from labkit.datapath.testrun import TC_ACT_OK
from labkit.maps.config import LabConfig, TraceMode
from labkit.maps.lb import BackendState, ServiceFlags
from labkit.maps.policy import Direction, PolicyEntry, PolicyKey
from labkit.observe.trace import Flow, Report

from .harness import A1, A2, B1, EXT, LB_VIP, NODE_IP, VIP, VPORT
from .packets import ACK, SYN, eth, ipv4, tcp, tcp_segment, udp

TO_LXC, TO_PROXY, TO_STACK, TO_OVERLAY, FROM_LXC = 0, 1, 3, 4, 5
NONE, LOW, MEDIUM = 0, 2, 3  #: monitor aggregation levels (pkg/option/monitor.go)
XDP_PASS = 2
IN, EG = Direction.INGRESS, Direction.EGRESS
LB_FLAGS = ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE


class _U32(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint32)]


def level(node, value: int) -> None:
    """Set node-a's monitor aggregation level (labkit_config), tracing everything."""
    with node.map("labkit_config", _U32, LabConfig) as m:
        m[_U32(0)] = LabConfig(clock_offset=0, faults=0, trace_mode=TraceMode.ALL, monitor_aggregation=value)


def reported(ev) -> bool:
    return bool(ev.report & Report.REPORTED)


# -- item 1: same-node pod to pod ------------------------------------------------------------
def test_same_node_from_container_is_from_endpoint_not_to_stack(native):
    """a1 -> a2 (same node): from-container's record is the from-endpoint trace (reported only at level none),
    never to-stack; to-container's record is the one to-endpoint, reported at every level the CT asks."""
    for lvl in (NONE, LOW):
        level(native, lvl)
        out = native.run("cil_from_container", tcp(A1.ip, A2.ip, 40000 + lvl, 8080, SYN))
        assert out.retval == TC_ACT_OK and out.event.verdict == Verdict.FORWARDED
        assert out.event.obs_point == FROM_LXC, f"level {lvl}: obs point {out.event.obs_point}, Cilium sends no to-stack"
        assert reported(out.event) == (lvl == NONE), f"level {lvl}: from-* points are dropped from TRACE_AGGREGATE_RX on"
        into = native.run("cil_to_container", tcp(A1.ip, A2.ip, 40000 + lvl, 8080, SYN))
        assert into.retval == TC_ACT_OK and into.event.obs_point == TO_LXC and reported(into.event)


def test_same_node_reply_is_from_endpoint_too(native):
    """a2's SYN-ACK back to a1 (same node, CT_REPLY) is no to-stack either."""
    level(native, LOW)
    native.run("cil_from_container", tcp(A1.ip, A2.ip, 40100, 8080, SYN))
    native.run("cil_to_container", tcp(A1.ip, A2.ip, 40100, 8080, SYN))
    back = native.run("cil_from_container", tcp(A2.ip, A1.ip, 8080, 40100, SYN | ACK))
    assert back.retval == TC_ACT_OK and back.event.obs_point == FROM_LXC and not reported(back.event)


def test_other_node_still_to_stack(native):
    """a1 -> b1 (node-b, native routing) is handed to the stack: to-stack, reported (the CT asked)."""
    level(native, LOW)
    out = native.run("cil_from_container", tcp(A1.ip, B1.ip, 40200, 8080, SYN))
    assert out.event.obs_point == TO_STACK and reported(out.event)


def test_hairpin_request_is_from_endpoint(native):
    """a1 -> its own Service (backend a1): the request is delivered locally (ipv4_local_delivery with
    hairpin_flow, bpf_lxc.c:1106-1147@82999990), so no to-stack either."""
    level(native, LOW)
    native.service(VIP, VPORT, [(1, A1.ip, 8080, BackendState.ACTIVE)])
    out = native.run("cil_from_container", tcp(A1.ip, VIP, 40300, VPORT, SYN))
    assert out.retval == TC_ACT_OK and out.event.after.daddr == out.event.before.saddr
    assert out.event.obs_point == FROM_LXC and not reported(out.event)


# -- item 7: cil_to_overlay and XDP send no traces ---------------------------------------------
def test_to_overlay_forwards_are_never_reported(tunnel):
    """cil_to_overlay's forwarded records stay out of Hubble even at level none; its drops are reported."""
    level(tunnel, NONE)
    out = tunnel.run("cil_to_overlay", tcp(NODE_IP, B1.ip, 40400, 8080, SYN))
    assert out.retval == TC_ACT_OK and out.event.hook == Hook.TO_OVERLAY and out.event.verdict == Verdict.FORWARDED
    assert not reported(out.event)
    drop = tunnel.run("cil_to_overlay", tcp(NODE_IP, "192.0.2.1", 40401, 8080, SYN))
    assert drop.event.verdict == Verdict.DROPPED and reported(drop.event)


def test_from_container_to_overlay_still_reported(tunnel):
    """The pod's own to-overlay trace (from-container, TRACE_TO_OVERLAY in encap_and_redirect_lxc) is untouched."""
    level(tunnel, NONE)
    out = tunnel.run("cil_from_container", tcp(A1.ip, B1.ip, 40500, 8080, SYN))
    assert out.event.obs_point == TO_OVERLAY and reported(out.event)


def test_xdp_translation_is_never_reported(xdp):
    """A NodePort request XDP load-balances to a local backend (translated, XDP_PASS) keeps its record for the
    step, unreported at level none; an XDP drop (a fragment) is reported."""
    level(xdp, NONE)
    xdp.service(LB_VIP, VPORT, [(1, A1.ip, 8080, BackendState.ACTIVE)], flags=LB_FLAGS)
    out = xdp.run_xdp(tcp(EXT, LB_VIP, 40600, VPORT, SYN))
    assert out.retval == XDP_PASS and out.event.hook == Hook.XDP and out.event.verdict == Verdict.FORWARDED
    assert not reported(out.event)
    fragment = eth(ipv4(EXT, LB_VIP, socket.IPPROTO_TCP, tcp_segment(EXT, LB_VIP, 40601, VPORT, SYN), frag=0x2000))
    drop = xdp.run_xdp(fragment)
    assert drop.event.drop_reason == DropReason.FRAG_NOSUPPORT and reported(drop.event)


# -- item 2: verdicts only in enforced directions ----------------------------------------------
def _filter(node, pod, value: int) -> None:
    with node.map("labkit_policy_filter", _U32, _U32) as m:
        m[_U32(node.endpoint_id(pod))] = _U32(value)


def _allow_all(direction):
    k = PolicyKey.make(0, direction)
    return k, PolicyEntry.allow(k)


def test_verdict_only_in_a_filtered_direction(policy):
    """a1 enforces ingress only (filter 0x1): its egress SYN passes on the allow-all key with no verdict; its
    ingress SYN gets one. With the filter 0x3 the egress SYN reports 'all EGRESS ALLOWED' again."""
    k_in = PolicyKey.make(B1.identity, IN)
    policy.policy(A1, [_allow_all(EG), (k_in, PolicyEntry.allow(k_in))])
    _filter(policy, A1, 0x1)
    out = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40700, 8080, SYN))
    assert out.retval == TC_ACT_OK and Flow(out.event, "node-a", "lxc-a1").policy is None
    assert out.event.remote_id == 0
    into = policy.run("cil_to_container", tcp(B1.ip, A1.ip, 40701, 8080, SYN))
    assert Flow(into.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:L3-Only INGRESS ALLOWED"
    _filter(policy, A1, 0x3)
    out = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40702, 8080, SYN))
    assert Flow(out.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:all EGRESS ALLOWED"


def test_denied_in_unfiltered_direction_drops_without_verdict(policy):
    """The filter only silences the notification: a drop in a direction outside it still drops (and the drop
    notification stays), as send_policy_verdict_notify returns before anything else."""
    policy.policy(A1, [])
    _filter(policy, A1, 0x1)
    out = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40800, 8080, SYN))
    assert out.event.verdict == Verdict.DROPPED and Flow(out.event, "node-a", "lxc-a1").policy is None
    assert reported(out.event)


# -- item 3: the proxy redirect ----------------------------------------------------------------
def test_proxy_port_travels_with_the_verdict(policy):
    """A verdict of an entry with a proxy port carries that port (Hubble: REDIRECTED); without a proxy socket the
    packet is DROP_PROXY_LOOKUP_FAILED (a test run has none)."""
    k = PolicyKey.make(0, EG, 17, 53)
    policy.policy(A1, [(k, PolicyEntry.allow(k, proxy_port=10053))])
    out = policy.run("cil_from_container", udp(A1.ip, B1.ip, 40900, 53))
    ev = out.event
    assert Flow(ev, "node-a", "lxc-a1").policy.text() == "policy-verdict:L4-Only EGRESS ALLOWED"
    assert ev.proxy_port == 10053
    assert ev.drop_reason == DropReason.PROXY_LOOKUP_FAILED
    plain = PolicyKey.make(0, EG, 6, 8080)
    policy.policy(A1, [(plain, PolicyEntry.allow(plain))])
    out = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40901, 8080, SYN))
    assert Flow(out.event, "node-a", "lxc-a1").policy is not None and out.event.proxy_port == 0
