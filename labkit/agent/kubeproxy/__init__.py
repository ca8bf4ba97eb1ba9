"""kube-proxy's iptables mode, for comparison: the same Service objects as the eBPF
agent, written into each node's ``filter`` and ``nat`` tables the way kube-proxy's
iptables proxier writes them (kubernetes pkg/proxy/iptables/proxier.go, v1.34), and
Linux conntrack read back as rows.

A lab brought up with ``--service-mode iptables`` keeps its BPF programs for
pod-to-pod traffic (and their CT maps), but the agent writes no ``cilium_lb4_*``
entry: every Service lives in each node's iptables instead::

    nat  PREROUTING/OUTPUT -> KUBE-SERVICES -> KUBE-SVC-<hash>  (one rule per endpoint, -m statistic)
                                            -> KUBE-SEP-<hash>  (mark hairpin traffic, DNAT)
         KUBE-SERVICES (last rule, local addresses) -> KUBE-NODEPORTS -> KUBE-EXT-<hash>
              KUBE-EXT: mark for masquerade, then KUBE-SVC; with externalTrafficPolicy Local the
              pod/LOCAL short-circuits, then KUBE-SVL-<hash> (this node's endpoints only)
         POSTROUTING -> KUBE-POSTROUTING: marked packets are MASQUERADEd --random-fully
    filter KUBE-SERVICES (REJECT: no endpoints), KUBE-EXTERNAL-SERVICES (DROP: none on this node),
           KUBE-FORWARD, KUBE-NODEPORTS, KUBE-PROXY-FIREWALL, KUBE-FIREWALL; KUBE-PROXY-CANARY in all three

Modules: :mod:`.names` (chain names, marks, probabilities), :mod:`.endpoints` (which
endpoints a node uses), :mod:`.rules` (the restore input of one sync), :mod:`.sync`
(full and partial syncs, cleanup, the node's iptables), :mod:`.text` (iptables-save text as tables),
:mod:`.conntrack` (rows).

    >>> from labkit.agent.services import Services
    >>> from labkit.net.topology import Topology
    >>> svcs = Services.in_memory(Topology.default("demo"))
    >>> web = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    >>> text = nat_table(svcs.list(), Topology.default("demo"))
    >>> [l for l in text.splitlines() if "statistic" in l][0]  # doctest: +ELLIPSIS
    '-A KUBE-SVC-... -m comment --comment "default/web -> 198.18.2.11:8080" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-...'
"""
from __future__ import annotations

from labkit.errors import ConfigError
from labkit.agent.kubeproxy.conntrack import ConntrackRow, parse_conntrack
from labkit.agent.kubeproxy.endpoints import Endpoint, categorize, endpoints
from labkit.agent.kubeproxy.names import MASQ_MARK, SERVICE_MODES, ext_chain, port_name, probability, sep_chain, svc_chain, svl_chain
from labkit.agent.kubeproxy.rules import NodeOptions, Restore, render
from labkit.agent.kubeproxy.sync import (nat_table, partial_table, CANARY, JUMPS, KUBELET_JUMPS, Iptables, MemoryIptables,
                                         MemoryTables, NetnsIptables, cleanup, restore, restore_noflush, sync)
from labkit.agent.kubeproxy.text import chains_in, diff_tables, parse_tables

__all__ = ["SERVICE_MODES", "MASQ_MARK", "svc_chain", "svl_chain", "ext_chain", "sep_chain", "port_name",
           "probability", "Endpoint", "endpoints", "categorize", "NodeOptions", "Restore", "render", "nat_table",
           "partial_table", "restore_noflush",
           "CANARY", "JUMPS", "KUBELET_JUMPS", "Iptables", "MemoryIptables", "MemoryTables", "NetnsIptables",
           "chains_in", "parse_tables", "diff_tables", "sync", "cleanup", "restore", "check_service", "changed_services", "ConntrackRow",
           "parse_conntrack"]


def check_service(svc) -> None:
    """Refuse what kube-proxy's iptables mode cannot render, naming the service and the option.

    Maglev is a Cilium choice (``--bpf-lb-algorithm`` or the ``service.cilium.io/lb-algorithm`` annotation);
    kube-proxy's iptables mode has exactly one way to pick an endpoint, ``-m statistic --mode random``.
    A real kube-proxy would ignore the annotation; labkit refuses it rather than show a Maglev service
    that silently is not one.

    >>> from labkit.agent.services import Service
    >>> check_service(Service("web", "198.19.0.10", 80, algorithm="maglev"))
    Traceback (most recent call last):
    ...
    labkit.errors.ConfigError: service 'web': algorithm 'maglev' has no rendering in --service-mode iptables \
(kube-proxy picks an endpoint only with -m statistic --mode random); expected algorithm 'random'
    """
    if svc.algorithm != "random":
        raise ConfigError(f"service '{svc.name}': algorithm {svc.algorithm!r} has no rendering in --service-mode "
                          "iptables (kube-proxy picks an endpoint only with -m statistic --mode random); "
                          "expected algorithm 'random'")


def changed_services(old: dict, new: dict) -> set[str]:
    """Names of the services whose Service or endpoints differ between two ``name -> Service`` maps
    (kube-proxy's serviceUpdateResult and endpointUpdateResult ``UpdatedServices``)."""
    return {name for name in set(old) | set(new) if old.get(name) != new.get(name)}
