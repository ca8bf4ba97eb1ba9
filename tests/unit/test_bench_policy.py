"""The policy bench's policies and report lines, without a lab: what the agent will resolve them to (one key per
CIDR identity) and how the two figures read. The measurement itself runs in tests/datapath/test_bench_smoke.py."""
from __future__ import annotations

import ipaddress
import json

from labkit.maps.policy import Direction, PolicyKey
from labkit.policy.identity import IdentityAllocator, pod_labels
from labkit.policy.resolve import Endpoint, resolve
from labkit.policy.rules import parse_policies
from labkit.tools import bench_policy as bp

PODS = {"a1": "198.18.1.11", "a2": "198.18.1.12", "b1": "198.18.2.11", "b2": "198.18.2.12"}


def _entries(policy: dict, pod: str) -> dict:
    alloc = IdentityAllocator()
    eps = [Endpoint(n, pod_labels({"app": n}), alloc.allocate(pod_labels({"app": n})), ip) for n, ip in PODS.items()]
    return resolve(eps, parse_policies(json.dumps(policy)), alloc).endpoints[pod].entries()


def test_wide_rule_is_one_key_per_cidr_identity():
    """The changed rule selects n distinct CIDR identities (local scope, bit 24) on its port: n L3-L4 keys, plus
    allow-localhost (1) and egress allow-all (0): n + 2 keys."""
    keys = set(_entries(bp.wide_rule(50, 9090), "a1"))
    cidr = {k for k in keys if k.sec_label >= 1 << 24}
    assert len(cidr) == 50 and len(keys) == 52
    assert all(k == PolicyKey.make(k.sec_label, Direction.INGRESS, 6, 9090) for k in cidr)


def test_prefixes_stay_in_benchmark_space_away_from_pods():
    """Every prefix of both policies is a /32 in 198.18.0.0/15 (DESIGN.md §4) outside the pod CIDRs, and the big
    first-packet policy's prefixes do not overlap the wide rule's."""
    wide = set(bp._prefixes(bp.IDENTITIES))
    extra = {c for r in bp.first_packet_policy("x", "a2", bp.RULES)["spec"]["ingress"][1:] for c in r["fromCIDR"]}
    assert len(extra) == bp.RULES and not wide & extra
    for p in wide | extra:
        net = ipaddress.ip_network(p)
        assert net.prefixlen == 32 and net.subnet_of(ipaddress.ip_network("198.18.0.0/15"))
        assert not any(net.subnet_of(ipaddress.ip_network(c)) for c in ("198.18.1.0/24", "198.18.2.0/24"))


def test_first_packet_maps_differ_by_the_rules_only():
    """The small map lets b1 in (plus host, egress allow-all: 3 keys); the big one holds those and one key per
    extra rule, so the only difference the connect() sees is the map's size."""
    small = _entries(bp.first_packet_policy("s", "a1", 0), "a1")
    big = _entries(bp.first_packet_policy("b", "a2", 30), "a2")
    assert len(small) == 3 and len(big) == 33
    assert {(k.sec_label, k.direction) for k in small} <= {(k.sec_label, k.direction) for k in big}


def test_report_lines():
    """Both lines name their conditions and figures: identities, keys, the CLI median in ms, rules, µs, ratio."""
    result = {"update": {"identities": 1000, "map_entries": 1002, "cli_s": [0.5, 0.7, 0.6], "api_s": [0.2, 0.1, 0.3]},
              "first_packet": {"rules": 1000, "pairs": 200, "rounds": 5, "map_entries": {"small": 3, "big": 1003},
                               "median_s": {"small": 5.0e-5, "big": 5.2e-5}, "ratio": 1.04}}
    update, first = bp.report_lines(result)
    assert "selecting 1,000 CIDR identities" in update and "1,002 keys" in update
    assert "median 600 ms of 3" in update and "200 ms of 3" in update
    assert "0 vs 1,000 more rules (3 vs 1,003 map keys)" in first and "50 µs vs 52 µs, ratio 1.04" in first
