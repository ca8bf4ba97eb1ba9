"""NAT keys, entries and rows: the NAT map's unswapped key, Cilium's 40-byte
entry, the ``cilium-dbg bpf nat list`` line grammar, and ``labkit nat list``."""
from __future__ import annotations

import json
import re
import socket
import struct
from pathlib import Path

import pytest

from labkit import cli
from labkit.config import DatapathConfig
from labkit.datapath.source import MAP_NAMES, node_build
from labkit.client import Lab
from labkit.maps import nat
from labkit.maps.ct import CtDiff, CtKey4, TupleFlags
from labkit.maps.nat import NAT_MAP, NatEntry, NatKey4, NatRow, diff_nat_rows
from labkit.net.topology import Topology

BPF = Path(__file__).resolve().parents[2] / "bpf"
POD, PP = "198.18.1.11", 40000  # a pod and its port
REMOTE, RP = "203.0.113.7", 80  # somewhere outside
NODE, NP = "198.51.100.11", 61000  # the node's address and the port SNAT picked

# The grammar of one `cilium-dbg bpf nat list` line (Cilium v1.16; Created= in lab-clock seconds here).
_IP = r"\d{1,3}(?:\.\d{1,3}){3}"
LINE = re.compile(
    rf"^(?P<proto>\S+) (?P<dir>OUT|IN) (?P<src>{_IP}):(?P<sport>\d+) -> (?P<dst>{_IP}):(?P<dport>\d+) "
    rf"XLATE_(?P<xlate>SRC|DST) (?P<to_addr>{_IP}):(?P<to_port>\d+) Created=(?P<created>-?\d+)sec ago "
    r"NeedsCT=(?P<needs_ct>\d+)$"
)


def raw_key(saddr: str, daddr: str, sport: int, dport: int, proto: int, flags: int) -> NatKey4:
    """A key built byte by byte from Cilium's layout: daddr, saddr, dport, sport (big-endian), nexthdr, flags."""
    raw = socket.inet_aton(daddr) + socket.inet_aton(saddr) + struct.pack(">HH", dport, sport) + bytes([proto, flags])
    assert len(raw) == 14
    return NatKey4.from_buffer_copy(raw)


def raw_entry(to_addr: str, to_port: int, created: int = 0, needs_ct: int = 0) -> NatEntry:
    """An entry built byte by byte from Cilium's layout: four u64, then address and port in network order."""
    raw = struct.pack("<QQQQ", created, needs_ct, 0, 0) + socket.inet_aton(to_addr) + struct.pack(">H", to_port)
    raw += b"\0\0"  # pad3
    assert len(raw) == 40
    return NatEntry.from_buffer_copy(raw)


NOW = 1230  # the lab clock when the rows below were read


def out_row(created: int = 1200) -> NatRow:
    return NatRow.of(raw_key(POD, REMOTE, PP, RP, 6, 0), raw_entry(NODE, NP, created, 1), NOW)


def in_row(created: int = 1200) -> NatRow:
    return NatRow.of(raw_key(REMOTE, NODE, RP, NP, 6, 1), raw_entry(POD, PP, created, 1), NOW)


# -- the grammar ---------------------------------------------------------------
def test_out_line_by_hand():
    """An OUT entry prints `TCP OUT src:sport -> dst:dport XLATE_SRC to:port Created=<age>sec ago NeedsCT=`
    (NatEntry4.Dump: "XLATE_%s %s:%d Created=%s NeedsCT=%d", the age "%dsec ago" from the clock source)."""
    line = out_row().line()
    assert line == f"TCP OUT {POD}:{PP} -> {REMOTE}:{RP} XLATE_SRC {NODE}:{NP} Created=30sec ago NeedsCT=1"
    m = LINE.match(line)
    assert m and (m["dir"], m["xlate"]) == ("OUT", "SRC")
    assert str(out_row()) == line


def test_in_line_by_hand():
    """An IN entry prints the reply's tuple and XLATE_DST with the address the reply is rewritten to."""
    line = in_row(1223).line()
    assert line == f"TCP IN {REMOTE}:{RP} -> {NODE}:{NP} XLATE_DST {POD}:{PP} Created=7sec ago NeedsCT=1"
    m = LINE.match(line)
    assert m and (m["dir"], m["xlate"], m["created"]) == ("IN", "DST", "7")


@pytest.mark.parametrize("proto,name", [(17, "UDP"), (1, "ICMP"), (132, "SCTP"), (47, "47")])
def test_line_protocol_names(proto, name):
    """The line starts with Cilium's protocol name (the number for unknown protocols)."""
    row = NatRow.of(NatKey4.make(POD, REMOTE, PP, RP, proto), NatEntry.make(NODE, NP), NOW)
    assert row.line().startswith(f"{name} OUT ") and LINE.match(row.line())


def test_line_without_a_clock_prints_the_raw_value():
    """Without the agent's clock source Cilium prints `Created=? (raw N)`; so does a row read without one."""
    row = NatRow.of(NatKey4.make(POD, REMOTE, PP, RP, 6), NatEntry.make(NODE, NP, created=1200))
    assert " Created=? (raw 1200) NeedsCT=0" in row.line()


def test_dir_comes_from_the_in_bit_only():
    """IN when TUPLE_F_IN is set, OUT otherwise (as Cilium's dump reads the flags)."""
    assert NatRow.of(raw_key(POD, REMOTE, PP, RP, 6, 0), NatEntry()).dir == "OUT"
    assert NatRow.of(raw_key(POD, REMOTE, PP, RP, 6, 1), NatEntry()).dir == "IN"
    assert NatRow.of(raw_key(POD, REMOTE, PP, RP, 6, 4), NatEntry()).dir == "OUT"


# -- byte orders ---------------------------------------------------------------
def test_key_make_is_unswapped():
    """NatKey4.make stores saddr/sport as the source and daddr/dport as the destination, big-endian."""
    key = NatKey4.make(POD, REMOTE, PP, RP, 6, TupleFlags.IN)
    assert bytes(key) == bytes(raw_key(POD, REMOTE, PP, RP, 6, 1))
    assert bytes(key)[8:12] == struct.pack(">HH", RP, PP)  # dport at 8, sport at 10
    assert (socket.ntohs(key.dport), socket.ntohs(key.sport)) == (RP, PP)
    assert key.raw() == bytes(key)


def test_nat_key_differs_from_ct_key_of_the_same_flow():
    """The CT key of the same flow stores addresses and ports the other way round: the NAT key does not swap."""
    ct_key = CtKey4.make(POD, REMOTE, PP, RP, 6, TupleFlags.OUT)
    nat_key = NatKey4.make(POD, REMOTE, PP, RP, 6, TupleFlags.OUT)
    assert bytes(ct_key) != bytes(nat_key)
    assert bytes(ct_key)[:4] == socket.inet_aton(POD) and bytes(nat_key)[:4] == socket.inet_aton(REMOTE)
    assert bytes(ct_key)[8:12] == struct.pack(">HH", RP, PP) == bytes(nat_key)[8:12]
    assert not isinstance(nat_key, CtKey4)


def test_entry_make_byte_order():
    """NatEntry.make: created/needs_ct little-endian u64s, to_addr at 32 and to_port at 36 in network order."""
    raw = bytes(NatEntry.make(NODE, NP, created=0x0102, needs_ct=1))
    assert len(raw) == 40
    assert raw[:8] == struct.pack("<Q", 0x0102) and raw[8:16] == struct.pack("<Q", 1)
    assert raw[16:32] == bytes(16)
    assert raw[32:36] == socket.inet_aton(NODE) and raw[36:38] == struct.pack(">H", NP) and raw[38:] == b"\0\0"
    assert raw == bytes(raw_entry(NODE, NP, 0x0102, 1))


def test_row_decodes_to_host_form():
    """NatRow holds addresses as dotted quads and ports in host order, whatever the machine's byte order."""
    row = out_row()
    assert (row.proto, row.src, row.sport, row.dst, row.dport) == (6, POD, PP, REMOTE, RP)
    assert (row.to_addr, row.to_port, row.created, row.needs_ct) == (NODE, NP, 1200, 1)
    assert row.key == bytes(raw_key(POD, REMOTE, PP, RP, 6, 0))


# -- JSON, identity and diffs ----------------------------------------------------
def test_to_json():
    """to_json has the row's fields, proto by name and xlate, the age when the row was read with a clock, and
    no raw key; it is JSON-serialisable."""
    data = in_row().to_json()
    assert data == {"proto": "TCP", "dir": "IN", "src": REMOTE, "sport": RP, "dst": NODE, "dport": NP,
                    "xlate": "DST", "to_addr": POD, "to_port": PP, "created": 1200, "needs_ct": 1, "age": 30}
    assert json.loads(json.dumps(data)) == data


def test_ident_is_map_and_key():
    """Two dumps of the same key have the same ident; a different direction is a different row."""
    assert out_row(1).ident == out_row(2).ident == (NAT_MAP, out_row().key)
    assert out_row().ident != in_row().ident
    assert out_row(1) != out_row(2) and out_row() == out_row()


def test_diff_nat_rows():
    """diff_nat_rows reports added, removed and changed rows (with the fields that moved) as a CtDiff."""
    a_out, a_in = out_row(), in_row()
    moved = NatRow.of(raw_key(POD, REMOTE, PP, RP, 6, 0), raw_entry(NODE, NP + 1, 1200, 1))
    d = diff_nat_rows([a_out, a_in], [moved])
    assert isinstance(d, CtDiff) and d
    assert d.removed == (a_in,) and d.added == ()
    assert d.changed == ((a_out, moved, ("to_port",)),)
    assert d.lines() == [f"- {a_in.line()}", f"~ TCP OUT {POD}:{PP} -> {REMOTE}:{RP}: to_port {NP}→{NP + 1}"]
    assert diff_nat_rows([], [a_in]).lines() == [f"+ {a_in.line()}"]
    assert not diff_nat_rows([a_out], [out_row()])


# -- the map in the datapath build ----------------------------------------------
def test_map_is_defined_and_pinned():
    """maps_nat.h defines cilium_snat_v4_external, an LRU hash ipv4_ct_tuple → ipv4_nat_entry; nodes pin it."""
    text = (BPF / "lib" / "maps_nat.h").read_text()
    assert re.search(r'BPF_F_TABLE\("lru_hash", struct ipv4_ct_tuple, struct ipv4_nat_entry, '
                     r'cilium_snat_v4_external, NAT_MAP_SIZE, 0\);', text)
    assert '#include "nat_types.h"' in text
    assert NAT_MAP in MAP_NAMES


def test_node_build_text_has_the_nat_map():
    """A node's translation unit carries the NAT struct and map (so BCC creates the map)."""
    text = node_build(Topology.default("demo"), DatapathConfig(), "node-a", vxlan_ifindex=7).text()
    assert "struct ipv4_nat_entry {" in text and "cilium_snat_v4_external, NAT_MAP_SIZE" in text


# -- labkit nat list -------------------------------------------------------------
class FakeLab:
    """Just enough of Lab for `nat list`."""

    def __init__(self, name: str = "demo"):
        self.name = name
        self.topology = Topology.default(name)
        self.asked: list[str] = []

    def nat(self, node: str) -> list[NatRow]:
        self.topology.node(node)
        self.asked.append(node)
        return [out_row(), in_row()]

    def nat_command(self, node: str) -> list[str]:
        return [f"bpftool map dump pinned /sys/fs/bpf/labkit/{self.name}/{node}/{NAT_MAP}"]


@pytest.fixture
def fake(monkeypatch):
    """Lab.attach returns a FakeLab."""
    lab = FakeLab()
    monkeypatch.delenv("LABKIT_LAB", raising=False)
    monkeypatch.setattr(Lab, "attach", staticmethod(lambda name="demo": lab))
    return lab


def test_parse_nat_list():
    """nat list NODE takes --json and --show-command; nat alone is a usage error."""
    args = cli.build_parser().parse_args(["nat", "list", "node-a", "--json", "--show-command"])
    assert (args.node, args.json, args.show_command, args.func) == ("node-a", True, True, cli.cmd_nat_list)
    assert cli.main(["nat"]) == 2


def test_nat_list_prints_only_rows(fake, capsys):
    """nat list prints one cilium-dbg line per entry, then the blank line fmt.Println adds after the map."""
    assert cli.main(["nat", "list", "node-b"]) == 0
    out = capsys.readouterr().out
    assert out == f"{out_row().line()}\n{in_row().line()}\n\n" and all(LINE.match(x) for x in out.split("\n")[:2])
    assert fake.asked == ["node-b"]


def test_nat_list_show_command(fake, capsys):
    """--show-command prints the bpftool command as a '# ' line before the rows (on stderr with --json)."""
    assert cli.main(["nat", "list", "node-a", "--show-command"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"# {fake.nat_command('node-a')[0]}", out_row().line(), in_row().line(), ""]
    assert cli.main(["nat", "list", "node-a", "--json", "--show-command"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [out_row().to_json(), in_row().to_json()]
    assert err.splitlines() == [f"# {fake.nat_command('node-a')[0]}"]


def test_nat_list_unknown_node(fake, capsys):
    """nat list of an unknown node fails with exit 1 and names the nodes."""
    assert cli.main(["nat", "list", "node-z"]) == 1
    err = capsys.readouterr().err
    assert "node-z" in err and "node-a" in err
