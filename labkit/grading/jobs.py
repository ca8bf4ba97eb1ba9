"""Jobs side by side, each in a process of its own, each with a time limit.

    results = run_jobs(jobs, execute, workers=2, timeout=600, finish=tidy, progress=show)

``execute(job)`` runs in a forked child that leads a process group of its own; what it returns
(picklable) comes back as ``JobResult.value``. A child that raises, dies or runs over ``timeout``
seconds (then its whole process group is killed) is reported in ``JobResult.error``; it never
stops the other jobs. ``finish(job, result)`` runs in the parent after every job, however it
ended (it is where a job's leftovers are taken down); ``progress(done, total, result)`` after that.
On KeyboardInterrupt every running child is killed and finished before the interrupt goes on.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

__all__ = ["JobResult", "run_jobs"]


@dataclass
class JobResult:
    """How one job ended."""

    index: int  #: its position in the jobs given
    value: Any = None  #: what ``execute`` returned (None when it did not return)
    error: str | None = None  #: why it did not return: raised, died, ran over its time limit
    timed_out: bool = False
    seconds: float = 0.0
    finish_error: str | None = None  #: what ``finish`` raised, if it did

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class _Running:
    index: int
    process: Any
    conn: Any
    started: float
    result: JobResult | None = None


def _child(execute: Callable[[Any], Any], job: Any, conn) -> None:
    try:
        os.setsid()  # a group of its own: a timeout kills the child and everything it started
    except OSError:
        pass
    try:
        value = execute(job)
    except BaseException as exc:  # anything: the parent reports it, the other jobs go on
        last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
        where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
        conn.send(("error", f"{type(exc).__name__}: {exc}{where}"))
    else:
        try:
            conn.send(("ok", value))
        except Exception as exc:  # an unpicklable value
            conn.send(("error", f"could not return the result: {type(exc).__name__}: {exc}"))
    conn.close()


def _kill(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.is_alive():  # killed before it made its own group
        process.kill()
    process.join(10)


def run_jobs(jobs: Sequence[Any], execute: Callable[[Any], Any], workers: int = 1, timeout: float | None = None,
             finish: Callable[[Any, JobResult], None] | None = None,
             progress: Callable[[int, int, JobResult], None] | None = None) -> list[JobResult]:
    """Run ``execute(job)`` for every job, at most ``workers`` at a time, each within ``timeout`` seconds.

    Returns one :class:`JobResult` per job, in the order of ``jobs``.

    >>> [r.value for r in run_jobs([1, 2, 3], abs, workers=2)]
    [1, 2, 3]
    """
    ctx = multiprocessing.get_context("fork")
    results: list[JobResult | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    running: list[_Running] = []
    done = 0

    def end(r: _Running, result: JobResult) -> None:
        nonlocal done
        r.process.join(10)
        r.conn.close()
        result.seconds = time.monotonic() - r.started
        if finish is not None:
            try:
                finish(jobs[r.index], result)
            except Exception as exc:
                result.finish_error = f"{type(exc).__name__}: {exc}"
        results[r.index] = result
        running.remove(r)
        done += 1
        if progress is not None:
            progress(done, len(jobs), result)

    try:
        while pending or running:
            while pending and len(running) < max(1, workers):
                index = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                process = ctx.Process(target=_child, args=(execute, jobs[index], send), daemon=False)
                process.start()
                send.close()
                running.append(_Running(index, process, recv, time.monotonic()))
            now = time.monotonic()
            wake = min((r.started + timeout - now for r in running), default=None) if timeout else None
            wait([r.conn for r in running] + [r.process.sentinel for r in running],
                 timeout=None if wake is None else max(0.0, wake))
            for r in list(running):
                if r.conn.poll():
                    try:
                        kind, payload = r.conn.recv()
                    except (EOFError, OSError):  # the child died without a word
                        kind, payload = "died", None
                    if kind == "ok":
                        end(r, JobResult(r.index, value=payload))
                    elif kind == "error":
                        end(r, JobResult(r.index, error=payload))
                    else:
                        r.process.join(10)
                        end(r, JobResult(r.index, error=f"its process died (exit status {r.process.exitcode})"))
                elif not r.process.is_alive():
                    end(r, JobResult(r.index, error=f"its process died (exit status {r.process.exitcode})"))
                elif timeout and time.monotonic() - r.started >= timeout:
                    _kill(r.process)
                    end(r, JobResult(r.index, error=f"ran over its time limit ({timeout:g} s) and was stopped",
                                     timed_out=True))
    finally:
        for r in list(running):  # interrupted: nothing keeps running, everything is finished
            _kill(r.process)
            end(r, JobResult(r.index, error="interrupted"))
    return [r for r in results if r is not None]
