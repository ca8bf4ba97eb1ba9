"""labkit.policy.resolve: enforcement, policy map keys with deny precedence, and the datapath lookup over them."""
from __future__ import annotations

import pytest

from labkit.errors import PolicyError
from labkit.maps.policy import Direction, PolicyKey
from labkit.policy.identity import IdentityAllocator, pod_labels
from labkit.policy.resolve import Endpoint, covers, masked_ports, resolve
from labkit.policy.rules import parse_policies

IN, EG = Direction.INGRESS, Direction.EGRESS
TCP, UDP, SCTP = 6, 17, 132


def lab():
    """Three pods: web 256, client 257, db 258."""
    alloc = IdentityAllocator()
    eps = []
    for i, app in enumerate(("web", "client", "db")):
        labels = pod_labels({"app": app})
        eps.append(Endpoint(app, labels, alloc.allocate(labels), f"198.18.1.{11 + i}"))
    return eps, alloc


def policy(spec: str, name: str = "p"):
    return parse_policies(f"apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {{name: {name}}}\n" + spec)


def keys(ep_policy):
    return sorted((str(r.key), r.entry.is_deny) for r in ep_policy.rows)


def run(spec: str, fqdn_cache=None, pod="web"):
    eps, alloc = lab()
    res = resolve(eps, policy(spec), alloc, fqdn_cache)
    return res, res.endpoints[pod], alloc


def test_unselected_endpoint_allows_all():
    """mapstate.go allowAllIdentities: a direction no rule selects gets the identity-0 any-port allow key; ingress
    from reserved:host is in the map all the same: DistillPolicy calls determineAllowLocalhostIngress for every
    endpoint, enforced or not (pkg/policy/resolve.go:113-116 and 134-137@82999990, mapstate.go:1509-1519@82999990)."""
    res, web, _ = run("spec: {endpointSelector: {matchLabels: {app: db}}, ingress: [{}]}")
    assert (web.ingress_enforced, web.egress_enforced) == (False, False)
    assert keys(web) == [("Egress: 0 ANY", False), ("Ingress: 0 ANY", False), ("Ingress: 1 ANY", False)]
    assert web.verdict(2, IN, TCP, 80).allowed


def test_default_deny_once_selected_with_localhost():
    """`ingress: [{}]` selects the pod and allows nothing: default deny, except reserved:host (determineAllowLocalhostIngress)."""
    res, db, _ = run("spec: {endpointSelector: {matchLabels: {app: db}}, ingress: [{}]}", pod="db")
    assert db.ingress_enforced and not db.egress_enforced
    assert keys(db) == [("Egress: 0 ANY", False), ("Ingress: 1 ANY", False)]
    v = db.verdict(256, IN, TCP, 5432)
    assert not v.allowed and v.match == "none"
    assert db.verdict(1, IN, TCP, 5432).allowed


def test_allow_from_label_l3_l4():
    """fromEndpoints + toPorts gives one (identity, port/proto) key per selected identity."""
    _, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: client}}], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}]
""")
    assert ("Ingress: 257 8080/TCP", False) in keys(web)
    assert web.verdict(257, IN, TCP, 8080).match == "L3-L4"
    assert not web.verdict(258, IN, TCP, 8080).allowed
    assert not web.verdict(257, IN, UDP, 8080).allowed


def test_allow_port_only_is_identity_zero():
    """toPorts without a peer is L4-only: identity 0 (policy.h step 2, ANY/proto/port)."""
    _, web, _ = run("spec: {endpointSelector: {matchLabels: {app: web}}, ingress: [{toPorts: [{ports: [{port: '80', protocol: TCP}]}]}]}")
    assert ("Ingress: 0 80/TCP", False) in keys(web)
    v = web.verdict(2, IN, TCP, 80)
    assert v.allowed and v.match == "L4-only"


def test_protocol_any_expands():
    """A ports item without protocol (ANY) stands for TCP, UDP and SCTP (pkg/policy/l4.go)."""
    _, web, _ = run("spec: {endpointSelector: {matchLabels: {app: web}}, ingress: [{toPorts: [{ports: [{port: '53'}]}]}]}")
    assert {k for k, _ in keys(web)} >= {"Ingress: 0 53/TCP", "Ingress: 0 53/UDP", "Ingress: 0 53/SCTP"}


def test_deny_overrides_allow_and_removes_covered_allows():
    """A deny key deletes the allow keys it covers (same or any identity, broader-or-equal L4): mapstate.go."""
    _, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: client}}], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}]
  ingressDeny: [{fromEndpoints: [{matchLabels: {app: client}}]}]
""")
    assert ("Ingress: 257 8080/TCP", False) not in keys(web)
    assert ("Ingress: 257 ANY", True) in keys(web)
    v = web.verdict(257, IN, TCP, 8080)
    assert not v.allowed and v.match == "L3-only"


def test_allow_covered_by_existing_deny_bails():
    """An allow inserted under a broader deny for any identity is never written (bail if covered by a deny key)."""
    _, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingressDeny: [{toPorts: [{ports: [{port: "0", protocol: TCP}]}]}]
  ingress: [{fromEndpoints: [{matchLabels: {app: client}}], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}]
""")
    assert [k for k, deny in keys(web) if k.startswith("Ingress") and not deny] == ["Ingress: 1 ANY"]
    assert not web.verdict(257, IN, TCP, 8080).allowed


def test_dependent_deny_for_narrower_l4_only_allow():
    """An identity-specific L3 deny plus a narrower identity-0 allow adds (deny id, allow L4) as a deny,
    or policy.h's step 2 (L4-only) would let the packet through (mapstate.go insertDependentOfKey)."""
    _, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{toPorts: [{ports: [{port: "80", protocol: TCP}]}]}]
  ingressDeny: [{fromEndpoints: [{matchLabels: {app: client}}]}]
""")
    assert ("Ingress: 257 80/TCP", True) in keys(web)
    assert not web.verdict(257, IN, TCP, 80).allowed
    assert web.verdict(258, IN, TCP, 80).allowed


def test_to_cidr_with_except():
    """toCIDRSet: the prefix's CIDR identity is allowed, the except prefix gets its own identity and is not."""
    res, web, alloc = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress: [{toCIDRSet: [{cidr: 198.51.100.0/24, except: [198.51.100.128/25]}]}]
""")
    allowed = [k for k, _ in keys(web) if k.startswith("Egress")]
    net_id = alloc.allocate_cidr("198.51.100.0/24")
    exc_id = alloc.allocate_cidr("198.51.100.128/25")
    assert allowed == [f"Egress: {net_id} ANY"]
    assert web.egress_enforced and not web.verdict(exc_id, EG, TCP, 80).allowed
    assert web.verdict(net_id, EG, TCP, 80).allowed


def test_cidr_rules_select_every_prefix_inside_them():
    """A toCIDRSet prefix selects exactly the CIDR identities already allocated whose prefix lies inside it and not
    inside its except (ipaddress subnet_of, computed here pair by pair), IPv6 ones never; a thousand /32s in one
    toCIDR give a thousand keys."""
    import ipaddress

    known = ["198.51.100.0/24", "198.51.100.7/32", "198.51.100.200/32", "198.51.0.0/16", "198.50.0.0/15",
             "203.0.113.9/32", "2001:db8::/64", "2001:db8::5/128"]
    eps, alloc = lab()
    nets = {alloc.allocate_cidr(p): ipaddress.ip_network(p) for p in known}
    web = resolve(eps, policy("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  egress: [{toCIDRSet: [{cidr: 198.51.0.0/16, except: [198.51.100.128/25]}]}]
"""), alloc).endpoints["web"]
    base, excluded = ipaddress.ip_network("198.51.0.0/16"), ipaddress.ip_network("198.51.100.128/25")
    want = {i for i, n in nets.items() if n.version == 4 and n.subnet_of(base) and not n.subnet_of(excluded)}
    assert {r.key.sec_label for r in web.rows if r.key.direction == EG} == want
    assert sorted(map(str, (nets[i] for i in want))) == ["198.51.0.0/16", "198.51.100.0/24", "198.51.100.7/32"]
    many = ", ".join(f"198.18.{128 + i // 256}.{i % 256}/32" for i in range(1000))
    _, web, _ = run(f"spec:\n  endpointSelector: {{matchLabels: {{app: web}}}}\n  egress: [{{toCIDR: [{many}]}}]\n")
    assert sum(1 for r in web.rows if r.key.direction == EG) == 1000


@pytest.mark.parametrize("entity,ids", [
    ("world", {2, 9, 10}),       # reserved:world, world-ipv4, world-ipv6 (and every CIDR identity, none here)
    ("world-ipv4", {9}),
    ("world-ipv6", {10}),
    ("host", {1}),
    ("remote-node", {6, 7}),     # kube-apiserver carries reserved:remote-node too
    ("cluster", {1, 3, 4, 5, 6, 7, 8, 256, 257, 258}),
    ("all", {0}),
])
def test_to_entities(entity, ids):
    """toEntities maps to reserved identities (pkg/policy/api/entity.go:94-96@82999990: world is the selectors of
    reserved:world, world-ipv4 and world-ipv6, identities 2, 9, 10, in the selector cache of every node,
    pkg/identity/reserved.go:55-59@82999990); `all` is identity 0."""
    _, web, _ = run(f"spec: {{endpointSelector: {{matchLabels: {{app: web}}}}, egress: [{{toEntities: [{entity}]}}]}}")
    assert {k.sec_label for k in web.keys() if k.egress} == ids


def test_enable_default_deny_false():
    """enableDefaultDeny.ingress false: the rule adds keys but the direction keeps its allow-all key."""
    _, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  enableDefaultDeny: {ingress: false}
  ingressDeny: [{fromEntities: [world]}]
""")
    assert not web.ingress_enforced
    assert ("Ingress: 0 ANY", False) in keys(web) and ("Ingress: 2 ANY", True) in keys(web)
    assert not web.verdict(2, IN, TCP, 80).allowed and web.verdict(257, IN, TCP, 80).allowed


def test_fqdn_keys_only_after_the_answer():
    """toFQDNs selects nothing until the DNS cache holds a matching name; then the identity v1.16 gives the IPs
    selected by that selector (labels fqdn:<selector>, reserved:world; cilium/cilium PR 32769, pkg/policy/api/fqdn.go)."""
    spec = """
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress: [{toFQDNs: [{matchPattern: "*.example.test"}], toPorts: [{ports: [{port: "443", protocol: TCP}]}]}]
"""
    _, before, _ = run(spec, pod="client")
    assert [k for k, _ in keys(before) if k.startswith("Egress")] == []
    _, after, alloc = run(spec, {"api.example.test": ["203.0.113.10"], "a.b.example.test": ["203.0.113.11"],
                                 "other.test": ["203.0.113.12"]}, pod="client")
    ident = alloc.allocate_fqdn(["*.example.test"])
    assert alloc.labels(ident).printable() == ["fqdn:*.example.test", "reserved:world"]
    assert [k for k, _ in keys(after) if k.startswith("Egress")] == [f"Egress: {ident} 443/TCP"]


def test_fqdn_identity_per_selector_set():
    """Two IPs selected by the same selectors share one identity; an IP also named by a matchName gets its own."""
    spec = """
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress: [{toFQDNs: [{matchPattern: "*.example.test"}, {matchName: api.example.test}]}]
"""
    _, client, alloc = run(spec, {"api.example.test": ["203.0.113.10"], "www.example.test": ["203.0.113.20", "203.0.113.21"]},
                           pod="client")
    both = alloc.allocate_fqdn(["*.example.test", "api.example.test"])
    pattern_only = alloc.allocate_fqdn(["*.example.test"])
    assert {k.sec_label for k in client.keys() if k.egress} == {both, pattern_only}


def test_warnings_for_selectors_matching_nothing():
    """Selectors that select no endpoint are allowed and reported, once each."""
    res, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: ghost}}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: q}
spec: {endpointSelector: {matchLabels: {app: nobody}}, ingress: [{}]}
""")
    assert res.warnings == [
        "q: spec.endpointSelector (any:app=nobody,k8s:io.kubernetes.pod.namespace=default) selects no endpoint",
        "p: spec.ingress[0].fromEndpoints[0] (any:app=ghost,k8s:io.kubernetes.pod.namespace=default) selects no endpoint",
    ]
    assert web.ingress_enforced and not web.verdict(257, IN, TCP, 80).allowed


def test_port_range_masks():
    """endPort ranges split into LPM prefixes (PortRangeToMaskedPorts) and every port of the range is allowed."""
    assert masked_ports(80) == [(80, 0xFFFF)]
    assert masked_ports(0x100, 0x1FF) == [(0x100, 0xFF00)]
    assert masked_ports(16, 31) == [(16, 0xFFF0)]  # PortRangeToMaskedPorts' own example: 16-31 is 0b1xxxx
    # 9000-9010 as PortRangeToMaskedPorts builds it: start side 9000/fff8, end side 9010/ffff and 9008/fffe
    assert sorted(masked_ports(9000, 9010)) == sorted([(9000, 0xFFF8), (9010, 0xFFFF), (9008, 0xFFFE)])
    _, web, _ = run("spec: {endpointSelector: {matchLabels: {app: web}}, ingress: [{toPorts: [{ports: [{port: '9000', endPort: 9010, protocol: TCP}]}]}]}")
    assert [web.verdict(5, IN, TCP, p).allowed for p in (8999, 9000, 9005, 9010, 9011)] == [False, True, True, True, False]


def _ep_with(rows_spec):
    from labkit.maps.policy import PolicyEntry, PolicyRow
    from labkit.policy.resolve import EndpointPolicy
    rows = [PolicyRow(k, PolicyEntry.deny(k) if deny else PolicyEntry.allow(k)) for k, deny in rows_spec]
    return EndpointPolicy(None, True, True, rows)


@pytest.mark.parametrize("rows,match,allowed", [
    # bpf/lib/policy.h __policy_can_access (v1.16): 1 id/proto/port, 2 ANY/proto/port, 3 id/proto/ANY,
    # 4 ANY/proto/ANY, 5 id/ANY/ANY, 6 ANY/ANY/ANY, in that order.
    ([(PolicyKey.make(300, IN, 6, 80), False), (PolicyKey.make(0, IN, 6, 80), True)], "L3-L4", True),
    ([(PolicyKey.make(300, IN, 6), False), (PolicyKey.make(0, IN, 6, 80), True)], "L4-only", False),
    ([(PolicyKey.make(300, IN, 6), True), (PolicyKey.make(0, IN, 6), False)], "L3-proto", False),
    ([(PolicyKey.make(300, IN), True), (PolicyKey.make(0, IN, 6), False)], "proto-only", True),
    ([(PolicyKey.make(300, IN), True), (PolicyKey.make(0, IN), False)], "L3-only", False),
    ([(PolicyKey.make(0, IN), False)], "all", True),
])
def test_datapath_lookup_precedence(rows, match, allowed):
    """verdict() follows policy.h's six steps; the datapath alone does not prefer denies (mapstate does)."""
    v = _ep_with(rows).verdict(300, IN, 6, 80)
    assert (v.match, v.allowed) == (match, allowed)


def test_covers():
    """covers(): broader-or-equal protocol and port under the key's mask, same direction."""
    assert covers(PolicyKey.make(0, IN), PolicyKey.make(0, IN, 6, 80))
    assert not covers(PolicyKey.make(0, IN, 17), PolicyKey.make(0, IN, 6, 80))
    assert covers(PolicyKey.make(0, IN, 6, 0x100, 0xFF00), PolicyKey.make(0, IN, 6, 0x1AB))
    assert not covers(PolicyKey.make(0, EG), PolicyKey.make(0, IN))


def test_empty_ingress_list_does_not_select():
    """`ingress: []` is no ingress rule: pkg/policy/repository.go counts len(r.Ingress) > 0 || len(r.IngressDeny) > 0."""
    _, db, _ = run("spec: {endpointSelector: {matchLabels: {app: db}}, ingress: []}", pod="db")
    assert not db.ingress_enforced and db.verdict(256, IN, TCP, 5432).allowed


def test_always_enforces_unselected_endpoints():
    """--policy-enforcement=always (repository.go computePolicyEnforcementAndRules returns true, true): an
    endpoint no policy selects is default deny both ways, ingress from the host still allowed."""
    eps, alloc = lab()
    db = resolve(eps, [], alloc, enforcement="always").endpoints["db"]
    assert (db.ingress_enforced, db.egress_enforced) == (True, True)
    assert keys(db) == [("Ingress: 1 ANY", False)]


def test_never_enforces_selected_endpoints():
    """--policy-enforcement=never: no rule applies (no matching rules are returned), both directions allow-all,
    even a deny rule's keys are absent."""
    res, _, _ = run("""spec:
  endpointSelector: {matchLabels: {app: web}}
  ingressDeny: [{fromEndpoints: [{matchLabels: {app: client}}]}]
""")
    eps, alloc = lab()
    web = resolve(eps, policy("""spec:
  endpointSelector: {matchLabels: {app: web}}
  ingressDeny: [{fromEndpoints: [{matchLabels: {app: client}}]}]
"""), alloc, enforcement="never").endpoints["web"]
    assert (web.ingress_enforced, web.egress_enforced) == (False, False)
    # the host's allow is there too (pkg/policy/resolve.go:134-137@82999990: not only when enforced)
    assert keys(web) == [("Egress: 0 ANY", False), ("Ingress: 0 ANY", False), ("Ingress: 1 ANY", False)]
    assert res.endpoints["web"].ingress_enforced  # the same policy under "default" enforces


def test_unknown_enforcement_mode_is_refused():
    """A mode outside default/always/never is a PolicyError naming the modes."""
    eps, alloc = lab()
    with pytest.raises(PolicyError, match="expected one of default, always, never"):
        resolve(eps, [], alloc, enforcement="audit")


DNS_SPEC = """
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toCIDR: [198.51.100.100/32]
    toPorts: [{ports: [{port: "53", protocol: UDP}], rules: {dns: [{matchPattern: "*.lab.example"}]}}]
  - toFQDNs: [{matchName: web.lab.example}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
"""


def test_dns_rule_key_carries_the_proxy_port():
    """A toPorts item with rules.dns gives its allow key the DNS proxy's port; the toFQDNs key has none
    (pkg/policy l4.go: an L7 rule makes the port a redirect; mapstate entries carry ProxyPort)."""
    from labkit.policy.resolve import DNS_PROXY_PORT

    _, client, alloc = run(DNS_SPEC, {"web.lab.example": ["198.51.100.101"]}, pod="client")
    ports = {(r.key.port_proto(), r.entry.proxy_port) for r in client.rows if r.key.egress}
    assert ports == {("53/UDP", DNS_PROXY_PORT), ("8080/TCP", 0)}


def test_redirect_wins_over_a_plain_allow_on_one_key():
    """The same key allowed plainly and with a DNS rule keeps the proxy port (mapstate.go Merge: a redirect
    entry wins), whichever rule comes first."""
    from labkit.policy.resolve import DNS_PROXY_PORT

    for order in ((0, 1), (1, 0)):
        items = ['- toCIDR: [198.51.100.100/32]\n    toPorts: [{ports: [{port: "53", protocol: UDP}]}]',
                 '- toCIDR: [198.51.100.100/32]\n    toPorts: [{ports: [{port: "53", protocol: UDP}], '
                 'rules: {dns: [{matchName: web.lab.example}]}}]']
        spec = ("spec:\n  endpointSelector: {matchLabels: {app: client}}\n  egress:\n  "
                + "\n  ".join(items[i] for i in order) + "\n")
        _, client, _ = run(spec, pod="client")
        assert [r.entry.proxy_port for r in client.rows if r.key.egress] == [DNS_PROXY_PORT]


def test_fqdn_ids_name_the_ipcache_entries():
    """Resolution.fqdn_ids maps each cached IP a toFQDNs selector picks to its FQDN identity; an IP of a
    name no selector picks (db) has none."""
    res, _, alloc = run(DNS_SPEC, {"web.lab.example": ["198.51.100.101"], "db.lab.example": ["198.51.100.103"]},
                        pod="client")
    assert res.fqdn_ids == {"198.51.100.101": alloc.allocate_fqdn(["web.lab.example"])}
    # the cache's identities are given before the rules' CIDR prefixes': the first local identity, 2^24 + 1
    assert res.fqdn_ids["198.51.100.101"] == 1 << 24 | 1


def test_l4_only_deny_carves_its_port_out_of_a_narrower_identity_allow():
    """A deny of 80/TCP from every identity (fromEntities: all) and an allow of client on 80-83/TCP: Cilium adds
    the deny `client 80/TCP` (mapstate.go:897-911@82999990, the allow's identity with the deny's port), so
    the datapath's L3-L4 match denies port 80 and allows 81; without that row the client's 80-83 allow won."""
    _, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: client}}], toPorts: [{ports: [{port: "80", endPort: 83, protocol: TCP}]}]}]
  ingressDeny: [{fromEntities: [all], toPorts: [{ports: [{port: "80", protocol: TCP}]}]}]
""")
    assert ("Ingress: 257 80/TCP", True) in keys(web) and ("Ingress: 0 80/TCP", True) in keys(web)
    v = web.verdict(257, IN, TCP, 80)
    assert not v.allowed and v.match == "L3-L4"
    assert web.verdict(257, IN, TCP, 81).allowed


def test_world_entity_writes_three_rows():
    """`toEntities: [world]` on an enforced egress writes world (2), world-ipv4 (9) and world-ipv6 (10): the three
    selectors of pkg/policy/api/entity.go:94@82999990, each selecting its reserved identity."""
    _, web, alloc = run("spec: {endpointSelector: {matchLabels: {app: web}}, egress: [{toEntities: [world]}]}")
    assert [k for k, _ in keys(web) if k.startswith("Egress")] == ["Egress: 10 ANY", "Egress: 2 ANY", "Egress: 9 ANY"]
    text = "\n".join(web.lines(alloc))
    assert "reserved:world-ipv4" in text and "reserved:world-ipv6" in text


def test_narrower_deny_of_another_selector_stays_beside_an_l3_allow():
    """client's own deny of 8080/TCP (selector app=client) beside a deny of 8080/TCP from everyone (the wildcard
    selector) and an allow of client on every port: the identity-0 deny removes client's key as redundant
    (mapstate.go:976-995@82999990) but the client allow puts it back as the deny's dependent (mapstate.go:1089-1106),
    so client's map row `257 8080/TCP` deny is there, as on a node; labkit used to drop it. The host's allow, inserted
    last with denyPreferredInsert (mapstate.go:1509-1519), gets the same carve-out: `1 8080/TCP` deny."""
    _, web, _ = run("""
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingress: [{fromEndpoints: [{matchLabels: {app: client}}]}]
  ingressDeny:
  - {fromEndpoints: [{matchLabels: {app: client}}], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}
  - {fromEntities: [all], toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}
""")
    assert {k for k in keys(web) if k[0].startswith("Ingress")} == {
        ("Ingress: 0 8080/TCP", True), ("Ingress: 1 ANY", False), ("Ingress: 1 8080/TCP", True),
        ("Ingress: 257 ANY", False), ("Ingress: 257 8080/TCP", True)}
