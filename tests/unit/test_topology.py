"""The lab as data: default addresses, naming rules, validation, serialisation."""
from __future__ import annotations

import ipaddress

import pytest

from labkit.errors import LabkitError, NotFoundError, TopologyError
from labkit.net.topology import External, Node, Pod, Topology


@pytest.fixture
def topo() -> Topology:
    return Topology.default("demo")


def _nodes(*cidrs: str) -> tuple[Node, ...]:
    return tuple(Node(f"node-{chr(97 + i)}", f"198.51.100.{11 + i}", cidr, i + 1) for i, cidr in enumerate(cidrs))


def test_default_addresses(topo):
    """The default lab has DESIGN's addresses: nodes .11/.12 on 198.51.100/24, pods .11/.12 in 198.18.<n>.0/24, ext .100."""
    assert [(n.name, n.ip, n.pod_cidr, n.node_id) for n in topo.nodes] == [
        ("node-a", "198.51.100.11", "198.18.1.0/24", 1),
        ("node-b", "198.51.100.12", "198.18.2.0/24", 2),
    ]
    assert {p.name: (p.node, p.ip) for p in topo.pods} == {
        "a1": ("node-a", "198.18.1.11"),
        "a2": ("node-a", "198.18.1.12"),
        "b1": ("node-b", "198.18.2.11"),
        "b2": ("node-b", "198.18.2.12"),
    }
    assert [(e.name, e.ip) for e in topo.externals] == [("ext", "198.51.100.100")]
    assert topo.node("node-a").router_ip == "198.18.1.1"
    assert topo.node("node-b").router_ip == "198.18.2.1"
    assert topo.underlay == "198.51.100.0/24"


def test_default_identities_are_cluster_local(topo):
    """Pod identities are distinct and allocated from 256 up, as Cilium's cluster-local identities."""
    ids = [p.identity for p in topo.pods]
    assert len(set(ids)) == len(ids) and min(ids) >= 256


def test_naming(topo):
    """Namespaces are lk-<lab>-<name>, pod host veths lxc-<pod>, node fabric ports the node name."""
    assert topo.netns("a1") == "lk-demo-a1"
    assert topo.netns("node-b") == "lk-demo-node-b"
    assert topo.netns("fabric") == "lk-demo-fabric"
    assert topo.host_veth("a1") == "lxc-a1"
    assert topo.fabric_port("node-a") == "node-a"
    assert topo.all_netns()[0] == "lk-demo-fabric"
    assert set(topo.all_netns()) == {f"lk-demo-{n}" for n in ["fabric", "node-a", "node-b", "a1", "a2", "b1", "b2", "ext"]}


def test_lookups(topo):
    """pods_on, kind_of and owner_of answer from the data."""
    assert [p.name for p in topo.pods_on("node-b")] == ["b1", "b2"]
    assert (topo.kind_of("node-a"), topo.kind_of("a2"), topo.kind_of("ext")) == ("node", "pod", "external")
    assert topo.owner_of("198.18.2.12") == "b2"
    assert topo.owner_of("198.51.100.11") == "node-a"
    assert topo.owner_of("198.51.100.100") == "ext"
    assert topo.owner_of("192.0.2.1") is None


def test_only_reserved_documentation_ranges(topo):
    """Every default address lies in RFC 5737 / RFC 2544 ranges, never in RFC 1918 space."""
    private = [ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]
    allowed = [ipaddress.ip_network(n) for n in ("198.51.100.0/24", "198.18.0.0/15")]
    for obj in list(topo.nodes) + list(topo.pods) + list(topo.externals):
        ip = ipaddress.ip_address(obj.ip)
        assert any(ip in n for n in allowed) and not any(ip in n for n in private), obj


# -- validation ---------------------------------------------------------------
def _raises_topology(fn, *words):
    with pytest.raises(TopologyError) as info:
        fn()
    assert isinstance(info.value, ValueError) and isinstance(info.value, LabkitError)
    for w in words:
        assert w in str(info.value), f"{w!r} not in {info.value}"
    return info.value


def test_duplicate_names():
    """A name used twice is rejected, naming it."""
    _raises_topology(lambda: Topology.build("demo", {"node-a": ["a1"], "node-b": ["a1"]}), "'a1'", "twice")
    _raises_topology(lambda: Topology.build("demo", {"node-a": ["node-a"]}), "'node-a'")


def test_interface_name_too_long():
    """A 12-character pod name makes lxc-<pod> 16 characters, over the kernel's 15: rejected naming the pod."""
    name = "abcdefghijkl"
    assert len("lxc-" + name) == 16
    _raises_topology(lambda: Topology.build("demo", {"node-a": [name]}), f"'{name}'", f"lxc-{name}", "15")
    # 11 characters fit exactly
    assert Topology.build("demo", {"node-a": [name[:11]]}).host_veth(name[:11]) == "lxc-abcdefghijk"


def test_node_name_too_long():
    """A node name longer than 15 characters cannot be a fabric port name."""
    _raises_topology(lambda: Topology.build("demo", {"n" * 16: ["a1"]}), "n" * 16)


@pytest.mark.parametrize("bad", ["A1", "1pod", "pod_1", "pod.1", "-pod", "pöd", ""])
def test_invalid_names(bad):
    """Upper case, leading digits or dashes and other characters are rejected, naming the object."""
    err = _raises_topology(lambda: Topology.build("demo", {"node-a": [bad]}))
    assert f"'{bad}'" in str(err)


def test_fabric_is_reserved():
    """'fabric' names the underlay namespace and cannot be a node, pod or external name."""
    _raises_topology(lambda: Topology.build("demo", {"fabric": ["a1"]}), "'fabric'")
    _raises_topology(lambda: Topology.build("demo", {"node-a": ["fabric"]}), "'fabric'")
    _raises_topology(lambda: Topology.build("demo", {"node-a": ["a1"]}, externals=["fabric"]), "'fabric'")


@pytest.mark.parametrize("bad", ["Demo", "-demo", "de_mo", "a" * 25, "", "demo lab"])
def test_bad_lab_names(bad):
    """Lab names must be 1-24 characters of a-z, 0-9 and '-', starting with a letter or digit."""
    _raises_topology(lambda: Topology.default(bad), "lab name")


def test_lab_name_with_trailing_newline_rejected():
    """'demo\\n' is not 1-24 characters of a-z, 0-9 and '-': the lab name check must not let a newline through."""
    _raises_topology(lambda: Topology.default("demo\n"), "lab name")


def test_object_name_with_trailing_newline_rejected():
    """A pod named 'a1\\n' is rejected: names are lower-case letters, digits and '-' only."""
    _raises_topology(lambda: Topology.build("demo", {"node-a": ["a1\n"]}), "a1")


def test_long_lab_name_boundary():
    """A 24-character lab name is accepted."""
    assert Topology.default("a" * 24).netns("a1") == f"lk-{'a' * 24}-a1"


def test_overlapping_pod_cidrs():
    """Two nodes sharing a pod CIDR are rejected, naming both nodes."""
    t = Topology("demo", _nodes("198.18.1.0/24", "198.18.1.0/25"), ())
    _raises_topology(t.validate, "node-a", "node-b", "overlaps")
    _raises_topology(lambda: Topology.from_dict(t.to_dict()), "overlaps")


def test_pod_cidr_overlapping_clusterip_range():
    """A pod CIDR inside the ClusterIP range 198.19.0.0/16 is rejected."""
    _raises_topology(Topology("demo", _nodes("198.19.5.0/24"), ()).validate, "node-a", "ClusterIP")


@pytest.mark.parametrize("cidr", ["10.1.0.0/24", "172.20.0.0/24", "192.168.7.0/24"])
def test_private_pod_cidr_rejected(cidr):
    """Pod CIDRs from 10/8, 172.16/12 or 192.168/16 are rejected, naming the node and the private range."""
    pod = Pod("a1", "node-a", str(ipaddress.ip_network(cidr)[11]), 256)
    t = Topology("demo", _nodes(cidr), (pod,))
    err = _raises_topology(t.validate, "node-a", cidr)
    assert "private" in str(err)


def test_private_underlay_rejected():
    """An underlay in RFC 1918 space is rejected."""
    t = Topology("demo", (), (), (), "192.168.0.0/24")
    _raises_topology(t.validate, "underlay")


def test_addresses_outside_their_networks():
    """A node outside the underlay and a pod outside its node's CIDR are rejected, naming them."""
    _raises_topology(Topology("demo", (Node("node-a", "198.51.99.1", "198.18.1.0/24", 1),), ()).validate, "node-a")
    pod = Pod("a1", "node-a", "198.18.2.11", 256)
    _raises_topology(Topology("demo", _nodes("198.18.1.0/24"), (pod,)).validate, "'a1'", "198.18.2.11")
    router = Pod("a1", "node-a", "198.18.1.1", 256)
    _raises_topology(Topology("demo", _nodes("198.18.1.0/24"), (router,)).validate, "'a1'", "router")
    ext = External("ext", "203.0.113.5")
    _raises_topology(Topology("demo", (), (), (ext,)).validate, "'ext'", "underlay")


def test_duplicate_addresses():
    """Two objects with one address are rejected, naming both."""
    pods = (Pod("a1", "node-a", "198.18.1.11", 256), Pod("a2", "node-a", "198.18.1.11", 257))
    _raises_topology(Topology("demo", _nodes("198.18.1.0/24"), pods).validate, "'a1'", "'a2'", "198.18.1.11")


# -- lookups that fail ----------------------------------------------------------
def test_not_found_lists_pods(topo):
    """An unknown pod raises NotFoundError (a LookupError) listing the lab's pods."""
    with pytest.raises(NotFoundError) as info:
        topo.pod("a9")
    assert isinstance(info.value, LookupError) and isinstance(info.value, LabkitError)
    msg = str(info.value)
    assert "'a9'" in msg and "demo" in msg and all(p in msg for p in ("a1", "a2", "b1", "b2"))


def test_not_found_lists_nodes(topo):
    """An unknown node raises NotFoundError listing the nodes; so do pods_on, netns and kind_of."""
    with pytest.raises(LookupError) as info:
        topo.node("node-z")
    assert "'node-z'" in str(info.value) and "node-a" in str(info.value) and "node-b" in str(info.value)
    for call in (lambda: topo.pods_on("node-z"), lambda: topo.netns("zz"), lambda: topo.kind_of("zz"),
                 lambda: topo.external("zz")):
        with pytest.raises(NotFoundError):
            call()


# -- changes and serialisation --------------------------------------------------
def test_round_trip(topo):
    """from_dict(to_dict()) gives an equal topology; the dict is plain data."""
    data = topo.to_dict()
    assert data["lab"] == "demo" and data["nodes"][0]["ip"] == "198.51.100.11"
    assert Topology.from_dict(data) == topo


def test_with_pod(topo):
    """with_pod adds the next free address on the node and a fresh identity, leaving the original unchanged."""
    t2 = topo.with_pod("a3", "node-a")
    a3 = t2.pod("a3")
    assert (a3.node, a3.ip) == ("node-a", "198.18.1.13")
    assert a3.identity not in {p.identity for p in topo.pods}
    assert "a3" not in [p.name for p in topo.pods]
    with pytest.raises(TopologyError):
        topo.with_pod("a1", "node-b")
    with pytest.raises(NotFoundError):
        topo.with_pod("z1", "node-z")


def test_without_pod(topo):
    """without_pod removes exactly that pod; its address is reused by the next with_pod."""
    t2 = topo.without_pod("a1")
    assert [p.name for p in t2.pods] == ["a2", "b1", "b2"]
    assert t2.with_pod("a9", "node-a").pod("a9").ip == "198.18.1.11"
    with pytest.raises(NotFoundError):
        topo.without_pod("a9")


def test_to_networkx(topo):
    """The graph has namespaces and devices as nodes, linked pod–lxc–node–eth0–fabric and ext–fabric."""
    g = topo.to_networkx()
    expected_nodes = {
        "fabric", "node-a", "node-b", "node-a/eth0", "node-b/eth0", "a1", "a2", "b1", "b2",
        "node-a/lxc-a1", "node-a/lxc-a2", "node-b/lxc-b1", "node-b/lxc-b2", "ext",
    }
    assert set(g.nodes) == expected_nodes
    expected_edges = {
        frozenset(e)
        for e in [
            ("node-a", "node-a/eth0"), ("node-a/eth0", "fabric"), ("node-b", "node-b/eth0"), ("node-b/eth0", "fabric"),
            ("a1", "node-a/lxc-a1"), ("node-a/lxc-a1", "node-a"), ("a2", "node-a/lxc-a2"), ("node-a/lxc-a2", "node-a"),
            ("b1", "node-b/lxc-b1"), ("node-b/lxc-b1", "node-b"), ("b2", "node-b/lxc-b2"), ("node-b/lxc-b2", "node-b"),
            ("ext", "fabric"),
        ]
    }
    assert {frozenset(e) for e in g.edges} == expected_edges
    assert g.nodes["a1"]["kind"] == "pod" and g.nodes["node-a/lxc-a1"]["hooks"] == ["from-container", "to-container"]
    assert g.nodes["node-a/eth0"]["netns"] == "lk-demo-node-a"


# -- labels ---------------------------------------------------------------------------------
def test_default_labels_name_the_pod(topo):
    """Every pod of the default lab is labelled app=<its name>, so no two default pods share labels."""
    assert {p.name: p.labels for p in topo.pods} == {"a1": {"app": "a1"}, "a2": {"app": "a2"},
                                                     "b1": {"app": "b1"}, "b2": {"app": "b2"}}


def test_build_takes_labels_per_pod():
    """Topology.build gives the pods named in ``labels`` those labels and the others app=<name>."""
    t = Topology.build("t", {"n1": ["p1", "p2"]}, labels={"p2": {"app": "web", "tier": "front"}})
    assert (t.pod("p1").labels, t.pod("p2").labels) == ({"app": "p1"}, {"app": "web", "tier": "front"})


def test_labels_for_an_unknown_pod_are_refused():
    """Labels given for a name that is not a pod of the lab are a TopologyError naming it."""
    with pytest.raises(TopologyError, match="labels given for zz"):
        Topology.build("t", {"n1": ["p1"]}, labels={"zz": {"app": "x"}})


@pytest.mark.parametrize("labels, bad", [({"bad key": "x"}, "label key 'bad key'"),
                                         ({"app": "a b"}, "label app='a b'"),
                                         ({"app": 3}, "label app=3"),
                                         ({"-app": "x"}, "label key '-app'")])
def test_malformed_labels_are_refused(labels, bad):
    """Label keys and values follow Kubernetes' syntax; anything else is a TopologyError naming the label."""
    with pytest.raises(TopologyError, match=bad):
        Topology.build("t", {"n1": ["p1"]}, labels={"p1": labels})


def test_labels_survive_the_state_file():
    """to_dict/from_dict keep every pod's labels; a state file written before labels existed loads app=<name>."""
    t = Topology.build("t", {"n1": ["p1", "p2"]}, labels={"p2": {"app": "web"}})
    assert Topology.from_dict(t.to_dict()) == t
    old = t.to_dict()
    for p in old["pods"]:
        del p["labels"]
    assert {p.name: p.labels for p in Topology.from_dict(old).pods} == {"p1": {"app": "p1"}, "p2": {"app": "p2"}}


def test_with_identities_replaces_only_the_named_pods(topo):
    """with_identities sets the given pods' identities and leaves the rest and the original alone."""
    t = topo.with_identities({"b1": 256})
    assert [p.identity for p in t.pods] == [256, 257, 256, 259]
    assert [p.identity for p in topo.pods] == [256, 257, 258, 259]


def test_with_pod_takes_labels(topo):
    """with_pod gives the new pod the labels passed, else app=<name>."""
    assert topo.with_pod("a3", "node-a", {"app": "a1"}).pod("a3").labels == {"app": "a1"}
    assert topo.with_pod("a3", "node-a").pod("a3").labels == {"app": "a3"}
