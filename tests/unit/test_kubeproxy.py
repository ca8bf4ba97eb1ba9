"""kube-proxy's iptables mode without a kernel: chain names, the nat table's rules, the agent writing tables
instead of maps, and conntrack output parsed into rows."""
from __future__ import annotations

import doctest
import re

import pytest

from labkit import kubeproxy
from labkit.errors import DatapathError
from labkit.kubeproxy import ext_chain, nat_table, parse_conntrack, sep_chain, svc_chain
from labkit.services import Services
from labkit.topology import Topology

TOPO = Topology.default("demo")


@pytest.fixture
def ipt() -> Services:
    svcs = Services.in_memory(TOPO)
    svcs.mode = "iptables"
    return svcs


def test_chain_names_are_kube_proxys_shape():
    """KUBE-SVC/EXT/SEP names carry 16 base32 characters of a hash of port name, protocol (and endpoint)."""
    svcs = Services.in_memory(TOPO)
    web, dns = svcs.add("web", 80, ["b1:8080"]), svcs.add("dns", 53, ["b1:8080"], protocol="UDP")
    for name in (svc_chain(web), ext_chain(web), sep_chain(web, "198.18.2.11:8080")):
        assert re.fullmatch(r"KUBE-(SVC|EXT|SEP)-[A-Z2-7]{16}", name)
    assert svc_chain(web)[9:] == ext_chain(web)[9:] and svc_chain(web) != svc_chain(dns)
    assert sep_chain(web, "198.18.2.11:8080") != sep_chain(web, "198.18.2.12:8080")


def test_cluster_ip_rules_pick_each_endpoint_with_equal_chance(ipt):
    """Three endpoints: probabilities 1/3 then 1/2 then none; each SEP marks its own address for masquerade,
    then DNATs; the nodeports jump stays the last rule of KUBE-SERVICES."""
    web = ipt.add("web", 80, ["a1:8080", "b1:8080", "b2:8080"])
    text = nat_table(ipt.list(), TOPO)
    chain = svc_chain(web)
    picks = [l for l in text.splitlines() if l.startswith(f"-A {chain} -m comment")]
    assert [re.search(r"probability (\S+)", l).group(1) if "statistic" in l else None for l in picks] == \
        ["0.33333333333", "0.50000000000", None]
    sep = sep_chain(web, "198.18.1.11:8080")
    assert f"-A {sep} -s 198.18.1.11/32 -m comment --comment \"default/web\" -j KUBE-MARK-MASQ" in text
    assert f"-A {sep} -p tcp -m comment --comment \"default/web\" -m tcp -j DNAT --to-destination 198.18.1.11:8080" in text
    services = [l for l in text.splitlines() if l.startswith("-A KUBE-SERVICES")]
    assert services[0].startswith(f"-A KUBE-SERVICES -d {web.vip}/32 -p tcp") and "addrtype" in services[-1]
    assert text.startswith("*nat\n") and text.endswith("COMMIT\n")


def test_nodeport_and_loadbalancer_rules(ipt):
    """A LoadBalancer adds KUBE-NODEPORTS → KUBE-EXT (mark for masquerade, then the SVC chain) and a
    KUBE-SERVICES rule for its VIP; a service without active endpoints gets no rules."""
    web = ipt.add("web", 80, ["b1:8080"], type="LoadBalancer", node_port=30080)
    ipt.add("empty", 81, [])
    text = nat_table(ipt.list(), TOPO)
    ext = ext_chain(web)
    assert f"-A KUBE-NODEPORTS -p tcp -m comment --comment \"default/web\" -m tcp --dport 30080 -j {ext}" in text
    assert f"-A {ext} -j {svc_chain(web)}" in text
    assert f"-A KUBE-SERVICES -d {web.lb_vip}/32 -p tcp" in text
    assert "default/empty" not in text


def test_agent_writes_tables_not_maps(ipt):
    """In iptables mode every change rewrites each node's whole nat table and touches no LB map."""
    ipt.add("web", 80, ["b1:8080"])
    ipt.add_backend("web", "b2:8080")
    assert ipt.maps.ops == []
    assert set(ipt.tables.text) == {"node-a", "node-b"}
    assert ipt.iptables("node-a").count("DNAT --to-destination") == 2


def test_a_refused_table_rolls_back(ipt):
    """If node-b refuses the new table, node-a gets the old one back and the service list is unchanged."""
    ipt.add("web", 80, ["b1:8080"])
    installed = dict(ipt.tables.text)
    before = dict(installed)

    def refuse_on_node_b(node, text):
        if node == "node-b":
            raise OSError(5, "refused")
        installed[node] = text

    ipt.tables = refuse_on_node_b
    with pytest.raises(DatapathError, match="nat tables are as they were"):
        ipt.add("api", 81, ["a1:8080"])
    assert [s.name for s in ipt.list()] == ["web"]
    assert installed == before


def test_parse_conntrack_udp_and_flags():
    """UDP lines have no state; [UNREPLIED] and [ASSURED] become flags; other protocols are skipped."""
    rows = parse_conntrack(
        "udp      17 29 src=198.18.1.11 dst=198.19.0.10 sport=5000 dport=53 [UNREPLIED] src=198.18.2.11 "
        "dst=198.18.1.11 sport=8080 dport=5000 mark=0 use=1\n"
        "icmp     1 29 src=198.18.1.11 dst=198.18.2.11 type=8 code=0 id=7 src=198.18.2.11 dst=198.18.1.11 "
        "type=0 code=0 id=7 mark=0 use=1\n")
    assert len(rows) == 1 and rows[0].state == "" and rows[0].flags == ("UNREPLIED",) and rows[0].dnat


def test_doctests():
    """The examples in labkit.kubeproxy run and give what they show."""
    result = doctest.testmod(kubeproxy, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
