"""One endpoint's policy map state as Cilium v1.16 builds it: pkg/policy/mapstate.go's
``denyPreferredInsertWithChanges`` (mapstate.go:824-1136@82999990), with its owners and dependents.

Allow and deny entries live apart. Inserting a deny removes the allows it makes redundant, turns
into denies the allows whose identity it contains (CIDR containment, or identity 0), and adds
*dependent* deny keys where a broader allow would otherwise win in the datapath (bpf/lib/policy.h
prefers a port over an identity); a deny already covered by a deny of identity 0 or of its own
identity is not inserted, and the denies it covers go. Inserting an allow does the mirror image.

Every entry records its **owners**: the selectors whose rules need it, or, for a dependent, the
key it was derived from. Deleting a key deletes its dependents only where no other owner still
needs them (mapstate.go:677-732@82999990), so a deny that a selector asked for itself stays when
the key it also depends on goes.

    >>> from labkit.maps.policy import Direction, PolicyKey
    >>> ms = MapState()
    >>> ms.insert(PolicyKey.make(0, Direction.INGRESS, 6, 80), deny=True, owner="sel:all")
    >>> ms.insert(PolicyKey.make(300, Direction.INGRESS), deny=False, owner="sel:app=x")
    >>> [(str(r.key), r.entry.is_deny) for r in ms.rows()]
    [('Ingress: 0 80/TCP', True), ('Ingress: 300 80/TCP', True), ('Ingress: 300 ANY', False)]

(The allow of identity 300 on every port gets the deny's port as its own deny key: without it the
L3-only allow would still lose to the L4-only deny in the datapath, but Cilium writes the row.)
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from labkit.maps.policy import PolicyEntry, PolicyKey, PolicyRow, sort_rows

__all__ = ["MapState", "WORLD_NETS"]

Net = ipaddress.IPv4Network | ipaddress.IPv6Network
#: mapstate.go worldNets (mapstate.go:306-317@82999990): world, world-ipv4, world-ipv6 contain every address
#: of their families.
WORLD_NETS: dict[int, tuple[Net, ...]] = {
    2: (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")),
    9: (ipaddress.ip_network("0.0.0.0/0"),),
    10: (ipaddress.ip_network("::/0"),),
}


@dataclass
class _Entry:
    """A MapStateEntry: deny or allow (with a proxy port), who needs it, which keys were derived from it."""

    deny: bool
    proxy_port: int = 0
    owners: set = field(default_factory=set)
    dependents: set = field(default_factory=set)

    def merge(self, other: "_Entry") -> None:
        """MapStateEntry.Merge: deny is sticky, a redirect wins over none (the lower port on a tie)."""
        self.deny = self.deny or other.deny
        if self.deny:
            self.proxy_port = 0
        elif other.proxy_port and (not self.proxy_port or other.proxy_port < self.proxy_port):
            self.proxy_port = other.proxy_port
        self.owners |= other.owners
        self.dependents |= other.dependents

    def datapath(self, key: PolicyKey) -> PolicyEntry:
        return PolicyEntry.deny(key) if self.deny else PolicyEntry.allow(key, self.proxy_port)


def _facts(k: PolicyKey) -> tuple[int, int, int, int, int, int, int]:
    """(identity, egress, protocol, DestPort, its mask, first port, last port) of a key: port 0 is the wildcard."""
    dport, mask = k.dport, k.port_mask()
    first, last = (0, 0xFFFF) if dport == 0 else (dport, dport | (~mask & 0xFFFF))
    return k.sec_label, k.egress, k.protocol, dport, mask, first, last


def _port_is_equal(k, c) -> bool:
    return k[3] == c[3] and k[4] == c[4]


def _port_is_broader(k, c) -> bool:
    """Key.PortIsBroader (pkg/policy/types/types.go:103-115@82999990): covers, not equal."""
    if k[3] == 0 and c[3] != 0:
        return True
    if k[3] != 0 and c[3] == 0:
        return False
    return k[5] <= c[5] and k[6] >= c[6] and (k[5], k[6]) != (c[5], c[6])


def _portproto_is_broader(k, c) -> bool:
    """Key.PortProtoIsBroader (types.go:85-90@82999990)."""
    if k[2] == 0 and c[2] != 0:
        return _port_is_equal(k, c) or _port_is_broader(k, c)
    return k[2] == c[2] and _port_is_broader(k, c)


def _portproto_is_equal(k, c) -> bool:
    return _port_is_equal(k, c) and k[2] == c[2]


def _protocols_match(a, b) -> bool:
    return a[2] == 0 or b[2] == 0 or a[2] == b[2]


def _with_l4(key: PolicyKey, l4: PolicyKey) -> PolicyKey:
    """``key``'s identity and direction with ``l4``'s protocol and port."""
    out = PolicyKey.from_bytes(bytes(l4))
    out.sec_label = key.sec_label
    return out


def _with_identity(key: PolicyKey, identity: int) -> PolicyKey:
    out = PolicyKey.from_bytes(bytes(key))
    out.sec_label = identity
    return out


class _IdIndex:
    """The keys of one table by identity, and the identities by their prefixes: which identities contain, or lie
    within, a given one, without comparing it with every identity of the table."""

    def __init__(self, nets_of: Callable[[int], tuple]) -> None:
        self.keys: dict[int, set[PolicyKey]] = {}
        self._nets_of = nets_of
        self._exact: dict[tuple[int, int, int], set[int]] = {}   # a prefix → identities with exactly it
        self._within: dict[tuple[int, int, int], set[int]] = {}  # a prefix → identities with a prefix inside it

    def add(self, k: PolicyKey) -> None:
        ident = k.sec_label
        if ident not in self.keys:
            self.keys[ident] = set()
            for v, length, bits, _ in self._nets_of(ident):
                self._exact.setdefault((v, length, bits), set()).add(ident)
                for up in range(length + 1):
                    self._within.setdefault((v, up, bits >> (length - up)), set()).add(ident)
        self.keys[ident].add(k)

    def discard(self, k: PolicyKey) -> None:
        ident = k.sec_label
        keys = self.keys.get(ident)
        if keys is None:
            return
        keys.discard(k)
        if not keys:
            del self.keys[ident]
            for v, length, bits, _ in self._nets_of(ident):
                self._exact[(v, length, bits)].discard(ident)
                for up in range(length + 1):
                    self._within[(v, up, bits >> (length - up))].discard(ident)

    def related(self, ident: int) -> list[PolicyKey]:
        """Keys whose identity is ``ident`` or 0, or contains or lies within one of ``ident``'s prefixes (all of
        them for identity 0): the only keys an insert of ``ident`` can interact with."""
        if ident == 0:
            return [k for keys in self.keys.values() for k in keys]
        ids = {i for i in (0, ident) if i in self.keys}
        for v, length, bits, _ in self._nets_of(ident):
            ids |= self._within.get((v, length, bits), set())
            for up in range(length + 1):
                ids |= self._exact.get((v, up, bits >> (length - up)), set())
        return [k for i in ids for k in self.keys.get(i, ())]


class MapState:
    """Allow and deny entries of one endpoint, built the way mapstate.go builds them.

    ``nets(identity)`` gives the prefixes of a CIDR identity (none for others); the world identities'
    are :data:`WORLD_NETS`."""

    def __init__(self, nets: Callable[[int], Sequence[Net]] | None = None) -> None:
        self.allows: dict[PolicyKey, _Entry] = {}
        self.denies: dict[PolicyKey, _Entry] = {}
        self._nets = nets or (lambda ident: ())
        self._key_facts: dict[PolicyKey, tuple] = {}
        #: allows and denies by identity: an insert looks only at identities it can interact with
        self._allow_ids = _IdIndex(self._nets_of)
        self._deny_ids = _IdIndex(self._nets_of)
        self._id_nets: dict[int, tuple] = {}
        self._supersets: dict[tuple[int, int], bool] = {}

    def _f(self, k: PolicyKey) -> tuple:
        f = self._key_facts.get(k)
        if f is None:
            f = self._key_facts[k] = _facts(k)
        return f

    # -- mapState's primitives --------------------------------------------------------------
    def _get(self, k: PolicyKey) -> _Entry | None:
        return self.denies.get(k) or self.allows.get(k)

    def _put(self, k: PolicyKey, e: _Entry) -> None:
        self._drop(k)
        (self.denies if e.deny else self.allows)[k] = e
        (self._deny_ids if e.deny else self._allow_ids).add(k)

    def _drop(self, k: PolicyKey) -> None:
        for table, index in ((self.allows, self._allow_ids), (self.denies, self._deny_ids)):
            if table.pop(k, None) is not None:
                index.discard(k)

    def _nets_of(self, ident: int) -> tuple:
        """(family, prefix length, the prefix's bits) of each prefix of an identity."""
        got = self._id_nets.get(ident)
        if got is None:
            nets = WORLD_NETS.get(ident, ()) if ident <= 10 else self._nets(ident)
            got = self._id_nets[ident] = tuple(
                (n.version, n.prefixlen, int(n.network_address) >> (n.max_prefixlen - n.prefixlen), n.max_prefixlen)
                for n in nets)
        return got

    def _superset(self, primary: int, other: int) -> bool:
        """identityIsSupersetOf (mapstate.go:736-801@82999990): identity 0 contains every other; a prefix of
        ``primary`` contains one of ``other``'s (same family); an identity never contains itself."""
        if primary == other:
            return False
        if primary == 0:
            return True
        got = self._supersets.get((primary, other))
        if got is None:
            got = self._supersets[(primary, other)] = any(
                av == bv and bl >= al and (bbits >> (bl - al)) == abits
                for av, al, abits, _ in self._nets_of(primary) for bv, bl, bbits, _ in self._nets_of(other))
        return got

    def _add(self, key: PolicyKey, entry: _Entry) -> None:
        """addKeyWithChanges (mapstate.go:631-675@82999990): merge into an existing entry (an allow never
        overrides a deny), else insert a copy."""
        old = self._get(key)
        if old is not None:
            if old.deny and not entry.deny:
                return
            old.merge(entry)
            self._put(key, old)
            return
        self._put(key, _Entry(entry.deny, entry.proxy_port, set(entry.owners), set(entry.dependents)))

    def _remove_dependent(self, owner: PolicyKey, dependent: PolicyKey) -> None:
        e = self.allows.get(owner) or self.denies.get(owner)
        if e is not None:
            e.dependents.discard(dependent)

    def _delete(self, key: PolicyKey, owner: Hashable | None) -> None:
        """deleteKeyWithChanges (mapstate.go:677-732@82999990): with an owner, only that owner's share (the
        key stays while others need it); then the key's dependents lose it as their owner."""
        entry = self._get(key)
        if entry is None:
            return
        if owner is not None:
            if owner not in entry.owners:
                return
            entry.owners.discard(owner)
            if isinstance(owner, PolicyKey):
                self._remove_dependent(owner, key)
            if entry.owners:
                return
        else:
            for o in entry.owners:
                if isinstance(o, PolicyKey):
                    self._remove_dependent(o, key)
        for dep in list(entry.dependents):
            self._delete(dep, key)
        self._drop(key)

    # -- what resolve() calls -----------------------------------------------------------------
    def allow_all(self, key: PolicyKey) -> None:
        """allowAllIdentities (mapstate.go:1525-1556@82999990): the direction's identity-0 allow, upserted as
        is (no owner, no deny processing)."""
        self._put(key, _Entry(False, owners={None}))

    def insert(self, new_key: PolicyKey, deny: bool, proxy_port: int = 0, owner: Hashable | None = None) -> None:
        """denyPreferredInsertWithChanges for one key of a rule whose selector is ``owner``."""
        new = _Entry(deny, 0 if deny else proxy_port, {owner})
        if PolicyKey.make(0, new_key.direction) in self.denies:
            return  # a deny-all of the direction takes nothing more
        if deny:
            self._insert_deny(new_key, new)
        else:
            self._insert_allow(new_key, new)

    def _insert_deny(self, nk: PolicyKey, new: _Entry) -> None:
        n = self._f(nk)
        deletes, updates = [], []
        for k in self._allow_ids.related(n[0]):
            a = self._f(k)
            if n[1] != a[1] or not _protocols_match(n, a):
                continue
            if self._superset(a[0], n[0]):
                if _portproto_is_broader(n, a):
                    updates.append((_with_l4(nk, k), _Entry(True, owners={nk})))
            elif _portproto_is_broader(n, a) or _portproto_is_equal(n, a):
                if n[0] == 0 or n[0] == a[0]:
                    deletes.append(k)
                elif self._superset(n[0], a[0]):
                    updates.append((k, _Entry(True, owners={nk})))
            elif self._superset(n[0], a[0]):
                updates.append((_with_identity(nk, a[0]), _Entry(True, owners={nk})))
        for k in deletes:
            self._delete(k, None)
        for k, e in updates:
            self._add(k, e)
            new.dependents.add(k)

        doomed = []
        for k in self._deny_ids.related(n[0]):
            v, d = self.denies[k], self._f(k)
            if n[1] != d[1] or not _protocols_match(n, d):
                continue
            if (d[0] == 0 or d[0] == n[0]) and (_portproto_is_equal(d, n) or _portproto_is_broader(d, n)):
                if k != nk or v.owners == new.owners:
                    return  # covered by a deny the datapath already matches (an identical key merges owners)
            elif (n[0] == 0 or n[0] == d[0]) and (_portproto_is_equal(n, d) or _portproto_is_broader(n, d)) \
                    and k not in new.dependents:
                doomed.append(k)
        for k in doomed:
            self._delete(k, None)
        self._add(nk, new)

    def _insert_allow(self, nk: PolicyKey, new: _Entry) -> None:
        n = self._f(nk)
        updates, to_deny = [], False
        for k in self._deny_ids.related(n[0]):
            d = self._f(k)
            if n[1] != d[1] or not _protocols_match(n, d):
                continue
            if self._superset(n[0], d[0]):
                if _portproto_is_broader(d, n):
                    updates.append((_with_l4(k, nk), _Entry(True, owners={k}), k))
            elif _portproto_is_broader(d, n) or _portproto_is_equal(d, n):
                if d[0] == 0 or d[0] == n[0]:
                    return  # the datapath would match the deny first: the allow is not inserted
                if self._superset(d[0], n[0]):
                    to_deny = True
            elif self._superset(d[0], n[0]):
                updates.append((_with_identity(k, n[0]), _Entry(True, owners={k}), k))
        for key, e, owner in updates:
            self._add(key, e)
            owner_entry = self._get(owner)
            if owner_entry is not None:
                owner_entry.dependents.add(key)
        if to_deny:
            new.deny, new.proxy_port = True, 0
        self._add(nk, new)

    def rows(self) -> list[PolicyRow]:
        """The map's rows in ``cilium-dbg bpf policy get`` order."""
        return sort_rows([PolicyRow(k, e.datapath(k)) for d in (self.allows, self.denies) for k, e in d.items()])
