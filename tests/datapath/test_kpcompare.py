"""The kube-proxy vs eBPF comparison on the real kernel: a partial sync restored with --noflush leaves node-a's nat
table what a full restore of the new state leaves (iptables-save compared, counters stripped), and a small run of
compare_service_modes yields every figure, measured (no timing asserted)."""
from __future__ import annotations

import dataclasses

import pytest

from labkit.agent.kubeproxy import (chains_in, diff_tables, nat_table, parse_tables, partial_table, restore,
                                    restore_noflush)
from labkit.agent.kubeproxy.sync import NetnsIptables
from labkit.agent.services import Backend
from labkit.config import DatapathConfig
from labkit.net import netns as _netns
from labkit.lab.kpcompare import compare_service_modes, synthetic_services

from labtag import tagged


@pytest.fixture(scope="module")
def ipt(_require_datapath):
    from labkit import Lab

    lab = Lab.up(tagged("kpcmp"), config=DatapathConfig(service_mode="iptables", gc_timer=False))
    yield lab
    lab.down()


def _saved(netns: str) -> str:
    return NetnsIptables(netns).save("nat")


@pytest.mark.parametrize("n", [30, 1001])
def test_partial_restore_leaves_what_a_full_restore_of_the_new_state_leaves(ipt, n):
    """Adding an endpoint to one of n services by partial sync (--noflush), then taking it out again (its chain
    -X-deleted), leaves iptables-save -t nat equal, chain by chain, to a full restore of the same state (1,001:
    kube-proxy's large cluster mode, no comments in the service chains)."""
    netns = ipt.topology.netns("node-a")
    base = synthetic_services(n)
    last = base[-1]
    grown = base[:-1] + [dataclasses.replace(last, backends=last.backends + (Backend.parse("b2:8080", last.name),))]
    restore(netns, nat_table(grown, ipt.topology))
    want_grown = _saved(netns)
    restore(netns, nat_table(base, ipt.topology))
    want_base = _saved(netns)
    assert diff_tables(want_grown, want_base)  # the change is visible in the table

    restore_noflush(netns, partial_table(grown, ipt.topology, {last.name}, chains_in(want_base)))
    got_grown = _saved(netns)
    assert diff_tables(got_grown, want_grown) == []
    restore_noflush(netns, partial_table(base, ipt.topology, {last.name}, chains_in(got_grown)))
    got_base = _saved(netns)
    assert diff_tables(got_base, want_base) == []
    assert len(parse_tables(got_base)["nat"]) < len(parse_tables(got_grown)["nat"])  # the endpoint's chain is gone


def test_compare_service_modes_small_run_measures_every_figure(_require_datapath):
    """At n=10 with 5 small rounds the comparison returns every figure of both modes as a positive measured
    number, the eBPF agent holds the 10 services itself, the partial restore matched the full one, the stall
    saw connects in every window kind, and both labs are gone afterwards."""
    prefix = tagged("kpc")
    ticks = []
    kp = compare_service_modes((10,), lambda done, total, text: ticks.append((done, total)), prefix=prefix,
                               rounds=5, connects=20)
    assert kp["sizes"] == [10] and ticks[-1][0] == ticks[-1][1]
    ipt, ebpf = kp["iptables"][10], kp["ebpf"][10]
    for key in ("add_endpoint_s", "add_endpoint_partial_s", "save_nat_s", "first_packet_s", "first_packet_typical_s"):
        assert ipt[key] > 0 and len(ipt["samples"][key]) == 5, key
    for key in ("add_endpoint_s", "first_packet_s", "first_packet_typical_s"):
        assert ebpf[key] > 0 and len(ebpf["samples"][key]) == 5, key
    assert ebpf["services_in_agent"] == 10 and kp["conditions"]["tracing"] == "off"
    assert ipt["partial_equals_full"] and ipt["partial_lines"] < ipt["full_lines"]
    assert kp["positions"][10]["worst"] == 10 and 1 <= kp["positions"][10]["typical"] < 10
    for key, s in kp["stall"][10].items():
        assert s["rounds"] == 5 and s["connects"] > 0 and s["window_s"] > 0, key
        assert 0 < s["p50_s"] <= s["p99_s"] <= s["max_s"], key
    assert not any(_netns.exists(f"lk-{prefix}-{m}-a1") for m in ("bipt", "bebpf"))
