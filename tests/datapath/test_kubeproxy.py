"""kube-proxy's iptables mode on the real kernel: ClusterIP, NodePort and hairpin through the nodes' nat
tables, Linux conntrack beside the BPF CT rows, no LB map entry, and nothing of one mode left in the other."""
from __future__ import annotations

import re

import pytest

from labkit.config import DatapathConfig

from labtag import tagged

NODE_A, NODE_B, EXT = "198.51.100.11", "198.51.100.12", "198.51.100.100"


@pytest.fixture(scope="module")
def _ipt(_require_datapath):
    from labkit import Lab

    lab = Lab.up(tagged("dpipt"), config=DatapathConfig(service_mode="iptables", gc_timer=False))
    yield lab
    lab.down()


@pytest.fixture
def ipt(_ipt):
    _ipt.reset()
    return _ipt


def _client(lab, pod: str) -> str:
    """The client address:port the pod's server logged last."""
    return re.search(r"client=(\S+)", lab.pod(pod).server_log()[-1]).group(1)


def test_cluster_ip_through_iptables(ipt):
    """a1 → ClusterIP: the nat table's KUBE-SVC chain picks one of two endpoints (probability 0.5), Linux
    conntrack on node-a holds the DNAT, the BPF CT row is keyed by the VIP, no LB map entry exists, and the
    server sees a1's own address."""
    lab = ipt
    web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    conn = lab.pod("a1").tcp("web", 80)
    opened = conn.open()
    assert opened.ok and opened.result["peer"] == f"{web.vip}:80"
    cp = opened.result["sport"]
    table = lab.services.iptables("node-a")
    assert "--probability 0.50000000000" in table and table.count("-j DNAT --to-destination") == 2
    for node in ("node-a", "node-b"):
        assert lab.services.lb(node).rows() == []
    (track,) = [r for r in lab.conntrack("node-a") if (r.src, r.sport) == ("198.18.1.11", cp)]
    assert (track.dst, track.dport, track.dnat, track.snat) == (web.vip, 80, True, False)
    assert track.reply_src in ("198.18.2.11", "198.18.2.12") and track.state == "ESTABLISHED"
    rows = [r for r in lab.ct("node-a") if r.proto_name == "TCP" and not r.related]
    assert [(r.dir, r.dst, r.dport) for r in rows] == [("OUT", web.vip, 80)]  # BPF saw the packet before DNAT
    assert _client(lab, "b1" if track.reply_src == "198.18.2.11" else "b2") == f"198.18.1.11:{cp}"
    conn.close()


def test_nodeport_is_masqueraded(ipt):
    """ext → node-b:30080: KUBE-NODEPORTS → KUBE-EXT marks it, node-b DNATs and masquerades: the server sees
    node-b's address, and node-b's conntrack row is both DNAT and SNAT."""
    lab = ipt
    lab.services.add("web", 80, ["b1:8080"], type="NodePort", node_port=30080)
    opened = lab.external("ext").tcp("node-b", 30080).open()
    assert opened.ok
    assert _client(lab, "b1").startswith(f"{NODE_B}:")
    (track,) = [r for r in lab.conntrack("node-b") if r.src == EXT and r.dport == 30080]
    assert track.dnat and track.snat and track.reply_dst == NODE_B


def test_hairpin_is_masqueraded_to_the_node(ipt):
    """a1 → its own Service: the SEP chain's self-source rule marks it, so a1's server sees a node-a address
    (kube-proxy's MASQUERADE), not 169.254.42.1."""
    lab = ipt
    lab.services.add("self", 80, ["a1:8080"])
    opened = lab.pod("a1").tcp("self", 80).open()
    assert opened.ok
    seen = _client(lab, "a1").split(":")[0]
    assert seen in (NODE_A, "198.18.1.1") and seen != "169.254.42.1"


def test_no_rule_or_map_entry_of_the_other_mode(ipt, lab):
    """The iptables lab's LB maps stay empty with services in its nat table; the eBPF lab's nodes hold no
    KUBE chain with services in its maps; rebuilding the iptables lab in eBPF mode leaves no KUBE chain."""
    from labkit import Lab

    ipt.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    assert all(ipt.services.lb(n).rows() == [] for n in ("node-a", "node-b"))
    assert "KUBE-SVC-" in ipt.services.iptables("node-b")
    lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    assert lab.services.lb("node-a").rows()
    for node in ("node-a", "node-b"):
        assert "KUBE-" not in lab.exec(node, ["iptables-save", "-t", "nat"], check=True).stdout
    again = Lab.up(ipt.name, config=DatapathConfig(gc_timer=False))  # the same lab, now in eBPF mode
    try:
        for node in ("node-a", "node-b"):
            assert "KUBE-" not in again.exec(node, ["iptables-save", "-t", "nat"], check=True).stdout
        again.services.add("web", 80, ["b1:8080"])
        assert again.services.lb("node-a").rows()
    finally:
        Lab.up(ipt.name, config=ipt.config)  # back to iptables mode for the module's teardown
