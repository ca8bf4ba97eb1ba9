"""Every lab on this machine, read from its state files alone: what ``labkit list`` prints.

A lab is known by its directory ``/run/labkit/<lab>/`` (its ledger and ``lab.json``); nothing is
attached, so a broken or half-built lab is listed as well as a healthy one. A *variant* is a second lab a
notebook starts beside its main one (``<main>-<variant>``, :data:`VARIANTS`); a variant whose starting
process has ended is *orphaned*: the kernel that used it was restarted, and nothing will take it down
but ``start()`` in its notebook or ``labkit --lab <name> down``.

    >>> s = LabSummary("demo-snat", base="demo", variant="snat", status="up", created=1000.0, owner_pid=42,
    ...                owner_alive=False, holds={"netns": 8, "process": 5, "pin": 34}, running=4)
    >>> s.orphaned, s.age(now=1000.0 + 185), s.holds_text()
    (True, '3 min', '8 namespaces, 5 processes (4 running), 34 pins')
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

from labkit.net.ledger import RUN_DIR, Ledger, list_labs, process_start_time

__all__ = ["VARIANTS", "LabSummary", "split_variant", "summarize", "inventory", "variants_of"]

#: The second labs the notebooks start beside their main one (``start(variant=...)``):
#: lab 03 native routing, lab 06 socket LB for pods, lab 07 snat mode, lab 08 a small CT map,
#: lab 09 kube-proxy's iptables mode, and the two labs lab 09's measurement brings up
#: (``compare_service_modes(prefix=lab.name)``), lab 12 NodePort acceleration in XDP, lab 13 small event
#: rings for a flood.
VARIANTS = ("native", "socklb", "snat", "small", "ipt", "bipt", "bebpf", "xdp", "flood")

#: Ledger kinds as a learner reads them, in the order :meth:`LabSummary.holds_text` lists them.
_KIND_WORDS = (("netns", "namespace"), ("process", "process"), ("pin", "pin"), ("tc-filter", "tc filter"),
               ("xdp", "XDP program"), ("cgroup-prog", "cgroup program"), ("cgroup", "cgroup"))


def split_variant(name: str) -> tuple[str, str | None]:
    """(main lab, variant) of a lab name; the variant is None for a main lab.

    >>> split_variant("demo-snat"), split_variant("demo"), split_variant("g1n0-bench-ipt")
    (('demo', 'snat'), ('demo', None), ('g1n0-bench', 'ipt'))
    """
    base, sep, tail = name.rpartition("-")
    if sep and base and tail in VARIANTS:
        return base, tail
    return name, None


@dataclass(frozen=True)
class LabSummary:
    """One lab as its state files describe it."""

    name: str
    base: str  #: the main lab (``name`` itself for a main lab)
    variant: str | None  #: the variant word, None for a main lab
    status: str  #: 'up', 'building', or 'broken' (no readable lab.json)
    created: float | None  #: wall-clock time the build started
    owner_pid: int  #: the process that built it (0: unknown)
    owner_alive: bool  #: that process still runs (the same process, not a recycled pid)
    holds: dict[str, int] = field(default_factory=dict)  #: ledger kind → how many the ledger lists
    running: int = 0  #: of the recorded processes, how many still run

    @property
    def orphaned(self) -> bool:
        """A variant whose starting process has ended."""
        return self.variant is not None and not self.owner_alive

    def age(self, now: float | None = None) -> str:
        """How long ago it was built, in the largest whole unit (``'3 min'``), or ``'?'``."""
        if not self.created:
            return "?"
        seconds = max(0, int((time.time() if now is None else now) - self.created))
        for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
            if seconds >= size:
                return f"{seconds // size} {unit}"
        return f"{seconds} s"

    def owner_text(self) -> str:
        """``'pid 42 (running)'``, ``'pid 42 (ended)'`` or ``'-'``."""
        if not self.owner_pid:
            return "-"
        return f"pid {self.owner_pid} ({'running' if self.owner_alive else 'ended'})"

    def holds_text(self) -> str:
        """What the ledger lists, in words: ``'8 namespaces, 5 processes (5 running), 34 pins, …'``."""
        parts = []
        for kind, word in _KIND_WORDS:
            n = self.holds.get(kind, 0)
            if n:
                text = f"{n} {word}{'es' if word.endswith('s') and n != 1 else 's' if n != 1 else ''}"
                if kind == "process":
                    text += f" ({self.running} running)"
                parts.append(text)
        return ", ".join(parts) or "nothing recorded"

    def note(self) -> str | None:
        """The sentence ``labkit list`` prints under the table for this lab, if any."""
        if self.orphaned:
            return (f"{self.name} is orphaned: the process that started it ({self.owner_text()}) is gone. "
                    f"start() in lab {self.base}'s notebook takes it down, or: labkit --lab {self.name} down")
        if self.status == "building" and not self.owner_alive:
            return (f"{self.name} was left half-built by {self.owner_text()}: labkit --lab {self.name} down "
                    f"removes what it recorded")
        if self.status == "broken":
            return f"{self.name} has no readable lab.json: labkit --lab {self.name} cleanup removes what it recorded"
        return None

    def to_dict(self, now: float | None = None) -> dict:
        """The JSON object ``labkit list --json`` prints for this lab."""
        return {**asdict(self), "orphaned": self.orphaned, "age": self.age(now)}


def _alive(pid: int, started_at: float | None) -> bool:
    """``pid`` runs and is the process that was there at ``started_at`` (it did not start later)."""
    start = process_start_time(pid) if pid > 0 else None
    if start is None:
        return False
    if not started_at:
        return True
    try:
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return True
    return boot + start / os.sysconf("SC_CLK_TCK") <= started_at + 1.0


def summarize(name: str) -> LabSummary:
    """The :class:`LabSummary` of lab ``name`` (its ledger must exist)."""
    ledger = Ledger(name)
    entries = ledger.entries()
    holds: dict[str, int] = {}
    running = 0
    for e in entries:
        holds[e["kind"]] = holds.get(e["kind"], 0) + 1
        if e["kind"] == "process" and e.get("pid") and process_start_time(e["pid"]) == e.get("start"):
            running += 1
    try:
        state = json.loads(ledger.state_path.read_text())
        status, created, owner = state.get("status") or "broken", state.get("created"), int(state.get("owner_pid") or 0)
    except (OSError, ValueError, TypeError):
        status, created, owner = "broken", None, 0
    base, variant = split_variant(name)
    return LabSummary(name, base, variant, status, created, owner, _alive(owner, created), holds, running)


def inventory() -> list[LabSummary]:
    """Every lab with state under ``/run/labkit``, each main lab followed by its variants."""
    labs = [summarize(name) for name in list_labs()]
    return sorted(labs, key=lambda s: (s.base, s.variant is not None, s.variant or ""))


def variants_of(name: str) -> list[LabSummary]:
    """The variant labs of main lab ``name`` that have state on this machine."""
    return [summarize(f"{name}-{v}") for v in VARIANTS if (RUN_DIR / f"{name}-{v}" / "ledger.jsonl").exists()]
