"""`make bench` cannot rot: one small run of every measurement on the real kernel (no timing asserted here)."""
from __future__ import annotations

import json

import pytest

from labkit.tools import bench, bench_policy, xdpbench
from labkit.net import netns as _netns


# Every section of make bench, each with two samples, labs included: longer than pytest's per-test limit when the
# other worker of make test loads the machine too.
@pytest.mark.timeout(1800)
def test_bench_measures_every_target(tmp_path, monkeypatch):
    """One small run of the bench produces a positive figure for every target, each from MIN_SAMPLES samples, and
    writes both reports."""
    assert bench.MIN_SAMPLES >= 5  # what `make bench` publishes; this run takes two of each
    monkeypatch.setattr(bench, "MIN_SAMPLES", 2)
    monkeypatch.setattr(bench, "SERVICES_AT_SCALE", 2000)  # the scale run itself is `make bench`'s job
    monkeypatch.setattr(bench, "GROWTH_SERVICES", 300)
    monkeypatch.setattr(bench, "LB_REQUESTS", 30)
    monkeypatch.setattr(bench, "GC_ENTRIES", 20_000)
    monkeypatch.setattr(bench, "GC_MAP_SIZE", 65_536)
    monkeypatch.setattr(bench, "SCALE_SIZES", (100, 300))
    monkeypatch.setattr(bench, "THROUGHPUT_SECONDS", 1)
    monkeypatch.setattr(bench, "GRADE_COPIES", 2)
    monkeypatch.setattr(bench, "SOCKMAP_RR_TRANSACTIONS", 200)
    monkeypatch.setattr(bench, "SOCKMAP_STREAM_BYTES", 4 << 20)
    monkeypatch.setattr(xdpbench, "FLOOD_SECONDS", 0.5)
    monkeypatch.setattr(bench_policy, "IDENTITIES", 100)
    monkeypatch.setattr(bench_policy, "RULES", 100)
    monkeypatch.setattr(bench_policy, "CONNECT_PAIRS", 20)
    assert bench.main(["--runs", "1", "--out", str(tmp_path)]) in (0, 1)  # 1: a target missed on a busy machine
    result = json.loads((tmp_path / "bench.json").read_text())
    assert set(bench.TARGETS) <= set(result["median"])
    assert all(result["median"][k] > 0 for k in bench.TARGETS)
    table = (tmp_path / "bench.md").read_text()
    assert all((k[:-2] if k.endswith("_s") else k[:-3] if k.endswith("_mb") else k) in table for k in bench.TARGETS)
    assert not _netns.exists("lk-bench-node-a")
    lb = result["lb_modes"]
    assert lb["median_rps"]["dsr"] > 0 and lb["median_rps"]["snat"] > 0 and lb["ratio_dsr_vs_snat"] > 0
    assert "ratio dsr/snat" in table and "GC of a CT map with 20,000 entries" in table
    assert "labkit grade (the command, start-up included), the same 2 copies of lab 02" in table and result["grade"]["ratio"] > 0
    assert result["grade"]["rounds"] == 2 and all(len(v) == 2 for v in result["grade"]["samples_s"].values())
    render = result["render"]  # the break-it step's SYN retries: each retry another run of the open's hops
    assert len(render["retry_hops"]) == 1 and render["retry_hops"][0] > 2 * max(render["open_hops"])
    assert "a step rendered as a notebook shows it" in table and len(result["samples"]["step_render_retries_s"]) == 2
    assert result["gc"]["read_deleted"] == {"batch": [20_000, 10_000], "per-entry": [20_000, 10_000]}
    assert not any(_netns.exists(f"lk-{name}-node-a") for name in bench.LB_MODE_LABS.values())
    xdp = result["xdp"]  # every figure of the XDP section, tc and XDP, from two rounds
    assert xdp["rounds"] == 2 and all(len(v) == 2 for m in ("tc", "xdp") for v in xdp["samples_pps"][m].values())
    assert all(xdp["median_pps"][m][k] > 0 for m in ("tc", "xdp") for k in ("sent_pps", "forwarded_pps"))
    assert xdp["median_pps"]["xdp"]["dropped_xdp_pps"] > 0 and xdp["median_pps"]["tc"]["dropped_tc_pps"] > 0
    assert "NodePort in tc vs XDP" in table
    assert not any(_netns.exists(f"lk-{name}-node-a") for name in xdpbench.XDP_LABS.values())
    kp = result["kube_proxy"]
    assert set(kp["iptables"]) == set(kp["ebpf"]) == {"100", "300"}  # JSON keys
    assert all(kp[m][n]["first_packet_s"] > 0 for m in ("iptables", "ebpf") for n in ("100", "300"))
    assert "| 300 |" in table and "iperf3 same node" in table
    agent = result["agent"]
    assert agent["services"] == 2000 and agent["rss_mb"] > 0 and len(result["samples"]["agent_restart_50k_s"]) == 2
    assert "the agent with 2,000 services in its own state" in table
    assert all(result["throughput"][p]["bpf"] > 0 and result["throughput"][p]["no_bpf"] > 0
               for p in ("same_node", "across_nodes"))
    sm = result["sockmap"]  # socket-level redirect off vs on, side by side
    assert all(sm["median"][k][m] > 0 and len(sm["samples"][k][m]) == 2 for k in ("rr_us", "stream_gbit")
               for m in ("off", "on"))
    assert "sockmap off vs on" in table and sm["conditions"]["transactions"] == 200
    assert not any(_netns.exists(f"lk-{name}-node-a") for name in bench.sockbench.LABS.values())
    policy = result["policy"]
    assert policy["update"]["identities"] == 100 and len(result["samples"]["policy_update_1000_cli_s"]) == 2
    assert policy["first_packet"]["map_entries"]["big"] == 103 and policy["first_packet"]["ratio"] > 0
    assert "policy map update, one rule change (its port) in a rule selecting 100 CIDR identities" in table
    assert not any(_netns.exists(f"lk-{name}-node-a") for name in ("bench-ipt", "bench-ebpf", "bench-tput",
                                                                     "bench-plain", "bench-fp-small", "bench-fp-big",
                                                                     "bench-agent", bench_policy.LAB))
