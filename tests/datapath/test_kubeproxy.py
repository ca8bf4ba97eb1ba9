"""kube-proxy's iptables mode on the real kernel: every node's ``iptables-save -t filter`` and ``-t nat`` equal,
chain by chain, what kube-proxy writes for a set of Services; ClusterIP, NodePort, LoadBalancer and hairpin
traffic through those tables; session affinity, externalTrafficPolicy Local, terminating endpoints, REJECT;
partial syncs that leave other services' chains and counters alone; Linux conntrack beside the BPF CT rows;
nothing of one mode left in the other."""
from __future__ import annotations

import re
import sys
import textwrap

import pytest

from labkit.config import DatapathConfig
from labkit.agent.kubeproxy import diff_tables, ext_chain, parse_tables, sep_chain, svc_chain, svl_chain

from labtag import tagged

NODE_A, NODE_B, EXT = "198.51.100.11", "198.51.100.12", "198.51.100.100"
POD = {"a1": "198.18.1.11", "a2": "198.18.1.12", "b1": "198.18.2.11", "b2": "198.18.2.12"}


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


def _save(lab, node: str, table: str, counters: bool = False) -> str:
    argv = ["iptables-save", "-t", table] + (["-c"] if counters else [])
    return lab.exec(node, argv, check=True).stdout


def _connect(lab, pod: str, ip: str, port: int) -> str:
    """connect() from ``pod`` with a plain socket: 'connected', 'refused' or the error's name."""
    code = ("import socket\ns = socket.socket(); s.settimeout(2)\n"
            f"try:\n    s.connect(('{ip}', {port})); print('connected')\n"
            "except ConnectionRefusedError:\n    print('refused')\n"
            "except OSError as e:\n    print(type(e).__name__)\n")
    return lab.exec(pod, [sys.executable, "-c", code], check=True).stdout.strip()


# -- the tables ----------------------------------------------------------------------
def _add_service_set(lab) -> dict:
    """ClusterIP (two ready endpoints and a terminating one), NodePort, LoadBalancer with eTP Local (its one
    endpoint on node-a), ClientIP affinity, only terminating endpoints, no endpoints, UDP."""
    add = lab.services.add
    svcs = {
        "web": add("web", 80, ["b1:8080", "b2:8080"], vip="198.19.0.10"),
        "np": add("np", 80, ["b1:8080"], vip="198.19.0.11", type="NodePort", node_port=30080),
        "lb": add("lb", 80, ["a1:8080"], vip="198.19.0.12", type="LoadBalancer", node_port=30081,
                  lb_vip="203.0.113.10", etp="Local"),
        "sticky": add("sticky", 80, ["a2:8080", "b2:8080"], vip="198.19.0.13", affinity=10800),
        "term": add("term", 80, [], vip="198.19.0.14"),
        "empty": add("empty", 80, [], vip="198.19.0.15"),
        "dns": add("dns", 53, ["b1:8080"], vip="198.19.0.16", protocol="UDP"),
    }
    lab.services.add_backend("web", "a2:8080", state="terminating")
    svcs["term"] = lab.services.add_backend("term", "b2:8080", state="terminating")
    svcs["web"] = lab.services.get("web")
    return svcs


def _names(svcs: dict) -> dict[str, str]:
    """``{svc_web}``, ``{ext_lb}``, ``{svl_lb}``, ``{sep_web_b1}``...: the chains, by kube-proxy's hashes."""
    out = {}
    for key, s in svcs.items():
        out.update({f"svc_{key}": svc_chain(s), f"ext_{key}": ext_chain(s), f"svl_{key}": svl_chain(s)})
        for b in s.backends:
            out[f"sep_{key}_{b.pod}"] = sep_chain(s, f"{POD[b.pod]}:{b.port}")
    return out


def saved_probability(n: int) -> str:
    """What iptables-save prints for kube-proxy's ``--probability`` of 1/n: libxt_statistic stores
    lround(0x80000000 * p) and prints it back divided by 0x80000000 with %.11f."""
    p = float(f"{1.0 / n:0.10f}")
    return f"{round(0x80000000 * p) / 0x80000000:.11f}"


# kube-proxy's rules for this Service set, in iptables-save form. The rules are TestOverallIPTablesRules'
# (pkg/proxy/iptables/proxier_test.go, v1.33 line; see tests/unit/test_kubeproxy.py) for the shapes: cluster IP,
# NodePort (with the localhost nfacct rule), LoadBalancer, KUBE-EXT (Cluster: mark; Local: the short-circuits,
# then KUBE-SVL when this node has an endpoint), KUBE-SEP with -m recent --set, KUBE-SVC with --rcheck, REJECT
# and "has no local endpoints" DROP in filter; TestSyncProxyRulesRepeated's filter table and jump chains;
# TestTerminatingEndpointsTrafficPolicyCluster for which endpoints are used. iptables-save prints them
# normalised: addresses first (! -s, -d with /32, -p), every comment quoted, -m tcp without -p, the MARK
# targets as --set-xmark, REJECT with its default --reject-with icmp-port-unreachable, the probability with
# eleven digits, --nfacct-name followed by two spaces, -m recent with its --mask and --rsource defaults.
FILTER = """\
    *filter
    :INPUT ACCEPT [0:0]
    :FORWARD ACCEPT [0:0]
    :OUTPUT ACCEPT [0:0]
    :KUBE-EXTERNAL-SERVICES - [0:0]
    :KUBE-FIREWALL - [0:0]
    :KUBE-FORWARD - [0:0]
    :KUBE-NODEPORTS - [0:0]
    :KUBE-PROXY-CANARY - [0:0]
    :KUBE-PROXY-FIREWALL - [0:0]
    :KUBE-SERVICES - [0:0]
    -A INPUT -j KUBE-FIREWALL
    -A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
    -A INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
    -A INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
    -A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
    -A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
    -A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    -A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
    -A OUTPUT -j KUBE-FIREWALL
    -A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
    -A OUTPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    {no_local_lb}-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
    -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
    -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
    -A KUBE-SERVICES -d 198.19.0.15/32 -p tcp -m comment --comment "default/empty has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
    COMMIT
    """
# node-b has no endpoint of the eTP Local service 'lb'
NO_LOCAL_LB = """\
    -A KUBE-EXTERNAL-SERVICES -d 203.0.113.10/32 -p tcp -m comment --comment "default/lb has no local endpoints" -m tcp --dport 80 -j DROP
    -A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "default/lb has no local endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 30081 -j DROP
    """
NAT = """\
    *nat
    :PREROUTING ACCEPT [0:0]
    :INPUT ACCEPT [0:0]
    :OUTPUT ACCEPT [0:0]
    :POSTROUTING ACCEPT [0:0]
    :{ext_lb} - [0:0]
    :{ext_np} - [0:0]
    :KUBE-MARK-MASQ - [0:0]
    :KUBE-NODEPORTS - [0:0]
    :KUBE-POSTROUTING - [0:0]
    :KUBE-PROXY-CANARY - [0:0]
    :{sep_dns_b1} - [0:0]
    :{sep_lb_a1} - [0:0]
    :{sep_np_b1} - [0:0]
    :{sep_sticky_a2} - [0:0]
    :{sep_sticky_b2} - [0:0]
    :{sep_term_b2} - [0:0]
    :{sep_web_b1} - [0:0]
    :{sep_web_b2} - [0:0]
    :KUBE-SERVICES - [0:0]
    :{svc_dns} - [0:0]
    :{svc_lb} - [0:0]
    :{svc_np} - [0:0]
    :{svc_sticky} - [0:0]
    :{svc_term} - [0:0]
    :{svc_web} - [0:0]
    {svl_chain}-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    -A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
    -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
    -A {ext_lb} -s 198.18.0.0/15 -m comment --comment "pod traffic for default/lb external destinations" -j {svc_lb}
    -A {ext_lb} -m comment --comment "masquerade LOCAL traffic for default/lb external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
    -A {ext_lb} -m comment --comment "route LOCAL traffic for default/lb external destinations" -m addrtype --src-type LOCAL -j {svc_lb}
    {to_svl}-A {ext_np} -m comment --comment "masquerade traffic for default/np external destinations" -j KUBE-MARK-MASQ
    -A {ext_np} -j {svc_np}
    -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
    -A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "default/lb" -m tcp --dport 30081 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j {ext_lb}
    -A KUBE-NODEPORTS -p tcp -m comment --comment "default/lb" -m tcp --dport 30081 -j {ext_lb}
    -A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "default/np" -m tcp --dport 30080 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j {ext_np}
    -A KUBE-NODEPORTS -p tcp -m comment --comment "default/np" -m tcp --dport 30080 -j {ext_np}
    -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
    -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
    -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
    -A {sep_dns_b1} -s 198.18.2.11/32 -m comment --comment "default/dns" -j KUBE-MARK-MASQ
    -A {sep_dns_b1} -p udp -m comment --comment "default/dns" -m udp -j DNAT --to-destination 198.18.2.11:8080
    -A {sep_lb_a1} -s 198.18.1.11/32 -m comment --comment "default/lb" -j KUBE-MARK-MASQ
    -A {sep_lb_a1} -p tcp -m comment --comment "default/lb" -m tcp -j DNAT --to-destination 198.18.1.11:8080
    -A {sep_np_b1} -s 198.18.2.11/32 -m comment --comment "default/np" -j KUBE-MARK-MASQ
    -A {sep_np_b1} -p tcp -m comment --comment "default/np" -m tcp -j DNAT --to-destination 198.18.2.11:8080
    -A {sep_sticky_a2} -s 198.18.1.12/32 -m comment --comment "default/sticky" -j KUBE-MARK-MASQ
    -A {sep_sticky_a2} -p tcp -m comment --comment "default/sticky" -m recent --set --name {sep_sticky_a2} --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 198.18.1.12:8080
    -A {sep_sticky_b2} -s 198.18.2.12/32 -m comment --comment "default/sticky" -j KUBE-MARK-MASQ
    -A {sep_sticky_b2} -p tcp -m comment --comment "default/sticky" -m recent --set --name {sep_sticky_b2} --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 198.18.2.12:8080
    -A {sep_term_b2} -s 198.18.2.12/32 -m comment --comment "default/term" -j KUBE-MARK-MASQ
    -A {sep_term_b2} -p tcp -m comment --comment "default/term" -m tcp -j DNAT --to-destination 198.18.2.12:8080
    -A {sep_web_b1} -s 198.18.2.11/32 -m comment --comment "default/web" -j KUBE-MARK-MASQ
    -A {sep_web_b1} -p tcp -m comment --comment "default/web" -m tcp -j DNAT --to-destination 198.18.2.11:8080
    -A {sep_web_b2} -s 198.18.2.12/32 -m comment --comment "default/web" -j KUBE-MARK-MASQ
    -A {sep_web_b2} -p tcp -m comment --comment "default/web" -m tcp -j DNAT --to-destination 198.18.2.12:8080
    -A KUBE-SERVICES -d 198.19.0.16/32 -p udp -m comment --comment "default/dns cluster IP" -m udp --dport 53 -j {svc_dns}
    -A KUBE-SERVICES -d 198.19.0.12/32 -p tcp -m comment --comment "default/lb cluster IP" -m tcp --dport 80 -j {svc_lb}
    -A KUBE-SERVICES -d 203.0.113.10/32 -p tcp -m comment --comment "default/lb loadbalancer IP" -m tcp --dport 80 -j {ext_lb}
    -A KUBE-SERVICES -d 198.19.0.11/32 -p tcp -m comment --comment "default/np cluster IP" -m tcp --dport 80 -j {svc_np}
    -A KUBE-SERVICES -d 198.19.0.13/32 -p tcp -m comment --comment "default/sticky cluster IP" -m tcp --dport 80 -j {svc_sticky}
    -A KUBE-SERVICES -d 198.19.0.14/32 -p tcp -m comment --comment "default/term cluster IP" -m tcp --dport 80 -j {svc_term}
    -A KUBE-SERVICES -d 198.19.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j {svc_web}
    -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
    -A {svc_dns} ! -s 198.18.0.0/15 -d 198.19.0.16/32 -p udp -m comment --comment "default/dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
    -A {svc_dns} -m comment --comment "default/dns -> 198.18.2.11:8080" -j {sep_dns_b1}
    -A {svc_lb} ! -s 198.18.0.0/15 -d 198.19.0.12/32 -p tcp -m comment --comment "default/lb cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
    -A {svc_lb} -m comment --comment "default/lb -> 198.18.1.11:8080" -j {sep_lb_a1}
    -A {svc_np} ! -s 198.18.0.0/15 -d 198.19.0.11/32 -p tcp -m comment --comment "default/np cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
    -A {svc_np} -m comment --comment "default/np -> 198.18.2.11:8080" -j {sep_np_b1}
    -A {svc_sticky} ! -s 198.18.0.0/15 -d 198.19.0.13/32 -p tcp -m comment --comment "default/sticky cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
    -A {svc_sticky} -m comment --comment "default/sticky -> 198.18.1.12:8080" -m recent --rcheck --seconds 10800 --reap --name {sep_sticky_a2} --mask 255.255.255.255 --rsource -j {sep_sticky_a2}
    -A {svc_sticky} -m comment --comment "default/sticky -> 198.18.2.12:8080" -m recent --rcheck --seconds 10800 --reap --name {sep_sticky_b2} --mask 255.255.255.255 --rsource -j {sep_sticky_b2}
    -A {svc_sticky} -m comment --comment "default/sticky -> 198.18.1.12:8080" -m statistic --mode random --probability {half} -j {sep_sticky_a2}
    -A {svc_sticky} -m comment --comment "default/sticky -> 198.18.2.12:8080" -j {sep_sticky_b2}
    -A {svc_term} ! -s 198.18.0.0/15 -d 198.19.0.14/32 -p tcp -m comment --comment "default/term cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
    -A {svc_term} -m comment --comment "default/term -> 198.18.2.12:8080" -j {sep_term_b2}
    -A {svc_web} ! -s 198.18.0.0/15 -d 198.19.0.10/32 -p tcp -m comment --comment "default/web cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
    -A {svc_web} -m comment --comment "default/web -> 198.18.2.11:8080" -m statistic --mode random --probability {half} -j {sep_web_b1}
    -A {svc_web} -m comment --comment "default/web -> 198.18.2.12:8080" -j {sep_web_b2}
    {svl_rules}COMMIT
    """
# node-a has the eTP Local service's endpoint: KUBE-EXT-lb ends in KUBE-SVL-lb, which lists only a1
HERE = {"svl_chain": ":{svl_lb} - [0:0]\n", "to_svl": "-A {ext_lb} -j {svl_lb}\n",
        "svl_rules": '-A {svl_lb} -m comment --comment "default/lb -> 198.18.1.11:8080" -j {sep_lb_a1}\n'}


def expected(node: str, names: dict) -> str:
    """The two tables kube-proxy writes on ``node`` for the service set, in iptables-save form."""
    local = node == "node-a"
    parts = {k: (v if local else "") for k, v in HERE.items()}
    nat = textwrap.dedent(NAT).replace("{svl_chain}", parts["svl_chain"]).replace("{to_svl}", parts["to_svl"])
    nat = nat.replace("{svl_rules}", parts["svl_rules"])
    filter_ = textwrap.dedent(FILTER).replace("{no_local_lb}", "" if local else textwrap.dedent(NO_LOCAL_LB))
    return (filter_ + nat).format(half=saved_probability(2), **names)


def test_tables_are_kube_proxys(ipt):
    """After the service set, each node's iptables-save -t filter and -t nat equal, chain by chain, what
    kube-proxy writes: both nodes alike but for the eTP Local service, whose endpoint is on node-a."""
    lab = ipt
    names = _names(_add_service_set(lab))
    for node in ("node-a", "node-b"):
        got = _save(lab, node, "filter") + _save(lab, node, "nat")
        problems = diff_tables(got, expected(node, names))
        assert not problems, f"{node}:\n" + "\n".join(problems)
    assert ":KUBE-PROXY-CANARY - [0:0]" in _save(lab, "node-a", "mangle")
    assert lab.exec("node-a", ["sysctl", "-n", "net.ipv4.conf.all.route_localnet"], check=True).stdout.strip() == "1"


# -- traffic -------------------------------------------------------------------------------
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


def test_udp_cluster_ip(ipt):
    """A UDP Service: a1's datagram to the ClusterIP is DNATed by KUBE-SEP (-m udp) to b1's echo, and the
    answer comes back from the VIP."""
    lab = ipt
    dns = lab.services.add("dns", 53, ["b1:8080"], protocol="UDP")
    step = lab.pod("a1").udp("dns", 53, b"ping")
    assert step.ok and step.result["reply_text"].startswith("pod=b1 client=198.18.1.11:")
    assert step.result["peer"] == f"{dns.vip}:53"
    (track,) = [r for r in lab.conntrack("node-a") if r.proto == "udp" and r.dst == dns.vip]
    assert (track.reply_src, track.reply_sport, track.snat) == ("198.18.2.11", 8080, False)


def test_nodeport_is_masqueraded(ipt):
    """ext → node-b:30080: KUBE-NODEPORTS → KUBE-EXT marks it, node-b DNATs and masquerades (--random-fully):
    the server sees node-b's address, and node-b's conntrack row is both DNAT and SNAT."""
    lab = ipt
    lab.services.add("web", 80, ["b1:8080"], type="NodePort", node_port=30080)
    opened = lab.external("ext").tcp("node-b", 30080).open()
    assert opened.ok
    assert _client(lab, "b1").startswith(f"{NODE_B}:")
    (track,) = [r for r in lab.conntrack("node-b") if r.src == EXT and r.dport == 30080]
    assert track.dnat and track.snat and track.reply_dst == NODE_B
    assert _client(lab, "b1") == f"{NODE_B}:{track.reply_dport}"  # the port MASQUERADE picked


def test_hairpin_is_masqueraded_to_the_node(ipt):
    """a1 → its own Service: the SEP chain's self-source rule marks it, so a1's server sees a node-a address
    (kube-proxy's MASQUERADE), not 169.254.42.1."""
    lab = ipt
    lab.services.add("self", 80, ["a1:8080"])
    opened = lab.pod("a1").tcp("self", 80).open()
    assert opened.ok
    seen = _client(lab, "a1").split(":")[0]
    assert seen in (NODE_A, "198.18.1.1") and seen != "169.254.42.1"


def test_load_balancer_with_local_policy_keeps_the_client_address(ipt):
    """ext → the LoadBalancer VIP (routed to node-a, which has the endpoint) and ext → node-a's NodePort:
    KUBE-EXT sends them to KUBE-SVL unmasqueraded, so a1's server sees ext's own address."""
    lab = ipt
    lab.services.add("lb", 80, ["a1:8080"], type="LoadBalancer", node_port=30081, lb_vip="203.0.113.10", etp="Local")
    assert lab.external("ext").tcp("203.0.113.10", 80).open().ok
    assert _client(lab, "a1").startswith(f"{EXT}:")
    assert lab.external("ext").tcp("node-a", 30081).open().ok
    assert _client(lab, "a1").startswith(f"{EXT}:")


def test_local_policy_drops_on_a_node_without_an_endpoint(ipt):
    """ext → node-b's NodePort of a Service whose only endpoint is on node-a: filter KUBE-EXTERNAL-SERVICES
    DROPs it (the client times out), and that rule's counter shows it."""
    lab = ipt
    lab.services.add("lb", 80, ["a1:8080"], type="LoadBalancer", node_port=30081, lb_vip="203.0.113.10", etp="Local")
    opened = lab.external("ext").tcp("node-b", 30081).open()
    assert not opened.ok and opened.result.get("error") != "ECONNREFUSED"
    drops = parse_tables(_save(lab, "node-b", "filter", counters=True), counters=True)["filter"]
    (nodeport,) = [r for r in drops["KUBE-EXTERNAL-SERVICES"] if "--dport 30081" in r]
    assert nodeport.endswith("-j DROP") and not nodeport.startswith("[0:0]")


def test_affinity_pins_a_client(ipt):
    """ClientIP affinity: after the first connection every new one from a1 reaches the same endpoint, and the
    xt_recent list of that endpoint's KUBE-SEP chain holds a1's address."""
    lab = ipt
    sticky = lab.services.add("sticky", 80, ["a2:8080", "b2:8080"], affinity=10800)
    backends = set()
    for _ in range(6):
        conn = lab.pod("a1").tcp("sticky", 80)
        cp = conn.open().result["sport"]
        (track,) = [r for r in lab.conntrack("node-a") if (r.src, r.sport) == ("198.18.1.11", cp)]
        backends.add(track.reply_src)
        conn.close()
    (pinned,) = backends
    sep = sep_chain(sticky, f"{pinned}:8080")
    recent = lab.exec("node-a", ["cat", f"/proc/net/xt_recent/{sep}"], check=True).stdout
    assert "src=198.18.1.11 " in recent


def test_terminating_endpoints_still_answer(ipt):
    """A Service whose every endpoint is terminating falls back to them (serving, not ready): a1 connects;
    a terminating endpoint beside a ready one gets no new connection."""
    lab = ipt
    lab.services.add("term", 80, [])
    lab.services.add_backend("term", "b2:8080", state="terminating")
    assert lab.pod("a1").tcp("term", 80).open().ok and _client(lab, "b2").startswith("198.18.1.11:")
    lab.services.add_backend("term", "b1:8080")
    chain = parse_tables(lab.services.iptables("node-a"))["nat"][svc_chain(lab.services.get("term"))]
    assert [r for r in chain if "->" in r] == [f'-m comment --comment "default/term -> 198.18.2.11:8080" -j '
                                               f'{sep_chain(lab.services.get("term"), "198.18.2.11:8080")}']


def test_service_without_endpoints_rejects(ipt):
    """A NodePort Service without endpoints: filter KUBE-EXTERNAL-SERVICES REJECTs at the node's INPUT, so
    connect() from outside and from a pod is refused and the REJECT rule counts both; with an endpoint the
    same connect() succeeds. (To its ClusterIP a pod gets ENETUNREACH from node-a's routing instead: the lab's
    nodes have no route for 198.19.0.0/16, a real node's default route would carry the packet to FORWARD and
    kube-proxy's REJECT in filter KUBE-SERVICES.)"""
    lab = ipt
    lab.services.add("empty", 80, [], type="NodePort", node_port=30090)
    assert _connect(lab, "ext", NODE_B, 30090) == "refused"
    assert _connect(lab, "a1", NODE_B, 30090) == "refused"
    rules = parse_tables(_save(lab, "node-b", "filter", counters=True), counters=True)["filter"]
    (reject,) = rules["KUBE-EXTERNAL-SERVICES"]
    assert reject.startswith("[2:") and reject.endswith("-j REJECT --reject-with icmp-port-unreachable")
    lab.services.add_backend("empty", "b1:8080")
    assert _connect(lab, "ext", NODE_B, 30090) == "connected"


def test_partial_sync_leaves_other_chains_and_counters(ipt):
    """A change to one Service rewrites its chains and kube-proxy's top-level ones; every other service's
    chains keep their rules and their packet counters (iptables-restore --noflush --counters)."""
    lab = ipt
    web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    np = lab.services.add("np", 80, ["b1:8080"])
    for name in ("web", "np"):
        conn = lab.pod("a1").tcp(name, 80)
        assert conn.open().ok
        conn.close()

    def counted():
        return parse_tables(_save(lab, "node-a", "nat", counters=True), counters=True)["nat"]
    before = counted()
    web_chains = [svc_chain(web)] + [sep_chain(web, f"{POD[p]}:8080") for p in ("b1", "b2")]
    assert any(not r.startswith("[0:0]") for c in web_chains for r in before[c])
    lab.services.add_backend("np", "b2:8080")  # a partial sync: np's chains and the top-level ones
    after = counted()
    assert {c: after[c] for c in web_chains} == {c: before[c] for c in web_chains}
    assert all(r.startswith("[0:0]") for r in after[svc_chain(np)] + after["KUBE-SERVICES"])
    assert any(not r.startswith("[0:0]") for r in before[svc_chain(np)])


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
