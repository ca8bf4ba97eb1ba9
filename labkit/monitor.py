"""The lab's monitor: the one consumer of every node's ``labkit_events`` ring
buffer, appending the records to ``/run/labkit/<lab>/events.bin`` for any
number of readers (``labkit trace``, notebook steps). Cilium's monitor agent
plays the same part between the datapath and Hubble.

    python -m labkit.monitor --lab demo
"""
from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys

from . import _bpf
from .ledger import Ledger, lab_dir
from .trace import EVENT_SIZE

__all__ = ["main", "ROTATE_BYTES"]

ROTATE_BYTES = 64 * 1024 * 1024  # keep at most two files of this size


def run(lab: str) -> None:
    state = json.loads((lab_dir(lab) / "lab.json").read_text())
    rings = [_bpf.RingBuffer(_bpf.obj_get(f"{pin}/labkit_events")) for pin in state["pin_dirs"].values()]
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
    ap = argparse.ArgumentParser(prog="labkit.monitor")
    ap.add_argument("--lab", required=True)
    args = ap.parse_args(argv)
    try:
        run(args.lab)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
