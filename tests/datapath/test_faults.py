"""Each break-it fault breaks exactly what it names, on the real kernel: the mutation tests of the labs rely on it
(a check must fail when its exercise's fault was on), and the break-it exercises teach with it."""
from __future__ import annotations

import socket
import sys

import pytest

from labkit.constants import DropReason
from labkit.maps.ct import CtFlags, TcpFlags


@pytest.fixture
def faulty(lab):
    """The shared tunnel lab; every fault switched off again afterwards (reset does it too)."""
    yield lab
    lab.reset()


def _tcp_rows(step, node, direction):
    return [r for r in step.after[node] if r.proto_name == "TCP" and r.dir == direction and not r.related]


def test_no_out_entry(faulty):
    """no-out-entry: the client's node keeps no OUT row; the server's node still has its IN row."""
    faulty.fault("no-out-entry")
    step = faulty.pod("a1").ping("b1")
    assert not [r for r in step.after["node-a"] if r.dir == "OUT"]
    assert [r for r in step.after["node-b"] if r.dir == "IN" and not r.related]


def test_no_flags_seen_and_no_close(faulty):
    """no-flags-seen keeps TxFlagsSeen/RxFlagsSeen at 0; no-close leaves a FIN-closed connection without a
    closing flag and with the established lifetime."""
    faulty.fault("no-flags-seen")
    faulty.fault("no-close")
    conn = faulty.pod("a1").tcp("b1", 8080)
    conn.open()
    closed = conn.close()
    (out,) = _tcp_rows(closed, "node-a", "OUT")
    assert (out.tx_flags_seen, out.rx_flags_seen) == (0, 0)
    assert not out.flags & (CtFlags.RX_CLOSING | CtFlags.TX_CLOSING) and out.flags & CtFlags.SEEN_NON_SYN
    assert out.remaining(closed.now) > faulty.config.timeouts.close


def test_no_accounting(faulty):
    """no-accounting: a lab built with accounting counts nothing while the fault is on."""
    assert faulty.config.ct_accounting
    faulty.fault("no-accounting")
    step = faulty.pod("a1").ping("b1", count=2)
    assert all((r.packets, r.bytes) == (0, 0) for node in step.after for r in step.after[node])


def test_no_tunnel_drops_at_the_source(faulty):
    """no-tunnel: in tunnel routing the request is dropped where it should enter the tunnel."""
    faulty.fault("no-tunnel")
    step = faulty.pod("a1").ping("b1")
    assert not step.ok
    drops = [f for f in step.flows if f.dropped]
    assert drops and {(f.node, f.event.drop_reason) for f in drops} == {("node-a", DropReason.NO_TUNNEL_ENDPOINT)}


def test_no_fib_drops_native_traffic_at_to_netdev(native_lab):
    """no-fib: with native routing a pod's packet to another node is dropped at its node's to-netdev."""
    native_lab.fault("no-fib")
    try:
        step = native_lab.pod("a1").ping("b1")
    finally:
        native_lab.reset()
    drops = [f for f in step.flows if f.dropped]
    assert drops and {(f.node, f.hook.label, f.event.drop_reason) for f in drops} == {
        ("node-a", "to-netdev", DropReason.NO_FIB)}


def test_no_svc_entry(faulty):
    """no-svc-entry: per-packet LB leaves no SVC row (a datagram still gets its answer)."""
    faulty.services.add("dns", 53, ["b1:8080"], protocol="UDP")
    faulty.fault("no-svc-entry")
    step = faulty.pod("a1").udp("dns", 53)
    assert step.ok and not [r for r in step.after["node-a"] if r.dir == "SVC"]


def test_pick_terminating(faulty):
    """pick-terminating: new connections reach a terminating backend (one in two here)."""
    faulty.services.add("web", 80, ["b1:8080", "b2:8080"])
    faulty.services.set_backend_state("web", "b2:8080", "terminating")
    faulty.fault("pick-terminating")
    seen = set()
    for _ in range(24):
        conn = faulty.pod("a1").tcp("web", 80)
        opened = conn.open()
        assert opened.ok
        seen |= {pod for pod, lines in opened.server_log.items() if lines}  # who logged the connection
        conn.close()
    assert "b2" in seen


def test_maglev_wrong_hash_moves_flows(any_lab):
    """maglev-wrong-hash: the flows go where labkit.maglev's flow hash does not say."""
    from labkit.maglev import backend_name, flow_slot, lookup_table

    lab = any_lab
    svc = lab.services.add("dns", 53, ["a1:8080", "a2:8080", "b1:8080", "b2:8080"], protocol="UDP",
                           type="LoadBalancer", algorithm="maglev")
    names = {backend_name(lab.topology.pod(b.pod).ip, b.port, "UDP", lab.config.cilium): b.pod for b in svc.backends}
    m = lab.config.maglev_table_size
    table = lookup_table({n: b.id for n, b in zip(names, svc.backends)}, m)
    ids = {b.id: b.pod for b in svc.backends}
    lab.fault("maglev-wrong-hash")
    ext, misses = lab.external("ext"), 0
    try:
        for port in range(41000, 41016):
            step = ext.udp("dns", 53, b"q", sport=port)
            pod = step.result["reply_text"].split()[0].split("=")[1]
            misses += pod != ids[table[flow_slot(ext.ip, port, 53, socket.IPPROTO_UDP, m)]]
    finally:
        lab.reset()
    assert misses >= 4  # 16 flows, each off the table's choice 3 times in 4


def _sock_client(lab, where: str, vip: str, port: int):
    code = ("import socket,sys\ns=socket.socket();s.settimeout(3)\n"
            "try:\n s.connect((sys.argv[1],int(sys.argv[2])));print('peer',s.getpeername()[0])\n"
            "except OSError as e:\n print('errno',e.errno)")
    return lab.exec(where, [sys.executable, "-c", code, vip, str(port)]).stdout.split()


def test_socket_lb_faults(faulty):
    """sock-lb-off: the node's connect() keeps the VIP (per-packet LB does the work, an SVC row appears);
    no-getpeername: getpeername() shows the backend; sock-no-reject: connect() to a service without backends
    is not refused with EHOSTUNREACH."""
    svc = faulty.services.add("web", 80, ["b1:8080"])
    assert _sock_client(faulty, "node-a", svc.vip, 80) == ["peer", svc.vip]
    faulty.fault("no-getpeername")
    assert _sock_client(faulty, "node-a", svc.vip, 80) == ["peer", faulty.pod("b1").ip]
    faulty.fault("no-getpeername", on=False)
    empty = faulty.services.add("none", 80)
    assert _sock_client(faulty, "node-a", empty.vip, 80) == ["errno", "113"]
    faulty.fault("sock-no-reject")
    assert _sock_client(faulty, "node-a", empty.vip, 80) != ["errno", "113"]


def test_agent_faults(faulty):
    """Agent faults: lb-wrong-count writes each head one short; gc-noop deletes nothing; gc-fixed-interval keeps
    the interval; all listed by lab.faults() and gone after reset."""
    faulty.fault("lb-wrong-count")
    faulty.services.add("web", 80, ["b1:8080", "b2:8080"])
    (row,) = [r for r in faulty.services.lb("node-a").rows() if r.vip.startswith("198.19.")]
    assert row.count == 1 and len(row.backends) == 2
    faulty.fault("gc-noop")
    faulty.fault("gc-fixed-interval")
    conn = faulty.pod("a1").tcp("b1", 8080)
    conn.open()
    conn.close()
    faulty.clock.advance(faulty.config.timeouts.close + 1)
    run = faulty.gc.run()
    assert run.deleted == 0 and run.next_interval == run.interval
    assert set(faulty.faults()) >= {"lb-wrong-count", "gc-noop", "gc-fixed-interval"}
    faulty.reset()
    assert faulty.faults() == []
