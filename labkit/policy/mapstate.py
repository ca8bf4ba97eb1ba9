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


def _port_range(k: PolicyKey) -> tuple[int, int]:
    """(DestPort, EndPort) of Cilium's key: port 0 is the wildcard."""
    if k.dport == 0:
        return 0, 0xFFFF
    return k.dport, k.dport | (~k.port_mask() & 0xFFFF)


def _port_is_equal(k: PolicyKey, c: PolicyKey) -> bool:
    return k.dport == c.dport and k.port_mask() == c.port_mask()


def _port_is_broader(k: PolicyKey, c: PolicyKey) -> bool:
    """Key.PortIsBroader (pkg/policy/types/types.go:103-115@82999990): covers, not equal."""
    if k.dport == 0 and c.dport != 0:
        return True
    if k.dport != 0 and c.dport == 0:
        return False
    (ks, ke), (cs, ce) = _port_range(k), _port_range(c)
    return ks <= cs and ke >= ce and (ks, ke) != (cs, ce)


def _portproto_is_broader(k: PolicyKey, c: PolicyKey) -> bool:
    """Key.PortProtoIsBroader (types.go:85-90@82999990)."""
    if k.protocol == 0 and c.protocol != 0:
        return _port_is_equal(k, c) or _port_is_broader(k, c)
    return k.protocol == c.protocol and _port_is_broader(k, c)


def _portproto_is_equal(k: PolicyKey, c: PolicyKey) -> bool:
    return _port_is_equal(k, c) and k.protocol == c.protocol


def _protocols_match(a: PolicyKey, b: PolicyKey) -> bool:
    return a.protocol == 0 or b.protocol == 0 or a.protocol == b.protocol


def _with_l4(key: PolicyKey, l4: PolicyKey) -> PolicyKey:
    """``key``'s identity and direction with ``l4``'s protocol and port."""
    out = PolicyKey.from_bytes(bytes(l4))
    out.sec_label = key.sec_label
    return out


def _with_identity(key: PolicyKey, identity: int) -> PolicyKey:
    out = PolicyKey.from_bytes(bytes(key))
    out.sec_label = identity
    return out


class MapState:
    """Allow and deny entries of one endpoint, built the way mapstate.go builds them.

    ``nets(identity)`` gives the prefixes of a CIDR identity (none for others); the world identities'
    are :data:`WORLD_NETS`."""

    def __init__(self, nets: Callable[[int], Sequence[Net]] | None = None) -> None:
        self.allows: dict[PolicyKey, _Entry] = {}
        self.denies: dict[PolicyKey, _Entry] = {}
        self._nets = nets or (lambda ident: ())

    # -- mapState's primitives --------------------------------------------------------------
    def _get(self, k: PolicyKey) -> _Entry | None:
        return self.denies.get(k) or self.allows.get(k)

    def _put(self, k: PolicyKey, e: _Entry) -> None:
        (self.allows if e.deny else self.denies).pop(k, None)
        (self.denies if e.deny else self.allows)[k] = e

    def _nets_of(self, ident: int) -> Sequence[Net]:
        return WORLD_NETS.get(ident, ()) if ident <= 10 else self._nets(ident)

    def _superset(self, primary: int, other: int) -> bool:
        """identityIsSupersetOf (mapstate.go:736-801@82999990): identity 0 contains every other; a prefix of
        ``primary`` contains one of ``other``'s (same family); an identity never contains itself."""
        if primary == other:
            return False
        if primary == 0:
            return True
        return any(a.version == b.version and b.prefixlen >= a.prefixlen and b.network_address in a
                   for a in self._nets_of(primary) for b in self._nets_of(other))

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
        self.allows.pop(key, None)
        self.denies.pop(key, None)

    # -- what resolve() calls -----------------------------------------------------------------
    def allow_all(self, key: PolicyKey) -> None:
        """allowAllIdentities (mapstate.go:1525-1556@82999990): the direction's identity-0 allow, upserted as
        is (no owner, no deny processing)."""
        self.allows[key] = _Entry(False, owners={None})

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
        deletes, updates = [], []
        for k in list(self.allows):
            if nk.egress != k.egress or not _protocols_match(nk, k):
                continue
            if self._superset(k.sec_label, nk.sec_label):
                if _portproto_is_broader(nk, k):
                    updates.append((_with_l4(nk, k), _Entry(True, owners={nk})))
            elif _portproto_is_broader(nk, k) or _portproto_is_equal(nk, k):
                if nk.sec_label == 0 or nk.sec_label == k.sec_label:
                    deletes.append(k)
                elif self._superset(nk.sec_label, k.sec_label):
                    updates.append((k, _Entry(True, owners={nk})))
            elif self._superset(nk.sec_label, k.sec_label):
                updates.append((_with_identity(nk, k.sec_label), _Entry(True, owners={nk})))
        for k in deletes:
            self._delete(k, None)
        for k, e in updates:
            self._add(k, e)
            new.dependents.add(k)

        doomed = []
        for k, v in list(self.denies.items()):
            if nk.egress != k.egress or not _protocols_match(nk, k):
                continue
            if (k.sec_label == 0 or k.sec_label == nk.sec_label) and \
                    (_portproto_is_equal(k, nk) or _portproto_is_broader(k, nk)):
                if k != nk or v.owners == new.owners:
                    return  # covered by a deny the datapath already matches (an identical key merges owners)
            elif (nk.sec_label == 0 or nk.sec_label == k.sec_label) and \
                    (_portproto_is_equal(nk, k) or _portproto_is_broader(nk, k)) and k not in new.dependents:
                doomed.append(k)
        for k in doomed:
            self._delete(k, None)
        self._add(nk, new)

    def _insert_allow(self, nk: PolicyKey, new: _Entry) -> None:
        updates, bailed, to_deny = [], False, False
        for k, v in list(self.denies.items()):
            if nk.egress != k.egress or not _protocols_match(nk, k):
                continue
            if self._superset(nk.sec_label, k.sec_label):
                if _portproto_is_broader(k, nk):
                    updates.append((_with_l4(k, nk), _Entry(True, owners={k}), k))
            elif _portproto_is_broader(k, nk) or _portproto_is_equal(k, nk):
                if k.sec_label == 0 or k.sec_label == nk.sec_label:
                    bailed = True
                    break
                if self._superset(k.sec_label, nk.sec_label):
                    to_deny = True
            elif self._superset(k.sec_label, nk.sec_label):
                updates.append((_with_identity(k, nk.sec_label), _Entry(True, owners={k}), k))
        if bailed:
            return
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
