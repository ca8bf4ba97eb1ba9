"""kube-proxy's iptables mode without a kernel: chain names, the restore input of full and partial syncs
(compared chain by chain with expectations rewritten from kube-proxy's own proxier_test.go), the agent
syncing tables instead of maps, refusals, and conntrack output parsed into rows.

Source of every expectation: kubernetes/kubernetes pkg/proxy/iptables/proxier_test.go of the v1.33 line
(the NewFakeProxier with nfacct counters and async.BoundedFrequencyRunner), whose syncProxyRules is the same
as v1.34's. Rewriting them for labkit changes only names and addresses (namespace/name:port -> default/<name>,
pod IPs 10.x -> the lab's pods, 172.30.0.x -> 198.19.0.x, LoadBalancer IPs -> 203.0.113.x, NodePorts 300x
-> 3000x, the local-traffic CIDR 10.0.0.0/8 -> 198.18.0.0/15) and two things of the fake itself:
NewFakeProxier sets masqueradeMark "0x4000" where NewProxier writes fmt.Sprintf("%#08x", 1<<14) =
"0x00004000", and NewFake() has no --random-fully (TestMasqueradeRule covers both). What labkit's Service
model cannot hold (externalIPs, loadBalancerSourceRanges, healthCheckNodePort, named ports) is left out of
the rewritten expectation, and each place says so.
"""
from __future__ import annotations

import dataclasses
import importlib
import re
import textwrap

import pytest

from labkit.agent import kubeproxy
from labkit.errors import ConfigError, DatapathError
from labkit.agent.kubeproxy import (CANARY, MemoryIptables, NodeOptions, changed_services, diff_tables, ext_chain,
                              nat_table, parse_conntrack, parse_tables, partial_table, probability, render,
                              sep_chain, svc_chain, svl_chain, sync)
from labkit.agent.kubeproxy.text import chains_in
from labkit.agent.kubeproxy.names import _hash
from labkit.agent.services import Backend, Service, Services
from labkit.net.topology import Topology

TOPO = Topology.default("demo")
#: NewFakeProxier's configuration, in labkit's addresses: iptablestest.NewFake() has no --random-fully, and
#: conntrackTCPLiberal is false (a labkit node sets nf_conntrack_tcp_be_liberal, NodeOptions' default)
FAKE = NodeOptions(random_fully=False, tcp_be_liberal=False)
POD = {"a1": "198.18.1.11", "a2": "198.18.1.12", "b1": "198.18.2.11", "b2": "198.18.2.12"}


# -- comparing tables chain by chain -------------------------------------------------
def assert_tables(got: str, want: str) -> None:
    """Same tables, same chains, and in every chain the same rules in the same order; a failure names the
    table and chain that differ."""
    problems = diff_tables(got, textwrap.dedent(want))
    assert not problems, "\n".join(problems)


def check_jumps(text: str) -> None:
    """checkIPTablesRuleJumps: every chain a rule jumps to or fills is declared, and every jump goes to
    a chain with rules (KUBE-NODEPORTS excepted)."""
    targets = {"ACCEPT", "REJECT", "DROP", "MARK", "RETURN", "DNAT", "SNAT", "MASQUERADE"}
    for name, chains in parse_tables(text).items():
        declared = set(chains) - {"-X"}
        jumped = {j for rules in chains.values() for r in rules for j in re.findall(r"-j (\S+)", r)} - targets
        assert jumped <= declared, f"{name}: jumps to undeclared chains {sorted(jumped - declared)}"
        empty = {c for c in jumped if not chains[c]} - {"KUBE-NODEPORTS"}
        assert not empty, f"{name}: jumps to chains without rules {sorted(empty)}"


def svc(name: str, vip: str, port: int, *backends: str, terminating: tuple = (), **kw) -> Service:
    """A labkit Service with backends ``pod:port`` (those named in ``terminating`` terminating)."""
    bes = tuple(Backend.parse(b, name, "terminating" if b in terminating else "active") for b in backends)
    return Service(name, vip, port, kw.pop("protocol", "TCP"), bes, **kw)


def chains(**services: Service) -> dict[str, str]:
    """Placeholders for expectations: ``{svc1}``, ``{ext1}``, ``{svl1}``, and ``{sep1_b1}`` per backend."""
    out = {}
    for key, s in services.items():
        n = key.removeprefix("svc")
        out.update({f"svc{n}": svc_chain(s), f"ext{n}": ext_chain(s), f"svl{n}": svl_chain(s)})
        for b in s.backends:
            out[f"sep{n}_{b.pod}"] = sep_chain(s, f"{POD[b.pod]}:{b.port}")
    return out


# -- names and numbers ---------------------------------------------------------------
def test_chain_names_hash_as_kube_proxy_hashes():
    """portProtoHash and servicePortEndpointChainName give the chain names kube-proxy's tests expect."""
    # TestOverallIPTablesRules: ns1/svc1:p80 -> KUBE-SVC-XPGD46QRK7WJZT7O, its endpoint 10.180.0.1:80 ->
    # KUBE-SEP-SXIVWICOYRO3J4NJ; ns2/svc2:p80 -> GNZBNJ2PO5MGZ6GT; ns5/svc5:p80 at 10.180.0.3:80 -> I77PXRDZVX7PMWMN;
    # TestSyncProxyRulesRepeated: ns2/svc2:p8080 -> 2VJB64SDSIJUP5T6
    assert _hash("ns1/svc1:p80" + "tcp") == "XPGD46QRK7WJZT7O"
    assert _hash("ns1/svc1:p80" + "tcp" + "10.180.0.1:80") == "SXIVWICOYRO3J4NJ"
    assert _hash("ns2/svc2:p80tcp") == "GNZBNJ2PO5MGZ6GT" and _hash("ns2/svc2:p8080tcp") == "2VJB64SDSIJUP5T6"
    assert _hash("ns5/svc5:p80tcp10.180.0.3:80") == "I77PXRDZVX7PMWMN"
    web, dns = svc("web", "198.19.0.10", 80, "b1:8080"), svc("dns", "198.19.0.11", 53, "b1:8080", protocol="UDP")
    assert svc_chain(web) == "KUBE-SVC-" + _hash("default/webtcp")
    assert sep_chain(web, "198.18.2.11:8080") == "KUBE-SEP-" + _hash("default/webtcp198.18.2.11:8080")
    assert {svc_chain(web)[9:], ext_chain(web)[9:], svl_chain(web)[9:]} == {_hash("default/webtcp")}
    assert svc_chain(dns) == "KUBE-SVC-" + _hash("default/dnsudp")


def test_probabilities_have_ten_decimals():
    """computeProbability(n) is 1/n with %0.10f (TestComputeProbability's table)."""
    expected = {1: "1.0000000000", 2: "0.5000000000", 10: "0.1000000000", 100: "0.0100000000",
                1000: "0.0010000000", 10000: "0.0001000000", 100000: "0.0000100000", 100001: "0.0000099999"}
    assert {n: probability(n) for n in expected} == expected


# -- what one full sync writes ---------------------------------------------------------
def overall_services() -> dict[str, Service]:
    """TestOverallIPTablesRules' six services in labkit's terms (seen from node-a). Left out: svc2's and svc4's
    externalIPs, svc2's and svc5's healthCheckNodePort, svc5's loadBalancerSourceRanges (so no KUBE-FW chain and
    its LoadBalancer rule jumps to KUBE-EXT, as proxier.go does without source ranges); svc4 (a NodePort without a
    node port, reachable only by its externalIP) becomes a ClusterIP with the same two endpoints."""
    return {
        "svc1": svc("svc1", "198.19.0.41", 80, "b1:80"),
        # eTP Local, its one endpoint has no NodeName: not local; here it is on node-b
        "svc2": svc("svc2", "198.19.0.42", 80, "b2:80", type="LoadBalancer", node_port=30001,
                    lb_vip="203.0.113.4", etp="Local"),
        "svc3": svc("svc3", "198.19.0.43", 80, "a2:80", type="NodePort", node_port=30003),
        "svc4": svc("svc4", "198.19.0.44", 80, "a1:80", "b1:80"),
        "svc5": svc("svc5", "198.19.0.45", 80, "a2:80", type="LoadBalancer", node_port=30002,
                    lb_vip="203.0.113.8", affinity_timeout=10800),
        "svc6": svc("svc6", "198.19.0.46", 80),
    }


def test_overall_iptables_rules():
    """A full sync of ClusterIP, NodePort, LoadBalancer (eTP Cluster with affinity, eTP Local without a local
    endpoint) and an endpoint-less Service writes exactly TestOverallIPTablesRules' rules."""
    services = overall_services()
    restore = render(services.values(), TOPO, "node-a", FAKE)
    # TestOverallIPTablesRules (pkg/proxy/iptables/proxier_test.go), the `expected` restore input
    assert_tables(restore.text, """\
        *filter
        :KUBE-NODEPORTS - [0:0]
        :KUBE-SERVICES - [0:0]
        :KUBE-EXTERNAL-SERVICES - [0:0]
        :KUBE-FIREWALL - [0:0]
        :KUBE-FORWARD - [0:0]
        :KUBE-PROXY-FIREWALL - [0:0]
        -A KUBE-SERVICES -m comment --comment "default/svc6 has no endpoints" -m tcp -p tcp -d 198.19.0.46 --dport 80 -j REJECT
        -A KUBE-EXTERNAL-SERVICES -m comment --comment "default/svc2 has no local endpoints" -m tcp -p tcp -d 203.0.113.4 --dport 80 -j DROP
        -A KUBE-EXTERNAL-SERVICES -m comment --comment "default/svc2 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30001 -j DROP
        -A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
        -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
        -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
        -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
        COMMIT
        *nat
        :KUBE-NODEPORTS - [0:0]
        :KUBE-SERVICES - [0:0]
        :{ext2} - [0:0]
        :{ext3} - [0:0]
        :{ext5} - [0:0]
        :KUBE-MARK-MASQ - [0:0]
        :KUBE-POSTROUTING - [0:0]
        :{sep1_b1} - [0:0]
        :{sep2_b2} - [0:0]
        :{sep3_a2} - [0:0]
        :{sep4_a1} - [0:0]
        :{sep4_b1} - [0:0]
        :{sep5_a2} - [0:0]
        :{svc1} - [0:0]
        :{svc2} - [0:0]
        :{svc3} - [0:0]
        :{svc4} - [0:0]
        :{svc5} - [0:0]
        -A KUBE-NODEPORTS -m comment --comment default/svc2 -m tcp -p tcp -d 127.0.0.0/8 --dport 30001 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j {ext2}
        -A KUBE-NODEPORTS -m comment --comment default/svc2 -m tcp -p tcp --dport 30001 -j {ext2}
        -A KUBE-NODEPORTS -m comment --comment default/svc3 -m tcp -p tcp -d 127.0.0.0/8 --dport 30003 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j {ext3}
        -A KUBE-NODEPORTS -m comment --comment default/svc3 -m tcp -p tcp --dport 30003 -j {ext3}
        -A KUBE-NODEPORTS -m comment --comment default/svc5 -m tcp -p tcp -d 127.0.0.0/8 --dport 30002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j {ext5}
        -A KUBE-NODEPORTS -m comment --comment default/svc5 -m tcp -p tcp --dport 30002 -j {ext5}
        -A KUBE-SERVICES -m comment --comment "default/svc1 cluster IP" -m tcp -p tcp -d 198.19.0.41 --dport 80 -j {svc1}
        -A KUBE-SERVICES -m comment --comment "default/svc2 cluster IP" -m tcp -p tcp -d 198.19.0.42 --dport 80 -j {svc2}
        -A KUBE-SERVICES -m comment --comment "default/svc2 loadbalancer IP" -m tcp -p tcp -d 203.0.113.4 --dport 80 -j {ext2}
        -A KUBE-SERVICES -m comment --comment "default/svc3 cluster IP" -m tcp -p tcp -d 198.19.0.43 --dport 80 -j {svc3}
        -A KUBE-SERVICES -m comment --comment "default/svc4 cluster IP" -m tcp -p tcp -d 198.19.0.44 --dport 80 -j {svc4}
        -A KUBE-SERVICES -m comment --comment "default/svc5 cluster IP" -m tcp -p tcp -d 198.19.0.45 --dport 80 -j {svc5}
        -A KUBE-SERVICES -m comment --comment "default/svc5 loadbalancer IP" -m tcp -p tcp -d 203.0.113.8 --dport 80 -j {ext5}
        -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
        -A {ext2} -m comment --comment "pod traffic for default/svc2 external destinations" -s 198.18.0.0/15 -j {svc2}
        -A {ext2} -m comment --comment "masquerade LOCAL traffic for default/svc2 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
        -A {ext2} -m comment --comment "route LOCAL traffic for default/svc2 external destinations" -m addrtype --src-type LOCAL -j {svc2}
        -A {ext3} -m comment --comment "masquerade traffic for default/svc3 external destinations" -j KUBE-MARK-MASQ
        -A {ext3} -j {svc3}
        -A {ext5} -m comment --comment "masquerade traffic for default/svc5 external destinations" -j KUBE-MARK-MASQ
        -A {ext5} -j {svc5}
        -A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
        -A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
        -A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
        -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
        -A {sep4_b1} -m comment --comment default/svc4 -s 198.18.2.11 -j KUBE-MARK-MASQ
        -A {sep4_b1} -m comment --comment default/svc4 -m tcp -p tcp -j DNAT --to-destination 198.18.2.11:80
        -A {sep5_a2} -m comment --comment default/svc5 -s 198.18.1.12 -j KUBE-MARK-MASQ
        -A {sep5_a2} -m comment --comment default/svc5 -m recent --name {sep5_a2} --set -m tcp -p tcp -j DNAT --to-destination 198.18.1.12:80
        -A {sep3_a2} -m comment --comment default/svc3 -s 198.18.1.12 -j KUBE-MARK-MASQ
        -A {sep3_a2} -m comment --comment default/svc3 -m tcp -p tcp -j DNAT --to-destination 198.18.1.12:80
        -A {sep2_b2} -m comment --comment default/svc2 -s 198.18.2.12 -j KUBE-MARK-MASQ
        -A {sep2_b2} -m comment --comment default/svc2 -m tcp -p tcp -j DNAT --to-destination 198.18.2.12:80
        -A {sep1_b1} -m comment --comment default/svc1 -s 198.18.2.11 -j KUBE-MARK-MASQ
        -A {sep1_b1} -m comment --comment default/svc1 -m tcp -p tcp -j DNAT --to-destination 198.18.2.11:80
        -A {sep4_a1} -m comment --comment default/svc4 -s 198.18.1.11 -j KUBE-MARK-MASQ
        -A {sep4_a1} -m comment --comment default/svc4 -m tcp -p tcp -j DNAT --to-destination 198.18.1.11:80
        -A {svc4} -m comment --comment "default/svc4 cluster IP" -m tcp -p tcp -d 198.19.0.44 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc4} -m comment --comment "default/svc4 -> 198.18.1.11:80" -m statistic --mode random --probability 0.5000000000 -j {sep4_a1}
        -A {svc4} -m comment --comment "default/svc4 -> 198.18.2.11:80" -j {sep4_b1}
        -A {svc2} -m comment --comment "default/svc2 cluster IP" -m tcp -p tcp -d 198.19.0.42 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc2} -m comment --comment "default/svc2 -> 198.18.2.12:80" -j {sep2_b2}
        -A {svc5} -m comment --comment "default/svc5 cluster IP" -m tcp -p tcp -d 198.19.0.45 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc5} -m comment --comment "default/svc5 -> 198.18.1.12:80" -m recent --name {sep5_a2} --rcheck --seconds 10800 --reap -j {sep5_a2}
        -A {svc5} -m comment --comment "default/svc5 -> 198.18.1.12:80" -j {sep5_a2}
        -A {svc3} -m comment --comment "default/svc3 cluster IP" -m tcp -p tcp -d 198.19.0.43 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc3} -m comment --comment "default/svc3 -> 198.18.1.12:80" -j {sep3_a2}
        -A {svc1} -m comment --comment "default/svc1 cluster IP" -m tcp -p tcp -d 198.19.0.41 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc1} -m comment --comment "default/svc1 -> 198.18.2.11:80" -j {sep1_b1}
        COMMIT
        """.format(**chains(**services)))
    check_jumps(restore.text)


def test_external_traffic_policy_local_with_a_local_endpoint():
    """eTP Local with endpoints here and elsewhere: KUBE-EXT short-circuits pods and the node to KUBE-SVC (all
    endpoints) and sends the rest to KUBE-SVL (this node's only); no DROP rule in filter."""
    # TestExternalTrafficPolicyLocal (endpoints 10.180.0.1 remote, 10.180.2.1 local; external clients reach only
    # the local one, unmasqueraded; pods and the node reach both): the KUBE-EXT rules of TestOverallIPTablesRules'
    # svc2 plus proxier.go's `-A KUBE-EXT-... -j KUBE-SVL-...` for hasExternalEndpoints
    lb = svc("lb", "198.19.0.41", 80, "a1:80", "b1:80", type="LoadBalancer", node_port=30001,
             lb_vip="203.0.113.4", etp="Local")
    text = render([lb], TOPO, "node-a", FAKE).text
    c = chains(svc1=lb)
    got = parse_tables(text)
    assert got["nat"][c["ext1"]] == [
        f'-m comment --comment "pod traffic for default/lb external destinations" -s 198.18.0.0/15 -j {c["svc1"]}',
        '-m comment --comment "masquerade LOCAL traffic for default/lb external destinations" -m addrtype '
        "--src-type LOCAL -j KUBE-MARK-MASQ",
        f'-m comment --comment "route LOCAL traffic for default/lb external destinations" -m addrtype --src-type '
        f'LOCAL -j {c["svc1"]}',
        f'-j {c["svl1"]}']
    assert got["nat"][c["svl1"]] == [f'-m comment --comment "default/lb -> 198.18.1.11:80" -j {c["sep1_a1"]}']
    assert got["nat"][c["svc1"]][1:] == [
        f'-m comment --comment "default/lb -> 198.18.1.11:80" -m statistic --mode random --probability 0.5000000000 '
        f'-j {c["sep1_a1"]}',
        f'-m comment --comment "default/lb -> 198.18.2.11:80" -j {c["sep1_b1"]}']
    assert got["filter"]["KUBE-EXTERNAL-SERVICES"] == []
    check_jumps(text)


def test_no_endpoints_reject_every_frontend():
    """A LoadBalancer without endpoints: REJECT in filter for its ClusterIP, LoadBalancer IP and NodePort, and
    nothing of it in nat."""
    # TestNoEndpointsReject (pod and external clients get REJECT at every frontend); rule shapes of
    # TestOverallIPTablesRules' svc6, the KUBE-EXTERNAL-SERVICES shapes of its svc2 with "has no endpoints"
    lb = svc("lb", "198.19.0.41", 80, type="LoadBalancer", node_port=30001, lb_vip="203.0.113.4")
    got = parse_tables(render([lb], TOPO, "node-a", FAKE).text)
    assert got["filter"]["KUBE-SERVICES"] == [
        '-m comment --comment "default/lb has no endpoints" -m tcp -p tcp -d 198.19.0.41 --dport 80 -j REJECT']
    assert got["filter"]["KUBE-EXTERNAL-SERVICES"] == [
        '-m comment --comment "default/lb has no endpoints" -m tcp -p tcp -d 203.0.113.4 --dport 80 -j REJECT',
        '-m comment --comment "default/lb has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30001 '
        "-j REJECT"]
    assert sorted(got["nat"]) == ["KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-SERVICES"]
    assert got["nat"]["KUBE-NODEPORTS"] == []


# TestTerminatingEndpointsTrafficPolicyCluster / ...Local (proxier_test.go): which endpoints a packet may reach.
# In labkit a terminating backend is serving (ready=false, serving=true, terminating=true).
@pytest.mark.parametrize("backends,terminating,cluster,local", [
    # "ready endpoints exist": the serving terminating ones are left out, for Cluster and for Local
    (("a1:80", "a2:80", "b1:80", "b2:80"), ("a2:80", "b2:80"), ["a1", "b1"], ["a1"]),
    # "only terminating endpoints exist": they are used, for both policies
    (("a1:80", "a2:80", "b1:80"), ("a1:80", "a2:80", "b1:80"), ["a1", "a2", "b1"], ["a1", "a2"]),
    # Local: "ready endpoints exist" remotely but here only terminating ones: Local falls back on its own
    (("a1:80", "b1:80"), ("a1:80",), ["b1"], ["a1"]),
])
def test_terminating_endpoints_are_the_fallback(backends, terminating, cluster, local):
    """Ready endpoints only; serving terminating endpoints when no Ready one exists (Cluster: anywhere; Local:
    on this node), and a KUBE-SEP chain for every endpoint either policy uses."""
    lb = svc("lb", "198.19.0.41", 80, *backends, terminating=terminating, type="LoadBalancer", node_port=30001,
             lb_vip="203.0.113.4", etp="Local")
    got, c = parse_tables(render([lb], TOPO, "node-a", FAKE).text)["nat"], chains(svc1=lb)

    def picks(chain):
        return [re.search(r"-j (\S+)$", r).group(1) for r in got[chain] if "->" in r]
    assert picks(c["svc1"]) == [c[f"sep1_{p}"] for p in cluster]
    assert picks(c["svl1"]) == [c[f"sep1_{p}"] for p in local]
    assert {k for k in got if k.startswith("KUBE-SEP-")} == {c[f"sep1_{p}"] for p in set(cluster) | set(local)}


def test_terminating_endpoints_on_a_remote_node_only():
    """eTP Local, the only endpoint terminating on another node: ClusterIP traffic still reaches it; external
    traffic here is dropped ("has no local endpoints"), not rejected."""
    # TestTerminatingEndpointsTrafficPolicyLocal, "terminating endpoints on remote node"
    lb = svc("lb", "198.19.0.41", 80, "b1:80", terminating=("b1:80",), type="LoadBalancer", node_port=30001,
             lb_vip="203.0.113.4", etp="Local")
    got, c = parse_tables(render([lb], TOPO, "node-a", FAKE).text), chains(svc1=lb)
    assert got["nat"][c["svc1"]][-1] == f'-m comment --comment "default/lb -> 198.18.2.11:80" -j {c["sep1_b1"]}'
    assert [r.rsplit(" -j ", 1)[1] for r in got["filter"]["KUBE-EXTERNAL-SERVICES"]] == ["DROP", "DROP"]
    assert c["svl1"] not in got["nat"] and got["nat"][c["ext1"]][-1].endswith(f"-j {c['svc1']}")


def test_endpoints_sorted_as_strings():
    """Endpoints are ordered by their ip:port string (byEndpoint), not by address or by the order given."""
    # TestUpdateEndpointsMap case "complex add and remove": 10.1.1.11:11 sorts before 10.1.1.1:11
    web = svc("web", "198.19.0.41", 80, "b2:80", "b1:8080", "a1:9")
    rules = parse_tables(render([web], TOPO, "node-a", FAKE).text)["nat"][svc_chain(web)]
    assert [re.search(r"-> (\S+)\"", r).group(1) for r in rules if "->" in r] == \
        ["198.18.1.11:9", "198.18.2.11:8080", "198.18.2.12:80"]


@pytest.mark.parametrize("random_fully", [False, True])
def test_masquerade_rule(random_fully):
    """KUBE-POSTROUTING: RETURN unmarked, clear the mark, MASQUERADE (--random-fully where iptables has it)."""
    # TestMasqueradeRule, both cases
    text = render([], TOPO, "node-a", NodeOptions(random_fully=random_fully)).text
    assert parse_tables(text)["nat"]["KUBE-POSTROUTING"] == [
        "-m mark ! --mark 0x00004000/0x00004000 -j RETURN", "-j MARK --xor-mark 0x00004000",
        '-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE'
        + (" --random-fully" if random_fully else "")]


@pytest.mark.parametrize("nfacct,liberal,drop", [
    (frozenset(), False, "-m conntrack --ctstate INVALID -j DROP"),
    (frozenset({"ct_state_invalid_dropped_pkts"}), False,
     "-m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"),
    (frozenset(), True, None),
])
def test_drop_invalid_rule(nfacct, liberal, drop):
    """KUBE-FORWARD drops INVALID packets (counted by nfacct when it can) unless the kernel is liberal."""
    # TestDropInvalidRule, its three cases
    text = render([], TOPO, "node-a", NodeOptions(nfacct=nfacct, tcp_be_liberal=liberal)).text
    assert parse_tables(text)["filter"]["KUBE-FORWARD"] == ([drop] if drop else []) + [
        '-m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT',
        '-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED '
        "-j ACCEPT"]


def test_localhost_nodeports_off():
    """Without --iptables-localhost-nodeports: no KUBE-FIREWALL, no 127.0.0.0/8 NodePort rule, and the
    nodeports jump skips 127.0.0.0/8."""
    # TestNodePorts "ipv4, localhost-nodeports disabled" (expectFirewall false); the KUBE-SERVICES rule per
    # proxier.go's `! -d 127.0.0.0/8` when !localhostNodePorts
    np = svc("np", "198.19.0.41", 80, "b1:80", type="NodePort", node_port=30001)
    got = parse_tables(render([np], TOPO, "node-a", NodeOptions(localhost_nodeports=False)).text)
    assert "KUBE-FIREWALL" not in got["filter"]
    assert got["nat"]["KUBE-NODEPORTS"] == [f"-m comment --comment default/np -m tcp -p tcp --dport 30001 -j "
                                            f"{ext_chain(np)}"]
    assert got["nat"]["KUBE-SERVICES"][-1].endswith("-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS")


# -- full and partial syncs -------------------------------------------------------------
def test_sync_proxy_rules_repeated():
    """The first sync is full; each later one writes the top-level chains and only the changed services'
    chains, and deletes the chains of services and endpoints that went."""
    # TestSyncProxyRulesRepeated, its sequence of syncs and their `expected` restore inputs
    ipt = MemoryIptables(FAKE)
    s1 = svc("svc1", "198.19.0.41", 80, "a1:80")
    s2 = svc("svc2", "198.19.0.42", 8080, "b1:8080")
    s3 = svc("svc3", "198.19.0.43", 80, "a2:80")
    s4 = svc("svc4", "198.19.0.44", 80)
    s4e = dataclasses.replace(s4, backends=(Backend("b2", 80),))
    s3b = dataclasses.replace(s3, backends=(Backend("b1", 80),))
    s3c = dataclasses.replace(s3, backends=(Backend("b1", 80), Backend("b2", 80)))
    c = chains(svc1=s1, svc2=s2, svc3=s3, svc4=s4e, svc3x=s3c)
    filter_ = """\
        *filter
        :KUBE-NODEPORTS - [0:0]
        :KUBE-SERVICES - [0:0]
        :KUBE-EXTERNAL-SERVICES - [0:0]
        :KUBE-FIREWALL - [0:0]
        :KUBE-FORWARD - [0:0]
        :KUBE-PROXY-FIREWALL - [0:0]
        {reject}-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
        -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP
        -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
        -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
        COMMIT
        """
    top = """\
        *nat
        :KUBE-NODEPORTS - [0:0]
        :KUBE-SERVICES - [0:0]
        :KUBE-MARK-MASQ - [0:0]
        :KUBE-POSTROUTING - [0:0]
        {services}-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
        -A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
        -A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
        -A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
        -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
        """
    cip = {1: '-A KUBE-SERVICES -m comment --comment "default/svc1 cluster IP" -m tcp -p tcp -d 198.19.0.41 --dport 80 -j {svc1}\n',
           2: '-A KUBE-SERVICES -m comment --comment "default/svc2 cluster IP" -m tcp -p tcp -d 198.19.0.42 --dport 8080 -j {svc2}\n',
           3: '-A KUBE-SERVICES -m comment --comment "default/svc3 cluster IP" -m tcp -p tcp -d 198.19.0.43 --dport 80 -j {svc3}\n',
           4: '-A KUBE-SERVICES -m comment --comment "default/svc4 cluster IP" -m tcp -p tcp -d 198.19.0.44 --dport 80 -j {svc4}\n'}

    def expect(present, chains_text="", reject=""):
        services = "".join(cip[n] for n in present)
        head = textwrap.dedent(filter_).format(reject=reject) + textwrap.dedent(top).format(services=services)
        return (head + textwrap.dedent(chains_text) + "COMMIT\n").format(**c)

    first = sync(ipt, [s1, s2], TOPO, "node-a", None)
    assert first.full
    assert_tables(ipt.restores[-1], expect([1, 2], """\
        :{sep1_a1} - [0:0]
        :{sep2_b1} - [0:0]
        :{svc2} - [0:0]
        :{svc1} - [0:0]
        -A {sep1_a1} -m comment --comment default/svc1 -s 198.18.1.11 -j KUBE-MARK-MASQ
        -A {sep1_a1} -m comment --comment default/svc1 -m tcp -p tcp -j DNAT --to-destination 198.18.1.11:80
        -A {sep2_b1} -m comment --comment default/svc2 -s 198.18.2.11 -j KUBE-MARK-MASQ
        -A {sep2_b1} -m comment --comment default/svc2 -m tcp -p tcp -j DNAT --to-destination 198.18.2.11:8080
        -A {svc2} -m comment --comment "default/svc2 cluster IP" -m tcp -p tcp -d 198.19.0.42 --dport 8080 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc2} -m comment --comment "default/svc2 -> 198.18.2.11:8080" -j {sep2_b1}
        -A {svc1} -m comment --comment "default/svc1 cluster IP" -m tcp -p tcp -d 198.19.0.41 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc1} -m comment --comment "default/svc1 -> 198.18.1.11:80" -j {sep1_a1}
        """))
    # "Add a new service and its endpoints. (This will only sync the SVC and SEP rules for the new service)"
    assert not sync(ipt, [s1, s2, s3], TOPO, "node-a", {"svc3"}).full
    assert_tables(ipt.restores[-1], expect([1, 2, 3], """\
        :{sep3_a2} - [0:0]
        :{svc3} - [0:0]
        -A {sep3_a2} -m comment --comment default/svc3 -s 198.18.1.12 -j KUBE-MARK-MASQ
        -A {sep3_a2} -m comment --comment default/svc3 -m tcp -p tcp -j DNAT --to-destination 198.18.1.12:80
        -A {svc3} -m comment --comment "default/svc3 cluster IP" -m tcp -p tcp -d 198.19.0.43 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc3} -m comment --comment "default/svc3 -> 198.18.1.12:80" -j {sep3_a2}
        """))
    # "Delete a service. (Won't update the other services.)"
    sync(ipt, [s1, s3], TOPO, "node-a", {"svc2"})
    assert_tables(ipt.restores[-1], expect([1, 3], """\
        :{sep2_b1} - [0:0]
        :{svc2} - [0:0]
        -X {sep2_b1}
        -X {svc2}
        """))
    # "Add a service, sync, then add its endpoints": first only the REJECT rule...
    sync(ipt, [s1, s3, s4], TOPO, "node-a", {"svc4"})
    reject = ('-A KUBE-SERVICES -m comment --comment "default/svc4 has no endpoints" -m tcp -p tcp -d 198.19.0.44 '
              "--dport 80 -j REJECT\n")
    assert_tables(ipt.restores[-1], expect([1, 3], reject=reject))
    # ...then the new service
    sync(ipt, [s1, s3, s4e], TOPO, "node-a", {"svc4"})
    assert_tables(ipt.restores[-1], expect([1, 3, 4], """\
        :{sep4_b2} - [0:0]
        :{svc4} - [0:0]
        -A {sep4_b2} -m comment --comment default/svc4 -s 198.18.2.12 -j KUBE-MARK-MASQ
        -A {sep4_b2} -m comment --comment default/svc4 -m tcp -p tcp -j DNAT --to-destination 198.18.2.12:80
        -A {svc4} -m comment --comment "default/svc4 cluster IP" -m tcp -p tcp -d 198.19.0.44 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc4} -m comment --comment "default/svc4 -> 198.18.2.12:80" -j {sep4_b2}
        """))
    # "Change an endpoint of an existing service. This will cause its SVC and SEP chains to be rewritten."
    sync(ipt, [s1, s3b, s4e], TOPO, "node-a", {"svc3"})
    assert_tables(ipt.restores[-1], expect([1, 3, 4], """\
        :{sep3_a2} - [0:0]
        :{sep3x_b1} - [0:0]
        :{svc3} - [0:0]
        -A {sep3x_b1} -m comment --comment default/svc3 -s 198.18.2.11 -j KUBE-MARK-MASQ
        -A {sep3x_b1} -m comment --comment default/svc3 -m tcp -p tcp -j DNAT --to-destination 198.18.2.11:80
        -A {svc3} -m comment --comment "default/svc3 cluster IP" -m tcp -p tcp -d 198.19.0.43 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc3} -m comment --comment "default/svc3 -> 198.18.2.11:80" -j {sep3x_b1}
        -X {sep3_a2}
        """))
    # "Add an endpoint to a service. This will cause its SVC and SEP chains to be rewritten."
    sync(ipt, [s1, s3c, s4e], TOPO, "node-a", {"svc3"})
    assert_tables(ipt.restores[-1], expect([1, 3, 4], """\
        :{sep3x_b1} - [0:0]
        :{sep3x_b2} - [0:0]
        :{svc3} - [0:0]
        -A {sep3x_b1} -m comment --comment default/svc3 -s 198.18.2.11 -j KUBE-MARK-MASQ
        -A {sep3x_b1} -m comment --comment default/svc3 -m tcp -p tcp -j DNAT --to-destination 198.18.2.11:80
        -A {sep3x_b2} -m comment --comment default/svc3 -s 198.18.2.12 -j KUBE-MARK-MASQ
        -A {sep3x_b2} -m comment --comment default/svc3 -m tcp -p tcp -j DNAT --to-destination 198.18.2.12:80
        -A {svc3} -m comment --comment "default/svc3 cluster IP" -m tcp -p tcp -d 198.19.0.43 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
        -A {svc3} -m comment --comment "default/svc3 -> 198.18.2.11:80" -m statistic --mode random --probability 0.5000000000 -j {sep3x_b1}
        -A {svc3} -m comment --comment "default/svc3 -> 198.18.2.12:80" -j {sep3x_b2}
        """))
    # "Sync with no new changes... This will not rewrite any SVC or SEP chains"
    sync(ipt, [s1, s3c, s4e], TOPO, "node-a", set())
    assert_tables(ipt.restores[-1], expect([1, 3, 4]))
    # and the node holds every service's chains: the partial syncs left svc1's alone
    assert parse_tables(ipt.save("nat"))["nat"][c["svc1"]][-1] == f'-m comment --comment "default/svc1 -> 198.18.1.11:80" -j {c["sep1_a1"]}'


def test_first_sync_ensures_jumps_canaries_and_a_later_one_does_not():
    """A full sync creates the canaries in mangle, nat and filter and prepends the jumps from the built-in
    chains (so each built-in chain lists them in reverse order); a partial sync touches none of them."""
    # proxier.go iptablesJumpChains + iptablesKubeletJumpChains, EnsureRule(utiliptables.Prepend, ...);
    # NewProxier's ipt.Monitor(kubeProxyCanaryChain, {mangle, nat, filter}); TestTracePacket's filter jumps
    ipt = MemoryIptables(FAKE)
    sync(ipt, [], TOPO, "node-a", None)
    for table in ("mangle", "nat", "filter"):
        assert CANARY in parse_tables(ipt.save(table))[table]
    filter_ = parse_tables(ipt.save("filter"))["filter"]
    assert filter_["INPUT"] == [
        "-j KUBE-FIREWALL",
        '-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL',
        '-m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS',
        '-m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" '
        "-j KUBE-EXTERNAL-SERVICES"]
    assert filter_["FORWARD"] == [
        '-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL',
        '-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD',
        '-m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
        '-m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" '
        "-j KUBE-EXTERNAL-SERVICES"]
    assert filter_["OUTPUT"] == [
        "-j KUBE-FIREWALL",
        '-m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL',
        '-m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES']
    nat = parse_tables(ipt.save("nat"))["nat"]
    assert nat["PREROUTING"] == nat["OUTPUT"] == ['-m comment --comment "kubernetes service portals" -j KUBE-SERVICES']
    assert nat["POSTROUTING"] == ['-m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING']
    assert ipt.sysctls == {"net.ipv4.conf.all.route_localnet": 1, "net.netfilter.nf_conntrack_tcp_be_liberal": 1}
    before = ipt.save("filter")
    assert not sync(ipt, [], TOPO, "node-a", set()).full and ipt.save("filter") == before


def test_cleanup_leaves_kubelets_firewall_and_forces_a_full_sync():
    """CleanupLeftovers removes the jumps, the kube-proxy chains and the canaries but keeps KUBE-FIREWALL; the
    next sync finds no canary and is full."""
    # proxier.go CleanupLeftovers (v1.34: also KUBE-MARK-MASQ and the canaries) and the comment on
    # iptablesKubeletJumpChains: "we create these on startup but do not delete them in CleanupLeftovers"
    ipt = MemoryIptables()
    web = svc("web", "198.19.0.41", 80, "b1:80", type="NodePort", node_port=30001)
    sync(ipt, [web], TOPO, "node-a", None)
    kubeproxy.cleanup(ipt)
    assert parse_tables(ipt.save("nat"))["nat"] == {c: [] for c in ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING")}
    assert parse_tables(ipt.save("filter"))["filter"] == {
        "INPUT": ["-j KUBE-FIREWALL"], "FORWARD": [], "OUTPUT": ["-j KUBE-FIREWALL"],
        "KUBE-FIREWALL": ['-m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 '
                          "-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"]}
    assert CANARY not in parse_tables(ipt.save("mangle"))["mangle"]
    assert sync(ipt, [web], TOPO, "node-a", set()).full


def test_changed_services_are_the_ones_that_differ():
    """A service counts as changed when it appeared, went, or differs in anything (its endpoints included)."""
    a, b = svc("a", "198.19.0.41", 80, "b1:80"), svc("b", "198.19.0.42", 80, "b1:80")
    b2 = dataclasses.replace(b, backends=(Backend("b1", 80, "terminating"),))
    assert changed_services({"a": a, "b": b}, {"a": a, "b": b2, "c": a}) == {"b", "c"}
    assert changed_services({"a": a}, {}) == {"a"}


# -- the agent in iptables mode ---------------------------------------------------------
@pytest.fixture
def ipt() -> Services:
    return Services.in_memory(TOPO, mode="iptables")


def test_agent_syncs_tables_not_maps(ipt):
    """In iptables mode every change syncs each node's tables (the first fully, later ones partially) and
    touches no LB map."""
    ipt.add("web", 80, ["b1:8080"])
    ipt.add_backend("web", "b2:8080")
    assert ipt.maps.ops == []
    assert set(ipt.tables.nodes) == {"node-a", "node-b"}
    assert ipt.iptables("node-a").count("DNAT --to-destination") == 2
    assert [CANARY in r for r in ipt.tables("node-b").restores] == [False, False]  # the canary is not restored
    assert [":KUBE-PROXY-CANARY" in ipt.tables("node-b").save(t) for t in ("mangle", "nat", "filter")] == [True] * 3


def test_external_traffic_policy_local_differs_per_node(ipt):
    """eTP Local: the node with the endpoint has KUBE-SVL; the other drops external traffic in filter."""
    lb = ipt.add("lb", 80, ["a1:8080"], type="LoadBalancer", etp="Local")
    a, b = (parse_tables(ipt.iptables(n, "nat") + ipt.iptables(n, "filter")) for n in ("node-a", "node-b"))
    assert a["nat"][svl_chain(lb)] and svl_chain(lb) not in b["nat"]
    assert a["filter"]["KUBE-EXTERNAL-SERVICES"] == []
    assert [r.split(" -j ")[-1] for r in b["filter"]["KUBE-EXTERNAL-SERVICES"]] == ["DROP", "DROP"]


def test_reset_cleans_up_and_the_next_sync_is_full(ipt):
    """flush() (lab.reset) is kube-proxy --cleanup on every node; the next change is a full sync."""
    ipt.add("web", 80, ["b1:8080"])
    ipt.flush()
    assert "KUBE-SERVICES" not in ipt.iptables("node-a") and len(ipt) == 0
    ipt.add("api", 81, ["a1:8080"])
    restores = ipt.tables("node-a").restores
    assert "-A INPUT" not in restores[-1] and ":KUBE-PROXY-CANARY" in ipt.tables("node-a").save("nat")
    assert "default/api" in ipt.iptables("node-a") and "default/web" not in ipt.iptables("node-a")


def test_maglev_is_refused_before_anything_is_written(ipt):
    """A Maglev service has no iptables rendering: ConfigError naming the service and the option, no sync."""
    ipt.add("web", 80, ["b1:8080"])
    before = [list(ipt.tables(n).restores) for n in ("node-a", "node-b")]
    with pytest.raises(ConfigError, match=r"service 'hash': algorithm 'maglev' has no rendering in --service-mode "
                                          r"iptables .* expected algorithm 'random'"):
        ipt.add("hash", 80, ["b1:8080"], algorithm="maglev")
    assert [ipt.tables(n).restores for n in ("node-a", "node-b")] == before and "hash" not in ipt


def test_a_refused_restore_gets_a_full_sync_of_the_old_state(ipt):
    """If node-b refuses its restore, node-a and node-b get a full sync of the previous services and the
    service list is unchanged."""
    ipt.add("web", 80, ["b1:8080"])
    good = {n: ipt.iptables(n) for n in ("node-a", "node-b")}

    def refuse(text):
        if "default/api" in text:
            raise DatapathError("iptables-restore in lk-demo-node-b failed (1): line 7 failed")
    ipt.tables("node-b").fail = refuse
    with pytest.raises(DatapathError, match="the tables are as they were"):
        ipt.add("api", 81, ["a1:8080"])
    assert [s.name for s in ipt.list()] == ["web"]
    assert {n: ipt.iptables(n) for n in ("node-a", "node-b")} == good
    assert "default/web" in ipt.tables("node-a").restores[-1]  # the resync wrote web's chains again: full


def test_nat_table_is_a_whole_table_for_a_flushing_restore():
    """nat_table() (what the bench restores) holds the built-in chains, their jumps and the canary, then the
    full sync's nat rules."""
    web = svc("web", "198.19.0.41", 80, "b1:80")
    lines = nat_table([web], TOPO).splitlines()
    assert lines[:6] == ["*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
                         ":POSTROUTING ACCEPT [0:0]", ":KUBE-PROXY-CANARY - [0:0]"]
    assert '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES' in lines
    assert lines[-1] == "COMMIT" and any(l.startswith(f"-A {svc_chain(web)} ") for l in lines)


def _memory_with(table: str) -> MemoryIptables:
    """A node whose nat table is ``table`` (a nat_table() text), restored into empty in-memory tables."""
    ipt = MemoryIptables()
    ipt.restore_all(table)
    return ipt


def test_partial_table_writes_the_top_chains_and_only_the_changed_services_chains():
    """A partial sync's text declares the nat top-level chains, holds every service's KUBE-SERVICES rule and
    the NodePorts jump, and the KUBE-SVC/KUBE-SEP chains of the changed service only (db's are left out)."""
    web, db = svc("web", "198.19.0.41", 80, "b1:8080"), svc("db", "198.19.0.42", 5432, "b2:5432")
    grown = dataclasses.replace(web, backends=web.backends + (Backend.parse("a1:8080", "web"),))
    text = partial_table([grown, db], TOPO, {"web"}, chains_in(nat_table([web, db], TOPO)))
    nat = parse_tables(text)["nat"]
    names = chains(svc1=grown, svc2=db)
    assert set(nat) == {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", names["svc1"],
                        names["sep1_b1"], names["sep1_a1"]}
    assert [r.split(" -j ")[-1] for r in nat["KUBE-SERVICES"]] == [names["svc2"], names["svc1"], "KUBE-NODEPORTS"]
    assert len(nat[names["svc1"]]) == 3  # the masquerade rule, then 1/2 and the rest
    assert "KUBE-SERVICES" in parse_tables(text)["filter"] and "-X" not in nat


def test_partial_table_deletes_the_chains_of_a_removed_endpoint():
    """Taking an endpoint out declares its KUBE-SEP chain (flushing it) and -X-deletes it, because the
    nat table before the change had it."""
    two = svc("web", "198.19.0.41", 80, "b1:8080", "b2:8080")
    one = dataclasses.replace(two, backends=two.backends[:1])
    text = partial_table([one], TOPO, {"web"}, chains_in(nat_table([two], TOPO)))
    gone = chains(svc1=two)["sep1_b2"]
    assert f":{gone} - [0:0]" in text.splitlines() and parse_tables(text)["nat"]["-X"] == [gone]


def test_partial_restore_onto_the_old_table_equals_a_full_render_of_the_new():
    """--noflush of the partial text onto a node holding the old full table leaves the nat table a full render
    of the new state would write: adding an endpoint, then removing it again (with -X)."""
    web, db = svc("web", "198.19.0.41", 80, "b1:8080"), svc("db", "198.19.0.42", 5432, "b2:5432")
    grown = dataclasses.replace(web, backends=web.backends + (Backend.parse("a2:8080", "web"),))
    ipt = _memory_with(nat_table([web, db], TOPO))
    ipt.restore_all(partial_table([grown, db], TOPO, {"web"}, chains_in(ipt.save("nat"))))
    assert_tables(ipt.save("nat"), nat_table([grown, db], TOPO))
    ipt.restore_all(partial_table([web, db], TOPO, {"web"}, chains_in(ipt.save("nat"))))
    assert_tables(ipt.save("nat"), nat_table([web, db], TOPO))


def test_partial_table_without_the_old_chains_leaves_a_stale_chain():
    """Without ``existing`` (kube-proxy's large-cluster mode skips iptables-save) nothing is -X-deleted: the
    removed endpoint's chain stays, unreferenced."""
    two = svc("web", "198.19.0.41", 80, "b1:8080", "b2:8080")
    one = dataclasses.replace(two, backends=two.backends[:1])
    ipt = _memory_with(nat_table([two], TOPO))
    ipt.restore_all(partial_table([one], TOPO, {"web"}))
    stale = chains(svc1=two)["sep1_b2"]
    assert diff_tables(ipt.save("nat"), nat_table([one], TOPO)) == [f"nat {stale}: chain unexpected"]


def _many(n: int) -> list[Service]:
    """``n`` one-endpoint services (b1:8080) on ClusterIPs from 198.19.1.1."""
    return [svc(f"s{i:04d}", f"198.19.{1 + i // 250}.{1 + i % 250}", 80, "b1:8080") for i in range(n)]


def test_more_than_1000_endpoints_leave_the_comments_out_of_service_chains():
    """largeClusterMode: at 1,000 endpoints every KUBE-SVC/KUBE-SEP rule has its comment, at 1,001 none has
    (KUBE-SERVICES keeps its comments); a partial sync renders the same way."""
    for n, large in ((1000, False), (1001, True)):
        services = _many(n)
        restore = render(services, TOPO, "node-a")
        nat = parse_tables(restore.text)["nat"]
        own = [r for c, rules in nat.items() if c.startswith(("KUBE-SVC-", "KUBE-SEP-")) for r in rules]
        commented = [r for r in own if "--comment" in r and "cluster IP" not in r]  # the masquerade rule keeps its
        assert restore.large_cluster is large and (not commented) is large, n
        assert all("--comment" in r for r in nat["KUBE-SERVICES"])
    last = services[-1]
    partial = partial_table(services, TOPO, {last.name})
    assert f"-A {sep_chain(last, '198.18.2.11:8080')} -s 198.18.2.11 -j KUBE-MARK-MASQ" in partial.splitlines()


def test_parse_conntrack_udp_and_flags():
    """UDP lines have no state; [UNREPLIED] and [ASSURED] become flags; other protocols are skipped."""
    rows = parse_conntrack(
        "udp      17 29 src=198.18.1.11 dst=198.19.0.10 sport=5000 dport=53 [UNREPLIED] src=198.18.2.11 "
        "dst=198.18.1.11 sport=8080 dport=5000 mark=0 use=1\n"
        "icmp     1 29 src=198.18.1.11 dst=198.18.2.11 type=8 code=0 id=7 src=198.18.2.11 dst=198.18.1.11 "
        "type=0 code=0 id=7 mark=0 use=1\n")
    assert len(rows) == 1 and rows[0].state == "" and rows[0].flags == ("UNREPLIED",) and rows[0].dnat


