"""Compose one node's BPF translation unit: its options as macros, then the
attach-point files.

Cilium compiles every node's datapath on that node, with the node's options
written into ``node_config.h``; labkit does the same with ``-D`` macros, once
per node, so a node's programs and maps come from one compilation:

    >>> from labkit.net.topology import Topology
    >>> from labkit.config import DatapathConfig
    >>> topo = Topology.default("demo")
    >>> b = node_build(topo, DatapathConfig(), "node-a", vxlan_ifindex=7)
    >>> b.macros["NODE_ID"], b.macros["ROUTING_TUNNEL"], b.macros["CT_SYN_TIMEOUT"]
    (1, 1, 60)
    >>> [p.function for p in b.programs][:2]
    ['cil_from_container', 'cil_to_container']
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from labkit.addr import be32
from labkit.config import VXLAN_PORT, DatapathConfig
from labkit.errors import ConfigError
from labkit.maglev import FLOW_HASH_SEED
from labkit.net.topology import DEVICE_HOOKS, LOOPBACK_SNAT_ADDR, Topology

__all__ = ["BPF_DIR", "CGROUP_ATTACH", "SOCKMAP_ATTACH", "Program", "PROGRAMS", "NodeBuild", "node_build",
           "MAP_NAMES", "POLICY_MAP_NAMES", "SOCKMAP_MAP_NAMES"]

BPF_DIR = Path(os.environ.get("LABKIT_BPF_DIR") or Path(__file__).resolve().parents[2] / "bpf")

#: cgroup attach types (enum bpf_attach_type) of the socket programs, by their Program.direction.
CGROUP_ATTACH = {"connect4": 10, "sendmsg4": 14, "recvmsg4": 19, "getpeername4": 29}
#: Attach types (enum bpf_attach_type) of the socket-redirect programs: BPF_CGROUP_SOCK_OPS on the pods'
#: cgroups, BPF_SK_MSG_VERDICT on the sockhash.
SOCKMAP_ATTACH = {"sock_ops": 3, "sk_msg": 7}

#: Every map a node pins, by its Cilium (or labkit_) name.
MAP_NAMES = (
    "cilium_ct4_global",
    "cilium_ct_any4_global",
    "cilium_lxc",
    "cilium_ipcache",
    "cilium_lb4_services_v2",
    "cilium_lb4_backends_v3",
    "cilium_lb4_reverse_nat",
    "cilium_lb4_affinity",
    "cilium_lb_affinity_match",
    "cilium_lb4_reverse_sk",
    "cilium_lb4_maglev",
    "cilium_snat_v4_external",
    "labkit_config",
    "labkit_events",
    "labkit_events_lost",
)
#: The maps a node pins besides MAP_NAMES when policy is compiled in (ENABLE_POLICY, bpf/lib/maps_policy.h).
POLICY_MAP_NAMES = ("labkit_policy", "labkit_policy_filter")
#: The maps a node pins besides MAP_NAMES with socket-level redirect (ENABLE_SOCKMAP, bpf/lib/maps_sockops.h).
SOCKMAP_MAP_NAMES = ("cilium_sock_ops",)


@dataclass(frozen=True)
class Program:
    """One BPF function and where it attaches: device role and tc direction."""

    function: str
    source: str  #: the attach-point file that defines it
    #: 'lxc' (every pod veth), 'netdev' (eth0), 'overlay' (cilium_vxlan), 'xdp' (eth0's XDP), 'xdp-peer' (XDP on
    #: the fabric end of eth0's veth), 'cgroup' (socket LB's cgroups), 'pods' (the cgroup of every pod of the
    #: node) or 'sockmap' (the sockhash cilium_sock_ops)
    device: str
    #: tc: 'ingress' or 'egress'; cgroup: the attach type ('connect4', 'sendmsg4', ...); 'xdp'; pods and sockmap:
    #: a key of SOCKMAP_ATTACH
    direction: str
    hook: str  #: the name traces use

    @property
    def filter_name(self) -> str:
        """Name of the tc filter, as ``tc filter show`` prints it."""
        return f"labkit-{self.hook}"


_LXC, _NETDEV, _OVERLAY = DEVICE_HOOKS["lxc"], DEVICE_HOOKS["eth0"], DEVICE_HOOKS["cilium_vxlan"]

PROGRAMS = (
    Program("cil_from_container", "bpf_lxc.c", "lxc", "ingress", _LXC[0]),
    Program("cil_to_container", "bpf_lxc.c", "lxc", "egress", _LXC[1]),
    Program("cil_from_netdev", "bpf_host.c", "netdev", "ingress", _NETDEV[0]),
    Program("cil_to_netdev", "bpf_host.c", "netdev", "egress", _NETDEV[1]),
    Program("cil_from_overlay", "bpf_overlay.c", "overlay", "ingress", _OVERLAY[0]),
    Program("cil_to_overlay", "bpf_overlay.c", "overlay", "egress", _OVERLAY[1]),
    Program("cil_xdp_entry", "bpf_xdp.c", "xdp", "xdp", "xdp"),
    Program("lab_xdp_pass", "bpf_xdp.c", "xdp-peer", "xdp", "xdp-peer"),
    Program("cil_sock4_connect", "bpf_sock.c", "cgroup", "connect4", "sock4-connect"),
    Program("cil_sock4_sendmsg", "bpf_sock.c", "cgroup", "sendmsg4", "sock4-sendmsg"),
    Program("cil_sock4_recvmsg", "bpf_sock.c", "cgroup", "recvmsg4", "sock4-recvmsg"),
    Program("cil_sock4_getpeername", "bpf_sock.c", "cgroup", "getpeername4", "sock4-getpeername"),
    # sockmap "on" only; the sk_msg program first, so that it is on the map before any socket enters it
    Program("cil_redir", "bpf_redir.c", "sockmap", "sk_msg", "redir"),
    Program("cil_sockops", "bpf_sockops.c", "pods", "sock_ops", "sockops"),
)


@dataclass(frozen=True)
class NodeBuild:
    """Everything needed to compile and attach one node's datapath."""

    node: str
    macros: dict[str, int]
    programs: tuple[Program, ...]
    files: tuple[str, ...]

    def text(self) -> str:
        """The translation unit BCC compiles: a header comment, then the attach-point files."""
        lines = [f"/* labkit datapath for node {self.node}; options are -D macros: */"]
        lines += [f"/*   {k}={v} */" for k, v in sorted(self.macros.items())]
        seen: set[Path] = set()
        for name in self.files:
            lines += _expand(BPF_DIR / name, seen)
        return "\n".join(lines) + "\n"

    @property
    def map_names(self) -> tuple[str, ...]:
        """The maps this build pins: :data:`MAP_NAMES`, ``labkit_policy`` when policy is compiled in,
        ``cilium_sock_ops`` with socket-level redirect."""
        return (MAP_NAMES + (POLICY_MAP_NAMES if "ENABLE_POLICY" in self.macros else ())
                + (SOCKMAP_MAP_NAMES if "ENABLE_SOCKMAP" in self.macros else ()))

    def cflags(self) -> list[str]:
        """``-I`` for bpf/ and one ``-D`` per macro."""
        return [f"-I{BPF_DIR}"] + [f"-D{k}={v}" for k, v in sorted(self.macros.items())]


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def _expand(path: Path, seen: set[Path]) -> list[str]:
    """The file with its ``#include "..."`` lines replaced by the files, once each.

    BCC turns functions into programs, and ``map.lookup()`` calls into map
    accesses, only in its main file; so labkit pastes the attach-point files
    and their local headers into one text. ``#line`` keeps compiler messages
    pointing at the real file and line.
    """
    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    out = [f'#line 1 "{path}"']
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        m = _LOCAL_INCLUDE.match(line)
        if m:
            out += _expand(path.parent / m.group(1), seen)
            out.append(f'#line {number + 1} "{path}"')
        else:
            out.append(line)
    return out


#: LB_MODE values of bpf/lib/nodeport.h, by DatapathConfig.lb_mode.
LB_MODE_MACROS = {"snat": 0, "dsr": 1, "hybrid": 2}


def node_build(topo: Topology, config: DatapathConfig, node: str, vxlan_ifindex: int = 0,
               netdev_ifindex: int = 0) -> NodeBuild:
    """The build of ``node``: which files, which programs, which macros."""
    n = topo.node(node)
    tunnel = config.routing == "tunnel"
    macros: dict[str, int] = {
        "NODE_ID": n.node_id,
        "NODE_IP": be32(n.ip),
        "NATIVE_DEV_IFINDEX": netdev_ifindex,
        "LB_MODE": LB_MODE_MACROS[config.lb_mode],
        "LB_MAGLEV_LUT_SIZE": config.maglev_table_size,
        "LB_FLOW_HASH_SEED": FLOW_HASH_SEED,
        "CT_MAP_SIZE_TCP": config.ct_tcp_size,
        "CT_MAP_SIZE_ANY": config.ct_any_size,
        "LB_MAP_SIZE": config.lb_map_size,
        "VXLAN_PORT": VXLAN_PORT,
        "LB_LOOPBACK_IPV4": be32(LOOPBACK_SNAT_ADDR),
        "EVENTS_RING_PAGES": config.events_ring_pages,
        **config.timeouts.macros(),
        **config.profile.macros(),
    }
    if config.ct_accounting:
        macros["CONNTRACK_ACCOUNTING"] = 1
    if config.policy != "never":  # 'never' adds no macro: those builds stay what they were before policy
        macros["ENABLE_POLICY"] = 1
        if config.policy_audit:
            macros["POLICY_AUDIT_MODE"] = 1
    if config.sockmap == "on":  # 'off' adds no macro and no file: those builds stay what they were
        macros["ENABLE_SOCKMAP"] = 1
    if config.no_backend_response == "drop":  # 'reject' adds no macro: Cilium's default is the build's
        macros["SERVICE_NO_BACKEND_DROP"] = 1
    xdp = config.nodeport_accel == "xdp"
    if xdp:  # 'none' adds no macro: those builds stay byte for byte what they were before XDP
        macros["ENABLE_NODEPORT_ACCELERATION"] = 1
    if tunnel:
        if vxlan_ifindex <= 0:
            raise ConfigError(f"node '{node}': tunnel mode needs the ifindex of cilium_vxlan, got {vxlan_ifindex}")
        macros["ROUTING_TUNNEL"] = 1
        macros["VXLAN_IFINDEX"] = vxlan_ifindex
    programs = tuple(
        p for p in PROGRAMS
        if (tunnel or p.device != "overlay") and (config.socket_lb != "off" or p.device != "cgroup")
        and (config.sockmap == "on" or p.device not in ("pods", "sockmap"))
        and (xdp or p.device not in ("xdp", "xdp-peer"))
    )
    files = tuple(dict.fromkeys(p.source for p in programs))
    return NodeBuild(node, macros, programs, files)
