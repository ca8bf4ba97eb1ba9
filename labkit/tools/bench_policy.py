"""``make bench``'s network-policy figures, on one lab with policy enforcement compiled in.

    from labkit.tools.bench_policy import policy_bench, report_lines
    print("\\n".join(report_lines(policy_bench(rounds=5))))

Two measurements, both through the agent (nothing written behind it):

- **policy map update**: a1 is selected by one ingress rule whose ``fromCIDR`` lists ``IDENTITIES`` /32
  prefixes, so the agent allocates that many CIDR identities (its own allocator, into every node's
  ipcache) and a1's ``cilium_policy_<id>`` holds one key per identity. Each sample changes that rule's
  port (8080 and 9090 in turn: every identity's key is deleted and written again) and times
  ``labkit policy apply FILE``, the whole process, until it returns; the map is then read from bpffs
  and must hold the new port for every identity and the old one for none. The same change through the
  Python client's one agent call is timed too.
- **first packet with 0 vs RULES rules**: b1 connects (a fresh connection each sample, connect() until
  the SYN-ACK) to a1 and a2 in turn; one of them is selected by a policy holding the rule that lets b1
  in, the other by a policy holding that rule and ``RULES`` more (one ``fromCIDR`` prefix each: a map of
  RULES + 2 keys); which pod has the big map swaps every round, so the veth a pod sits on cannot pose
  as the map's cost. Tracing is off (trace mode ``none``): the datapath, not the monitor, is measured.
"""
from __future__ import annotations

import ipaddress
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from labkit.config import DatapathConfig
from labkit.lab import Lab
from labkit.maps.base import PinnedMap
from labkit.maps.eps import EndpointInfo, EndpointKey, IpcacheKey, RemoteEndpointInfo
from labkit.maps.policy import Direction, PolicyEntry, PolicyKey

__all__ = ["policy_bench", "report_lines", "LAB", "IDENTITIES", "RULES", "CONNECT_PAIRS"]

LAB = "bench-policy"
#: CIDR identities the changed rule selects (one /32 each), and the extra rules of the big first-packet map.
IDENTITIES = 1000
RULES = 1000
#: connect() pairs (small map, big map) per first-packet round.
CONNECT_PAIRS = 200
#: The prefixes: 198.18.128.0 and up, benchmarking space (RFC 2544) that no lab address uses (DESIGN.md §4).
_FIRST = int(ipaddress.IPv4Address("198.18.128.0"))
PORTS = (8080, 9090)

_PAIRS = r"""
import socket, statistics, sys, time
small, big, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
times = {small: [], big: []}
for i in range(n):
    for host in ((small, big) if i % 2 == 0 else (big, small)):
        s = socket.socket()
        t = time.perf_counter()
        s.connect((host, 8080))
        times[host].append(time.perf_counter() - t)
        s.close()
print(statistics.median(times[small]), statistics.median(times[big]))
"""


def _prefixes(n: int, offset: int = 0) -> list[str]:
    return [f"{ipaddress.IPv4Address(_FIRST + offset + i)}/32" for i in range(n)]


def _cnp(name: str, pod: str, ingress: list[dict]) -> dict:
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": {"name": name},
            "spec": {"endpointSelector": {"matchLabels": {"app": pod}}, "ingress": ingress}}


def wide_rule(n: int, port: int) -> dict:
    """a1 lets ``n`` /32 prefixes in on ``port``: one rule, ``n`` CIDR identities."""
    return _cnp("bench-wide", "a1", [{"fromCIDR": _prefixes(n),
                                      "toPorts": [{"ports": [{"port": str(port), "protocol": "TCP"}]}]}])


def first_packet_policy(name: str, pod: str, extra: int) -> dict:
    """``pod`` lets b1 in, plus ``extra`` rules of one prefix each (prefixes after the wide rule's)."""
    rules = [{"fromEndpoints": [{"matchLabels": {"app": "b1"}}]}]
    rules += [{"fromCIDR": [p]} for p in _prefixes(extra, offset=IDENTITIES + 16)]
    return _cnp(name, pod, rules)


def _map_of(lab, pod: str) -> str:
    p = lab.topology.pod(pod)
    with PinnedMap(f"{lab.pin_dir(p.node)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
        ep = lxc[EndpointKey.for_ip(p.ip)].lxc_id
    return f"{lab.pin_dir(p.node)}/cilium_policy_{ep:05d}"


def _cidr_identities(lab, n: int) -> list[int]:
    """The identities node-a's ipcache holds for the wide rule's prefixes (the agent allocated them)."""
    with PinnedMap(f"{lab.pin_dir('node-a')}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as m:
        held = {str(k): v.sec_identity for k, v in m.items()}
    missing = [p for p in _prefixes(n) if p not in held]
    if missing:
        raise RuntimeError(f"policy bench: expected the agent to put {n} prefixes in node-a's ipcache, "
                           f"{len(missing)} missing (first {missing[0]})")
    return [held[p] for p in _prefixes(n)]


def _check_port(lab, identities: list[int], port: int, old: int) -> int:
    """a1's pinned map holds ``port`` for every identity and ``old`` for none; returns the map's size."""
    with PinnedMap(_map_of(lab, "a1"), PolicyKey, PolicyEntry) as m:
        keys = {PolicyKey.from_bytes(bytes(k)) for k, _ in m.items_per_key()}
    want = {PolicyKey.make(i, Direction.INGRESS, 6, port) for i in identities}
    gone = {PolicyKey.make(i, Direction.INGRESS, 6, old) for i in identities}
    if not want <= keys or keys & gone:
        raise RuntimeError(f"policy bench: a1's map after the change: expected port {port} for {len(want)} "
                           f"identities and {old} for none, got {len(want & keys)} and {len(keys & gone)}")
    return len(keys)


def _update_times(lab, rounds: int, n: int) -> dict:
    lab.policy.apply(wide_rule(n, PORTS[0]))
    identities = _cidr_identities(lab, n)
    if len(set(identities)) != n:
        raise RuntimeError(f"policy bench: expected {n} distinct CIDR identities, got {len(set(identities))}")
    cli, api = [], []
    entries = 0
    cmd = [sys.executable, "-m", "labkit", "cli", "--lab", lab.name, "policy", "apply"]
    with tempfile.TemporaryDirectory(prefix="labkit-bench-policy-") as tmp:
        files = {}
        for port in PORTS:
            files[port] = os.path.join(tmp, f"wide-{port}.yaml")
            with open(files[port], "w") as f:
                json.dump(wide_rule(n, port), f)  # JSON is YAML; `policy apply` reads both
        port = PORTS[0]
        for _ in range(rounds):
            for timed in ("cli", "api"):
                old, port = port, PORTS[1] if port == PORTS[0] else PORTS[0]
                t = time.perf_counter()
                if timed == "cli":
                    subprocess.run(cmd + [files[port]], check=True, capture_output=True, timeout=120)
                else:
                    lab.policy.apply(wide_rule(n, port))
                (cli if timed == "cli" else api).append(time.perf_counter() - t)
                entries = _check_port(lab, identities, port, old)
    report = lab.policy.last_report or {}
    return {"identities": n, "map_entries": entries, "cli_s": cli, "api_s": api,
            "last_change": report.get("endpoints", {}).get("a1")}


def _first_packet(lab, rounds: int, rules: int, pairs: int) -> dict:
    a1, a2 = lab.pod("a1").ip, lab.pod("a2").ip
    small, big = [], []
    for r in range(rounds):
        lab.policy.flush()
        big_pod, small_pod = ("a2", "a1") if r % 2 == 0 else ("a1", "a2")
        lab.policy.apply(first_packet_policy("bench-small", small_pod, 0))
        lab.policy.apply(first_packet_policy("bench-big", big_pod, rules))
        lab.flush_ct()
        hosts = {"a1": a1, "a2": a2}
        out = lab.exec("b1", [sys.executable, "-c", _PAIRS, hosts[small_pod], hosts[big_pod], str(pairs)],
                       check=True, timeout=300).stdout.split()
        small.append(float(out[0]))
        big.append(float(out[1]))
    with PinnedMap(_map_of(lab, big_pod), PolicyKey, PolicyEntry) as m:
        big_entries = sum(1 for _ in m.items_per_key())
    with PinnedMap(_map_of(lab, small_pod), PolicyKey, PolicyEntry) as m:
        small_entries = sum(1 for _ in m.items_per_key())
    med_small, med_big = statistics.median(small), statistics.median(big)
    return {"rules": rules, "pairs": pairs, "rounds": rounds, "map_entries": {"small": small_entries,
                                                                              "big": big_entries},
            "small_s": small, "big_s": big, "median_s": {"small": round(med_small, 7), "big": round(med_big, 7)},
            "ratio": round(med_big / med_small, 3)}


def policy_bench(rounds: int, identities: int | None = None, rules: int | None = None,
                 pairs: int | None = None) -> dict:
    """Both policy measurements on a lab of their own (native routing, policy mode default, tracing off)."""
    name = LAB
    Lab.cleanup(name)
    lab = Lab.up(name, config=DatapathConfig(routing="native", policy="default", gc_timer=False))
    try:
        lab.trace_mode("none")
        update = _update_times(lab, rounds, identities or IDENTITIES)
        lab.policy.flush()
        first = _first_packet(lab, rounds, rules or RULES, pairs or CONNECT_PAIRS)
    finally:
        Lab.cleanup(name)
    return {"update": update, "first_packet": first}


def report_lines(result: dict) -> list[str]:
    """The report's lines for :func:`policy_bench`."""
    u, f = result["update"], result["first_packet"]
    return [
        f"policy map update, one rule change (its port) in a rule selecting {u['identities']:,} CIDR identities "
        f"the agent allocated (a1's map: {u['map_entries']:,} keys, every identity's key rewritten): "
        f"`labkit policy apply FILE` (the process, start-up included) median "
        f"{statistics.median(u['cli_s']) * 1e3:.0f} ms of {len(u['cli_s'])}, one agent call from Python "
        f"{statistics.median(u['api_s']) * 1e3:.0f} ms of {len(u['api_s'])}; the pinned map read back after "
        f"each holds the change (native routing, 2 nodes, tracing off)",
        f"first packet (b1 connect() to a pod on node-a, a fresh connection each) with the destination's policy "
        f"holding 0 vs {f['rules']:,} more rules ({f['map_entries']['small']} vs {f['map_entries']['big']:,} "
        f"map keys), taking turns, the big map's pod swapped each round, {f['rounds']} rounds of "
        f"{f['pairs']} pairs: {f['median_s']['small'] * 1e6:.0f} µs vs {f['median_s']['big'] * 1e6:.0f} µs, "
        f"ratio {f['ratio']}",
    ]
