"""labkit.lab.inventory: labs read from their state files (no root, a run directory of the test's own)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from labkit.lab import inventory
from labkit.lab.inventory import LabSummary, split_variant
from labkit.net import ledger


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger, "RUN_DIR", tmp_path)
    monkeypatch.setattr(inventory, "RUN_DIR", tmp_path)
    return tmp_path


def _ended_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lab(run_dir, name, *, owner, status="up", created=None, entries=()):
    d = run_dir / name
    d.mkdir()
    (d / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    if status is not None:
        (d / "lab.json").write_text(json.dumps({"lab": name, "status": status, "owner_pid": owner,
                                                "created": time.time() if created is None else created}))


def test_split_variant_knows_only_the_notebook_variants():
    """Only the words of VARIANTS make a variant; other dashes belong to the lab's own name."""
    assert split_variant("w-snat") == ("w", "snat")
    assert split_variant("my-lab") == ("my-lab", None)
    assert split_variant("snat") == ("snat", None)
    assert {split_variant(f"x-{v}")[1] for v in inventory.VARIANTS} == set(inventory.VARIANTS)


def test_session_variants_are_the_inventory_variants():
    """The notebooks' start(variant=...) and `labkit list` agree on what a variant is."""
    from labkit.client.session import VARIANTS

    assert VARIANTS is inventory.VARIANTS


def test_a_variant_whose_starter_ended_is_orphaned(run_dir):
    """A variant lab whose owner process has ended is orphaned; one whose owner runs is not; a main lab never is."""
    gone = _ended_pid()
    _lab(run_dir, "w", owner=gone)
    _lab(run_dir, "w-snat", owner=gone)
    _lab(run_dir, "w-small", owner=os.getpid())
    labs = {s.name: s for s in inventory.inventory()}
    assert labs["w-snat"].orphaned and not labs["w-snat"].owner_alive
    assert not labs["w-small"].orphaned and labs["w-small"].owner_alive
    assert not labs["w"].orphaned and labs["w"].variant is None
    note = labs["w-snat"].note()
    assert f"pid {gone} (ended)" in note and "labkit --lab w-snat down" in note and "start()" in note
    assert labs["w-small"].note() is None


def test_a_recycled_pid_is_not_the_owner(run_dir):
    """A running process that started after the lab was built is not the lab's owner."""
    _lab(run_dir, "w-snat", owner=os.getpid(), created=1.0)  # built long before this process started
    [s] = inventory.inventory()
    assert not s.owner_alive and s.orphaned


def test_main_labs_come_before_their_variants(run_dir):
    """inventory() groups each main lab with its variants, main first, then by variant word."""
    for name in ("b-snat", "a", "b", "a-small", "a-native"):
        _lab(run_dir, name, owner=0)
    assert [s.name for s in inventory.inventory()] == ["a", "a-native", "a-small", "b", "b-snat"]
    assert [s.name for s in inventory.variants_of("a")] == ["a-native", "a-small"]


def test_holds_counts_the_ledger_and_running_processes(run_dir):
    """What a lab holds is counted from its ledger; a process counts as running only if pid and start time match."""
    me = {"kind": "process", "name": "me", "pid": os.getpid(), "start": ledger.process_start_time(os.getpid())}
    stale = {"kind": "process", "name": "old", "pid": os.getpid(), "start": 1}
    entries = [{"kind": "netns", "name": "lk-w-a"}, {"kind": "netns", "name": "lk-w-b"}, me, stale,
               {"kind": "pin", "path": "/sys/fs/bpf/x"}, {"kind": "file", "path": "/run/x"}]
    _lab(run_dir, "w", owner=0, entries=entries)
    [s] = inventory.inventory()
    assert s.holds == {"netns": 2, "process": 2, "pin": 1, "file": 1}
    assert s.running == 1
    assert s.holds_text() == "2 namespaces, 2 processes (1 running), 1 pin"


def test_a_lab_without_state_is_listed_as_broken(run_dir):
    """A ledger without lab.json is still listed (broken), with the cleanup command."""
    _lab(run_dir, "w", owner=0, status=None)
    [s] = inventory.inventory()
    assert s.status == "broken" and s.owner_text() == "-"
    assert "labkit --lab w cleanup" in s.note()


def test_age_uses_the_largest_whole_unit():
    """Ages read as seconds, minutes, hours or days, never a fraction."""
    s = LabSummary("w", "w", None, "up", 1000.0, 0, False)
    assert [s.age(now=1000.0 + d) for d in (5, 61, 7300, 2 * 86400 + 5)] == ["5 s", "1 min", "2 h", "2 d"]
    assert LabSummary("w", "w", None, "broken", None, 0, False).age() == "?"


def test_to_dict_carries_the_verdicts(run_dir):
    """`labkit list --json` rows carry orphaned and age next to the raw fields."""
    _lab(run_dir, "w-ipt", owner=_ended_pid(), created=time.time() - 90)
    [s] = inventory.inventory()
    d = s.to_dict()
    assert d["orphaned"] is True and d["variant"] == "ipt" and d["base"] == "w" and d["age"].endswith("min")
