"""Socket LB on the real kernel, as Cilium v1.16's bpf_sock.c: unconnected UDP balanced per datagram at
cgroup/sendmsg4 and answered from the VIP at cgroup/recvmsg4, the UDP backend slot taken from the socket
cookie, connected UDP, session affinity keyed on the network namespace, services without backends, and
the cilium_lb4_reverse_sk map."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.config import DatapathConfig
from labkit.net.ledger import Ledger
from labkit.maps.base import PinnedMap
from labkit.maps.lb import (
    AFFINITY_MAP,
    BACKENDS_MAP,
    REVERSE_SK_MAP,
    SERVICES_MAP,
    Ipv4RevnatEntry,
    Ipv4RevnatTuple,
    Lb4AffinityKey,
    Lb4Backend,
    Lb4BackendKey,
    Lb4Key,
    Lb4Service,
    LbAffinityVal,
)

from labtag import tagged

from .util import rows

DNS_PORT = 53
#: labkit's name of each socket hook → how bpftool names its attach type.
SOCKET_ATTACH = {"connect4": "cgroup_inet4_connect", "sendmsg4": "cgroup_udp4_sendmsg",
                 "recvmsg4": "cgroup_udp4_recvmsg", "getpeername4": "cgroup_inet4_getpeername"}

# One process, ``n`` UDP sockets (more, up to 64, while ``spread`` asks for both cookie parities), each
# sending ``per`` datagrams to host:port and reading every answer with recvfrom(). ``mode`` 'sendto' leaves
# the socket unconnected; 'connect' connects it first and uses send(). One JSON line per socket: its cookie
# (SO_COOKIE, what bpf_get_socket_cookie returns), its netns cookie (SO_NETNS_COOKIE), local port, peer
# (connected only), each answer's source as recvfrom() reported it and its text, or the errno name.
_UDP_CLIENT = r"""
import errno, json, socket, sys
SO_COOKIE, SO_NETNS_COOKIE = 57, 71
mode, host, port, n, per, spread = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
def cookie(s, opt):
    return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, opt, 8), "little")
out, keep = [], []
while len(out) < n or (spread and len({r["cookie"] % 2 for r in out}) < 2 and len(out) < 64):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    keep.append(s)
    rec = {"cookie": cookie(s, SO_COOKIE), "netns": cookie(s, SO_NETNS_COOKIE), "answers": [], "error": None}
    try:
        if mode == "connect":
            s.connect((host, port))
            rec["peer"] = list(s.getpeername())
        for k in range(per):
            payload = ("%d-%d" % (len(out), k)).encode()
            s.send(payload) if mode == "connect" else s.sendto(payload, (host, port))
            data, src = s.recvfrom(2000)
            rec["answers"].append({"src": list(src), "text": data.decode()})
        rec["local"] = s.getsockname()[1]
    except OSError as exc:
        rec["error"] = errno.errorcode.get(exc.errno, str(exc.errno))
    out.append(rec)
for rec in out:
    print(json.dumps(rec))
"""

# connect() to host:port over TCP: "connected <peer>" or the errno name; with "get", an HTTP GET whose
# answer names the pod that served it.
_TCP_CONNECT = r"""
import errno, socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
except OSError as exc:
    print(errno.errorcode.get(exc.errno, str(exc.errno)))
    sys.exit()
print("connected", s.getpeername()[0])
if sys.argv[3:] == ["get"]:
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    print(s.recv(300).split(b"\r\n\r\n")[1].decode().split()[0])
"""

# A connected UDP socket that answers "peer" on stdin with getpeername(), until stdin closes.
_UDP_PEER = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((sys.argv[1], int(sys.argv[2])))
print(*s.getpeername(), flush=True)
for line in sys.stdin:
    print(*s.getpeername(), flush=True)
"""


@pytest.fixture(scope="module")
def socklb(_require_datapath):
    """A lab with socket LB for node processes and pods (full), reset for each test."""
    from labkit import Lab
    from labkit.net.build import cgroup_root

    lab = Lab.up(tagged("dpsocklb"), config=DatapathConfig(socket_lb="full", gc_timer=False))
    yield lab
    lab.down()
    root = cgroup_root()
    assert root is None or not (root / "labkit" / lab.name).exists(), "a cgroup of the lab is left"


@pytest.fixture
def lab(socklb):
    socklb.reset()
    return socklb


def _udp(lab, client: str, vip: str, port: int, n: int = 1, per: int = 1, mode: str = "sendto",
         spread: bool = False) -> list[dict]:
    """Run the UDP client in ``client`` (a node or pod: its namespace and cgroup); one dict per socket."""
    r = lab.exec(client, [sys.executable, "-c", _UDP_CLIENT, mode, vip, str(port), str(n), str(per),
                          "1" if spread else "0"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def _served_by(answer: dict) -> str:
    """The pod that answered: the echo server's text starts ``pod=<name>``."""
    return answer["text"].split()[0].split("=", 1)[1]


def _slot_pods(lab, svc, node: str = "node-a") -> dict[int, str]:
    """Slot → backend pod of ``svc``'s external scope, as the node's maps hold them."""
    pods = {lab.pod(p.name).ip: p.name for p in lab.topology.pods}
    pin = lab.pin_dir(node)
    with PinnedMap(f"{pin}/{SERVICES_MAP}", Lb4Key, Lb4Service) as m:
        ids = {k.backend_slot: v.backend_id for k, v in m.items()
               if (k.vip, k.port, k.scope) == (svc.vip, svc.port, 0) and k.backend_slot}
    with PinnedMap(f"{pin}/{BACKENDS_MAP}", Lb4BackendKey, Lb4Backend) as m:
        where = {k.backend_id: v.ip for k, v in m.items()}
    return {slot: pods[where[bid]] for slot, bid in ids.items()}


def _log_marks(lab, pods) -> dict[str, int]:
    return {p: len(lab.pod(p).server_log()) for p in pods}


def _udp_log(lab, pod: str, since: int) -> list[tuple[str, int]]:
    """Client address and port of each datagram ``pod``'s server logged after line ``since``."""
    lines = lab.pod(pod).server_log()[since:]
    clients = [line.split("client=")[1].split()[0].rsplit(":", 1) for line in lines if " udp pod=" in line]
    return [(ip, int(port)) for ip, port in clients]


@pytest.mark.parametrize("client", ["node-a", "a1"])
def test_unconnected_udp_is_balanced_by_socket_cookie_and_answered_from_the_vip(lab, client):
    """sendto() a ClusterIP with two backends: every datagram answered, recvfrom() reports VIP:port each
    time; a socket's backend is slot cookie % 2 + 1 (Cilium's sock_select_slot), so one socket always
    reaches the same backend and sockets whose cookies differ in parity reach both; the servers' logs agree."""
    svc = lab.services.add("dns", DNS_PORT, ["b1:8080", "b2:8080"], protocol="UDP")
    slots = _slot_pods(lab, svc)
    assert sorted(slots) == [1, 2] and sorted(slots.values()) == ["b1", "b2"]
    marks = _log_marks(lab, ("b1", "b2"))

    one = _udp(lab, client, svc.vip, DNS_PORT, n=1, per=8)
    many = _udp(lab, client, svc.vip, DNS_PORT, n=8, per=2, spread=True)
    for sock in one + many:
        assert sock["error"] is None, sock
        assert len(sock["answers"]) == (8 if sock in one else 2)
        assert all(a["src"] == [svc.vip, DNS_PORT] for a in sock["answers"]), sock["answers"]
        expected = slots[sock["cookie"] % 2 + 1]
        assert {_served_by(a) for a in sock["answers"]} == {expected}, (sock["cookie"], sock["answers"])
    assert len({s["cookie"] % 2 for s in many}) == 2, "the client found no two cookies of different parity"
    assert {_served_by(a) for s in many for a in s["answers"]} == {"b1", "b2"}

    # The servers saw each socket's datagrams from its own address and port: only the destination changed.
    source = lab.pod(client).ip if client == "a1" else lab.topology.node(client).ip
    logged = {p: _udp_log(lab, p, marks[p]) for p in ("b1", "b2")}
    for sock in one + many:
        pod = slots[sock["cookie"] % 2 + 1]
        other = "b2" if pod == "b1" else "b1"
        me = (source, sock["local"])
        assert logged[pod].count(me) == len(sock["answers"]) and me not in logged[other], (me, logged)


@pytest.mark.parametrize("client", ["node-a", "a1"])
def test_socket_lb_creates_no_svc_entry_and_records_each_socket(lab, client):
    """Socket-LB traffic, UDP and TCP, leaves no SVC row and no CT row naming the VIP on the node: packets
    carry the backend from the first one; cilium_lb4_reverse_sk holds {cookie, backend, port} →
    {VIP, port, rev_nat} for every socket."""
    udp = lab.services.add("dns", DNS_PORT, ["b1:8080", "b2:8080"], protocol="UDP")
    web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    socks = _udp(lab, client, udp.vip, DNS_PORT, n=4, per=1)
    r = lab.exec(client, [sys.executable, "-c", _TCP_CONNECT, web.vip, "80"])
    assert r.stdout.split() == ["connected", web.vip], r.stdout + r.stderr
    assert not rows(lab, "node-a", direction="SVC") and not rows(lab, "node-b", direction="SVC")
    assert not [row for row in lab.ct("node-a") if web.vip in (row.src, row.dst) or udp.vip in (row.src, row.dst)]

    with PinnedMap(f"{lab.pin_dir('node-a')}/{REVERSE_SK_MAP}", Ipv4RevnatTuple, Ipv4RevnatEntry) as m:
        entries = {k.cookie: (k, v) for k, v in m.items()}
    slots = _slot_pods(lab, udp)
    for sock in socks:
        key, val = entries[sock["cookie"]]
        backend = slots[sock["cookie"] % 2 + 1]
        assert str(key) == f"cookie {sock['cookie']} {lab.pod(backend).ip}:8080"
        assert str(val) == f"{udp.vip}:{DNS_PORT} rev_nat {udp.id}"


def test_connected_udp_is_translated_once_at_connect(lab):
    """A connected UDP socket is balanced by connect4 (its cookie's slot as well); send() then carries no
    address, and recvfrom() and getpeername() report the VIP."""
    svc = lab.services.add("dns", DNS_PORT, ["b1:8080", "b2:8080"], protocol="UDP")
    slots = _slot_pods(lab, svc)
    socks = _udp(lab, "a1", svc.vip, DNS_PORT, n=4, per=3, mode="connect", spread=True)
    for sock in socks:
        assert sock["error"] is None and sock["peer"] == [svc.vip, DNS_PORT], sock
        assert all(a["src"] == [svc.vip, DNS_PORT] for a in sock["answers"])
        assert {_served_by(a) for a in sock["answers"]} == {slots[sock["cookie"] % 2 + 1]}
    assert not rows(lab, "node-a", direction="SVC")


def test_reverse_entry_of_a_removed_service_is_stale(lab):
    """getpeername() reports the VIP while the service stands; once it is removed, the reverse translation
    finds the entry stale (Cilium's __sock4_xlate_rev checks the service and its rev_nat), deletes it, and
    the socket's real peer, the backend, shows."""
    svc = lab.services.add("dns", DNS_PORT, ["b2:8080"], protocol="UDP")
    proc = lab.popen("a1", [sys.executable, "-c", _UDP_PEER, svc.vip, str(DNS_PORT)],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split() == [svc.vip, str(DNS_PORT)]
        reverse = f"{lab.pin_dir('node-a')}/{REVERSE_SK_MAP}"
        with PinnedMap(reverse, Ipv4RevnatTuple, Ipv4RevnatEntry) as m:
            assert [str(v) for _, v in m.items()] == [f"{svc.vip}:{DNS_PORT} rev_nat {svc.id}"]
        lab.services.remove("dns")
        proc.stdin.write("peer\n")
        proc.stdin.flush()
        assert proc.stdout.readline().split() == [lab.pod("b2").ip, "8080"]
        with PinnedMap(reverse, Ipv4RevnatTuple, Ipv4RevnatEntry) as m:
            assert not m.items()
    finally:
        proc.stdin.close()
        proc.wait(5)


def _affinity_rows(lab, svc) -> list[tuple[Lb4AffinityKey, LbAffinityVal]]:
    with PinnedMap(f"{lab.pin_dir('node-a')}/{AFFINITY_MAP}", Lb4AffinityKey, LbAffinityVal) as m:
        return [(k, v) for k, v in m.items() if k.rev_nat == svc.id]


def test_affinity_keeps_a_namespace_on_one_backend_across_sockets(lab):
    """With session affinity, every socket of one namespace reaches the backend its first socket got, whatever
    its cookie; cilium_lb4_affinity holds one entry per namespace with netns_cookie=1 and client_id = the
    namespace's cookie (SO_NETNS_COOKIE), in the map the tc path keys by address."""
    svc = lab.services.add("sticky", DNS_PORT, ["b1:8080", "b2:8080"], protocol="UDP", affinity=300)
    by_client = {}
    for client in ("node-a", "a1"):
        socks = _udp(lab, client, svc.vip, DNS_PORT, n=8, per=1, spread=True)
        assert len({s["cookie"] % 2 for s in socks}) == 2  # without affinity these would reach both backends
        served = {_served_by(a) for s in socks for a in s["answers"]}
        assert len(served) == 1 and all(s["error"] is None for s in socks), socks
        assert len({s["netns"] for s in socks}) == 1
        by_client[client] = (socks[0]["netns"], served.pop())
    assert by_client["node-a"][0] != by_client["a1"][0]

    ids = {b.pod: b.id for b in lab.services.get("sticky").backends}
    entries = _affinity_rows(lab, svc)
    assert len(entries) == 2, [str(k) for k, _ in entries]
    for key, val in entries:
        assert key.netns_cookie == 1 and key.pad1 == 0 and key.pad2 == 0
        netns, pod = next(v for v in by_client.values() if v[0] == key.client_id)
        assert val.backend_id == ids[pod]

    # TCP connects of one namespace follow its entry too (random slots otherwise).
    web = lab.services.add("stickyweb", 80, ["b1:8080", "b2:8080"], affinity=300)
    served = set()
    for _ in range(6):
        r = lab.exec("a1", [sys.executable, "-c", _TCP_CONNECT, web.vip, "80", "get"])
        assert r.stdout.split()[:2] == ["connected", web.vip], r.stdout + r.stderr
        served.add(r.stdout.split()[2])
    assert len(served) == 1, served
    assert [k.netns_cookie for k, _ in _affinity_rows(lab, web)] == [1]


@pytest.mark.parametrize("client", ["node-a", "a1"])
def test_service_without_backends_fails_with_ehostunreach(lab, client):
    """A service with no backends: sendto() and connect() (TCP and UDP) fail with EHOSTUNREACH, the errno
    Cilium's cil_sock4_sendmsg / cil_sock4_connect set (try_set_retval(-EHOSTUNREACH)); nothing is sent."""
    udp = lab.services.add("nodns", DNS_PORT, [], protocol="UDP")
    tcp = lab.services.add("noweb", 80, [])
    assert [s["error"] for s in _udp(lab, client, udp.vip, DNS_PORT)] == ["EHOSTUNREACH"]
    assert [s["error"] for s in _udp(lab, client, udp.vip, DNS_PORT, mode="connect")] == ["EHOSTUNREACH"]
    r = lab.exec(client, [sys.executable, "-c", _TCP_CONNECT, tcp.vip, "80"])
    assert r.stdout.split() == ["EHOSTUNREACH"], r.stdout + r.stderr
    assert not rows(lab, "node-a", "UDP") and not rows(lab, "node-a", "TCP")


def test_reverse_sk_map_holds_cilium_default_entries(lab):
    """cilium_lb4_reverse_sk is an LRU hash of 262144 entries (Cilium's --bpf-sock-rev-map-max default),
    16-byte ipv4_revnat_tuple keys and 8-byte ipv4_revnat_entry values."""
    for node in ("node-a", "node-b"):
        r = subprocess.run(["bpftool", "-j", "map", "show", "pinned", f"{lab.pin_dir(node)}/{REVERSE_SK_MAP}"],
                           capture_output=True, text=True, check=True)
        info = json.loads(r.stdout)
        assert (info["type"], info["bytes_key"], info["bytes_value"], info["max_entries"]) == \
            ("lru_hash", 16, 8, 262144), info


def test_socket_programs_attach_to_every_socket_lb_cgroup(lab):
    """connect4, sendmsg4, recvmsg4 and getpeername4 are attached to the node's cgroup and (full) its pods',
    each recorded in the ledger, so that down detaches every one."""
    ledger = [e for e in Ledger(lab.name).entries() if e["kind"] == "cgroup-prog"]
    for node in ("node-a", "node-b"):
        members = [node] + [p.name for p in lab.topology.pods_on(node)]
        for member in members:
            cg = lab.cgroup(member)
            r = subprocess.run(["bpftool", "-j", "cgroup", "show", cg], capture_output=True, text=True, check=True)
            attached = {(p["attach_type"], p["name"]) for p in json.loads(r.stdout)}
            assert attached == {(bpftool, f"cil_sock4_{t[:-1]}") for t, bpftool in SOCKET_ATTACH.items()}, member
            assert sorted(e["name"] for e in ledger if e["cgroup"] == cg) == \
                sorted(f"labkit-sock4-{t[:-1]}" for t in SOCKET_ATTACH)
