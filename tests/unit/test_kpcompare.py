"""The kube-proxy vs eBPF comparison without a kernel: the services both sides hold, where a service sits in
KUBE-SERVICES, the stall's statistics and the report's lines."""
from __future__ import annotations

from labkit.agent.kubeproxy import nat_table
from labkit.net.topology import Topology
from labkit.lab import kpcompare
from labkit.lab.kpcompare import report_lines, service_specs, synthetic_services

TOPO = Topology.default("demo")


def test_specs_and_services_describe_the_same_services():
    """The specs the eBPF agent gets and the Service objects iptables renders agree on name, VIP, port and endpoint."""
    specs, svcs = service_specs(12), synthetic_services(12)
    assert [(s["name"], s["vip"], s["port"]) for s in specs] == [(s.name, s.vip, s.port) for s in svcs]
    assert {b.ref for s in svcs for b in s.backends} == {"b1:8080"} and service_specs(12, 10) == specs[10:]


def test_the_last_spec_is_the_last_rule_of_kube_services():
    """Names sort as their index, so the last service is rule n of KUBE-SERVICES (the NodePorts jump is n + 1)."""
    svcs = synthetic_services(120)
    table = nat_table(svcs, TOPO)
    assert kpcompare._rule_number(table, svcs[-1].vip) == 120
    assert kpcompare._rule_number(table, svcs[7].vip) == 8


def test_stall_summary_pools_the_windows():
    """p50/p99/max are over every connect of every window; connects counts them; window_s is the median window."""
    s = kpcompare._stall_summary([0.1, 0.3, 0.2], [[1.0, 2.0], [3.0], [4.0, 5.0, 6.0]])
    assert s == {"rounds": 3, "window_s": 0.2, "connects": 6, "connects_per_window": 2, "p50_s": 3.0, "p99_s": 6.0,
                 "max_s": 6.0}
    assert kpcompare._stall_summary([0.1], [[]])["p99_s"] is None


def test_percentile_is_nearest_rank():
    """The 50th of 1..100 is 50, the 99th is 99, the 100th the maximum."""
    values = [float(v) for v in range(100, 0, -1)]
    assert [kpcompare._percentile(values, q) for q in (50, 99, 100)] == [50.0, 99.0, 100.0]


def test_report_lines_name_the_conditions_and_every_figure():
    """The report says the sizes, routing, tracing and samples, and has a row per size in each of its three tables."""
    fig = {"add_endpoint_s": 0.5, "add_endpoint_partial_s": 0.2, "save_nat_s": 0.1, "rules": 508, "full_lines": 600,
           "partial_lines": 132, "partial_equals_full": True, "first_packet_s": 1e-4, "first_packet_typical_s": 9e-5}
    stall = {"rounds": 5, "window_s": 0.05, "connects": 40, "connects_per_window": 8, "p50_s": 1e-4, "p99_s": 2e-4,
             "max_s": 3e-4}
    kp = {"sizes": [100], "iptables": {100: fig},
          "ebpf": {100: {"add_endpoint_s": 0.002, "services_in_agent": 100, "first_packet_s": 8e-5,
                         "first_packet_typical_s": 8e-5}},
          "positions": {100: {"worst": 100, "typical": 19}},
          "stall": {100: dict.fromkeys(("iptables_full", "iptables_partial", "ebpf", "baseline_iptables",
                                        "baseline_ebpf"), stall)},
          "conditions": {"routing": "native", "tracing": "off", "rounds": 5, "cpus": 2, "kernel": "6.1",
                         "client": "a1", "endpoints": "b1:8080", "ebpf_loaded_by": "apply"}}
    text = "\n".join(report_lines(kp))
    assert "sizes 100 services" in text and "native routing, tracing off, medians of 5 samples" in text
    assert "| 100 | 500.0 ms (508 nat rules) | 200.0 ms (132 lines) | 2.00 ms (100 services in the agent)" in text
    assert "rule 19 of 101" in text and text.count("| 100 |") == 2 + 5
