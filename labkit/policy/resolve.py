"""From endpoints and policies to each endpoint's policy map, as Cilium v1.16 computes it
(pkg/policy/mapstate.go), and the datapath's lookup over that map (bpf/lib/policy.h).

An endpoint is *selected* in a direction when a policy's ``endpointSelector`` matches it
and that rule has an ``ingress``/``ingressDeny`` (or egress) section; then the direction is
default-deny: only what the map allows passes. A direction nobody selects gets the
allow-all key (identity 0, every protocol and port). Ingress from the node itself
(``reserved:host``) is always allowed (``allow-localhost``, the default).

Every rule becomes keys ``(identity or 0, direction, protocol, port/prefix)``; deny
keys win over the allow keys they cover (same identity or identity 0, broader or equal
protocol/port), and where the datapath would otherwise prefer a narrower identity-0 allow
over a broader identity-specific deny, a dependent deny key is added — exactly
mapstate.go's ``denyPreferredInsertWithChanges``. An egress ``toPorts`` item with ``rules.dns``
gives its allow keys the DNS proxy's port (:data:`DNS_PROXY_PORT`; pkg/policy l4.go: an L7 rule
makes the filter a redirect, and mapstate.go's entry for it carries ``ProxyPort``); where a
redirect and a plain allow meet on one key the redirect is kept (mapstate.go ``Merge``: the entry
with a proxy port wins). Not modelled: auth types, other L7 redirects, incremental changes.

    >>> from labkit.policy.identity import IdentityAllocator, pod_labels
    >>> from labkit.policy.rules import parse_policies
    >>> alloc = IdentityAllocator()
    >>> eps = [Endpoint(n, pod_labels({"app": n}), alloc.allocate(pod_labels({"app": n})), ip)
    ...        for n, ip in (("web", "198.18.1.11"), ("client", "198.18.1.12"))]
    >>> pols = parse_policies('''
    ... apiVersion: cilium.io/v2
    ... kind: CiliumNetworkPolicy
    ... metadata: {name: web}
    ... spec:
    ...   endpointSelector: {matchLabels: {app: web}}
    ...   ingress: [{fromEndpoints: [{matchLabels: {app: client}}], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}]
    ... ''')
    >>> res = resolve(eps, pols, alloc)
    >>> web = res.endpoints["web"]
    >>> web.ingress_enforced, web.egress_enforced
    (True, False)
    >>> [str(k) for k in web.keys()]
    ['Ingress: 1 ANY', 'Ingress: 257 8080/TCP', 'Egress: 0 ANY']
    >>> print("\\n".join(line.rstrip() for line in web.lines(alloc)))  # doctest: +NORMALIZE_WHITESPACE
    POLICY DIRECTION LABELS (source:key[=value]) PORT/PROTO PROXY PORT AUTH TYPE BYTES PACKETS PREFIX
    Allow Ingress reserved:host ANY NONE disabled 0 0 0
    Allow Ingress k8s:app=client 8080/TCP NONE disabled 0 0 24
    k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default
    k8s:io.cilium.k8s.policy.cluster=default
    k8s:io.cilium.k8s.policy.serviceaccount=default
    k8s:io.kubernetes.pod.namespace=default
    Allow Egress reserved:unknown ANY NONE disabled 0 0 0
    >>> web.verdict(257, Direction.INGRESS, 6, 8080).allowed, web.verdict(257, Direction.INGRESS, 6, 22).allowed
    (True, False)
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from labkit.config import POLICY_MODES
from labkit.errors import PolicyError
from labkit.maps.policy import (
    DPORT_BITS,
    Direction,
    PolicyEntry,
    PolicyKey,
    PolicyRow,
    policy_get_lines,
)
from labkit.policy.identity import (
    IDENTITY_HOST,
    RESERVED_NAMES,
    IdentityAllocator,
    LabelSet,
    reserved_labels,
)
from labkit.policy.mapstate import MapState
from labkit.policy.matchpattern import fqdn, matches
from labkit.policy.rules import FqdnSelector, PeerRule, Policy, PortProto, Rule

__all__ = [
    "ENFORCEMENT_MODES",
    "Endpoint",
    "Verdict",
    "EndpointPolicy",
    "Resolution",
    "resolve",
    "masked_ports",
    "covers",
    "DNS_PROXY_PORT",
    "fqdn_selects",
]

#: The DNS proxy's port in every node (labkit's choice, fixed). Cilium v1.16 lets the OS pick it
#: unless --tofqdns-proxy-port is set (pkg/proxy: the DNS proxy's port, restored across restarts);
#: a fixed port keeps ``labkit policy get`` stable from run to run.
DNS_PROXY_PORT = 10053

_PROTO_NUMBERS = {"TCP": 6, "UDP": 17, "SCTP": 132}
#: pkg/policy/l4.go: a ports item with protocol ANY stands for these three.
_ANY_EXPANDS_TO = ("TCP", "UDP", "SCTP")
#: Entities that are sets of reserved identities (pkg/policy/api/entity.go EntitySelectorMapping);
#: "cluster" adds every pod identity, "world" every CIDR identity (they carry reserved:world),
#: "all" is the wildcard identity 0.
_CLUSTER_RESERVED = ("host", "remote-node", "init", "ingress", "health", "unmanaged", "kube-apiserver")
#: Entities that stand for more than their own label (pkg/policy/api/entity.go:94-96@82999990): world is three
#: selectors, reserved:world, reserved:world-ipv4 and reserved:world-ipv6 — identities 2, 9 and 10, which the
#: selector cache holds on every node, single-stack too (pkg/identity/reserved.go:55-59@82999990).
_ENTITY_LABELS = {"world": ("world", "world-ipv4", "world-ipv6")}
#: --policy-enforcement (pkg/option): pkg/policy/repository.go computePolicyEnforcementAndRules enforces
#: both directions of every endpoint with "always", neither with "never", and with "default" a direction
#: only once a rule selecting the endpoint has rules in it.
ENFORCEMENT_MODES = POLICY_MODES  # the agent's modes are the datapath's (DatapathConfig.policy)


@dataclass(frozen=True)
class Endpoint:
    """A pod as policy sees it: its name, labels, identity and address."""

    name: str
    labels: LabelSet
    identity: int
    ip: str


@dataclass(frozen=True)
class Verdict:
    """The datapath's answer for one packet: allowed or not, which step of policy.h's
    lookup matched (``L3-L4``, ``L4-only``, ``L3-proto``, ``proto-only``, ``L3-only``,
    ``all``, or ``none``), and the key that matched."""

    allowed: bool
    match: str
    key: PolicyKey | None = None


def masked_ports(start: int, end: int = 0) -> list[tuple[int, int]]:
    """A port range as (port, mask) prefixes for the LPM key: the smallest set of aligned
    blocks covering ``port``..``endPort``. That set is unique, so it is the set Cilium's
    PortRangeToMaskedPorts (pkg/policy) returns, though Cilium lists it in another order.

    >>> [(p, hex(m)) for p, m in masked_ports(9000, 9010)]
    [(9000, '0xfff8'), (9008, '0xfffe'), (9010, '0xffff')]
    """
    if not end or end == start:
        return [(start, 0xFFFF)]
    out = []
    port = start
    while port <= end:
        size = port & -port if port else 1 << DPORT_BITS
        while port + size - 1 > end:
            size >>= 1
        out.append((port, (0xFFFF << (size.bit_length() - 1)) & 0xFFFF))
        port += size
    return out


def covers(a: PolicyKey, b: PolicyKey) -> bool:
    """Whether key ``a``'s protocol/port is broader than or equal to ``b``'s (same direction;
    identities are not compared).

    >>> covers(PolicyKey.make(0, Direction.INGRESS, 6), PolicyKey.make(5, Direction.INGRESS, 6, 80))
    True
    """
    if a.egress != b.egress or a.l4_prefix > b.l4_prefix:
        return False
    if a.l4_prefix == 0:
        return True
    if a.protocol != b.protocol:
        return False
    mask = a.port_mask()
    return (a.dport & mask) == (b.dport & mask)


def _l4_keys(identity: int, direction: Direction, ports: Sequence[PortProto]) -> list[PolicyKey]:
    if not ports:
        return [PolicyKey.make(identity, direction)]
    out = []
    for pp in ports:
        for proto in (_ANY_EXPANDS_TO if pp.protocol == "ANY" else (pp.protocol,)):
            if pp.port == 0:
                out.append(PolicyKey.make(identity, direction, _PROTO_NUMBERS[proto]))
                continue
            for port, mask in masked_ports(pp.port, pp.end_port):
                out.append(PolicyKey.make(identity, direction, _PROTO_NUMBERS[proto], port, mask))
    return out


@dataclass
class EndpointPolicy:
    """One endpoint's resolved policy: enforcement per direction and its map rows."""

    endpoint: Endpoint
    ingress_enforced: bool
    egress_enforced: bool
    rows: list[PolicyRow]
    selected_by: list[str] = field(default_factory=list)  #: "policy/spec" paths that select it

    def keys(self) -> list[PolicyKey]:
        """The keys, in ``cilium-dbg bpf policy get`` order."""
        return [r.key for r in self.rows]

    def lines(self, alloc: IdentityAllocator, numeric: bool = False) -> list[str]:
        """The map as ``cilium-dbg bpf policy get`` prints it, labels from ``alloc``
        (identity 0 is ``reserved:unknown``, as v1.16 prints it)."""
        def labels(ident: int) -> list[str]:
            return ["reserved:unknown"] if ident == 0 else alloc.labels(ident).printable()
        return policy_get_lines(self.rows, labels, numeric)

    def entries(self) -> dict[PolicyKey, PolicyEntry]:
        """The map contents: key → entry."""
        return {r.key: r.entry for r in self.rows}

    def verdict(self, identity: int, direction: Direction, proto: int, dport: int) -> Verdict:
        """What bpf/lib/policy.h ``__policy_can_access`` (v1.16) decides for a packet from/to
        ``identity``: two LPM lookups (the identity's, then identity 0) and six precedence
        steps: L3/L4, L4-only, L3-proto, proto-only, L3-only, all; no match is a drop."""
        def lookup(ident: int) -> PolicyKey | None:
            pkt = PolicyKey.make(ident, direction, proto, dport)
            best = None
            for k in self.keys():
                if k.sec_label == ident and k.egress == int(direction) and covers(k, pkt):
                    if best is None or k.l4_prefix > best.l4_prefix:
                        best = k
            return best

        entries = self.entries()
        policy, l4policy = lookup(identity), lookup(0)

        def done(key: PolicyKey, match: str) -> Verdict:
            return Verdict(not entries[key].is_deny, match, key)

        if policy is not None and policy.dport_be != 0:
            return done(policy, "L3-L4")
        if l4policy is not None and l4policy.dport_be != 0:
            return done(l4policy, "L4-only")
        if policy is not None and policy.protocol != 0:
            return done(policy, "L3-proto")
        if l4policy is not None and l4policy.protocol != 0:
            return done(l4policy, "proto-only")
        if policy is not None:
            return done(policy, "L3-only")
        if l4policy is not None:
            return done(l4policy, "all")
        return Verdict(False, "none")


@dataclass
class Resolution:
    """Every endpoint's policy, and the warnings (selectors that match nothing)."""

    endpoints: dict[str, EndpointPolicy]
    warnings: list[str]
    #: every cached IP a toFQDNs selector picks out → its identity (the ipcache entries the agent writes)
    fqdn_ids: dict[str, int] = field(default_factory=dict)


def _prefix_key(net, length: int | None = None) -> tuple[int, int, int]:
    """(family, length, the address's first ``length`` bits): equal for ``net`` cut to ``length`` bits and for
    the prefix of that length containing it, so "which prefixes lie inside X" is one lookup.

    >>> _prefix_key(ipaddress.ip_network("198.51.100.7/32"), 24) == _prefix_key(ipaddress.ip_network("198.51.100.0/24"))
    True
    """
    length = net.prefixlen if length is None else length
    return net.version, length, int(net.network_address) >> (net.max_prefixlen - length)


class _Peers:
    """The identities a peer rule selects, from the endpoints, reserved and CIDR identities."""

    def __init__(self, endpoints: Sequence[Endpoint], alloc: IdentityAllocator, fqdns: Mapping[str, Iterable[str]]):
        self.alloc = alloc
        self.fqdns = {fqdn(n): list(ips) for n, ips in fqdns.items()}
        self.pods = {ep.identity: ep.labels for ep in endpoints}
        self.reserved = {num: reserved_labels(num) for num in RESERVED_NAMES if num}
        self.fqdn_ids: dict[str, int] = {}
        #: _prefix_key of every prefix containing a CIDR identity's → those identities (a rule may list thousands
        #: of prefixes: comparing each with every CIDR identity is quadratic)
        self._inside: dict[tuple[int, int, int], set[int]] = {}
        self._indexed: set[int] = set()

    def universe(self) -> dict[int, LabelSet]:
        out = dict(self.reserved)
        out.update(self.pods)
        out.update(dict(self.alloc))
        return out

    def cidr_ids(self, cidr: str, excepts: Sequence[str]) -> set[int]:
        base = ipaddress.ip_network(cidr)
        self.alloc.allocate_cidr(cidr)
        for e in excepts:
            self.alloc.allocate_cidr(e)
        for ident, net in self.alloc.cidr_networks().items():
            if ident not in self._indexed:
                self._indexed.add(ident)
                for length in range(net.prefixlen + 1):
                    self._inside.setdefault(_prefix_key(net, length), set()).add(ident)
        out = set(self._inside.get(_prefix_key(base), ()))
        for e in excepts:
            out -= self._inside.get(_prefix_key(ipaddress.ip_network(e)), set())
        if base.prefixlen == 0 and not excepts:
            out.add(2)  # 0.0.0.0/0 is the world identity too
        return out

    def entity_ids(self, entity: str) -> set[int] | None:
        """Identities of an entity; None for "all" (the wildcard identity 0)."""
        got = self.entity_selectors(entity)
        if got is None:
            return None
        return set().union(*(ids for _, ids in got))

    def entity_selectors(self, entity: str) -> list[tuple[str, set[int]]] | None:
        """An entity's selectors, each with the identities it selects; None for "all" (identity 0)."""
        if entity == "all":
            return None
        if entity == "none":
            return []
        universe = self.universe()
        if entity == "cluster":
            names = set(_CLUSTER_RESERVED)
            return [("entity:cluster", set(self.pods) | {i for i, ls in self.reserved.items()
                                                          if any(lbl.key in names for lbl in ls)})]
        return [(f"reserved:{key}", {i for i, ls in universe.items()
                                      if any(lbl.source == "reserved" and lbl.key == key for lbl in ls)})
                for key in _ENTITY_LABELS.get(entity, (entity,))]

    def select(self, rule: PeerRule, warnings: list[str], where: str) -> set[int] | None:
        """The rule's peer identities; None means "any identity" (key identity 0)."""
        owned = self.select_owned(rule, warnings, where)
        if any(ids is None for _, ids in owned):
            return None
        return set().union(*(ids for _, ids in owned))

    def select_owned(self, rule: PeerRule, warnings: list[str], where: str) -> list[tuple[str, set[int] | None]]:
        """The rule's peer selectors, each as (the selector, its identities): Cilium's cached selectors, the
        owners of the map entries they make. None for identities means "any identity" (key identity 0)."""
        if not rule.l3_given:
            return [("wildcard", None)] if rule.ports else []  # L4-only rule, or an empty rule selecting nothing
        out: list[tuple[str, set[int] | None]] = []
        universe = self.universe()
        for i, sel in enumerate(rule.endpoints or ()):
            hit = {ident for ident, ls in universe.items() if sel.matches(ls)}
            if not hit:
                warnings.append(f"{where}.{'from' if rule.direction == 'ingress' else 'to'}Endpoints[{i}] "
                                f"({sel}) selects no endpoint")
            out.append((f"endpoints:{sel}", hit))
        for c in rule.cidrs or ():
            out.append((f"cidr:{c.cidr} except {sorted(c.except_)}", self.cidr_ids(c.cidr, c.except_)))
        for e in rule.entities or ():
            got = self.entity_selectors(e)
            out += [("wildcard", None)] if got is None else got
        for f in rule.fqdns or ():
            ids: set[int] = set()
            for name, ips in self.fqdns.items():
                if fqdn_selects(f, name):
                    ids |= {self.fqdn_ids[ip] for ip in ips}
            out.append((f"fqdn:{f.match_name or f.match_pattern}", ids))
        return out

    def learn(self, selectors: Sequence[FqdnSelector]) -> None:
        """Give every cached IP its v1.16 FQDN identity: one per set of selectors that select
        any of the names the IP answered for (selector labels, not the address)."""
        by_ip: dict[str, set[str]] = {}
        for name, ips in self.fqdns.items():
            for sel in selectors:
                if fqdn_selects(sel, name):
                    for ip in ips:
                        by_ip.setdefault(ip, set()).add(sel.match_name or sel.match_pattern)
        self.fqdn_ids = {ip: self.alloc.allocate_fqdn(sels) for ip, sels in by_ip.items()}


def fqdn_selects(sel: FqdnSelector, name: str) -> bool:
    """Whether a toFQDNs or DNS rule item selects ``name`` (a full name with its final dot): matchName
    exactly, matchPattern by its anchored regex (pkg/fqdn/matchpattern)."""
    if sel.match_name:
        return fqdn(sel.match_name) == name
    return matches(sel.match_pattern, name)


def _enforced(rules: Sequence[Rule], direction: str) -> tuple[bool, bool]:
    """(has rules in this direction, default-deny on)."""
    has = [r for r in rules if (r.has_ingress if direction == "ingress" else r.has_egress)]
    flags = [r.default_deny_ingress if direction == "ingress" else r.default_deny_egress for r in has]
    return bool(has), any(f is not False for f in flags)


def resolve(endpoints: Sequence[Endpoint], policies: Sequence[Policy], alloc: IdentityAllocator,
            fqdn_cache: Mapping[str, Iterable[str]] | None = None, allow_localhost: bool = True,
            enforcement: str = "default") -> Resolution:
    """Each endpoint's enforcement and policy map rows, and warnings for selectors that match
    no endpoint (allowed, as Cilium allows them). ``fqdn_cache`` maps names the DNS proxy has
    seen to their IPs; each IP a toFQDNs selector picks out gets a local identity labelled by
    the selectors that pick it (``fqdn:<selector>``, allocated in ``alloc``), and the rules
    select those identities. toCIDR prefixes and their ``except`` prefixes get their CIDR
    identities in ``alloc`` too: the ipcache entries the agent must write for them.
    ``enforcement`` is the agent's policy enforcement mode (:data:`ENFORCEMENT_MODES`)."""
    if enforcement not in ENFORCEMENT_MODES:
        raise PolicyError(f"policy enforcement mode: expected one of {', '.join(ENFORCEMENT_MODES)}, got {enforcement!r}")
    warnings: list[str] = []
    peers = _Peers(endpoints, alloc, fqdn_cache or {})
    peers.learn([f for pol in policies for rule in pol.rules for pr in rule.egress for f in (pr.fqdns or ())])
    for pol in policies:
        for rule in pol.rules:
            if not any(rule.endpoint_selector.matches(ep.labels) for ep in endpoints):
                warnings.append(f"{pol.name}: {rule.path}.endpointSelector ({rule.endpoint_selector}) selects no endpoint")
    out: dict[str, EndpointPolicy] = {}

    known: dict = {}

    def nets(ident: int):
        if ident not in known:
            known.update(alloc.cidr_networks())
        net = known.get(ident)
        return (net,) if net is not None else ()

    for ep in endpoints:
        # "never": computePolicyEnforcementAndRules returns no matching rules at all
        selecting = [] if enforcement == "never" else [
            (pol, rule) for pol in policies for rule in pol.rules if rule.endpoint_selector.matches(ep.labels)]
        rules = [r for _, r in selecting]
        ms = MapState(nets)
        enforced = {}
        for direction, dir_enum in (("ingress", Direction.INGRESS), ("egress", Direction.EGRESS)):
            has, deny_default = _enforced(rules, direction)
            enforced[direction] = enforcement == "always" or (enforcement == "default" and has and deny_default)
            if not enforced[direction]:
                ms.allow_all(PolicyKey.make(0, dir_enum))  # allowAllIdentities (pkg/policy/resolve.go:113-116)
        for direction, dir_enum in (("ingress", Direction.INGRESS), ("egress", Direction.EGRESS)):
            # denies first, then allows: mapstate.go's result does not depend on the order
            items = [(pol, rule, pr) for pol, rule in selecting
                     for pr in (rule.ingress if direction == "ingress" else rule.egress)]
            for pol, rule, pr in sorted(items, key=lambda t: not t[2].deny):
                for owner, ids in peers.select_owned(pr, warnings, f"{pol.name}: {pr.path}"):
                    for ident in ([0] if ids is None else sorted(ids)):
                        for pp in (pr.ports or (None,)):
                            proxy = DNS_PROXY_PORT if pp is not None and pp.dns is not None and not pr.deny else 0
                            for key in _l4_keys(ident, dir_enum, () if pp is None else (pp,)):
                                ms.insert(key, deny=pr.deny, proxy_port=proxy, owner=owner)
        if allow_localhost:
            # determineAllowLocalhostIngress, after the rules and whether ingress is enforced or not
            # (pkg/policy/resolve.go:134-137, mapstate.go:1509-1519@82999990)
            ms.insert(PolicyKey.make(IDENTITY_HOST, Direction.INGRESS), deny=False)
        out[ep.name] = EndpointPolicy(ep, enforced["ingress"], enforced["egress"], ms.rows(),
                                      [f"{p.name}/{r.path}" for p, r in selecting])
    # a selector warning is reported once, however many endpoints the rule applies to
    return Resolution(out, list(dict.fromkeys(warnings)), dict(peers.fqdn_ids))
