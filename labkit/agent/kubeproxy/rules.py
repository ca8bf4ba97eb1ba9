"""The ``iptables-restore`` input kube-proxy's ``syncProxyRules`` writes for one node
(kubernetes pkg/proxy/iptables/proxier.go, the v1.33/v1.34 line), line for line and
in its argument order.

One restore holds two tables. ``filter`` is always written whole; ``nat`` always
rewrites its top-level chains (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING,
KUBE-MARK-MASQ), but a **partial** sync writes the per-service chains (KUBE-SVC,
KUBE-SVL, KUBE-EXT, KUBE-SEP) only for the services that changed since the last sync,
and ``-X``-deletes the service chains that exist on the node but are no longer used.
A **full** sync writes every service's chains.

    >>> from labkit.agent.services import Services
    >>> from labkit.net.topology import Topology
    >>> topo = Topology.default("demo")
    >>> svcs = Services.in_memory(topo)
    >>> web = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    >>> text = render(svcs.list(), topo, "node-a").text
    >>> print("\\n".join(l for l in text.splitlines() if l.startswith("-A KUBE-SVC")))  # doctest: +NORMALIZE_WHITESPACE
    -A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web cluster IP" -m tcp -p tcp -d 198.19.0.10 --dport 80 ! -s 198.18.0.0/15 -j KUBE-MARK-MASQ
    -A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 198.18.2.11:8080" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-AYUPPDUJE3VKXBT5
    -A KUBE-SVC-LOLE4ISW44XBNF3G -m comment --comment "default/web -> 198.18.2.12:8080" -j KUBE-SEP-POV4HANKZOY4OMY6

The node's configuration (what kube-proxy would be started with, and what it finds
on the node) is a :class:`NodeOptions`; its defaults are kube-proxy's defaults on a
labkit node: ``--detect-local-mode ClusterCIDR`` with the pods' 198.18.0.0/15,
``--iptables-localhost-nodeports`` on, ``--random-fully`` (iptables 1.8.9 has it),
both nfacct counters available, and ``nf_conntrack_tcp_be_liberal`` on, as a labkit node sets it in
iptables mode (see :func:`labkit.agent.kubeproxy.sync.setup`), so there is no INVALID DROP rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable

from labkit.net.topology import POD_SUPERNET, Topology
from labkit.agent.kubeproxy.endpoints import Categorized, categorize, endpoints, external_policy_local, externally_accessible
from labkit.agent.kubeproxy.names import (
    MASQ_VALUE,
    ext_chain,
    is_service_chain,
    port_name,
    probability,
    proto,
    sep_chain,
    svc_chain,
    svl_chain,
)

__all__ = ["NodeOptions", "Restore", "render", "chain_line", "NFACCT_INVALID", "NFACCT_LOCALHOST",
           "FILTER_TOP", "NAT_TOP", "LARGE_CLUSTER_ENDPOINTS"]

#: metrics.IPTablesCTStateInvalidDroppedNFAcctCounter and metrics.LocalhostNodePortAcceptedNFAcctCounter
NFACCT_INVALID = "ct_state_invalid_dropped_pkts"
NFACCT_LOCALHOST = "localhost_nps_accepted_pkts"
#: the top-level chains every sync declares (and so flushes and refills), in kube-proxy's order
FILTER_TOP = ("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL")
NAT_TOP = ("KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ")
#: largeClusterEndpointsThreshold: with more endpoints than this in all services together, kube-proxy is in
#: "large cluster mode" and leaves the comments out of the KUBE-SVC/KUBE-SVL and KUBE-SEP rules
#: (appendServiceCommentLocked), which makes the restore input much smaller
LARGE_CLUSTER_ENDPOINTS = 1000
_MASQ = f"{MASQ_VALUE}/{MASQ_VALUE}"


@dataclass(frozen=True)
class NodeOptions:
    """kube-proxy's configuration on one node, and what it found there when it started."""

    cluster_cidr: str = str(POD_SUPERNET)  #: --detect-local-mode ClusterCIDR --cluster-cidr (None: NoOp detector)
    localhost_nodeports: bool = True  #: --iptables-localhost-nodeports (the default)
    random_fully: bool = True  #: iptables.HasRandomFully(): iptables >= 1.6.2
    tcp_be_liberal: bool = True  #: net.netfilter.nf_conntrack_tcp_be_liberal was set (a labkit node sets it)
    nfacct: frozenset = frozenset({NFACCT_INVALID, NFACCT_LOCALHOST})  #: counters nfacct.Ensure() could create
    self_masq: bool = True  #: False only under labkit's break-it fault kp-no-masq: no hairpin KUBE-MARK-MASQ


@dataclass(frozen=True)
class Restore:
    """One sync's restore input, the nat chains it keeps, the stale ones it deletes, and whether it was full."""

    text: str
    active: frozenset
    deleted: tuple
    full: bool
    large_cluster: bool = False  #: more than LARGE_CLUSTER_ENDPOINTS endpoints: no comments in service chains


@dataclass
class _Buffers:
    """proxier.filterChains/filterRules/natChains/natRules: lines in the order kube-proxy writes them."""

    filter_chains: list = field(default_factory=list)
    filter_rules: list = field(default_factory=list)
    nat_chains: list = field(default_factory=list)
    nat_rules: list = field(default_factory=list)

    def text(self) -> str:
        lines = (["*filter"] + self.filter_chains + self.filter_rules + ["COMMIT", "*nat"] + self.nat_chains
                 + self.nat_rules + ["COMMIT"])
        return "\n".join(lines) + "\n"


def chain_line(chain: str) -> str:
    """utiliptables.MakeChainLine: declares (and, with --noflush, flushes) a chain."""
    return f":{chain} - [0:0]"


def _q(text: str) -> str:
    return f'"{text}"'


def render(services: Iterable, topology: Topology, node: str, options: NodeOptions = NodeOptions(),
           changed: set | None = None, existing: Iterable[str] = ()) -> Restore:
    """The restore input of one sync on ``node``: full when ``changed`` is None, else partial (only the
    chains of the services named in ``changed``). ``existing`` are the nat chains ``iptables-save`` shows
    now; those that look like kube-proxy's service chains and are no longer used get ``-X``. With more than
    LARGE_CLUSTER_ENDPOINTS endpoints in all services, the service chains' rules carry no comments."""
    b = _Buffers()
    b.filter_chains += [chain_line(c) for c in FILTER_TOP]
    b.nat_chains += [chain_line(c) for c in NAT_TOP]
    _write_masquerade(b, options)
    if options.localhost_nodeports:
        _write_localnet_firewall(b)
    active: set[str] = set()
    services = sorted(services, key=port_name)
    large = sum(len(endpoints(svc, topology)) for svc in services) > LARGE_CLUSTER_ENDPOINTS
    for svc in services:
        use = categorize(endpoints(svc, topology), svc, node)
        rewrite = changed is None or svc.name in changed
        _write_service(b, svc, use, options, active, rewrite, large)
    deleted = tuple(sorted(c for c in set(existing) - active if is_service_chain(c)))
    for chain in deleted:
        b.nat_chains.append(chain_line(chain))  # declaring it flushes it; then it can go
        b.nat_rules.append(f"-X {chain}")
    _write_nodeports_jump(b, options)
    _write_forward(b, options)
    return Restore(b.text(), frozenset(active), deleted, changed is None, large)


def _write_masquerade(b: _Buffers, options: NodeOptions) -> None:
    """KUBE-POSTROUTING masquerades what KUBE-MARK-MASQ marked, once (the mark is cleared first)."""
    b.nat_rules.append(f"-A KUBE-POSTROUTING -m mark ! --mark {_MASQ} -j RETURN")
    b.nat_rules.append(f"-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_VALUE}")
    masq = '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE'
    b.nat_rules.append(masq + (" --random-fully" if options.random_fully else ""))
    b.nat_rules.append(f"-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_VALUE}")


def _write_localnet_firewall(b: _Buffers) -> None:
    """KUBE-FIREWALL (a copy of kubelet's): route_localnet must not let outsiders reach 127.0.0.0/8."""
    b.filter_chains.append(chain_line("KUBE-FIREWALL"))
    b.filter_rules.append('-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" '
                          "-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP")


def _write_nodeports_jump(b: _Buffers, options: NodeOptions) -> None:
    """The last rule of nat KUBE-SERVICES: anything to a local address may be a NodePort."""
    where = "-m addrtype --dst-type LOCAL" + ("" if options.localhost_nodeports else " ! -d 127.0.0.0/8")
    b.nat_rules.append('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the '
                       f'last rule in this chain" {where} -j KUBE-NODEPORTS')


def _write_forward(b: _Buffers, options: NodeOptions) -> None:
    """KUBE-FORWARD: drop INVALID (unless the kernel is liberal), accept marked and established traffic."""
    if not options.tcp_be_liberal:
        acct = f" -m nfacct --nfacct-name {NFACCT_INVALID}" if NFACCT_INVALID in options.nfacct else ""
        b.filter_rules.append(f"-A KUBE-FORWARD -m conntrack --ctstate INVALID{acct} -j DROP")
    b.filter_rules.append('-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" '
                          f"-m mark --mark {_MASQ} -j ACCEPT")
    b.filter_rules.append('-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
                          "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")


# -- one service ---------------------------------------------------------------------
@dataclass(frozen=True)
class _Svc:
    """What syncProxyRules works out for one service port before it writes anything."""

    svc: object
    use: Categorized
    has_external: bool  #: hasExternalEndpoints
    filter_target: str  #: REJECT (no endpoints at all) or DROP (none on this node for eTP Local); "" if neither
    filter_comment: str
    large_cluster: bool = False  #: proxier.largeClusterMode: service chain rules without comments

    def comment(self, text: str) -> str:
        """appendServiceCommentLocked: `` -m comment --comment <text>``, or nothing in large cluster mode."""
        return "" if self.large_cluster else f" -m comment --comment {text}"

    @property
    def name(self) -> str:
        return port_name(self.svc)

    @property
    def match(self) -> str:
        p = proto(self.svc)
        return f"-m {p} -p {p}"

    def to(self, chain: str, comment: str, address: str, target: str, also: str = "") -> str:
        """A rule in ``chain`` for packets to ``address`` on the service's port, as kube-proxy orders it:
        comment, protocol, destination, port, then ``also``, then the jump."""
        return (f"-A {chain} -m comment --comment {comment} {self.match} -d {address} --dport {self.svc.port}"
                f"{also} -j {target}")


def _plan(svc, use: Categorized) -> _Svc:
    has_external = use.has_any and (not external_policy_local(svc) or bool(use.local))
    if not use.has_any:
        return _Svc(svc, use, False, "REJECT", _q(f"{port_name(svc)} has no endpoints"))
    if not has_external:
        return _Svc(svc, use, False, "DROP", _q(f"{port_name(svc)} has no local endpoints"))
    return _Svc(svc, use, True, "", "")


def _write_service(b: _Buffers, svc, use: Categorized, options: NodeOptions, active: set, rewrite: bool,
                   large: bool = False) -> None:
    """Everything one service port adds: top-level rules always, its own chains only if ``rewrite``."""
    s = replace(_plan(svc, use), large_cluster=large)
    _capture_cluster_ip(b, s)
    _capture_load_balancer(b, s)
    _capture_node_port(b, s, options)
    chains, rules = (b.nat_chains, b.nat_rules) if rewrite else ([], [])  # a partial sync skips unchanged chains
    _write_internal(rules, s, options)
    _write_external(chains, rules, s, options, active)
    _write_policy_chain(chains, rules, s, svc_chain(svc), use.cluster, active)
    if external_policy_local(svc):
        _write_policy_chain(chains, rules, s, svl_chain(svc), use.local, active)
    for ep in use.reachable:
        _write_endpoint_chain(chains, rules, s, ep, active, options)


def _capture_cluster_ip(b: _Buffers, s: _Svc) -> None:
    svc = s.svc
    if s.use.has_any:
        b.nat_rules.append(s.to("KUBE-SERVICES", _q(s.name + " cluster IP"), svc.vip, svc_chain(svc)))
    else:
        b.filter_rules.append(s.to("KUBE-SERVICES", s.filter_comment, svc.vip, s.filter_target))


def _capture_load_balancer(b: _Buffers, s: _Svc) -> None:
    svc = s.svc
    if not svc.lb_vip:
        return
    if s.use.has_any:
        b.nat_rules.append(s.to("KUBE-SERVICES", _q(s.name + " loadbalancer IP"), svc.lb_vip, ext_chain(svc)))
    if not s.has_external:
        b.filter_rules.append(s.to("KUBE-EXTERNAL-SERVICES", s.filter_comment, svc.lb_vip, s.filter_target))


def _capture_node_port(b: _Buffers, s: _Svc, options: NodeOptions) -> None:
    svc = s.svc
    if not svc.node_port:
        return
    if s.use.has_any:
        if options.localhost_nodeports and NFACCT_LOCALHOST in options.nfacct:
            b.nat_rules.append(f"-A KUBE-NODEPORTS -m comment --comment {s.name} {s.match} -d 127.0.0.0/8 "
                               f"--dport {svc.node_port} -m nfacct --nfacct-name {NFACCT_LOCALHOST} "
                               f"-j {ext_chain(svc)}")
        b.nat_rules.append(f"-A KUBE-NODEPORTS -m comment --comment {s.name} {s.match} "
                           f"--dport {svc.node_port} -j {ext_chain(svc)}")
    if not s.has_external:
        b.filter_rules.append(f"-A KUBE-EXTERNAL-SERVICES -m comment --comment {s.filter_comment} "
                              f"-m addrtype --dst-type LOCAL {s.match} --dport {svc.node_port} -j {s.filter_target}")


def _write_internal(rules: list, s: _Svc, options: NodeOptions) -> None:
    """Masquerade off-cluster clients of the ClusterIP (the local-traffic detector's IfNotLocal)."""
    svc = s.svc
    if s.use.has_any and options.cluster_cidr:
        rules.append(s.to(svc_chain(svc), _q(s.name + " cluster IP"), svc.vip, "KUBE-MARK-MASQ",
                          f" ! -s {options.cluster_cidr}"))


def _write_external(chains: list, rules: list, s: _Svc, options: NodeOptions, active: set) -> None:
    """KUBE-EXT: mark for masquerade (Cluster policy), or the short-circuits of Local policy, then the policy chain."""
    svc = s.svc
    if not (s.use.has_any and externally_accessible(svc)):
        return
    ext = ext_chain(svc)
    chains.append(chain_line(ext))
    active.add(ext)
    if not external_policy_local(svc):
        rules.append(f"-A {ext} -m comment --comment {_q(f'masquerade traffic for {s.name} external destinations')} "
                     "-j KUBE-MARK-MASQ")
    else:
        if options.cluster_cidr:
            rules.append(f"-A {ext} -m comment --comment {_q(f'pod traffic for {s.name} external destinations')} "
                         f"-s {options.cluster_cidr} -j {svc_chain(svc)}")
        rules.append(f"-A {ext} -m comment --comment "
                     f"{_q(f'masquerade LOCAL traffic for {s.name} external destinations')} "
                     "-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ")
        rules.append(f"-A {ext} -m comment --comment {_q(f'route LOCAL traffic for {s.name} external destinations')} "
                     f"-m addrtype --src-type LOCAL -j {svc_chain(svc)}")
    if s.has_external:
        rules.append(f"-A {ext} -j {svl_chain(svc) if external_policy_local(svc) else svc_chain(svc)}")


def _write_policy_chain(chains: list, rules: list, s: _Svc, chain: str, eps: tuple, active: set) -> None:
    """writeServiceToEndpointRules: affinity checks first, then one rule per endpoint, 1/n of what is left."""
    if not eps:
        return
    chains.append(chain_line(chain))
    active.add(chain)
    svc = s.svc
    if svc.affinity_timeout:
        for ep in eps:
            sep = sep_chain(svc, str(ep))
            rules.append(f"-A {chain}{s.comment(_q(f'{s.name} -> {ep}'))} -m recent --name {sep} "
                         f"--rcheck --seconds {svc.affinity_timeout} --reap -j {sep}")
    for i, ep in enumerate(eps):
        pick = f" -m statistic --mode random --probability {probability(len(eps) - i)}" if i < len(eps) - 1 else ""
        rules.append(f"-A {chain}{s.comment(_q(f'{s.name} -> {ep}'))}{pick} -j {sep_chain(svc, str(ep))}")


def _write_endpoint_chain(chains: list, rules: list, s: _Svc, ep, active: set, options: NodeOptions) -> None:
    """KUBE-SEP: mark hairpin traffic (the endpoint is its own client), remember the client for affinity, DNAT."""
    svc = s.svc
    sep = sep_chain(svc, str(ep))
    chains.append(chain_line(sep))
    active.add(sep)
    if options.self_masq:
        rules.append(f"-A {sep}{s.comment(s.name)} -s {ep.ip} -j KUBE-MARK-MASQ")
    recent = f" -m recent --name {sep} --set" if svc.affinity_timeout else ""
    rules.append(f"-A {sep}{s.comment(s.name)}{recent} {s.match} -j DNAT --to-destination {ep}")
