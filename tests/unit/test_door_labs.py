"""labkit.door.labs: labkitd's limits read from its environment, a user's main labs counted, a topology held to the
per-lab limits (no root: a run directory of the test's own, the datapath side's Lab a stand-in)."""
from __future__ import annotations

import json

import pytest

from labkit.config import DatapathConfig
from labkit.door import labs as labs_mod
from labkit.door.labs import Labs, Limits
from labkit.door.owners import Caller, lab_key, owner_of
from labkit.errors import ConfigError, LimitError
from labkit.net import ledger
from labkit.net.topology import IFNAMSIZ, LAB_KEY, Topology

ALICE = Caller(uid=1000, gid=1000, pid=4242, name="alice", groups=frozenset())
BOB = Caller(uid=1001, gid=1001, pid=4343, name="bob", groups=frozenset())
ROOT = Caller(uid=0, gid=0, pid=1, name="root", groups=frozenset())


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A run directory of the test's own: a lab is there when its ledger is."""
    monkeypatch.setattr(ledger, "RUN_DIR", tmp_path)
    return tmp_path


def _lab(run_dir, key):
    d = run_dir / key
    d.mkdir()
    (d / "ledger.jsonl").write_text(json.dumps({"kind": "netns", "name": f"lk-{key}-fabric"}) + "\n")


class _FakeLab:
    """The datapath side's Lab, as far as Labs.up reaches it: records the builds asked for."""

    ups: list = []

    @classmethod
    def up(cls, key, *, config, topology, owner, owner_pid):
        cls.ups.append((key, owner, owner_pid, topology.lab))
        return cls()


@pytest.fixture
def fake_lab(monkeypatch):
    _FakeLab.ups = []
    monkeypatch.setattr(labs_mod, "Lab", _FakeLab)
    return _FakeLab


# -- Limits -------------------------------------------------------------------------------------
def test_limits_from_an_empty_environment_are_the_defaults():
    """No LABKIT_LIMIT_* variable (or an empty one) leaves every limit at its default."""
    assert Limits.from_env({}) == Limits()
    assert Limits.from_env({"LABKIT_LIMIT_LABS": "", "PATH": "/bin"}) == Limits()
    assert Limits() == Limits(labs_per_user=3, nodes_per_lab=8, pods_per_lab=32, services_per_lab=60_000,
                              procs_per_lab=64, concurrent_per_user=8, connections_per_user=64)


def test_each_limit_has_its_variable():
    """Each LABKIT_LIMIT_* variable overrides its own limit and no other."""
    env = {"LABKIT_LIMIT_LABS": "5", "LABKIT_LIMIT_NODES": "4", "LABKIT_LIMIT_PODS": "10",
           "LABKIT_LIMIT_SERVICES": "100", "LABKIT_LIMIT_PROCS": "2", "LABKIT_LIMIT_CONCURRENT": "1",
           "LABKIT_LIMIT_CONNECTIONS": "3"}
    assert Limits.from_env(env) == Limits(5, 4, 10, 100, 2, 1, 3)
    assert Limits.from_env({"LABKIT_LIMIT_PODS": "7"}) == Limits(pods_per_lab=7)


def test_limits_read_labkitds_environment_by_default(monkeypatch):
    """from_env() without a mapping reads the process environment."""
    monkeypatch.setenv("LABKIT_LIMIT_CONCURRENT", "2")
    assert Limits.from_env().concurrent_per_user == 2


@pytest.mark.parametrize("value, says", [("many", "expected a whole number"), ("2.5", "expected a whole number"),
                                         ("0", "expected a number >= 1"), ("-3", "expected a number >= 1")])
def test_a_limit_that_is_not_a_positive_whole_number_is_refused(value, says):
    """A non-number, or a number below 1, is a ConfigError naming the variable and the value given."""
    with pytest.raises(ConfigError) as exc:
        Limits.from_env({"LABKIT_LIMIT_NODES": value})
    assert str(exc.value) == f"LABKIT_LIMIT_NODES={value!r}: {says}"


# -- labs per user -------------------------------------------------------------------------------
def test_a_users_main_labs_are_counted_without_their_variants(run_dir):
    """demo-snat_u1000 belongs to demo: two main labs and a variant are two labs, so a third is allowed."""
    for key in ("demo_u1000", "demo-snat_u1000", "web_u1000"):
        _lab(run_dir, key)
    labs = Labs(Limits(labs_per_user=3))
    labs.check_count(ALICE, "db_u1000")  # a third main lab: allowed
    labs.check_count(ALICE, "web-ipt_u1000")


def test_past_the_limit_a_new_main_lab_is_refused_in_one_line(run_dir):
    """With as many main labs as allowed, a new main lab is refused naming the labs held and the limit."""
    for key in ("demo_u1000", "demo-snat_u1000", "web_u1000"):
        _lab(run_dir, key)
    labs = Labs(Limits(labs_per_user=2))
    with pytest.raises(LimitError) as exc:
        labs.check_count(ALICE, "db_u1000")
    assert str(exc.value) == ("`up` of lab 'db': you have 2 labs (demo, web); labkitd allows 2 per user "
                              "(`labkit down` one first)")


def test_a_variant_or_rebuild_of_a_held_lab_is_not_a_new_lab(run_dir):
    """At the limit, a variant of a lab held (demo-ipt) or the same lab again is still allowed."""
    for key in ("demo_u1000", "web_u1000"):
        _lab(run_dir, key)
    labs = Labs(Limits(labs_per_user=2))
    labs.check_count(ALICE, "demo-ipt_u1000")
    labs.check_count(ALICE, "demo_u1000")
    labs.check_count(ALICE, "web-native_u1000")


def test_other_users_labs_do_not_count(run_dir):
    """Labs of another uid, and root's, are not the caller's: bob's first lab is allowed beside alice's three."""
    for key in ("a_u1000", "b_u1000", "c_u1000", "rootlab", "rootlab2"):
        _lab(run_dir, key)
    labs = Labs(Limits(labs_per_user=1))
    labs.check_count(BOB, "demo_u1001")
    with pytest.raises(LimitError, match="you have 3 labs"):
        labs.check_count(ALICE, "demo_u1000")


def test_a_directory_without_a_ledger_is_not_a_lab(run_dir):
    """Only a run directory with a ledger counts as a lab (a leftover directory does not)."""
    _lab(run_dir, "demo_u1000")
    (run_dir / "old_u1000").mkdir()
    Labs(Limits(labs_per_user=2)).check_count(ALICE, "web_u1000")


def test_check_count_itself_exempts_no_one(run_dir):
    """check_count counts root's labs as anyone's: the instructors' exemption is up()'s to decide."""
    for key in ("a", "b"):
        _lab(run_dir, key)
    with pytest.raises(LimitError, match="you have 2 labs"):
        Labs(Limits(labs_per_user=2)).check_count(ROOT, "c")


def test_up_holds_a_user_to_the_count_and_not_an_instructor(run_dir, fake_lab):
    """up() refuses a user's lab past the limit before anything is built; root (an instructor) builds past it."""
    for key in ("a_u1000", "b_u1000", "a", "b"):
        _lab(run_dir, key)
    labs = Labs(Limits(labs_per_user=2))
    with pytest.raises(LimitError, match="`up` of lab 'c'"):
        labs.up(ALICE, "c_u1000", DatapathConfig(), None)
    assert fake_lab.ups == []
    held = labs.up(ROOT, "c", DatapathConfig(), None)
    assert fake_lab.ups == [("c", 0, 1, "c")]
    assert held.key == "c" and held.owner == 0 and held.supervise and labs.held("c") is held


def test_up_of_a_lab_that_exists_is_not_counted(run_dir, fake_lab):
    """A user at the limit may still `up` a lab they already have (an attach, or a rebuild)."""
    for key in ("a_u1000", "b_u1000"):
        _lab(run_dir, key)
    held = Labs(Limits(labs_per_user=2)).up(ALICE, "a_u1000", DatapathConfig(), None)
    assert fake_lab.ups == [("a_u1000", 1000, 4242, "a_u1000")] and held.owner == 1000


# -- per-lab limits ------------------------------------------------------------------------------
def test_more_nodes_than_allowed_are_refused_naming_the_lab_and_the_limit():
    """A topology of 9 nodes, against 8 allowed, is refused naming the lab, the count and the limit."""
    big = Topology.build("big", {f"n{i}": [] for i in range(9)})
    with pytest.raises(LimitError) as exc:
        Labs().check_topology(big)
    assert str(exc.value) == "lab 'big': 9 nodes; labkitd allows at most 8 per lab"


def test_more_pods_than_allowed_are_refused_naming_the_lab_and_the_limit():
    """The default lab's 4 pods, against 3 allowed, are refused naming the lab, the count and the limit."""
    with pytest.raises(LimitError) as exc:
        Labs(Limits(pods_per_lab=3)).check_topology(Topology.default("demo_u1000"))
    assert str(exc.value) == "lab 'demo_u1000': 4 pods; labkitd allows at most 3 per lab"


def test_a_topology_at_the_limits_is_allowed():
    """Exactly as many nodes and pods as allowed pass."""
    Labs(Limits(nodes_per_lab=2, pods_per_lab=4)).check_topology(Topology.default("demo"))


def test_up_checks_the_topology_before_building(run_dir, fake_lab):
    """up() of a lab with more pods than allowed is refused and nothing is built, even for root."""
    with pytest.raises(LimitError, match="4 pods"):
        Labs(Limits(pods_per_lab=2)).up(ROOT, "demo", DatapathConfig(), None)
    assert fake_lab.ups == []


# -- the longest key ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["a" * 24, "lab-09-bench-ipt-xxxxxxx", "9" * 24])
def test_the_longest_lab_key_still_gives_a_valid_topology(name):
    """A 24-character name with the largest uid makes a key whose topology validates: the owner part never
    reaches an interface name, so every one still fits the kernel's 15 characters."""
    assert len(name) == 24
    key = lab_key(4294967294, name)
    assert key == f"{name}_u4294967294" and LAB_KEY.fullmatch(key) and owner_of(key) == 4294967294
    topo = Topology.default(key)
    topo.validate()
    ifnames = [topo.fabric_port(n.name) for n in topo.nodes + topo.externals] + [topo.host_veth(p.name)
                                                                                 for p in topo.pods]
    assert all(len(i) <= IFNAMSIZ and "_u" not in i for i in ifnames)
    assert topo.netns("a1") == f"lk-{key}-a1"  # the key names namespaces, which have no such limit
    Labs().check_topology(topo)
