"""Every program labkit runs, in one place: ``python -m labkit PROGRAM [ARGS...]``.

==========  ==================================================  ==========================
program     what it is                                          who starts it
==========  ==================================================  ==========================
cli         the ``labkit`` command                              you (``labkit`` runs it)
loader      compiles, loads, attaches and pins one node's BPF    ``Lab.up``, one per node
monitor     drains the nodes' trace ring buffers to a file      ``Lab.up``, one per lab
gc          the CT garbage collector on the lab clock           ``Lab.up``, one per lab
podserver   the TCP/UDP server inside a pod                     ``Lab.up``, one per pod
podclient   opens connections and sends packets for steps       a pod's first step
bench       labkit's speed targets                              ``make bench``
==========  ==================================================  ==========================

Each program is a ``main(argv)`` of the module that owns it, imported only when
that program runs (a pod's server does not load the CLI).
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time

__all__ = ["PROGRAMS", "main"]

#: program → "module:function"; the function takes the remaining arguments.
PROGRAMS = {
    "cli": "labkit.cli:main",
    "loader": "labkit.datapath.loader:main",
    "monitor": "labkit.observe.monitor:main",
    "gc": "labkit.__main__:gc_main",
    "podserver": "labkit.net.podserver:main",
    "podclient": "labkit.net.podclient:main",
    "bench": "labkit.tools.bench:main",
}


def gc_main(argv: list[str] | None = None) -> None:
    """The lab's GC process: every ``--poll`` seconds, run the GC if the lab clock says it is due."""
    ap = argparse.ArgumentParser(prog="labkit.gc", description="a lab's CT garbage collector")
    ap.add_argument("--lab", required=True)
    ap.add_argument("--poll", type=float, default=1.0)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    from labkit.lab import Lab  # here, not above: the other programs must not load the lab

    lab = Lab.attach(args.lab)
    print(f"labkit gc: lab {lab.name}, interval on the lab clock, checked every {args.poll} s", flush=True)
    while True:
        try:
            if lab.gc.due():
                lab.gc.run()
        except Exception as exc:  # a lab being torn down: the ledger kills this process next
            print(f"labkit gc: {type(exc).__name__}: {exc}", flush=True)
        time.sleep(args.poll)


def main(argv: list[str] | None = None) -> int:
    """Run ``argv[0]``'s program with the rest of ``argv``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in PROGRAMS:
        print(f"usage: python -m labkit {{{','.join(PROGRAMS)}}} [ARGS...]", file=sys.stderr)
        return 2
    module, _, function = PROGRAMS[argv[0]].partition(":")
    run = getattr(importlib.import_module(module), function)
    return run(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
