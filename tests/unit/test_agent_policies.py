"""labkit.agent.policies without a kernel: map names, the entry delta, CIDR prefixes for the ipcache, and the
repository (apply, replace, delete, restore) checked whole before any map would be written."""
from __future__ import annotations

import json

import pytest
import yaml

from labkit.agent import policies as P
from labkit.agent.identities import IdentityStore, assign
from labkit.errors import NotFoundError, PolicyError
from labkit.maps.policy import Direction, PolicyEntry, PolicyKey
from labkit.net import ledger
from labkit.net.topology import Topology
from labkit.policy.identity import IdentityAllocator
from labkit.policy.rules import parse_policies

IN, EG = Direction.INGRESS, Direction.EGRESS

WEB = """apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a1-from-b1}
spec:
  endpointSelector: {matchLabels: {app: a1}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: b1}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
"""


def _obj(text: str) -> dict:
    return yaml.safe_load(text)


# -- pure parts ------------------------------------------------------------------------------
@pytest.mark.parametrize("ep_id, name", [(1, "cilium_policy_00001"), (4095, "cilium_policy_04095"),
                                         (65535, "cilium_policy_65535")])
def test_policy_map_name_is_ciliums(ep_id, name):
    """pkg/endpoint/bpf.go policyMapPath = bpf.LocalMapPath(policymap.MapName, e.ID); pkg/bpf LocalMapName
    formats "%s%05d" after MapName "cilium_policy_"."""
    assert P.policy_map_name(ep_id) == name


def test_entry_delta_adds_changes_and_deletes():
    """Keys only wanted are added, keys whose decided bytes differ are changed, keys no longer wanted deleted."""
    keep, change, gone, new = (PolicyKey.make(i, IN) for i in (1, 256, 257, 258))
    have = {bytes(keep): bytes(PolicyEntry.allow(keep)), bytes(change): bytes(PolicyEntry.allow(change)),
            bytes(gone): bytes(PolicyEntry.allow(gone))}
    want = {keep: PolicyEntry.allow(keep), change: PolicyEntry.deny(change), new: PolicyEntry.allow(new)}
    writes, deletes = P.entry_delta(have, want)
    assert sorted((str(k), kind) for k, _, kind in writes) == [("Ingress: 256 ANY", "changed"),
                                                               ("Ingress: 258 ANY", "added")]
    assert deletes == [gone]


def test_entry_delta_ignores_the_datapaths_counters():
    """A kept key whose entry differs only in packets/bytes (what the datapath counts) is not written again."""
    k = PolicyKey.make(256, IN, 6, 8080)
    counted = PolicyEntry.allow(k)
    counted.packets, counted.bytes = 7, 420
    assert P.entry_delta({bytes(k): bytes(counted)}, {k: PolicyEntry.allow(k)}) == ([], [])


def test_cidr_prefixes_skip_default_route_and_own_addresses():
    """CIDR and except prefixes get CIDR identities (local scope from 1<<24|1); 0.0.0.0/0 and the lab's own
    /32s get no ipcache entry of their own."""
    pols = parse_policies("""apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: out}
spec:
  endpointSelector: {}
  egress:
  - toCIDR: [198.18.2.11/32, 0.0.0.0/0, 198.51.100.100/32]
  - toCIDRSet: [{cidr: 203.0.113.0/24, except: [203.0.113.128/25]}]
""")
    got = P.cidr_prefixes(pols, IdentityAllocator(), own=["198.18.2.11/32"])
    assert got == {"198.51.100.100/32": 16777217, "203.0.113.0/24": 16777218, "203.0.113.128/25": 16777219}


def test_enforcement_defaults_to_ciliums():
    """A datapath config without policy options enforces as Cilium's --policy-enforcement=default, no audit;
    one with them is taken at its word."""
    class Without:
        routing = "tunnel"

    class With:
        policy, policy_audit = "always", True

    assert P.enforcement_of(Without()) == ("default", False)
    assert P.enforcement_of(With()) == ("always", True)


@pytest.mark.parametrize("spec, a1_filter", [
    ("ingress: [{fromEndpoints: [{matchLabels: {app: b1}}]}]", 0x1),
    ("egress: [{toEndpoints: [{matchLabels: {app: b1}}]}]", 0x2),
    ("ingress: [{fromEndpoints: [{}]}]\n  egress: [{toEndpoints: [{}]}]", 0x3),
])
def test_verdict_log_filter_is_the_enforced_directions(spec, a1_filter):
    """pkg/endpoint/bpf.go:1538-1547@82999990 GetPolicyVerdictLogFilter: 0x1 when ingress is enforced, 0x2 when
    egress is, from the endpoint's resolved policy; an endpoint no policy selects enforces nothing (0)."""
    from labkit.policy.identity import pod_labels
    from labkit.policy.resolve import Endpoint, resolve

    text = f"""apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {{name: p}}
spec:
  endpointSelector: {{matchLabels: {{app: a1}}}}
  {spec}
"""
    eps = [Endpoint(n, pod_labels({"app": n}), ident, ip)
           for n, ident, ip in (("a1", 256, "198.18.1.11"), ("b1", 257, "198.18.2.11"))]
    res = resolve(eps, parse_policies(text), IdentityAllocator())
    assert P.verdict_log_filter(res.endpoints["a1"]) == a1_filter
    assert P.verdict_log_filter(res.endpoints["b1"]) == 0


def test_enforcement_mode_must_be_known():
    """A policy mode outside default/always/never is a PolicyError naming the modes."""
    class Config:
        policy = "sometimes"

    with pytest.raises(PolicyError, match="expected one of default, always, never, got 'sometimes'"):
        P.enforcement_of(Config())


# -- the repository, its map writes captured -----------------------------------------------------
class Config:
    """A datapath config whose policy mode is Cilium's default."""

    policy, policy_audit = "default", False


class View:
    """What Policies reads of the agent's view: name, topology (identities assigned), config, pin dirs."""

    def __init__(self, name="x", config=None):
        self.name = name
        self.topology = assign(Topology.default(name))[0]
        self.config = config or Config()
        self.pin_dirs = {"node-a": "/nonexistent/node-a", "node-b": "/nonexistent/node-b"}

    def pin_dir(self, node):
        return self.pin_dirs[node]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A Policies of lab 'x' whose endpoint ids are a1..b2 = 1..4 and whose map writes are recorded, not done."""
    monkeypatch.setattr(ledger, "RUN_DIR", tmp_path)
    (tmp_path / "x").mkdir()
    view = View()
    IdentityStore("x").save(assign(view.topology)[1])
    ids = {p.ip: i for i, p in enumerate(view.topology.pods, start=1)}
    monkeypatch.setattr(P, "_pod_endpoint_ids", lambda pin_dirs: ids)
    writes = []

    def record(self, res, ipcache):
        writes.append(({n: ep for n, ep in res.endpoints.items() if ep.ingress_enforced or ep.egress_enforced},
                       dict(ipcache)))
        return {"endpoints": {}, "removed": [], "ipcache": {"added": [], "deleted": []}}

    monkeypatch.setattr(P.Policies, "_write", record)
    pols = P.Policies(view)
    pols.writes = writes
    return pols


def test_apply_resolves_and_persists(repo, tmp_path):
    """An applied policy enforces a1's ingress with Cilium's keys (host allowed, b1=258 on 8080/TCP, egress
    allow-all) and lands in policies.json as written."""
    report = repo.apply(WEB, "web.yaml")
    assert report["applied"] == ["default/a1-from-b1"] and report["replaced"] == []
    enforced, _ = repo.writes[-1]
    assert list(enforced) == ["a1"]
    assert [str(k) for k in enforced["a1"].keys()] == ["Ingress: 1 ANY", "Ingress: 258 8080/TCP", "Egress: 0 ANY"]
    saved = json.loads((tmp_path / "x" / P.POLICIES_FILE).read_text())
    assert [p["metadata"]["name"] for p in saved["policies"]] == ["a1-from-b1"]


def test_same_name_replaces(repo):
    """Applying a policy of the same namespace and name replaces it (kubectl apply), it is not added twice."""
    repo.apply(WEB)
    report = repo.apply(WEB.replace('"8080"', '"9090"'))
    assert report["replaced"] == ["default/a1-from-b1"] and len(repo.objects) == 1
    assert "Ingress: 258 9090/TCP" in [str(k) for k in repo.writes[-1][0]["a1"].keys()]


@pytest.mark.parametrize("text, message", [
    ("kind: [", "expected YAML or JSON"),
    (WEB.replace("ingress:", "ingres:"), "spec.ingres: unknown field"),
    (WEB.replace("app: b1", "app: nosuch"), "selects no endpoint"),
    (WEB.replace("app: a1", "app: nosuch"), "endpointSelector .* selects no endpoint"),
])
def test_bad_policy_writes_nothing(repo, text, message):
    """Malformed YAML, an unknown field or a selector that selects nothing is a PolicyError; no map write is
    attempted and the repository and its file are as before."""
    repo.apply(WEB)
    before, file_before = list(repo.objects), repo.store.path.read_text()
    n = len(repo.writes)
    with pytest.raises(PolicyError, match=message):
        repo.apply(text)
    assert (len(repo.writes), repo.objects, repo.store.path.read_text()) == (n, before, file_before)


def test_empty_selector_of_an_older_policy_does_not_block(repo):
    """Only the policies being applied must select something: a new policy is not refused for an older one."""
    repo.objects = [_obj(WEB.replace("app: b1", "app: gone"))]
    repo.apply(WEB.replace("a1-from-b1", "other"))
    assert [p["metadata"]["name"] for p in repo.objects] == ["a1-from-b1", "other"]


def test_delete_and_unknown_name(repo):
    """Deleting a policy leaves no endpoint enforced; an unknown name is a NotFoundError listing the policies."""
    repo.apply(WEB)
    repo.delete("a1-from-b1")
    assert repo.writes[-1][0] == {} and repo.objects == []
    with pytest.raises(NotFoundError, match=r"policy 'default/nope' not found .*\(policies: none\)"):
        repo.delete("nope")


def test_duplicate_names_in_one_list_are_refused(repo):
    """Two objects with one namespace/name in one apply are a PolicyError."""
    obj = _obj(WEB)
    with pytest.raises(PolicyError, match="default/a1-from-b1 more than once"):
        repo.apply([obj, obj])


def test_a_new_repository_restores_from_its_file(repo):
    """A new Policies (a restarted agent) reads the applied policies back and sync() writes the same maps."""
    repo.apply(WEB)
    again = P.Policies(repo.view)
    assert again.objects == repo.objects
    again.sync()
    assert [str(k) for k in repo.writes[-1][0]["a1"].keys()] == ["Ingress: 1 ANY", "Ingress: 258 8080/TCP",
                                                                  "Egress: 0 ANY"]


def test_cidr_identities_are_saved_with_the_change(repo):
    """A toCIDR policy's prefix gets a CIDR identity that is saved in identities.json and put in the ipcache."""
    repo.apply(WEB.replace("fromEndpoints: [{matchLabels: {app: b1}}]", "fromCIDR: [198.51.100.100/32]"))
    assert repo.writes[-1][1] == {"198.51.100.100/32": 16777217}
    assert IdentityStore("x").load().cidr_of(16777217) is not None


def test_always_mode_enforces_every_endpoint(repo):
    """--policy-enforcement=always (computePolicyEnforcementAndRules): every endpoint enforced, no policy needed."""
    repo.mode = "always"
    repo.sync()
    assert sorted(repo.writes[-1][0]) == ["a1", "a2", "b1", "b2"]


def test_never_mode_enforces_nothing(repo):
    """--policy-enforcement=never: even a selected endpoint is not enforced (no map: allow-all), and the report
    says how to get a lab that enforces."""
    repo.mode = "never"
    report = repo.apply(WEB)
    assert repo.writes[-1][0] == {}
    assert "up --policy-mode default" in report["warnings"][-1]


def test_glob_fault_lets_star_cross_dots():
    """The dns-star-crosses-dots fault's matching crosses dots where v1.16's never does (pkg/fqdn/matchpattern
    ToAnchoredRegexp: '*' is [-a-zA-Z0-9_]*); both keep the pattern's own dot, so the zone's name stays out."""
    from labkit.policy.resolve import fqdn_selects
    from labkit.policy.rules import FqdnSelector

    sel = FqdnSelector(match_pattern="*.lab.example")
    assert P._glob_selects(sel, "deep.web.lab.example.") and not fqdn_selects(sel, "deep.web.lab.example.")
    assert P._glob_selects(sel, "web.lab.example.") and fqdn_selects(sel, "web.lab.example.")
    assert not P._glob_selects(sel, "lab.example.") and not fqdn_selects(sel, "lab.example.")
    assert P._glob_selects(FqdnSelector(match_name="web.lab.example"), "web.lab.example.")
