"""labkit.policy.mapstate: Cilium v1.16's denyPreferredInsertWithChanges, checked against Cilium's own table
(pkg/policy/mapstate_test.go:3555-3752@82999990, TestMapState_denyPreferredInsertWithSubnets) and the cases
labkit's resolve() used to get wrong."""
from __future__ import annotations

import ipaddress

import pytest

from labkit.maps.policy import Direction, PolicyKey
from labkit.policy.mapstate import MapState

WORLD, WORLD_IP, WORLD_SUBNET = 2, (1 << 24) | 1, (1 << 24) | 2
NETS = {WORLD_IP: (ipaddress.ip_network("192.0.2.3/32"),), WORLD_SUBNET: (ipaddress.ip_network("192.0.2.0/24"),)}
A, B, A_WITH_B_PROTO, B_WITH_A_PROTO, B_WITH_A_PROTO_AS_DENY, B_AS_DENY = "A", "B", "AwB", "BwA", "BwA-deny", "B-deny"
BOTH = (A, B)

# (name, a identity, b identity, a deny, b deny, a port, a proto, b port, b proto, outcome): mapstate_test.go:3589-3627
CASES = [
    ("deny-allow: a superset a|b L3-only", WORLD, WORLD_SUBNET, True, False, 0, 0, 0, 0, (A, B_AS_DENY)),
    ("deny-allow: b superset a|b L3-only", WORLD_IP, WORLD_SUBNET, True, False, 0, 0, 0, 0, BOTH),
    ("deny-allow: a superset a L3-only, b L4", WORLD, WORLD_SUBNET, True, False, 0, 0, 0, 6, (A, B_AS_DENY)),
    ("deny-allow: b superset a L3-only, b L4", WORLD_IP, WORLD_SUBNET, True, False, 0, 0, 0, 6, BOTH + (A_WITH_B_PROTO,)),
    ("deny-allow: a superset a L3-only, b L3L4", WORLD, WORLD_SUBNET, True, False, 0, 0, 80, 6, (A, B_AS_DENY)),
    ("deny-allow: b superset a L3-only, b L3L4", WORLD_IP, WORLD_SUBNET, True, False, 0, 0, 80, 6, BOTH + (A_WITH_B_PROTO,)),
    ("deny-allow: a superset a L4, b L3-only", WORLD, WORLD_SUBNET, True, False, 0, 6, 0, 0, BOTH + (B_WITH_A_PROTO_AS_DENY,)),
    ("deny-allow: b superset a L4, b L3-only", WORLD_IP, WORLD_SUBNET, True, False, 0, 6, 0, 0, BOTH),
    ("deny-allow: a superset a L4, b L4", WORLD, WORLD_SUBNET, True, False, 0, 6, 0, 6, (A, B_AS_DENY)),
    ("deny-allow: b superset a L4, b L4", WORLD_IP, WORLD_SUBNET, True, False, 0, 6, 0, 6, BOTH),
    ("deny-allow: a superset a L4, b L3L4", WORLD, WORLD_SUBNET, True, False, 0, 6, 80, 6, (A, B_AS_DENY)),
    ("deny-allow: b superset a L4, b L3L4", WORLD_IP, WORLD_SUBNET, True, False, 0, 6, 80, 6, BOTH + (A_WITH_B_PROTO,)),
    ("deny-allow: a superset a L3L4, b L3-only", WORLD, WORLD_SUBNET, True, False, 80, 6, 0, 0, BOTH + (B_WITH_A_PROTO_AS_DENY,)),
    ("deny-allow: b superset a L3L4, b L3-only", WORLD_IP, WORLD_SUBNET, True, False, 80, 6, 0, 0, BOTH),
    ("deny-allow: a superset a L3L4, b L4", WORLD, WORLD_SUBNET, True, False, 80, 6, 0, 6, BOTH + (B_WITH_A_PROTO_AS_DENY,)),
    ("deny-allow: b superset a L3L4, b L4", WORLD_IP, WORLD_SUBNET, True, False, 80, 6, 0, 6, BOTH),
    ("deny-allow: a superset a L3L4, b L3L4", WORLD, WORLD_SUBNET, True, False, 80, 6, 80, 6, (A, B_AS_DENY)),
    ("deny-allow: b superset a L3L4, b L3L4", WORLD_IP, WORLD_SUBNET, True, False, 80, 6, 80, 6, BOTH),
] + [
    (f"deny-deny: {a_port}/{a_proto} {b_port}/{b_proto} {b_id}", WORLD_SUBNET, b_id, True, True, a_port, a_proto,
     b_port, b_proto, BOTH)
    for b_id in (WORLD_IP, WORLD)
    for a_port, a_proto in ((0, 0), (0, 6), (80, 6)) for b_port, b_proto in ((0, 0), (0, 6), (80, 6))
]


def _key(ident, port, proto):
    return PolicyKey.make(ident, Direction.INGRESS, proto, port)


def _expected(a_id, b_id, a_deny, b_deny, a_port, a_proto, b_port, b_proto, outcome):
    want = {_key(0, 0, 0): False}
    if A in outcome:
        want[_key(a_id, a_port, a_proto)] = a_deny
    if B in outcome:
        want[_key(b_id, b_port, b_proto)] = b_deny
    if B_AS_DENY in outcome:
        want[_key(b_id, b_port, b_proto)] = True
    if A_WITH_B_PROTO in outcome:
        want[_key(a_id, b_port, b_proto)] = a_deny
    if B_WITH_A_PROTO in outcome:
        want[_key(b_id, a_port, a_proto)] = b_deny
    if B_WITH_A_PROTO_AS_DENY in outcome:
        want[_key(b_id, a_port, a_proto)] = True
    return want


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("reverse", [False, True])
def test_ciliums_subnet_table(case, reverse):
    """Each row of Cilium's table gives the same keys, deny or allow, in both insertion orders (the any-ingress
    allow, a, b; and b, a, the allow)."""
    name, a_id, b_id, a_deny, b_deny, a_port, a_proto, b_port, b_proto, outcome = case
    ms = MapState(lambda ident: NETS.get(ident, ()))
    inserts = [(_key(0, 0, 0), False), (_key(a_id, a_port, a_proto), a_deny), (_key(b_id, b_port, b_proto), b_deny)]
    for n, (key, deny) in enumerate(reversed(inserts) if reverse else inserts):
        ms.insert(key, deny=deny, owner=f"selector{n}")
    got = {r.key: r.entry.is_deny for r in ms.rows()}
    assert got == _expected(a_id, b_id, a_deny, b_deny, a_port, a_proto, b_port, b_proto, outcome)


def test_l4_deny_gives_an_l3_allow_its_port_as_a_deny():
    """An identity-0 deny on 80/TCP and an allow of identity X on every port: Cilium adds the deny X 80/TCP in
    either order (mapstate.go:897-911 for the deny, 1089-1106 for the allow @82999990)."""
    for order in ((True, False), (False, True)):
        ms = MapState()
        for deny in order:
            ms.insert(_key(0, 80, 6) if deny else _key(300, 0, 0), deny=deny, owner=f"selector-{deny}")
        assert {(str(r.key), r.entry.is_deny) for r in ms.rows()} == {
            ("Ingress: 0 80/TCP", True), ("Ingress: 300 ANY", False), ("Ingress: 300 80/TCP", True)}


def test_a_dependent_deny_another_selector_asked_for_outlives_its_owner():
    """A deny key that one deny derived (owner: that key) and a selector also asked for stays when the key it was
    derived from is deleted: deleteKeyWithChanges takes only the deleted key's share of its dependents
    (mapstate.go:677-732@82999990; owners merged for an identical key, mapstate.go:963-971). Without the
    selector's own rule, it goes with its owner. CIDR identities: /16 ⊃ /24."""
    subnet, net = (1 << 24) | 10, (1 << 24) | 11
    nets = {subnet: (ipaddress.ip_network("198.51.100.0/24"),), net: (ipaddress.ip_network("198.51.0.0/16"),)}

    def build(own_deny: bool) -> set:
        ms = MapState(lambda ident: nets.get(ident, ()))
        ms.insert(_key(subnet, 0, 0), deny=False, owner="cidr:198.51.100.0/24")  # allow the /24, every port
        ms.insert(_key(net, 80, 6), deny=True, owner="cidr:198.51.0.0/16")        # derives deny /24 80/TCP
        if own_deny:
            ms.insert(_key(subnet, 80, 6), deny=True, owner="cidr:198.51.100.0/24 deny")
        ms.insert(_key(net, 0, 0), deny=True, owner="cidr:198.51.0.0/16 all")     # deletes deny /16 80/TCP
        return {(r.key.sec_label, r.key.port_proto(), r.entry.is_deny) for r in ms.rows()}

    assert build(True) == {(net, "ANY", True), (subnet, "ANY", True), (subnet, "80/TCP", True)}
    assert build(False) == {(net, "ANY", True), (subnet, "ANY", True)}
