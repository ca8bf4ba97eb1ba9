"""The examples in labkit's docstrings run and give what they show: the one place doctests are collected."""
from __future__ import annotations

import doctest
import importlib

import pytest

#: Modules whose examples need more than ELLIPSIS, and what.
FLAGS = {name: doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE for name in (
    "labkit.agent.kubeproxy", "labkit.agent.kubeproxy.names", "labkit.agent.kubeproxy.endpoints",
    "labkit.agent.kubeproxy.rules", "labkit.agent.kubeproxy.sync", "labkit.agent.kubeproxy.conntrack",
    "labkit.agent.kubeproxy._nfacct", "labkit.agent.kubeproxy.text")}
#: Modules whose examples need the notebook extra.
NEEDS = {"labkit.notebook.viz": ("matplotlib", "ipywidgets"), "labkit.tools.bench": ("nbformat",)}

MODULES = [
    "labkit.net.topology",
    "labkit.config",
    "labkit.maps.ct",
    "labkit.maps.eps",
    "labkit.maps.policy",
    "labkit.policy.identity",
    "labkit.policy.matchpattern",
    "labkit.policy.rules",
    "labkit.policy.resolve",
    "labkit.maps.config",
    "labkit.maps.base",
    "labkit.net.ledger",
    "labkit.clock",
    "labkit.constants",
    "labkit.addr",
    "labkit.datapath.source",
    "labkit.agent.endpoints",
    "labkit.agent.identities",
    "labkit.agent.policies",
    "labkit.net.podserver",
    "labkit.maps.lb",
    "labkit.agent.services",
    "labkit.agent.services.ids",
    "labkit.agent.services.store",
    "labkit.agent.services.restore",
    "labkit.agent.services.core",
    "labkit.agent.api",
    "labkit.tools.bench",
    "labkit.tools.doorbench",
    "labkit.cli.doctor",
    "labkit.grading.checks",
    "labkit.grading.answers",
    "labkit.grading.grade",
    "labkit.grading.jobs",
    "labkit.maps.nat",
    "labkit.notebook.viz",
    "labkit.notebook.pathgraph",
    "labkit.notebook.svgpath",
    "labkit.notebook.stepview",
    "labkit.notebook.ladder",
    "labkit.notebook.widgets",
    "labkit.maglev",
    "labkit.agent.gc",
    "labkit._tabwriter",
    "labkit.client.session",
    "labkit.client.lab",
    "labkit.lab.standby",
    "labkit.lab.members",
    "labkit.door.api",
    "labkit.door.wire",
    "labkit.door.owners",
    "labkit.door.labs",
    "labkit.door.verbs",
    "labkit.lab.kpcompare",
    "labkit.cli",
    "labkit.workdir",
    "labkit.datapath.doctor",
    *FLAGS,
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    """Every docstring example of the module passes (and there is at least one)."""
    for extra in NEEDS.get(name, ()):
        pytest.importorskip(extra)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=FLAGS.get(name, doctest.ELLIPSIS), verbose=False, report=True)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0
