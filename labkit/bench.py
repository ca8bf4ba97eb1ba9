"""``make bench``: the speed targets, measured here and printed side by side.

    python -m labkit.bench [--runs 5] [--out bench-report]

Each figure is the median of several runs in one process on this machine;
the report (markdown and JSON) lands in ``bench-report/``. Targets:

=========================  ========
bring-up (datapath built)  <= 5 s
down                       <= 1 s
reset                      <= 0.3 s
one ``labkit ct list``     <= 0.2 s
one notebook step          <= 0.15 s
live table, 1,000 rows     <= 0.1 s
=========================  ========
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main", "TARGETS"]

TARGETS = {"up_s": 5.0, "down_s": 1.0, "reset_s": 0.3, "ct_list_s": 0.2, "step_s": 0.15, "table_refresh_1000_s": 0.1}
LAB = "bench"


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(runs: int) -> dict:
    """Bring-up, down, reset and ct-list timings (seconds, medians) with their samples."""
    from .lab import Lab

    Lab.cleanup(LAB)
    ups, downs = [], []
    for _ in range(runs):
        ups.append(_timed(lambda: Lab.up(LAB)))
        downs.append(_timed(lambda: Lab.cleanup(LAB)))
    lab = Lab.up(LAB)
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
        cmd = [sys.executable, "-m", "labkit.cli", "--lab", LAB, "ct", "list", "node-a"]
        ct_list = [_timed(lambda: subprocess.run(cmd, check=True, capture_output=True)) for _ in range(10)]
        resets = []
        for _ in range(10):
            lab.pod("a1").exec("ping", "-c", "1", "-W", "1", lab.pod("b1").ip)
            resets.append(_timed(lab.reset))
        steps = _step_times(lab)
        refreshes = _refresh_times(lab)
    finally:
        Lab.cleanup(LAB)
    samples = {"up_s": ups, "down_s": downs, "reset_s": resets, "ct_list_s": ct_list, "step_s": steps,
               "table_refresh_1000_s": refreshes}
    return {
        "machine": {"kernel": platform.release(), "python": platform.python_version(), "cpus": _cpus()},
        "ct_rows_listed": rows,
        "median": {k: round(statistics.median(v), 4) for k, v in samples.items()},
        "samples": {k: [round(x, 4) for x in v] for k, v in samples.items()},
        "targets": TARGETS,
    }


def _step_times(lab) -> list[float]:
    """Wall time of TCP open/send/close steps: act, collect flows, read maps, diff (wire time is µs here)."""
    out = []
    for _ in range(10):
        lab.reset()
        conn = lab.pod("a1").tcp("b1")
        for action in (conn.open, lambda: conn.send(b"bench"), conn.close):
            out.append(_timed(action))
    return out


def _refresh_times(lab) -> list[float]:
    """A live table's refresh (read the kernel map, diff, render) with 1,000 rows in node-a's CT map."""
    from .maps.base import PinnedMap
    from .maps.ct import CtEntry, CtKey4
    from .widgets import CtTable

    lab.reset()
    with PinnedMap(f"{lab.pin_dir('node-a')}/cilium_ct_any4_global", CtKey4, CtEntry) as m:
        for i in range(1000):
            key = CtKey4.make("198.18.1.11", "198.18.2.11", 10000 + i, 8080, 17, 0)
            m[key] = CtEntry(lifetime=lab.clock.now() + 60, packets=1, bytes=100)
    table = CtTable(lab, "node-a")
    out = [_timed(table.refresh) for _ in range(10)]
    table.close()
    lab.reset()
    return out


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def report(result: dict) -> str:
    """The markdown table."""
    lines = ["| measure | median | target | ok |", "|---|---|---|---|"]
    for key, target in TARGETS.items():
        value = result["median"][key]
        lines.append(f"| {key[:-2]} | {value:.3f} s | <= {target} s | {'yes' if value <= target else 'NO'} |")
    lines.append("")
    lines.append(f"kernel {result['machine']['kernel']}, {result['machine']['cpus']} CPUs; "
                 f"ct list read {result['ct_rows_listed']} rows; runs per figure: {len(result['samples']['up_s'])} "
                 f"(up/down), {len(result['samples']['reset_s'])} (reset, ct list)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure, print, write the report."""
    ap = argparse.ArgumentParser(prog="labkit.bench", description="labkit speed targets")
    ap.add_argument("--runs", type=int, default=5, help="bring-ups to time (default 5)")
    ap.add_argument("--out", default="bench-report", help="directory for bench.md and bench.json")
    args = ap.parse_args(argv)
    result = measure(args.runs)
    table = report(result)
    print(table)
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    (out / "bench.md").write_text(table + "\n")
    (out / "bench.json").write_text(json.dumps(result, indent=1))
    return 0 if all(result["median"][k] <= t for k, t in TARGETS.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
