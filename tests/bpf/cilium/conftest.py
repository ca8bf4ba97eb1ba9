"""The peer tier's own builds: node-a's programs as the harness builds them (tests/bpf/conftest.py's session
fixtures serve every other test here), plus --service-no-backend-response=drop for Cilium's scenarios compiled
without SERVICE_NO_BACKEND_RESPONSE. Each is compiled once per session (BCC's image is cached after that)."""
from __future__ import annotations

from dataclasses import replace

import pytest


def _drop_mode_node(name: str):
    from labkit.datapath.source import node_build
    from labkit.datapath.testrun import TestBuild

    from ..harness import BUILDS, NODE, TOPO, Node

    config, files = BUILDS[name]  # as harness.loaded_build makes it, one macro more
    build = node_build(TOPO, config, NODE)
    build = replace(build, files=files, programs=tuple(p for p in build.programs if p.source in files),
                    macros={**build.macros, "SERVICE_NO_BACKEND_DROP": 1})
    loaded = TestBuild.load(build)
    node = Node(name, loaded)
    yield node
    loaded.close()


@pytest.fixture(scope="session")
def _native_drop(_require_bpf):
    yield from _drop_mode_node("native")


@pytest.fixture(scope="session")
def _xdp_snat_drop(_require_bpf):
    yield from _drop_mode_node("xdp-snat")


@pytest.fixture
def native_drop(_native_drop):
    """``native`` built with SERVICE_NO_BACKEND_DROP (--service-no-backend-response=drop); maps reset."""
    _native_drop.reset()
    return _native_drop


@pytest.fixture
def xdp_snat_drop(_xdp_snat_drop):
    """``xdp_snat`` built with SERVICE_NO_BACKEND_DROP; maps reset."""
    _xdp_snat_drop.reset()
    return _xdp_snat_drop


@pytest.fixture(scope="session")
def fib(_require_bpf):
    """node-a's eth0, routes and neighbours in a namespace of the session's own, for XDP test runs whose FIB lookup
    answers as on node-a (fibns.py); removed at the end."""
    from .fibns import FibNamespace

    ns = FibNamespace()
    yield ns
    ns.close()
