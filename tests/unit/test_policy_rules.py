"""labkit.policy.rules: CiliumNetworkPolicy YAML/JSON as users write it, and errors naming the field path."""
from __future__ import annotations

import json

import pytest

from labkit.errors import PolicyError
from labkit.policy.identity import LabelSet, pod_labels
from labkit.policy.rules import CidrRule, FqdnSelector, PortProto, Selector, parse_policies

HEAD = "apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\nmetadata: {name: p}\n"


def one(spec_yaml: str):
    return parse_policies(HEAD + spec_yaml)[0]


def test_full_policy_parses():
    """Every field the brief lists lands in the typed rule (pkg/policy/api rule.go, ingress.go, egress.go, l4.go, cidr.go, fqdn.go)."""
    pol = one("""
spec:
  endpointSelector:
    matchLabels: {app: web}
    matchExpressions: [{key: tier, operator: In, values: [front, back]}]
  ingress:
  - fromEndpoints: [{matchLabels: {app: client}}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}, {port: 9000, endPort: 9010, protocol: UDP}]}]
  - fromEntities: [world, host]
  ingressDeny:
  - fromCIDR: [203.0.113.0/24]
  egress:
  - toCIDRSet: [{cidr: 198.51.100.0/24, except: [198.51.100.128/25]}]
  - toFQDNs: [{matchName: api.example.test}, {matchPattern: "*.example.test"}]
    toPorts: [{ports: [{port: "443"}]}]
  egressDeny:
  - toEntities: [world]
""")
    r = pol.rules[0]
    assert (pol.name, pol.namespace) == ("p", "default")
    assert r.has_ingress and r.has_egress
    assert r.ingress[0].ports == (PortProto(8080, 0, "TCP"), PortProto(9000, 9010, "UDP"))
    assert r.ingress[1].entities == ("world", "host") and r.ingress[1].ports == ()
    assert r.ingress[2].deny and r.ingress[2].cidrs == (CidrRule("203.0.113.0/24"),)
    assert r.egress[0].cidrs == (CidrRule("198.51.100.0/24", ("198.51.100.128/25",)),)
    assert r.egress[1].fqdns == (FqdnSelector(match_name="api.example.test"), FqdnSelector(match_pattern="*.example.test"))
    assert r.egress[1].ports == (PortProto(443, 0, "ANY"),)
    assert r.egress[2].deny and r.egress[2].entities == ("world",)


def test_namespace_added_to_selectors():
    """A CNP's selectors without a namespace select only its own namespace's pods (k8s:io.kubernetes.pod.namespace)."""
    pol = parse_policies(HEAD.replace("{name: p}", "{name: p, namespace: shop}") + """
spec:
  endpointSelector: {}
  ingress: [{fromEndpoints: [{}, {matchLabels: {"k8s:io.kubernetes.pod.namespace": other}}]}]
""")[0]
    r = pol.rules[0]
    assert r.endpoint_selector.matches(pod_labels({"app": "x"}, namespace="shop"))
    assert not r.endpoint_selector.matches(pod_labels({"app": "x"}, namespace="default"))
    assert str(r.ingress[0].endpoints[0]) == "k8s:io.kubernetes.pod.namespace=shop"
    assert str(r.ingress[0].endpoints[1]) == "k8s:io.kubernetes.pod.namespace=other"


@pytest.mark.parametrize("expr,labels,want", [
    ({"key": "app", "operator": "In", "values": ["a", "b"]}, ["k8s:app=b"], True),
    ({"key": "app", "operator": "NotIn", "values": ["a"]}, ["k8s:app=a"], False),
    ({"key": "app", "operator": "NotIn", "values": ["a"]}, [], True),
    ({"key": "app", "operator": "Exists"}, ["k8s:app=z"], True),
    ({"key": "k8s:app", "operator": "DoesNotExist"}, ["k8s:app=z"], False),
])
def test_match_expressions(expr, labels, want):
    """matchExpressions operators In, NotIn, Exists, DoesNotExist as Kubernetes label selectors define them."""
    assert Selector.make({"matchExpressions": [expr]}).matches(LabelSet.parse(labels)) is want


def test_source_prefixed_key_matches_only_that_source():
    """A key `k8s:app` matches only k8s labels; a bare key matches any source (Cilium's any:)."""
    assert not Selector.make({"matchLabels": {"container:app": "web"}}).matches(LabelSet.parse(["k8s:app=web"]))
    assert Selector.make({"matchLabels": {"app": "web"}}).matches(LabelSet.parse(["container:app=web"]))


def test_specs_list_and_json():
    """`specs` holds several rules; a JSON text parses like YAML."""
    obj = {"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": {"name": "j"},
           "specs": [{"endpointSelector": {}, "egress": [{"toEntities": ["all"]}]},
                     {"endpointSelector": {"matchLabels": {"a": "b"}}, "ingress": [{}]}]}
    pol = parse_policies(json.dumps(obj))[0]
    assert len(pol.rules) == 2 and pol.rules[1].path == "specs[1]" and not pol.rules[1].ingress[0].l3_given


def test_several_documents():
    """A YAML stream with several policies gives them all, in order."""
    text = HEAD + "spec: {endpointSelector: {}}\n---\n" + HEAD.replace("{name: p}", "{name: q}") + "spec: {endpointSelector: {}}\n"
    assert [p.name for p in parse_policies(text)] == ["p", "q"]


@pytest.mark.parametrize("spec,message", [
    ("spec:\n  endpointSelector: {}\n  ingress:\n  - toPorts: [{ports: [{port: http}]}]\n",
     "spec.ingress[0].toPorts[0].ports[0].port: expected a port number 1-65535 (0 for every port), got 'http'"),
    ("spec:\n  endpointSelector: {}\n  ingress:\n  - toPorts: [{ports: [{port: '70000'}]}]\n",
     "spec.ingress[0].toPorts[0].ports[0].port: expected a port number 1-65535 (0 for every port), got '70000'"),
    ("spec:\n  endpointSelector: {}\n  ingress: [{fromEndpoint: []}]\n",
     "spec.ingress[0].fromEndpoint: unknown field"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toPorts: [{ports: [{port: '53', protocol: DNS}]}]}]\n",
     "spec.egress[0].toPorts[0].ports[0].protocol: expected one of TCP, UDP, SCTP, ICMP, ICMPv6, ANY, got 'DNS'"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toEntities: [internet]}]\n",
     "spec.egress[0].toEntities[0]: expected one of all, world"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toCIDR: [198.51.100.0/33]}]\n",
     "spec.egress[0].toCIDR[0]: expected a CIDR such as 198.51.100.0/24, got '198.51.100.0/33'"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toCIDRSet: [{cidr: 198.51.100.0/24, except: [203.0.113.0/25]}]}]\n",
     "spec.egress[0].toCIDRSet[0].except[0]: expected a prefix inside 198.51.100.0/24, got 203.0.113.0/25"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toFQDNs: [{matchName: a.test, matchPattern: '*.test'}]}]\n",
     "spec.egress[0].toFQDNs[0]: expected exactly one of matchName, matchPattern"),
    ("spec:\n  endpointSelector: {}\n  egressDeny: [{toFQDNs: [{matchName: a.test}]}]\n",
     "spec.egressDeny[0].toFQDNs: unknown field"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toServices: []}]\n",
     "spec.egress[0].toServices: Cilium accepts this field but labkit does not implement it"),
    ("spec:\n  endpointSelector: {matchLabels: [app]}\n",
     "spec.endpointSelector.matchLabels: expected a mapping of label keys to values, got a list ['app']"),
    ("spec:\n  endpointSelector: {matchExpressions: [{key: a, operator: Has}]}\n",
     "spec.endpointSelector.matchExpressions[0].operator: expected one of In, NotIn, Exists, DoesNotExist, got 'Has'"),
    ("spec:\n  ingress: []\n", "spec.endpointSelector: expected a selector, got nothing"),
    ("spec:\n  endpointSelector: {}\n  ingress: {fromEntities: [world]}\n", "spec.ingress: expected a list, got a mapping"),
])
def test_errors_name_the_field_path(spec, message):
    """Wrong types, unknown fields and bad values raise PolicyError naming the field path, expected vs got."""
    with pytest.raises(PolicyError) as exc:
        one(spec)
    assert message in str(exc.value)
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("text,message", [
    ("a: [1, 2\n", "expected YAML or JSON, got a parse error"),
    ("", "expected at least one CiliumNetworkPolicy"),
    ("apiVersion: cilium.io/v2\nkind: NetworkPolicy\nmetadata: {name: x}\nspec: {endpointSelector: {}}\n",
     "kind: expected 'CiliumNetworkPolicy', got 'NetworkPolicy'"),
    (HEAD + "spec: {endpointSelector: {}}\nstatus: {}\n", "status: unknown field"),
    (HEAD + "spec: {endpointSelector: {}}\nspecs: []\n", "spec: expected exactly one of spec, specs, got both"),
    (HEAD + "spec: {endpointSelector: {}}\n---\n" + HEAD + "spec: {endpointSelector: {}}\n", "expected distinct policy names, got p"),
])
def test_document_errors(text, message):
    """Bad YAML, a wrong kind, unknown top-level fields and duplicate names are PolicyErrors."""
    with pytest.raises(PolicyError, match=None) as exc:
        parse_policies(text, source="p.yaml")
    assert message in str(exc.value)


def test_dns_rules_on_an_egress_port():
    """toPorts rules.dns is read into each port of its item; items without rules have dns None."""
    pol = one("spec:\n  endpointSelector: {}\n  egress:\n  - toPorts:\n"
              "    - ports: [{port: '53', protocol: UDP}, {port: '53', protocol: TCP}]\n"
              "      rules: {dns: [{matchPattern: '*.lab.example'}, {matchName: web.lab.example}]}\n"
              "    - ports: [{port: '8080', protocol: TCP}]\n")
    ports = pol.rules[0].egress[0].ports
    want = (FqdnSelector("", "*.lab.example"), FqdnSelector("web.lab.example", ""))
    assert [p.dns for p in ports] == [want, want, None]


@pytest.mark.parametrize("spec, message", [
    ("spec:\n  endpointSelector: {}\n  ingress: [{toPorts: [{ports: [{port: '53'}], rules: {dns: []}}]}]\n",
     "spec.ingress[0].toPorts[0].rules: Cilium accepts this field but labkit does not implement it"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toPorts: [{ports: [{port: '80'}], rules: {http: [{}]}}]}]\n",
     "spec.egress[0].toPorts[0].rules.http: Cilium accepts this field but labkit does not implement it"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toPorts: [{ports: [{port: '53'}], rules: {}}]}]\n",
     "spec.egress[0].toPorts[0].rules.dns: expected a list of {matchName | matchPattern}, got nothing"),
    ("spec:\n  endpointSelector: {}\n  egress: [{toPorts: [{ports: [{port: '53'}], rules: {dns: [{matchName: '*.x'}]}}]}]\n",
     "spec.egress[0].toPorts[0].rules.dns[0].matchName: expected a name without '*' (use matchPattern)"),
])
def test_dns_rule_errors(spec, message):
    """DNS rules only on egress allow rules, only `dns` of the L7 kinds, each item one matchName or matchPattern."""
    with pytest.raises(PolicyError) as exc:
        one(spec)
    assert message in str(exc.value)
