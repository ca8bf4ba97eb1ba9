"""Services: the part of the cilium-agent that turns a Kubernetes Service into
rows of every node's ``cilium_lb4_*`` maps.

A ClusterIP service is a frontend (VIP, port, protocol) and its backends
(pod, port). For each one, on every node, the agent writes (layouts in
:mod:`labkit.maps.lb`):

- ``cilium_lb4_backends_v3``: backend id → pod address, port, state;
- ``cilium_lb4_services_v2``: slots 1..n → backend ids (active first, then the
  terminating ones, which the random pick never reaches), and slot 0, the head:
  how many are active, the service id (``rev_nat_index``), flags;
- ``cilium_lb4_reverse_nat``: service id → VIP:port, to rewrite replies.

The datapath reads these while the agent writes them, so the order matters:
a growing service gets its backends, then its slots, then reverse NAT and its
head **last**; a shrinking one gets its head (the new count) **first**, then
slots, then loses the backends nothing uses any more. A packet never sees a
count that points at a slot not yet written.

A NodePort service is its ClusterIP frontend plus one frontend per node address,
``nodeIP:nodePort`` (flags NODEPORT and ROUTABLE), of which each node's maps hold only its
own, and the surrogate ``0.0.0.0:nodePort`` (NODEPORT, non-routable) that every node's maps
hold for socket LB's wildcard lookup; a LoadBalancer one is a NodePort
plus ``lbVIP:port`` from 203.0.113.0/24 (LOADBALANCER, ROUTABLE). As in Cilium,
every frontend has its own head and slots, its own service id and reverse NAT
entry (back to that frontend's address:port), and they all share the backends.
The write order above holds across all of a service's frontends at once.

What the agent writes depends on the Cilium release the lab reproduces (``lab.config.cilium``,
:mod:`labkit.release`): v1.16's agent writes protocol 0 in every service key and backend, so
one VIP:port holds one service whatever its protocol (two that differ only in protocol are
refused), and names Maglev backends ``ip:port``; 1.17+ writes the protocol
(cilium/cilium#33434) and 1.18+ hashes ``[ip:port/TCP,State:active]``
(:func:`labkit.maglev.backend_name`). Maglev tables are Cilium's: the lab's table size
(16381 by default) and the seed of ``--bpf-lb-maglev-hash-seed``'s default.

Service ids (1, 2, ...; one per frontend) and backend ids are allocated per lab, the same on
every node; a backend id belongs to one address:port/protocol and is shared by
every service that uses it (as in Cilium), and freed when the last one stops.
The agent keeps its services in memory with indexes (by name, frontend, backend, id;
:mod:`labkit.agent.services.ids`), so a change computes and writes only the rows of the
service it touches, whatever the number of services. Every process attached to the lab sees
the same ones: they live in ``/run/labkit/<lab>/services.json`` (a snapshot) and
``services.journal`` (one line per change since; :mod:`labkit.agent.services.store`), and an
agent replays the lines another process added before its next call. On a running lab one
process does it all: the lab's agent (:mod:`labkit.agent.daemon`); ``lab.services`` is its client.

The class is :mod:`labkit.agent.services.core`'s; this package names its parts without
importing them until they are used, so a command that only needs the names stays quick.

Without a kernel, the same agent writes into dictionaries::

    >>> from labkit.agent.services import Services
    >>> from labkit.net.topology import Topology
    >>> svcs = Services.in_memory(Topology.default())
    >>> web = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    >>> web.frontend, web.id, [str(b) for b in web.backends]
    ('198.19.0.10:80/TCP', 1, ['b1:8080', 'b2:8080'])
    >>> for line in svcs.lb("node-a").lines():  # `cilium service list` on v1.16 (its lines end in spaces)
    ...     print(line.rstrip())
    ID   Frontend         Service Type   Backend
    1    198.19.0.10:80   ClusterIP      1 => 198.18.2.11:8080 (active)
                                         2 => 198.18.2.12:8080 (active)
    >>> svcs.maps.ops[:6]  # node-a, in the order written; v1.16 keys carry protocol 0 (ANY)
    ['update node-a cilium_lb4_backends_v3 backend 1', 'update node-a cilium_lb4_backends_v3 backend 2', 'update node-a cilium_lb4_services_v2 198.19.0.10:80/ANY slot 1', 'update node-a cilium_lb4_services_v2 198.19.0.10:80/ANY slot 2', 'update node-a cilium_lb4_reverse_nat rev_nat 1', 'update node-a cilium_lb4_services_v2 198.19.0.10:80/ANY slot 0']

On a running lab the same calls are ``lab.services.add(...)``, and
``labkit service add web --port 80 --backend b1:8080 --backend b2:8080``.
"""
from __future__ import annotations

import importlib

#: name → the module of this package that defines it
_PARTS = {
    "Services": "core", "Backend": "model", "Frontend": "model", "Service": "model", "FIRST_VIP": "model",
    "FIRST_LB_VIP": "model", "NODE_PORT_RANGE": "model", "SERVICE_TYPES": "model", "STATES": "model",
    "TRAFFIC_POLICIES": "model", "ALGORITHMS": "model", "PROTOCOLS": "model", "MapWriter": "lbmaps",
    "PinnedMaps": "lbmaps", "MemoryMaps": "lbmaps", "LbMapsWriter": "lbmaps", "IptablesWriter": "iptables",
    "ServiceStore": "store", "JsonStore": "store", "MemoryStore": "store",
}

__all__ = ["Services", "Backend", "Frontend", "Service", "MapWriter", "PinnedMaps", "MemoryMaps", "LbMapsWriter",
           "IptablesWriter", "ServiceStore", "JsonStore", "MemoryStore", "FIRST_VIP", "FIRST_LB_VIP",
           "NODE_PORT_RANGE", "SERVICE_TYPES", "STATES", "TRAFFIC_POLICIES", "ALGORITHMS"]


def __getattr__(name: str):
    if name in _PARTS:
        value = getattr(importlib.import_module(f"{__name__}.{_PARTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
