"""labkit.door.supervise: one look at the supervised labs restarts the agents that ended, and only those (a stand-in
Labs whose labs report health; nothing is started for real)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from labkit.door.supervise import Supervisor


class FakeLab:
    """The datapath side's health() and restart_agent()."""

    def __init__(self, problems=(), fails=False):
        self.problems, self.fails, self.restarted = list(problems), fails, 0

    def health(self):
        if self.fails:
            raise OSError(2, "No such file or directory")
        return list(self.problems)

    def restart_agent(self):
        self.restarted += 1
        self.problems = []


class FakeLabs:
    """supervised(), held(key) and lock(key), as Labs has them."""

    def __init__(self, **labs):
        self.labs = labs
        self.locks = {k: threading.RLock() for k in labs}

    def supervised(self):
        return list(self.labs)

    def held(self, key):
        lab = self.labs[key]
        return None if lab is None else SimpleNamespace(key=key, lab=lab)

    def lock(self, key):
        return self.locks[key]


def _supervisor(labs):
    lines: list[str] = []
    return Supervisor(labs, log=lines.append), lines


def test_a_lab_whose_agent_ended_gets_a_new_one():
    """A lab whose only problems are `process agent ...` has its agent restarted, and it is logged once."""
    lab = FakeLab(["process agent (pid 4242) has ended"])
    sup, lines = _supervisor(FakeLabs(demo_u1000=lab))
    sup.once()
    assert lab.restarted == 1 and sup.restarts == ["demo_u1000"]
    assert lines == [("labkitd: lab demo_u1000: its agent had ended (process agent (pid 4242) has ended); "
                      "started a new one")]
    sup.once()  # healthy now: nothing more
    assert lab.restarted == 1 and len(lines) == 1


def test_a_lab_with_other_problems_is_left_alone():
    """A lab with problems other than its agent (or besides it) is not restarted; a healthy one neither."""
    mixed = FakeLab(["process agent (pid 1) has ended", "pin /sys/fs/bpf/labkit/demo/node-a/cilium_lxc missing"])
    other = FakeLab(["netns lk-web-a1 missing"])
    healthy = FakeLab()
    sup, lines = _supervisor(FakeLabs(demo=mixed, web=other, ok=healthy))
    sup.once()
    assert (mixed.restarted, other.restarted, healthy.restarted) == (0, 0, 0)
    assert sup.restarts == [] and lines == []


def test_a_lab_being_changed_is_looked_at_next_time():
    """A lab whose lock another thread holds is skipped this time, and restarted on the next look once free."""
    lab = FakeLab(["process agent (pid 9) has ended"])
    labs = FakeLabs(demo=lab)
    sup, _ = _supervisor(labs)
    taken, release = threading.Event(), threading.Event()

    def change():
        with labs.lock("demo"):
            taken.set()
            release.wait(10)

    t = threading.Thread(target=change)
    t.start()
    try:
        assert taken.wait(10)
        sup.once()
        assert lab.restarted == 0
    finally:
        release.set()
        t.join(10)
    sup.once()
    assert lab.restarted == 1


def test_a_lab_whose_health_fails_is_logged_and_the_others_still_looked_at():
    """health() raising is logged with its error and the lab's lock given back; the next lab is still restarted."""
    broken = FakeLab(fails=True)
    dead = FakeLab(["process agent (pid 3) has ended"])
    labs = FakeLabs(broken_u1000=broken, dead_u1000=dead)
    sup, lines = _supervisor(labs)
    sup.once()
    assert dead.restarted == 1 and sup.restarts == ["dead_u1000"]
    assert lines[0] == ("labkitd: lab broken_u1000: could not look after its agent "
                        "(FileNotFoundError: [Errno 2] No such file or directory)")
    assert labs.locks["broken_u1000"].acquire(blocking=False)  # not left held
    labs.locks["broken_u1000"].release()


def test_a_lab_no_longer_held_is_skipped():
    """A key supervised() listed but no longer held (taken down meanwhile) is skipped without a lock."""
    sup, lines = _supervisor(FakeLabs(gone=None))
    sup.once()
    assert sup.restarts == [] and lines == []


def test_the_thread_looks_every_period_until_stopped():
    """run() looks once per period until stopping is set."""
    lab = FakeLab(["process agent (pid 5) has ended"])
    sup = Supervisor(FakeLabs(demo=lab), period=0.01, log=lambda line: None)
    sup.start()
    try:
        for _ in range(500):
            if sup.restarts:
                break
            threading.Event().wait(0.01)
    finally:
        sup.stopping.set()
        sup.join(5)
    assert sup.restarts == ["demo"] and not sup.is_alive()
