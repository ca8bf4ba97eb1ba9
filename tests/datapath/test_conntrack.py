"""Connection tracking on the real kernel: rows, flags, lifetimes, counters."""
from __future__ import annotations

import socket
import sys

import pytest

from labkit.maps.ct import CtFlags, TcpFlags

from .util import TcpClient, rows, wait_for

SYN, ACK, PSH, FIN, RST = TcpFlags.SYN, TcpFlags.ACK, TcpFlags.PSH, TcpFlags.FIN, TcpFlags.RST
CLOSING = CtFlags.RX_CLOSING | CtFlags.TX_CLOSING


def test_ping_rows_and_counts(any_lab):
    """ping a1 → b1: node-a holds ICMP OUT, node-b ICMP IN, each counting requests and replies."""
    lab = any_lab
    a1, b1 = lab.pod("a1"), lab.pod("b1")
    count = 4
    r = a1.exec("ping", "-c", str(count), "-i", "0.2", "-W", "2", b1.ip)
    assert r.returncode == 0, r.stdout + r.stderr
    out = rows(lab, "node-a", "ICMP", "OUT", related=False)
    assert [(x.src, x.dst, x.dport) for x in out] == [(a1.ip, b1.ip, 0)]
    # Both directions pass the pod's veth on each node: requests plus replies.
    assert out[0].packets == 2 * count
    inn = rows(lab, "node-b", "ICMP", "IN", related=False)
    assert [(x.src, x.dst, x.sport) for x in inn] == [(a1.ip, b1.ip, out[0].sport)]
    assert inn[0].packets == 2 * count
    assert not rows(lab, "node-a", direction="IN") and not rows(lab, "node-b", direction="OUT")
    line = out[0].line()
    assert line.startswith(f"ICMP OUT {a1.ip}:{out[0].sport} -> {b1.ip}:0 expires=")


def test_ping_same_node_makes_out_and_in_on_one_node(lab):
    """a1 → a2 on one node: the OUT and the IN row both live in node-a's map."""
    a1, a2 = lab.pod("a1"), lab.pod("a2")
    assert a1.exec("ping", "-c", "1", "-W", "2", a2.ip).returncode == 0
    dirs = sorted(r.dir for r in rows(lab, "node-a", "ICMP", related=False))
    assert dirs == ["IN", "OUT"]
    assert not rows(lab, "node-b")


def test_tcp_open_exchange_close(any_lab):
    """TCP a1 → b1:8080: SeenNonSyn and the established lifetime after the handshake, flags
    seen per packet, both closing flags and the close timeout after both FINs."""
    lab = any_lab
    a1, b1 = lab.pod("a1"), lab.pod("b1")
    t = lab.config.timeouts
    conn = TcpClient(lab, "a1", b1.ip)

    def out_row():
        found = [r for r in rows(lab, "node-a", "TCP", "OUT") if r.sport == conn.port]
        return found[0] if found and found[0].flags & CtFlags.SEEN_NON_SYN else None

    out = wait_for(out_row, what="the OUT row to see the handshake's ACK")
    now = lab.clock.now()
    assert (out.src, out.sport, out.dst, out.dport) == (a1.ip, conn.port, b1.ip, 8080)
    assert t.tcp - 2 <= out.remaining(now) <= t.tcp
    assert out.tx_flags_seen == SYN | ACK  # our SYN, then our ACK
    assert out.rx_flags_seen == SYN | ACK  # their SYN-ACK
    assert not out.flags & CLOSING
    inn = wait_for(lambda: [r for r in rows(lab, "node-b", "TCP", "IN") if r.sport == conn.port
                            and r.flags & CtFlags.SEEN_NON_SYN], what="the IN row on node-b")[0]
    assert inn.rx_flags_seen == SYN | ACK and inn.tx_flags_seen == SYN | ACK

    assert conn.send() == "echo hello labkit"
    out = wait_for(lambda: [r for r in rows(lab, "node-a", "TCP", "OUT") if r.tx_flags_seen & PSH
                            and r.rx_flags_seen & PSH], what="data both ways")[0]
    assert out.tx_flags_seen == SYN | ACK | PSH and out.rx_flags_seen == SYN | ACK | PSH

    conn.close()
    out = wait_for(lambda: [r for r in rows(lab, "node-a", "TCP", "OUT") if r.flags & CLOSING == CLOSING],
                   what="both FINs on node-a")[0]
    now = lab.clock.now()
    assert out.tx_flags_seen & FIN and out.rx_flags_seen & FIN
    assert 0 <= out.remaining(now) <= t.close
    assert CtFlags.names(out.flags) == ["RxClosing", "TxClosing", "SeenNonSyn"]
    inn = wait_for(lambda: [r for r in rows(lab, "node-b", "TCP", "IN") if r.flags & CLOSING == CLOSING],
                   what="both FINs on node-b")[0]
    assert 0 <= inn.remaining(lab.clock.now()) <= t.close
    # The twin for ICMP errors about this flow, in the any map: the entry as the SYN created it (Cilium's
    # ct_create4 writes it before the counters): no flags, only the SYN seen, nothing counted.
    twins = rows(lab, "node-a", "ICMP", "OUT", related=True)
    assert [(x.src, x.dst, x.sport, x.dport) for x in twins] == [(a1.ip, b1.ip, 0, 0)]
    assert (twins[0].flags, twins[0].tx_flags_seen, twins[0].rx_flags_seen, twins[0].packets) == (0, SYN, 0, 0)
    # On the server's node the twin of the IN entry saw the SYN as ingress; in tunnel mode both carry
    # FromTunnel (the SYN came through the overlay: bpf_lxc's from_tunnel), in native mode neither does.
    from_tunnel = CtFlags.FROM_TUNNEL if lab.config.routing == "tunnel" else 0
    assert inn.flags & CtFlags.FROM_TUNNEL == from_tunnel
    twins = rows(lab, "node-b", "ICMP", "IN", related=True)
    assert [(x.src, x.dst, x.flags, x.tx_flags_seen, x.rx_flags_seen, x.packets) for x in twins] == [
        (a1.ip, b1.ip, from_tunnel, 0, SYN, 0)]


def test_lone_syn_keeps_syn_lifetime(lab):
    """A SYN nobody answers leaves an OUT row with only SYN seen and the SYN lifetime."""
    target = "198.18.2.99"  # inside node-b's CIDR, no pod: the SYN goes nowhere
    code = (
        "import socket,time;s=socket.socket();s.setblocking(False)\n"
        f"s.connect_ex(('{target}',8080));time.sleep(0.5);print('sent')"
    )
    assert lab.pod("a1").exec(sys.executable, "-c", code).stdout.strip() == "sent"
    out = wait_for(lambda: rows(lab, "node-a", "TCP", "OUT"), what="the SYN's OUT row")
    assert len(out) == 1 and out[0].dst == target
    row = out[0]
    assert row.tx_flags_seen == SYN and row.rx_flags_seen == 0
    assert not row.flags & CtFlags.SEEN_NON_SYN
    syn = lab.config.timeouts.syn
    assert syn - 2 <= row.remaining(lab.clock.now()) <= syn


def test_rst_before_handshake_closes_both_sides(any_lab):
    """a1 → b1 on a closed port: the RST closes OUT and IN rows in both directions at once."""
    lab = any_lab
    code = (
        "import socket\ntry:\n socket.create_connection(('%s',9999),timeout=3)\n"
        "except ConnectionRefusedError:\n print('refused')" % lab.pod("b1").ip
    )
    assert lab.pod("a1").exec(sys.executable, "-c", code).stdout.strip() == "refused"
    for node, direction in (("node-a", "OUT"), ("node-b", "IN")):
        row = wait_for(lambda: [r for r in rows(lab, node, "TCP", direction) if r.dport == 9999], what=node)[0]
        assert row.flags & CLOSING == CLOSING, f"{node}: {row.line()}"
        assert 0 <= row.remaining(lab.clock.now()) <= lab.config.timeouts.close
    out = rows(lab, "node-a", "TCP", "OUT")[0]
    assert out.rx_flags_seen & RST and out.tx_flags_seen == SYN


def test_udp_rows_in_any_map_with_related_twins(any_lab):
    """UDP a1 → b2 goes to cilium_ct_any4_global; each new row has its RELATED ICMP twin."""
    lab = any_lab
    a1, b2 = lab.pod("a1"), lab.pod("b2")
    code = (
        "import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(3)\n"
        f"s.sendto(b'hi',('{b2.ip}',8080));print(s.recvfrom(200)[0].decode());print(s.getsockname()[1])"
    )
    r = a1.exec(sys.executable, "-c", code)
    reply, port = r.stdout.split("\n")[:2]
    assert reply == f"pod=b2 client={a1.ip}:{port} data=hi"
    for node, direction in (("node-a", "OUT"), ("node-b", "IN")):
        udp = rows(lab, node, "UDP", direction)
        assert [(x.map, x.src, x.sport, x.dst, x.dport) for x in udp] == [
            ("cilium_ct_any4_global", a1.ip, int(port), b2.ip, 8080)
        ]
        assert udp[0].packets == 2
        twins = rows(lab, node, "ICMP", direction, related=True)
        assert [(x.map, x.src, x.dst, x.sport, x.dport) for x in twins] == [
            ("cilium_ct_any4_global", a1.ip, b2.ip, 0, 0)
        ]
        # The twin is the entry as it was created, written before any counter (Cilium's ct_create4):
        # no flags but FromTunnel on an IN entry whose datagram came through the overlay, no packets,
        # the non-TCP lifetime of the first datagram.
        tunnel_in = direction == "IN" and lab.config.routing == "tunnel"
        assert (twins[0].flags, twins[0].packets, twins[0].bytes) == (CtFlags.FROM_TUNNEL if tunnel_in else 0, 0, 0)
        assert udp[0].flags == (CtFlags.FROM_TUNNEL if tunnel_in else 0)
        assert twins[0].lifetime == twins[0].last_tx_report + lab.config.timeouts.any if direction == "OUT" else \
            twins[0].lifetime == twins[0].last_rx_report + lab.config.timeouts.any
        nontcp = lab.config.timeouts.any
        assert nontcp - 2 <= udp[0].remaining(lab.clock.now()) <= nontcp


def test_icmp_error_about_udp_flow_is_related(lab):
    """A port-unreachable for a UDP flow matches the RELATED twin (CT_RELATED at the hook)."""
    a1, b1 = lab.pod("a1"), lab.pod("b1")
    events = lab.events()
    events.seek_end()
    code = f"import socket;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.sendto(b'x',('{b1.ip}',9999))"
    a1.exec(sys.executable, "-c", code)

    def related_flow():
        return [f for f in events.read() if f.event.ct_result == 3 and f.node == "node-a"]

    flow = wait_for(related_flow, what="a CT_RELATED verdict on node-a")[0]
    assert flow.hook.label == "to-container"
    assert flow.event.before.proto == socket.IPPROTO_ICMP


def test_expired_after_clock_moves_past_lifetime(lab):
    """Advancing the lab clock past a lifetime marks the row expired (still present: GC deletes)."""
    a1, b1 = lab.pod("a1"), lab.pod("b1")
    assert a1.exec("ping", "-c", "1", "-W", "2", b1.ip).returncode == 0
    row = rows(lab, "node-a", "ICMP", "OUT", related=False)[0]
    assert not row.expired(lab.clock.now())
    lab.clock.advance(row.remaining(lab.clock.now()) + 1)
    now = lab.clock.now()
    row = rows(lab, "node-a", "ICMP", "OUT", related=False)[0]
    assert row.expired(now) and row.remaining(now) < 0
    assert f"(remaining: {row.remaining(now)} sec(s))" in row.line(now)
    assert row.to_json(now)["expired"] is True


def test_new_entries_use_the_moved_clock(lab):
    """An entry created after the clock moved gets lifetime = lab clock now + timeout."""
    lab.clock.advance(5000)
    a1, b1 = lab.pod("a1"), lab.pod("b1")
    assert a1.exec("ping", "-c", "1", "-W", "2", b1.ip).returncode == 0
    row = rows(lab, "node-a", "ICMP", "OUT", related=False)[0]
    nontcp = lab.config.timeouts.any
    assert nontcp - 2 <= row.remaining(lab.clock.now()) <= nontcp


def test_reset_flushes_ct_and_clock(lab):
    """reset() empties both CT maps on every node and sets the clock offset back to 0."""
    a1, b1 = lab.pod("a1"), lab.pod("b1")
    a1.exec("ping", "-c", "1", "-W", "2", b1.ip)
    lab.clock.advance(30)
    assert rows(lab, "node-a") and lab.clock.offset == 30
    lab.reset()
    assert lab.ct("node-a") == [] and lab.ct("node-b") == []
    assert lab.clock.offset == 0


@pytest.mark.parametrize("pod,peer", [("a1", "b1"), ("b2", "a2")])
def test_server_sees_client_address(lab, pod, peer):
    """The HTTP answer names the serving pod and the client address:port it saw."""
    src, dst = lab.pod(pod), lab.pod(peer)
    code = (
        "import socket;s=socket.create_connection(('%s',8080),timeout=3);s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
        "d=b''\nwhile True:\n c=s.recv(500)\n if not c: break\n d+=c\nprint(d.decode().split('\\r\\n\\r\\n')[1].strip(), s.getsockname()[1])"
        % dst.ip
    )
    body, port = lab.pod(pod).exec(sys.executable, "-c", code).stdout.rsplit(" ", 1)
    assert body == f"pod={peer} client={src.ip}:{port.strip()}"
    assert any(f"client={src.ip}:{port.strip()}" in line for line in dst.server_log())
