"""``labkit doctor``: this machine's checks, run here rather than through labkitd (they are about the machine
labkitd needs), and, as root, a running lab's services journal checked against its pinned maps.

The machine checks are :mod:`labkit.datapath.doctor`, with one more: does labkitd answer (:func:`labkitd_check`).
As a user other than root, doctor runs what a user can see (kernel, BTF, bpffs, cgroup2, BCC, headers, tools,
disk, CPU) and names what it left to ``sudo labkit doctor`` (:data:`ROOT_ONLY`): labkitd holds the privileges,
so a user's lack of them is no failure. The journal check reads only
(:func:`labkit.agent.services.restore.recover` writes nothing), so it is safe beside a running agent.

    >>> print("\\n".join(journal_lines("demo", ["services.journal line 4: expected record seq 4, found seq 7"], True)))
      - services.journal line 4: expected record seq 4, found seq 7
    services journal: damaged: run `labkit --lab demo agent restart` to rebuild it from the maps
    >>> journal_lines("demo", [], False)
    ['services journal: ok']
"""
from __future__ import annotations

import os

from labkit.errors import LabkitError, LabStateError, NotFoundError

__all__ = ["ROOT_ONLY", "machine_checks", "labkitd_check", "root_only_note", "journal_lines", "services_journal",
           "running_lab"]

#: What only ``sudo labkit doctor`` checks.
ROOT_ONLY = ("privileges", "the compile-and-attach probe", "the lab's services journal")


def labkitd_check():
    """Whether labkitd answers on its socket (every lab command needs it), as a doctor check."""
    from labkit.datapath.doctor import Check
    from labkit.door import api
    from labkit.door.daemon import status

    path = api.socket_path()
    st = status(path)
    if st is None:
        return Check("labkitd", False, f"no labkitd answers on {path}", api.START_HINT.replace("start it with ", ""))
    return Check("labkitd", True, f"answers on {path} (protocol {st.get('version')}; you are {st.get('user')}"
                                  f"{', an instructor' if st.get('instructor') else ''})")


def machine_checks(root: bool | None = None) -> list:
    """Every check this user can run: as root all of :func:`labkit.datapath.doctor.run_checks`, else all but the
    privileges and the compile-and-attach probe (labkitd holds the privileges); labkitd's first."""
    from labkit.datapath.doctor import run_checks

    root = os.geteuid() == 0 if root is None else root
    checks = run_checks() if root else [c for c in run_checks(full=False) if c.name != "privileges"]
    return [labkitd_check(), *checks]


def root_only_note(uid: int) -> str:
    """What doctor says it left to root.

        >>> root_only_note(1000)
        "not checked as uid 1000: privileges, the compile-and-attach probe, the lab's services journal; `sudo labkit doctor` checks the rest"
    """
    return f"not checked as uid {uid}: {', '.join(ROOT_ONLY)}; `sudo labkit doctor` checks the rest"


def running_lab(name: str):
    """The lab ``name`` (root's, or any by its key) held in-process if it is up, else None (doctor checks the
    machine whether or not a lab runs). Root only: it reads the lab's state files and pins."""
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
