"""Datapath tests run on the real kernel, as root, with real packets.

Labs are shared across tests and reset before each one (`lab.reset()` flushes
CT state and the lab clock) so the suite stays within its time budget. The CI gate
(CI=true: fail instead of skip) is the root conftest's ``datapath_ready``.
"""
from __future__ import annotations

import pytest

from labtag import tagged

from .hostsnap import snapshot

_HOST_BEFORE: dict = {}


def pytest_collection_modifyitems(config, items):
    """Run the host-untouched check after every other test."""
    last = [i for i in items if i.name == "test_host_namespace_unchanged"]
    for item in last:
        items.remove(item)
        items.append(item)


@pytest.fixture(scope="session", autouse=True)
def _require_datapath(datapath_ready):
    """The datapath can run (the root conftest's gate); the host namespace is snapshot before any lab exists."""
    _HOST_BEFORE.update(snapshot())  # before any lab of this session exists


class _SharedLab:
    """One lab shared by every test of a worker, healed before each use.

    Under pytest-xdist a worker runs whole files in any order, so a file that takes the shared labs down
    (test_lifecycle.py's host check) or kills their agent may come before another that uses them: a lab
    whose ledger is gone or whose health lists a problem is brought up again (``Lab.up`` keeps what is
    still there and starts what is not)."""

    def __init__(self, name: str, config):
        self.name, self.config, self.lab = name, config, None

    def get(self):
        from labkit import Lab
        from labkit.net.ledger import Ledger

        if self.lab is None or not Ledger(self.name).exists() or self.lab.health():
            self.lab = Lab.up(self.name, config=self.config)
        self.lab.reset()
        return self.lab

    def down(self) -> None:
        from labkit import Lab

        Lab.cleanup(self.name)


def _shared_lab(name: str, config):
    shared = _SharedLab(name, config)
    yield shared
    shared.down()


# The shared labs start with the GC timer off: tests move the lab clock far ahead and then read the
# expired rows; test_gc.py switches it on where the timer is what it tests. They count packets and bytes
# (ct_accounting, off on a default node): many tests here pin the counters. What a default node prints
# (Packets=0 Bytes=0) is pinned by test_golden.py on labs with the default options.
@pytest.fixture(scope="session")
def _lab_tunnel(_require_datapath):
    from labkit.config import DatapathConfig

    yield from _shared_lab(tagged("dptest"), DatapathConfig(routing="tunnel", gc_timer=False, ct_accounting=True))


@pytest.fixture(scope="session")
def _lab_native(_require_datapath):
    from labkit.config import DatapathConfig

    yield from _shared_lab(tagged("dpnative"), DatapathConfig(routing="native", gc_timer=False, ct_accounting=True))


@pytest.fixture
def lab(_lab_tunnel):
    """The shared tunnel-mode lab `dptest`, healed and reset for this test."""
    return _lab_tunnel.get()


@pytest.fixture
def native_lab(_lab_native):
    """The shared native-routing lab `dpnative`, healed and reset for this test."""
    return _lab_native.get()


@pytest.fixture(params=["tunnel", "native"])
def any_lab(request, _require_datapath):
    """Each routing mode's shared lab in turn, healed and reset."""
    return request.getfixturevalue("_lab_tunnel" if request.param == "tunnel" else "_lab_native").get()


@pytest.fixture
def host_before():
    """The host namespace as it was when the session started."""
    return _HOST_BEFORE
