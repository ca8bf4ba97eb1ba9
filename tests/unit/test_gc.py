"""The GC's interval rule (Cilium's calculateInterval) and its result objects, without a kernel."""
from __future__ import annotations


import pytest

from labkit.agent import gc
from labkit.agent.gc import MAX_INTERVAL, MIN_INTERVAL, START_INTERVAL, GcRun, MapScan, next_interval
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
