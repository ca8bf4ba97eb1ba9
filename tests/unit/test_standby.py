"""labkit.lab.standby: the loader and agent processes started ahead of a build (stand-ins for both processes: nothing
is started for real)."""
from __future__ import annotations

import threading

import pytest

from labkit.lab import standby
from labkit.lab.standby import Standby


class FakeLoader:
    """PendingLoader's surface: started for ``n`` nodes, alive until it dies or is discarded."""

    made: list[FakeLoader] = []

    def __init__(self, n, preload=None):
        self.n, self.dead, self.discarded = n, False, False
        self.preload = list(preload or [])
        FakeLoader.made.append(self)

    def alive(self):
        return not self.dead

    def discard(self):
        self.discarded = True


class FakeAgent:
    """An agent process: poll() is None while it runs."""

    def __init__(self):
        self.returncode = None

    def poll(self):
        return self.returncode


@pytest.fixture
def started(monkeypatch):
    """What was started: loaders and agents, in order."""
    FakeLoader.made = []
    agents: list[FakeAgent] = []

    def agent_process():
        agents.append(FakeAgent())
        return agents[-1]

    monkeypatch.setattr(standby, "PendingLoader", FakeLoader)
    monkeypatch.setattr(standby, "agent_process", agent_process)
    return FakeLoader.made, agents


def _standby_threads():
    return [t for t in threading.enumerate() if t.name == "standby"]


def test_with_keep_off_nothing_is_started_ahead(started):
    """A Standby without keep starts nothing, and refill() after a build starts nothing either."""
    loaders, agents = started
    s = Standby()
    s.refill()
    assert not _standby_threads() and loaders == [] and agents == []


def test_fill_starts_one_of_each_and_only_what_is_missing(started):
    """fill() starts one loader (for the nodes asked) and one agent; a second fill() starts nothing more."""
    loaders, agents = started
    s = Standby()
    s.fill(3)
    s.fill(3)
    assert [ld.n for ld in loaders] == [3] and len(agents) == 1


def test_the_ready_loader_is_taken_when_its_node_count_fits(started):
    """loader(n) gives the ready loader when it was started for n nodes; the next loader(n) is a new one."""
    loaders, _ = started
    s = Standby()
    s.fill(2)
    ready = loaders[0]
    assert s.loader(2) is ready and not ready.discarded
    other = s.loader(2)
    assert other is not ready and loaders == [ready, other]


def test_a_ready_loader_for_another_node_count_is_discarded(started):
    """loader(n) with a ready loader for another number of nodes discards it and starts one for n."""
    loaders, _ = started
    s = Standby()
    s.fill(2)
    ready = loaders[0]
    got = s.loader(5)
    assert ready.discarded and got is not ready and got.n == 5


def test_a_ready_loader_that_died_is_discarded(started):
    """A ready loader that has ended is discarded and a new one started in its place."""
    loaders, _ = started
    s = Standby()
    s.fill(2)
    loaders[0].dead = True
    got = s.loader(2)
    assert loaders[0].discarded and got is loaders[1] and got.n == 2


def test_the_ready_agent_is_taken_while_it_runs(started):
    """agent() gives the ready agent while it runs, a new one when it has ended or none is ready."""
    _, agents = started
    s = Standby()
    s.fill()
    assert s.agent() is agents[0]
    fresh = s.agent()
    assert fresh is agents[1]
    s.fill()
    agents[2].returncode = 1
    assert s.agent() is agents[3]


def test_refill_with_keep_fills_in_the_background(started):
    """With keep on, refill() starts a 'standby' thread that starts what was taken."""
    loaders, agents = started
    s = Standby(keep=True)
    s.fill(2)
    s.loader(2)
    s.agent()
    s.refill()
    for t in _standby_threads():
        t.join(10)
    assert len(loaders) == 2 and len(agents) == 2
    assert s.loader(2) is loaders[1] and s.agent() is agents[1]


def test_a_loader_started_ahead_loads_the_last_builds_images(started):
    """Once a build of 2 nodes used images k1 and k2 twice in a row, the loader started ahead for 2 nodes is asked
    to load them (one for 3 nodes loads nothing); a build that changed stops that, and a ready loader told other
    images is not handed out."""
    sb = standby.Standby()
    sb.learn(["k1", "k2"])
    assert sb.loader(2).preload == []  # once is no pattern
    sb.learn(["k1", "k2"])
    assert sb.loader(2).preload == ["k1", "k2"] and sb.loader(3).preload == []
    sb.fill(2)
    ready = sb._loader
    sb.learn(["k3", "k4"])
    got = sb.loader(2)
    assert got is not ready and ready.discarded and got.preload == []  # a build that changed: nothing ahead
    sb.learn(["k3", "k4"])
    assert sb.loader(2).preload == ["k3", "k4"]
