"""The policy half of the agent on the real kernel: identities from labels in cilium_lxc and cilium_ipcache,
CiliumNetworkPolicies applied through `lab.policy` and `labkit policy`, each endpoint's pinned
cilium_policy_<id> LPM trie holding exactly what the policy resolves to (written by difference), the outer
map labkit_policy pointing at it, CIDR prefixes in the ipcache, delete, agent restart, bad input that leaves
every map byte-identical, and `labkit policy get` / `labkit identity list` output."""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import subprocess
import sys

import pytest

from labkit.agent.identities import labels_of
from labkit.datapath import bpf
from labkit.errors import PolicyError
from labkit.maps.base import PinnedMap
from labkit.maps.eps import EndpointInfo, EndpointKey, IpcacheKey, RemoteEndpointInfo
from labkit.maps.policy import Direction, PolicyEntry, PolicyKey
from labkit.net.topology import Topology
from labkit.policy.identity import IdentityAllocator
from labkit.policy.resolve import Endpoint, resolve
from labkit.policy.rules import parse_policies

from labtag import tagged

IN, EG = Direction.INGRESS, Direction.EGRESS
TCP = 6
LABKIT = [sys.executable, "-m", "labkit", "cli"]
#: pkg/identity/numericidentity.go: the first CIDR identity is MinLocalIdentity = 1 | IdentityScopeLocal (1 << 24).
FIRST_CIDR_IDENTITY = (1 << 24) | 1
#: The default lab's pods, numbered from MinimalNumericIdentity (256) in declaration order: each has its own labels.
IDS = {"a1": 256, "a2": 257, "b1": 258, "b2": 259}

WEB = """apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a1-from-b1}
spec:
  endpointSelector: {matchLabels: {app: a1}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: b1}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
"""
EXT = """apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a1-to-ext}
spec:
  endpointSelector: {matchLabels: {app: a1}}
  egress:
  - toCIDR: [198.51.100.100/32]
"""


def _key(ident, direction, proto=0, port=0):
    return PolicyKey.make(ident, direction, proto, port)


#: a1's map under WEB, by Cilium's rules: ingress enforced (default deny) with allow-localhost (identity 1,
#: determineAllowLocalhostIngress), b1 (258) on 8080/TCP (prefix 40+8+16), egress not selected: allow-all (0).
WEB_A1 = {k: PolicyEntry.allow(k) for k in (_key(1, IN), _key(IDS["b1"], IN, TCP, 8080), _key(0, EG))}


def enforcing_config(**options):
    """A DatapathConfig whose policy mode is Cilium's default (when the datapath has the option; a datapath
    without it is enforced as Cilium's default by the agent)."""
    from labkit.config import DatapathConfig

    if any(f.name == "policy" for f in dataclasses.fields(DatapathConfig)):
        options["policy"] = "default"
    return DatapathConfig(**options)


@pytest.fixture(scope="module")
def shared_lab(_require_datapath):
    from labkit import Lab

    lab = Lab.up(tagged("pol"), config=enforcing_config(gc_timer=False))
    yield lab
    lab.down()


@pytest.fixture
def lab(shared_lab):
    """The module's lab without any policy."""
    shared_lab.policy.flush()
    return shared_lab


def ep_id(lab, pod: str) -> int:
    """The pod's endpoint id, as cilium_lxc holds it."""
    p = lab.topology.pod(pod)
    with PinnedMap(f"{lab.pin_dir(p.node)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
        return lxc[EndpointKey.for_ip(p.ip)].lxc_id


def map_path(lab, pod: str) -> str:
    return f"{lab.pin_dir(lab.topology.pod(pod).node)}/cilium_policy_{ep_id(lab, pod):05d}"


def pinned(lab, pod: str) -> dict[PolicyKey, PolicyEntry]:
    """The pod's pinned policy map, read from bpffs (not through the agent)."""
    with PinnedMap(map_path(lab, pod), PolicyKey, PolicyEntry) as m:
        return {PolicyKey.from_bytes(bytes(k)): v for k, v in m.items_per_key()}


def ipcache(lab, node: str) -> dict[str, int]:
    with PinnedMap(f"{lab.pin_dir(node)}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as m:
        return {str(k): v.sec_identity for k, v in m.items()}


def every_policy_byte(lab) -> dict[str, object]:
    """Every node's policy maps (raw bytes) and ipcache, and which policy maps are pinned: what must not move."""
    out = {}
    for node in lab.topology.nodes:
        d = lab.pin_dir(node.name)
        names = sorted(n for n in os.listdir(d) if n.startswith("cilium_policy_"))
        out[f"{node.name}/pins"] = names
        for n in names:
            with PinnedMap(f"{d}/{n}", PolicyKey, PolicyEntry) as m:
                out[f"{node.name}/{n}"] = sorted((bytes(k), bytes(v)) for k, v in m.items_per_key())
        out[f"{node.name}/ipcache"] = ipcache(lab, node.name)
    return out


def resolved_entries(lab, text: str, pod: str) -> dict:
    """EndpointPolicy.entries() of ``pod`` computed here, from the topology's labels and a fresh allocator."""
    alloc = IdentityAllocator()
    eps = [Endpoint(p.name, labels_of(p), alloc.allocate(labels_of(p)), p.ip) for p in lab.topology.pods]
    return resolve(eps, parse_policies(text), alloc).endpoints[pod].entries()


def cli(lab, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LABKIT, "--lab", lab.name, *argv], capture_output=True, text=True, timeout=60)


# -- identities ------------------------------------------------------------------------------
def test_identities_in_lxc_and_ipcache_are_the_allocators(lab):
    """cilium_lxc and every node's cilium_ipcache carry each pod's identity as allocated from its labels
    (256-259 for the default lab's four label sets, the numbers the golden CT rows use)."""
    assert {p.name: p.identity for p in lab.topology.pods} == IDS
    for pod, ident in IDS.items():
        p = lab.topology.pod(pod)
        with PinnedMap(f"{lab.pin_dir(p.node)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
            assert lxc[EndpointKey.for_ip(p.ip)].sec_id == ident
        for node in lab.topology.nodes:
            assert ipcache(lab, node.name)[f"{p.ip}/32"] == ident


def test_identity_list_cli(lab):
    """`labkit identity list` prints cilium-dbg identity list's table: reserved 1-10 first, then a1's label set
    under 256, one label a line."""
    proc = cli(lab, "identity", "list")
    assert proc.returncode == 0, proc.stderr
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    # tabwriter.NewWriter(os.Stdout, 2, 0, 3, ' ', 0): the ID column is its widest cell plus 3 spaces
    width = max(len(line.split()[0]) for line in lines if not line.startswith(" ")) + 3
    col = lambda left, right: left.ljust(width) + right  # noqa: E731
    assert lines[:3] == [col("ID", "LABELS"), col("1", "reserved:host"), col("2", "reserved:world")]
    i = lines.index(col("256", "k8s:app=a1"))
    assert lines[i + 1:i + 5] == [col("", "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default"),
                                  col("", "k8s:io.cilium.k8s.policy.cluster=default"),
                                  col("", "k8s:io.cilium.k8s.policy.serviceaccount=default"),
                                  col("", "k8s:io.kubernetes.pod.namespace=default")]
    assert [line.split()[0] for line in lines[1:] if not line.startswith(" ")][:14] == \
        [str(i) for i in range(1, 11)] + ["256", "257", "258", "259"]


# -- apply, change, delete -----------------------------------------------------------------------
def test_apply_pins_exactly_the_resolved_map(lab):
    """After apply, a1's pinned cilium_policy_<id> (an LPM trie: key 12 B, value 24 B, 16384 entries,
    BPF_F_NO_PREALLOC) holds exactly EndpointPolicy.entries(), which are Cilium's keys for the policy;
    pods no policy selects have no map (allow-all)."""
    lab.policy.apply(WEB)
    assert pinned(lab, "a1") == WEB_A1 == resolved_entries(lab, WEB, "a1")
    show = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "pinned", map_path(lab, "a1")],
                                     capture_output=True, text=True, check=True).stdout)
    assert (show["type"], show["bytes_key"], show["bytes_value"], show["max_entries"], show["flags"]) == \
        ("lpm_trie", 12, 24, 16384, 1)
    for pod in ("a2", "b1", "b2"):
        assert not os.path.lexists(map_path(lab, pod))


def test_change_writes_only_the_difference(lab):
    """Re-applying with another port replaces the one key; the kept keys are not rewritten, so the counters
    the datapath added to them stay."""
    lab.policy.apply(WEB)
    host = _key(1, IN)
    with PinnedMap(map_path(lab, "a1"), PolicyKey, PolicyEntry) as m:
        counted = PolicyEntry.allow(host)
        counted.packets, counted.bytes = 5, 300
        m[host] = counted
    report = lab.policy.apply(WEB.replace('"8080"', '"9090"'))
    assert report["endpoints"]["a1"] == {"created": 0, "added": 1, "changed": 0, "deleted": 1}
    got = pinned(lab, "a1")
    assert set(got) == {host, _key(IDS["b1"], IN, TCP, 9090), _key(0, EG)}
    assert (got[host].packets, got[host].bytes) == (5, 300)


def test_delete_unpins_the_map(lab):
    """Deleting the only policy that selects a1 removes its map: no map is allow-all, as an unselected endpoint."""
    lab.policy.apply(WEB)
    lab.policy.delete("a1-from-b1")
    assert not os.path.lexists(map_path(lab, "a1"))
    assert lab.policy.list() == []


def test_reset_removes_every_policy(lab):
    """lab.reset() leaves no policy and no policy map."""
    lab.policy.apply(WEB)
    lab.reset()
    assert lab.policy.list() == [] and not os.path.lexists(map_path(lab, "a1"))


def test_cidr_policy_puts_the_prefix_in_every_ipcache(lab):
    """toCIDR 198.51.100.100/32 gets the first CIDR identity (1<<24 | 1) in a1's egress key and in every
    node's ipcache; deleting the policy takes the ipcache entry away again."""
    lab.policy.apply(EXT)
    assert _key(FIRST_CIDR_IDENTITY, EG) in pinned(lab, "a1")
    for node in lab.topology.nodes:
        assert ipcache(lab, node.name)["198.51.100.100/32"] == FIRST_CIDR_IDENTITY
    lab.policy.delete("a1-to-ext")
    for node in lab.topology.nodes:
        assert "198.51.100.100/32" not in ipcache(lab, node.name)


# -- refusals -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, message", [
    ("apiVersion: cilium.io/v2\nkind: [", "expected YAML or JSON"),
    (WEB.replace("toPorts", "toPortz"), r"toPortz: unknown field"),
    (WEB.replace("app: b1", "app: nobody"), "selects no endpoint"),
    (EXT.replace("a1-to-ext", "a1-from-b1").replace("198.51.100.100/32", "198.51.100.300/32"), "expected a CIDR"),
])
def test_bad_policy_leaves_every_map_unchanged(lab, text, message):
    """Bad YAML, an unknown field, a selector that selects nothing, a bad CIDR: a PolicyError with the reason,
    and every policy map, pin and ipcache entry of every node byte-identical (the policy applied before stays)."""
    lab.policy.apply(WEB)
    before = every_policy_byte(lab)
    with pytest.raises(PolicyError, match=message):
        lab.policy.apply(text)
    assert every_policy_byte(lab) == before
    assert [p["name"] for p in lab.policy.list()] == ["a1-from-b1"]


def test_cli_apply_error_exit_status(lab, tmp_path):
    """`labkit policy apply` of a bad file exits 1 with the agent's PolicyError message on stderr."""
    f = tmp_path / "bad.yaml"
    f.write_text(WEB.replace("ingress:", "ingres:"))
    proc = cli(lab, "policy", "apply", str(f))
    assert proc.returncode == 1
    assert "spec.ingres: unknown field" in proc.stderr


def test_cli_apply_list_delete_round_trip(lab, tmp_path):
    """`policy apply FILE`, `policy list` (namespace, name, rules, selected pods), `policy delete FILE`: the
    file's policies come and go, and a1's map with them."""
    f = tmp_path / "web.yaml"
    f.write_text(WEB + "---\n" + EXT)
    proc = cli(lab, "policy", "apply", str(f))
    assert proc.returncode == 0, proc.stderr
    assert "applied default/a1-from-b1, default/a1-to-ext" in proc.stdout
    proc = cli(lab, "policy", "list")
    assert [line.split() for line in proc.stdout.splitlines()] == [
        ["NAMESPACE", "NAME", "RULES", "SELECTS"], ["default", "a1-from-b1", "1", "a1"],
        ["default", "a1-to-ext", "1", "a1"]]
    assert set(pinned(lab, "a1")) == set(WEB_A1) - {_key(0, EG)} | {_key(FIRST_CIDR_IDENTITY, EG)}
    proc = cli(lab, "policy", "delete", str(f))
    assert proc.returncode == 0, proc.stderr
    assert lab.policy.list() == [] and not os.path.lexists(map_path(lab, "a1"))


# -- restore ----------------------------------------------------------------------------------------
def test_agent_restart_restores_policies_and_maps(lab):
    """A new agent reads policies.json back and rewrites a1's map where it differs: a key deleted behind its
    back returns, a stray key goes."""
    lab.policy.apply(WEB)
    stray = _key(IDS["b2"], IN)
    with PinnedMap(map_path(lab, "a1"), PolicyKey, PolicyEntry) as m:
        m.delete(_key(1, IN))
        m[stray] = PolicyEntry.allow(stray)
    lab.restart_agent()
    assert [p["name"] for p in lab.policy.list()] == ["a1-from-b1"]
    assert pinned(lab, "a1") == WEB_A1
    assert lab.agent_status()["policy_restored"]["endpoints"] == 1


# -- the outer map -----------------------------------------------------------------------------------
@pytest.fixture
def outer_map(lab):
    """``labkit_policy`` on node-a: the datapath's when it has one, else one made here (a hash of maps whose
    inner template is the policy map's shape) and unpinned afterwards."""
    path = f"{lab.pin_dir('node-a')}/labkit_policy"
    if os.path.lexists(path):
        yield path
        return
    inner = bpf.map_create(bpf.BPF_MAP_TYPE_LPM_TRIE, 12, 24, 16384, "policy_tmpl", flags=bpf.BPF_F_NO_PREALLOC)
    try:
        fd = bpf.map_create(bpf.BPF_MAP_TYPE_HASH_OF_MAPS, 4, 4, 1024, "labkit_policy", inner_map_fd=inner)
    finally:
        os.close(inner)
    try:
        bpf.obj_pin(fd, path)
    finally:
        os.close(fd)
    try:
        yield path
    finally:
        os.unlink(path)


def test_outer_map_points_at_the_endpoints_map(lab, outer_map):
    """With labkit_policy present, apply puts endpoint id → a1's pinned map in it (a lookup answers the inner
    map's kernel id), and delete takes the entry out."""
    lab.policy.apply(WEB)
    fd = bpf.obj_get(map_path(lab, "a1"))
    try:
        inner_id = bpf.map_info(fd).id
    finally:
        os.close(fd)
    with PinnedMap(outer_map, ctypes.c_uint32, ctypes.c_uint32) as outer:
        assert outer[ctypes.c_uint32(ep_id(lab, "a1"))].value == inner_id
    lab.policy.delete("a1-from-b1")
    with PinnedMap(outer_map, ctypes.c_uint32, ctypes.c_uint32) as outer:
        assert outer.get(ctypes.c_uint32(ep_id(lab, "a1"))) is None


# -- the CLI's view of a map ---------------------------------------------------------------------------
def test_policy_get_cli_prints_bpf_policy_get(lab):
    """`labkit policy get a1` prints the bpftool command for the pinned map, then cilium-dbg bpf policy get's
    table (bpf_policy_get.go formatMap: allows ingress before egress, by identity; labels one a line)."""
    lab.policy.apply(WEB)
    proc = cli(lab, "policy", "get", "a1")
    assert proc.returncode == 0, proc.stderr
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    pad = " " * 21
    assert lines == [
        f"# bpftool map dump pinned {map_path(lab, 'a1')}",
        "POLICY   DIRECTION   LABELS (source:key[=value])" + " " * 46
        + "PORT/PROTO   PROXY PORT   AUTH TYPE   BYTES   PACKETS   PREFIX",
        "Allow    Ingress     reserved:host" + " " * 60 + "ANY          NONE         disabled    0       0         0",
        "Allow    Ingress     k8s:app=b1" + " " * 63 + "8080/TCP     NONE         disabled    0       0         24",
        pad + "k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default",
        pad + "k8s:io.cilium.k8s.policy.cluster=default",
        pad + "k8s:io.cilium.k8s.policy.serviceaccount=default",
        pad + "k8s:io.kubernetes.pod.namespace=default",
        "Allow    Egress      reserved:unknown" + " " * 57 + "ANY          NONE         disabled    0       0         0",
    ]


def test_policy_get_cli_numeric_and_unselected(lab):
    """`policy get a1 -n` prints identities as numbers; a pod without a map is said to be allowed everything."""
    lab.policy.apply(WEB)
    proc = cli(lab, "policy", "get", "a1", "-n")
    rows = [line.split()[:4] for line in proc.stdout.splitlines()[2:]]
    assert rows == [["Allow", "Ingress", "1", "ANY"], ["Allow", "Ingress", "258", "8080/TCP"],
                    ["Allow", "Egress", "0", "ANY"]]
    proc = cli(lab, "policy", "get", "a2")
    assert proc.returncode == 0 and "no policy enforces on it" in proc.stdout


# -- shared labels, a deleted pod -----------------------------------------------------------------------
def test_equal_labels_share_identity_and_a_deleted_pod_loses_its_map(_require_datapath):
    """On a lab whose a2 carries a1's labels, both have one identity in cilium_lxc and the ipcache, one policy
    selects both (two maps), and deleting a2 removes its map."""
    from labkit import Lab

    name = tagged("polsh")
    topo = Topology.build(name, {"node-a": ["a1", "a2"], "node-b": ["b1"]}, labels={"a2": {"app": "a1"}})
    lab = Lab.up(name, topology=topo, config=enforcing_config())
    try:
        assert {p.name: p.identity for p in lab.topology.pods} == {"a1": 256, "a2": 256, "b1": 257}
        for pod in ("a1", "a2"):
            p = lab.topology.pod(pod)
            with PinnedMap(f"{lab.pin_dir('node-a')}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
                assert lxc[EndpointKey.for_ip(p.ip)].sec_id == 256
            assert ipcache(lab, "node-b")[f"{p.ip}/32"] == 256
        report = lab.policy.apply(WEB.replace("app: b1", "app: b1"))
        assert sorted(report["endpoints"]) == ["a1", "a2"]
        a2_map = map_path(lab, "a2")
        assert os.path.lexists(a2_map)
        lab.delete_pod("a2")
        assert not os.path.lexists(a2_map)
        assert [p["selects"] for p in lab.policy.list()] == [["a1"]]
    finally:
        lab.down()


_CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()
    print("connected")
except OSError as exc:
    print("failed", type(exc).__name__)
"""

L4_DENY = """apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b1-ports}
spec:
  endpointSelector: {matchLabels: {app: b1}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a1}}]
    toPorts: [{ports: [{port: "8080", endPort: 8083, protocol: TCP}]}]
  ingressDeny:
  - fromEntities: [all]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
"""


def test_l4_deny_beats_a_narrower_identitys_port_range_on_the_kernel(lab):
    """A deny of 8080/TCP from every identity beside an allow of a1 on 8080-8083: b1's pinned map holds the
    deny `a1 8080/TCP` Cilium adds (pkg/policy/mapstate.go:897-911@82999990), so a1's SYN to 8080 is dropped
    by policy at b1 while one to 8081 reaches b1 (nobody listens: refused, not dropped)."""
    lab.policy.apply(L4_DENY)
    got = pinned(lab, "b1")
    assert got[_key(IDS["a1"], IN, TCP, 8080)].is_deny and got[_key(0, IN, TCP, 8080)].is_deny
    assert {bytes(k): bytes(v) for k, v in got.items()} == \
        {bytes(k): bytes(v) for k, v in resolved_entries(lab, L4_DENY, "b1").items()}
    b1 = lab.pod("b1").ip

    def connect(port):
        return lab.exec("a1", [sys.executable, "-c", _CONNECT, b1, str(port)], timeout=30).stdout.strip()

    log = lab.events()
    assert connect(8080).startswith("failed Timeout")
    drop = next(f for f in log.read() if f.dropped and f.node == "node-b")
    assert drop.policy.text() == "policy-verdict:L3-L4 INGRESS DENIED"
    assert connect(8081) == "failed ConnectionRefusedError"


def test_to_entities_world_pins_three_rows(lab):
    """`toEntities: [world]` on a1's egress pins world (2), world-ipv4 (9) and world-ipv6 (10) in a1's map: the
    three selectors of pkg/policy/api/entity.go:94@82999990 (plus any CIDR identity the agent holds: each carries
    reserved:world in a single-stack cluster, pkg/labels/cidr.go:101-110@82999990)."""
    lab.policy.apply(EXT.replace("toCIDR: [198.51.100.100/32]", "toEntities: [world]"))
    ids = {k.sec_label for k in pinned(lab, "a1") if k.egress}
    assert {i for i in ids if i < FIRST_CIDR_IDENTITY} == {2, 9, 10}
