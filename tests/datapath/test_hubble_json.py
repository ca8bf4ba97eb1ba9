"""Hubble's JSON and compact lines of real connections, field by field as Cilium v1.16's Hubble fills them.

The facts (cilium/cilium at v1.16.0, 82999990):
- pkg/hubble/parser/threefour/parser.go Decode: which fields each event gets; decodeIsReply (410-430),
  decodeTrafficDirection (483-533), decodeTraceReason (439-460), decodeNetworkInterface (598-628), the OrigIP
  of a trace as source and the packet's as source_xlated (173-186), the service of each address (201-205);
- pkg/hubble/parser/common/endpoint.go ResolveEndpoint: a local endpoint's ID and labels (139-156), a remote
  one's identity, cluster, namespace, pod and labels (159-188);
- bpf/bpf_lxc.c: bpf_lxc's notifications come from the endpoint (EVENT_SOURCE LXC_ID, 16); to-endpoint carries
  THIS_INTERFACE_IFINDEX and the source before reverse NAT (1830, 1976-1977, 2008); bpf/lib/encap.h: to-overlay
  carries ENCAP_IFINDEX (52-53);
- hubble/pkg/printer/printer.go: ``<>`` when is_reply is absent (365-374); no lost events (797-811).
"""
from __future__ import annotations

import json
import sys
import time

import pytest

from labtag import tagged

from .util import TcpClient, wait_for

_CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
    print("connected")
except OSError as exc:
    print("failed", type(exc).__name__)
"""

ONLY_A2 = """
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b1-from-a2, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b1}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a2}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
"""


@pytest.fixture(scope="module")
def hlab(_require_datapath):
    """A tunnel lab with policy compiled in (a node's default mode), monitor aggregation none."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("dphubble"), config=DatapathConfig(routing="tunnel", policy="default", gc_timer=False,
                                                           monitor_aggregation="none"))
    yield lab
    lab.down()


@pytest.fixture
def hl(hlab):
    for p in hlab.policy.list():
        hlab.policy.delete(p["name"], p.get("namespace", "default"))
    for svc in hlab.services.list():
        hlab.services.remove(svc.name)
    return hlab


def _link(lab, name: str, dev: str) -> dict:
    """``ip -j link show dev`` in the namespace of ``name`` (netlink: /sys/class/net shows the host's)."""
    return json.loads(lab.exec(name, ["ip", "-j", "link", "show", "dev", dev], timeout=10, check=True).stdout)[0]


def _mac(lab, name: str, dev: str) -> str:
    return _link(lab, name, dev)["address"]


def _ifindex(lab, node: str, dev: str) -> int:
    return _link(lab, node, dev)["ifindex"]


def _endpoint_id(lab, pod: str) -> int:
    from labkit.maps.base import PinnedMap
    from labkit.maps.eps import EndpointInfo, EndpointKey

    p = lab.topology.pod(pod)
    with PinnedMap(f"{lab.pin_dir(p.node)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
        return lxc[EndpointKey.for_ip(p.ip)].lxc_id


def _flows(lab, port: int, want: int) -> list[dict]:
    from labkit.observe.hubble import FlowFilter, last_flows
    from labkit.observe.monitor import flushed_past

    flushed_past(lab.name, lab.pin_dirs)

    def enough():
        got = [r["flow"] for r in last_flows(lab, FlowFilter(ports=[port])) if "flow" in r]
        return got if len(got) >= want else None

    return wait_for(enough, timeout=5, what=f"{want} flows of port {port}")


def _one(flows: list[dict], **match) -> dict:
    found = [f for f in flows if all(_get(f, k) == v for k, v in match.items())]
    assert found, f"no flow with {match} among {[(f['node_name'], f.get('trace_observation_point'), f['Summary']) for f in flows]}"
    return found[0]


def _get(flow: dict, dotted: str):
    for part in dotted.split("__"):
        flow = flow.get(part, {}) if isinstance(flow, dict) else {}
    return flow if flow != {} else None


def test_a_denied_verdict_prints_undirected_and_has_no_is_reply(hl):
    """a1 -> b1 denied by b1's ingress policy: the policy-verdict event is DROPPED with no is_reply in its JSON
    (threefour/parser.go:420-429@82999990: only a verdict >= 0 is known not to be a reply) and its compact line
    has the undirected arrow ``<>`` (hubble/pkg/printer/printer.go:365-368@82999990); the allowed verdict of a2
    keeps is_reply false and ``->``."""
    from labkit.observe.hubble import compact, last_flows

    hl.policy.apply(ONLY_A2)
    b1 = hl.pod("b1")
    assert hl.exec("a1", [sys.executable, "-c", _CONNECT, b1.ip, "8080"], timeout=30).stdout.strip().startswith("failed")
    assert hl.exec("a2", [sys.executable, "-c", _CONNECT, b1.ip, "8080"], timeout=30).stdout.strip() == "connected"

    def verdicts():
        got = [r for r in last_flows(hl) if r.get("flow", {}).get("event_type", {}).get("type") == 5
               and r["flow"]["node_name"] == "node-b"]
        denied = [r for r in got if r["flow"]["verdict"] == "DROPPED"]
        allowed = [r for r in got if r["flow"]["verdict"] == "FORWARDED" and r["flow"]["source"].get("pod_name") == "a2"]
        return (denied[-1], allowed[-1]) if denied and allowed else None

    denied, allowed = wait_for(verdicts, timeout=5, what="the denied and the allowed verdict at node-b")
    assert "is_reply" not in denied["flow"] and "interface" not in denied["flow"]
    a1, b1p = hl.topology.pod("a1"), hl.topology.pod("b1")
    sport = denied["flow"]["l4"]["TCP"]["source_port"]
    assert compact(denied).endswith(f": default/a1:{sport} (ID:{a1.identity}) <> default/b1:8080 (ID:{b1p.identity}) "
                                    "policy-verdict:none INGRESS DENIED (TCP Flags: SYN)"), compact(denied)
    assert allowed["flow"]["is_reply"] is False and " -> default/b1:8080 " in compact(allowed)


def test_json_of_a_connection_across_nodes(hl):
    """a1 (node-a) -> b1 (node-b): each end's endpoint as its own node's Hubble resolves it (local: ID from
    cilium_lxc, the pod's own label k8s:app; remote: cluster_name, no ID), traffic direction and trace reason of
    each trace, the interface each notification names (to-overlay cilium_vxlan, to-endpoint the pod's lxc), and
    the Ethernet header of the frames on the pods' veths (pod MAC <-> host veth MAC)."""
    client = TcpClient(hl, "a1", hl.pod("b1").ip)
    client.close()
    flows = _flows(hl, client.port, 4)
    a1_mac, b1_mac = _mac(hl, "a1", "eth0"), _mac(hl, "b1", "eth0")
    lxc_a1, lxc_b1 = _mac(hl, "node-a", "lxc-a1"), _mac(hl, "node-b", "lxc-b1")

    syn_out = _one(flows, node_name="node-a", trace_observation_point="TO_OVERLAY", Summary="TCP Flags: SYN")
    assert syn_out["source"]["ID"] == _endpoint_id(hl, "a1") and "cluster_name" not in syn_out["source"]
    assert "k8s:app=a1" in syn_out["source"]["labels"] and "k8s:app=b1" in syn_out["destination"]["labels"]
    assert "ID" not in syn_out["destination"] and syn_out["destination"]["cluster_name"] == "default"
    assert (syn_out["traffic_direction"], syn_out["trace_reason"], syn_out["is_reply"]) == ("EGRESS", "NEW", False)
    assert syn_out["interface"] == {"index": _ifindex(hl, "node-a", "cilium_vxlan"), "name": "cilium_vxlan"}
    assert syn_out["ethernet"] == {"source": a1_mac, "destination": lxc_a1}

    syn_in = _one(flows, node_name="node-b", trace_observation_point="TO_ENDPOINT", Summary="TCP Flags: SYN")
    assert syn_in["destination"]["ID"] == _endpoint_id(hl, "b1") and syn_in["source"]["cluster_name"] == "default"
    assert (syn_in["traffic_direction"], syn_in["trace_reason"]) == ("INGRESS", "NEW")
    assert syn_in["interface"] == {"index": _ifindex(hl, "node-b", "lxc-b1"), "name": "lxc-b1"}
    assert syn_in["ethernet"] == {"source": lxc_b1, "destination": b1_mac}

    synack = _one(flows, node_name="node-a", trace_observation_point="TO_ENDPOINT", Summary="TCP Flags: SYN, ACK")
    assert (synack["is_reply"], synack["reply"], synack["trace_reason"], synack["traffic_direction"]) == \
        (True, True, "REPLY", "EGRESS")
    assert synack["ethernet"] == {"source": lxc_a1, "destination": a1_mac}
    for f in flows:  # the to-overlay and to-stack notifications of bpf_lxc never name the pod's veth
        if f.get("trace_observation_point") in ("TO_OVERLAY", "TO_STACK"):
            assert not f.get("interface", {}).get("name", "").startswith("lxc-"), f


def test_a_clusterip_reply_shows_the_backend_with_the_vip_as_source_xlated(hl):
    """a1 -> ClusterIP web:80 (backend b1:8080): at a1's to-endpoint the reply's source is the backend, as the
    notification's OrigIP gives it (bpf_lxc.c:1830, 1873-1885, 1976@82999990: orig_sip read before lb4_rev_nat),
    and the packet's VIP goes to IP.source_xlated (threefour/parser.go:173-186@82999990); its source port is the
    packet's, 80. No service is named: the service lookup takes the backend's address (parser.go:201-205)."""
    from labkit.observe.hubble import compact

    svc = hl.services.add("web", 80, ["b1:8080"])
    client = TcpClient(hl, "a1", svc.vip, 80)
    client.close()
    flows = _flows(hl, client.port, 4)
    synack = _one(flows, node_name="node-a", trace_observation_point="TO_ENDPOINT", Summary="TCP Flags: SYN, ACK")
    assert synack["IP"] == {"source": hl.pod("b1").ip, "source_xlated": svc.vip, "destination": hl.pod("a1").ip,
                            "ipVersion": "IPv4"}
    assert synack["l4"]["TCP"]["source_port"] == 80 and "source_service" not in synack
    b1, a1 = hl.topology.pod("b1"), hl.topology.pod("a1")
    line = compact({"flow": synack})
    assert f": default/a1:{client.port} (ID:{a1.identity}) <- default/b1:80 (ID:{b1.identity}) to-endpoint " in line, line


def test_v1_16_prints_no_lost_events_where_1_20_does(_require_datapath):
    """A flood beyond a node's event ring: the Hubble ring holds lost-event entries either way, but v1.16's
    ``hubble observe`` prints none (hubble/pkg/printer/printer.go:797-811@82999990) while the 1.20 profile prints
    them as ``EVENTS LOST:`` lines (cilium/cilium#35208)."""
    from labkit import Lab
    from labkit.config import DatapathConfig
    from labkit.net.ledger import lab_dir
    from labkit.observe.hubble import compact, last_flows
    from labkit.observe.monitor import flushed_past
    from labkit.observe.ring import SLOT_LOST, HubbleRing

    shown = {}
    for release in ("1.16", "1.20"):
        lab = Lab.up(tagged(f"obl{release.replace('.', '')}"), config=DatapathConfig(
            events_ring_pages=2, monitor_aggregation="none", gc_timer=False, cilium=release))
        try:
            flood = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                     f"for i in range(20000): s.sendto(b'x', ('{lab.pod('a2').ip}', 9))")
            assert lab.pod("a1").exec(sys.executable, "-c", flood, timeout=120).returncode == 0
            flushed_past(lab.name, lab.pin_dirs)
            time.sleep(0.5)  # the monitor's next drain reads the lost counters

            def ring_lost():
                ring = HubbleRing.open(lab_dir(lab.name) / "hubble.ring")
                try:
                    return [s for s in ring.entries() if s.kind == SLOT_LOST] or None
                finally:
                    ring.close()

            assert wait_for(ring_lost, timeout=5, what="lost-event entries in the Hubble ring")
            shown[release] = [line for line in map(compact, last_flows(lab)) if line.startswith("EVENTS LOST")]
        finally:
            lab.down()
    assert shown["1.16"] == []
    assert shown["1.20"] and all(line.startswith("EVENTS LOST: PERF_EVENT_RING_BUFFER CPU(0) ") for line in shown["1.20"])


def test_icmp_flows_carry_the_code(hl):
    """a1's UDP datagram to a closed port of b1: b1's kernel answers ICMP destination unreachable, code 3 (port);
    its flows carry type 3 and code 3 (threefour/parser.go:392-399@82999990 decodeICMPv4) and the summary names
    both as gopacket prints them (parser.go:271-273: ``ICMPv4 DestinationUnreachable(Port)``)."""
    from labkit.observe.hubble import FlowFilter, last_flows
    from labkit.observe.monitor import flushed_past

    send = ("import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
            f"s.sendto(b'x',('{hl.pod('b1').ip}',9));s.settimeout(1)\n"
            "try: s.recv(10)\nexcept OSError: pass")
    assert hl.exec("a1", [sys.executable, "-c", send], timeout=30).returncode == 0
    flushed_past(hl.name, hl.pin_dirs)
    icmp = wait_for(lambda: [r["flow"] for r in last_flows(hl, FlowFilter(protocols=["icmp"])) if "flow" in r
                             and r["flow"]["l4"]["ICMPv4"].get("type") == 3] or None, timeout=5,
                    what="the ICMP port unreachable's flows")
    assert {f["l4"]["ICMPv4"]["code"] for f in icmp} == {3}
    assert {f["Summary"] for f in icmp} == {"ICMPv4 DestinationUnreachable(Port)"}
