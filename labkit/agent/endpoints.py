"""The control plane: what the cilium-agent would write into each node's maps.

The BPF programs never ask user space anything; every decision they make
comes from these maps. For the foundation that is:

- ``cilium_lxc`` — the node's own pods: host veth, endpoint id, MACs, identity;
- ``cilium_ipcache`` — every pod, node and the world: identity, and in
  tunnel mode the underlay address of the node that hosts the pod.

Services (``cilium_lb4_*``) are written by :mod:`labkit.agent.services`, the other half of the agent.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.maps.base import PinnedMap
from labkit.maps.eps import (
    IDENTITY_HOST,
    IDENTITY_REMOTE_NODE,
    IDENTITY_WORLD,
    EndpointInfo,
    EndpointKey,
    IpcacheKey,
    RemoteEndpointInfo,
)
from labkit.net.topology import Topology

if TYPE_CHECKING:  # net.build drives pyroute2, which `labkit ct list` never loads
    from labkit.net.build import EndpointFacts

__all__ = ["ipcache_entries", "program_node"]


def ipcache_entries(topo: Topology, node: str, routing: str) -> list[tuple[IpcacheKey, RemoteEndpointInfo]]:
    """The ipcache of ``node``: world, every node, every pod.

    >>> t = Topology.default()
    >>> [str(v) for k, v in ipcache_entries(t, "node-a", "tunnel") if str(k) == "198.18.2.11/32"]
    ['identity=258 tunnelendpoint=198.51.100.12 flags=0x02']
    """
    entries = [(IpcacheKey.for_ip("0.0.0.0", 0), RemoteEndpointInfo.make(IDENTITY_WORLD))]
    for n in topo.nodes:
        identity = IDENTITY_HOST if n.name == node else IDENTITY_REMOTE_NODE
        entries.append((IpcacheKey.for_ip(n.ip), RemoteEndpointInfo.make(identity)))
    for p in topo.pods:
        if p.node == node:
            info = RemoteEndpointInfo.make(p.identity)
        elif routing == "tunnel":
            info = RemoteEndpointInfo.make(p.identity, tunnel_endpoint=topo.node(p.node).ip)
        else:
            info = RemoteEndpointInfo.make(p.identity, skip_tunnel=True)
        entries.append((IpcacheKey.for_ip(p.ip), info))
    return entries


def program_node(topo: Topology, node: str, routing: str, pin_dir: str, endpoints: list[EndpointFacts]) -> None:
    """Write ``node``'s endpoint map and ipcache (a lab's first agent sync)."""
    with PinnedMap(f"{pin_dir}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
        for ep in endpoints:
            pod = topo.pod(ep.pod)
            lxc[EndpointKey.for_ip(pod.ip)] = EndpointInfo.make(
                ep.ifindex, ep.lxc_id, ep.mac, ep.node_mac, pod.identity
            )
    with PinnedMap(f"{pin_dir}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as ipcache:
        for key, info in ipcache_entries(topo, node, routing):
            ipcache[key] = info
