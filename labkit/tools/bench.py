"""``make bench``: the speed targets, measured here and printed side by side.

    python -m labkit bench [--runs 5] [--out bench-report]

Each figure is the median of several runs in one process on this machine;
the report (markdown and JSON) lands in ``bench-report/``. Targets:

=========================  ========
bring-up (datapath built)  <= 5 s    (the BPF image cached, as for every bring-up after a build's first)
down                       <= 1 s
reset                      <= 0.3 s
one ``labkit ct list``     <= 0.2 s
one notebook step          <= 0.15 s
live table, 1,000 rows     <= 0.1 s
up + down, labkitd / mn    <= 2.0x   (``labkit up`` + ``labkit down``, the commands, vs ``mn --switch lxbr --topo single,4``)
one step via labkitd       <= 1.2x   (over the same step made as root in-process)
live table via labkitd     <= 0.05 s (1,000 rows, one refresh)
load 50k services (agent)  <= 10 s    (one ``service apply`` call through the agent's API)
agent memory at 50k        <= 300 MB (RSS)
backend add/remove at 50k  <= 1 ms   (inside the agent, which holds all 50k services)
... API round trip         <= 2 ms   (a Python client, one kept connection)
... ``labkit service backend`` process  <= 0.2 s
in-agent growth 100 → 50k  <= 1.5x
agent restart at 50k       <= 5 s    (kill -9, then ``labkit agent restart`` until it serves them all)
first packet, 50k vs 10    ratio <= 1.1
policy first packet 1k/0   ratio <= 1.1 (b1 to a pod whose policy map holds 1,000 more rules, vs none)
GC, 1M entries, batch      <= 2 s
GC batch / per-entry       <= 0.2 (5x faster)
grade, 2 jobs / 1 job      <= 0.6 (6 copies of lab 02, 2 cores)
a step rendered            <= 150 ms (picture, numbered hops, ladder, CT diff: a TCP open)
... with SYN retries       <= 300 ms (lab 04's break-it step, ~54 hops)
=========================  ========

labkitd's three (:mod:`labkit.tools.doorbench`, which says exactly what each measures) are side by side in one
run: ``labkit up`` + ``labkit down`` through labkitd against Mininet's ``mn --switch lxbr --controller none --topo
single,4 --test none``, rounds alternating; one notebook step (TCP open, send, close) in a lab through labkitd
against the same in a lab built in-process as root, both up at once; a live table's refresh with 1,000 CT rows
through labkitd. Beside them the report gives the breakdown of up and down (the Python client's call, labkitd's
own time for the request, the build), each step's own medians, and the same refresh in-process.

Reported without a target: one policy rule change selecting 1,000 CIDR identities, from ``labkit policy apply``
to the pinned map holding it (:mod:`labkit.tools.bench_policy`); a build's first bring-up on this machine (BCC
compiles both nodes' datapaths; each run gets an empty image cache); the request rate of the external client to a
LoadBalancer VIP in dsr and in snat mode, two labs side by side, rounds
alternating, and their ratio; packets per second node-a forwards and drops for
a UDP flood from ext with NodePort in tc and in XDP, two labs side by side, the
sender's rate beside them (:mod:`labkit.tools.xdpbench`).

kube-proxy's iptables mode against eBPF, at 100 / 1,000 / 5,000 / 10,000 services
(``SCALE_SIZES``; the stall at ``STALL_SIZES``; at 50,000 one iptables-nft restore with --noflush
takes minutes here, so that size is left to the eBPF-only figures), the
eBPF side holding every service in its agent's own state
(:mod:`labkit.lab.kpcompare`): adding one endpoint (iptables full restore,
iptables partial sync as kube-proxy >= 1.27 writes it, one agent call), the
first packet to the last service of KUBE-SERVICES (worst case) and to one at a
random position, and the stall a client sees while each change lands (the eBPF
first-packet growth target, 100 to 10,000 services, is measured eBPF against eBPF
by ``_first_packet_side_by_side``); and iperf3 throughput pod to pod, same node and across nodes, with the
datapath attached vs the same lab with its tc programs removed (target >= 85%); same-node request/response
latency and throughput with socket-level redirect off and on, two labs side by side
(:mod:`labkit.tools.sockbench`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from labkit.agent.gc import collect_node, fill_synthetic
from labkit.config import DatapathConfig
from labkit.grading.answers import load_key
from labkit.grading.grade import answer_cells
from labkit.lab import Lab
from labkit.maps.base import PinnedMap
from labkit.maps.ct import CT_MAPS, CtEntry, CtKey4
from labkit.net.ledger import Ledger
from labkit.notebook.widgets import CtTable
from labkit.tools.bench_policy import policy_bench, report_lines as policy_report_lines
from labkit.lab.kpcompare import compare_service_modes, report_lines as kp_report_lines
from labkit.tools import doorbench, sockbench
from labkit.tools.xdpbench import report_lines as xdp_report_lines, xdp_vs_tc

__all__ = ["main", "TARGETS", "compare_service_modes", "grade_side_by_side"]

TARGETS = {"up_s": 5.0, "down_s": 1.0, "reset_s": 0.3, "ct_list_s": 0.2, "step_s": 0.15, "table_refresh_1000_s": 0.1,
           "agent_load_50k_s": 10.0, "agent_rss_50k_mb": 300.0, "backend_update_50k_s": 0.001,
           "agent_api_roundtrip_50k_s": 0.002, "cli_backend_50k_s": 0.2, "agent_update_growth_100_to_50k": 1.5,
           "agent_restart_50k_s": 5.0, "first_packet_ratio_50k_vs_10": 1.1, "gc_batch_1m_s": 2.0,
           "gc_batch_over_per_entry": 0.2, "ebpf_first_packet_growth_100_to_10k": 1.1,
           "no_bpf_over_bpf_throughput": round(1 / 0.85, 4), "grade_jobs2_over_jobs1": 0.6,
           "step_render_s": 0.15, "step_render_retries_s": 0.3, "policy_first_packet_ratio_1000_rules_vs_0": 1.1,
           "door_up_down_over_mininet": 2.0, "door_step_over_inprocess": 1.2, "door_table_refresh_1000_s": 0.05}
#: Numbers of services of the kube-proxy comparison (each size: both modes, side by side).
SCALE_SIZES = (100, 1000, 5000, 10000)
#: Sizes at which the kube-proxy comparison also measures the stall.
STALL_SIZES = (1000, 10000)
THROUGHPUT_SECONDS = 3
#: Socket-level redirect off vs on (labkit/tools/sockbench.py): round trips per RR sample, bytes per stream sample.
SOCKMAP_RR_TRANSACTIONS = sockbench.RR_TRANSACTIONS
SOCKMAP_STREAM_BYTES = sockbench.STREAM_BYTES
#: Every published figure is a median of at least this many samples.
MIN_SAMPLES = 5
#: CT entries the GC measurement fills in (half of them expired), and the map size that holds them.
GC_ENTRIES = 1_000_000
GC_MAP_SIZE = 2 ** 21
SERVICES_AT_SCALE = 50_000
#: The eBPF first-packet growth target compares 100 services loaded with this many.
GROWTH_SERVICES = 10_000
#: 50,000 services need 100,000 slots: more than Cilium's default --bpf-lb-map-max (65536), as on a real node.
BENCH_CONFIG = {"lb_map_size": 131072, "gc_timer": False}
LAB = "bench"
#: The two labs of the dsr/snat comparison: native routing, so the only difference is the LB mode.
LB_MODE_LABS = {"dsr": "bench-dsr", "snat": "bench-snat"}
LB_REQUESTS = 300
#: ``labkit grade`` side by side: this many copies of lab 02 (reference answers), --jobs GRADE_JOBS vs --jobs 1.
GRADE_COPIES = 6
GRADE_JOBS = 2
GRADE_LAB = "02"
#: seconds one `labkit grade` run of the bench may take (a fraction of the notebooks' own limits: a run that
#: hangs is a fault to report, not a figure)
GRADE_RUN_LIMIT = 900

_REQUESTS = r"""
import socket, sys, time
vip, n = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
for _ in range(n):
    s = socket.create_connection((vip, 80), timeout=5)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    while s.recv(4096):
        pass
    s.close()
print(time.perf_counter() - t)
"""


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _cold_up(name: str) -> float:
    """One bring-up as on a machine that never built this datapath: the loaders find an empty image cache."""


    before = os.environ.get("LABKIT_BPF_CACHE")
    with tempfile.TemporaryDirectory(prefix="labkit-bench-cache-") as empty:
        os.environ["LABKIT_BPF_CACHE"] = empty  # the loaders inherit it
        try:
            return _timed(lambda: Lab.up(name))
        finally:
            if before is None:
                del os.environ["LABKIT_BPF_CACHE"]
            else:
                os.environ["LABKIT_BPF_CACHE"] = before


def measure(runs: int) -> dict:
    """Bring-up, down, reset and ct-list timings (seconds, medians) with their samples."""

    Lab.cleanup(LAB)
    ups, downs, cold = [], [], []
    Lab.up(LAB)  # untimed: the image cache holds this build before "cached" bring-ups are timed
    Lab.cleanup(LAB)
    for _ in range(runs):
        cold.append(_cold_up(LAB))
        Lab.cleanup(LAB)
        ups.append(_timed(lambda: Lab.up(LAB)))
        downs.append(_timed(lambda: Lab.cleanup(LAB)))

    lab = Lab.up(LAB, config=DatapathConfig(**BENCH_CONFIG))
    try:
        # Some state to list and flush: 20 pings and 20 short TCP connections.
        for _ in range(20):
            lab.pod("a1").exec("ping", "-c", "1", "-W", "1", lab.pod("b1").ip)
        code = (
            "import socket\nfor i in range(20):\n s=socket.create_connection(('%s',8080));"
            "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n');s.recv(200);s.close()" % lab.pod("b2").ip
        )
        lab.pod("a2").exec(sys.executable, "-c", code)
        rows = len(lab.ct("node-a"))
        cmd = [sys.executable, "-m", "labkit", "cli", "--lab", LAB, "ct", "list", "node-a"]
        ct_list = [_timed(lambda: subprocess.run(cmd, check=True, capture_output=True)) for _ in range(10)]
        resets = []
        for _ in range(10):
            lab.pod("a1").exec("ping", "-c", "1", "-W", "1", lab.pod("b1").ip)
            resets.append(_timed(lab.reset))
        steps = _step_times(lab)
        refreshes = _refresh_times(lab)
        render = _render_times(lab, max(runs, MIN_SAMPLES))
    finally:
        Lab.cleanup(LAB)
    door = {"up_down": doorbench.up_down_vs_mininet(max(runs, MIN_SAMPLES)),  # each takes its own labs down
            "step": doorbench.step_door_vs_inprocess(max(runs, MIN_SAMPLES)),
            "table": doorbench.table_refresh_door(max(runs, MIN_SAMPLES))}
    agent = agent_scale(max(runs, MIN_SAMPLES))
    samples = {"up_s": ups, "up_first_s": cold, "down_s": downs, "reset_s": resets, "ct_list_s": ct_list, "step_s": steps,
               "table_refresh_1000_s": refreshes, "step_render_s": render["open_s"],
               "step_render_retries_s": render["retries_s"], **agent["samples"],
               "door_up_down_s": door["up_down"]["samples_s"]["labkit"],
               "mininet_up_down_s": door["up_down"]["samples_s"]["mininet"],
               "door_step_s": door["step"]["samples_s"]["door"]["all"],
               "door_step_inprocess_s": door["step"]["samples_s"]["inprocess"]["all"],
               "door_table_refresh_1000_s": door["table"]["samples_s"]["door"]}
    medians = {k: round(statistics.median(v), 6) for k, v in samples.items()}
    medians["door_up_down_over_mininet"] = door["up_down"]["ratio"]
    medians["door_step_over_inprocess"] = door["step"]["ratio"]
    medians["agent_update_growth_100_to_50k"] = round(
        statistics.median(samples["backend_update_50k_s"]) / statistics.median(samples["backend_update_100_s"]), 3)
    medians["agent_rss_50k_mb"] = agent["rss_mb"]
    ratio_50k = _first_packet_side_by_side(10, SERVICES_AT_SCALE + 10, rounds=max(runs, MIN_SAMPLES))
    medians["first_packet_ratio_50k_vs_10"] = ratio_50k["ratio"]
    lb_modes = _lb_mode_rates(max(runs, MIN_SAMPLES))
    xdp = xdp_vs_tc(max(runs, MIN_SAMPLES))
    kube_proxy = compare_service_modes(SCALE_SIZES, stall_sizes=[n for n in STALL_SIZES if n in SCALE_SIZES]
                                       or SCALE_SIZES[-1:])
    growth = _first_packet_side_by_side(100, GROWTH_SERVICES, rounds=max(runs, MIN_SAMPLES))
    medians["ebpf_first_packet_growth_100_to_10k"] = growth["ratio"]
    throughput = _throughput(THROUGHPUT_SECONDS, rounds=max(runs, MIN_SAMPLES))
    sockmap = sockbench.compare_sockmap(rounds=max(runs, MIN_SAMPLES), transactions=SOCKMAP_RR_TRANSACTIONS,
                                        stream_bytes=SOCKMAP_STREAM_BYTES)
    medians["no_bpf_over_bpf_throughput"] = round(
        max(1 / throughput[p]["share"] for p in ("same_node", "across_nodes")), 4)
    gc = _gc_scale(max(runs, MIN_SAMPLES))
    samples["gc_batch_1m_s"] = gc["batch_s"]
    medians["gc_batch_1m_s"] = round(statistics.median(gc["batch_s"]), 4)
    medians["gc_batch_over_per_entry"] = round(medians["gc_batch_1m_s"] / statistics.median(gc["per_entry_s"]), 4)
    graded = grade_side_by_side(max(runs, MIN_SAMPLES))
    medians["grade_jobs2_over_jobs1"] = graded["ratio"]
    policy = policy_bench(max(runs, MIN_SAMPLES))
    samples["policy_update_1000_cli_s"] = policy["update"]["cli_s"]
    medians["policy_update_1000_cli_s"] = round(statistics.median(policy["update"]["cli_s"]), 4)
    medians["policy_first_packet_ratio_1000_rules_vs_0"] = policy["first_packet"]["ratio"]
    return {
        "door": door,
        "policy": policy,
        "grade": graded,
        "first_packet_side_by_side": {"10_vs_50k": ratio_50k, "100_vs_10k": growth},
        "kube_proxy": kube_proxy,
        "throughput": throughput,
        "sockmap": sockmap,
        "gc": gc,
        "lb_modes": lb_modes,
        "xdp": xdp,
        "agent": {k: v for k, v in agent.items() if k != "samples"},
        "machine": {"kernel": platform.release(), "python": platform.python_version(), "cpus": _cpus()},
        "date": time.strftime("%Y-%m-%d"),
        "ct_rows_listed": rows,
        "render": {k: v for k, v in render.items() if not k.endswith("_s")},
        "median": medians,
        "samples": {k: [round(x, 4) for x in v] for k, v in samples.items()},
        "targets": TARGETS,
    }


def _step_times(lab, connections: int = 10) -> list[float]:
    """Wall time of TCP open/send/close steps: act, collect flows, read maps, diff (wire time is µs here); a lab
    reset before each of ``connections`` connections a1 -> b1, three times per connection (open, send, close)."""
    out = []
    for _ in range(connections):
        lab.reset()
        conn = lab.pod("a1").tcp("b1")
        for action in (conn.open, lambda: conn.send(b"bench"), conn.close):
            out.append(_timed(action))
    return out


def _render_times(lab, rounds: int) -> dict:
    """A step rendered as a notebook shows it (``Step._repr_html_``: path picture, numbered hops, raw records,
    ladder, CT diff), each sample a new step rendered once: a TCP open a1 -> b1, and lab 04's break-it step (the
    reverse NAT skipped, so a1 retries its SYN: every retry a new run of hops)."""
    from labkit.notebook.viz import hops

    lab.reset()
    opens, open_hops = [], set()
    for _ in range(2 * rounds):
        conn = lab.pod("a1").tcp("b1")
        step = conn.open()
        open_hops.add(len(hops(step.flows, lab.topology)))
        opens.append(_timed(step._repr_html_))
        conn.close()
    lab.services.add("bench-web", 80, ["b1:8080"])
    lab.fault("skip-rev-nat")
    retries, retry_hops = [], set()
    try:
        for _ in range(rounds):
            lab.flush_ct()
            step = lab.pod("a1").tcp("bench-web", 80).open()
            retry_hops.add(len(hops(step.flows, lab.topology)))
            retries.append(_timed(step._repr_html_))
    finally:
        lab.fault("skip-rev-nat", on=False)
        lab.services.remove("bench-web")
        lab.reset()
    return {"open_s": opens, "retries_s": retries, "open_hops": sorted(open_hops), "retry_hops": sorted(retry_hops)}


def _refresh_times(lab) -> list[float]:
    """A live table's refresh (read the kernel map, diff, render) with 1,000 rows in node-a's CT map, written as
    root; ``lab`` built in-process or held through labkitd (:class:`labkit.client.Lab`: :mod:`.doorbench`)."""

    lab.reset()
    now = lab.clock.now()  # once: through labkitd each reading is a request
    with PinnedMap(f"{lab.pin_dir('node-a')}/cilium_ct_any4_global", CtKey4, CtEntry) as m:
        for i in range(1000):
            key = CtKey4.make("198.18.1.11", "198.18.2.11", 10000 + i, 8080, 17, 0)
            m[key] = CtEntry(lifetime=now + 60, packets=1, bytes=100)
    table = CtTable(lab, "node-a")
    out = [_timed(table.refresh) for _ in range(10)]
    read = len(table.rows)
    table.close()
    if table.refresh_count != len(out) or read < 1000:  # refresh() never raises: a failed one shows in its status
        raise RuntimeError(f"live table of {lab.name}: {table.refresh_count} of {len(out)} refreshes read the maps, "
                           f"{read} rows, expected >= 1000 ({table.last_error!r})")
    lab.reset()
    return out


_CONNECT_TIMES = r"""
import socket, statistics, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(n):
    s = socket.socket()
    t = time.perf_counter()
    s.connect((host, port))
    times.append(time.perf_counter() - t)
    s.close()
print(statistics.median(times))
"""


def _first_packet(lab, vip: str, n: int = 300) -> float:
    """Median connect() time (SYN out, SYN-ACK back) from a1 to vip:80, in seconds."""
    r = lab.pod("a1").exec(sys.executable, "-c", _CONNECT_TIMES, vip, "80", str(n), timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"connect timing failed: {r.stderr[-500:]}")
    return float(r.stdout.strip())


def _lb_mode_rates(rounds: int) -> dict:
    """Requests per second from ext to a LoadBalancer VIP (backend b1 on node-b: the remote case) in a dsr
    lab and a snat lab, both up at once, rounds alternating; tracing off so only the datapath is measured."""

    labs = {}
    try:
        for mode, name in LB_MODE_LABS.items():
            Lab.cleanup(name)
            labs[mode] = Lab.up(name, config=DatapathConfig(routing="native", lb_mode=mode))
            labs[mode].services.add("web", 80, ["b1:8080"], type="LoadBalancer")
            labs[mode].trace_mode("none")
        vips = {mode: lab.services.get("web").lb_vip for mode, lab in labs.items()}
        rates: dict[str, list[float]] = {mode: [] for mode in labs}
        for _ in range(rounds):
            for mode, lab in labs.items():
                out = lab.exec("ext", [sys.executable, "-c", _REQUESTS, vips[mode], str(LB_REQUESTS)],
                               check=True, timeout=120).stdout
                rates[mode].append(LB_REQUESTS / float(out.strip()))
    finally:
        for name in LB_MODE_LABS.values():
            Lab.cleanup(name)
    medians = {mode: round(statistics.median(r), 1) for mode, r in rates.items()}
    return {"requests_per_round": LB_REQUESTS, "rounds": rounds, "median_rps": medians,
            "samples_rps": {m: [round(x, 1) for x in r] for m, r in rates.items()},
            "ratio_dsr_vs_snat": round(medians["dsr"] / medians["snat"], 3)}


def _gc_scale(rounds: int) -> dict:
    """GC of a CT map holding GC_ENTRIES entries, half expired: batch and per-entry scans of the same
    fill, alternating, ``rounds`` each."""

    name = "bench-gc"
    Lab.cleanup(name)
    lab = Lab.up(name, config=DatapathConfig(routing="native", gc_timer=False, ct_tcp_size=GC_MAP_SIZE))
    times: dict[str, list[float]] = {"batch": [], "per-entry": []}
    counts = {}
    try:
        pin = lab.pin_dir("node-a")
        for _ in range(rounds):
            for mode in times:
                lab.flush_ct("node-a")
                now = lab.clock.now()
                fill_synthetic(pin, GC_ENTRIES, now)
                t = time.perf_counter()
                (scan,) = collect_node("node-a", pin, now, mode, map_names=(CT_MAPS[0],))
                times[mode].append(time.perf_counter() - t)
                counts[mode] = (scan.scanned, scan.deleted)
    finally:
        Lab.cleanup(name)
    return {"entries": GC_ENTRIES, "map_size": GC_MAP_SIZE, "rounds": rounds, "batch_s": times["batch"],
            "per_entry_s": times["per-entry"], "read_deleted": counts,
            "speedup": round(statistics.median(times["per-entry"]) / statistics.median(times["batch"]), 2)}


def grade_side_by_side(rounds: int, copies: int | None = None) -> dict:
    """Wall time of the ``labkit grade`` command, as an instructor runs it (a fresh process each time, its
    start-up included), on the same ``copies`` copies of lab 02 (reference answers, a learner folder each),
    with ``--jobs GRADE_JOBS`` and with ``--jobs 1``, ``rounds`` runs of each, alternating; medians and their
    ratio. Every notebook runs in a fresh lab, as an instructor's grading does."""
    copies = copies or GRADE_COPIES
    labs = Path(__file__).resolve().parents[2] / "labs"
    [source] = labs.glob(f"{GRADE_LAB}-*.ipynb")
    nb = nbformat.read(source, as_version=4)
    key = load_key(GRADE_LAB)
    for ex, i in answer_cells(nb).items():
        nb.cells[i].source = key[ex].answer
    times: dict[int, list[float]] = {GRADE_JOBS: [], 1: []}
    passed: dict[int, list[int]] = {GRADE_JOBS: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="labkit-bench-grade-") as tmp:
        paths = []
        for k in range(copies):
            path = Path(tmp) / f"learner{k}" / source.name
            path.parent.mkdir()
            nbformat.write(nb, path)
            paths.append(str(path))
        for _ in range(rounds):
            for jobs in times:
                argv = [sys.executable, "-m", "labkit", "cli", "grade", *paths, "--jobs", str(jobs),
                        "--lab-tag=-bench", "--json", "--quiet"]
                t = time.perf_counter()
                try:
                    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=GRADE_RUN_LIMIT)
                except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as exc:
                    said = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
                    raise RuntimeError(f"`{' '.join(argv[2:])}` did not finish well ({exc}); it said: "
                                       f"{said.strip()[-2000:] or '(nothing)'}") from None
                times[jobs].append(time.perf_counter() - t)
                report = json.loads(out.stdout)
                passed[jobs].append(sum(e["passed"] for n in report["notebooks"] for e in n["exercises"]))
    med = {jobs: statistics.median(t) for jobs, t in times.items()}
    return {"copies": copies, "lab": GRADE_LAB, "jobs": GRADE_JOBS, "rounds": rounds,
            "median_s": {str(j): round(v, 2) for j, v in med.items()},
            "samples_s": {str(j): [round(x, 2) for x in t] for j, t in times.items()},
            "exercises_passed": {str(j): p for j, p in passed.items()},
            "exercises": copies * len(key), "ratio": round(med[GRADE_JOBS] / med[1], 3)}


def grade_line(g: dict, cpus: int) -> str:
    """The report's line for :func:`grade_side_by_side`."""
    return (f"labkit grade (the command, start-up included), the same {g['copies']} copies of lab {g['lab']} "
            f"(reference answers, a fresh lab each): "
            f"--jobs {g['jobs']} {g['median_s'][str(g['jobs'])]:.1f} s, --jobs 1 {g['median_s']['1']:.1f} s, ratio "
            f"{g['ratio']} (medians of {g['rounds']} runs each, alternating, {cpus} CPUs; exercises passed per run: "
            f"{', '.join(map(str, g['exercises_passed'][str(g['jobs'])]))} of {g['exercises']})")


_CONNECT_PAIRS = r"""
import ctypes, os, socket, statistics, sys, time
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000
netns = [os.open(f"/run/netns/{name}", os.O_RDONLY) for name in (sys.argv[1], sys.argv[3])]
targets, n = [(sys.argv[2], 80), (sys.argv[4], 80)], int(sys.argv[5])
times = [[], []]
for i in range(n):
    for k in ((0, 1) if i % 2 == 0 else (1, 0)):
        if libc.setns(netns[k], CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns")
        s = socket.socket()  # a socket belongs to the namespace it was made in
        t = time.perf_counter()
        s.connect(targets[k])
        times[k].append(time.perf_counter() - t)
        s.close()
print(statistics.median(times[0]), statistics.median(times[1]))
"""


def _first_packet_side_by_side(small: int, big: int, rounds: int) -> dict:
    """First-packet time to the last-added service with ``small`` and with ``big`` services loaded: two eBPF
    labs up at once, and one client process that takes turns between a1 of one and a1 of the other, connect()
    by connect(), so both see the same CPU and scheduling; ``rounds`` runs of 400 pairs, medians."""

    names = {small: "bench-fp-small", big: "bench-fp-big"}
    labs, vips, times = {}, {}, {small: [], big: []}
    try:
        for n, name in names.items():
            Lab.cleanup(name)
            labs[n] = Lab.up(name, config=DatapathConfig(routing="native", gc_timer=False, lb_map_size=131072))
            labs[n].trace_mode("none")
            specs = _agent_specs(n)
            labs[n].services.apply(specs)  # every service in the agent's own state
            vips[n] = specs[-1]["vip"]
        argv = [sys.executable, "-c", _CONNECT_PAIRS, labs[small].topology.netns("a1"), vips[small],
                labs[big].topology.netns("a1"), vips[big], "400"]
        for _ in range(rounds):
            out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout.split()
            times[small].append(float(out[0]))
            times[big].append(float(out[1]))
    finally:
        for name in names.values():
            Lab.cleanup(name)
    med = {n: statistics.median(t) for n, t in times.items()}
    return {"small": small, "big": big, "rounds": rounds, "median_s": {str(n): round(v, 7) for n, v in med.items()},
            "samples_s": {str(n): [round(x, 7) for x in t] for n, t in times.items()},
            "ratio": round(med[big] / med[small], 3)}


_IPERF_JSON_KEY = ("end", "sum_received", "bits_per_second")


def _iperf(lab, client: str, server: str, seconds: int) -> float:
    """Bits per second from ``client`` to ``server`` (iperf3, one stream)."""
    import json
    import subprocess

    srv = lab.popen(server, ["iperf3", "-s", "-1", "-p", "5201"], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        r = lab.exec(client, ["iperf3", "-c", lab.pod(server).ip, "-p", "5201", "-t", str(seconds), "-O", "1", "-J"],
                     timeout=seconds + 30)
        data = json.loads(r.stdout)
        for k in _IPERF_JSON_KEY:
            data = data[k]
        return float(data)
    finally:
        srv.kill()
        srv.wait()


def _throughput(seconds: int, rounds: int = 3) -> dict:
    """iperf3 a1 → a2 (same node) and a1 → b1 (across, native routing): a lab with its datapath and the same
    lab built again with every tc program removed (clsact qdiscs deleted), both up at once, rounds
    alternating; medians."""
    import statistics as st


    names = {"bpf": "bench-tput", "no_bpf": "bench-plain"}
    labs, samples = {}, {}
    try:
        for phase, name in names.items():
            Lab.cleanup(name)
            labs[phase] = Lab.up(name, config=DatapathConfig(routing="native", gc_timer=False))
            labs[phase].trace_mode("none")  # the datapath's work, not the monitor's
        for e in Ledger(names["no_bpf"]).entries("qdisc"):
            labs["no_bpf"].exec(e["netns"].removeprefix(f"lk-{names['no_bpf']}-"),
                                ["tc", "qdisc", "del", "dev", e["ifname"], "clsact"])
        for _ in range(rounds):
            for pair, (a, b) in (("same_node", ("a1", "a2")), ("across_nodes", ("a1", "b1"))):
                for phase, lab in labs.items():
                    samples.setdefault(pair, {}).setdefault(phase, []).append(_iperf(lab, a, b, seconds))
    finally:
        for name in names.values():
            Lab.cleanup(name)
    out = {}
    for pair, by_phase in samples.items():
        out[pair] = {phase: st.median(v) for phase, v in by_phase.items()}
        out[pair]["share"] = round(out[pair]["bpf"] / out[pair]["no_bpf"], 3)
        out[pair]["samples"] = by_phase
    out["rounds"] = rounds
    return out


def _agent_specs(n: int) -> list[dict]:
    """``n`` one-backend ClusterIP services (b1:8080) on VIPs from 198.19.1.1, as ``service apply`` takes them."""
    import ipaddress

    base = int(ipaddress.IPv4Address("198.19.1.1"))
    return [{"name": f"s{i}", "port": 80, "vip": str(ipaddress.IPv4Address(base + i)), "backends": ["b1:8080"]}
            for i in range(n)]


def _updates(lab, name: str, pairs: int) -> tuple[list[float], list[float]]:
    """``pairs`` backend adds and removes on service ``name``: (seconds inside the agent, API round trips)."""
    inside, rt = [], []
    for _ in range(pairs):
        for call in (lambda: lab.services.add_backend(name, "b2:8080"),
                     lambda: lab.services.remove_backend(name, "b2:8080")):
            t = time.perf_counter()
            call()
            rt.append(time.perf_counter() - t)
            inside.append(lab.services.last_agent_seconds)
    return inside, rt


def agent_scale(rounds: int, n: int | None = None) -> dict:
    """The agent holding every service in its own state (nothing written behind it), in a lab of its own:

    - ``agent_load_50k_s``: ``n`` services through the agent in one apply call (an API call from Python: the
      body sent, checked, written to both nodes' maps, journalled), ``rounds`` times, flushed in between;
    - ``agent_rss_50k_mb``: the agent process's resident memory once it holds them;
    - ``backend_update_100_s`` / ``backend_update_50k_s``: one backend add or remove as timed inside the agent
      (its ``agent_seconds``), with 100 services and with ``n``; ``agent_api_roundtrip_50k_s`` the same calls
      timed by the client; ``cli_backend_50k_s`` the whole ``labkit service backend … --add/--remove`` process;
    - ``agent_restart_50k_s``: SIGKILL of the agent, then ``lab.restart_agent()`` until it answers with all
      ``n`` services restored (journal read, every map checked against it)."""
    import signal

    n = n or SERVICES_AT_SCALE
    name = "bench-agent"
    Lab.cleanup(name)
    lab = Lab.up(name, config=DatapathConfig(routing="native", **BENCH_CONFIG))
    samples: dict[str, list[float]] = {k: [] for k in ("agent_load_50k_s", "backend_update_100_s",
                                                       "backend_update_50k_s", "agent_api_roundtrip_50k_s",
                                                       "cli_backend_50k_s", "agent_restart_50k_s")}
    try:
        lab.trace_mode("none")
        lab.services.apply(_agent_specs(100))
        inside, _ = _updates(lab, "s9", 20)
        samples["backend_update_100_s"] = inside
        lab.services.flush()
        specs = _agent_specs(n)
        for r in range(rounds):
            t = time.perf_counter()
            lab.services.apply(specs)
            samples["agent_load_50k_s"].append(time.perf_counter() - t)
            if r < rounds - 1:
                lab.services.flush()
        pid = [e for e in Ledger(name).entries("process") if e["name"] == "agent"][-1]["pid"]
        rss_kb = int(next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:")))
        inside, rt = _updates(lab, "s9", 20)
        samples["backend_update_50k_s"], samples["agent_api_roundtrip_50k_s"] = inside, rt
        cmd = [sys.executable, "-m", "labkit", "cli", "--lab", name, "service", "backend", "s9", "b2:8080"]
        for _ in range(max(rounds, MIN_SAMPLES)):
            for flag in ("--add", "--remove"):
                samples["cli_backend_50k_s"].append(_timed(lambda: subprocess.run(cmd + [flag], check=True,
                                                                                   capture_output=True)))
        for _ in range(rounds):
            pid = [e for e in Ledger(name).entries("process") if e["name"] == "agent"][-1]["pid"]
            os.kill(pid, signal.SIGKILL)
            t = time.perf_counter()
            status = lab.restart_agent()
            samples["agent_restart_50k_s"].append(time.perf_counter() - t)
            if status["restored"]["services"] != n:
                raise RuntimeError(f"agent restart restored {status['restored']['services']} services, expected {n}")
        restored = status["restored"]
    finally:
        Lab.cleanup(name)
    return {"services": n, "rounds": rounds, "rss_mb": round(rss_kb / 1024, 1), "samples": samples,
            "restored": {k: restored.get(k) for k in ("source", "checked", "seconds")}}


def _cpus() -> int:

    return os.cpu_count() or 0


def report(result: dict) -> str:
    """The markdown table."""
    lines = ["| measure | median | target | ok |", "|---|---|---|---|"]
    for key, target in TARGETS.items():
        value = result["median"][key]
        unit = " s" if key.endswith("_s") else " MB" if key.endswith("_mb") else ""
        name = key[:-2] if key.endswith("_s") else key[:-3] if key.endswith("_mb") else key
        lines.append(f"| {name} | {value:.4f}{unit} | <= {target}{unit} | {'yes' if value <= target else 'NO'} |")
    lines.append("")
    lines.append(f"a build's first bring-up on this machine (BCC compiles; empty image cache each run): median "
                 f"{statistics.median(result['samples']['up_first_s']):.2f} s of "
                 f"{len(result['samples']['up_first_s'])}, against {result['median']['up_s']:.2f} s with the image cached")
    lines.append(f"kernel {result['machine']['kernel']}, {result['machine']['cpus']} CPUs; "
                 f"ct list read {result['ct_rows_listed']} rows; runs per figure: {len(result['samples']['up_s'])} "
                 f"(up/down), {len(result['samples']['reset_s'])} (reset, ct list)")
    ag, fp = result["agent"], result["first_packet_side_by_side"]
    for key in ("10_vs_50k", "100_vs_10k"):
        f = fp[key]
        lines.append(f"first packet to the last-added service, {f['small']:,} vs {f['big']:,} services loaded (two "
                     f"eBPF labs side by side, one client taking turns, {f['rounds']} runs of 400 pairs): "
                     f"{f['median_s'][str(f['small'])] * 1e6:.0f} µs vs {f['median_s'][str(f['big'])] * 1e6:.0f} µs, "
                     f"ratio {f['ratio']}")
    lines.append(f"the agent with {ag['services']:,} services in its own state (routing native, tracing off): load by "
                 f"one apply call median {statistics.median(result['samples']['agent_load_50k_s']):.2f} s of "
                 f"{ag['rounds']}; RSS {ag['rss_mb']} MB; backend add/remove inside the agent "
                 f"{result['median']['backend_update_50k_s'] * 1e3:.3f} ms (with 100 services "
                 f"{result['median']['backend_update_100_s'] * 1e3:.3f} ms), API round trip "
                 f"{result['median']['agent_api_roundtrip_50k_s'] * 1e3:.2f} ms, whole CLI process "
                 f"{result['median']['cli_backend_50k_s']:.3f} s (medians of 40, 40 and "
                 f"{len(result['samples']['cli_backend_50k_s'])}); restart after kill -9 "
                 f"{result['median']['agent_restart_50k_s']:.2f} s ({ag['restored']['checked']})")
    gc = result["gc"]
    lines.append(f"GC of a CT map with {gc['entries']:,} entries, half expired (median of {gc['rounds']}): batch "
                 f"{statistics.median(gc['batch_s']):.3f} s, per-entry {statistics.median(gc['per_entry_s']):.3f} s, "
                 f"batch {gc['speedup']}x faster")
    lines.append("")
    lines += kp_report_lines(result["kube_proxy"])
    tp = result["throughput"]
    lines.append("")
    lines.append(" ".join(f"iperf3 {pair.replace('_', ' ')}: {tp[pair]['bpf'] / 1e9:.2f} Gbit/s with the datapath, "
                          f"{tp[pair]['no_bpf'] / 1e9:.2f} without ({tp[pair]['share']:.0%});"
                          for pair in ("same_node", "across_nodes"))
                 + f" medians of {tp['rounds']} alternating rounds of {THROUGHPUT_SECONDS} s, one stream, two labs side "
                   f"by side (native routing, tracing off: trace mode 'none' in both)")
    if "sockmap" in result:
        lines.append(sockbench.report_line(result["sockmap"]))
    lb = result["lb_modes"]
    lines.append(f"ext -> LoadBalancer VIP, backend on the other node, {lb['requests_per_round']} requests "
                 f"(connect, GET, answer, close) per round, median of {lb['rounds']} alternating rounds: "
                 f"dsr {lb['median_rps']['dsr']} req/s, snat {lb['median_rps']['snat']} req/s, "
                 f"ratio dsr/snat {lb['ratio_dsr_vs_snat']}")
    if "xdp" in result:
        lines.append("")
        lines += xdp_report_lines(result["xdp"])
    if "render" in result:
        r = result["render"]
        lines.append(f"a step rendered as a notebook shows it (path picture, numbered hops, raw records, ladder, CT "
                     f"diff; a new step each sample): TCP open a1 -> b1 ({'/'.join(map(str, r['open_hops']))} hops) "
                     f"median {result['median']['step_render_s'] * 1e3:.0f} ms of "
                     f"{len(result['samples']['step_render_s'])}; lab 04's break-it step (reverse NAT skipped, SYN "
                     f"retries: {'/'.join(map(str, r['retry_hops']))} hops) median "
                     f"{result['median']['step_render_retries_s'] * 1e3:.0f} ms of "
                     f"{len(result['samples']['step_render_retries_s'])}")
    if "grade" in result:
        lines.append(grade_line(result["grade"], result["machine"]["cpus"]))
    if "policy" in result:
        lines += policy_report_lines(result["policy"])
    if "door" in result:
        lines.append("")
        lines += doorbench.report_lines(result["door"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print, write the report."""
    ap = argparse.ArgumentParser(prog="labkit.tools.bench", description="labkit speed targets")
    ap.add_argument("--runs", type=int, default=5, help="bring-ups to time (default 5)")
    ap.add_argument("--out", default="bench-report", help="directory for bench.md and bench.json")
    ap.add_argument("--readme", metavar="PATH",
                    help="also put the report into PATH between the bench markers (the project's README.md)")
    args = ap.parse_args(argv)
    result = measure(args.runs)
    result["commit"] = _commit()
    table = report(result)
    print(table)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    (out / "bench.md").write_text(table + "\n")
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    if args.readme:
        path = Path(args.readme)
        path.write_text(put_in_readme(path.read_text(), table, result))
    return 0 if all(result["median"][k] <= t for k, t in TARGETS.items()) else 1


#: The README's generated part lies between these lines (``labkit bench --readme README.md`` rewrites it).
README_BEGIN = "<!-- bench: generated by `make bench` from one run; do not edit by hand -->"
README_END = "<!-- bench: end -->"


def put_in_readme(text: str, table: str, result: dict) -> str:
    """``text`` with the part between :data:`README_BEGIN` and :data:`README_END` replaced by one run's report,
    naming the commit it measured, the date and the machine.

    >>> put_in_readme(f"a\\n{README_BEGIN}\\nold\\n{README_END}\\nb\\n", "| t |", {"commit": "abc1234",
    ...               "date": "2026-12-01", "machine": {"kernel": "6.18", "cpus": 2}}).splitlines()[2]
    'One run of `make bench` at commit abc1234 on 2026-12-01 (kernel 6.18, 2 CPUs):'
    """
    begin, end = text.find(README_BEGIN), text.find(README_END)
    if begin < 0 or end < begin:
        raise ValueError(f"README: expected the lines {README_BEGIN!r} and {README_END!r} around the bench report")
    m = result["machine"]
    head = (f"One run of `make bench` at commit {result.get('commit') or 'unknown'} on {result.get('date')} "
            f"(kernel {m['kernel']}, {m['cpus']} CPUs):")
    return text[:begin] + f"{README_BEGIN}\n{head}\n\n{table}\n" + text[end:]


def _commit() -> str | None:
    """The commit this labkit was measured at (``git describe``-like: short hash, ``+dirty`` if changed)."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")

