"""Evidence: what a notebook's traffic cells showed, kept so that a check grades what the learner saw.

A check must not read the live lab: by the time a learner answers, later cells (or a pause long enough
for the GC) have moved it on. Instead every step records itself here when it ends — its packets' trace
records, the CT rows before and after, what the client got — and so do the other cells a question can
be about: a clock advance, a GC run, a fault switched on or off, a reset, and any ``lab.snapshot(...)``.
A grader asks the journal for the newest record that matches its question; if there is none, the check
says which cell to run instead of failing the answer.

The journal lives on the privileged side, in labkitd, which runs the cells' steps and keeps each lab's
records in a file the lab's owner may read and not write (:mod:`labkit.door.evidence`); it holds the last
:data:`KEEP` records of each lab and forgets a lab's records when that lab is reset: nothing before a reset
is evidence. Records copy what they show, so a record does not change when the lab does.

    >>> j = Journal()
    >>> rec = j.record("demo", "snapshot", "after the flood", data={"n": 3})
    >>> j.latest("demo", "snapshot", title="after the flood").data
    {'n': 3}
    >>> j.reset("demo"); j.latest("demo", "snapshot") is None
    True
"""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

__all__ = ["Record", "Journal", "JOURNAL", "KINDS", "KEEP", "Evidence", "Snapshot"]

#: What can be recorded: a traffic step, the lab clock moved, a GC run, a fault toggled, a snapshot of the
#: maps, a Service change, a view of the Hubble ring (lab 13).
KINDS = ("step", "clock", "gc", "fault", "snapshot", "service", "observe")
#: Records kept per lab (the oldest go first).
KEEP = 5000

_seq = itertools.count(1)
_seq_lock = threading.Lock()


@dataclass(frozen=True)
class Record:
    """One piece of evidence."""

    seq: int  #: order of recording in this process
    lab: str  #: the lab it was recorded in
    kind: str  #: one of KINDS
    title: str  #: the step's title, the snapshot's name, ...
    data: Any = None  #: the Step, GcRun, rows ... (kind-specific)
    attrs: dict = field(default_factory=dict)  #: what graders match on (kind, actor, target, port, fault, ...)
    time: float = field(default_factory=time.time)

    def matches(self, **attrs) -> bool:
        """True when every given attribute has the given value (a callable value is a predicate)."""
        for key, want in attrs.items():
            have = self.attrs.get(key, getattr(self, key, None))
            if callable(want) and not isinstance(want, type):
                if not want(have):
                    return False
            elif have != want:
                return False
        return True


@dataclass(frozen=True)
class Snapshot:
    """A lab's rows at one moment (``lab.snapshot(title)``): every node's CT and NAT rows, optionally its
    Service maps, a node's Linux conntrack and nat table and a Service as the agent holds it — all read by
    labkitd — the lab clock, and the cell's own note (``extra``, which checks never read: the learner wrote it)."""

    title: str
    now: int
    ct: dict  #: node -> [CtRow]
    nat: dict  #: node -> [NatRow]
    lb: dict = field(default_factory=dict)  #: node -> LbSnapshot (when asked for)
    extra: Any = None
    conntrack: tuple = ()  #: a node's Linux conntrack rows (``conntrack -L``; iptables mode), when asked for
    iptables: str = ""  #: a node's ``iptables-save -t nat``, when asked for
    service: Any = None  #: a Service as the agent held it (:class:`labkit.agent.services.model.Service`), when asked for

    def rows(self, node: str) -> list:
        """The CT rows of ``node``."""
        return self.ct.get(node, [])


class Journal:
    """The records of one process, oldest first, the last :attr:`keep` of each lab.

    ``sinks`` are told of every change (``sink("record", rec)``, ``sink("reset", lab)``): labkitd keeps each
    lab's records in a file of the lab's (:mod:`labkit.door.evidence`) and labkitd :meth:`load`-s them when it starts.
    """

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._labs: dict[str, list[Record]] = {}
        self.sinks: list[Callable[[str, Any], None]] = []

    def _tell(self, what: str, arg: Any) -> None:
        for sink in self.sinks:
            sink(what, arg)

    def record(self, lab: str, kind: str, title: str, data: Any = None, **attrs) -> Record:
        """Append a record and return it."""
        if kind not in KINDS:
            raise ValueError(f"evidence kind {kind!r}: expected one of {', '.join(KINDS)}")
        rec = Record(next(_seq), lab, kind, title, data, dict(attrs))
        records = self._labs.setdefault(lab, [])
        records.append(rec)
        if len(records) > self.keep:
            del records[: len(records) - self.keep]
        self._tell("record", rec)
        return rec

    def load(self, records: Iterable[Record]) -> None:
        """Take back records kept elsewhere (their own ``seq`` order); later records number after them."""
        global _seq
        top = 0
        for rec in records:
            self._labs.setdefault(rec.lab, []).append(rec)
            top = max(top, rec.seq)
        for recs in self._labs.values():
            recs.sort(key=lambda r: r.seq)
            del recs[: max(0, len(recs) - self.keep)]
        with _seq_lock:
            current = next(_seq)
            _seq = itertools.count(max(current, top + 1))

    def reset(self, lab: str) -> None:
        """Forget everything recorded in ``lab`` (``lab.reset()`` calls this): nothing before it is evidence."""
        self._labs.pop(lab, None)
        self._tell("reset", lab)

    def forget(self, lab: str) -> None:
        """Drop ``lab``'s records from memory only (labkitd closing a lab that went down)."""
        self._labs.pop(lab, None)

    def find(self, lab: str | None = None, kind: str | None = None, **attrs) -> list[Record]:
        """Matching records, oldest first."""
        if lab is not None:
            pool = list(self._labs.get(lab, ()))
        else:
            pool = sorted((r for recs in list(self._labs.values()) for r in recs), key=lambda r: r.seq)
        return [r for r in pool if (kind is None or r.kind == kind) and r.matches(**attrs)]

    def latest(self, lab: str | None = None, kind: str | None = None, **attrs) -> Record | None:
        """The newest matching record, or None."""
        found = self.find(lab, kind, **attrs)
        return found[-1] if found else None

    def after(self, rec: Record, lab: str | None = None, kind: str | None = None, **attrs) -> list[Record]:
        """Matching records made after ``rec``."""
        return [r for r in self.find(lab, kind, **attrs) if r.seq > rec.seq]

    def clear(self) -> None:
        self._labs.clear()

    def __len__(self) -> int:
        return sum(len(recs) for recs in self._labs.values())

    def __iter__(self):
        return iter(self.find())


#: This process's journal (labkitd's: every lab's).
JOURNAL = Journal()


class Evidence:
    """What a grader may read: the journal's records of one lab (and its variant labs), and the lab's
    fixed facts (topology, options) as they were when recorded. Never the live maps.

    ``lab`` is the notebook's main lab name; ``variant("snat")`` reads the records of ``<lab>-snat``.
    """

    def __init__(self, lab_name: str, journal: Journal = JOURNAL, facts=None, facts_of=None):
        self.lab_name = lab_name
        self.journal = journal
        self._facts = facts  #: the Lab object, for topology and config only (static facts)
        self._facts_of = facts_of  #: lab name -> its Lab (a variant's facts), or None

    # -- the records ----------------------------------------------------------------------
    def steps(self, **attrs) -> list:
        """Steps recorded in this lab matching ``attrs`` (``op="tcp-close"``, ``actor="a1"``, ...), oldest
        first, as :class:`labkit.notebook.steps.Step` objects."""
        return [r.data for r in self.journal.find(self.lab_name, "step", **attrs)]

    def step(self, **attrs):
        """The newest matching step, or None."""
        found = self.steps(**attrs)
        return found[-1] if found else None

    def latest(self, kind: str, **attrs) -> Record | None:
        """The newest matching record of ``kind`` in this lab."""
        return self.journal.latest(self.lab_name, kind, **attrs)

    def records(self, kind: str | None = None, **attrs) -> list[Record]:
        return self.journal.find(self.lab_name, kind, **attrs)

    def after(self, rec: Record, kind: str | None = None, **attrs) -> list[Record]:
        return self.journal.after(rec, self.lab_name, kind, **attrs)

    def snapshot(self, title: str | None = None):
        """The newest :class:`Snapshot` (with that title), or None."""
        rec = self.latest("snapshot", **({"title": title} if title else {}))
        return rec.data if rec else None

    def variant(self, name: str) -> "Evidence":
        """The evidence of the notebook's second lab ``<lab>-<name>`` (its key keeps the owner part:
        ``demo_u1000`` → ``demo-small_u1000``), with that lab's facts when it is up."""
        base, dot, owner = self.lab_name.partition("_u")
        key = f"{base}-{name}" + (f"_u{owner}" if dot else "")
        facts = None
        if self._facts_of is not None:
            try:
                facts = self._facts_of(key)
            except Exception:  # the variant is down by now: its records still count
                facts = None
        return Evidence(key, self.journal, facts, self._facts_of)

    # -- fixed facts --------------------------------------------------------------------
    @property
    def lab(self):
        """The lab object, for its topology and options (``ev.lab.config.timeouts``); graders must not read
        its maps, trace or clock (that is what the records are for)."""
        return self._facts

    @property
    def config(self):
        return self._facts.config if self._facts is not None else None

    @property
    def topology(self):
        return self._facts.topology if self._facts is not None else None


def pick(records: Iterable, key: Callable | None = None):
    """The last of ``records`` (optionally the last for which ``key`` is true), or None."""
    items = [r for r in records if key is None or key(r)]
    return items[-1] if items else None
