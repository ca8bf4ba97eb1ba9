"""Policy compiled into a real lab (``DatapathConfig(policy="default")``): the loader pins
labkit_policy, and a pod's policy map written into it the way the agent writes it decides
real connections between real pods, with the verdict in the trace.

The facts the verdicts follow (bpf_lxc.c ipv4_policy, v1.16: new and established packets
are checked, replies are not) are pinned packet by packet in tests/bpf/test_policy.py;
here the kernel's own TCP stack sends the packets.
"""
from __future__ import annotations

import ctypes
import os
import socket
import sys

import pytest

from labkit.constants import DropReason
from labkit.datapath import bpf as _bpf
from labkit.maps.base import PinnedMap
from labkit.maps.eps import EndpointInfo, EndpointKey
from labkit.maps.policy import POLICY_MAP_MAX_ENTRIES, Direction, PolicyEntry, PolicyKey
from labkit.observe.hubble import FlowFilter, compact, last_flows
from labtag import tagged

from .util import TcpClient, rows, wait_for

BPF_MAP_TYPE_LPM_TRIE, BPF_F_NO_PREALLOC = 11, 1

_CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except OSError as exc:
    print("failed", type(exc).__name__)
"""


@pytest.fixture(scope="module")
def plab(_require_datapath):
    """A native-routing lab with policy compiled in; no pod has a policy map yet."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("dppol"), config=DatapathConfig(routing="native", policy="default", gc_timer=False))
    yield lab
    lab.down()


@pytest.fixture
def pl(plab):
    plab.reset()
    for node in plab.pin_dirs:
        _clear_policy(plab, node)
    return plab


def _outer(lab, node: str) -> int:
    return _bpf.obj_get(f"{lab.pin_dir(node)}/labkit_policy")


def _clear_policy(lab, node: str) -> None:
    fd = _outer(lab, node)
    try:
        for key in _bpf.all_keys(fd, 4):
            _bpf.delete(fd, ctypes.create_string_buffer(key, 4))
    finally:
        os.close(fd)


def endpoint_id(lab, pod: str) -> int:
    """The pod's endpoint id as its node's cilium_lxc holds it."""
    p = lab.topology.pod(pod)
    with PinnedMap(f"{lab.pin_dir(p.node)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
        return lxc[EndpointKey.for_ip(p.ip)].lxc_id


def set_policy(lab, pod: str, keys) -> None:
    """Give ``pod`` a policy map allowing ``keys`` (an empty list: deny all), as the agent does."""
    p = lab.topology.pod(pod)
    inner = _bpf.map_create(BPF_MAP_TYPE_LPM_TRIE, ctypes.sizeof(PolicyKey), ctypes.sizeof(PolicyEntry),
                            POLICY_MAP_MAX_ENTRIES, "cilium_policy", flags=BPF_F_NO_PREALLOC)
    outer = _outer(lab, p.node)
    try:
        for k in keys:
            _bpf.update(inner, k, PolicyEntry.allow(k))
        _bpf.update(outer, ctypes.c_uint32(endpoint_id(lab, pod)), ctypes.c_uint32(inner))
    finally:
        os.close(inner)
        os.close(outer)


def connect(lab, pod: str, ip: str, port: int = 8080, timeout: float = 1.5) -> bool:
    r = lab.exec(pod, [sys.executable, "-c", _CONNECT, ip, str(port), str(timeout)], timeout=30)
    return r.stdout.strip() == "connected"


def test_policy_build_pins_labkit_policy(pl):
    """Every node of a policy lab pins labkit_policy, a hash of maps (type 13) keyed by the 4-byte endpoint id."""
    for node in pl.pin_dirs:
        fd = _outer(pl, node)
        try:
            info = _bpf.map_info(fd)
        finally:
            os.close(fd)
        assert (info.type, info.key_size, info.value_size) == (13, 4, 4)


def test_no_map_no_enforcement(pl):
    """Before any pod has a policy map, a1 reaches b1 as in a lab without policy."""
    assert connect(pl, "a1", pl.pod("b1").ip)


def test_deny_all_then_allow(pl):
    """b1 with an empty map refuses a1's SYN at node-b's to-container (Policy denied, INGRESS DENIED);
    an allow for a1's identity on 8080 lets the next connection in."""
    a1, b1 = pl.pod("a1"), pl.pod("b1")
    set_policy(pl, "b1", [])
    log = pl.events()
    assert not connect(pl, "a1", b1.ip)
    drop = wait_for(lambda: next((f for f in log.read() if f.dropped and f.node == "node-b"), None), timeout=5,
                    what="the policy drop at node-b")
    assert drop.hook.label == "to-container" and drop.event.drop_reason == DropReason.POLICY
    assert drop.policy.text() == "policy-verdict:none INGRESS DENIED"
    assert drop.event.remote_id == pl.topology.pod("a1").identity
    assert not rows(pl, "node-b", "TCP", "IN"), "the denied SYN left no IN row on node-b"
    assert rows(pl, "node-a", "TCP", "OUT"), "a1's egress is not enforced: its OUT row exists"
    # Hubble's view: the policy verdict is an event of its own, beside the drop's (monitor -> Hubble ring).
    lines = wait_for(lambda: [line for line in map(compact, last_flows(pl, FlowFilter(verdicts=["DROPPED"])))
                              if "policy-verdict" in line] or None, timeout=5, what="the policy verdict in Hubble")
    sport = socket.ntohs(drop.event.before.sport)
    # A denied verdict's direction is unknown: ``<>`` (threefour/parser.go:420-429, printer.go:365-368@82999990).
    assert lines[-1].endswith(f"default/a1:{sport} (ID:{a1.identity}) <> default/b1:8080 (ID:{b1.identity}) "
                              "policy-verdict:none INGRESS DENIED (TCP Flags: SYN)")
    set_policy(pl, "b1", [PolicyKey.make(pl.topology.pod("a1").identity, Direction.INGRESS, 6, 8080)])
    assert connect(pl, "a1", b1.ip)
    assert not connect(pl, "a2", b1.ip), "a2's identity is still denied"


def test_established_connection_stops_when_allow_removed(pl):
    """An open connection keeps working while its allow exists; once b1's map no longer allows it, the next
    data packet is dropped at node-b (v1.16 checks established packets too)."""
    b1 = pl.pod("b1")
    key = PolicyKey.make(pl.topology.pod("a1").identity, Direction.INGRESS, 6, 8080)
    set_policy(pl, "b1", [key])
    client = TcpClient(pl, "a1", b1.ip)
    try:
        assert client.send() == "echo hello labkit"
        log = pl.events()
        set_policy(pl, "b1", [])
        client.proc.stdin.write("send\n")
        client.proc.stdin.flush()
        drop = wait_for(lambda: next((f for f in log.read() if f.dropped and f.node == "node-b"), None), timeout=5,
                        what="the established packet's drop")
        assert drop.event.drop_reason == DropReason.POLICY and drop.ct_result.name == "ESTABLISHED"
    finally:
        client.proc.kill()
        client.proc.wait(5)
