"""Labels and security identities, as Cilium v1.16 writes and numbers them.

A label is ``source:key[=value]`` (``k8s:app=web``, ``reserved:host``,
``cidr:198.51.100.0/24``); an identity is a number standing for one *set* of labels.
Numbers 1-10 are reserved (host, world, ..., world-ipv6), 256 and up are handed
out to the label sets of pods, and CIDR identities (toCIDR, toFQDNs) live in the
local scope: ``1 << 24`` ORed with a counter starting at 1 (and so do the identities
v1.16 gives IPs that toFQDNs selectors picked out, labelled ``fqdn:<selector>``).

    >>> alloc = IdentityAllocator()
    >>> web = LabelSet.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=default"])
    >>> alloc.allocate(web), alloc.allocate(LabelSet.parse(["k8s:app=db"])), alloc.allocate(web)
    (256, 257, 256)
    >>> alloc.allocate_cidr("198.51.100.0/24")
    16777217
    >>> print("\\n".join(identity_list_lines(alloc, reserved=False)))
    ID         LABELS
    256        k8s:app=web
               k8s:io.kubernetes.pod.namespace=default
    257        k8s:app=db
    16777217   cidr:198.51.100.0/24
               reserved:world
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from labkit._tabwriter import tabwrite
from labkit.errors import PolicyError

__all__ = [
    "Label",
    "LabelSet",
    "RESERVED",
    "RESERVED_NAMES",
    "IDENTITY_UNKNOWN",
    "IDENTITY_HOST",
    "IDENTITY_WORLD",
    "IDENTITY_UNMANAGED",
    "IDENTITY_HEALTH",
    "IDENTITY_INIT",
    "IDENTITY_REMOTE_NODE",
    "IDENTITY_KUBE_APISERVER",
    "IDENTITY_INGRESS",
    "IDENTITY_WORLD_IPV4",
    "IDENTITY_WORLD_IPV6",
    "MINIMAL_NUMERIC_IDENTITY",
    "IDENTITY_SCOPE_LOCAL",
    "MIN_LOCAL_IDENTITY",
    "IdentityAllocator",
    "pod_labels",
    "identity_list_lines",
    "reserved_labels",
]

# pkg/identity/numericidentity.go (v1.16): the iota block from IdentityUnknown.
IDENTITY_UNKNOWN = 0
IDENTITY_HOST = 1
IDENTITY_WORLD = 2
IDENTITY_UNMANAGED = 3
IDENTITY_HEALTH = 4
IDENTITY_INIT = 5
IDENTITY_REMOTE_NODE = 6
IDENTITY_KUBE_APISERVER = 7
IDENTITY_INGRESS = 8
IDENTITY_WORLD_IPV4 = 9
IDENTITY_WORLD_IPV6 = 10

#: MinimalNumericIdentity: the first identity the allocator hands to a label set.
MINIMAL_NUMERIC_IDENTITY = 256
#: IdentityScopeLocal (1 << 24): the scope bit of CIDR identities.
IDENTITY_SCOPE_LOCAL = 1 << 24
#: MinLocalIdentity = MinAllocatorLocalIdentity (1) | IdentityScopeLocal.
MIN_LOCAL_IDENTITY = 1 | IDENTITY_SCOPE_LOCAL
_MAX_LOCAL_IDENTITY = 0xFFFFFF | IDENTITY_SCOPE_LOCAL

#: reservedIdentityNames: number → name (``reserved:<name>`` is its label).
RESERVED_NAMES: dict[int, str] = {
    IDENTITY_UNKNOWN: "unknown",
    IDENTITY_HOST: "host",
    IDENTITY_WORLD: "world",
    IDENTITY_UNMANAGED: "unmanaged",
    IDENTITY_HEALTH: "health",
    IDENTITY_INIT: "init",
    IDENTITY_REMOTE_NODE: "remote-node",
    IDENTITY_KUBE_APISERVER: "kube-apiserver",
    IDENTITY_INGRESS: "ingress",
    IDENTITY_WORLD_IPV4: "world-ipv4",
    IDENTITY_WORLD_IPV6: "world-ipv6",
}
#: reservedIdentities: name → number.
RESERVED: dict[str, int] = {name: num for num, name in RESERVED_NAMES.items() if num}


@dataclass(frozen=True, order=True)
class Label:
    """One label; ``str()`` is Cilium's ``Source:Key=Value`` (``Source:Key`` without a value).

    >>> str(Label.parse("k8s:app=web")), str(Label.parse("reserved:host")), Label.parse("app=web").source
    ('k8s:app=web', 'reserved:host', 'unspec')
    """

    source: str
    key: str
    value: str = ""

    @classmethod
    def parse(cls, text: str, default_source: str = "unspec") -> "Label":
        """``source:key=value`` as pkg/labels parseLabel reads it (the source is up to the first ``:``)."""
        if not isinstance(text, str) or not text:
            raise PolicyError(f"label: expected 'source:key[=value]', got {text!r}")
        source, sep, rest = text.partition(":")
        if not sep:
            source, rest = default_source, text
        key, _, value = rest.partition("=")
        if source == "reserved" and not key:
            key, value = value, ""
        if not key:
            raise PolicyError(f"label {text!r}: expected a key, got none")
        return cls(source, key, value)

    def __str__(self) -> str:
        return f"{self.source}:{self.key}={self.value}" if self.value else f"{self.source}:{self.key}"


class LabelSet(frozenset):
    """A set of :class:`Label` s; two pods with equal sets share one identity.

    >>> s = LabelSet.parse(["k8s:b=2", "k8s:a=1"])
    >>> s.printable(), s.get("k8s", "a")
    (['k8s:a=1', 'k8s:b=2'], '1')
    """

    @classmethod
    def parse(cls, labels: Iterable[str] | Mapping[str, str], default_source: str = "k8s") -> "LabelSet":
        """From ``["k8s:app=web", ...]`` or ``{"app": "web"}`` (keys without a source get ``default_source``)."""
        if isinstance(labels, Mapping):
            items = [Label.parse(f"{k}={v}" if ":" in k else f"{default_source}:{k}={v}") for k, v in labels.items()]
        else:
            items = [Label.parse(t, default_source) for t in labels]
        return cls(items)

    def printable(self) -> list[str]:
        """pkg/labels GetPrintableModel: the labels as strings, sorted."""
        return sorted(str(lbl) for lbl in self)

    def get(self, source: str, key: str) -> str | None:
        """The value of ``source:key`` (``any`` matches every source), None when absent."""
        for lbl in self:
            if lbl.key == key and (source == "any" or lbl.source == source):
                return lbl.value
        return None

    def __repr__(self) -> str:
        return f"LabelSet({self.printable()!r})"


def reserved_labels(identity: int) -> LabelSet:
    """The labels of a reserved identity (numericidentity.go reservedIdentityLabels):
    kube-apiserver also carries ``reserved:remote-node``.

    >>> reserved_labels(IDENTITY_KUBE_APISERVER).printable()
    ['reserved:kube-apiserver', 'reserved:remote-node']
    """
    name = RESERVED_NAMES[identity]
    if identity == IDENTITY_KUBE_APISERVER:
        return LabelSet([Label("reserved", name), Label("reserved", "remote-node")])
    return LabelSet([Label("reserved", name)])


def pod_labels(labels: Mapping[str, str] | None = None, namespace: str = "default") -> LabelSet:
    """The label set Cilium derives for a pod: its own labels under ``k8s:``, plus the
    namespace, service-account and cluster labels every pod carries.

    >>> pod_labels({"app": "web"}).printable()  # doctest: +NORMALIZE_WHITESPACE
    ['k8s:app=web', 'k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=default',
     'k8s:io.cilium.k8s.policy.cluster=default', 'k8s:io.cilium.k8s.policy.serviceaccount=default',
     'k8s:io.kubernetes.pod.namespace=default']
    """
    out = dict(labels or {})
    out.update({
        "io.kubernetes.pod.namespace": namespace,
        "io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name": namespace,
        "io.cilium.k8s.policy.serviceaccount": "default",
        "io.cilium.k8s.policy.cluster": "default",
    })
    return LabelSet.parse(out)


def _cidr_label(prefix: str) -> Label:
    net = ipaddress.ip_network(prefix, strict=False)
    # pkg/labels/cidr.go: IPv6 colons become dashes in the key.
    return Label("cidr", str(net).replace(":", "-"))


class IdentityAllocator:
    """Cluster identities (from 256) for label sets, CIDR identities (local scope) for prefixes.

    ``previous`` (``{identity: [labels...]}``, e.g. :meth:`snapshot` of the last run) keeps
    numbers stable across a restart: a set seen before gets its old number back.

    >>> a = IdentityAllocator()
    >>> n = a.allocate(LabelSet.parse(["k8s:app=db"]))
    >>> IdentityAllocator(previous=a.snapshot()).allocate(LabelSet.parse(["k8s:app=db"])) == n
    True
    """

    def __init__(self, previous: Mapping[int | str, Iterable[str]] | None = None):
        self._by_labels: dict[LabelSet, int] = {}
        self._by_id: dict[int, LabelSet] = {}
        #: CIDR identities' prefixes, parsed once: a rule with n prefixes asks for every one of them n times
        self._nets: dict[int, ipaddress.IPv4Network | ipaddress.IPv6Network] = {}
        self._next_global = MINIMAL_NUMERIC_IDENTITY
        self._next_local = MIN_LOCAL_IDENTITY
        for ident, labels in (previous or {}).items():
            self._put(int(ident), LabelSet.parse(list(labels)))

    def _put(self, ident: int, labels: LabelSet) -> None:
        self._by_labels[labels] = ident
        self._by_id[ident] = labels
        for lbl in labels:
            if lbl.source == "cidr":
                self._nets[ident] = ipaddress.ip_network(lbl.key.replace("-", ":"))
        if ident & IDENTITY_SCOPE_LOCAL:
            self._next_local = max(self._next_local, ident + 1)
        else:
            self._next_global = max(self._next_global, ident + 1)

    def allocate(self, labels: LabelSet) -> int:
        """The identity of ``labels``: its old number, or the next free one from 256.
        A set that is exactly a reserved identity's labels gets that reserved number."""
        for num in RESERVED_NAMES:
            if num and labels == reserved_labels(num):
                return num
        if labels in self._by_labels:
            return self._by_labels[labels]
        ident = self._next_global
        self._put(ident, labels)
        return ident

    def allocate_cidr(self, prefix: str) -> int:
        """The local-scope identity of a prefix, labelled ``cidr:<prefix>`` and ``reserved:world``."""
        try:
            label = _cidr_label(prefix)
        except ValueError as exc:
            raise PolicyError(f"CIDR {prefix!r}: expected an address prefix such as 198.51.100.0/24, got {prefix!r}") from exc
        return self._allocate_local(LabelSet([label, Label("reserved", "world")]), f"CIDR {prefix}")

    def allocate_fqdn(self, selectors: Iterable[str]) -> int:
        """The local-scope identity of an IP that toFQDNs selectors picked out: in v1.16 it is
        labelled by the selectors (``fqdn:<matchName or matchPattern>``, pkg/policy/api/fqdn.go
        IdentityLabel) and ``reserved:world``, not by its address, so every IP a set of selectors
        selects shares one identity.

        >>> a = IdentityAllocator()
        >>> a.allocate_fqdn(["*.example.test"]) == a.allocate_fqdn(["*.example.test"]), a.labels(16777217).printable()
        (True, ['fqdn:*.example.test', 'reserved:world'])
        """
        sels = sorted(set(selectors))
        if not sels:
            raise PolicyError("FQDN identity: expected at least one selector, got none")
        return self._allocate_local(LabelSet([Label("fqdn", s) for s in sels] + [Label("reserved", "world")]),
                                    f"toFQDNs {', '.join(sels)}")

    def _allocate_local(self, labels: LabelSet, what: str) -> int:
        if labels in self._by_labels:
            return self._by_labels[labels]
        if self._next_local > _MAX_LOCAL_IDENTITY:
            raise PolicyError(f"local identity for {what}: expected a free local identity, got none left")
        ident = self._next_local
        self._put(ident, labels)
        return ident

    def labels(self, identity: int) -> LabelSet:
        """The labels of an identity (reserved ones included); KeyError when unknown."""
        if identity in RESERVED_NAMES and identity:
            return reserved_labels(identity)
        return self._by_id[identity]

    def cidr_of(self, identity: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        """The prefix a CIDR identity stands for, None for any other identity."""
        return self._nets.get(identity)

    def cidr_networks(self) -> dict[int, ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """Every CIDR identity and its prefix (a copy).

        >>> a = IdentityAllocator()
        >>> n = a.allocate_cidr("198.51.100.0/24")
        >>> a.cidr_networks() == {n: ipaddress.ip_network("198.51.100.0/24")}
        True
        """
        return dict(self._nets)

    def __iter__(self) -> Iterator[tuple[int, LabelSet]]:
        return iter(sorted(self._by_id.items()))

    def snapshot(self) -> dict[int, list[str]]:
        """``{identity: [labels...]}`` for every allocated identity: what a restart passes back."""
        return {ident: labels.printable() for ident, labels in self}


def identity_list_lines(alloc: IdentityAllocator, reserved: bool = True) -> list[str]:
    """``cilium-dbg identity list`` (cilium-dbg/cmd/identity_get.go printIdentities): an
    ``ID  LABELS`` table, one label per line, the ID on the first; reserved identities first.

    >>> identity_list_lines(IdentityAllocator())[:3]
    ['ID   LABELS', '1    reserved:host', '2    reserved:world']
    """
    rows: list[tuple[int, LabelSet]] = []
    if reserved:
        rows += [(num, reserved_labels(num)) for num in sorted(RESERVED_NAMES) if num]
    rows += list(alloc)
    text = "ID\tLABELS\n"
    for ident, labels in rows:
        for i, lbl in enumerate(labels.printable()):
            text += f"{ident}\t{lbl}\n" if i == 0 else f"\t{lbl}\n"
    # printIdentities: tabwriter.NewWriter(os.Stdout, 2, 0, 3, ' ', 0)
    return tabwrite(text, minwidth=2, tabwidth=0, padding=3).splitlines()
