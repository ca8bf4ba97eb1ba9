"""``labkit doctor``'s look at a running lab: its services journal, checked against the pinned maps.

The machine checks are :mod:`labkit.datapath.doctor`; this is the part that needs a lab. It reads
only (:func:`labkit.agent.services.restore.recover` writes nothing), so it is safe beside a running
agent.

    >>> print("\\n".join(journal_lines("demo", ["services.journal line 4: expected record seq 4, found seq 7"], True)))
      - services.journal line 4: expected record seq 4, found seq 7
    services journal: damaged: run `labkit --lab demo agent restart` to rebuild it from the maps
    >>> journal_lines("demo", [], False)
    ['services journal: ok']
"""
from __future__ import annotations

from labkit.errors import LabkitError, LabStateError, NotFoundError

__all__ = ["journal_lines", "services_journal", "running_lab"]


def running_lab(name: str):
    """The lab ``name`` if it is up, else None (doctor checks the machine whether or not a lab runs)."""
    from labkit.lab import Lab

    try:
        return Lab.attach(name)
    except (NotFoundError, LabStateError, OSError, ValueError, KeyError, TypeError):
        return None  # not up, or its lab.json half-written: nothing to check beside the machine


def journal_lines(lab: str, problems: list[str], damaged: bool) -> list[str]:
    """What doctor prints: each problem, then whether the journal can be trusted and what to run."""
    out = [f"  - {p}" for p in problems]
    if damaged:
        out.append(f"services journal: damaged: run `labkit --lab {lab} agent restart` to rebuild it from the maps")
    elif problems:
        out.append(f"services journal: ok; the maps differ from it in {len(problems)} place(s): "
                   f"`labkit --lab {lab} agent restart` rewrites them")
    else:
        out.append("services journal: ok")
    return out


def services_journal(lab) -> tuple[list[str], bool]:
    """Check running ``lab``'s services journal against its pinned maps: (the lines to print, whether it is ok)."""
    from labkit.agent.services import JsonStore, PinnedMaps
    from labkit.agent.services.restore import recover

    if getattr(lab.config, "service_mode", "ebpf") != "ebpf":
        return [f"services journal: not checked (lab '{lab.name}' keeps services in iptables, not in LB maps)"], True
    m = lab.config.maglev_table_size
    try:
        r = recover(JsonStore(lab.name), PinnedMaps(lab.pin_dirs, m), lab.topology, lab.config.profile.release, m)
    except (OSError, LabkitError) as exc:
        return [f"services journal: cannot read lab '{lab.name}''s pinned maps ({exc}); expected to run as root "
                f"beside a lab that is up"], False
    return journal_lines(lab.name, r.problems, r.damaged), not r.damaged
