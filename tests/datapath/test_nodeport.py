"""NodePort and LoadBalancer services reached from outside: dsr, snat and hybrid modes, externalTrafficPolicy,
Maglev, and malformed packets on the wire — real packets from the external client `ext`."""
from __future__ import annotations

import json
import socket
import sys

import pytest

from labkit.addr import be32 as _be32
from labkit.config import DatapathConfig
from labkit.constants import DropReason, Hook
from labkit.maglev import backend_name, cilium_seed, flow_slot, lookup_table
from labkit.maps.ct import CtFlags

from labtag import tagged

from .util import wait_for

EXT = "198.51.100.100"
NODE_A, NODE_B = "198.51.100.11", "198.51.100.12"
B1, A1 = "198.18.2.11", "198.18.1.11"
TCP, UDP = 6, 17


def logged(lab, pod: str, text: str) -> None:
    """Wait until the last line ``pod``'s server logged says ``text``: the server logs a connection after
    accept(), which may come just after the handshake the step waited for."""
    wait_for(lambda: text in (lab.pod(pod).server_log() or [""])[-1], what=f"{pod}'s server to log {text!r}")


def _lab(name: str, **options):
    from labkit import Lab

    lab = Lab.up(name, config=DatapathConfig(**options))
    yield lab
    lab.down()


@pytest.fixture(scope="module")
def _snat(_require_datapath):
    yield from _lab(tagged("dpsnat"), routing="native", lb_mode="snat")


@pytest.fixture(scope="module")
def _hybrid(_require_datapath):
    yield from _lab(tagged("dphybrid"), routing="tunnel", lb_mode="hybrid", maglev_table_size=16381)


@pytest.fixture
def snat_lab(_snat):
    _snat.reset()
    return _snat


@pytest.fixture
def hybrid_lab(_hybrid):
    _hybrid.reset()
    return _hybrid


def rows(lab, node: str, dir: str, proto: int = TCP) -> list:
    """The node's CT rows of one direction and protocol, RELATED twins left out."""
    return [r for r in lab.ct(node) if r.dir == dir and r.proto == proto and not r.related]


def frontend_id(svc, type_: str, address: str | None = None) -> int:
    return next(fe.id for fe in svc.frontends if fe.type == type_ and (address is None or fe.address == address))


def packets_to_client(step) -> list:
    """Every trace record of a packet addressed to the external client, before or after translation."""
    ext = _be32(EXT)
    return [f for f in step.flows if ext in (f.event.before.daddr, f.event.after.daddr)]


def test_dsr_lb_vip_backend_on_other_node(any_lab):
    """dsr: node-a keeps only the SVC row; node-b the DSRInternal OUT row keyed client -> backend, the pod's
    own IN row and the NAT row {b1:8080 -> ext:cp} -> VIP:80; the client talks to VIP:80 and no reply
    packet touches node-a."""
    lab = any_lab
    svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    conn = lab.external("ext").tcp("web", 80)
    opened = conn.open()
    assert opened.ok and opened.result["peer"] == f"{svc.lb_vip}:80"
    cp = opened.result["sport"]

    (svc_row,) = rows(lab, "node-a", "SVC")
    assert (svc_row.src, svc_row.sport, svc_row.dst, svc_row.dport) == (EXT, cp, svc.lb_vip, 80)
    assert not svc_row.flags & CtFlags.NODE_PORT  # Cilium's lb4_local gets a fresh ct_state
    assert svc_row.rev_nat == frontend_id(svc, "LoadBalancer")
    assert svc_row.backend_id == svc.backend("b1:8080").id
    assert rows(lab, "node-a", "OUT") == [] and rows(lab, "node-a", "IN") == []
    assert lab.nat("node-a") == []

    # nodeport_dsr_ingress_ipv4 keys the entry like any OUT entry of a client on this node: C:cp -> B:bp.
    (out,) = rows(lab, "node-b", "OUT")
    assert (out.src, out.sport, out.dst, out.dport) == (EXT, cp, B1, 8080)
    assert out.flags & CtFlags.DSR_INTERNAL and not out.flags & CtFlags.NODE_PORT
    assert not [r for r in lab.ct("node-b") if r.related and r.dir == "OUT"]  # ct_create4 got no related map
    (inn,) = rows(lab, "node-b", "IN")  # the backend pod's own ingress entry
    assert (inn.src, inn.sport, inn.dst, inn.dport, inn.src_sec_id) == (EXT, cp, B1, 8080, 2)
    (nat,) = lab.nat("node-b")
    assert (nat.dir, nat.src, nat.sport, nat.dst, nat.dport) == ("OUT", B1, 8080, EXT, cp)
    assert (nat.to_addr, nat.to_port) == (svc.lb_vip, 80)
    logged(lab, "b1", f"client={EXT}:{cp}")  # DSR keeps the client's address

    replies = packets_to_client(opened)
    assert replies and {f.node for f in replies} == {"node-b"}
    leaving = [f for f in replies if f.hook == Hook.TO_NETDEV]
    assert leaving and all(f.event.after.saddr == _be32(svc.lb_vip) for f in leaving)

    sent = conn.send(b"dsr")
    assert sent.result["reply"] == b"dsr".hex()
    assert packets_to_client(sent) and {f.node for f in packets_to_client(sent)} == {"node-b"}
    conn.close()


def test_dsr_udp_answers_from_the_vip(any_lab):
    """dsr with UDP: every datagram carries the option; the connected client socket accepts the answer,
    so it came from VIP:53; node-b's NAT row maps b1:8080 -> ext to the VIP."""
    lab = any_lab
    svc = lab.services.add("dns", 53, ["b1:8080"], protocol="UDP", type="LoadBalancer")
    step = lab.external("ext").udp("dns", 53, b"query")
    assert step.ok and step.result["reply_text"] == f"pod=b1 client={EXT}:{step.result['sport']} data=query"
    (nat,) = lab.nat("node-b")
    assert (nat.proto, nat.src, nat.to_addr, nat.to_port) == (UDP, B1, svc.lb_vip, 53)
    assert any(f.node == "node-a" and f.event.flags & 0x01 for f in step.flows)  # option added on node-a
    assert any(f.node == "node-b" and f.event.flags & 0x02 for f in step.flows)  # and stripped on node-b


def test_snat_reply_returns_through_lb_node(snat_lab):
    """snat: node-a SNATs to its own address (NAT OUT XLATE_SRC, NAT IN XLATE_DST), tracks the flow with a
    NodePort OUT row, and the reply leaves for the client from node-a."""
    lab = snat_lab
    svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    conn = lab.external("ext").tcp("web", 80)
    opened = conn.open()
    assert opened.ok and opened.result["peer"] == f"{svc.lb_vip}:80"
    cp = opened.result["sport"]

    nat = {r.dir: r for r in lab.nat("node-a")}
    assert set(nat) == {"OUT", "IN"} and len(lab.nat("node-a")) == 2
    out, back = nat["OUT"], nat["IN"]
    assert (out.src, out.sport, out.dst, out.dport, out.to_addr) == (EXT, cp, B1, 8080, NODE_A)
    nat_port = out.to_port
    assert 32768 <= nat_port <= 65535
    assert (back.src, back.sport, back.dst, back.dport) == (B1, 8080, NODE_A, nat_port)
    assert (back.to_addr, back.to_port) == (EXT, cp)
    logged(lab, "b1", f"client={NODE_A}:{nat_port}")

    (ct_out,) = rows(lab, "node-a", "OUT")
    assert ct_out.flags & CtFlags.NODE_PORT and ct_out.rev_nat == frontend_id(svc, "LoadBalancer")
    assert (ct_out.src, ct_out.sport, ct_out.dst, ct_out.dport) == (EXT, cp, B1, 8080)
    assert lab.nat("node-b") == []

    replies = packets_to_client(opened)
    assert replies and {f.node for f in replies} == {"node-a"}
    back_in = [f for f in opened.flows if f.node == "node-a" and f.hook == Hook.FROM_NETDEV
               and f.event.before.daddr == _be32(NODE_A)]
    assert back_in and all(f.event.after.saddr == _be32(svc.lb_vip) and f.event.after.daddr == _be32(EXT)
                           for f in back_in)
    assert conn.send(b"snat").result["reply"] == b"snat".hex()
    conn.close()


def test_hybrid_tcp_goes_dsr_udp_goes_snat(hybrid_lab):
    """hybrid: a TCP flow leaves its NAT row on the backend's node (DSR), a UDP flow its two rows on the
    node that load-balanced (SNAT)."""
    lab = hybrid_lab
    lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    lab.services.add("dns", 53, ["b1:8080"], protocol="UDP", type="LoadBalancer")
    ext = lab.external("ext")
    conn = ext.tcp("web", 80)
    assert conn.open().ok
    assert ext.udp("dns", 53, b"q").ok
    assert [(r.proto, r.dir) for r in lab.nat("node-b")] == [(TCP, "OUT")]
    assert sorted((r.proto, r.dir) for r in lab.nat("node-a")) == [(UDP, "IN"), (UDP, "OUT")]
    conn.close()


def _maglev_names(lab, backends, protocol: str) -> dict[str, int]:
    """Backend name -> id as the lab's Cilium release hashes them (v1.16 "ip:port")."""
    return {backend_name(lab.topology.pod(b.pod).ip, b.port, protocol, lab.config.cilium): b.id for b in backends}


def test_maglev_at_cilium_default_size(hybrid_lab):
    """At Cilium's default M=16381 and hash seed the datapath holds the Python table and sends 200 UDP flows
    exactly where the table and flow hash say (hybrid mode: UDP goes by SNAT)."""
    lab = hybrid_lab
    assert lab.config.maglev_table_size == 16381
    svc = lab.services.add("dns", 53, ["a1:8080", "a2:8080", "b1:8080", "b2:8080"], protocol="UDP",
                           type="LoadBalancer", algorithm="maglev")
    table = lookup_table(_maglev_names(lab, svc.backends, "UDP"), 16381, cilium_seed())
    bpf, expected = lab.services.maglev("dns", "node-b")[frontend_id(svc, "LoadBalancer")]
    assert list(bpf.backend_ids) == table == list(expected.backend_ids)
    lab.trace_mode("drops")
    try:
        chosen = _backend_by_port(lab, svc.lb_vip, 30000, 200)
    finally:
        lab.trace_mode("all")
    assert chosen == {p: table[flow_slot(EXT, p, 53, UDP, 16381)] for p in range(30000, 30200)}


def test_nodeport_on_node_b_reaches_backend_on_node_a(native_lab):
    """NodePort on node-b's address: node-b load-balances to a1 on node-a (SVC row with node-b's frontend id),
    and the client talks to node-b:30080 throughout."""
    lab = native_lab
    svc = lab.services.add("web", 80, ["a1:8080"], type="NodePort", node_port=30080)
    conn = lab.external("ext").tcp("node-b", 30080)
    opened = conn.open()
    assert opened.ok and opened.result["peer"] == f"{NODE_B}:30080"
    (svc_row,) = rows(lab, "node-b", "SVC")
    assert svc_row.rev_nat == frontend_id(svc, "NodePort", NODE_B) and not svc_row.flags & CtFlags.NODE_PORT
    (out,) = rows(lab, "node-a", "OUT")
    assert (out.src, out.dst, out.dport) == (EXT, A1, 8080) and out.flags & CtFlags.DSR_INTERNAL
    logged(lab, "a1", f"client={EXT}:")
    conn.close()


def test_etp_local_node_without_local_backend_answers_port_unreachable(native_lab):
    """eTP=Local: node-b has no backend of its own, so its NodePort's external scope counts 0: from-netdev answers
    ext's SYN with ICMP port unreachable from node-b's address (nodeport_svc_lb4 tail-calls tail_no_service_ipv4 on
    DROP_NO_SERVICE, bpf/lib/nodeport.h:2849-2856@82999990; v1.16's default --service-no-backend-response=reject),
    sent back out of eth0: connect() fails at once with ECONNREFUSED, no packet is dropped and no CT row is made."""
    from labkit.constants import TraceFlags

    lab = native_lab
    lab.services.add("web", 80, ["a1:8080"], type="NodePort", node_port=30080, etp="Local")
    opened = lab.external("ext").tcp("node-b", 30080).open()
    assert not opened.ok and opened.result["error"] == "ECONNREFUSED", opened.result
    answered = [f for f in opened.flows if f.event.flags & TraceFlags.NO_BACKEND_REPLY]
    assert answered and all((f.node, f.hook) == ("node-b", Hook.FROM_NETDEV) for f in answered)
    assert {f.event.drop_reason for f in answered} == {DropReason.NO_SERVICE}
    assert not [f for f in opened.flows if f.dropped]
    assert lab.ct("node-b") == [] and lab.ct("node-a") == []


def test_etp_local_answers_locally_and_pods_still_reach_every_backend(native_lab):
    """eTP=Local with backends a1 and b1: outside clients of node-b's NodePort always get b1 and no packet
    crosses to node-a; a pod uses the internal scope and reaches both backends."""
    lab = native_lab
    svc = lab.services.add("web", 80, ["a1:8080", "b1:8080"], type="NodePort", node_port=30080, etp="Local")
    ext = lab.external("ext")
    for _ in range(5):
        conn = ext.tcp("node-b", 30080)
        opened = conn.open()
        assert opened.ok and {f.node for f in opened.flows} == {"node-b"}
        conn.close()
    assert {r.backend_id for r in rows(lab, "node-b", "SVC")} == {svc.backend("b1:8080").id}
    row = next(r for r in lab.services.lb("node-b").rows() if r.vip == NODE_B)
    assert "Local" in row.to_json()["flags"]

    for _ in range(24):
        conn = lab.pod("a2").tcp("node-a", 30080)
        assert conn.open().ok
        conn.close()
    seen = {r.backend_id for r in rows(lab, "node-a", "SVC")}
    assert seen == {svc.backend("a1:8080").id, svc.backend("b1:8080").id}


def test_pod_to_another_nodes_nodeport_is_balanced_there(native_lab):
    """Each node's maps hold its own NodePort address and the surrogate 0.0.0.0:nodePort, not the other node's
    (pkg/k8s/service.go:203-216,244-248@82999990): a pod's connection to node-b's NodePort finds no frontend at its
    own from-container (lb4_lookup_service of the destination, bpf/bpf_lxc.c:100@82999990), so node-a makes no SVC
    row and node-b's from-netdev load-balances it (bpf/lib/nodeport.h:2988@82999990)."""
    lab = native_lab
    svc = lab.services.add("web", 80, ["b1:8080", "b2:8080"], type="NodePort", node_port=30080)
    keys = {r.frontend for r in lab.services.lb("node-a").rows()}
    assert f"{NODE_B}:30080" not in keys and "0.0.0.0:30080" in keys
    conn = lab.pod("a2").tcp("node-b", 30080)
    opened = conn.open()
    assert opened.ok
    conn.close()
    assert not rows(lab, "node-a", "SVC")
    assert {r.backend_id for r in rows(lab, "node-b", "SVC")} <= {b.id for b in svc.backends}
    assert [r for r in rows(lab, "node-b", "SVC")]


def test_maglev_bpf_table_equals_python_table(native_lab):
    """The Maglev table the agent wrote into cilium_lb4_maglev (read back through the inner map) equals
    labkit.maglev.lookup_table for every NodePort and LoadBalancer frontend a node holds: the lab's default size is
    Cilium's (16381), the seed Cilium's default's; the ClusterIP frontend and the surrogate 0.0.0.0 have no table
    (svcInfo.useMaglev, pkg/service/service.go:173,177@82999990), and a node has none for the other node's
    NodePort address, which its maps do not hold."""
    lab = native_lab
    assert lab.config.maglev_table_size == 16381
    svc = lab.services.add("web", 80, ["a1:8080", "a2:8080", "b1:8080", "b2:8080"], type="LoadBalancer",
                           algorithm="maglev")
    want = lookup_table(_maglev_names(lab, svc.backends, "TCP"), 16381, cilium_seed())
    for node in ("node-a", "node-b"):
        tables = lab.services.maglev("web", node)
        assert set(tables) == set(svc.ids)
        ip = lab.topology.node(node).ip
        with_table = {fe.id for fe in svc.frontends if fe.type != "ClusterIP" and not fe.surrogate
                      and svc.on_node(fe, ip)}
        assert len(with_table) == 2  # the node's own NodePort address and the LoadBalancer VIP
        for fid, (bpf, expected) in tables.items():
            if fid in with_table:
                assert bpf is not None and list(bpf.backend_ids) == want == list(expected.backend_ids)
            else:
                assert (bpf, expected) == (None, None)


_UDP_BURST = r"""
import socket, sys
vip, port, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
for sport in range(first, first + n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", sport))
    s.sendto(b"maglev", (vip, port))
    s.close()
"""


def _backend_by_port(lab, vip: str, first: int, n: int) -> dict[int, int]:
    lab.exec("ext", [sys.executable, "-c", _UDP_BURST, vip, "53", str(first), str(n)], check=True, timeout=60)
    chosen = wait_for(lambda: (lambda got: got if len(got) == n else None)(
        {r.sport: r.backend_id for r in rows(lab, "node-a", "SVC", UDP) if r.src == EXT}),
        timeout=20, what=f"{n} SVC rows on node-a")
    return chosen


def test_maglev_removing_a_backend_moves_only_its_flows(native_lab):
    """2,000 client ports over 4 Maglev backends: the datapath picks exactly the backend the Python table and
    flow hash predict; after removing one backend its flows move and at most 3% of the others do."""
    lab = native_lab
    lab.trace_mode("drops")  # 4,000 datagrams: keep the monitor out of it
    try:
        svc = lab.services.add("dns", 53, ["a1:8080", "a2:8080", "b1:8080", "b2:8080"], protocol="UDP",
                               type="LoadBalancer", algorithm="maglev")
        m = lab.config.maglev_table_size

        def predicted(service, ports):
            table = lookup_table(_maglev_names(lab, service.active, "UDP"), m, cilium_seed())
            return {p: table[flow_slot(EXT, p, 53, UDP, m)] for p in ports}

        ports = range(20000, 22000)
        before = _backend_by_port(lab, svc.lb_vip, ports.start, len(ports))
        assert before == predicted(svc, ports)
        gone = svc.backend("b2:8080").id
        on_gone = {p for p, b in before.items() if b == gone}
        assert 300 < len(on_gone) < 700  # about a quarter

        svc = lab.services.remove_backend("dns", "b2:8080")
        lab.flush_ct("node-a")
        after = _backend_by_port(lab, svc.lb_vip, ports.start, len(ports))
        assert after == predicted(svc, ports)
        moved = {p for p in ports if before[p] != after[p]}
        others_moved = moved - on_gone
        assert on_gone <= moved
        assert len(others_moved) <= 0.03 * (len(ports) - len(on_gone)), (len(others_moved), len(on_gone))
        print(f"maglev M={m}: {len(on_gone)} flows on the removed backend moved; "
              f"{len(others_moved)} of {len(ports) - len(on_gone)} others moved")
    finally:
        lab.trace_mode("all")


_SYN_CATCHER = r"""
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL: taps run before tc
s.bind(("eth0", 0))
s.settimeout(10)
print("ready", flush=True)
while True:
    frame = s.recv(2048)
    if frame[12:14] != b"\x08\x00":
        continue
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    if ip[9] == 6 and ip[16:20] == socket.inet_aton(sys.argv[1]) and ip[ihl + 13] & 0x02:
        print(ip[:ihl].hex(), flush=True)
        break
"""


def test_dsr_option_bytes_on_the_wire(native_lab):
    """The SYN node-a forwards to node-b carries the DSR option exactly as Cilium writes it: type 0x9a, length 8,
    then the frontend's port and address with bpf_htons/bpf_htonl applied to values already in network order —
    byte-reversed on the wire (nodeport.h dsr_set_opt4; bpf/tests/tc_nodeport_dsr_backend builds the option
    with opt->port = bpf_ntohs(FRONTEND_PORT), opt->addr = bpf_ntohl(FRONTEND_IP))."""
    import subprocess

    lab = native_lab
    svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    catcher = lab.popen("node-b", [sys.executable, "-c", _SYN_CATCHER, B1], stdout=subprocess.PIPE, text=True)
    try:
        assert catcher.stdout.readline().strip() == "ready"
        conn = lab.external("ext").tcp("web", 80)
        assert conn.open().ok
        header = bytes.fromhex(catcher.stdout.readline().strip())
        conn.close()
    finally:
        catcher.kill()
        catcher.wait()
    assert header[0] == 0x47  # IPv4, IHL 7: 20 bytes and the 8-byte option
    option = header[20:28]
    assert option == b"\x9a\x08" + (80).to_bytes(2, "big")[::-1] + socket.inet_aton(svc.lb_vip)[::-1]
    if svc.lb_vip == "203.0.113.10":
        assert option.hex(" ") == "9a 08 50 00 0a 71 00 cb"


# -- malformed input on the wire ------------------------------------------------------------
_FRAME_SENDER = r"""
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("eth0", 0))
for line in sys.stdin.read().split():
    s.send(bytes.fromhex(line))
"""


def _mac(lab, name: str) -> str:
    """eth0's MAC in ``name``'s namespace (netlink: /sys would show the host's devices)."""
    out = lab.exec(name, ["ip", "-j", "link", "show", "dev", "eth0"], check=True).stdout
    return json.loads(out)[0]["address"]


def _malformed(case: str, vip: str) -> tuple[str, bytes]:
    """(node whose eth0 it is sent to, the IPv4 packet) for one kind of bad input."""
    from scapy.all import IP, TCP as ScTCP, IPOption  # noqa: N811

    port_addr = (80).to_bytes(2, "big") + socket.inet_aton(vip)
    syn = ScTCP(sport=40000, dport=8080, flags="S")
    if case == "dsr-option-wrong-length":
        return "node-b", bytes(IP(src=EXT, dst=B1, options=[IPOption(b"\x9a\x06" + port_addr[:4])]) / syn)
    if case == "dsr-option-wrong-type":
        return "node-b", bytes(IP(src=EXT, dst=B1, options=[IPOption(b"\x9b\x08" + port_addr)]) / syn)
    if case == "truncated-ip-header":
        return "node-a", bytes(IP(src=EXT, dst=vip, ihl=15) / ScTCP(dport=80, flags="S"))[:40]
    if case == "truncated-tcp-header":
        raw = bytearray(bytes(IP(src=EXT, dst=vip) / ScTCP(dport=80, flags="S"))[:28])
        raw[2:4] = (28).to_bytes(2, "big")
        return "node-a", bytes(raw)
    if case == "ip-fragment":
        return "node-a", bytes(IP(src=EXT, dst=vip, flags="MF", id=7) / ScTCP(dport=80, flags="S"))
    raise ValueError(case)


MALFORMED = {
    "dsr-option-wrong-length": DropReason.INVALID,
    "dsr-option-wrong-type": DropReason.INVALID,
    "truncated-ip-header": DropReason.INVALID,
    "truncated-tcp-header": DropReason.CT_INVALID_HDR,
    "ip-fragment": DropReason.FRAG_NOSUPPORT,
}


def send_malformed(lab, node: str, packet: bytes, case: str):
    """Send ``packet`` from ext in an Ethernet frame to ``node``'s eth0; (the first drop record, the event log)."""
    frame = bytes.fromhex(_mac(lab, node).replace(":", "")) + bytes.fromhex(_mac(lab, "ext").replace(":", "")) \
        + b"\x08\x00" + packet
    log = lab.events()
    log.seek_end()
    lab.exec("ext", [sys.executable, "-c", _FRAME_SENDER], input=frame.hex(), check=True)
    return wait_for(lambda: next((f for f in log.read() if f.dropped), None), timeout=5,
                    what=f"the drop of {case}"), log


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_on_the_wire_makes_no_state(native_lab, case):
    """A bad DSR option, a truncated IP or TCP header, or an IP fragment from the fabric is dropped at
    from-netdev with its reason and leaves no CT or NAT row on any node."""
    lab = native_lab
    svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    node, packet = _malformed(case, svc.lb_vip)
    drop, _ = send_malformed(lab, node, packet, case)
    assert (drop.node, drop.hook, drop.event.drop_reason) == (node, Hook.FROM_NETDEV, MALFORMED[case])
    for n in ("node-a", "node-b"):
        assert lab.ct(n) == [] and lab.nat(n) == []
