"""Realise a Topology: namespaces, links, addresses, routes, sysctls, cgroups,
pod servers. Every object goes into the ledger the moment it exists.

The steps, in the kernel's own words (what ``labkit status`` would let you
retype by hand):

- ``ip netns add lk-<lab>-<name>`` for the fabric, nodes, pods, externals;
- fabric: ``ip link add fabric type bridge``; per node: ``ip link add <node>
  type veth peer name eth0 netns lk-<lab>-<node>``, enslaved to the bridge;
- node: eth0 address, ``cilium_host`` (a veth paired with ``cilium_net``, as
  Cilium has it) holding the pods' gateway
  address, forwarding on, rp_filter off, IPv6 off; tunnel mode adds
  ``cilium_vxlan`` (``type vxlan external dstport 8472``, ``arp off``) and routes the other
  nodes' pod CIDRs into it, native mode routes them via the other node;
- external client: its eth0 address and ``ip route add 203.0.113.0/24 via
  <first node>``: the LoadBalancer VIPs are announced by the first node (one
  fixed choice standing in for the ECMP router in front of a real cluster);
- pod: ``ip link add lxc-<pod> type veth peer name eth0 netns lk-<lab>-<pod>``,
  a /32 address, ``default via <gateway>`` with a permanent neighbour entry
  for the gateway (the host veth's MAC), and on the node a /32 route to the
  pod through ``lxc-<pod>``.
"""
from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from labkit.config import VXLAN_PORT, DatapathConfig
from labkit.errors import NetnsError
from labkit.net import netns as _netns
from labkit.net import pod_argv
from labkit.net.ledger import Ledger
from labkit.net.topology import LB_RANGE, Topology

if TYPE_CHECKING:
    from pyroute2 import IPRoute

__all__ = ["EndpointFacts", "build_network", "start_pod_servers", "cgroup_root", "POD_PORT"]

POD_PORT = 8080
NUD_PERMANENT = 0x80
_SCOPE_LINK = 253
_TUNNEL_MTU = 1450  # 1500 minus VXLAN's 50 bytes, as Cilium sets it
_IFF_NOARP = 0x80
_COMMON_SYSCTLS = {
    "net.ipv6.conf.all.disable_ipv6": 1,
    "net.ipv6.conf.default.disable_ipv6": 1,
}
#: The fabric is a plain wire: if br_netfilter is loaded on the host, bridged frames would
#: otherwise pass iptables in the fabric namespace, which also drops malformed IPv4 before
#: any node sees it.
_FABRIC_SYSCTLS = {
    "net.bridge.bridge-nf-call-iptables": 0,
    "net.bridge.bridge-nf-call-ip6tables": 0,
    "net.bridge.bridge-nf-call-arptables": 0,
}
_NODE_SYSCTLS = {
    "net.ipv4.ip_forward": 1,
    "net.ipv4.conf.all.rp_filter": 0,
    "net.ipv4.conf.default.rp_filter": 0,
}


@dataclass(frozen=True)
class EndpointFacts:
    """What the agent learnt about a local pod while creating it."""

    pod: str
    ifindex: int  #: host veth ifindex in the node namespace
    lxc_id: int
    mac: str  #: the pod's eth0
    node_mac: str  #: the host veth


def cgroup_root() -> Path | None:
    """Where cgroup v2 is mounted: /sys/fs/cgroup (unified) or /sys/fs/cgroup/unified (hybrid)."""
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] == "cgroup2":
                return Path(parts[1])
    return None


# pyroute2 is imported where a lab is built, not when this module is: read-only commands
# (`labkit ct list`, whose start-up `make bench` times) reach this module through Lab and never build.
def _ns(topo: Topology, name: str) -> IPRoute:
    from pyroute2 import IPRoute

    with _netns.entered(topo.netns(name)):
        return IPRoute()


def _idx(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NetnsError(2, f"interface '{ifname}' not found")
    return found[0]


def _mac(ipr: IPRoute, index: int) -> str:
    return ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")


def _sysctls(name: str, values: dict) -> None:
    present = {k: v for k, v in values.items() if os.path.exists("/proc/sys/" + k.replace(".", "/"))}
    _netns.sysctl(name, present)


def _nl(what: str):
    """Turn a NetlinkError into a NetnsError naming the step."""

    class _Ctx:
        def __enter__(self):
            return self

        def __exit__(self, etype, exc, tb):
            from pyroute2.netlink.exceptions import NetlinkError

            if isinstance(exc, NetlinkError):
                raise NetnsError(exc.code, f"{what}: {os.strerror(exc.code)}") from None
            return False

    return _Ctx()


def build_network(topo: Topology, config: DatapathConfig, ledger: Ledger) -> dict:
    """Create every namespace and link; returns per-node facts the datapath needs:
    ``{"endpoints": {node: [EndpointFacts]}, "devices": {node: {ifindex: name}}}``."""
    names = topo.all_netns()
    for name in names:
        if _netns.exists(name):
            raise NetnsError(17, f"network namespace '{name}' already exists; expected lab '{topo.lab}' to own it")
    with _nl(f"ip netns add {' '.join(names)}"):
        # each recorded first: a kill between the two steps leaves nothing unlisted
        _netns.create_many(names, before=lambda name: ledger.record("netns", name=name))
    for name in names:
        _sysctls(name, _COMMON_SYSCTLS)
    for n in topo.nodes:
        _sysctls(topo.netns(n.name), _NODE_SYSCTLS)
    _sysctls(topo.netns("fabric"), _FABRIC_SYSCTLS)

    fabric = _ns(topo, "fabric")
    try:
        with _nl("fabric bridge"):
            fabric.link("set", index=_idx(fabric, "lo"), state="up")
            fabric.link("add", ifname="fabric", kind="bridge")
            br = _idx(fabric, "fabric")
            fabric.link("set", index=br, state="up")
        for member in list(topo.nodes) + list(topo.externals):
            port = topo.fabric_port(member.name)
            with _nl(f"veth {port} <-> {member.name}/eth0"):
                fabric.link("add", ifname=port, kind="veth", peer={"ifname": "eth0", "net_ns_fd": topo.netns(member.name)})
                fabric.link("set", index=_idx(fabric, port), master=br, state="up")
    finally:
        fabric.close()

    endpoints: dict[str, list[EndpointFacts]] = {}
    devices: dict[str, dict[int, str]] = {}
    for n in topo.nodes:
        ipr = _ns(topo, n.name)
        try:
            endpoints[n.name], devices[n.name] = _build_node(topo, config, n.name, ipr)
        finally:
            ipr.close()
    if config.nodeport_accel == "xdp":
        _node_neighbours(topo)
    for e in topo.externals:
        if config.nodeport_accel == "xdp":  # complete checksums, as from a wire (labkit/datapath/xdp.py)
            with _netns.entered(topo.netns(e.name)), _nl(f"{e.name}: ethtool -K eth0 tx off"):
                _tx_checksum_off("eth0")
        ipr = _ns(topo, e.name)
        try:
            with _nl(f"{e.name}: eth0 {e.ip}"):
                ipr.link("set", index=_idx(ipr, "lo"), state="up")
                eth0 = _idx(ipr, "eth0")
                ipr.addr("add", index=eth0, address=e.ip, prefixlen=24)
                ipr.link("set", index=eth0, state="up")
            with _nl(f"{e.name}: route {LB_RANGE} via {topo.nodes[0].ip}"):
                ipr.route("add", dst=str(LB_RANGE), gateway=topo.nodes[0].ip, oif=eth0)
        finally:
            ipr.close()
    return {"endpoints": endpoints, "devices": devices}


_NUD_PERMANENT = 0x80
_SIOCETHTOOL, _ETHTOOL_STXCSUM = 0x8946, 0x17


def _tx_checksum_off(ifname: str) -> None:
    """``ethtool -K IFNAME tx off`` in the calling thread's namespace: the device's senders complete their
    TCP/UDP checksums in software, as frames from a wire arrive (labkit/datapath/xdp.py says why XDP needs it)."""
    value = ctypes.create_string_buffer(struct.pack("II", _ETHTOOL_STXCSUM, 0))
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), _SIOCETHTOOL, ifreq)


def _node_neighbours(topo: Topology) -> None:
    """Each node's eth0 gets a permanent neighbour entry for every other node (``ip neigh replace``).

    XDP cannot resolve a next hop (bpf_fib_lookup answers NO_NEIGH, and there is no bpf_redirect_neigh in XDP):
    Cilium's agent keeps a non-GC'able neighbour entry for every other node for this reason
    (pkg/datapath/linux/node.go, linuxNodeHandler.insertNeighbor)."""
    macs = {}
    for n in topo.nodes:
        ipr = _ns(topo, n.name)
        try:
            macs[n.name] = _mac(ipr, _idx(ipr, "eth0"))
        finally:
            ipr.close()
    for n in topo.nodes:
        ipr = _ns(topo, n.name)
        try:
            for m in topo.nodes:
                if m.name != n.name:
                    with _nl(f"{n.name}: ip neigh replace {m.ip} lladdr {macs[m.name]} dev eth0 nud permanent"):
                        ipr.neigh("replace", dst=m.ip, lladdr=macs[m.name], ifindex=_idx(ipr, "eth0"),
                                  state=_NUD_PERMANENT)
        finally:
            ipr.close()


def _build_node(topo: Topology, config: DatapathConfig, node: str, ipr: IPRoute):
    n = topo.node(node)
    with _nl(f"{node}: eth0 {n.ip}"):
        ipr.link("set", index=_idx(ipr, "lo"), state="up")
        eth0 = _idx(ipr, "eth0")
        ipr.addr("add", index=eth0, address=n.ip, prefixlen=24)
        ipr.link("set", index=eth0, state="up")
    with _nl(f"{node}: cilium_host {n.router_ip}"):
        ipr.link("add", ifname="cilium_host", kind="veth", peer={"ifname": "cilium_net"})
        host = _idx(ipr, "cilium_host")
        ipr.addr("add", index=host, address=n.router_ip, prefixlen=32)
        ipr.link("set", index=host, state="up")
        ipr.link("set", index=_idx(ipr, "cilium_net"), state="up")
    tunnel = config.routing == "tunnel"
    if tunnel:
        with _nl(f"{node}: cilium_vxlan"):
            ipr.link("add", ifname="cilium_vxlan", kind="vxlan", vxlan_collect_metadata=1, vxlan_port=VXLAN_PORT,
                     vxlan_learning=0)
            vx = _idx(ipr, "cilium_vxlan")
            # NOARP: packets the node's kernel routes into the tunnel (its own, or NATed by iptables) need no
            # neighbour; to-overlay gives them their tunnel endpoint from cilium_ipcache.
            ipr.link("set", index=vx, flags=_IFF_NOARP, change=_IFF_NOARP)
            ipr.link("set", index=vx, mtu=_TUNNEL_MTU, state="up")
    for other in topo.nodes:
        if other.name == node:
            continue
        with _nl(f"{node}: route {other.pod_cidr}"):
            if tunnel:
                ipr.route("add", dst=other.pod_cidr, oif=vx, scope=_SCOPE_LINK)
            else:
                ipr.route("add", dst=other.pod_cidr, gateway=other.ip, oif=eth0)

    endpoints = []
    for lxc_id, pod in enumerate(topo.pods_on(node), start=1):
        veth = topo.host_veth(pod.name)
        with _nl(f"{node}: veth {veth} <-> {pod.name}/eth0"):
            ipr.link("add", ifname=veth, kind="veth", peer={"ifname": "eth0", "net_ns_fd": topo.netns(pod.name)})
            lxc = _idx(ipr, veth)
            ipr.link("set", index=lxc, state="up")
            ipr.route("add", dst=f"{pod.ip}/32", oif=lxc, scope=_SCOPE_LINK)
        node_mac = _mac(ipr, lxc)
        pod_ipr = _ns(topo, pod.name)
        try:
            with _nl(f"{pod.name}: eth0 {pod.ip}"):
                pod_ipr.link("set", index=_idx(pod_ipr, "lo"), state="up")
                eth = _idx(pod_ipr, "eth0")
                pod_ipr.addr("add", index=eth, address=pod.ip, prefixlen=32)
                pod_ipr.link("set", index=eth, mtu=_TUNNEL_MTU if tunnel else 1500, state="up")
                pod_ipr.route("add", dst=f"{n.router_ip}/32", oif=eth, scope=_SCOPE_LINK)
                pod_ipr.route("add", dst="0.0.0.0/0", gateway=n.router_ip, oif=eth)
                pod_ipr.neigh("add", dst=n.router_ip, lladdr=node_mac, ifindex=eth, state=NUD_PERMANENT)
            pod_mac = _mac(pod_ipr, eth)
        finally:
            pod_ipr.close()
        endpoints.append(EndpointFacts(pod.name, lxc, lxc_id, pod_mac, node_mac))

    devices = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
    return endpoints, devices


def start_pod_servers(topo: Topology, ledger: Ledger, cgroups: dict[str, str]) -> dict[str, subprocess.Popen]:
    """Start one :mod:`labkit.net.podserver` per pod, in its namespace and cgroup."""
    logs = ledger.dir / "pods"
    if not logs.exists():
        ledger.record("dir", path=str(logs))
        logs.mkdir()
    procs = {}
    for pod in topo.pods:
        log = logs / f"{pod.name}.log"
        ledger.record("file", path=str(log))
        ledger.record("file", path=str(logs / f"{pod.name}.err"))
        log.touch()
        proc = subprocess.Popen(
            pod_argv("podserver", "--pod", pod.name, "--port", str(POD_PORT), "--log", str(log)),
            preexec_fn=_netns.preexec(topo.netns(pod.name), cgroups.get(pod.name)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(logs / f"{pod.name}.err", "ab"),
            close_fds=True,
        )
        ledger.record_process(f"podserver-{pod.name}", proc.pid, netns=topo.netns(pod.name))
        procs[pod.name] = proc
    return procs
