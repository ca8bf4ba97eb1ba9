"""The lab's monitor: the one consumer of every node's ``labkit_events`` ring
buffer, appending the records to ``/run/labkit/<lab>/events.bin`` for any
number of readers (``labkit trace``, notebook steps). Cilium's monitor agent
plays the same part between the datapath and Hubble.

After every write it records, in ``monitor.pos`` (one u64 per node, in
``pin_dirs`` order), how far into each ring buffer it has consumed *and*
flushed; a reader that needs every event up to now compares those with the
rings' producer positions (:func:`flushed_past`).

    python -m labkit monitor --lab demo
"""
from __future__ import annotations

import argparse
import os
import select
import signal
import struct
import sys
import time

from labkit.datapath import bpf as _bpf
from labkit.errors import LabTimeoutError
from labkit.net.ledger import LabState, Ledger, lab_dir
from labkit.observe.trace import EVENT_SIZE

__all__ = ["main", "ROTATE_BYTES", "flushed_past"]

ROTATE_BYTES = 64 * 1024 * 1024  # keep at most two files of this size


def run(lab: str) -> None:
    state = LabState.read(lab)
    rings = [_bpf.RingBuffer(_bpf.obj_get(f"{pin}/labkit_events")) for pin in state.pin_dirs.values()]
    pos_path = lab_dir(lab) / "monitor.pos"
    pos_fd = os.open(pos_path, os.O_RDWR | os.O_CREAT, 0o644)
    poller = select.epoll()
    for ring in rings:
        poller.register(ring.fd, select.EPOLLIN)
    path = lab_dir(lab) / "events.bin"
    out = open(path, "ab")
    print("monitor ready", flush=True)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    while not stopping:
        try:
            poller.poll(0.2)
        except InterruptedError:
            continue
        wrote = False
        for ring in rings:
            for rec in ring.records():
                out.write(rec[:EVENT_SIZE])
                wrote = True
        if wrote:
            out.flush()
        os.pwrite(pos_fd, struct.pack(f"={len(rings)}Q", *(r.consumer_pos() for r in rings)), 0)
        if wrote:
            if out.tell() > ROTATE_BYTES:
                out.close()
                rotated = path.with_suffix(".bin.1")
                if not rotated.exists():
                    Ledger(lab).record("file", path=str(rotated))
                os.replace(path, rotated)
                out = open(path, "ab")
    out.close()


def main(argv: list[str] | None = None) -> None:
    """Run until SIGTERM."""
    ap = argparse.ArgumentParser(prog="labkit.observe.monitor")
    ap.add_argument("--lab", required=True)
    args = ap.parse_args(argv)
    try:
        run(args.lab)
    except KeyboardInterrupt:
        sys.exit(0)



def flushed_past(lab: str, pin_dirs: dict[str, str], timeout: float = 2.0) -> None:
    """Return once the monitor has written out every event the kernel produced before this call."""
    targets = []
    for pin in pin_dirs.values():
        fd = _bpf.obj_get(f"{pin}/labkit_events")
        try:
            targets.append(_bpf.ringbuf_producer_pos(fd))
        finally:
            os.close(fd)
    path = lab_dir(lab) / "monitor.pos"
    deadline = time.monotonic() + timeout
    while True:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        if len(data) == 8 * len(targets):
            done = struct.unpack(f"={len(targets)}Q", data)
            if all(d >= t for d, t in zip(done, targets)):
                return
        if time.monotonic() > deadline:
            raise LabTimeoutError(f"lab '{lab}': the trace monitor has not caught up after {timeout} s (is it running?)")
        time.sleep(0.001)
