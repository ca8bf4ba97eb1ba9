"""Cilium release profiles: which behaviours each profile has, their macros, and the checks on names."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.config import DatapathConfig
from labkit.errors import ConfigError
from labkit.release import BEHAVIOURS, DEFAULT_RELEASE, RELEASES, profile

BPF = Path(__file__).resolve().parents[2] / "bpf"


def test_releases_and_default():
    """The two seed releases are the profiles; 1.16 (the conntrack deep dive's) is the default."""
    assert RELEASES == ("1.16", "1.20") and DEFAULT_RELEASE == "1.16"
    assert DatapathConfig().cilium == "1.16" and DatapathConfig().profile.release == "1.16"


@pytest.mark.parametrize("name, on_116, on_120", [
    ("svc_close_both", True, True),  # backported to v1.16.0 (#33941): the same in both
    ("hairpin_in_no_revnat", False, True),
    ("lb_proto_keys", False, True),
    ("ct_accounting_flag", False, True),
    ("gc_batch", False, True),
    ("snat_retries_32", False, True),
    ("ct_list_no_ifindex", False, True),
    ("ct_list_nat_port", False, True),
])
def test_each_behaviour_per_release(name, on_116, on_120):
    """Each listed behaviour is on in a profile exactly when the release is at least the one that brought it."""
    assert (profile("1.16").has(name), profile("1.20").has(name)) == (on_116, on_120)


def test_every_behaviour_names_its_change():
    """Every row names the Cilium change behind it and what a learner sees differently."""
    for b in BEHAVIOURS:
        assert re.search(r"cilium/cilium(#\d+| commit [0-9a-f]{7,})", b.change), b
        assert b.what and b.since in ("1.16", "1.17", "1.18", "1.19", "1.20")


def test_macros_are_the_behaviours_on():
    """A profile's datapath macros are CILIUM_<NAME>=1 for each behaviour it has, nothing else."""
    assert profile("1.16").macros() == {"CILIUM_SVC_CLOSE_BOTH": 1}
    assert set(profile("1.20").macros()) == {b.macro for b in BEHAVIOURS}


def test_datapath_macros_are_known_behaviours():
    """Every CILIUM_* macro the BPF sources test is a behaviour of the table (no stray spelling)."""
    used = set()
    for path in BPF.rglob("*.[ch]"):
        used |= set(re.findall(r"\bCILIUM_[A-Z0-9_]+\b", path.read_text()))
    assert used and used <= {b.macro for b in BEHAVIOURS}, used - {b.macro for b in BEHAVIOURS}


def test_unknown_release_and_behaviour_are_errors():
    """An unknown release or behaviour name is a ConfigError that lists the valid ones."""
    with pytest.raises(ConfigError, match=r"1\.16, 1\.20.*'1\.17'"):
        DatapathConfig(cilium="1.17")
    with pytest.raises(ConfigError, match="svc_close_both"):
        profile().has("no_such_thing")
    with pytest.raises(ConfigError, match="True or False"):
        DatapathConfig(ct_accounting="yes")


def test_status_lines_say_on_or_off():
    """lines() gives one line per behaviour, on or off in this profile, with its release and change."""
    lines = profile("1.16").lines()
    assert len(lines) == len(BEHAVIOURS)
    assert lines[0].startswith("on  svc_close_both (since 1.16") and lines[1].startswith("off hairpin_in_no_revnat")
