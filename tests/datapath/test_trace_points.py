"""Which trace records reach the Hubble ring on a real lab: the observation points Cilium v1.16.0
(commit 82999990) sends for a same-node connection, for traffic through the tunnel, and the
policy verdicts of an endpoint that enforces one direction only. The packet-level rules are
pinned in tests/bpf/test_trace_points.py with their source lines; here real pods' kernels send the
packets and the lab's monitor fills the ring.

- Same node: bpf_lxc.c:1143@82999990 delivers through ipv4_local_delivery (bpf/lib/l3.h:156),
  the destination's policy program sends TRACE_TO_LXC (bpf_lxc.c:1976); from-container sends only
  TRACE_FROM_LXC (bpf_lxc.c:1451), dropped from TRACE_AGGREGATE_RX on (bpf/lib/trace.h:161-187).
- cil_to_overlay sends drop notifications only (bpf/bpf_overlay.c:742-801@82999990).
- Verdicts: send_policy_verdict_notify returns unless POLICY_VERDICT_LOG_FILTER has the direction
  (bpf/lib/policy_log.h:74@82999990); the agent sets 0x1 for ingress enforced, 0x2 for egress
  enforced (pkg/endpoint/bpf.go:1538-1547@82999990).
"""
from __future__ import annotations

import ctypes
import socket

import pytest

from labtag import tagged

from .util import TcpClient

TO_LXC, TO_STACK, TO_OVERLAY, FROM_LXC = 0, 3, 4, 5


def _records(lab, port: int) -> list:
    """Every trace record of the TCP connection with client port ``port`` (the inner packet for VXLAN ones)."""
    from labkit.observe.monitor import flushed_past

    flushed_past(lab.name, lab.pin_dirs)
    out = []
    for f in lab.events().read():
        for t in (f.event.before, f.event.inner):
            if t.proto == socket.IPPROTO_TCP and port in (socket.ntohs(t.sport), socket.ntohs(t.dport)):
                out.append(f)
                break
    return out


def _ring_flows(lab, port: int) -> list:
    """The Hubble ring's trace/drop entries (not policy verdicts) of that connection: their records."""
    from labkit.net.ledger import lab_dir
    from labkit.observe.ring import SLOT_FLOW, HubbleRing

    ring = HubbleRing.open(lab_dir(lab.name) / "hubble.ring")
    try:
        slots = ring.entries()
    finally:
        ring.close()
    out = []
    for s in slots:
        t = s.event.before
        if s.kind == SLOT_FLOW and t.proto == socket.IPPROTO_TCP and port in (socket.ntohs(t.sport),
                                                                              socket.ntohs(t.dport)):
            out.append(s.event)
    return out


def _connection(lab, client: str, server: str, sends: int = 3) -> int:
    conn = TcpClient(lab, client, lab.pod(server).ip)
    for _ in range(sends):
        assert conn.send() == "echo hello labkit"
    conn.close()
    return conn.port


def test_same_node_connection_reports_one_to_endpoint_per_packet(any_lab):
    """a1 -> a2 on node-a at level low: every packet has a from-container record (from-endpoint, unreported) and a
    to-container record (to-endpoint, reported); nothing is to-stack, and the ring holds only to-endpoint flows,
    one per packet."""
    lab = any_lab
    before = lab.monitor_aggregation()
    lab.monitor_aggregation("low")
    try:
        port = _connection(lab, "a1", "a2")
        records = _records(lab, port)
    finally:
        lab.monitor_aggregation(before)
    from labkit.observe.trace import Report

    outs = [f for f in records if f.hook.label == "from-container"]
    ins = [f for f in records if f.hook.label == "to-container"]
    assert outs and len(outs) == len(ins), [(f.hook.label, f.event.before.tcp_flags) for f in records]
    assert {f.event.obs_point for f in outs} == {FROM_LXC}
    assert not any(f.event.obs_point == TO_STACK for f in records)
    assert all(not f.event.report & Report.REPORTED for f in outs)
    assert all(f.event.obs_point == TO_LXC and f.event.report & Report.REPORTED for f in ins)
    ring = _ring_flows(lab, port)
    assert [e.obs_point for e in ring] == [TO_LXC] * len(ins)


def test_to_overlay_records_never_reach_the_ring(lab):
    """a1 -> b1 through the tunnel at level none: cil_to_overlay keeps a record per packet for the step, and none
    of them is reported; the pod's own to-overlay (from-container) still is."""
    from labkit.observe.trace import Report

    before = lab.monitor_aggregation()
    lab.monitor_aggregation("none")
    try:
        port = _connection(lab, "a1", "b1", sends=1)
        records = _records(lab, port)
    finally:
        lab.monitor_aggregation(before)
    overlay = [f for f in records if f.hook.label == "to-overlay"]
    assert overlay and not any(f.event.report & Report.REPORTED for f in overlay)
    pod = [f for f in records if f.hook.label == "from-container"]
    assert pod and all(f.event.obs_point == TO_OVERLAY and f.event.report & Report.REPORTED for f in pod)
    assert not any(e.hook == overlay[0].event.hook for e in _ring_flows(lab, port))


# -- policy verdicts only where enforced ------------------------------------------------------------------
INGRESS_ONLY_A2 = """
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a2-in}
spec:
  endpointSelector: {matchLabels: {app: a2}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a1}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
"""


@pytest.fixture(scope="module")
def vlab(_require_datapath):
    """A native-routing lab with policy compiled in (Cilium's default enforcement)."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("dpverdict"), config=DatapathConfig(routing="native", policy="default", gc_timer=False))
    yield lab
    lab.down()


def _filter(lab, pod: str) -> int | None:
    from labkit.maps.base import PinnedMap
    from labkit.maps.eps import EndpointInfo, EndpointKey

    p = lab.topology.pod(pod)
    with PinnedMap(f"{lab.pin_dir(p.node)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
        ep_id = lxc[EndpointKey.for_ip(p.ip)].lxc_id
    with PinnedMap(f"{lab.pin_dir(p.node)}/labkit_policy_filter", ctypes.c_uint32, ctypes.c_uint32) as m:
        have = m.get(ctypes.c_uint32(ep_id))
    return None if have is None else have.value


def test_ingress_only_policy_reports_no_egress_verdict(vlab):
    """An ingress-only policy on a2: the agent writes a2's filter 0x1; a2 -> b1 (egress, not enforced) carries no
    verdict, where before every new connection printed 'policy-verdict:all EGRESS ALLOWED'; a1 -> a2 gets its
    INGRESS ALLOWED verdict at a2."""
    vlab.reset()
    vlab.policy.apply(INGRESS_ONLY_A2)
    try:
        out = _connection(vlab, "a2", "b1", sends=1)
        verdicts = [f.policy for f in _records(vlab, out) if f.policy is not None]
        assert verdicts == [], [v.text() for v in verdicts]
        into = _connection(vlab, "a1", "a2", sends=1)
        texts = [f.policy.text() for f in _records(vlab, into) if f.policy is not None]
        assert texts == ["policy-verdict:L3-L4 INGRESS ALLOWED"]
        assert _filter(vlab, "a2") == 0x1 and _filter(vlab, "a1") is None
    finally:
        vlab.policy.flush()
    assert _filter(vlab, "a2") is None, "a2's filter goes with its policy map"
