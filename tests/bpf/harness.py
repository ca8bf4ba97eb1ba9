"""The BPF unit tier's node: one compiled datapath (loaded, never attached),
its maps filled as the agent fills a node's, and a verb to run a hook on a
crafted frame and read back the verdict, the frame, the trace record and the
map rows.

Addresses are the default lab's (DESIGN §4): node-a 198.51.100.11 with pods
a1 198.18.1.11 and a2 198.18.1.12; node-b 198.51.100.12 with b1 198.18.2.11
and b2 198.18.2.12; the outside client ext 198.51.100.100. The programs are
node-a's.
"""
from __future__ import annotations

import ctypes
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, replace

from labkit.addr import ipv4 as ip_of  # the tests' name for it
from labkit.datapath import bpf as _bpf
from labkit.agent.endpoints import ipcache_entries
from labkit.clock import mono_seconds
from labkit.config import DatapathConfig
from labkit.datapath.source import node_build
from labkit.datapath.testrun import SkBuff, TestBuild, prog_test_run
from labkit.maps.base import PinnedMap
from labkit.maps.config import LabConfig, TraceMode
from labkit.maps.ct import CT_MAPS, CtKey4, CtEntry, CtRow
from labkit.maps.eps import EndpointInfo, EndpointKey, IpcacheKey, RemoteEndpointInfo
from labkit.maps.lb import (
    BackendState,
    Lb4Backend,
    Lb4BackendKey,
    Lb4Key,
    Lb4RevNatKey,
    Lb4ReverseNat,
    Lb4Service,
    MaglevLut,
)
from labkit.maps.nat import NatEntry, NatKey4, NatRow
from labkit.maps.policy import POLICY_MAP_MAX_ENTRIES, PolicyEntry, PolicyKey
from labkit.net.topology import Topology
from labkit.observe.trace import TraceEvent

from . import packets

TOPO = Topology.default("bpfunit")
NODE = "node-a"
NODE_IP = TOPO.node(NODE).ip
A1, A2 = TOPO.pod("a1"), TOPO.pod("a2")
B1, B2 = TOPO.pod("b1"), TOPO.pod("b2")
EXT = "198.51.100.100"
VIP, VPORT = "198.19.0.10", 80  #: a ClusterIP
LB_VIP = "203.0.113.10"  #: a LoadBalancer VIP
SVC_ID = 1
LOOPBACK = "169.254.42.1"
VXLAN_IFINDEX = 7  #: what cilium_vxlan's ifindex would be in the tunnel build

#: The maps a reset empties: every hash map the datapath or the agent writes.
_STATE_MAPS = CT_MAPS + ("cilium_snat_v4_external", "cilium_lb4_affinity", "cilium_lb_affinity_match", "cilium_lb4_services_v2",
                         "cilium_lb4_backends_v3", "cilium_lb4_reverse_nat", "cilium_lb4_maglev", "cilium_lxc",
                         "cilium_ipcache")


class _U32(ctypes.Structure):
    _fields_ = [("value", ctypes.c_uint32)]


def pod_mac(pod) -> str:
    """A pod's eth0 MAC, made from its address (the lab's veths get random ones)."""
    last = [int(x) for x in pod.ip.split(".")]
    return "02:00:%02x:%02x:%02x:%02x" % tuple(last)


GW_MAC = packets.GW_MAC

#: Each build's options: what node-a's datapath is compiled with.
BUILDS = {
    # native routing, dsr (Cilium's tunnel-less default is native; dsr is labkit's default lb mode), counting
    # packets and bytes as the datapath tier's shared labs do
    "native": (DatapathConfig(routing="native", socket_lb="off", ct_accounting=True),
               ("bpf_lxc.c", "bpf_host.c")),
    # --bpf-lb-mode=snat: only the uplink's programs differ
    "snat": (DatapathConfig(routing="native", socket_lb="off", lb_mode="snat"), ("bpf_host.c",)),
    # tunnel routing, every other option at labkit's default (no CONNTRACK_ACCOUNTING, as on a default node)
    "tunnel": (DatapathConfig(routing="tunnel", socket_lb="off"), ("bpf_lxc.c", "bpf_overlay.c")),
    # policy enforcement compiled in (ENABLE_POLICY), native routing: only the pods' programs differ
    "policy": (DatapathConfig(routing="native", socket_lb="off", policy="default"), ("bpf_lxc.c",)),
    # policy compiled in with tunnel routing: packets arrive from cilium_vxlan (MARK_FROM_OVERLAY)
    "policy-tunnel": (DatapathConfig(routing="tunnel", socket_lb="off", policy="default"), ("bpf_lxc.c",)),
    # "native" with NodePort acceleration (ENABLE_NODEPORT_ACCELERATION): cil_xdp_entry beside cil_from_netdev,
    # one translation unit, the same maps
    "xdp": (DatapathConfig(routing="native", socket_lb="off", ct_accounting=True, nodeport_accel="xdp"),
            ("bpf_host.c", "bpf_xdp.c")),
    # the same in snat mode
    "xdp-snat": (DatapathConfig(routing="native", socket_lb="off", ct_accounting=True, lb_mode="snat",
                                nodeport_accel="xdp"), ("bpf_host.c", "bpf_xdp.c")),
    # the same with --policy-audit-mode (POLICY_AUDIT_MODE)
    "audit": (DatapathConfig(routing="native", socket_lb="off", policy="default", policy_audit=True), ("bpf_lxc.c",)),
}

#: The policy builds' extra map, emptied by a reset.
_POLICY_MAPS = ("labkit_policy", "labkit_policy_filter")
BPF_MAP_TYPE_LPM_TRIE, BPF_F_NO_PREALLOC = 11, 1


def loaded_build(name: str) -> TestBuild:
    """node-a's datapath with the options of ``BUILDS[name]``, loaded as a lab loads it (not attached)."""
    config, files = BUILDS[name]
    build = node_build(TOPO, config, NODE, vxlan_ifindex=VXLAN_IFINDEX if config.routing == "tunnel" else 0)
    build = replace(build, files=files, programs=tuple(p for p in build.programs if p.source in files))
    return TestBuild.load(build)


@dataclass
class Outcome:
    """One hook run: verdict, the frame as the program left it, and the trace records it wrote."""

    retval: int
    frame: bytes
    events: list
    ctx: SkBuff | None  #: None for an XDP run

    @property
    def pkt(self) -> packets.Parsed:
        """The frame, parsed (checksums checked)."""
        return packets.parse(self.frame)

    @property
    def event(self) -> TraceEvent:
        """The one trace record of the run."""
        assert len(self.events) == 1, f"expected one trace record, got {len(self.events)}"
        return self.events[0]


class Node:
    """node-a's datapath of one build, with the maps a node of the default lab has."""

    def __init__(self, name: str, build: TestBuild):
        self.name = name
        self.build = build
        self.config = BUILDS[name][0]
        self._ring = _bpf.RingBuffer(build.map_fd("labkit_events"))

    def map(self, name: str, key_type, value_type) -> PinnedMap:
        """Map ``name`` of this build with labkit's key and value types (use it in ``with``)."""
        return PinnedMap.from_fd(self.build.map_fd(name), key_type, value_type, name)

    # -- state -------------------------------------------------------------
    def reset(self, faults: int = 0, clock_offset: int = 0) -> None:
        """Empty CT, NAT and Service maps (and policy maps), write node-a's endpoints and ipcache, set the faults."""
        self.build.clear_maps(_STATE_MAPS + (_POLICY_MAPS if self.config.policy != "never" else ()))
        with self.map("cilium_lxc", EndpointKey, EndpointInfo) as lxc:
            for i, pod in enumerate(TOPO.pods_on(NODE), start=1):
                lxc[EndpointKey.for_ip(pod.ip)] = EndpointInfo.make(100 + i, i, pod_mac(pod), GW_MAC, pod.identity)
        with self.map("cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as ipc:
            for key, info in ipcache_entries(TOPO, NODE, self.config.routing):
                ipc[key] = info
        self.set_config(faults=faults, clock_offset=clock_offset)
        self.drain()

    def set_config(self, faults: int = 0, clock_offset: int = 0) -> None:
        """Write ``labkit_config`` (trace everything)."""
        with self.map("labkit_config", _U32, LabConfig) as m:
            m[_U32(0)] = LabConfig(clock_offset=clock_offset, faults=int(faults), trace_mode=TraceMode.ALL)

    @property
    def faults(self) -> int:
        with self.map("labkit_config", _U32, LabConfig) as m:
            return m[_U32(0)].faults

    def drain(self) -> list:
        """Trace records written since the last drain."""
        return [TraceEvent.from_buffer_copy(r) for r in self._ring.records()]

    def service(self, vip: str, port: int, backends, flags: int = 0, count: int | None = None,
                service_id: int = SVC_ID, maglev: list[int] | None = None) -> None:
        """A service as Cilium v1.16's agent writes it: head (slot 0), one slot per backend, backends
        (protocol 0), reverse NAT; ``backends`` is ``[(id, ip, port, state)]``; terminating ones follow
        the counted ones. ``maglev``: the service's lookup table (backend id per slot)."""
        active = sum(1 for b in backends if b[3] == BackendState.ACTIVE)
        head = Lb4Key.make(vip, port, 0)
        with self.map("cilium_lb4_services_v2", Lb4Key, Lb4Service) as svc:
            svc[head] = Lb4Service.head(active if count is None else count, service_id, flags)
            for slot, (bid, _, _, _) in enumerate(backends, start=1):
                svc[head.with_slot(slot)] = Lb4Service.slot(bid, service_id)
        with self.map("cilium_lb4_backends_v3", Lb4BackendKey, Lb4Backend) as be:
            for bid, ip, bport, state in backends:
                be[Lb4BackendKey(bid)] = Lb4Backend.make(ip, bport, 0, state)
        with self.map("cilium_lb4_reverse_nat", Lb4RevNatKey, Lb4ReverseNat) as rn:
            rn[Lb4RevNatKey.make(service_id)] = Lb4ReverseNat.make(vip, port)
        if maglev is not None:
            lut = bytes(MaglevLut(maglev))
            fd = _bpf.map_create(_bpf.BPF_MAP_TYPE_ARRAY, 4, len(lut), 1, "lb4_maglev_lut")
            try:
                _bpf.update(fd, ctypes.c_uint32(0), ctypes.create_string_buffer(lut, len(lut)))
                _bpf.update(self.build.map_fd("cilium_lb4_maglev"), Lb4RevNatKey.make(service_id), ctypes.c_uint32(fd))
            finally:
                import os

                os.close(fd)

    # -- policy --------------------------------------------------------------
    @staticmethod
    def endpoint_id(pod) -> int:
        """The pod's endpoint id (cilium_lxc's lxc_id) as :meth:`reset` writes it: its index on node-a."""
        return [p.name for p in TOPO.pods_on(NODE)].index(pod.name) + 1

    def policy(self, pod, rows) -> None:
        """Give ``pod`` a policy map holding ``rows`` (``[(PolicyKey, PolicyEntry)]``), as the agent does:
        a new LPM trie shaped like labkit_policy_inner, stored under the pod's endpoint id."""
        fd = _bpf.map_create(BPF_MAP_TYPE_LPM_TRIE, ctypes.sizeof(PolicyKey), ctypes.sizeof(PolicyEntry),
                             POLICY_MAP_MAX_ENTRIES, "cilium_policy", flags=BPF_F_NO_PREALLOC)
        try:
            for key, entry in rows:
                _bpf.update(fd, key, entry)
            _bpf.update(self.build.map_fd("labkit_policy"), _U32(self.endpoint_id(pod)), ctypes.c_uint32(fd))
        finally:
            os.close(fd)

    @contextmanager
    def policy_map(self, pod):
        """The pod's policy map, read back through labkit_policy (``with node.policy_map(a1) as m``)."""
        map_id = ctypes.c_uint32()
        if not _bpf.lookup(self.build.map_fd("labkit_policy"), _U32(self.endpoint_id(pod)), map_id):
            raise KeyError(f"{pod.name} has no policy map")
        fd = _bpf.map_fd_by_id(map_id.value)
        try:
            m = PinnedMap.from_fd(fd, PolicyKey, PolicyEntry, "cilium_policy")
        finally:
            os.close(fd)
        with m:
            yield m

    # -- running -----------------------------------------------------------
    def run(self, function: str, frame: bytes, mark: int = 0) -> Outcome:
        """Test-run ``function`` (``cil_from_container``, ...) on ``frame``."""
        self.drain()
        r = self.build.run(function, frame, ctx=SkBuff(mark=mark))
        return Outcome(r.retval, r.data, self.drain(), r.ctx)

    def run_xdp(self, frame: bytes) -> Outcome:
        """Test-run ``cil_xdp_entry`` on ``frame`` (no context: the kernel's XDP test run makes one on lo)."""
        self.drain()
        r = prog_test_run(self.build.prog_fd("cil_xdp_entry"), frame)
        return Outcome(r.retval, r.data, self.drain(), None)

    # -- reading -----------------------------------------------------------
    def ct(self) -> list[CtRow]:
        """Every CT row of both maps."""
        rows = []
        for name in CT_MAPS:
            with self.map(name, CtKey4, CtEntry) as m:
                rows += [CtRow.of(k, v, name) for k, v in m.items()]
        return rows

    def ct_row(self, direction: str, src: str, sport: int, dst: str, dport: int, proto: int = socket.IPPROTO_TCP,
               related: bool = False) -> CtRow | None:
        """The row that prints ``<proto> <direction> src:sport -> dst:dport [related]``, or None."""
        for row in self.ct():
            if (row.dir, row.src, row.sport, row.dst, row.dport, row.proto, row.related) == \
                    (direction, src, sport, dst, dport, proto, related):
                return row
        return None

    def nat(self) -> list[NatRow]:
        """Every NAT row."""
        with self.map("cilium_snat_v4_external", NatKey4, NatEntry) as m:
            return [NatRow.of(k, v) for k, v in m.items()]

    def nat_entry(self, src: str, sport: int, dst: str, dport: int, proto: int = socket.IPPROTO_TCP,
                  direction: int = 0) -> NatEntry | None:
        """The NAT entry keyed by the packet ``src:sport -> dst:dport`` (OUT=0, IN=1), or None."""
        with self.map("cilium_snat_v4_external", NatKey4, NatEntry) as m:
            return m.get(NatKey4.make(src, dst, sport, dport, proto, direction))

    @staticmethod
    def now() -> int:
        """The lab clock with offset 0: CLOCK_MONOTONIC seconds, as the programs read it."""
        return mono_seconds()
