"""CiliumNetworkPolicy as users write it (``cilium.io/v2``), parsed into typed rules.

What labkit reads: ``metadata.name``/``namespace``, ``spec`` or ``specs``, each with
``endpointSelector`` (matchLabels, matchExpressions), ``ingress``/``ingressDeny``
(fromEndpoints, fromCIDR, fromCIDRSet, fromEntities, toPorts) and ``egress``/``egressDeny``
(toEndpoints, toCIDR, toCIDRSet, toEntities, toFQDNs, toPorts), ``enableDefaultDeny``,
``description``, ``labels``, and of L7 ``rules`` only ``dns`` (an egress ``toPorts`` item whose
``rules.dns`` lists matchName/matchPattern items: the DNS proxy's allow list, and the reason the
port's key carries the proxy port). Fields Cilium knows but labkit does not implement (other L7 ``rules``,
``toServices``, ``fromRequires``, ``icmps``, …) and fields nobody knows are errors naming the
field path, as Cilium's CRD validation rejects unknown fields.

A CiliumNetworkPolicy is namespaced: its ``endpointSelector`` and every ``fromEndpoints``/
``toEndpoints`` selector that names no namespace select only pods of the policy's namespace
(Cilium adds ``k8s:io.kubernetes.pod.namespace=<ns>``).

    >>> pol = parse_policies('''
    ... apiVersion: cilium.io/v2
    ... kind: CiliumNetworkPolicy
    ... metadata: {name: web-from-client}
    ... spec:
    ...   endpointSelector: {matchLabels: {app: web}}
    ...   ingress:
    ...   - fromEndpoints: [{matchLabels: {app: client}}]
    ...     toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
    ... ''')[0]
    >>> rule = pol.rules[0]
    >>> str(rule.endpoint_selector)
    'any:app=web,k8s:io.kubernetes.pod.namespace=default'
    >>> rule.ingress[0].ports
    (PortProto(port=8080, end_port=0, protocol='TCP'),)
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import yaml

from labkit.errors import PolicyError
from labkit.policy.identity import Label, LabelSet
from labkit.policy.matchpattern import validate as validate_pattern

__all__ = [
    "Selector",
    "PortProto",
    "CidrRule",
    "FqdnSelector",
    "PeerRule",
    "Rule",
    "Policy",
    "ENTITIES",
    "parse_policies",
    "policy_from_obj",
]

NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
#: pkg/policy/api/entity.go (v1.16): the entity names.
ENTITIES = ("all", "world", "world-ipv4", "world-ipv6", "cluster", "host", "init", "ingress",
            "unmanaged", "remote-node", "health", "none", "kube-apiserver")
#: L4Proto values (pkg/policy/api/l4.go).
PROTOCOLS = ("TCP", "UDP", "SCTP", "ICMP", "ICMPV6", "ANY")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

#: Fields Cilium v1.16 accepts that labkit does not model: named so the error can say so.
_UNSUPPORTED = {
    "rule": ("nodeSelector",),
    "ingress": ("fromRequires", "fromGroups", "fromNodes", "icmps", "authentication"),
    "egress": ("toRequires", "toServices", "toGroups", "toNodes", "icmps", "authentication"),
    "port": ("originatingTLS", "terminatingTLS", "listener", "serverNames"),
}


def _where(path: str) -> str:
    return path or "policy"


def _type_name(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", int: "a number", bool: "a boolean",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _expect(v: Any, kind: type, path: str, what: str) -> Any:
    if kind is int and isinstance(v, bool):
        raise PolicyError(f"{_where(path)}: expected {what}, got {v!r}")
    if not isinstance(v, kind):
        raise PolicyError(f"{_where(path)}: expected {what}, got {_type_name(v)} {v!r}")
    return v


def _fields(obj: Mapping, path: str, known: Iterable[str], unsupported: Iterable[str] = ()) -> None:
    known, unsupported = set(known), set(unsupported)
    for k in obj:
        sub = f"{path}.{k}" if path else str(k)
        if k in unsupported:
            raise PolicyError(f"{sub}: Cilium accepts this field but labkit does not implement it "
                              f"(expected one of: {', '.join(sorted(known))})")
        if k not in known:
            raise PolicyError(f"{sub}: unknown field (expected one of: {', '.join(sorted(known))})")


@dataclass(frozen=True)
class Selector:
    """An endpoint selector: every matchLabels label and every expression must hold.

    Keys are ``[source:]key``; without a source any source matches (Cilium's ``any:``).

    >>> s = Selector.make({"matchLabels": {"app": "web"}})
    >>> s.matches(LabelSet.parse(["k8s:app=web"])), s.matches(LabelSet.parse(["k8s:app=db"]))
    (True, False)
    """

    match_labels: tuple[Label, ...] = ()
    match_expressions: tuple[tuple[Label, str, tuple[str, ...]], ...] = ()

    @staticmethod
    def _key(key: str) -> Label:
        source, sep, k = key.partition(":")
        return Label(source, k) if sep else Label("any", key)

    @classmethod
    def make(cls, obj: Any, path: str = "selector") -> "Selector":
        """From ``{matchLabels: {...}, matchExpressions: [...]}``; PolicyError naming ``path``."""
        _expect(obj, dict, path, "a selector mapping (matchLabels, matchExpressions)")
        _fields(obj, path, ("matchLabels", "matchExpressions"))
        labels = []
        ml = obj.get("matchLabels") or {}
        _expect(ml, dict, f"{path}.matchLabels", "a mapping of label keys to values")
        for k, v in ml.items():
            if not isinstance(v, str) and not isinstance(v, (int, float)) or isinstance(v, bool):
                raise PolicyError(f"{path}.matchLabels.{k}: expected a label value string, got {_type_name(v)} {v!r}")
            lbl = cls._key(str(k))
            labels.append(Label(lbl.source, lbl.key, str(v)))
        exprs = []
        me = obj.get("matchExpressions") or []
        _expect(me, list, f"{path}.matchExpressions", "a list of {key, operator, values}")
        for i, e in enumerate(me):
            p = f"{path}.matchExpressions[{i}]"
            _expect(e, dict, p, "a mapping {key, operator, values}")
            _fields(e, p, ("key", "operator", "values"))
            key = _expect(e.get("key"), str, f"{p}.key", "a label key")
            op = e.get("operator")
            if op not in _OPERATORS:
                raise PolicyError(f"{p}.operator: expected one of {', '.join(_OPERATORS)}, got {op!r}")
            values = e.get("values") or []
            _expect(values, list, f"{p}.values", "a list of strings")
            if op in ("In", "NotIn") and not values:
                raise PolicyError(f"{p}.values: expected at least one value for operator {op}, got none")
            if op in ("Exists", "DoesNotExist") and values:
                raise PolicyError(f"{p}.values: expected no values for operator {op}, got {values!r}")
            exprs.append((cls._key(key), op, tuple(str(v) for v in values)))
        return cls(tuple(sorted(labels)), tuple(exprs))

    def with_namespace(self, namespace: str) -> "Selector":
        """The selector restricted to ``namespace`` unless it already names a namespace."""
        if any(lbl.key == NAMESPACE_LABEL for lbl in self.match_labels) or any(
                lbl.key == NAMESPACE_LABEL for lbl, _, _ in self.match_expressions):
            return self
        return Selector(tuple(sorted(self.match_labels + (Label("k8s", NAMESPACE_LABEL, namespace),))),
                        self.match_expressions)

    @staticmethod
    def _value(labels: LabelSet, key: Label) -> str | None:
        return labels.get(key.source, key.key)

    def matches(self, labels: LabelSet) -> bool:
        """Whether a label set is selected."""
        for want in self.match_labels:
            if self._value(labels, want) != want.value:
                return False
        for key, op, values in self.match_expressions:
            have = self._value(labels, key)
            if op == "In" and have not in values:
                return False
            if op == "NotIn" and have is not None and have in values:
                return False
            if op == "Exists" and have is None:
                return False
            if op == "DoesNotExist" and have is not None:
                return False
        return True

    def __str__(self) -> str:
        parts = [str(lbl) for lbl in self.match_labels]
        parts += [f"{k.source}:{k.key} {op} ({','.join(v)})" if v else f"{k.source}:{k.key} {op}"
                  for k, op, v in self.match_expressions]
        return ",".join(parts) or "{}"


@dataclass(frozen=True)
class PortProto:
    """One ``ports`` item: port 0 is every port; end_port 0 is a single port. ``dns`` is the
    ``rules.dns`` list of the ``toPorts`` item it came from (None: no DNS rule), whose traffic
    the datapath redirects to the DNS proxy."""

    port: int
    end_port: int
    protocol: str
    dns: tuple["FqdnSelector", ...] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CidrRule:
    """A ``toCIDR`` entry or a ``toCIDRSet`` item with its ``except`` prefixes."""

    cidr: str
    except_: tuple[str, ...] = ()


@dataclass(frozen=True)
class FqdnSelector:
    """A ``toFQDNs`` item: exactly one of matchName, matchPattern."""

    match_name: str = ""
    match_pattern: str = ""


@dataclass(frozen=True)
class PeerRule:
    """One item of ``ingress``/``ingressDeny``/``egress``/``egressDeny``: whom (peers) and
    which ports. A field left out is None; an empty list selects nothing."""

    direction: str  #: "ingress" or "egress"
    deny: bool
    endpoints: tuple[Selector, ...] | None = None
    cidrs: tuple[CidrRule, ...] | None = None
    entities: tuple[str, ...] | None = None
    fqdns: tuple[FqdnSelector, ...] | None = None
    ports: tuple[PortProto, ...] = ()
    path: str = ""

    @property
    def l3_given(self) -> bool:
        """Whether any peer field was written (even as an empty list)."""
        return any(f is not None for f in (self.endpoints, self.cidrs, self.entities, self.fqdns))


@dataclass(frozen=True)
class Rule:
    """One ``spec``: the endpoints it selects and its rules per direction."""

    endpoint_selector: Selector
    ingress: tuple[PeerRule, ...] = ()
    egress: tuple[PeerRule, ...] = ()
    has_ingress: bool = False  #: ``ingress`` or ``ingressDeny`` holds at least one rule
    has_egress: bool = False
    default_deny_ingress: bool | None = None  #: ``enableDefaultDeny.ingress`` as written
    default_deny_egress: bool | None = None
    description: str = ""
    path: str = "spec"


@dataclass(frozen=True)
class Policy:
    """A CiliumNetworkPolicy: its name, namespace and rules."""

    name: str
    namespace: str
    rules: tuple[Rule, ...]


def _port(pp: Any, path: str) -> PortProto:
    _expect(pp, dict, path, "a mapping {port, endPort, protocol}")
    _fields(pp, path, ("port", "endPort", "protocol"))
    raw = pp.get("port", "0")
    text = str(raw).strip() if isinstance(raw, (str, int)) and not isinstance(raw, bool) else None
    if text is None or not text.isdigit() or not 0 <= int(text) <= 65535:
        raise PolicyError(f"{path}.port: expected a port number 1-65535 (0 for every port), got {raw!r}")
    port = int(text)
    end = pp.get("endPort", 0)
    if isinstance(end, bool) or not isinstance(end, int) or not 0 <= end <= 65535:
        raise PolicyError(f"{path}.endPort: expected a port number 1-65535, got {end!r}")
    if end and (port == 0 or end < port):
        raise PolicyError(f"{path}.endPort: expected a port >= port {port} (and port set), got {end}")
    proto = pp.get("protocol", "ANY")
    if not isinstance(proto, str) or proto.upper() not in PROTOCOLS:
        raise PolicyError(f"{path}.protocol: expected one of TCP, UDP, SCTP, ICMP, ICMPv6, ANY, got {proto!r}")
    if proto.upper() in ("ICMP", "ICMPV6"):
        raise PolicyError(f"{path}.protocol: Cilium takes ICMP in an 'icmps' rule, which labkit does not implement; got {proto!r}")
    return PortProto(port, end if end != port else 0, proto.upper())


def _cidr(text: Any, path: str) -> str:
    if not isinstance(text, str):
        raise PolicyError(f"{path}: expected a CIDR such as 198.51.100.0/24, got {_type_name(text)} {text!r}")
    try:
        net = ipaddress.ip_network(text if "/" in text else text + ("/32" if ":" not in text else "/128"), strict=False)
    except ValueError:
        raise PolicyError(f"{path}: expected a CIDR such as 198.51.100.0/24, got {text!r}") from None
    return str(net)


def _list(obj: Mapping, key: str, path: str) -> list | None:
    if key not in obj:
        return None
    v = obj[key]
    if v is None:
        return []
    return _expect(v, list, f"{path}.{key}", "a list")


def _peer(obj: Any, direction: str, deny: bool, path: str, namespace: str) -> PeerRule:
    _expect(obj, dict, path, f"a {direction} rule mapping")
    pre = "from" if direction == "ingress" else "to"
    known = [f"{pre}Endpoints", f"{pre}CIDR", f"{pre}CIDRSet", f"{pre}Entities", "toPorts"]
    if direction == "egress" and not deny:
        known.append("toFQDNs")
    _fields(obj, path, known, _UNSUPPORTED[direction])
    eps = _list(obj, f"{pre}Endpoints", path)
    endpoints = None if eps is None else tuple(
        Selector.make(s, f"{path}.{pre}Endpoints[{i}]").with_namespace(namespace) for i, s in enumerate(eps))
    cidrs: list[CidrRule] | None = None
    plain = _list(obj, f"{pre}CIDR", path)
    if plain is not None:
        cidrs = [CidrRule(_cidr(c, f"{path}.{pre}CIDR[{i}]")) for i, c in enumerate(plain)]
    sets = _list(obj, f"{pre}CIDRSet", path)
    if sets is not None:
        cidrs = cidrs or []
        for i, item in enumerate(sets):
            p = f"{path}.{pre}CIDRSet[{i}]"
            _expect(item, dict, p, "a mapping {cidr, except}")
            _fields(item, p, ("cidr", "except"), ("cidrGroupRef",))
            if "cidr" not in item:
                raise PolicyError(f"{p}.cidr: expected a CIDR, got nothing")
            base = _cidr(item["cidr"], f"{p}.cidr")
            excepts = tuple(_cidr(e, f"{p}.except[{j}]") for j, e in enumerate(_list(item, "except", p) or []))
            for j, e in enumerate(excepts):
                if not ipaddress.ip_network(e).subnet_of(ipaddress.ip_network(base)):
                    raise PolicyError(f"{p}.except[{j}]: expected a prefix inside {base}, got {e}")
            cidrs.append(CidrRule(base, excepts))
    ents = _list(obj, f"{pre}Entities", path)
    entities = None
    if ents is not None:
        for i, e in enumerate(ents):
            if e not in ENTITIES:
                raise PolicyError(f"{path}.{pre}Entities[{i}]: expected one of {', '.join(ENTITIES)}, got {e!r}")
        entities = tuple(ents)
    fq = _list(obj, "toFQDNs", path) if "toFQDNs" in known else None
    fqdns = None if fq is None else _fqdn_selectors(fq, f"{path}.toFQDNs")
    ports: list[PortProto] = []
    for i, pr in enumerate(_list(obj, "toPorts", path) or []):
        p = f"{path}.toPorts[{i}]"
        _expect(pr, dict, p, "a mapping {ports}")
        _fields(pr, p, ("ports", "rules") if direction == "egress" and not deny else ("ports",),
                _UNSUPPORTED["port"] + (() if direction == "egress" and not deny else ("rules",)))
        dns = _dns_rules(pr["rules"], f"{p}.rules") if "rules" in pr else None
        for j, pp in enumerate(_list(pr, "ports", p) or []):
            one = _port(pp, f"{p}.ports[{j}]")
            ports.append(one if dns is None else PortProto(one.port, one.end_port, one.protocol, dns))
    return PeerRule(direction, deny, endpoints, None if cidrs is None else tuple(cidrs), entities, fqdns,
                    tuple(ports), path)


def _fqdn_selectors(items: list, path: str) -> tuple[FqdnSelector, ...]:
    """toFQDNs items, or the items of a ``rules.dns`` list: exactly one of matchName, matchPattern."""
    out = []
    for i, item in enumerate(items):
        p = f"{path}[{i}]"
        _expect(item, dict, p, "a mapping {matchName | matchPattern}")
        _fields(item, p, ("matchName", "matchPattern"))
        name, pattern = item.get("matchName", ""), item.get("matchPattern", "")
        if bool(name) == bool(pattern):
            raise PolicyError(f"{p}: expected exactly one of matchName, matchPattern, got {sorted(item)}")
        if name:
            validate_pattern(name, f"{p}.matchName")
            if "*" in name:
                raise PolicyError(f"{p}.matchName: expected a name without '*' (use matchPattern), got {name!r}")
        else:
            validate_pattern(pattern, f"{p}.matchPattern")
        out.append(FqdnSelector(name, pattern))
    return tuple(out)


def _dns_rules(obj: Any, path: str) -> tuple[FqdnSelector, ...]:
    """A ``toPorts`` item's ``rules``: labkit's proxy is a DNS proxy, so only ``dns`` (pkg/policy/api
    l4.go L7Rules: ``dns`` is one of http, kafka, dns, l7proto/l7, each a list)."""
    _expect(obj, dict, path, "a mapping {dns: [...]}")
    _fields(obj, path, ("dns",), ("http", "kafka", "l7proto", "l7"))
    items = _list(obj, "dns", path)
    if items is None:
        raise PolicyError(f"{path}.dns: expected a list of {{matchName | matchPattern}}, got nothing")
    return _fqdn_selectors(items, f"{path}.dns")


def _rule(obj: Any, path: str, namespace: str) -> Rule:
    _expect(obj, dict, path, "a rule mapping (endpointSelector, ingress, egress, ...)")
    known = ("endpointSelector", "ingress", "ingressDeny", "egress", "egressDeny", "enableDefaultDeny",
             "description", "labels")
    _fields(obj, path, known, _UNSUPPORTED["rule"])
    if "endpointSelector" not in obj:
        raise PolicyError(f"{path}.endpointSelector: expected a selector, got nothing")
    sel = Selector.make(obj["endpointSelector"], f"{path}.endpointSelector").with_namespace(namespace)
    peers: dict[str, list[PeerRule]] = {"ingress": [], "egress": []}
    for direction in ("ingress", "egress"):
        for deny in (False, True):
            key = direction + ("Deny" if deny else "")
            for i, item in enumerate(_list(obj, key, path) or []):
                peers[direction].append(_peer(item, direction, deny, f"{path}.{key}[{i}]", namespace))
    dd = obj.get("enableDefaultDeny") or {}
    _expect(dd, dict, f"{path}.enableDefaultDeny", "a mapping {ingress, egress}")
    _fields(dd, f"{path}.enableDefaultDeny", ("ingress", "egress"))
    for k, v in dd.items():
        _expect(v, bool, f"{path}.enableDefaultDeny.{k}", "true or false")
    desc = obj.get("description", "")
    _expect(desc, str, f"{path}.description", "a string")
    return Rule(sel, tuple(peers["ingress"]), tuple(peers["egress"]),
                # rule_validation.go Sanitize / repository.go: len(r.Ingress) > 0 || len(r.IngressDeny) > 0,
                # so `ingress: []` selects nothing while `ingress: [{}]` is default deny
                has_ingress=bool(peers["ingress"]), has_egress=bool(peers["egress"]),
                default_deny_ingress=dd.get("ingress"), default_deny_egress=dd.get("egress"),
                description=desc, path=path)


def policy_from_obj(obj: Any, where: str = "") -> Policy:
    """One CiliumNetworkPolicy from its parsed YAML/JSON mapping."""
    pre = f"{where}: " if where else ""
    try:
        _expect(obj, dict, "", "a CiliumNetworkPolicy mapping")
        _fields(obj, "", ("apiVersion", "kind", "metadata", "spec", "specs"))
        if obj.get("apiVersion") != "cilium.io/v2":
            raise PolicyError(f"apiVersion: expected 'cilium.io/v2', got {obj.get('apiVersion')!r}")
        if obj.get("kind") != "CiliumNetworkPolicy":
            raise PolicyError(f"kind: expected 'CiliumNetworkPolicy', got {obj.get('kind')!r}")
        meta = _expect(obj.get("metadata"), dict, "metadata", "a mapping with a name")
        _fields(meta, "metadata", ("name", "namespace", "labels", "annotations"))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise PolicyError(f"metadata.name: expected a name, got {name!r}")
        namespace = meta.get("namespace", "default")
        _expect(namespace, str, "metadata.namespace", "a namespace name")
        if ("spec" in obj) == ("specs" in obj):
            raise PolicyError(f"spec: expected exactly one of spec, specs, got {'both' if 'spec' in obj else 'neither'}")
        if "spec" in obj:
            rules = [_rule(obj["spec"], "spec", namespace)]
        else:
            specs = _expect(obj["specs"], list, "specs", "a list of rules")
            rules = [_rule(s, f"specs[{i}]", namespace) for i, s in enumerate(specs)]
    except PolicyError as exc:
        raise PolicyError(pre + str(exc)) from None
    return Policy(name, namespace, tuple(rules))


def parse_policies(text: str, source: str = "") -> list[Policy]:
    """Every policy of a YAML (several documents allowed) or JSON text.

    >>> parse_policies("kind: CiliumNetworkPolicy")
    Traceback (most recent call last):
    ...
    labkit.errors.PolicyError: apiVersion: expected 'cilium.io/v2', got None
    """
    where = source or "policy"
    try:
        docs = [json.loads(text)] if text.lstrip().startswith("{") else list(yaml.safe_load_all(text))
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise PolicyError(f"{where}: expected YAML or JSON, got a parse error: {exc}".replace("\n", " ")) from None
    docs = [d for d in docs if d is not None]
    if not docs:
        raise PolicyError(f"{where}: expected at least one CiliumNetworkPolicy, got an empty document")
    out: list[Policy] = []
    for i, d in enumerate(docs):
        label = f"{source} document {i + 1}" if source and len(docs) > 1 else (
            f"document {i + 1}" if len(docs) > 1 else source)
        out.append(policy_from_obj(d, label))
    names = [p.name for p in out]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise PolicyError(f"{where}: expected distinct policy names, got {', '.join(dups)} more than once")
    return out
