"""The labs labkitd holds, and the limits it keeps.

A lab is known by its state files (``/run/labkit/<key>/``), not by labkitd's memory: labkitd opens a
lab (:class:`labkit.lab.Lab`, the datapath side) the first time a request names it and keeps it open,
with what only a live lab has — the TCP connections its steps opened (:mod:`labkit.door.conns`), the
processes users started in its pods, its evidence journal. A new labkitd (after a crash, an upgrade)
finds every running lab the same way and adopts it: ``labkit list`` is the same before and after.

    >>> Limits().labs_per_user, Limits.from_env({"LABKIT_LIMIT_LABS": "5"}).labs_per_user
    (3, 5)
"""
from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field, fields
from typing import Any

from labkit.config import DatapathConfig
from labkit.door.owners import Caller, owner_of
from labkit.errors import ConfigError, LimitError, NotFoundError
from labkit.lab import Lab
from labkit.lab.inventory import split_variant
from labkit.lab.standby import STANDBY
from labkit.net.ledger import LabState, Ledger, list_labs
from labkit.net.topology import Topology

__all__ = ["Limits", "Held", "Labs"]


@dataclass(frozen=True)
class Limits:
    """What one user may hold at once. Each refusal is one line (:class:`LimitError`); root and instructors
    are held to the per-lab limits only."""

    labs_per_user: int = 3  #: main labs (a lab's variants, ``<name>-<variant>``, belong to it)
    nodes_per_lab: int = 8
    pods_per_lab: int = 32
    services_per_lab: int = 60_000  #: the bench loads 50,000
    procs_per_lab: int = 64  #: processes a user started in the lab's pods, running at once
    concurrent_per_user: int = 8  #: requests of one user in progress at once
    connections_per_user: int = 64  #: open connections to labkitd of one user

    _ENV = {"labs_per_user": "LABKIT_LIMIT_LABS", "nodes_per_lab": "LABKIT_LIMIT_NODES",
            "pods_per_lab": "LABKIT_LIMIT_PODS", "services_per_lab": "LABKIT_LIMIT_SERVICES",
            "procs_per_lab": "LABKIT_LIMIT_PROCS", "concurrent_per_user": "LABKIT_LIMIT_CONCURRENT",
            "connections_per_user": "LABKIT_LIMIT_CONNECTIONS"}

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "Limits":
        """The defaults, each overridden by its ``LABKIT_LIMIT_*`` variable (labkitd's environment)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            var = cls._ENV.get(f.name)
            if var and environ.get(var):
                try:
                    values[f.name] = int(environ[var])
                except ValueError:
                    raise ConfigError(f"{var}={environ[var]!r}: expected a whole number") from None
                if values[f.name] < 1:
                    raise ConfigError(f"{var}={environ[var]!r}: expected a number >= 1")
        return cls(**values)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class Held:
    """One lab labkitd has open: the datapath side's :class:`Lab`, and what lives only while it runs."""

    key: str
    owner: int
    lab: Lab
    lock: threading.RLock = field(default_factory=threading.RLock)  #: one change at a time
    conns: dict[int, Any] = field(default_factory=dict)  #: connection id -> the step side's TcpConn
    procs: dict[int, Any] = field(default_factory=dict)  #: process id -> what the sandbox started
    ids: Any = field(default_factory=lambda: itertools.count(1))
    extra: dict = field(default_factory=dict)  #: per-lab sessions of longer verbs (the service-mode measurement)
    build: tuple | None = None  #: which build of the lab it is (its ledger file's inode and birth)
    supervise: bool = False  #: labkitd restarts its agent when it dies (:mod:`labkit.door.supervise`)

    def next_id(self) -> int:
        return next(self.ids)


class Labs:
    """Every lab labkitd has opened, by key; locks per key so that one lab's changes run one at a time while
    other labs go on."""

    def __init__(self, limits: Limits | None = None):
        self.limits = limits or Limits()
        self._held: dict[str, Held] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._mutex = threading.Lock()
        self.on_open = None  #: called with each newly opened Held (labkitd loads its evidence)

    def lock(self, key: str) -> threading.RLock:
        """The lock of lab ``key`` (whether or not it is up): up, down and every change take it."""
        with self._mutex:
            return self._locks.setdefault(key, threading.RLock())

    def exists(self, key: str) -> bool:
        return Ledger(key).exists()

    def get(self, key: str, name: str | None = None) -> Held:
        """The lab ``key``, opened on first use; NotFoundError (named as its owner names it) when it is not up.
        A lab taken down and built again behind labkitd's back (root's own scripts) is opened afresh: labkitd
        knows the build it holds by its ledger file."""
        with self._mutex:
            held = self._held.get(key)
        if held is not None and held.build == _build_of(key):
            return held
        with self.lock(key):
            with self._mutex:
                held = self._held.get(key)
            build = _build_of(key)
            if held is not None and held.build == build:
                return held
            lab = Lab.attach(key)  # NotFoundError / LabStateError with the key's name
            owner = LabState.read(key).owner_uid
            held = Held(key, owner, lab, build=_build_of(key), supervise=owner != 0)
            with self._mutex:
                self._held[key] = held
            if self.on_open is not None:
                self.on_open(held)
            return held

    def held(self, key: str) -> Held | None:
        """The lab ``key`` if labkitd has it open."""
        with self._mutex:
            return self._held.get(key)

    def supervised(self) -> list[str]:
        """The keys of the held labs whose agents labkitd looks after."""
        with self._mutex:
            return [k for k, h in self._held.items() if h.supervise]

    def forget(self, key: str) -> Held | None:
        """Drop lab ``key`` from memory (it went down)."""
        with self._mutex:
            return self._held.pop(key, None)

    def keys(self) -> list[str]:
        """Every lab with state on this machine."""
        return list_labs()

    def visible(self, caller: Caller) -> list[str]:
        """The labs ``caller`` may see."""
        return [k for k in list_labs() if caller.instructor or _owner(k) == caller.uid]

    def up(self, caller: Caller, key: str, config: DatapathConfig, labels: dict | None) -> Held:
        """Bring up (or attach to) ``caller``'s lab ``key`` within the limits."""
        topology = Topology.default(key, labels=labels) if labels else Topology.default(key)
        self.check_topology(topology)
        with self.lock(key):
            if not caller.instructor and not Ledger(key).exists():
                self.check_count(caller, key)
            try:
                lab = Lab.up(key, config=config, topology=topology, owner=owner_of(key), owner_pid=caller.pid)
            finally:
                STANDBY.refill()  # the next build's loader and agent, started now that this one is done
            build = _build_of(key)
            with self._mutex:
                held = self._held.get(key)
                if held is not None and held.build == build:  # it was running as asked: the same lab
                    return held
                held = self._held[key] = Held(key, owner_of(key), lab, build=build, supervise=True)
            if self.on_open is not None:
                self.on_open(held)
            return held

    def check_topology(self, topology: Topology) -> None:
        if len(topology.nodes) > self.limits.nodes_per_lab:
            raise LimitError(f"lab '{topology.lab}': {len(topology.nodes)} nodes; labkitd allows at most "
                             f"{self.limits.nodes_per_lab} per lab")
        if len(topology.pods) > self.limits.pods_per_lab:
            raise LimitError(f"lab '{topology.lab}': {len(topology.pods)} pods; labkitd allows at most "
                             f"{self.limits.pods_per_lab} per lab")

    def check_count(self, caller: Caller, key: str) -> None:
        """LimitError when a new lab ``key`` would give ``caller`` more main labs than allowed."""
        base = split_variant(key.split("_u")[0])[0]
        mains = {split_variant(k.split("_u")[0])[0] for k in list_labs() if _owner(k) == caller.uid}
        if base not in mains and len(mains) >= self.limits.labs_per_user:
            raise LimitError(f"`up` of lab '{key.split('_u')[0]}': you have {len(mains)} labs "
                             f"({', '.join(sorted(mains))}); labkitd allows {self.limits.labs_per_user} per user "
                             f"(`labkit down` one first)")

    def get_or_none(self, key: str) -> Held | None:
        try:
            return self.get(key)
        except (NotFoundError, Exception):
            return None


def _build_of(key: str) -> tuple | None:
    """Which build of lab ``key`` is on the machine: its ledger file's (inode, device), None when it is not up."""
    try:
        st = os.stat(Ledger(key).path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_dev)


def _owner(key: str) -> int:
    try:
        return owner_of(key)
    except Exception:
        return -1
