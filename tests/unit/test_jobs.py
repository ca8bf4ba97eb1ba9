"""The grading job runner's order, time limits and crashes, with fake jobs (labkit.grading.jobs)."""
from __future__ import annotations

import os
import time
from pathlib import Path

from labkit.grading.jobs import run_jobs


# -- the job runner ------------------------------------------------------------------------------------
def _sleep_then(job):
    kind, seconds = job
    if kind == "child":  # a process of its own that must die with the job
        import subprocess

        p = subprocess.Popen(["sleep", "300"])
        Path(seconds).write_text(str(p.pid))
        time.sleep(300)
    time.sleep(seconds)
    if kind == "raise":
        raise RuntimeError("boom")
    if kind == "die":
        os._exit(3)
    if kind == "hang":
        time.sleep(300)
    return kind


def test_jobs_run_side_by_side_in_order():
    """Four half-second jobs on two workers take about two rounds, and results keep the jobs' order."""
    t = time.monotonic()
    results = run_jobs([("ok", 0.5)] * 4, _sleep_then, workers=2)
    assert [r.value for r in results] == ["ok"] * 4 and all(r.ok for r in results)
    assert time.monotonic() - t < 1.9


def test_a_job_that_raises_dies_or_hangs_never_stops_the_others(tmp_path):
    """Raising, exiting and running over the limit are each reported; the other jobs finish; finish() runs
    for every job; a timed-out job's own child processes are killed with it."""
    pidfile = tmp_path / "child.pid"
    jobs = [("raise", 0), ("ok", 0.2), ("die", 0), ("hang", 0), ("child", str(pidfile)), ("ok", 0.1)]
    finished, progress = [], []
    t = time.monotonic()
    results = run_jobs(jobs, _sleep_then, workers=3, timeout=1.5,
                       finish=lambda job, r: finished.append(job[0]), progress=lambda d, n, r: progress.append((d, n)))
    assert time.monotonic() - t < 6
    assert results[0].error.startswith("RuntimeError: boom")
    assert results[1].value == "ok" and results[5].value == "ok"
    assert results[2].error == "its process died (exit status 3)"
    assert results[3].timed_out and "time limit (1.5 s)" in results[3].error
    assert results[4].timed_out
    pid = int(pidfile.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    assert sorted(finished) == sorted(j[0] for j in jobs)
    assert progress == [(k, 6) for k in range(1, 7)]


def test_a_finish_that_raises_is_reported_on_its_job():
    """An error in finish() (a lab not taken down) is kept on the job's result; the run goes on."""
    def finish(job, result):
        raise RuntimeError("lab 'g1n0' left behind")

    results = run_jobs([("ok", 0), ("ok", 0)], _sleep_then, workers=2, finish=finish)
    assert [r.finish_error for r in results] == ["RuntimeError: lab 'g1n0' left behind"] * 2
