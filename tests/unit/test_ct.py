"""CT keys, entries and rows: Cilium's stored-key layout and the
``cilium-dbg bpf ct list global`` line grammar."""
from __future__ import annotations

import re
import socket
import struct

import pytest

from labkit.maps.ct import (
    CT_MAPS,
    CtEntry,
    CtFlags,
    CtKey4,
    CtRow,
    TupleFlags,
    diff_rows,
    list_text,
    proto_name,
)

C, CP = "198.18.1.11", 40000  # client
S, SP = "198.18.2.11", 8080  # server
VIP, VPORT = "198.19.0.10", 80  # a ClusterIP

# The grammar of one `cilium-dbg bpf ct list global` line (Cilium v1.16).
_IP = r"\d{1,3}(?:\.\d{1,3}){3}"
LINE = re.compile(
    rf"^(?P<proto>\S+) (?P<dir>OUT|IN|SVC) (?P<src>{_IP}):(?P<sport>\d+) -> (?P<dst>{_IP}):(?P<dport>\d+) "
    r"(?P<related>related )?expires=(?P<expires>\d+)(?: \(remaining: (?P<remaining>-?\d+) sec\(s\)\))? "
    r"Packets=(?P<packets>\d+) Bytes=(?P<bytes>\d+) RxFlagsSeen=0x(?P<rx>[0-9a-f]{2}) LastRxReport=(?P<lrx>\d+) "
    r"TxFlagsSeen=0x(?P<tx>[0-9a-f]{2}) LastTxReport=(?P<ltx>\d+) Flags=0x(?P<flags>[0-9a-f]{4}) "
    r"\[ (?P<names>(?:\S+ )*)\] RevNAT=(?P<revnat>\d+) SourceSecurityID=(?P<secid>\d+) "
    r"IfIndex=(?P<ifindex>\d+) BackendID=(?P<backend>\d+) $"  # "... BackendID=%d \n": a trailing space
)
CILIUM_FLAG_NAMES = [
    (0x0001, "RxClosing"),
    (0x0002, "TxClosing"),
    (0x0004, "Nat64"),
    (0x0008, "LBLoopback"),
    (0x0010, "SeenNonSyn"),
    (0x0020, "NodePort"),
    (0x0040, "ProxyRedirect"),
    (0x0080, "DSRInternal"),
    (0x0100, "FromL7LB"),
    (0x0400, "FromTunnel"),
]


def raw_key(daddr: str, saddr: str, dport: int, sport: int, proto: int, flags: int) -> CtKey4:
    """A key built byte by byte from Cilium's layout (addresses and ports big-endian)."""
    raw = socket.inet_aton(daddr) + socket.inet_aton(saddr) + struct.pack(">HH", dport, sport) + bytes([proto, flags])
    assert len(raw) == 14
    return CtKey4.from_buffer_copy(raw)


def raw_entry(
    *,
    backend_id=0,
    packets=0,
    bytes_=0,
    lifetime=0,
    flags=0,
    rev_nat=0,
    ifindex=0,
    tx_seen=0,
    rx_seen=0,
    sec_id=0,
    last_tx=0,
    last_rx=0,
) -> CtEntry:
    """An entry built byte by byte from Cilium's ct_entry layout (rev_nat_index in network order)."""
    raw = (
        struct.pack("<QQQQIH", 0, backend_id, packets, bytes_, lifetime, flags)
        + struct.pack(">H", rev_nat)
        + struct.pack("<HBBIII", ifindex, tx_seen, rx_seen, sec_id, last_tx, last_rx)
    )
    assert len(raw) == 56
    return CtEntry.from_buffer_copy(raw)


# -- keys -------------------------------------------------------------------
def test_make_stores_cilium_out_key_layout():
    """CtKey4.make(C, S, cp, sp) stores {daddr=C, saddr=S, dport=sp, sport=cp} in network order."""
    key = CtKey4.make(C, S, CP, SP, 6, TupleFlags.OUT)
    raw = key.raw()
    assert len(raw) == 14
    assert raw[0:4] == socket.inet_aton(C)
    assert raw[4:8] == socket.inet_aton(S)
    assert raw[8:10] == SP.to_bytes(2, "big")
    assert raw[10:12] == CP.to_bytes(2, "big")
    assert raw[12] == 6 and raw[13] == 0


def test_make_equals_hand_built_key():
    """make() and a hand-built key of the same flow are byte-identical, for IN keys too."""
    assert CtKey4.make(C, S, CP, SP, 17, TupleFlags.IN).raw() == raw_key(C, S, SP, CP, 17, 1).raw()


# -- rows -------------------------------------------------------------------
def test_row_out():
    """An OUT key reads initiator -> responder: daddr:sport-field -> saddr:dport-field."""
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 0), raw_entry())
    assert (row.dir, row.related) == ("OUT", False)
    assert (row.src, row.sport, row.dst, row.dport) == (C, CP, S, SP)
    assert row.proto == 6 and row.map == "cilium_ct4_global"


def test_row_in():
    """An IN key (flags=1) reads the same way round and is labelled IN."""
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 1), raw_entry())
    assert row.dir == "IN" and not row.related
    assert row.flow() == f"{C}:{CP} -> {S}:{SP}"


def test_row_svc():
    """A SERVICE key {daddr=VIP, saddr=C, dport=cp, sport=vport} reads client -> VIP:vport."""
    row = CtRow.of(raw_key(VIP, C, CP, VPORT, 6, int(TupleFlags.SERVICE)), raw_entry())
    assert row.dir == "SVC" and not row.related
    assert (row.src, row.sport, row.dst, row.dport) == (C, CP, VIP, VPORT)


@pytest.mark.parametrize("flags,direction", [(2, "OUT"), (3, "IN")])
def test_row_related(flags, direction):
    """RELATED keys keep their direction, set related and print 'related ' before expires."""
    row = CtRow.of(raw_key(C, S, SP, CP, 1, flags), raw_entry(lifetime=30))
    assert row.dir == direction and row.related
    assert f"{C}:{CP} -> {S}:{SP} related expires=30 " in row.line()


def test_row_map_by_protocol():
    """Without a map name, TCP rows come from cilium_ct4_global and the rest from cilium_ct_any4_global."""
    assert CtRow.of(raw_key(C, S, SP, CP, 6, 0), raw_entry()).map == "cilium_ct4_global"
    assert CtRow.of(raw_key(C, S, SP, CP, 17, 0), raw_entry()).map == "cilium_ct_any4_global"
    assert CtRow.of(raw_key(C, S, SP, CP, 17, 0), raw_entry(), "custom").map == "custom"
    assert CT_MAPS == ("cilium_ct4_global", "cilium_ct_any4_global")


def test_row_rev_nat_host_order():
    """rev_nat is the host-order value of the network-order rev_nat_index field (177 stored as htons(177))."""
    entry = raw_entry(rev_nat=177)
    assert entry.rev_nat_index == socket.htons(177)
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 0), entry)
    assert row.rev_nat == 177
    assert " RevNAT=177 " in row.line()


def test_row_entry_fields():
    """Every ct_entry field lands in the row from its Cilium offset."""
    e = raw_entry(backend_id=9, packets=5, bytes_=400, lifetime=1234, flags=0x10, ifindex=7, tx_seen=0x1B,
                  rx_seen=0x12, sec_id=256, last_tx=101, last_rx=100)
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 0), e)
    assert (row.backend_id, row.packets, row.bytes, row.lifetime, row.flags) == (9, 5, 400, 1234, 0x10)
    assert (row.ifindex, row.tx_flags_seen, row.rx_flags_seen, row.src_sec_id) == (7, 0x1B, 0x12, 256)
    assert (row.last_tx_report, row.last_rx_report) == (101, 100)


# -- the line grammar ---------------------------------------------------------
ROWS = {
    "out": (raw_key(C, S, SP, CP, 6, 0), raw_entry(lifetime=5000, flags=0x10, packets=3, bytes_=222)),
    "in": (raw_key(C, S, SP, CP, 6, 1), raw_entry(lifetime=5000, rx_seen=0x02, tx_seen=0x12)),
    "svc": (raw_key(VIP, C, CP, VPORT, 6, 4), raw_entry(lifetime=70, rev_nat=3, backend_id=2)),
    "related": (raw_key(C, S, SP, CP, 1, 2), raw_entry(lifetime=60)),
    "udp": (raw_key(C, S, 53, CP, 17, 0), raw_entry(lifetime=60, flags=0xFFFF)),
}


@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("now", [None, 100])
def test_line_matches_grammar(name, now):
    """line() and line(now) parse with the ct list grammar and round-trip every value."""
    key, entry = ROWS[name]
    row = CtRow.of(key, entry)
    m = LINE.match(row.line(now))
    assert m, row.line(now)
    assert (m["proto"], m["dir"], m["src"], int(m["sport"]), m["dst"], int(m["dport"])) == (
        row.proto_name, row.dir, row.src, row.sport, row.dst, row.dport)
    assert bool(m["related"]) == row.related
    assert int(m["expires"]) == entry.lifetime
    assert m["remaining"] is None if now is None else int(m["remaining"]) == entry.lifetime - now
    assert int(m["flags"], 16) == entry.flags
    assert int(m["revnat"]) == socket.ntohs(entry.rev_nat_index)
    assert int(m["packets"]) == entry.packets and int(m["backend"]) == entry.backend_id


def test_line_exact_out():
    """A hand-made OUT row prints exactly as cilium-dbg would print it."""
    row = CtRow.of(
        raw_key(C, S, SP, CP, 6, 0),
        raw_entry(lifetime=12345, flags=0x1B, packets=5, bytes_=400, rx_seen=0x12, tx_seen=0x1B, last_rx=100,
                  last_tx=101, rev_nat=177, sec_id=256, ifindex=7),
    )
    assert row.line() == (
        "TCP OUT 198.18.1.11:40000 -> 198.18.2.11:8080 expires=12345 Packets=5 Bytes=400 RxFlagsSeen=0x12 "
        "LastRxReport=100 TxFlagsSeen=0x1b LastTxReport=101 Flags=0x001b [ RxClosing TxClosing LBLoopback "
        "SeenNonSyn ] RevNAT=177 SourceSecurityID=256 IfIndex=7 BackendID=0 "
    )
    assert str(row) == row.line()


def test_line_exact_svc_with_remaining():
    """A hand-made SVC row with -d style remaining time prints exactly, empty flags as '[ ]'."""
    row = CtRow.of(raw_key(VIP, C, CP, VPORT, 6, 4), raw_entry(lifetime=160, rev_nat=3, backend_id=2))
    assert row.line(100) == (
        "TCP SVC 198.18.1.11:40000 -> 198.19.0.10:80 expires=160 (remaining: 60 sec(s)) Packets=0 Bytes=0 "
        "RxFlagsSeen=0x00 LastRxReport=0 TxFlagsSeen=0x00 LastTxReport=0 Flags=0x0000 [ ] RevNAT=3 "
        "SourceSecurityID=0 IfIndex=0 BackendID=2 "
    )


def test_line_exact_related_icmp():
    """A hand-made RELATED ICMP row prints 'related ' between the flow and expires."""
    row = CtRow.of(raw_key(C, S, 0, 7, 1, 2), raw_entry(lifetime=60))
    assert row.line() == (
        "ICMP OUT 198.18.1.11:7 -> 198.18.2.11:0 related expires=60 Packets=0 Bytes=0 RxFlagsSeen=0x00 "
        "LastRxReport=0 TxFlagsSeen=0x00 LastTxReport=0 Flags=0x0000 [ ] RevNAT=0 SourceSecurityID=0 "
        "IfIndex=0 BackendID=0 "
    )


def test_line_grammar_of_later_releases():
    """1.18 drops IfIndex= (commit 105cd80bf473, the field became reserved); 1.19 appends NatPort=%d, the
    port field in network order (cilium/cilium#43017); the 1.20 profile prints both changes."""
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 0), raw_entry(lifetime=12345, ifindex=socket.htons(40001)), release="1.20")
    assert row.line() == (
        "TCP OUT 198.18.1.11:40000 -> 198.18.2.11:8080 expires=12345 Packets=0 Bytes=0 RxFlagsSeen=0x00 "
        "LastRxReport=0 TxFlagsSeen=0x00 LastTxReport=0 Flags=0x0000 [ ] RevNAT=0 SourceSecurityID=0 "
        "BackendID=0 NatPort=40001 "
    )


def test_list_text_blank_line_after_each_map():
    """list_text: every row on its line, then the blank line cilium-dbg's fmt.Println adds after each map,
    an empty map being only that line."""
    out = CtRow.of(raw_key(C, S, SP, CP, 6, 0), raw_entry(lifetime=1))
    twin = CtRow.of(raw_key(C, S, 0, 0, 1, 2), raw_entry(lifetime=1))
    assert list_text([[out], [twin]]) == f"{out.line()}\n\n{twin.line()}\n\n"
    assert list_text([[], []]) == "\n\n"


def test_line_remaining_negative_when_expired():
    """line(now) past the lifetime shows a negative remaining time."""
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 0), raw_entry(lifetime=100))
    assert "expires=100 (remaining: -5 sec(s)) " in row.line(105)
    assert "(remaining: 0 sec(s))" in row.line(100)


def test_real_sample_line():
    """The loopback sample from a real node prints 'Flags=0x001b [ RxClosing TxClosing LBLoopback SeenNonSyn ] RevNAT=177'."""
    row = CtRow.of(
        raw_key("169.254.42.1", "192.0.2.133", 8000, 48766, 6, 0), raw_entry(flags=0x001B, rev_nat=177)
    )
    line = row.line()
    assert line.startswith("TCP OUT 169.254.42.1:48766 -> 192.0.2.133:8000 ")
    assert "Flags=0x001b [ RxClosing TxClosing LBLoopback SeenNonSyn ] RevNAT=177 " in line


# -- flags and protocols --------------------------------------------------------
@pytest.mark.parametrize("bit,name", CILIUM_FLAG_NAMES)
def test_each_flag_name(bit, name):
    """Each known flag bit has Cilium's name."""
    assert CtFlags.names(bit) == [name]


def test_flag_names_order_and_unknown():
    """All known bits print in Cilium's order, then bits from MaxFlags (0x0800) up as Unknown=0x%04x; the
    reserved bit 0x0200 below it is never printed (flagsString: unknownFlags &^= MaxFlags - 1)."""
    every = sum(bit for bit, _ in CILIUM_FLAG_NAMES)
    assert CtFlags.names(every) == [name for _, name in CILIUM_FLAG_NAMES]
    assert CtFlags.names(0x0200) == [] and CtFlags.names(0x0210) == ["SeenNonSyn"]
    assert CtFlags.names(0x0800) == ["Unknown=0x0800"]
    assert CtFlags.names(0x8001) == ["RxClosing", "Unknown=0x8000"]
    assert CtFlags.names(0xF000 | 0x0010) == ["SeenNonSyn", "Unknown=0xf000"]
    assert CtFlags.names(0) == []


def test_flag_names_in_line():
    """The bracketed list in line() holds the same names, space separated."""
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 0), raw_entry(flags=0x0420 | 0x1000))
    assert "Flags=0x1420 [ NodePort FromTunnel Unknown=0x1000 ] " in row.line()
    assert row.flag_names == ["NodePort", "FromTunnel", "Unknown=0x1000"]


@pytest.mark.parametrize(
    "proto,name", [(0, "ANY"), (1, "ICMP"), (6, "TCP"), (17, "UDP"), (58, "ICMPv6"), (132, "SCTP"), (47, "47"), (255, "255")]
)
def test_proto_names(proto, name):
    """Protocol numbers print with Cilium's names, other numbers as themselves."""
    assert proto_name(proto) == name
    assert CtRow.of(raw_key(C, S, SP, CP, proto, 0), raw_entry()).line().startswith(f"{name} OUT ")


# -- json, expiry, diff ----------------------------------------------------------
def test_to_json():
    """to_json gives proto/dir/src/dst names, flags by name, host-order rev_nat, expires, related, remaining, expired."""
    row = CtRow.of(raw_key(VIP, C, CP, VPORT, 6, 4),
                   raw_entry(lifetime=150, flags=0x0011, rev_nat=177, backend_id=4, packets=2, bytes_=120))
    data = row.to_json(now=100)
    expected = {
        "proto": "TCP",
        "dir": "SVC",
        "src": C,
        "sport": CP,
        "dst": VIP,
        "dport": VPORT,
        "flags": ["RxClosing", "SeenNonSyn"],
        "rev_nat": 177,
        "backend_id": 4,
        "packets": 2,
        "bytes": 120,
        "expires": 150,
        "related": False,
        "remaining": 50,
        "expired": False,
    }
    assert {k: data[k] for k in expected} == expected
    assert "key" not in data and "lifetime" not in data
    assert "remaining" not in row.to_json() and "expired" not in row.to_json()


def test_expired_is_strictly_after_lifetime():
    """expired(now) is lifetime < now: alive at the lifetime second itself, expired one second later."""
    row = CtRow.of(raw_key(C, S, SP, CP, 6, 0), raw_entry(lifetime=100))
    assert not row.expired(99)
    assert not row.expired(100)
    assert row.expired(101)
    assert row.remaining(90) == 10


def test_diff_rows_added_removed_changed():
    """diff_rows keys rows by map and key bytes: new keys are added, gone keys removed, moved fields listed."""
    k1, k2, k3 = raw_key(C, S, SP, 1, 6, 0), raw_key(C, S, SP, 2, 6, 0), raw_key(C, S, SP, 3, 6, 0)
    before = [CtRow.of(k1, raw_entry(packets=1, lifetime=10)), CtRow.of(k2, raw_entry())]
    after = [CtRow.of(k1, raw_entry(packets=4, lifetime=20)), CtRow.of(k3, raw_entry())]
    d = diff_rows(before, after)
    assert [r.sport for r in d.added] == [3]
    assert [r.sport for r in d.removed] == [2]
    assert len(d.changed) == 1
    old, new, fields = d.changed[0]
    assert (old.sport, new.sport, set(fields)) == (1, 1, {"packets", "lifetime"})
    assert d
    assert [line[0] for line in d.lines()] == ["+", "-", "~"]


def test_diff_rows_same_key_other_map_is_different_row():
    """The same key bytes in two maps are two rows; identical snapshots give an empty (falsy) diff."""
    k = raw_key(C, S, SP, CP, 17, 0)
    a = CtRow.of(k, raw_entry(), "cilium_ct_any4_global")
    b = CtRow.of(k, raw_entry(), "cilium_ct4_global")
    d = diff_rows([a], [b])
    assert len(d.added) == 1 and len(d.removed) == 1 and not d.changed
    assert not diff_rows([a], [a])
    assert diff_rows([a], [a]).lines() == []


def test_a_row_from_its_fields_equals_the_row_and_refuses_any_other_shape():
    """CtRow.from_fields (what labkitd's wire decodes with) makes a row equal to CtRow.of's, and a dict with a
    field missing or one unknown is a TypeError naming them."""
    row = CtRow.of(CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 80, 6, 0), CtEntry(lifetime=100, packets=3))
    again = CtRow.from_fields(dict(row.__dict__))
    assert again == row and again.key == row.key and hash(again) == hash(row)
    missing = {k: v for k, v in row.__dict__.items() if k != "packets"}
    with pytest.raises(TypeError, match=r"\['packets'\] missing"):
        CtRow.from_fields(missing)
    with pytest.raises(TypeError, match=r"\['colour'\] unknown"):
        CtRow.from_fields({**row.__dict__, "colour": 1})
