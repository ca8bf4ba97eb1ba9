"""Socket-level redirect on the real kernel (`labkit up --sockmap on`), as Cilium 1.4-1.13's bpf/sockops/:
bpf_sockops.c (bpf_sockmap → bpf_sock_ops_ipv4) records an established TCP socket whose peer is a local
endpoint in the sockhash cilium_sock_ops under the peer's view of the connection (addresses and ports
swapped, BPF_NOEXIST); bpf_redir.c (bpf_redir_proxy) looks each send up under the sender's own view and
bpf_msg_redirect_hash(..., BPF_F_INGRESS) queues it on the peer socket. So after the handshake no segment
is built: the veth hooks see the handshake and the teardown only, and conntrack counts nothing more."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest

from labkit.config import DatapathConfig
from labkit.constants import Hook
from labkit.maps.ct import TcpFlags
from labkit.maps.sockmap import SOCKOPS_MAP, SockKey, sock_keys

from labtag import tagged

from .util import rows, wait_for

PORT = 9100
SIZE = 1 << 20  # 1 MiB, the exchange
#: A segment without payload is at most Ethernet (14) + IPv4 without options (20) + the longest TCP header
#: (60) = 94 bytes of skb->len at a veth's tc hook; a SYN with its options is 74, an ACK with timestamps 66.
HEADERS_ONLY_MAX_LEN = 94
#: A TCP/IPv4 packet carries at most 65,535 - 20 - 20 bytes of payload, even a GSO one at a veth.
MAX_PAYLOAD = 65535 - 40

# The peer: accept one connection, read to EOF, print how many bytes came and their SHA-256.
_SERVER = r"""
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
h, n = hashlib.sha256(), 0
while True:
    b = c.recv(65536)
    if not b:
        break
    h.update(b)
    n += len(b)
print(n, h.hexdigest(), flush=True)
c.close()
"""
# The sender: connect, then on each line of stdin: first send SIZE bytes, then close.
_CLIENT = r"""
import socket, sys
data = bytes(range(256)) * (int(sys.argv[3]) // 256)
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
print("connected", s.getsockname()[1], flush=True)
sys.stdin.readline()
s.sendall(data)
print("sent", flush=True)
sys.stdin.readline()
s.close()
print("closed", flush=True)
"""
PAYLOAD_SHA256 = hashlib.sha256(bytes(range(256)) * (SIZE // 256)).hexdigest()


@dataclass
class Exchange:
    """What one SIZE-byte send from ``src`` to ``dst`` left behind."""

    src_ip: str
    dst_ip: str
    client_port: int
    received: tuple[int, str]  # bytes the peer read, their SHA-256
    keys_connected: set = field(default_factory=set)  # the sockhash once both ends are established
    keys_closed: set = field(default_factory=set)
    tcp_packets_connected: dict = field(default_factory=dict)  # CT row text → Packets, before the data
    tcp_packets_sent: dict = field(default_factory=dict)  # the same after the data, before the close
    flows: list = field(default_factory=list)  # the trace records of the connection

    def at(self, node: str, hook: Hook) -> list:
        return [f for f in self.flows if f.node == node and f.hook == hook]

    def flags(self, node: str, hook: Hook) -> Counter:
        """TCP flags of the records at one hook of ``node``, counted."""
        return Counter(TcpFlags.text(f.event.before.tcp_flags) for f in self.at(node, hook))

    def data_records(self) -> list:
        """Records of packets that carry payload (longer than any header-only segment)."""
        return [f for f in self.flows if f.event.len > HEADERS_ONLY_MAX_LEN]


def _tcp_packets(lab, node: str) -> dict[str, int]:
    """``"OUT src:port -> dst:port"`` → Packets of each non-related TCP row of ``node``."""
    return {f"{r.dir} {r.src}:{r.sport} -> {r.dst}:{r.dport}": r.packets for r in rows(lab, node, proto="TCP")
            if not r.related}


def _exchange(lab, src: str, dst: str) -> Exchange:
    src_ip, dst_ip = lab.pod(src).ip, lab.pod(dst).ip
    node = lab.topology.pod(src).node
    sockhash = f"{lab.pin_dir(node)}/{SOCKOPS_MAP}" if lab.config.sockmap == "on" else None
    server = lab.popen(dst, [sys.executable, "-c", _SERVER, str(PORT)], stdout=subprocess.PIPE, text=True)
    client = None
    try:
        assert server.stdout.readline().strip() == "listening"
        events = lab.events()
        events.seek_end()
        client = lab.popen(src, [sys.executable, "-c", _CLIENT, dst_ip, str(PORT), str(SIZE)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = client.stdout.readline().split()
        assert line and line[0] == "connected", f"client in {src} did not connect: {line}"
        ex = Exchange(src_ip, dst_ip, int(line[1]), (0, ""))
        if sockhash and lab.topology.pod(dst).node == node and "sock-no-redirect" not in lab.faults():
            # the accepted end goes in at the handshake's last ACK
            ex.keys_connected = wait_for(lambda: len(sock_keys(sockhash)) >= 2 and set(sock_keys(sockhash)),
                                         what="both ends in cilium_sock_ops")
        else:
            time.sleep(0.2)
            ex.keys_connected = set(sock_keys(sockhash)) if sockhash else set()
        ex.tcp_packets_connected = _tcp_packets(lab, node)
        client.stdin.write("send\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "sent"
        time.sleep(0.2)
        ex.tcp_packets_sent = _tcp_packets(lab, node)
        client.stdin.write("close\n")
        client.stdin.flush()
        assert client.stdout.readline().strip() == "closed"
        n, digest = server.stdout.readline().split()
        ex.received = (int(n), digest)
        server.wait(10)
        client.wait(10)
        if sockhash:
            wait_for(lambda: not sock_keys(sockhash), what="the sockhash emptied")
            ex.keys_closed = set(sock_keys(sockhash))
        ports = {_be16(PORT), _be16(ex.client_port)}

        def ours(f) -> bool:
            t = f.event.before
            return t.proto == 6 and {t.sport, t.dport} == ports

        flows: list = []

        def fins_seen() -> bool:  # the monitor drains the rings on its own thread
            flows.extend(f for f in events.read() if ours(f))
            return sum(1 for f in flows if f.event.before.tcp_flags & TcpFlags.FIN) >= 2
        wait_for(fins_seen, timeout=5, what="both FINs in the trace")
        time.sleep(0.3)
        flows.extend(f for f in events.read() if ours(f))
        ex.flows = flows
        return ex
    finally:
        for p in (client, server):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def _be16(port: int) -> int:
    """A port as the trace record holds it (network order read as a little-endian u16)."""
    return int.from_bytes(port.to_bytes(2, "big"), "little")


@pytest.fixture(scope="module")
def sockmap_lab(_require_datapath):
    """A tunnel-mode lab with socket-level redirect and CT accounting, reset for each test."""
    from labkit import Lab

    lab = Lab.up(tagged("dpsockmap"), config=DatapathConfig(sockmap="on", gc_timer=False, ct_accounting=True))
    yield lab
    lab.down()


@pytest.fixture
def smlab(sockmap_lab):
    sockmap_lab.reset()
    return sockmap_lab


def test_same_node_data_skips_the_veth_hooks(smlab):
    """With sockmap on, 1 MiB a1 → a2 shows only handshake and teardown segments at both lxc hooks of node-a, and
    a2 reads every byte intact."""
    ex = _exchange(smlab, "a1", "a2")
    assert ex.received == (SIZE, PAYLOAD_SHA256)
    assert ex.data_records() == []
    for hook in (Hook.FROM_CONTAINER, Hook.TO_CONTAINER):
        seen = ex.flags("node-a", hook)
        # each hook sees a1's and a2's segments once: SYN, SYN|ACK, the handshake's ACK, a FIN|ACK from each
        # side and the ACKs of the FINs (one of them may ride on a2's FIN|ACK)
        assert seen["SYN"] == 1 and seen["SYN|ACK"] == 1 and seen["FIN|ACK"] == 2, seen
        assert 2 <= seen["ACK"] <= 3 and set(seen) == {"SYN", "SYN|ACK", "ACK", "FIN|ACK"}, seen
    assert {f.hook for f in ex.flows} == {Hook.FROM_CONTAINER, Hook.TO_CONTAINER}  # node-a's veths only


def test_sockhash_holds_both_ends_while_connected(smlab):
    """During the connection cilium_sock_ops holds exactly the two keys of the connection, one the other swapped
    (userspace reads keys only: which socket sits under which key, each under its peer's view, is what the
    intact bytes of test_same_node_data_skips_the_veth_hooks prove); the kernel drops both when the sockets close."""
    ex = _exchange(smlab, "a1", "a2")
    a1_view = SockKey.make(ex.src_ip, ex.client_port, ex.dst_ip, PORT)
    assert ex.keys_connected == {a1_view, a1_view.swapped()}
    assert ex.keys_closed == set()


def test_sockhash_keys_carry_family_then_zero_padding(smlab):
    """Each key the kernel holds has family ENDPOINT_KEY_IPV4 (1) at byte 32 and zero padding at bytes 33-35:
    Cilium's struct sock_key has `__u8 family; __u8 pad7; __u16 pad8;` there (bpf/sockops/bpf_sockops.h:26-28
    at v1.13.0, c9723a8d; the sockops directory is gone at v1.16.0's 82999990), and sk_extract4_key writes
    only the family (bpf/sockops/bpf_sockops.c:26-40 at v1.13.0): no protocol byte 0x06."""
    ex = _exchange(smlab, "a1", "a2")
    assert len(ex.keys_connected) == 2
    for key in ex.keys_connected:
        raw = bytes(key)
        assert (raw[32], raw[33:36]) == (1, b"\0\0\0"), raw.hex()
        assert raw[4:16] == raw[20:32] == bytes(12)  # the IPv6 rest of each address slot


def test_ct_rows_stop_counting_after_the_handshake(smlab):
    """With CT accounting, the OUT and IN rows of a1 → a2 count the 3 handshake segments (each passes one
    lookup of each row: bpf/lib/conntrack.h counts every lookup that finds the entry) and stay at 3 after 1 MiB."""
    ex = _exchange(smlab, "a1", "a2")
    tuple_text = f"{ex.src_ip}:{ex.client_port} -> {ex.dst_ip}:{PORT}"
    want = {f"OUT {tuple_text}": 3, f"IN {tuple_text}": 3}
    assert {k: v for k, v in ex.tcp_packets_connected.items() if k.endswith(tuple_text)} == want
    assert {k: v for k, v in ex.tcp_packets_sent.items() if k.endswith(tuple_text)} == want


def test_cross_node_traffic_is_not_redirected(smlab):
    """a1 → b1 (node-b) is not recorded (the peer is no local endpoint): its data crosses the hooks, at least
    1 MiB / 65,495 bytes of segments, and arrives intact."""
    ex = _exchange(smlab, "a1", "b1")
    assert ex.received == (SIZE, PAYLOAD_SHA256)
    forward = [f for f in ex.data_records() if f.node == "node-a" and f.hook == Hook.FROM_CONTAINER]
    assert len(forward) >= -(-SIZE // MAX_PAYLOAD)
    assert ex.keys_connected == set()


def test_without_sockmap_data_crosses_the_hooks(lab):
    """With sockmap off (the shared lab's default) the same a1 → a2 exchange shows its data segments at a1's
    from-container hook, and the CT rows count them."""
    assert lab.config.sockmap == "off"
    ex = _exchange(lab, "a1", "a2")
    assert ex.received == (SIZE, PAYLOAD_SHA256)
    forward = [f for f in ex.data_records() if f.node == "node-a" and f.hook == Hook.FROM_CONTAINER]
    assert len(forward) >= -(-SIZE // MAX_PAYLOAD)
    tuple_text = f"{ex.src_ip}:{ex.client_port} -> {ex.dst_ip}:{PORT}"
    assert ex.tcp_packets_sent[f"OUT {tuple_text}"] > ex.tcp_packets_connected[f"OUT {tuple_text}"] == 3


def test_fault_sock_no_redirect_sends_through_the_stack(smlab):
    """With the fault sock-no-redirect on, sock_ops records neither end of a1 → a2, so the data crosses a1's
    from-container as with sockmap off (the break-it fault of lab 12), and still arrives intact."""
    smlab.fault("sock-no-redirect")
    try:
        ex = _exchange(smlab, "a1", "a2")
    finally:
        smlab.fault("sock-no-redirect", on=False)
    assert ex.received == (SIZE, PAYLOAD_SHA256)
    assert ex.keys_connected == set()
    forward = [f for f in ex.data_records() if f.node == "node-a" and f.hook == Hook.FROM_CONTAINER]
    assert len(forward) >= -(-SIZE // MAX_PAYLOAD)


def test_sockmap_programs_are_attached_where_cilium_put_them(smlab):
    """cil_sockops is on every pod cgroup of its node as cgroup_sock_ops, cil_redir on the node's sockhash as
    msg_verdict, and both, with cilium_sock_ops, are pinned beside the node's other maps."""
    import json

    for node in ("node-a", "node-b"):
        pins = smlab.pin_dir(node)
        show = json.loads(subprocess.run(["bpftool", "-j", "map", "show", "pinned", f"{pins}/{SOCKOPS_MAP}"],
                                         capture_output=True, text=True, check=True).stdout)
        assert (show["type"], show["bytes_key"], show["bytes_value"], show["max_entries"]) == \
            ("sockhash", 44, 4, 65535)  # struct sock_key, sizeof(int), SOCKOPS_MAP_SIZE
        for pod in smlab.topology.pods_on(node):
            progs = json.loads(subprocess.run(["bpftool", "-j", "cgroup", "show", smlab.cgroup(pod.name)],
                                              capture_output=True, text=True, check=True).stdout)
            assert [(p["attach_type"], p["name"]) for p in progs if p["attach_type"] == "cgroup_sock_ops"] == \
                [("cgroup_sock_ops", "cil_sockops")]
        prog = json.loads(subprocess.run(["bpftool", "-j", "prog", "show", "pinned", f"{pins}/cil_redir"],
                                         capture_output=True, text=True, check=True).stdout)
        assert prog["type"] == "sk_msg"
