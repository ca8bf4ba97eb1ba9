"""Describe a lab's network, then realise it: the stage below everything else.

- :mod:`labkit.net.topology` — nodes, pods, links and addresses as pure data;
- :mod:`labkit.net.netns` — entering network namespaces and cgroups;
- :mod:`labkit.net.ledger` — what a lab created, recorded before it is created;
- :mod:`labkit.net.build` — namespaces, veths, VXLAN, routes and sysctls from a topology;
- :mod:`labkit.net.podserver` / :mod:`labkit.net.podclient` — the processes inside each pod.
"""
from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["pod_argv", "POD_PROGRAMS"]

#: The programs that run inside pods. Each uses only the standard library.
POD_PROGRAMS = ("podserver", "podclient")


def pod_argv(program: str, *args: str) -> list[str]:
    """The command line that runs a pod's ``program`` (``podserver`` or ``podclient``) with ``args``.

    The module's file runs under ``python -S``: it needs only the standard library, so it skips site's
    start-up (the venv's ``.pth`` hooks, about 50 ms of CPU for each pod's process).
    ``python -m labkit podserver ...`` runs the same code.

    >>> argv = pod_argv("podserver", "--pod", "a1")
    >>> argv[1], Path(argv[2]).name, argv[3:]
    ('-S', 'podserver.py', ['--pod', 'a1'])
    """
    if program not in POD_PROGRAMS:
        raise ValueError(f"pod program {program!r}: expected one of {', '.join(POD_PROGRAMS)}")
    return [sys.executable, "-S", str(Path(__file__).with_name(f"{program}.py")), *args]
