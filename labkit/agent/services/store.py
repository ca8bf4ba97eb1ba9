"""Where a lab's list of services is kept: ``/run/labkit/<lab>/services.json`` under a lock of the
lab directory (:class:`JsonStore`), or a dictionary (:class:`MemoryStore`, no kernel).
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Iterator, Protocol

from labkit.errors import ConfigError
from labkit.net.ledger import Ledger, dir_lock, lab_dir

__all__ = ["ServiceStore", "JsonStore", "MemoryStore"]


class ServiceStore(Protocol):
    """Where the agent keeps its list of services between calls and processes."""

    def load(self) -> dict: ...
    def save(self, data: dict) -> None: ...
    def lock(self) -> contextlib.AbstractContextManager: ...


class JsonStore:
    """``/run/labkit/<lab>/services.json``, in the lab's ledger.

    Writers hold an exclusive flock of the lab directory, so two processes adding
    services at once allocate different ids; a reader outside a writer's lock takes
    it shared, so it never reads half a file. The file is rewritten in place under
    the lock: a rename per change cost 0.2 ms on the VM's disk, a fifth of the
    agent's 1 ms budget.
    """

    def __init__(self, lab: str):
        self.lab = lab
        self.dir = lab_dir(lab)
        self.path = self.dir / "services.json"
        self._ledger = Ledger(lab)
        self._held = False  # this object holds the exclusive lock (load() must not ask again)
        self._recorded = False

    def load(self) -> dict:
        try:
            if self._held:
                return self._read()
            with dir_lock(self.lab, shared=True):
                return self._read()
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise ConfigError(f"lab '{self.lab}': {self.path} is unreadable ({exc}); "
                              f"`labkit --lab {self.lab} cleanup` removes what the lab created") from None

    def _read(self) -> dict:
        text = self.path.read_text()
        return json.loads(text) if text else {}

    def save(self, data: dict) -> None:
        if not self._recorded and not self.path.exists():
            if str(self.path) not in {e.get("path") for e in self._ledger.entries("file")}:
                self._ledger.record("file", path=str(self.path))  # before it exists: teardown removes it
        self._recorded = True
        raw = json.dumps(data, separators=(",", ":")).encode()  # compact: the C encoder, fast
        with contextlib.ExitStack() as stack:
            if not self._held:
                stack.enter_context(dir_lock(self.lab))
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, raw)
                os.ftruncate(fd, len(raw))
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        with dir_lock(self.lab):
            self._held = True
            try:
                yield
            finally:
                self._held = False


class MemoryStore:
    """A :class:`ServiceStore` in memory (examples and tests)."""

    def __init__(self, data: dict | None = None):
        self.data = json.loads(json.dumps(data or {}))
        self.saves = 0

    def load(self) -> dict:
        return json.loads(json.dumps(self.data))

    def save(self, data: dict) -> None:
        self.data = json.loads(json.dumps(data))
        self.saves += 1

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        yield
