"""Processes started ahead of a lab's build: the loader that compiles and attaches the nodes' programs, and the
lab's agent. Each is a Python process that spends most of its start-up importing; started ahead, it has done so by
the time ``up`` hands it its lab. A loader started ahead also loads the images of a build that came twice in a row
(:meth:`Standby.learn`): its maps made and programs verified before the lab asks, it only pins and attaches them
— when the lab's build is that image; another build loads as before.

``labkit up`` in a process of its own starts both at the beginning of the build, so their imports overlap the
network's creation. labkitd, which builds lab after lab, keeps one of each ready between builds
(:data:`STANDBY` with ``keep`` on): once a build is done (:meth:`Standby.refill`, not during it: the two cores
are the build's then) it starts the next ones in the background. A standby that is never used ends with labkitd
(its loader dies with its parent, its agent at the end of its stdin).

    >>> Standby().keep
    False
"""
from __future__ import annotations

import subprocess
import sys
import threading

from labkit.datapath.loader import PendingLoader

__all__ = ["Standby", "STANDBY", "agent_process"]


def agent_process() -> subprocess.Popen:
    """A lab agent waiting for its lab's name on stdin (``python -m labkit agent --lab -``)."""
    return subprocess.Popen([sys.executable, "-m", "labkit", "agent", "--lab", "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)


class Standby:
    """The loader and agent processes started ahead; with ``keep``, one of each is kept ready."""

    def __init__(self, keep: bool = False):
        self.keep = keep
        self._mutex = threading.Lock()
        self._loader: PendingLoader | None = None
        self._agent: subprocess.Popen | None = None
        self._images: dict[int, list[str | None]] = {}  #: nodes -> the image keys to load ahead
        self._last: dict[int, list[str | None]] = {}  #: nodes -> the image keys of the last build that size

    def learn(self, keys: list[str | None]) -> None:
        """The image keys a build of ``len(keys)`` nodes used, in node order. When the build before it of as many
        nodes used the same, the next loader for that many nodes loads them ahead: a lab brought up again and
        again (a learner's, a bench's) gets its programs ready; builds that keep changing (a test run's) do not
        spend the cores on images nobody asks for."""
        n = len(keys)
        with self._mutex:
            repeated = self._last.get(n) == list(keys)
            self._last[n] = list(keys)
            if repeated:
                self._images[n] = list(keys)
            else:
                self._images.pop(n, None)

    def forget(self) -> None:
        """Forget the builds learnt so far: nothing is loaded ahead until a build comes twice again."""
        with self._mutex:
            self._last.clear()
            self._images.clear()

    def loader(self, nodes: int) -> PendingLoader:
        """A loader for ``nodes`` nodes: the ready one when it fits, else a new one (loading the last build's
        images meanwhile)."""
        with self._mutex:
            ready, self._loader = self._loader, None
            images = self._images.get(nodes)
        if ready is not None and (ready.n != nodes or not ready.alive() or ready.preload != (images or [])):
            ready.discard()
            ready = None
        return ready or PendingLoader(nodes, images)

    def agent(self) -> subprocess.Popen:
        """An agent process waiting for its lab: the ready one, else a new one."""
        with self._mutex:
            ready, self._agent = self._agent, None
        if ready is not None and ready.poll() is not None:
            ready = None
        return ready or agent_process()

    def refill(self) -> None:
        """With ``keep``, start what was taken, in the background (after a build)."""
        if self.keep:
            threading.Thread(target=self.fill, name="standby", daemon=True).start()

    def fill(self, nodes: int = 2) -> None:
        """Start what is missing (a loader for ``nodes`` nodes, an agent)."""
        with self._mutex:
            if self._loader is None:
                self._loader = PendingLoader(nodes, self._images.get(nodes))
            if self._agent is None:
                self._agent = agent_process()


#: This process's standby (labkitd turns ``keep`` on).
STANDBY = Standby()
