"""The examples in labkit's docstrings run and give what they show."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "labkit.net.topology",
    "labkit.config",
    "labkit.maps.ct",
    "labkit.maps.eps",
    "labkit.maps.config",
    "labkit.maps.base",
    "labkit.clock",
    "labkit.constants",
    "labkit.datapath.source",
    "labkit.agent.endpoints",
    "labkit.net.podserver",
    "labkit.maps.lb",
    "labkit.agent.services",
    "labkit.agent.services.ids",
    "labkit.grading.checks",
    "labkit.grading.answers",
    "labkit.grading.grade",
    "labkit.grading.jobs",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    """Every docstring example of the module passes (and there is at least one)."""
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0
