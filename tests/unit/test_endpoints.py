"""The agent's ipcache for a node, in tunnel and native routing."""
from __future__ import annotations

import socket

import pytest

from labkit.agent.endpoints import ipcache_entries
from labkit.maps.eps import IPCACHE_F_HAS_TUNNEL_EP, IPCACHE_F_SKIP_TUNNEL
from labkit.net.topology import Topology

# Cilium's reserved identities.
HOST, WORLD, REMOTE_NODE = 1, 2, 6


@pytest.fixture
def topo() -> Topology:
    return Topology.default("demo")


def _table(entries) -> dict[str, tuple[int, str, int]]:
    """``{cidr: (identity, tunnel endpoint, flags)}`` decoded from raw bytes."""
    out = {}
    for key, value in entries:
        kb = bytes(key)
        prefixlen = int.from_bytes(kb[0:4], "little")
        assert kb[7] == 1  # family ENDPOINT_KEY_IPV4
        cidr = f"{socket.inet_ntoa(kb[8:12])}/{prefixlen - 32}"
        vb = bytes(value)
        out[cidr] = (int.from_bytes(vb[0:4], "little"), socket.inet_ntoa(vb[4:8]), vb[11])
    assert len(out) == len(entries), "duplicate ipcache keys"
    return out


def test_tunnel_node_a(topo):
    """Tunnel mode on node-a: world/0 is identity 2, node-a host (1), node-b remote-node (6); node-b's pods tunnel to 198.51.100.12."""
    t = _table(ipcache_entries(topo, "node-a", "tunnel"))
    ids = {p.name: p.identity for p in topo.pods}
    assert t == {
        "0.0.0.0/0": (WORLD, "0.0.0.0", 0),
        "198.51.100.11/32": (HOST, "0.0.0.0", 0),
        "198.51.100.12/32": (REMOTE_NODE, "0.0.0.0", 0),
        "198.18.1.11/32": (ids["a1"], "0.0.0.0", 0),
        "198.18.1.12/32": (ids["a2"], "0.0.0.0", 0),
        "198.18.2.11/32": (ids["b1"], "198.51.100.12", IPCACHE_F_HAS_TUNNEL_EP),
        "198.18.2.12/32": (ids["b2"], "198.51.100.12", IPCACHE_F_HAS_TUNNEL_EP),
    }


def test_tunnel_node_b_mirrors(topo):
    """On node-b the roles swap: node-a's pods tunnel to 198.51.100.11, node-b is the host."""
    t = _table(ipcache_entries(topo, "node-b", "tunnel"))
    assert t["198.18.1.11/32"][1:] == ("198.51.100.11", IPCACHE_F_HAS_TUNNEL_EP)
    assert t["198.18.2.11/32"][1:] == ("0.0.0.0", 0)
    assert t["198.51.100.12/32"][0] == HOST and t["198.51.100.11/32"][0] == REMOTE_NODE


def test_native_node_a(topo):
    """Native routing: remote pods carry skip_tunnel and no tunnel endpoint; local pods neither."""
    t = _table(ipcache_entries(topo, "node-a", "native"))
    assert t["198.18.2.11/32"][1:] == ("0.0.0.0", IPCACHE_F_SKIP_TUNNEL)
    assert t["198.18.2.12/32"][1:] == ("0.0.0.0", IPCACHE_F_SKIP_TUNNEL)
    assert t["198.18.1.11/32"][1:] == ("0.0.0.0", 0)
    assert t["0.0.0.0/0"] == (WORLD, "0.0.0.0", 0)
    assert not any(flags & IPCACHE_F_HAS_TUNNEL_EP for _, _, flags in t.values())


def test_world_entry_first(topo):
    """The world entry (the catch-all /0) is written first."""
    key, value = ipcache_entries(topo, "node-a", "tunnel")[0]
    assert (str(key), value.sec_identity) == ("0.0.0.0/0", WORLD)


def test_added_pod_appears(topo):
    """A pod added to node-b shows up in node-a's ipcache behind node-b's address."""
    t2 = topo.with_pod("b3", "node-b")
    t = _table(ipcache_entries(t2, "node-a", "tunnel"))
    b3 = t2.pod("b3")
    assert t[f"{b3.ip}/32"] == (b3.identity, "198.51.100.12", IPCACHE_F_HAS_TUNNEL_EP)
