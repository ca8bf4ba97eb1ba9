"""Socket-level redirect measured: same-node pod-to-pod TCP with ``--sockmap off`` and ``on``, side by side.

Two labs are up at once (native routing, tracing off in both, the CT GC timer off), the same but for
``sockmap``. In each, a server in a2 answers a client in a1, netperf-style, with small Python programs
run in the pods (no netperf in the lab):

* **request/response** (netperf's TCP_RR): one connection, TCP_NODELAY, ``transactions`` round trips of
  one byte each way; a sample is the median time of one transaction in that run.
* **stream** (netperf's TCP_STREAM): ``iperf3 -n stream_bytes``, one stream a1 → a2 (iperf3's default
  128 KiB sends); a sample is what the receiver counted (``end.sum_received.bits_per_second``).

Rounds alternate between the labs (off, on, off, on, ...), so both see the same machine; each figure is
the median of ``rounds`` (>= 5) samples::

    result = compare_sockmap(rounds=5)
    result["median"]["rr_us"]["on"], result["median"]["stream_gbit"]["off"]
    report_line(result)   # one markdown line, as `make bench` prints it
"""
from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time

from labkit.config import DatapathConfig
from labkit.lab import Lab

__all__ = ["compare_sockmap", "report_line", "LABS", "RR_TRANSACTIONS", "STREAM_BYTES", "RR_PORT", "STREAM_PORT"]

#: The two labs, by their sockmap mode.
LABS = {"off": "bench-smoff", "on": "bench-smon"}
RR_TRANSACTIONS = 2000
STREAM_BYTES = 64 << 20
RR_PORT, STREAM_PORT = 9201, 9202

# The request/response server (in a2): echo each byte of each connection, one connection at a time.
_RR_SERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(4)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (b := c.recv(1)):
        c.sendall(b)
    c.close()
"""
# The request/response client (in a1): N one-byte round trips; prints the median transaction in seconds.
_RR_CLIENT = r"""
import socket, statistics, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times, clock = [], time.perf_counter
for _ in range(int(sys.argv[3])):
    t = clock()
    s.sendall(b"x")
    if s.recv(1) != b"x":
        sys.exit("the server did not echo")
    times.append(clock() - t)
s.close()
print(statistics.median(times))
"""


def compare_sockmap(rounds: int = 5, transactions: int | None = None, stream_bytes: int | None = None) -> dict:
    """Both labs up at once, ``rounds`` alternating rounds of request/response and stream a1 → a2; medians.

    Returns ``{"median": {"rr_us": {"off", "on"}, "stream_gbit": {...}}, "samples": {...}, "ratio":
    {"rr_on_over_off", "stream_on_over_off"}, "conditions": {...}}``."""
    transactions = transactions or RR_TRANSACTIONS
    stream_bytes = stream_bytes or STREAM_BYTES
    labs: dict[str, Lab] = {}
    servers: list[subprocess.Popen] = []
    rr: dict[str, list[float]] = {mode: [] for mode in LABS}
    stream: dict[str, list[float]] = {mode: [] for mode in LABS}
    try:
        for mode, name in LABS.items():
            Lab.cleanup(name)
            labs[mode] = Lab.up(name, config=DatapathConfig(routing="native", gc_timer=False, sockmap=mode))
            labs[mode].trace_mode("none")  # the datapath's work, not the monitor's
            server = labs[mode].popen("a2", [sys.executable, "-c", _RR_SERVER, str(RR_PORT)],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            servers.append(server)
            if server.stdout.readline().strip() != "listening":
                raise RuntimeError(f"lab {name}: the bench server in a2 did not start")
        for _ in range(rounds):
            for mode, lab in labs.items():
                out = lab.exec("a1", [sys.executable, "-c", _RR_CLIENT, lab.pod("a2").ip, str(RR_PORT),
                                      str(transactions)], check=True, timeout=300).stdout
                rr[mode].append(float(out.strip()))
                stream[mode].append(_iperf_bytes(lab, stream_bytes))
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for name in LABS.values():
            Lab.cleanup(name)
    median = {"rr_us": {m: round(statistics.median(v) * 1e6, 2) for m, v in rr.items()},
              "stream_gbit": {m: round(statistics.median(v) * 8 / 1e9, 3) for m, v in stream.items()}}
    return {
        "median": median,
        "samples": {"rr_us": {m: [round(x * 1e6, 2) for x in v] for m, v in rr.items()},
                    "stream_gbit": {m: [round(x * 8 / 1e9, 3) for x in v] for m, v in stream.items()}},
        "ratio": {"rr_on_over_off": round(median["rr_us"]["on"] / median["rr_us"]["off"], 3),
                  "stream_on_over_off": round(median["stream_gbit"]["on"] / median["stream_gbit"]["off"], 3)},
        "conditions": {"rounds": rounds, "transactions": transactions, "stream_bytes": stream_bytes,
                       "routing": "native", "tracing": "none", "pair": "a1 -> a2 (node-a)",
                       "kernel": platform.release(), "cpus": _cpus(),
                       "client": "a Python RR client/server and iperf3, one connection per sample"},
    }


def _iperf_bytes(lab: Lab, size: int) -> float:
    """Bytes per second a2 received of ``size`` bytes iperf3 sent from a1 (one stream)."""
    server = lab.popen("a2", ["iperf3", "-s", "-1", "-p", str(STREAM_PORT)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # until the server listens
            probe = lab.exec("a2", ["ss", "-Hltn", f"sport = :{STREAM_PORT}"], timeout=10).stdout
            if probe.strip():
                break
            time.sleep(0.05)
        out = lab.exec("a1", ["iperf3", "-c", lab.pod("a2").ip, "-p", str(STREAM_PORT), "-n", str(size), "-J"],
                       check=True, timeout=300).stdout
        return float(json.loads(out)["end"]["sum_received"]["bits_per_second"]) / 8
    finally:
        server.kill()
        server.wait()


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def report_line(result: dict) -> str:
    """The comparison as one markdown line (``bench.report()`` prints it)."""
    m, c, r = result["median"], result["conditions"], result["ratio"]
    return (f"same-node pod TCP a1 -> a2, sockmap off vs on (socket-level redirect; two labs up at once, "
            f"{c['routing']} routing, tracing {c['tracing']}, medians of {c['rounds']} alternating rounds, "
            f"{c['cpus']} CPUs, kernel {c['kernel']}; client: {c['client']}): request/response of 1 byte each way "
            f"(TCP_RR-style, median of {c['transactions']:,} transactions per round) {m['rr_us']['off']:.1f} µs off, "
            f"{m['rr_us']['on']:.1f} µs on (ratio on/off {r['rr_on_over_off']}); iperf3 stream of "
            f"{c['stream_bytes'] >> 20} MiB (TCP_STREAM-style, what the receiver counted) "
            f"{m['stream_gbit']['off']:.2f} Gbit/s off, {m['stream_gbit']['on']:.2f} Gbit/s on "
            f"(ratio on/off {r['stream_on_over_off']})")
