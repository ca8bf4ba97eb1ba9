"""Cilium's conntrack scenarios, run through node-a's pod programs (``native``): lifetimes and the trace
'monitor' (whether a packet is reported at medium aggregation) as one connection's packets cross a live entry, a
closing one and a closed one; the same for a service entry; an RST before the handshake.

Cilium's files: bpf/tests/conntrack_test.c and bpf_ct_tests.c (@82999990). They call ``__ct_lookup`` and
``__ct_update_timeout`` directly on a tuple with a fake clock; here every call is a packet at the hook that makes
it — CT_INGRESS is a reply reaching pod a1 (cil_to_container), CT_EGRESS a packet a1 sends (cil_from_container),
CT_SERVICE a1's packet to the ClusterIP — and the clock is the lab clock advanced by ``clock_offset``. Cilium's
direct lookup of the tuple answers CT_ESTABLISHED where the hook, which looks the reply up reversed, answers
CT_REPLY. The tuple: a1 198.18.1.11:40000 -> b1 198.18.2.11:8080 (Cilium's all-zero tuple, 10.3.0.10:3010 ->
10.3.0.20:3020 in bpf_ct_tests.c), the ClusterIP 198.19.0.10:80. The trace record's REPORT_MONITOR bit is the CT
lookup's ``monitor`` (TRACE_PAYLOAD_LEN when non-zero). Lifetimes are v1.16's agent defaults (facts sheet §3:
SYN 60 s, TCP 8000 s, service TCP 8000 s, close 10 s); Cilium's test header node_config.h has others, which its
asserts name by macro.
"""
from __future__ import annotations

from labkit.datapath.testrun import TC_ACT_OK
from labkit.maps.ct import CtResult, TcpFlags
from labkit.observe.trace import Report

from ..harness import A1, B1, B2, SVC_ID, VIP, VPORT
from .. import packets
from .peer import add_service

SYN_TIMEOUT, TCP_LIFETIME, SVC_TCP_LIFETIME, CLOSE_TIMEOUT, REPORT_INTERVAL = 60, 8000, 8000, 10, 5
C, CP, S, SP = A1.ip, 40000, B1.ip, 8080
SYN, FIN, RST = packets.SYN, packets.FIN, packets.RST


class Clock:
    """The lab clock of one node, advanced by whole seconds (Cilium's advance_time)."""

    def __init__(self, node):
        self.node, self.offset = node, 0

    def advance(self, seconds: int = 1) -> None:
        self.offset += seconds
        self.node.set_config(clock_offset=self.offset)

    def now(self) -> int:
        return self.node.now() + self.offset

    def set_now(self, seconds: int) -> None:
        """The lab clock reads ``seconds`` now (the offset from CLOCK_MONOTONIC that gives it)."""
        self.offset = seconds - self.node.now()
        self.node.set_config(clock_offset=self.offset)


def _ingress(node, flags: int):
    return node.run("cil_to_container", packets.tcp(S, C, SP, CP, flags))


def _egress(node, flags: int):
    return node.run("cil_from_container", packets.tcp(C, S, CP, SP, flags))


def _monitored(r) -> bool:
    return bool(r.event.report & Report.MONITOR)


def _assert_timeout_in(node, clock, seconds: int, before: int) -> None:
    """Cilium's timeout_in(entry, seconds): lifetime == now + seconds (now read around the packet)."""
    row = node.ct_row("OUT", C, CP, S, SP)
    assert row is not None, [x.line() for x in node.ct()]
    assert before + seconds <= row.lifetime <= clock.now() + seconds, (row.lifetime, before, seconds)


def test_ct_lookup(native):
    """conntrack_test.c's ct_lookup: a SYN is monitored and gets CT_SYN_TIMEOUT, the same again is not monitored but
    refreshed, a packet without SYN gets the TCP lifetime, a FIN is monitored and keeps the entry alive, the FIN of
    the other side is monitored and closes it (CT_CLOSE_TIMEOUT), a closed entry is no longer refreshed, a SYN on it
    reopens it as CT_NEW, and an unknown tuple is CT_NEW and monitored (bpf/tests/conntrack_test.c:91-211@82999990)."""
    clock = Clock(native)
    assert _egress(native, SYN).retval == TC_ACT_OK  # the entry (:103-112)
    steps = [  # (what, hook, flags, CT result, monitored, lifetime), :117-201
        ("first SYN", _ingress, SYN, CtResult.REPLY, True, SYN_TIMEOUT),  # :119-125
        ("same flags", _ingress, SYN, CtResult.REPLY, False, SYN_TIMEOUT),  # :127-136
        ("no SYN", _ingress, 0, CtResult.REPLY, False, TCP_LIFETIME),  # :138-146
        ("FIN one side", _ingress, FIN, CtResult.REPLY, True, TCP_LIFETIME),  # :148-156
        ("after the FIN", _ingress, 0, CtResult.REPLY, False, TCP_LIFETIME),  # :158-166
        ("FIN other side", _egress, FIN, CtResult.ESTABLISHED, True, CLOSE_TIMEOUT),  # :168-179
    ]
    for i, (what, hook, flags, result, monitored, lifetime) in enumerate(steps):
        if i:
            clock.advance()
        before = clock.now()
        r = hook(native, flags)
        assert (r.event.ct_result, _monitored(r)) == (result, monitored), what
        _assert_timeout_in(native, clock, lifetime, before)
    clock.advance()  # :181-190: not refreshed: CT_CLOSE_TIMEOUT - 1 from now
    before = clock.now()
    r = _egress(native, 0)
    # Cilium's test calls __ct_lookup on the forward tuple and a dead entry leaves monitor at 0; at the hook,
    # ct_lookup4 looks the reverse tuple up first (bpf/lib/conntrack.h:841-853@82999990) and its miss sets monitor
    # (conntrack.h:375-377), which the forward hit on the dead entry then leaves: reported
    assert (r.event.ct_result, _monitored(r)) == (CtResult.ESTABLISHED, True)
    _assert_timeout_in(native, clock, CLOSE_TIMEOUT - 1, before)
    clock.advance()  # :192-201: a SYN reopens the closed entry
    before = clock.now()
    r = _egress(native, SYN)
    assert (r.event.ct_result, _monitored(r)) == (CtResult.NEW, True)
    _assert_timeout_in(native, clock, SYN_TIMEOUT, before)
    r = native.run("cil_to_container", packets.tcp(B2.ip, C, SP, CP, SYN))  # :203-210: an untracked tuple
    assert (r.event.ct_result, _monitored(r)) == (CtResult.NEW, True)


def test_ct_update_timeout(native):
    """conntrack_test.c's ct_update_timeout: an entry is reported again once a full report interval has passed
    (last_rx_report = now, tx side untouched), not within one, and at once when its seen flags change
    (rx_flags_seen = SYN) but not for the same flags again (bpf/tests/conntrack_test.c:45-81@82999990). Its last
    step (:83-88, flags ignored under a zero report mask) is a compile-time option here (CT_REPORT_FLAGS), not
    translated."""
    clock = Clock(native)
    _egress(native, SYN)
    created = native.ct_row("OUT", C, CP, S, SP).last_tx_report
    before = clock.now()
    r = _ingress(native, 0)  # never reported on the rx side: a full interval has passed (:57-63)
    row = native.ct_row("OUT", C, CP, S, SP)
    assert _monitored(r) and before <= row.last_rx_report <= clock.now() and row.last_tx_report == created
    assert row.rx_flags_seen == 0
    then = row.last_rx_report
    clock.set_now(then + REPORT_INTERVAL)  # :64-69: exactly a full interval later: no report
    r = _ingress(native, 0)
    assert not _monitored(r) and native.ct_row("OUT", C, CP, S, SP).last_rx_report == then
    before = clock.now()
    r = _ingress(native, SYN)  # :71-78: flags change: report
    row = native.ct_row("OUT", C, CP, S, SP)
    assert _monitored(r) and before <= row.last_rx_report <= clock.now() and row.rx_flags_seen == TcpFlags.SYN
    assert row.last_tx_report == created and row.tx_flags_seen == TcpFlags.SYN, "the tx side as the SYN left it"
    assert not _monitored(_ingress(native, SYN))  # :79-81


def _svc_row(node):
    row = node.ct_row("SVC", C, CP, VIP, VPORT)
    assert row is not None, [x.line() for x in node.ct()]
    return row


def test_ct_lookup_svc(native):
    """conntrack_test.c's ct_lookup_svc: a service entry gets CT_SYN_TIMEOUT on SYNs, the service TCP lifetime
    without SYN, and CT_CLOSE_TIMEOUT at the first FIN (a service entry sees one direction and closes both); an
    unknown tuple is CT_NEW (bpf/tests/conntrack_test.c:216-295@82999990). The trace record carries the backend lookup's
    monitor, not the service lookup's, so 'monitor' is not checked here."""
    clock = Clock(native)
    add_service(native, [(1, B1.ip, SP, 0)], frontend=VIP, port=VPORT, rev_nat=SVC_ID)
    to_vip = lambda flags, sport=CP: native.run("cil_from_container", packets.tcp(C, VIP, sport, VPORT, flags))
    steps = [("SYN", SYN, SYN_TIMEOUT), ("same flags", SYN, SYN_TIMEOUT),  # :243-262
             ("no SYN", 0, SVC_TCP_LIFETIME), ("FIN", FIN, CLOSE_TIMEOUT)]  # :264-282
    for i, (what, flags, lifetime) in enumerate(steps):
        if i:
            clock.advance()
        before = clock.now()
        r = to_vip(flags)
        assert r.event.svc_ct_result == (CtResult.NEW if i == 0 else CtResult.ESTABLISHED), what
        row = _svc_row(native)
        assert before + lifetime <= row.lifetime <= clock.now() + lifetime, what
    assert to_vip(SYN, sport=CP + 1).event.svc_ct_result == CtResult.NEW  # :284-291


def test_ct4_syn_then_rst(native):
    """bpf_ct_tests.c's ct4: a SYN creates the entry with tx_flags_seen SYN; the answer carrying SYN and RST (the
    test's second packet keeps the first's SYN bit: mkpkt rewrites one static buffer, :22-83) leaves rx_flags_seen
    SYN|RST and a lifetime of at most 10 s; neither packet is modified (bpf/tests/bpf_ct_tests.c:85-217@82999990)."""
    first = packets.tcp(C, S, 3010, 3020, SYN)
    r = native.run("cil_from_container", first)
    assert r.frame == first  # :152-153
    row = native.ct_row("OUT", C, 3010, S, 3020)
    assert row is not None and row.tx_flags_seen == TcpFlags.SYN  # :144-147
    second = packets.tcp(S, C, 3020, 3010, SYN | RST)
    r = native.run("cil_to_container", second)
    assert r.frame == second  # :194-195
    row = native.ct_row("OUT", C, 3010, S, 3020)
    assert row.rx_flags_seen == TcpFlags.SYN | TcpFlags.RST  # :204-207
    assert row.lifetime - native.now() <= 10  # :209-212
