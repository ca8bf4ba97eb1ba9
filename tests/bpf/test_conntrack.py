"""Connection tracking at the pod's veth (bpf_lxc.c, lib/conntrack.h), one TCP
flag at a time: which rows a packet creates, refreshes and closes, with the
seen flags and lifetimes of Cilium v1.16 (facts sheet §1-3).

The flow: pod a1 (198.18.1.11:40000) opens a connection to pod b1
(198.18.2.11:8080) on the other node. from-container sees a1's packets,
to-container the replies it receives. With native routing the programs hand
everything back to the kernel (TC_ACT_OK).
"""
from __future__ import annotations

import socket

from labkit.datapath.testrun import TC_ACT_OK
from labkit.maps.ct import CtFlags, CtResult, TcpFlags

from .harness import A1, A2, B1
from .packets import ACK, FIN, RST, SYN, tcp, udp

# Cilium's defaults (facts §3): what a node's agent compiles in.
SYN_TIMEOUT, TCP_LIFETIME, CLOSE_TIMEOUT, NONTCP_LIFETIME = 60, 8000, 10, 60
C, CP, S, SP = A1.ip, 40000, B1.ip, 8080
TCP = socket.IPPROTO_TCP


def out_pkt(flags: int) -> bytes:
    """a1 → b1, as a1 sends it."""
    return tcp(C, S, CP, SP, flags)


def reply_pkt(flags: int) -> bytes:
    """b1 → a1, the reply."""
    return tcp(S, C, SP, CP, flags)


def open_out(node) -> None:
    node.run("cil_from_container", out_pkt(SYN))


def out_row(node):
    return node.ct_row("OUT", C, CP, S, SP)


def assert_lifetime(row, before: int, after: int, seconds: int) -> None:
    assert row is not None, "no such CT row"
    assert before + seconds <= row.lifetime <= after + seconds, \
        f"lifetime {row.lifetime}: expected now + {seconds} (now in [{before}, {after}])"


def test_syn_creates_out_entry(native):
    """A pod's SYN creates one TCP OUT row {a1:cp -> b1:sp}: TxFlagsSeen=SYN, no flags, SYN lifetime, the pod's identity."""
    before = native.now()
    r = native.run("cil_from_container", out_pkt(SYN))
    after = native.now()
    assert r.retval == TC_ACT_OK
    row = out_row(native)
    assert row is not None, [x.line() for x in native.ct()]
    assert row.map == "cilium_ct4_global"
    assert (row.tx_flags_seen, row.rx_flags_seen, row.flags) == (TcpFlags.SYN, 0, 0)
    assert row.src_sec_id == A1.identity and row.rev_nat == 0
    assert_lifetime(row, before, after, SYN_TIMEOUT)
    assert r.event.ct_result == CtResult.NEW and r.event.ct_dir == 0
    assert native.ct_row("IN", C, CP, S, SP) is None, "the client's side keeps only an OUT row"


def test_new_entry_has_related_twin(native):
    """A new entry's RELATED twin sits in the any map: ICMP, ports 0, OUT|RELATED, the entry's flags as created, no counters."""
    open_out(native)
    twin = native.ct_row("OUT", C, 0, S, 0, proto=socket.IPPROTO_ICMP, related=True)
    assert twin is not None, [x.line() for x in native.ct()]
    assert twin.map == "cilium_ct_any4_global"
    main = out_row(native)
    assert (twin.flags, twin.tx_flags_seen, twin.lifetime) == (main.flags, main.tx_flags_seen, main.lifetime)
    assert (twin.packets, twin.bytes) == (0, 0)
    assert (main.packets, main.bytes) == (1, len(out_pkt(SYN))), "CONNTRACK_ACCOUNTING counts the SYN on the main entry"


def test_syn_ack_is_reply_of_out_entry(native):
    """The SYN-ACK at to-container is CT_REPLY of the OUT row: RxFlagsSeen=SYN|ACK, still the SYN lifetime, no IN row."""
    open_out(native)
    before = native.now()
    r = native.run("cil_to_container", reply_pkt(SYN | ACK))
    after = native.now()
    assert r.retval == TC_ACT_OK
    assert r.event.ct_result == CtResult.REPLY
    row = out_row(native)
    assert (row.tx_flags_seen, row.rx_flags_seen) == (TcpFlags.SYN, TcpFlags.SYN | TcpFlags.ACK)
    assert not row.flags & CtFlags.SEEN_NON_SYN, "a SYN-ACK still carries SYN"
    assert_lifetime(row, before, after, SYN_TIMEOUT)
    assert native.ct_row("IN", C, CP, S, SP) is None


def test_ack_sets_seen_non_syn_and_tcp_lifetime(native):
    """The first packet without SYN sets SeenNonSyn and gives the entry the established TCP lifetime."""
    open_out(native)
    native.run("cil_to_container", reply_pkt(SYN | ACK))
    before = native.now()
    r = native.run("cil_from_container", out_pkt(ACK))
    after = native.now()
    assert r.event.ct_result == CtResult.ESTABLISHED
    row = out_row(native)
    assert row.flags == CtFlags.SEEN_NON_SYN
    assert row.tx_flags_seen == TcpFlags.SYN | TcpFlags.ACK
    assert_lifetime(row, before, after, TCP_LIFETIME)


def test_accounting_counts_packets_and_bytes(native):
    """With CONNTRACK_ACCOUNTING every packet that finds the entry, either way, adds 1 and its skb->len (frame included)."""
    frames = [("cil_from_container", out_pkt(SYN)), ("cil_to_container", reply_pkt(SYN | ACK)),
              ("cil_from_container", out_pkt(ACK))]
    for hook, frame in frames:
        native.run(hook, frame)
    row = out_row(native)
    assert (row.packets, row.bytes) == (3, sum(len(f) for _, f in frames))


def test_fin_both_ways_closes_entry(native):
    """FIN from the client sets TxClosing (entry alive); FIN back sets RxClosing, and the dead entry gets CT_CLOSE_TIMEOUT."""
    open_out(native)
    native.run("cil_to_container", reply_pkt(SYN | ACK))
    native.run("cil_from_container", out_pkt(ACK))
    before = native.now()
    native.run("cil_from_container", out_pkt(FIN | ACK))
    after = native.now()
    row = out_row(native)
    assert row.flags == CtFlags.SEEN_NON_SYN | CtFlags.TX_CLOSING
    assert row.tx_flags_seen == TcpFlags.SYN | TcpFlags.ACK | TcpFlags.FIN
    assert_lifetime(row, before, after, TCP_LIFETIME)  # still alive: refreshed as usual
    before = native.now()
    native.run("cil_to_container", reply_pkt(FIN | ACK))
    after = native.now()
    row = out_row(native)
    assert row.flags == CtFlags.SEEN_NON_SYN | CtFlags.TX_CLOSING | CtFlags.RX_CLOSING
    assert row.rx_flags_seen == TcpFlags.SYN | TcpFlags.ACK | TcpFlags.FIN
    assert_lifetime(row, before, after, CLOSE_TIMEOUT)


def test_dead_entry_is_not_refreshed(native):
    """Once both directions closed, later packets leave the lifetime alone (the GC may take the entry)."""
    open_out(native)
    native.run("cil_to_container", reply_pkt(SYN | ACK))
    native.run("cil_from_container", out_pkt(FIN | ACK))
    native.run("cil_to_container", reply_pkt(FIN | ACK))
    closed = out_row(native).lifetime
    native.set_config(clock_offset=5)  # five seconds later
    native.run("cil_from_container", out_pkt(ACK))
    assert out_row(native).lifetime == closed


def test_rst_before_handshake_closes_both(native):
    """An RST answering a SYN (no SYN seen back) closes both directions at once."""
    open_out(native)
    before = native.now()
    native.run("cil_to_container", reply_pkt(RST | ACK))
    after = native.now()
    row = out_row(native)
    assert row.flags & (CtFlags.RX_CLOSING | CtFlags.TX_CLOSING) == CtFlags.RX_CLOSING | CtFlags.TX_CLOSING
    assert row.rx_flags_seen == TcpFlags.RST | TcpFlags.ACK
    assert_lifetime(row, before, after, CLOSE_TIMEOUT)


def test_rst_after_handshake_closes_both(native):
    """After both SYNs, an RST still closes both directions and gives the close timeout (v1.16 as it executes).

    ct_entry_seen_both_syns ANDs the 8-bit seen flags with TCP_FLAG_SYN, a
    32-bit big-endian word (bpf/lib/conntrack.h:67-73@82999990,
    bpf/include/linux/tcp.h:77@82999990): always false on x86, so the RST branch
    at bpf/lib/conntrack.h:345-348@82999990 closes rx and tx. Cilium's own test
    expects a lifetime of at most CT_CLOSE_TIMEOUT after an RST answering a
    SYN with both SYNs in the seen flags (bpf/tests/bpf_ct_tests.c:207-212@82999990).
    """
    open_out(native)
    native.run("cil_to_container", reply_pkt(SYN | ACK))
    native.run("cil_from_container", out_pkt(ACK))
    row = out_row(native)
    assert row.tx_flags_seen & TcpFlags.SYN and row.rx_flags_seen & TcpFlags.SYN
    before = native.now()
    native.run("cil_to_container", reply_pkt(RST))
    after = native.now()
    row = out_row(native)
    assert row.flags == CtFlags.SEEN_NON_SYN | CtFlags.RX_CLOSING | CtFlags.TX_CLOSING
    assert_lifetime(row, before, after, CLOSE_TIMEOUT)


def test_syn_reopens_closed_entry(native):
    """A SYN on a closed entry starts it afresh (v1.16: CT_NEW, flags and seen flags reset, SYN lifetime)."""
    open_out(native)
    native.run("cil_to_container", reply_pkt(SYN | ACK))
    native.run("cil_from_container", out_pkt(FIN | ACK))
    native.run("cil_to_container", reply_pkt(FIN | ACK))
    before = native.now()
    r = native.run("cil_from_container", out_pkt(SYN))
    after = native.now()
    assert r.event.ct_result == CtResult.NEW
    row = out_row(native)
    assert (row.flags, row.tx_flags_seen, row.rx_flags_seen) == (0, TcpFlags.SYN, 0)
    assert_lifetime(row, before, after, SYN_TIMEOUT)


def test_to_container_syn_creates_in_entry(native):
    """A SYN reaching pod a1 from b1 creates an IN row {b1:cp -> a1:sp}: RxFlagsSeen=SYN, b1's identity, a RELATED twin."""
    r = native.run("cil_to_container", tcp(B1.ip, A1.ip, 50000, 8080, SYN))
    assert r.retval == TC_ACT_OK
    row = native.ct_row("IN", B1.ip, 50000, A1.ip, 8080)
    assert row is not None, [x.line() for x in native.ct()]
    assert (row.rx_flags_seen, row.tx_flags_seen, row.flags) == (TcpFlags.SYN, 0, 0)
    assert row.src_sec_id == B1.identity
    assert native.ct_row("IN", B1.ip, 0, A1.ip, 0, proto=socket.IPPROTO_ICMP, related=True) is not None
    # the pod's answer is the IN row's reply, seen at from-container
    r = native.run("cil_from_container", tcp(A1.ip, B1.ip, 8080, 50000, SYN | ACK))
    assert r.event.ct_result == CtResult.REPLY
    assert native.ct_row("IN", B1.ip, 50000, A1.ip, 8080).tx_flags_seen == TcpFlags.SYN | TcpFlags.ACK
    assert native.ct_row("OUT", A1.ip, 8080, B1.ip, 50000) is None


def test_in_entry_from_tunnel(native):
    """A packet marked as decapsulated by from-overlay gets an IN row with FromTunnel, and the mark is taken off."""
    r = native.run("cil_to_container", tcp(B1.ip, A1.ip, 50000, 8080, SYN), mark=0x40000000)
    row = native.ct_row("IN", B1.ip, 50000, A1.ip, 8080)
    assert row.flags == CtFlags.FROM_TUNNEL
    assert r.ctx.mark == 0


def test_udp_entry_in_any_map(native):
    """UDP goes to the any map with the non-TCP lifetime and no seen flags."""
    before = native.now()
    native.run("cil_from_container", udp(A1.ip, A2.ip, 5353, 53))
    after = native.now()
    row = native.ct_row("OUT", A1.ip, 5353, A2.ip, 53, proto=socket.IPPROTO_UDP)
    assert row is not None and row.map == "cilium_ct_any4_global"
    assert (row.tx_flags_seen, row.rx_flags_seen, row.flags) == (0, 0, 0)
    assert_lifetime(row, before, after, NONTCP_LIFETIME)


def test_default_node_counts_nothing(tunnel):
    """Without CONNTRACK_ACCOUNTING (a default node) entries keep Packets=0 Bytes=0."""
    tunnel.run("cil_from_container", out_pkt(SYN))
    tunnel.run("cil_from_container", out_pkt(ACK))
    row = tunnel.ct_row("OUT", C, CP, S, SP)
    assert (row.packets, row.bytes) == (0, 0)
