"""Services on the real kernel: ClusterIP per-packet LB, hairpin, socket LB, affinity,
backend changes, no backends."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from labkit.config import DatapathConfig
from labkit.constants import DropReason, Verdict
from labkit.maps.ct import CtFlags

from labtag import tagged

from .util import rows, wait_for

VIP_PORT = 80
_GET_MANY = r"""
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    s = socket.create_connection((host, port), timeout=3)
    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
    data = b""
    while True:
        c = s.recv(500)
        if not c:
            break
        data += c
    print(data.split(b"\r\n\r\n", 1)[1].decode().split()[0], s.getsockname()[1], flush=True)
    s.close()
"""


def _gets(lab, pod: str, vip: str, n: int, ports: list | None = None) -> list[str]:
    """n HTTP GETs from ``pod`` to vip:80, each on a new connection: the serving pod of each
    (and the client ports used, appended to ``ports``)."""
    r = lab.pod(pod).exec(sys.executable, "-c", _GET_MANY, vip, str(VIP_PORT), str(n), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line.split() for line in r.stdout.splitlines() if line.strip()]
    if ports is not None:
        ports += [int(port) for _, port in lines]
    return [served.split("=", 1)[1] for served, _ in lines]


def _binomial_bounds(n: int, p: float, tail: float) -> tuple[int, int]:
    """Smallest lo and largest hi with P(X < lo) <= tail and P(X > hi) <= tail for X ~ Bin(n, p)."""
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    lo, acc = 0, 0.0
    while acc + pmf[lo] <= tail:
        acc += pmf[lo]
        lo += 1
    hi, acc = n, 0.0
    while acc + pmf[hi] <= tail:
        acc += pmf[hi]
        hi -= 1
    return lo, hi


def test_clusterip_rows_on_both_nodes(lab):
    """a1 → VIP → b1: node-a has SVC and OUT rows with the service's RevNAT, node-b the IN row;
    the client sees VIP:80 as its peer and the server sees a1's address."""
    svc = lab.services.add("web", VIP_PORT, ["b1:8080"])
    conn = lab.pod("a1").tcp("web", VIP_PORT)
    opened = conn.open()
    assert opened.ok and opened.result["peer"] == f"{svc.vip}:{VIP_PORT}"
    a1, b1 = lab.pod("a1").ip, lab.pod("b1").ip
    svc_rows = rows(lab, "node-a", "TCP", "SVC")
    assert [(r.src, r.sport, r.dst, r.dport) for r in svc_rows] == [(a1, conn.sport, svc.vip, VIP_PORT)]
    assert svc_rows[0].backend_id != 0
    assert svc_rows[0].rev_nat == svc.id
    assert not svc_rows[0].flags & CtFlags.LB_LOOPBACK
    out = rows(lab, "node-a", "TCP", "OUT")
    assert [(r.src, r.sport, r.dst, r.dport, r.rev_nat) for r in out] == [(a1, conn.sport, b1, 8080, svc.id)]
    inn = rows(lab, "node-b", "TCP", "IN")
    assert [(r.src, r.sport, r.dst, r.dport) for r in inn] == [(a1, conn.sport, b1, 8080)]
    assert not rows(lab, "node-b", "TCP", "SVC")
    conn.send(b"ping")
    assert any(f"client={a1}:{conn.sport}" in line for line in lab.pod("b1").server_log())
    # The reply was reverse-translated at node-a's to-container: b1:8080 became VIP:80.
    reply = [f for f in opened.flows if f.node == "node-a" and f.hook.label == "to-container" and f.translated]
    assert reply and reply[0].to_json()["after"]["src"] == svc.vip and reply[0].to_json()["before"]["src"] == b1
    conn.close()


def test_hairpin_three_rows_and_server_sees_loopback(lab):
    """a1 → its own Service: SVC without LBLoopback, OUT and IN from 169.254.42.1 with LBLoopback;
    the server logs 169.254.42.1 as the client."""
    svc = lab.services.add("self", VIP_PORT, ["a1:8080"])
    conn = lab.pod("a1").tcp("self", VIP_PORT)
    assert conn.open().ok
    assert conn.send(b"hairpin").result["reply"] == b"hairpin".hex()
    conn.close()
    a1 = lab.pod("a1").ip
    got = {(r.dir, r.src, r.sport, r.dst, r.dport): r for r in rows(lab, "node-a", "TCP")}
    assert set(got) == {
        ("SVC", a1, conn.sport, svc.vip, VIP_PORT),
        ("OUT", "169.254.42.1", conn.sport, a1, 8080),
        ("IN", "169.254.42.1", conn.sport, a1, 8080),
    }
    assert not got[("SVC", a1, conn.sport, svc.vip, VIP_PORT)].flags & CtFlags.LB_LOOPBACK
    for d in ("OUT", "IN"):
        row = got[(d, "169.254.42.1", conn.sport, a1, 8080)]
        assert CtFlags.names(row.flags) == ["RxClosing", "TxClosing", "LBLoopback", "SeenNonSyn"], row.line()
    assert got[("OUT", "169.254.42.1", conn.sport, a1, 8080)].rev_nat == svc.id
    assert any(f"client=169.254.42.1:{conn.sport}" in line for line in lab.pod("a1").server_log())


def test_hairpin_udp(lab):
    """UDP to the pod's own Service also goes through the loopback address."""
    lab.services.add("selfudp", VIP_PORT, ["a2:8080"], protocol="UDP")
    step = lab.pod("a2").udp("selfudp", VIP_PORT, b"x")
    assert step.ok and step.result["reply_text"].startswith("pod=a2 client=169.254.42.1:")


def test_hairpin_without_loopback_snat_fails_and_trace_shows_where(lab):
    """With the no-loopback-snat fault the hairpin connection fails; the trace shows the
    SYN delivered to the pod with its own address as source, and no answer."""
    lab.services.add("self", VIP_PORT, ["a1:8080"])
    lab.fault("no-loopback-snat")
    step = lab.pod("a1").tcp("self", VIP_PORT).open()
    assert not step.ok
    a1 = lab.pod("a1").ip
    translated = [f for f in step.flows if f.hook.label == "from-container" and f.translated]
    assert translated and all(f.to_json()["after"]["src"] == a1 == f.to_json()["after"]["dst"] for f in translated)
    assert not [r for r in rows(lab, "node-a", "TCP") if r.src == "169.254.42.1"]


def test_skip_rev_nat_fault_breaks_the_reply(lab):
    """With skip-rev-nat the reply keeps the backend's address and the client's connect fails."""
    lab.services.add("web", VIP_PORT, ["b1:8080"])
    lab.fault("skip-rev-nat")
    step = lab.pod("a1").tcp("web", VIP_PORT).open()
    assert not step.ok
    replies = [f for f in step.flows if f.node == "node-a" and f.hook.label == "to-container"]
    assert replies and not any(f.translated for f in replies)


def test_random_backend_choice_is_fair(lab):
    """300 connections over 3 backends: each backend's share lies within a 99.9% binomial bound."""
    assert lab.gc.state()["timer"] is False  # the shared labs collect nothing behind a test's back
    lab.services.add("web", VIP_PORT, ["b1:8080", "b2:8080", "a2:8080"])
    vip = lab.services.get("web").vip
    ports: list[int] = []
    served = _gets(lab, "a1", vip, 300, ports)
    lo, hi = _binomial_bounds(300, 1 / 3, 0.0005)
    counts = {pod: served.count(pod) for pod in ("b1", "b2", "a2")}
    assert sum(counts.values()) == 300
    assert all(lo <= c <= hi for c in counts.values()), (counts, lo, hi)
    # one SVC row per client port: a port the kernel handed out twice reuses its (closed) row
    assert {r.sport for r in rows(lab, "node-a", "TCP", "SVC")} == set(ports), (len(set(ports)), len(ports))


def test_affinity_pins_a_client_to_one_backend(lab):
    """With session affinity every connection of a client goes to the same backend."""
    lab.services.add("sticky", VIP_PORT, ["b1:8080", "b2:8080", "a2:8080"], affinity=300)
    vip = lab.services.get("sticky").vip
    for pod in ("a1", "b2"):
        served = set(_gets(lab, pod, vip, 20))
        assert len(served) == 1, (pod, served)


def test_affinity_follows_the_agents_match_map(lab):
    """Each node pins cilium_lb_affinity_match with one {backend_id, rev_nat_id} key per backend of an affinity
    service (pkg/maps/lbmap/affinity.go:68-83@82999990, read by bpf/lib/lb.h:1429@82999990). When the client's
    backend leaves the service, the agent deletes its keys and the client's next connection goes to a backend
    that is still there, which it then keeps."""
    from labkit.maps.base import PinnedMap
    from labkit.maps.lb import AFFINITY_MATCH_MAP, LbAffinityMatch, LbAffinityMatchValue

    svc = lab.services.add("sticky", VIP_PORT, ["b1:8080", "b2:8080"], affinity=300)

    def matched(node: str) -> set:
        with PinnedMap(f"{lab.pin_dir(node)}/{AFFINITY_MATCH_MAP}", LbAffinityMatch, LbAffinityMatchValue) as m:
            return {(k.rev_nat, k.backend_id) for k in m.keys()}

    assert matched("node-a") == matched("node-b") == {(svc.id, b.id) for b in svc.backends}
    (first,) = set(_gets(lab, "a1", svc.vip, 5))
    svc = lab.services.remove_backend("sticky", f"{first}:8080")
    assert matched("node-a") == {(svc.id, b.id) for b in svc.backends}
    after = set(_gets(lab, "a1", svc.vip, 5))
    assert len(after) == 1 and first not in after, (first, after)


def test_terminating_backend_keeps_established_and_gets_no_new(lab):
    """A backend marked terminating keeps serving its open connection but is never picked again."""
    lab.services.add("web", VIP_PORT, ["b1:8080", "b2:8080"])
    vip = lab.services.get("web").vip
    conns = [lab.pod("a1").tcp("web", VIP_PORT) for _ in range(12)]
    for c in conns:
        assert c.open().ok
    b1_log = "\n".join(lab.pod("b1").server_log())
    b1_conn = next((c for c in conns if f"client={lab.pod('a1').ip}:{c.sport}" in b1_log), None)
    assert b1_conn is not None, "no connection went to b1 in 12 tries"
    lab.services.set_backend_state("web", "b1:8080", "terminating")
    assert b1_conn.send(b"still there").result["reply"] == b"still there".hex()
    assert set(_gets(lab, "a2", vip, 40)) == {"b2"}


def test_no_backends_answers_icmp_port_unreachable(lab):
    """A Service with no backends, per packet: from-container answers the SYN with ICMP port unreachable from the VIP
    (v1.16's default --service-no-backend-response=reject: bpf/bpf_lxc.c:121-124@82999990 tail-calls
    tail_no_service_ipv4, bpf/lib/lb.h:1718-1836@82999990), so connect() fails at once with ECONNREFUSED; the record
    says redirected with reason 'Service backend not found' and no SVC row is written."""
    from labkit.constants import TraceFlags

    svc = lab.services.add("empty", VIP_PORT, [])
    step = lab.pod("a1").tcp("empty", VIP_PORT).open()
    assert not step.ok and step.result["error"] == "ECONNREFUSED", step.result
    assert step.seconds < 2.5, "answered, not timed out"
    answered = [f for f in step.flows if f.event.flags & TraceFlags.NO_BACKEND_REPLY]
    assert answered and answered[0].verdict == Verdict.REDIRECTED
    assert DropReason.text(answered[0].event.drop_reason) == "Service backend not found"
    assert not [f for f in step.flows if f.verdict == Verdict.DROPPED]
    assert not rows(lab, "node-a", "TCP", "SVC") and svc.vip


@pytest.fixture(scope="module")
def socklb_lab():
    """A lab with socket LB for pods too (full)."""
    from labkit import Lab

    lab = Lab.up(tagged("dpsock"), config=DatapathConfig(socket_lb="full"))
    yield lab
    lab.down()


def test_socket_lb_full_rewrites_at_connect(socklb_lab):
    """Socket LB full: no SVC row, packets carry the backend from the first SYN, a reverse-socket
    entry exists, and getpeername() returns the VIP; no backends → EHOSTUNREACH."""
    lab = socklb_lab
    lab.reset()
    svc = lab.services.add("web", VIP_PORT, ["b1:8080"])
    step = lab.pod("a1").tcp("web", VIP_PORT).open()
    assert step.ok and step.result["peer"] == f"{svc.vip}:{VIP_PORT}"
    assert not rows(lab, "node-a", "TCP", "SVC")
    first = step.flows[0]
    assert first.hook.label == "from-container" and first.to_json()["before"]["dst"] == lab.pod("b1").ip
    assert not any(f.translated for f in step.flows)
    r = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", f"{lab.pin_dir('node-a')}/cilium_lb4_reverse_sk"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() not in ("", "[]")
    lab.services.add("empty", VIP_PORT + 1, [])
    refused = lab.pod("a1").tcp("empty", VIP_PORT + 1).open()
    assert refused.result["error"] == "EHOSTUNREACH" and not refused.flows


def test_socket_lb_hostns_leaves_pods_per_packet_and_serves_nodes(lab):
    """hostns (the default): pods take the per-packet path (SVC row), the node's own processes the socket path."""
    assert lab.config.socket_lb == "hostns"
    svc = lab.services.add("web", VIP_PORT, ["b1:8080"])
    assert lab.pod("a1").tcp("web", VIP_PORT).open().ok
    assert rows(lab, "node-a", "TCP", "SVC")
    code = ("import socket;s=socket.create_connection(('%s',%d),timeout=3);print(s.getpeername()[0]);"
            "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n');print(s.recv(300).split(b'\\r\\n\\r\\n')[1].decode())"
            % (svc.vip, VIP_PORT))
    r = lab.node("node-b").exec(sys.executable, "-c", code)
    assert r.stdout.split()[0] == svc.vip and "pod=b1" in r.stdout, r.stdout + r.stderr


def test_socket_lb_nodeport_of_another_node_takes_the_surrogate(lab):
    """A node's process connecting to the other node's address:nodePort: that frontend is not in this node's maps,
    so connect() looks up the surrogate 0.0.0.0:nodePort (the address has identity remote-node in the ipcache and
    the port is in the NodePort range: sock4_wildcard_lookup, bpf/bpf_sock.c:186-216@82999990, tried after the
    direct lookup fails, bpf/bpf_sock.c:320-323@82999990) and rewrites it to the backend; getpeername() shows the
    address it asked for, and node-b makes no SVC row (no packet ever went to its frontend)."""
    svc = lab.services.add("web", 80, ["b1:8080"], type="NodePort")
    node_b = lab.topology.node("node-b").ip
    assert f"{node_b}:{svc.node_port}" not in {r.frontend for r in lab.services.lb("node-a").rows()}
    code = ("import socket;s=socket.create_connection(('%s',%d),timeout=3);print('%%s:%%d' %% s.getpeername());"
            "s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n');print(s.recv(300).split(b'\\r\\n\\r\\n')[1].decode())"
            % (node_b, svc.node_port))
    r = lab.node("node-a").exec(sys.executable, "-c", code)
    assert r.stdout.split()[0] == f"{node_b}:{svc.node_port}" and "pod=b1" in r.stdout, r.stdout + r.stderr
    assert not rows(lab, "node-b", "TCP", "SVC") and not rows(lab, "node-a", "TCP", "SVC")


def test_close_after_the_server_closed_first(lab):
    """close() after an HTTP answer (the server's FIN came first) ends on the server's ACK."""
    conn = lab.pod("a1").tcp("b1", 8080)
    conn.open()
    answer = conn._call("tcp_send", data=b"GET / HTTP/1.0\r\n\r\n".hex())  # the server answers, then closes
    assert answer["ok"] and bytes.fromhex(answer["reply"]).startswith(b"HTTP/1.0 200")
    closed = conn.close()
    assert closed.result["peer_closed_first"] is True


def test_socket_lb_to_itself_stays_on_loopback(socklb_lab):
    """With socket LB full, a pod reaching its own Service is connected to itself over loopback: the
    step completes with no packets at the hooks and says so."""
    lab = socklb_lab
    lab.reset()
    lab.services.add("self", VIP_PORT, ["a1:8080"])
    conn = lab.pod("a1").tcp("self", VIP_PORT)
    step = conn.open()
    assert step.ok and conn.loopback and not step.flows and "loopback" in step.result["note"]
    assert conn.send(b"me").result["reply"] == b"me".hex()
    conn.close()
