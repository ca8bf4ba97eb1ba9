"""Every program labkit runs, in one place: ``python -m labkit PROGRAM [ARGS...]``.

==========  ==================================================  ==========================
program     what it is                                          who starts it
==========  ==================================================  ==========================
cli         the ``labkit`` command                              you (``labkit`` runs it)
loader      compiles, loads, attaches and pins one node's BPF    ``Lab.up``, one per node
labkitd     the privileged door: every lab's privileged acts    systemd, or ``labkit daemon start``
agent       the lab's agent: Services, monitor, GC timer, API   ``Lab.up``, one per lab
podserver   the TCP/UDP server inside a pod                     ``Lab.up``, one per pod
podclient   opens connections and sends packets for steps       a pod's first step
bench       labkit's speed targets                              ``make bench``
==========  ==================================================  ==========================

Each program is a ``main(argv)`` of the module that owns it, imported only when
that program runs (a pod's server does not load the CLI).
"""
from __future__ import annotations

import importlib
import sys

__all__ = ["PROGRAMS", "main"]

#: program → "module:function"; the function takes the remaining arguments.
PROGRAMS = {
    "cli": "labkit.cli:main",
    "labkitd": "labkit.door.daemon:main",
    "loader": "labkit.datapath.loader:main",
    "agent": "labkit.agent.daemon:main",
    "podserver": "labkit.net.podserver:main",
    "podclient": "labkit.net.podclient:main",
    "bench": "labkit.tools.bench:main",
}


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
