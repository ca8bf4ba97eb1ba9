"""The examples in labkit's docstrings run and give what they show."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "labkit.topology",
    "labkit.config",
    "labkit.maps.ct",
    "labkit.maps.eps",
    "labkit.maps.config",
    "labkit.maps.base",
    "labkit.clock",
    "labkit.constants",
    "labkit.datapath.source",
    "labkit.agent",
    "labkit.podserver",
    "labkit.maps.lb",
    "labkit.services",
    "labkit.checks",
    "labkit.answers",
    "labkit.grade",
    "labkit._jobs",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    """Every docstring example of the module passes (and there is at least one)."""
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.attempted > 0, f"{name} has no doctest examples"
    assert result.failed == 0
