"""labkit.policy.identity: labels, reserved identities, the allocator and `cilium-dbg identity list`."""
from __future__ import annotations

import pytest

from labkit.errors import PolicyError
from labkit.policy.identity import (
    IDENTITY_SCOPE_LOCAL,
    MIN_LOCAL_IDENTITY,
    RESERVED,
    RESERVED_NAMES,
    IdentityAllocator,
    Label,
    LabelSet,
    identity_list_lines,
    pod_labels,
    reserved_labels,
)


def test_reserved_numbers_and_names():
    """pkg/identity/numericidentity.go (v1.16): the iota block host 1 … ingress 8, then world-ipv4 9, world-ipv6 10."""
    assert RESERVED == {"host": 1, "world": 2, "unmanaged": 3, "health": 4, "init": 5, "remote-node": 6,
                        "kube-apiserver": 7, "ingress": 8, "world-ipv4": 9, "world-ipv6": 10}
    assert RESERVED_NAMES[0] == "unknown"


def test_kube_apiserver_labels_include_remote_node():
    """reservedIdentityLabels: kube-apiserver carries reserved:kube-apiserver and reserved:remote-node."""
    assert reserved_labels(7).printable() == ["reserved:kube-apiserver", "reserved:remote-node"]
    assert reserved_labels(1).printable() == ["reserved:host"]


@pytest.mark.parametrize("text,want", [
    # pkg/labels/labels.go parseLabel / Label.String
    ("k8s:app=web", ("k8s", "app", "web")),
    ("reserved:host", ("reserved", "host", "")),
    ("app=web", ("unspec", "app", "web")),
    ("k8s:io.kubernetes.pod.namespace=default", ("k8s", "io.kubernetes.pod.namespace", "default")),
])
def test_label_parse_and_string(text, want):
    """A label is source:key[=value], source up to the first colon; str() gives it back."""
    lbl = Label.parse(text)
    assert (lbl.source, lbl.key, lbl.value) == want
    assert str(Label.parse(text)) == (text if ":" in text else "unspec:" + text)


def test_bad_label():
    """An empty key is a PolicyError naming the label."""
    with pytest.raises(PolicyError, match="'k8s:=x'"):
        Label.parse("k8s:=x")


def test_allocator_from_256_same_set_same_number():
    """Cluster identities start at MinimalNumericIdentity 256; an equal label set gets the same number."""
    a = IdentityAllocator()
    web = pod_labels({"app": "web"})
    assert a.allocate(web) == 256
    assert a.allocate(pod_labels({"app": "db"})) == 257
    assert a.allocate(pod_labels({"app": "web"})) == 256
    assert a.labels(256) == web


def test_allocator_restart_keeps_numbers():
    """Given the previous allocation, sets keep their numbers and new ones continue after the highest."""
    a = IdentityAllocator()
    for app in ("a", "b", "c"):
        a.allocate(pod_labels({"app": app}))
    b = IdentityAllocator(previous=a.snapshot())
    assert b.allocate(pod_labels({"app": "c"})) == 258
    assert b.allocate(pod_labels({"app": "d"})) == 259


def test_reserved_label_set_gets_reserved_number():
    """A set equal to a reserved identity's labels is that identity, not a new one."""
    assert IdentityAllocator().allocate(LabelSet.parse(["reserved:world"])) == 2


def test_cidr_identities_local_scope():
    """CIDR identities: IdentityScopeLocal (1<<24) | counter from MinAllocatorLocalIdentity 1 → first is 16777217."""
    a = IdentityAllocator()
    assert IDENTITY_SCOPE_LOCAL == 16777216 and MIN_LOCAL_IDENTITY == 16777217
    n = a.allocate_cidr("198.51.100.0/24")
    assert n == 16777217 and a.allocate_cidr("198.51.100.7/24") == n
    assert a.allocate_cidr("203.0.113.9/32") == 16777218
    assert a.labels(n).printable() == ["cidr:198.51.100.0/24", "reserved:world"]
    assert str(a.cidr_of(n)) == "198.51.100.0/24" and a.cidr_of(2) is None


def test_bad_cidr():
    """A prefix that is not one is a PolicyError."""
    with pytest.raises(PolicyError, match="not-a-cidr"):
        IdentityAllocator().allocate_cidr("not-a-cidr")


def test_identity_list_grammar():
    """identity_get.go printIdentities: "ID\\tLABELS", the ID on a set's first label only, tabwriter(2,0,3)."""
    a = IdentityAllocator()
    a.allocate(LabelSet.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=default"]))
    lines = identity_list_lines(a)
    # the widest ID is "256" → column width 3 + padding 3 = 6
    assert lines[0] == "ID    LABELS"
    assert lines[1] == "1     reserved:host"
    assert lines[7] == "7     reserved:kube-apiserver" and lines[8] == "      reserved:remote-node"
    assert lines[-2:] == ["256   k8s:app=web", "      k8s:io.kubernetes.pod.namespace=default"]


def test_reserved_numbers_agree_with_the_ipcache_module():
    """labkit.maps.eps names host, world and remote-node for the ipcache; the numbers are the same ones."""
    from labkit.maps import eps
    assert (eps.IDENTITY_HOST, eps.IDENTITY_WORLD, eps.IDENTITY_REMOTE_NODE) == (RESERVED["host"], RESERVED["world"], RESERVED["remote-node"])
