"""The GC's interval rule (Cilium's calculateInterval) and its result objects, without a kernel."""
from __future__ import annotations


import pytest

from labkit.agent import gc
from labkit.agent.gc import MAX_INTERVAL, MIN_INTERVAL, START_INTERVAL, GcRun, MapScan, get_interval, next_interval
from labkit.maps.ct import CtKey4


@pytest.mark.parametrize("interval, ratio, expected", [
    (300, 0.0, 300),        # nothing deleted: unchanged
    (300, 0.01, 450),       # below 5%: x1.5
    (300, 0.049, 450),
    (300, 0.05, 300),       # 5% .. 25%: unchanged
    (300, 0.10, 300),
    (300, 0.25, 300),
    (300, 0.26, 222),       # above 25%: x(1 - ratio), rounded to seconds
    (300, 0.5, 150),
    (300, 0.9, 30),
    (300, 0.95, 30),        # 90% and more: x0.1
    (300, 1.0, 30),
    (50, 0.9, 10),          # floor 10 s
    (11, 0.3, 10),
    (40000, 0.01, 43200),   # cap 12 h
    (43200, 0.0001, 43200),
    (10, 0.01, 15),
])
def test_interval_rule(interval, ratio, expected):
    """next_interval follows Cilium's rule row by row, including the 10 s floor and the 12 h cap."""
    assert next_interval(interval, ratio) == expected


def test_interval_rounds_half_away_from_zero():
    """675 s × 1.5 = 1012.5 s becomes 1013 s: Go's Duration.Round(time.Second) rounds halves away from zero
    (pkg/maps/ctmap/ctmap.go:911@82999990), where Python's round() gives 1012; 1012.5 s × 0.6 = 607.5 s → 608 s."""
    assert next_interval(675, 0.01) == 1013
    assert next_interval(1013, 0.4) == 608  # 607.8 s
    assert next_interval(25, 0.3) == 18  # 17.5 s
    assert next_interval(15, 0.3) == 11  # 10.5 s


def test_get_interval_ciliums_own_cases():
    """Cilium's TestCalculateInterval/TestGetInterval (pkg/maps/ctmap/ctmap_test.go:20-55@82999990): 60 s → 36 s at
    0.40, 24 s at 0.60, 10 s → 15 s at 0.01, 1 s → 10 s at 0.9, 24 h → 12 h; an on-time run keeps 60 s and a
    max interval of 20 s caps it."""
    assert [next_interval(60, r) for r in (0.1, 0.2, 0.25, 0.40, 0.60)] == [60, 60, 60, 36, 24]
    assert (next_interval(10, 0.01), next_interval(10, 0.04), next_interval(1, 0.9)) == (15, 15, 10)
    assert next_interval(24 * 3600, 0.01) == MAX_INTERVAL
    assert get_interval(60, 0.1, cached=60) == (60, 60)
    assert get_interval(60, 0.1, cached=60, max_interval=20)[0] == 20


def test_get_interval_scales_an_early_runs_ratio():
    """A run that came before the expected interval reads ratio × expected/actual (ctmap.go:861-866@82999990):
    0.1 after 150 s of an expected 450 s counts as 0.3 (450 → 315 s); late or first runs, or a cache still 0, are
    not scaled."""
    assert get_interval(150, 0.1, cached=450) == (315, 315)
    assert get_interval(600, 0.1, cached=450) == (450, 450)  # late: no scaling
    assert get_interval(0, 0.1, cached=450) == (450, 450)  # no previous run
    assert get_interval(10, 0.1, cached=0) == (300, 300)  # nothing cached: starts at 5 min, unscaled
    assert get_interval(10, 0.0, cached=0) == (300, 0)  # ratio 0 stores nothing (ctmap.go:890-892@82999990)


def test_max_interval_caps_the_result_not_the_cache():
    """--conntrack-gc-max-interval caps what GetInterval returns (ctmap.go:869-871@82999990) while
    calculateInterval has already cached the uncapped value (ctmap.go:917@82999990): the cache keeps growing, and
    a run on the capped schedule counts as early next time."""
    nxt, cached = get_interval(0, 0.01, cached=0, max_interval=400)
    assert (nxt, cached) == (400, 450)
    # 400 s later (on time for the cap) the 0.1 ratio is scaled by 450/400: 0.1125, still 5%..25%: unchanged
    assert get_interval(400, 0.1, cached, max_interval=400) == (400, 450)
    # and 0.24 becomes 0.27: 450 × 0.73 = 328.5 s → 329 s (under the cap)
    assert get_interval(400, 0.24, cached, max_interval=400) == (329, 329)


def test_run_rule_reproduces_the_recorded_interval():
    """A GcRun carries what GetInterval read (actual, cached, cap), so a grader can recompute its next interval."""
    maps = (MapScan("node-a", "cilium_ct4_global", 1000, 100, 100, 0.001),)
    run = GcRun(500, "per-entry", maps, 0.002, 450, 315, actual=150, cached=450)
    assert run.adjusted_ratio == 0.1 * 3 and run.expected == 450 and run.rule() == 315
    assert "early" in "\n".join(run.lines())
    old = GcRun(500, "per-entry", maps, 0.002, 300, 300)  # recorded before these fields: the plain rule
    assert old.expected == 300 and old.rule() == 300


def test_constants_are_ciliums():
    """The GC starts at 5 minutes, never goes below 10 s nor above 12 h."""
    assert (START_INTERVAL, MIN_INTERVAL, MAX_INTERVAL) == (300, 10, 43200)


def test_run_ratio_is_the_largest_over_the_maps():
    """A run's ratio is the largest deleted/max_entries over its maps, and its lines name every map."""
    maps = (MapScan("node-a", "cilium_ct4_global", 1000, 100, 10, 0.001),
            MapScan("node-b", "cilium_ct_any4_global", 100, 50, 30, 0.001, nat_deleted=2))
    run = GcRun(500, "batch", maps, 0.002, 300, next_interval(300, 0.3))
    assert run.ratio == 0.3 and (run.deleted, run.scanned) == (40, 150) and run.next_interval == 210
    text = "\n".join(run.lines())
    assert "cilium_ct_any4_global" in text and "2 NAT entries" in text and "300 s -> 210 s" in text
    assert run.to_json()["ratio"] == 0.3


def test_dsr_nat_key_swaps_only_the_ports():
    """A DSRInternal entry {daddr=C, saddr=B, dport=bp, sport=cp} owns the NAT entry {saddr=B, daddr=C,
    sport=bp, dport=cp, OUT}: Cilium's DeleteSwappedMapping4 swaps the ports and keeps the addresses."""
    from labkit.agent.gc import _dsr_nat_key
    from labkit.maps.ct import TupleFlags
    from labkit.maps.nat import NatKey4

    ct = CtKey4.make("198.51.100.100", "198.18.2.11", 40000, 8080, 6, TupleFlags.OUT)  # OUT C:cp -> B:bp
    assert bytes(_dsr_nat_key(bytes(ct))) == bytes(NatKey4.make("198.18.2.11", "198.51.100.100", 8080, 40000, 6))


def test_snat_out_key_swaps_the_addresses():
    """An OUT entry of a SNATed flow {daddr=C, saddr=B, dport=bp, sport=cp} finds its NAT OUT entry keyed by
    the request {saddr=C, daddr=B, sport=cp, dport=bp}: Cilium's DeleteMapping4 swaps the addresses."""
    from labkit.agent.gc import _snat_out_key
    from labkit.maps.ct import TupleFlags
    from labkit.maps.nat import NatKey4

    ct = CtKey4.make("198.51.100.100", "198.18.2.11", 40000, 8080, 6, TupleFlags.OUT)
    assert bytes(_snat_out_key(bytes(ct))) == bytes(NatKey4.make("198.51.100.100", "198.18.2.11", 40000, 8080, 6))


def test_default_scan_follows_the_release():
    """v1.16 scans per entry (DumpReliablyWithCallback); batch came with 1.18 (cilium/cilium#36288)."""
    from labkit.agent.gc import default_mode

    assert (default_mode("1.16"), default_mode("1.20")) == ("per-entry", "batch")
