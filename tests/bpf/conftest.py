"""BPF unit tier: node-a's compiled tc programs run on crafted frames with
BPF_PROG_TEST_RUN — no namespace, no link, milliseconds per test (Cilium's
bpf/tests do the same with its programs).

Each build is compiled once per session (BCC takes seconds per compile); every
test gets its node with the maps reset. In CI (CI=true) a test that would be
skipped for lack of root or BPF fails instead (the gate in tests/conftest.py).
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def _require_bpf(datapath_ready):
    """Root and BPF (tests/conftest.py's CI gate)."""


def _session_node(name: str):
    from .harness import Node, loaded_build

    build = loaded_build(name)
    node = Node(name, build)
    yield node
    build.close()


@pytest.fixture(scope="session")
def _native(_require_bpf):
    yield from _session_node("native")


@pytest.fixture(scope="session")
def _snat(_require_bpf):
    yield from _session_node("snat")


@pytest.fixture(scope="session")
def _tunnel(_require_bpf):
    yield from _session_node("tunnel")


@pytest.fixture
def native(_native):
    """node-a, native routing, lb mode dsr, CT accounting on; maps reset, no fault."""
    _native.reset()
    return _native


@pytest.fixture
def snat(_snat):
    """node-a's uplink programs in lb mode snat; maps reset, no fault."""
    _snat.reset()
    return _snat


@pytest.fixture
def tunnel(_tunnel):
    """node-a in tunnel routing, otherwise labkit's defaults (no CT accounting); maps reset, no fault."""
    _tunnel.reset()
    return _tunnel


@pytest.fixture(scope="session")
def _policy(_require_bpf):
    yield from _session_node("policy")


@pytest.fixture(scope="session")
def _audit(_require_bpf):
    yield from _session_node("audit")


@pytest.fixture
def policy(_policy):
    """node-a's pod programs with policy compiled in (native routing); maps reset, no pod has a policy map."""
    _policy.reset()
    return _policy


@pytest.fixture
def audit(_audit):
    """The same with policy audit mode; maps reset, no pod has a policy map."""
    _audit.reset()
    return _audit


@pytest.fixture(scope="session")
def _policy_tunnel(_require_bpf):
    yield from _session_node("policy-tunnel")


@pytest.fixture
def policy_tunnel(_policy_tunnel):
    """node-a's pod programs with policy compiled in and tunnel routing; maps reset, no pod has a policy map."""
    _policy_tunnel.reset()
    return _policy_tunnel


@pytest.fixture(scope="session")
def _xdp(_require_bpf):
    yield from _session_node("xdp")


@pytest.fixture(scope="session")
def _xdp_snat(_require_bpf):
    yield from _session_node("xdp-snat")


@pytest.fixture
def xdp(_xdp):
    """node-a, native routing, dsr, CT accounting, NodePort acceleration in XDP; maps reset, no fault."""
    _xdp.reset()
    return _xdp


@pytest.fixture
def xdp_snat(_xdp_snat):
    """The same in snat mode."""
    _xdp_snat.reset()
    return _xdp_snat
