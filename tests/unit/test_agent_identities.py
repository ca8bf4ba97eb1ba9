"""labkit.agent.identities: pods' identities from their label sets, and the allocator kept between processes."""
from __future__ import annotations

import json

import pytest

from labkit.agent import identities
from labkit.agent.identities import IdentityStore, assign, labels_of
from labkit.errors import LabStateError
from labkit.net import ledger
from labkit.net.topology import Topology
from labkit.policy.identity import LabelSet


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A private /run/labkit with lab 'x' in it."""
    monkeypatch.setattr(ledger, "RUN_DIR", tmp_path)
    (tmp_path / "x").mkdir()
    return tmp_path


def test_default_lab_keeps_its_identities():
    """The default lab's pods get 256-259 in declaration order (MinimalNumericIdentity = 256), the numbers the
    golden CT rows carry (SourceSecurityID=256 for a1)."""
    topo, _ = assign(Topology.default())
    assert [(p.name, p.identity) for p in topo.pods] == [("a1", 256), ("a2", 257), ("b1", 258), ("b2", 259)]


def test_equal_labels_share_an_identity():
    """Pods with equal label sets share one identity (an identity stands for a label set, pkg/identity), and
    the next distinct set takes the next number."""
    topo = Topology.build("t", {"n1": ["p1", "p2"], "n2": ["p3", "p4"]},
                          labels={"p1": {"app": "web"}, "p3": {"app": "web"}})
    topo, _ = assign(topo)
    assert {p.name: p.identity for p in topo.pods} == {"p1": 256, "p2": 257, "p3": 256, "p4": 258}


def test_label_order_does_not_matter():
    """A label set is a set: the same labels written in another order are the same identity."""
    topo = Topology.build("t", {"n1": ["p1", "p2"]},
                          labels={"p1": {"app": "web", "tier": "a"}, "p2": {"tier": "a", "app": "web"}})
    topo, _ = assign(topo)
    assert topo.pod("p1").identity == topo.pod("p2").identity == 256


def test_pod_label_set_is_ciliums():
    """The label set of a pod is its labels under k8s: plus the namespace, service-account and cluster labels
    (pkg/k8s/utils GetPodMetadata / policy labels every pod carries)."""
    pod = Topology.default().pod("a1")
    assert labels_of(pod).printable() == [
        "k8s:app=a1",
        "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default",
        "k8s:io.cilium.k8s.policy.cluster=default",
        "k8s:io.cilium.k8s.policy.serviceaccount=default",
        "k8s:io.kubernetes.pod.namespace=default",
    ]


def test_store_round_trip_keeps_numbers(run_dir):
    """An allocator saved and loaded gives every label set its old number, and a new set the next free one."""
    topo, alloc = assign(Topology.default("x"))
    alloc.allocate_cidr("203.0.113.0/24")
    IdentityStore("x").save(alloc)
    again = IdentityStore("x").load()
    assert again.snapshot() == alloc.snapshot()
    assert again.allocate(LabelSet.parse({"app": "new"})) == 260
    assert again.allocate_cidr("203.0.113.8/29") == (1 << 24) + 2


def test_store_is_in_the_ledger(run_dir):
    """identities.json is recorded in the lab's ledger (so `down` removes it), once."""
    store = IdentityStore("x")
    store.save(assign(Topology.default("x"))[1])
    store.save(assign(Topology.default("x"))[1])
    entries = [json.loads(line) for line in (run_dir / "x" / "ledger.jsonl").read_text().splitlines()]
    assert entries == [{"kind": "file", "path": str(run_dir / "x" / identities.IDENTITIES_FILE)}]


def test_store_without_file_is_empty(run_dir):
    """Nothing saved yet: an empty allocator (the first pod set gets 256)."""
    assert IdentityStore("x").load().snapshot() == {}


def test_unreadable_store_names_the_file(run_dir):
    """A corrupt identities.json is a LabStateError naming the file and what was expected."""
    (run_dir / "x" / identities.IDENTITIES_FILE).write_text("{not json")
    with pytest.raises(LabStateError, match="identities.json is unreadable"):
        IdentityStore("x").load()
