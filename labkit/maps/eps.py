"""Endpoints and the IP cache: the maps through which the agent tells each
node's hooks which addresses are its pods and which node hosts the rest.

Keep in sync with bpf/lib/eps_types.h.

    >>> k = IpcacheKey.for_ip("198.18.2.11")
    >>> k.prefixlen, str(RemoteEndpointInfo.make(257, "198.51.100.12"))
    (64, 'identity=257 tunnelendpoint=198.51.100.12 flags=0x02')
"""
from __future__ import annotations

import ctypes

from labkit.addr import be32, ipv4

__all__ = [
    "EndpointKey",
    "EndpointInfo",
    "IpcacheKey",
    "RemoteEndpointInfo",
    "ENDPOINT_KEY_IPV4",
    "IDENTITY_HOST",
    "IDENTITY_WORLD",
    "IDENTITY_REMOTE_NODE",
    "IPCACHE_F_SKIP_TUNNEL",
    "IPCACHE_F_HAS_TUNNEL_EP",
]

ENDPOINT_KEY_IPV4 = 1
IDENTITY_HOST, IDENTITY_WORLD, IDENTITY_REMOTE_NODE = 1, 2, 6
IPCACHE_F_SKIP_TUNNEL, IPCACHE_F_HAS_TUNNEL_EP = 0x01, 0x02


def _mac_t(mac: str) -> int:
    """A MAC as Cilium's mac_t: the six bytes, in order, in the low end of a __u64."""
    return int.from_bytes(bytes(int(x, 16) for x in mac.split(":")) + b"\0\0", "little")


class EndpointKey(ctypes.LittleEndianStructure):
    """``struct endpoint_key`` (20 bytes): a local pod's address."""

    _pack_ = 1
    _fields_ = [
        ("ip4", ctypes.c_uint32),
        ("pad1", ctypes.c_uint32),
        ("pad2", ctypes.c_uint32),
        ("pad3", ctypes.c_uint32),
        ("family", ctypes.c_uint8),
        ("key", ctypes.c_uint8),
        ("cluster_id", ctypes.c_uint16),
    ]

    @classmethod
    def for_ip(cls, ip: str) -> "EndpointKey":
        """The key of a pod address."""
        return cls(ip4=be32(ip), family=ENDPOINT_KEY_IPV4)

    @property
    def ip(self) -> str:
        """Dotted address."""
        return ipv4(self.ip4)


class EndpointInfo(ctypes.LittleEndianStructure):
    """``struct endpoint_info`` (48 bytes): the pod's veth, id, MACs and identity."""

    _fields_ = [
        ("ifindex", ctypes.c_uint32),
        ("unused", ctypes.c_uint16),
        ("lxc_id", ctypes.c_uint16),
        ("flags", ctypes.c_uint32),
        ("mac", ctypes.c_uint64),
        ("node_mac", ctypes.c_uint64),
        ("sec_id", ctypes.c_uint32),
        ("pad", ctypes.c_uint32 * 3),
    ]

    @classmethod
    def make(cls, ifindex: int, lxc_id: int, mac: str, node_mac: str, sec_id: int) -> "EndpointInfo":
        """An entry for a pod whose host veth is ``ifindex``."""
        return cls(ifindex=ifindex, lxc_id=lxc_id, sec_id=sec_id, mac=_mac_t(mac), node_mac=_mac_t(node_mac))

    def __str__(self) -> str:
        mac = ":".join(f"{b:02x}" for b in self.mac.to_bytes(8, "little")[:6])
        return f"id={self.lxc_id} ifindex={self.ifindex} mac={mac} identity={self.sec_id}"


class IpcacheKey(ctypes.LittleEndianStructure):
    """``struct ipcache_key`` (24 bytes): an LPM key whose prefix counts the
    32 bits of cluster_id/pad/family plus the address prefix."""

    _pack_ = 1
    _fields_ = [
        ("prefixlen", ctypes.c_uint32),
        ("cluster_id", ctypes.c_uint16),
        ("pad1", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("ip4", ctypes.c_uint32),
        ("pad4", ctypes.c_uint32),
        ("pad5", ctypes.c_uint32),
        ("pad6", ctypes.c_uint32),
    ]

    @classmethod
    def for_ip(cls, ip: str, prefix: int = 32) -> "IpcacheKey":
        """The key of ``ip/prefix``."""
        return cls(prefixlen=32 + prefix, family=ENDPOINT_KEY_IPV4, ip4=be32(ip))

    def __str__(self) -> str:
        return f"{ipv4(self.ip4)}/{self.prefixlen - 32}"


class RemoteEndpointInfo(ctypes.LittleEndianStructure):
    """``struct remote_endpoint_info`` (12 bytes): identity and hosting node."""

    _fields_ = [
        ("sec_identity", ctypes.c_uint32),
        ("tunnel_endpoint", ctypes.c_uint32),
        ("pad", ctypes.c_uint16),
        ("key", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
    ]

    @classmethod
    def make(cls, identity: int, tunnel_endpoint: str | None = None, skip_tunnel: bool = False):
        """Identity, and the node to tunnel to (None for local addresses)."""
        flags = IPCACHE_F_SKIP_TUNNEL if skip_tunnel else 0
        if tunnel_endpoint:
            flags |= IPCACHE_F_HAS_TUNNEL_EP
        return cls(
            sec_identity=identity,
            tunnel_endpoint=be32(tunnel_endpoint) if tunnel_endpoint else 0,
            flags=flags,
        )

    def __str__(self) -> str:
        return (
            f"identity={self.sec_identity} tunnelendpoint={ipv4(self.tunnel_endpoint)} flags={self.flags:#04x}"
        )
