"""The agent's network policies: a repository of CiliumNetworkPolicies, and every endpoint's
policy map kept equal to what they resolve to (cilium-agent's policy repository and endpoint
regeneration, pkg/policy and pkg/endpoint).

The repository holds policies by (namespace, name) in ``/run/labkit/<lab>/policies.json``
(in the lab's ledger), so a new agent restores them. Every change is checked whole before
anything is written: the YAML parsed (:mod:`labkit.policy.rules`), every endpoint's policy
resolved (:func:`labkit.policy.resolve.resolve`) with a *copy* of the identity allocator,
and a selector of the new policies that selects nothing refused. Only then are the maps
written, and only the difference:

- one map per selected endpoint, pinned beside the node's other maps as Cilium names it
  (pkg/endpoint/bpf.go policyMapPath: ``bpf.LocalMapPath(policymap.MapName, e.ID)``, and
  pkg/bpf LocalMapName formats ``"%s%05d"``: ``cilium_policy_00001``), an LPM trie of
  ``struct policy_key`` → ``struct policy_entry`` (:mod:`labkit.maps.policy`), 16384 entries,
  ``BPF_F_NO_PREALLOC``; keys to add or change are written, then keys no longer wanted deleted
  (counters of unchanged keys stay);
- the outer map ``labkit_policy`` (a hash of maps: endpoint id → the endpoint's map), when
  the datapath has one: an endpoint without an entry there has no policy map, which the
  datapath reads as allow-all — what Cilium's default enforcement mode gives an endpoint no
  policy selects (its map holds only the allow-all keys);
- each enforced endpoint's policy verdict log filter in ``labkit_policy_filter`` (the directions it
  enforces: :func:`verdict_log_filter`), so the datapath reports verdicts only there, as Cilium does;
- the prefixes of ``toCIDR``/``fromCIDR`` rules (and their ``except`` prefixes) in every
  node's ``cilium_ipcache`` with their CIDR identities, so the datapath finds the identity the
  policy map names (a pod's or node's own /32 is never overwritten);
- every address the DNS proxy learnt for a name a ``toFQDNs`` selector picks out, as a /32 with
  its FQDN identity (:meth:`Policies.learn_dns`; the cache is :mod:`labkit.fqdn.cache`, kept in
  ``fqdn.json``), until its TTL runs out on the lab clock (:meth:`Policies.expire_dns`).

    >>> policy_map_name(1)
    'cilium_policy_00001'
"""
from __future__ import annotations

import fnmatch

import ctypes
import ipaddress
import json
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from labkit.agent.identities import IdentityStore, assign, labels_of
from labkit.datapath import bpf as _bpf
from labkit.errors import DatapathError, NotFoundError, PolicyError
from labkit.fqdn.cache import DnsCache
from labkit.maps.base import PinnedMap
from labkit.maps.eps import EndpointInfo, EndpointKey, IpcacheKey, RemoteEndpointInfo
from labkit.maps.policy import POLICY_MAP_MAX_ENTRIES, POLICY_MAP_PREFIX, PolicyEntry, PolicyKey, PolicyRow
from labkit.net.ledger import Ledger, dir_lock, lab_dir
from labkit.policy.identity import IdentityAllocator
from labkit.policy.matchpattern import fqdn as _fqdn
from labkit.policy.matchpattern import sanitize as _sanitize
from labkit.policy.resolve import ENFORCEMENT_MODES, Endpoint, EndpointPolicy, Resolution, fqdn_selects, resolve
from labkit.policy.rules import Policy, parse_policies, policy_from_obj

__all__ = [
    "POLICIES_FILE",
    "FQDN_FILE",
    "OUTER_MAP",
    "policy_map_name",
    "enforcement_of",
    "verdict_log_filter",
    "PolicyStore",
    "PolicyMaps",
    "Policies",
    "EndpointRef",
    "read_policy_map",
    "entry_delta",
    "cidr_prefixes",
]

POLICIES_FILE = "policies.json"
#: The DNS proxy's cache (:class:`labkit.fqdn.cache.DnsCache` entries), beside policies.json.
FQDN_FILE = "fqdn.json"
#: The outer map (BPF_MAP_TYPE_HASH_OF_MAPS): __u32 endpoint id → the endpoint's policy map.
OUTER_MAP = "labkit_policy"
#: Endpoint id → the endpoint's policy verdict log filter (bpf/lib/maps_policy.h), when the datapath has it.
FILTER_MAP = "labkit_policy_filter"
#: Bytes of ``struct policy_entry`` the agent decides (proxy port, flags, auth type, pads); the rest
#: are the packet and byte counters the datapath adds to.
_DECIDED = 8


def policy_map_name(ep_id: int) -> str:
    """The pinned name of endpoint ``ep_id``'s policy map (pkg/bpf LocalMapName: ``"%s%05d"``)."""
    return f"{POLICY_MAP_PREFIX}{ep_id:05d}"


def verdict_log_filter(ep: EndpointPolicy) -> int:
    """The directions whose policy verdicts endpoint ``ep`` reports, as cilium-agent v1.16 computes its
    POLICY_VERDICT_LOG_FILTER (pkg/endpoint/bpf.go GetPolicyVerdictLogFilter): 0x1 with ingress enforced,
    0x2 with egress enforced (bpf/lib/policy_log.h tests the verdict's direction against it)."""
    return (0x1 if ep.ingress_enforced else 0) | (0x2 if ep.egress_enforced else 0)


def enforcement_of(config) -> tuple[str, bool]:
    """(enforcement mode, audit) of a lab's :class:`~labkit.config.DatapathConfig`; a datapath
    built without the ``policy``/``policy_audit`` options enforces as Cilium's default does."""
    mode = getattr(config, "policy", "default")
    if mode not in ENFORCEMENT_MODES:
        raise PolicyError(f"policy enforcement mode: expected one of {', '.join(ENFORCEMENT_MODES)}, got {mode!r}")
    return mode, bool(getattr(config, "policy_audit", False))


class PolicyStore:
    """``/run/labkit/<lab>/policies.json``: the applied policies as their users wrote them (in order)
    and the ipcache prefixes the agent wrote for them."""

    def __init__(self, lab: str):
        self.lab = lab
        self.path = lab_dir(lab) / POLICIES_FILE

    def load(self) -> dict:
        """``{"policies": [object…], "ipcache": {prefix: identity}}`` (both empty when none was saved)."""
        try:
            with dir_lock(self.lab, shared=True):
                data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"policies": [], "ipcache": {}}
        except ValueError as exc:
            raise PolicyError(f"lab '{self.lab}': policy repository {self.path} is unreadable ({exc}); expected "
                              f"a JSON object {{policies, ipcache}}") from None
        return {"policies": list(data.get("policies", [])), "ipcache": dict(data.get("ipcache", {}))}

    def save(self, policies: list[dict], ipcache: Mapping[str, int]) -> None:
        with dir_lock(self.lab):
            if not self.path.exists():
                Ledger(self.lab).record("file", path=str(self.path))
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"policies": policies, "ipcache": dict(ipcache)}, indent=1))
            os.replace(tmp, self.path)


@dataclass(frozen=True)
class EndpointRef:
    """Where one pod's policy lives: its node, endpoint id (cilium_lxc's), and policy view."""

    pod: str
    node: str
    ep_id: int
    endpoint: Endpoint


def _pod_endpoint_ids(pin_dirs: Mapping[str, str]) -> dict[str, int]:
    """``{pod address: endpoint id}`` from every node's cilium_lxc."""
    out = {}
    for pin_dir in pin_dirs.values():
        with PinnedMap(f"{pin_dir}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
            for key, info in lxc.items():
                out[key.ip] = info.lxc_id
    return out


def entry_delta(have: Mapping[bytes, bytes], want: Mapping[PolicyKey, PolicyEntry]
                ) -> tuple[list[tuple[PolicyKey, PolicyEntry, str]], list[PolicyKey]]:
    """What turns a map holding ``have`` (raw key → raw value) into one holding ``want``: the keys to write
    (``"added"``, or ``"changed"`` when the value differs in what the agent decides, not in the counters the
    datapath adds to) and the keys to delete.

    >>> k = PolicyKey.make(256, 0)
    >>> entry_delta({}, {k: PolicyEntry.allow(k)})[0][0][2], entry_delta({bytes(k): bytes(PolicyEntry.allow(k))}, {})[1]
    ('added', [PolicyKey(Ingress: 256 ANY)])
    """
    writes = []
    for k, v in want.items():
        old = have.get(bytes(k))
        if old is None or old[:_DECIDED] != bytes(v)[:_DECIDED]:
            writes.append((k, v, "added" if old is None else "changed"))
    wanted = {bytes(k) for k in want}
    deletes = [PolicyKey.from_bytes(raw) for raw in sorted(have) if raw not in wanted]
    return writes, deletes


def cidr_prefixes(policies: Iterable[Policy], alloc: IdentityAllocator, own: Iterable[str] = ()) -> dict[str, int]:
    """``{prefix: CIDR identity}`` the ipcache needs for ``policies``: every CIDR rule's prefix and its
    ``except`` prefixes (a packet to an excepted address must find the except's identity, not the wider
    prefix's), allocated in ``alloc``; not the default route (``reserved:world``'s entry) nor the lab's own
    addresses ``own`` (a pod's or node's entry says more than a CIDR identity).

    >>> from labkit.policy.rules import parse_policies
    >>> pols = parse_policies('''
    ... apiVersion: cilium.io/v2
    ... kind: CiliumNetworkPolicy
    ... metadata: {name: out}
    ... spec:
    ...   endpointSelector: {}
    ...   egress: [{toCIDRSet: [{cidr: 203.0.113.0/24, except: [203.0.113.8/29]}]}, {toCIDR: [0.0.0.0/0]}]
    ... ''')
    >>> cidr_prefixes(pols, IdentityAllocator())
    {'203.0.113.0/24': 16777217, '203.0.113.8/29': 16777218}
    """
    own = set(own)
    out = {}
    for pol in policies:
        for rule in pol.rules:
            for pr in rule.ingress + rule.egress:
                for c in pr.cidrs or ():
                    for prefix in (c.cidr, *c.except_):
                        net = ipaddress.ip_network(prefix)
                        if net.version == 4 and net.prefixlen and str(net) not in own:
                            out[str(net)] = alloc.allocate_cidr(str(net))
    return out


class PolicyMaps:
    """One node's policy maps: create, pin, fill with the difference, remove."""

    def __init__(self, lab: str, node: str, pin_dir: str):
        self.lab, self.node, self.pin_dir = lab, node, pin_dir

    def path(self, ep_id: int) -> str:
        return f"{self.pin_dir}/{policy_map_name(ep_id)}"

    def outer_path(self) -> str:
        return f"{self.pin_dir}/{OUTER_MAP}"

    def exists(self, ep_id: int) -> bool:
        return os.path.lexists(self.path(ep_id))

    def write_filter(self, ep_id: int, value: int) -> None:
        """Endpoint ``ep_id``'s policy verdict log filter (:func:`verdict_log_filter`), when the datapath
        has the map (one built before it existed reports every direction)."""
        path = f"{self.pin_dir}/{FILTER_MAP}"
        if os.path.lexists(path):
            with PinnedMap(path, ctypes.c_uint32, ctypes.c_uint32) as m:
                have = m.get(ctypes.c_uint32(ep_id))
                if have is None or have.value != value:
                    m[ctypes.c_uint32(ep_id)] = ctypes.c_uint32(value)

    def _create(self, ep_id: int) -> None:
        path = self.path(ep_id)
        ledger = Ledger(self.lab)
        if not any(e.get("path") == path for e in ledger.entries("pin")):
            ledger.record("pin", path=path)  # in the ledger before it exists: `down` removes it
        try:
            fd = _bpf.map_create(_bpf.BPF_MAP_TYPE_LPM_TRIE, ctypes.sizeof(PolicyKey), ctypes.sizeof(PolicyEntry),
                                 POLICY_MAP_MAX_ENTRIES, policy_map_name(ep_id), flags=_bpf.BPF_F_NO_PREALLOC)
        except OSError as exc:
            raise DatapathError(f"node '{self.node}': policy map {path}: expected the kernel to create an LPM trie "
                                f"of {POLICY_MAP_MAX_ENTRIES} entries, got {exc.strerror}") from None
        try:
            _bpf.obj_pin(fd, path)
        except OSError as exc:
            raise DatapathError(f"node '{self.node}': cannot pin policy map {path} ({exc.strerror})") from None
        finally:
            os.close(fd)

    def write(self, ep_id: int, entries: Mapping[PolicyKey, PolicyEntry]) -> dict[str, int]:
        """Make endpoint ``ep_id``'s map hold exactly ``entries`` (counters of kept keys untouched), then
        make sure the outer map points at it. Returns ``{created, added, changed, deleted}``."""
        created = not self.exists(ep_id)
        if created:
            self._create(ep_id)
        counts = {"created": int(created), "added": 0, "changed": 0, "deleted": 0}
        with PinnedMap(self.path(ep_id), PolicyKey, PolicyEntry) as m:
            writes, deletes = entry_delta({bytes(k): bytes(v) for k, v in m.items_per_key()}, entries)
            for k, v, kind in writes:  # adds and changes first: an allowed flow never loses its key
                m[k] = v
                counts[kind] += 1
            for k in deletes:
                m.delete(k)
                counts["deleted"] += 1
            self._link(ep_id, m.fd)
        return counts

    def _link(self, ep_id: int, inner_fd: int) -> None:
        """Outer map entry ep_id → the inner map, when the datapath has an outer map."""
        if not os.path.lexists(self.outer_path()):
            return
        inner_id = _bpf.map_info(inner_fd).id
        with PinnedMap(self.outer_path(), ctypes.c_uint32, ctypes.c_uint32) as outer:
            have = outer.get(ctypes.c_uint32(ep_id))  # a lookup answers the inner map's id
            if have is None or have.value != inner_id:
                outer[ctypes.c_uint32(ep_id)] = ctypes.c_uint32(inner_fd)  # an update takes its fd

    def remove(self, ep_id: int) -> bool:
        """Unlink endpoint ``ep_id`` from the outer map and unpin its map; False when it had none."""
        if os.path.lexists(self.outer_path()):
            with PinnedMap(self.outer_path(), ctypes.c_uint32, ctypes.c_uint32) as outer:
                outer.delete(ctypes.c_uint32(ep_id))
        if os.path.lexists(f"{self.pin_dir}/{FILTER_MAP}"):
            with PinnedMap(f"{self.pin_dir}/{FILTER_MAP}", ctypes.c_uint32, ctypes.c_uint32) as m:
                m.delete(ctypes.c_uint32(ep_id))
        if not self.exists(ep_id):
            return False
        os.unlink(self.path(ep_id))
        return True

    def pinned(self) -> list[int]:
        """Endpoint ids whose policy map is pinned on this node."""
        out = []
        for name in os.listdir(self.pin_dir):
            tail = name[len(POLICY_MAP_PREFIX):]
            if name.startswith(POLICY_MAP_PREFIX) and tail.isdigit():
                out.append(int(tail))
        return sorted(out)


def read_policy_map(path: str) -> list[PolicyRow]:
    """The rows of a pinned policy map, as ``bpftool map dump pinned PATH`` reads them."""
    with PinnedMap(path, PolicyKey, PolicyEntry) as m:
        return [PolicyRow(k, v) for k, v in m.items_per_key()]


def _documents(text: str) -> list[dict]:
    """The objects of a YAML (several documents) or JSON text that parse_policies accepted."""
    import yaml

    docs = [json.loads(text)] if text.lstrip().startswith("{") else list(yaml.safe_load_all(text))
    return [json.loads(json.dumps(d)) for d in docs if d is not None]


def _key_of(obj: Any) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", "default"), meta["name"]


class Policies:
    """The repository and the maps of one lab, driven by the agent (one call at a time).

    ``view`` is the agent's view of the lab (:class:`labkit.agent.daemon.AgentView`: ``name``,
    ``topology``, ``config``, ``pin_dirs``)."""

    def __init__(self, view):
        self.view = view
        self.store = PolicyStore(view.name)
        self.identities = IdentityStore(view.name)
        self.mode, self.audit = enforcement_of(view.config)
        data = self.store.load()
        self.objects: list[dict] = data["policies"]
        self.ipcache: dict[str, int] = {k: int(v) for k, v in data["ipcache"].items()}
        self.fqdn_path = lab_dir(view.name) / FQDN_FILE
        try:
            self.dns = DnsCache(entries=json.loads(self.fqdn_path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            self.dns = DnsCache()

    def _now(self) -> int:
        clock = getattr(self.view, "clock", None)
        if clock is None:
            from labkit.clock import mono_seconds

            return mono_seconds()
        return clock.now()

    def _save_dns(self) -> None:
        with dir_lock(self.view.name):
            if not self.fqdn_path.exists():
                Ledger(self.view.name).record("file", path=str(self.fqdn_path))
            tmp = self.fqdn_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.dns.to_json(), indent=1))
            os.replace(tmp, self.fqdn_path)

    # -- reading -----------------------------------------------------------------------
    def parsed(self, objects: Iterable[dict] | None = None) -> list[Policy]:
        return [policy_from_obj(o, f"policy {_key_of(o)[1]!r}") for o in (self.objects if objects is None else objects)]

    def list(self) -> list[dict]:
        """Every policy: name, namespace, how many rules, the pods it selects, and the object itself."""
        res, _ = self._resolve(self.objects, self.identities.load())
        out = []
        for obj, pol in zip(self.objects, self.parsed()):
            pods = sorted({name for name, ep in res.endpoints.items()
                           if any(s.startswith(f"{pol.name}/") for s in ep.selected_by)})
            out.append({"name": pol.name, "namespace": pol.namespace, "rules": len(pol.rules), "selects": pods,
                        "object": obj})
        return out

    def endpoints(self) -> list[EndpointRef]:
        """Every pod as an endpoint: labels, identity (the allocator's), its endpoint id on its node."""
        ids = _pod_endpoint_ids(self.view.pin_dirs)
        topo, _ = assign(self.view.topology, self.identities.load())
        return [EndpointRef(p.name, p.node, ids[p.ip], Endpoint(p.name, labels_of(p), p.identity, p.ip))
                for p in topo.pods if p.ip in ids]

    def _resolve(self, objects: list[dict], alloc: IdentityAllocator) -> tuple[Resolution, IdentityAllocator]:
        eps = self.endpoints()
        return resolve([e.endpoint for e in eps], self.parsed(objects), alloc, enforcement=self.mode,
                       fqdn_cache=self.dns.names_to_ips(self._now())), alloc

    # -- changing ----------------------------------------------------------------------
    def apply(self, source: str | Mapping | list, where: str = "") -> dict:
        """Add or replace (same namespace and name) the policies of ``source`` (YAML/JSON text, one object,
        or a list of objects), then write every endpoint's difference. Nothing is written when any of them
        is malformed or has a selector that selects nothing."""
        if isinstance(source, str):
            parse_policies(source, where)  # every document checked, names distinct
            new = _documents(source)
        else:
            items = [source] if isinstance(source, Mapping) else list(source)
            if not items:
                raise PolicyError(f"{where or 'policy'}: expected at least one CiliumNetworkPolicy, got none")
            for i, o in enumerate(items):
                policy_from_obj(o, where or (f"policy {i + 1}" if len(items) > 1 else ""))
            new = [json.loads(json.dumps(o)) for o in items]
        keys = [_key_of(o) for o in new]
        dups = sorted({f"{ns}/{n}" for ns, n in keys if keys.count((ns, n)) > 1})
        if dups:
            raise PolicyError(f"{where or 'policy'}: expected distinct policy names, got {', '.join(dups)} more than once")
        objects = [o for o in self.objects if _key_of(o) not in keys] + new
        replaced = [f"{ns}/{n}" for ns, n in keys if any(_key_of(o) == (ns, n) for o in self.objects)]
        report = self._commit(objects, {n for _, n in keys})
        report.update(applied=[f"{ns}/{n}" for ns, n in keys], replaced=replaced)
        return report

    def delete(self, name: str, namespace: str = "default") -> dict:
        """Remove policy ``namespace/name`` and write every endpoint's difference."""
        if not any(_key_of(o) == (namespace, name) for o in self.objects):
            have = ", ".join(f"{ns}/{n}" for ns, n in map(_key_of, self.objects)) or "none"
            raise NotFoundError(f"policy '{namespace}/{name}' not found in lab '{self.view.name}' (policies: {have})")
        report = self._commit([o for o in self.objects if _key_of(o) != (namespace, name)], set())
        report["deleted"] = [f"{namespace}/{name}"]
        return report

    def flush(self) -> dict:
        """Remove every policy (``lab.reset()``): every endpoint's map and CIDR ipcache entry goes, and the DNS
        cache is emptied (the reset lab clock would otherwise keep old answers alive longer)."""
        if self.dns.entries:
            self.dns.entries = []
            self._save_dns()
        if not self.objects and not self.ipcache and not any(
                PolicyMaps(self.view.name, n, d).pinned() for n, d in self.view.pin_dirs.items()):
            return {"endpoints": {}, "removed": [], "ipcache": {"added": [], "deleted": []}, "warnings": [],
                    "deleted": []}
        deleted = [f"{ns}/{n}" for ns, n in map(_key_of, self.objects)]
        report = self._commit([], set())
        report["deleted"] = deleted
        return report

    def sync(self) -> dict:
        """Write what the repository calls for (a new agent's restore, or a changed topology)."""
        return self._commit(list(self.objects), set())

    def _commit(self, objects: list[dict], checked: set[str]) -> dict:
        saved = self.identities.load()
        alloc = IdentityAllocator(previous=saved.snapshot())  # a copy: nothing allocated if this fails
        res, alloc = self._resolve(objects, alloc)
        empty = [w for w in res.warnings if w.split(":", 1)[0] in checked]
        if empty:
            raise PolicyError(f"lab '{self.view.name}': expected every selector to select something, got: "
                              f"{'; '.join(empty)} (nothing written)")
        topo = self.view.topology
        own = [f"{p.ip}/32" for p in topo.pods] + [f"{n.ip}/32" for n in topo.nodes]
        ipcache = cidr_prefixes(self.parsed(objects), alloc, own)
        for ip, ident in res.fqdn_ids.items():  # the DNS proxy's learnt addresses (never a lab address)
            if f"{ip}/32" not in own:
                ipcache[f"{ip}/32"] = ident
        if alloc.snapshot() != saved.snapshot():
            self.identities.save(alloc)
        report = self._write(res, ipcache)
        self.objects, self.ipcache = objects, ipcache
        self.store.save(objects, ipcache)
        report["warnings"] = res.warnings
        if self.mode == "never" and objects:
            report["warnings"].append(f"lab '{self.view.name}' enforces no policy (policy mode never): the policies "
                                      f"are kept but no endpoint gets a policy map; `labkit --lab {self.view.name} "
                                      f"up --policy-mode default` builds a lab that enforces them")
        return report

    def _write(self, res: Resolution, ipcache: Mapping[str, int]) -> dict:
        """Every node's maps made to hold what ``res`` calls for; returns what was written."""
        eps = {e.pod: e for e in self.endpoints()}
        report: dict = {"endpoints": {}, "removed": [], "ipcache": {"added": [], "deleted": []}}
        for node, pin_dir in self.view.pin_dirs.items():
            maps = PolicyMaps(self.view.name, node, pin_dir)
            wanted = {}
            for name, ref in eps.items():
                ep: EndpointPolicy = res.endpoints[name]
                if ref.node == node and (ep.ingress_enforced or ep.egress_enforced):
                    wanted[ref.ep_id] = (name, ep)
            # break-it fault (lab 11): the addresses keep their FQDN identity, the endpoints get no key for it
            no_fqdn = set(res.fqdn_ids.values()) if "fqdn-no-policy-key" in self.view.agent_faults() else set()
            for ep_id, (name, ep) in sorted(wanted.items()):
                entries = {k: v for k, v in ep.entries().items() if k.sec_label not in no_fqdn}
                maps.write_filter(ep_id, verdict_log_filter(ep))  # before the map is linked: no verdict unfiltered
                report["endpoints"][name] = maps.write(ep_id, entries)
            for ep_id in maps.pinned():
                if ep_id not in wanted and maps.remove(ep_id):
                    report["removed"].append(f"{node}/{policy_map_name(ep_id)}")
            with PinnedMap(f"{pin_dir}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as ipc:
                for prefix, ident in ipcache.items():
                    net = ipaddress.ip_network(prefix)
                    key = IpcacheKey.for_ip(str(net.network_address), net.prefixlen)
                    have = ipc.get(key)
                    if have is None or have.sec_identity != ident:
                        ipc[key] = RemoteEndpointInfo.make(ident)
                        report["ipcache"]["added"].append(f"{node}/{prefix}")
                for prefix in set(self.ipcache) - set(ipcache):
                    net = ipaddress.ip_network(prefix)
                    if ipc.delete(IpcacheKey.for_ip(str(net.network_address), net.prefixlen)):
                        report["ipcache"]["deleted"].append(f"{node}/{prefix}")
        return report

    # -- the DNS proxy -----------------------------------------------------------------------
    def dns_endpoint(self, ip: str) -> EndpointRef | None:
        """The endpoint whose address is ``ip`` (a DNS query's source), None for anything else."""
        return next((e for e in self.endpoints() if e.endpoint.ip == ip), None)

    def dns_allowed(self, ref: EndpointRef, name: str, dport: int) -> bool:
        """Whether an egress ``toPorts`` item with ``rules.dns`` of a policy selecting ``ref`` allows a query for
        ``name`` to port ``dport`` (pkg/fqdn/dnsproxy proxy.go CheckAllowed: the endpoint's DNS rules for the
        destination port, matchName exact and matchPattern by its regex). CheckAllowed also requires the rule's
        L3 selector to select the server's identity; labkit does not check that again here (the query reached
        the proxy only through a policy key for that server), so two DNS rules for two different servers would
        share their names."""
        name = _fqdn(name)
        # break-it fault (lab 11): '*' as a shell glob, crossing dots (fnmatch), where v1.16 stays in one label
        selects = _glob_selects if "dns-star-crosses-dots" in self.view.agent_faults() else fqdn_selects
        for pol in self.parsed():
            for rule in pol.rules:
                if not rule.endpoint_selector.matches(ref.endpoint.labels):
                    continue
                for pr in rule.egress:
                    for pp in pr.ports:
                        if pp.dns is None or pp.protocol not in ("UDP", "ANY"):
                            continue
                        if pp.port and not pp.port <= dport <= (pp.end_port or pp.port):
                            continue
                        if any(selects(sel, name) for sel in pp.dns):
                            return True
        return False

    def learn_dns(self, ref: EndpointRef, name: str, answers: list[tuple[str, int]]) -> dict:
        """An allowed answer's A records into the cache; when that changes what a name maps to, every
        endpoint's policy map and the ipcache are written again before this returns (what the proxy waits for
        before it releases the answer: daemon/cmd/fqdn.go notifyOnDNSMsg → UpdateGenerateDNS, then the
        wait on the endpoints' regeneration)."""
        ips = [ip for ip, _ in answers]
        ttl = min((t for _, t in answers), default=0)
        if not self.dns.update(ref.ep_id, name, ips, ttl, self._now()):
            self._save_dns()
            return {"changed": False}
        self._save_dns()
        report = self._commit(list(self.objects), set())
        report["changed"] = True
        return report

    def expire_dns(self) -> list[dict]:
        """Drop the cache entries whose TTL ran out on the lab clock; when any went, write the maps again
        without their addresses (Cilium's DNS GC, pkg/fqdn/namemanager/gc.go, every DNSGCJobInterval = 1 minute)."""
        gone = self.dns.expire(self._now())
        if gone:
            self._save_dns()
            self._commit(list(self.objects), set())
        return [e.to_json() for e in gone]

    # -- what a pod's map holds ------------------------------------------------------------
    def endpoint_policy(self, pod: str) -> dict:
        """Pod ``pod``'s resolved policy: enforcement, the policies selecting it, its rows as text."""
        eps = {e.pod: e for e in self.endpoints()}
        if pod not in eps:
            raise NotFoundError(f"pod '{pod}' is not an endpoint of lab '{self.view.name}' "
                                f"(endpoints: {', '.join(sorted(eps)) or 'none'})")
        alloc = self.identities.load()
        res, alloc = self._resolve(self.objects, IdentityAllocator(previous=alloc.snapshot()))
        ep = res.endpoints[pod]
        ref = eps[pod]
        return {"pod": pod, "node": ref.node, "endpoint_id": ref.ep_id, "identity": ref.endpoint.identity,
                "ingress_enforced": ep.ingress_enforced, "egress_enforced": ep.egress_enforced,
                "selected_by": ep.selected_by, "lines": ep.lines(alloc),
                "path": PolicyMaps(self.view.name, ref.node, self.view.pin_dir(ref.node)).path(ref.ep_id)}


def _glob_selects(sel, name: str) -> bool:
    """The ``dns-star-crosses-dots`` fault's matching: matchName exactly, matchPattern as an fnmatch glob."""
    if sel.match_name:
        return fqdn_selects(sel, name)
    return fnmatch.fnmatchcase(name, _sanitize(sel.match_pattern))
