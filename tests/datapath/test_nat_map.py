"""The NAT map on the real kernel: pinned on every node, empty, read back as
`cilium-dbg bpf nat list` rows, flushed by reset. No program uses it yet."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from labkit.maps.base import PinnedMap
from labkit.maps.nat import NAT_MAP, NAT_MAP_SIZE, NatEntry, NatKey4, NatRow

BPF_MAP_TYPE_LRU_HASH = 9
LABKIT = [sys.executable, "-m", "labkit", "cli"]
REMOTE, RP = "203.0.113.7", 80  # somewhere outside the lab
NAT_PORT = 61000
_IP = r"\d{1,3}(?:\.\d{1,3}){3}"
LINE = re.compile(
    rf"^(?P<proto>\S+) (?P<dir>OUT|IN) (?P<src>{_IP}):(?P<sport>\d+) -> (?P<dst>{_IP}):(?P<dport>\d+) "
    rf"XLATE_(?P<xlate>SRC|DST) (?P<to_addr>{_IP}):(?P<to_port>\d+) Created=(?P<age>\d+)sec ago "
    r"NeedsCT=(?P<needs_ct>\d+)$"
)


def labkit(lab, *args: str) -> subprocess.CompletedProcess:
    """Run ``labkit --lab <lab> ARGS`` and capture its output as text."""
    return subprocess.run(LABKIT + ["--lab", lab.name, *args], capture_output=True, text=True, timeout=60)


def nat_map(lab, node: str) -> PinnedMap:
    """The node's pinned NAT map, opened with labkit's key and entry types."""
    return PinnedMap(lab.node(node).pin(NAT_MAP), NatKey4, NatEntry)


def write_pair(lab, node: str = "node-a") -> tuple[NatRow, NatRow]:
    """Write a masquerade pair by hand: a1 → REMOTE leaves as node:NAT_PORT (OUT), the reply comes back (IN)."""
    pod, node_ip, now = lab.pod("a1").ip, lab.node(node).ip, lab.clock.now()
    out_key = NatKey4.make(pod, REMOTE, 40000, RP, 6)
    out_val = NatEntry.make(node_ip, NAT_PORT, created=now, needs_ct=1)
    in_key = NatKey4.make(REMOTE, node_ip, RP, NAT_PORT, 6, 1)
    in_val = NatEntry.make(pod, 40000, created=now, needs_ct=1)
    with nat_map(lab, node) as m:
        m[out_key] = out_val
        m[in_key] = in_val
    return NatRow.of(out_key, out_val), NatRow.of(in_key, in_val)


def test_nat_map_pinned_empty_lru(lab):
    """Every node pins an empty cilium_snat_v4_external: LRU hash, 524288 entries, 14-byte key, 40-byte value."""
    for node in lab.topology.nodes:
        assert lab.nat(node.name) == []
        with nat_map(lab, node.name) as m:  # the constructor checks the key and value sizes
            # The kernel keeps 15 characters of a map's name (BPF_OBJ_NAME_LEN), as on a real Cilium node.
            assert (m.name, m.map_type, m.max_entries) == (NAT_MAP[:15], BPF_MAP_TYPE_LRU_HASH, NAT_MAP_SIZE)


def test_written_entries_read_back_as_rows(lab):
    """An OUT and an IN entry written from Python come back from lab.nat() as the same rows, in Cilium's grammar."""
    out, inn = write_pair(lab)
    rows = lab.nat("node-a")
    assert sorted(rows, key=lambda r: r.dir, reverse=True) == [out, inn]
    a1, node_ip = lab.pod("a1").ip, lab.node("node-a").ip
    lines = {r.dir: r.line() for r in rows}
    age = rows[0].now - out.created  # the lab clock when the rows were read, minus what was written
    assert 0 <= age <= 2
    assert lines["OUT"] == f"TCP OUT {a1}:40000 -> {REMOTE}:{RP} XLATE_SRC {node_ip}:{NAT_PORT} " \
                           f"Created={age}sec ago NeedsCT=1"
    assert lines["IN"] == f"TCP IN {REMOTE}:{RP} -> {node_ip}:{NAT_PORT} XLATE_DST {a1}:40000 " \
                          f"Created={age}sec ago NeedsCT=1"
    assert lab.nat("node-b") == []  # maps are per node


def test_cli_nat_list(lab):
    """labkit nat list prints one grammar line per entry; --json and --show-command work on the real map."""
    out, inn = write_pair(lab)
    proc = labkit(lab, "nat", "list", "node-a")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "" and len(lines) == 3, "the two rows, then the blank line after the map"
    got = {m["dir"]: m for m in map(LINE.match, lines[:2])}
    assert {d: (m["src"], int(m["sport"]), m["to_addr"], int(m["to_port"])) for d, m in got.items()} == {
        r.dir: (r.src, r.sport, r.to_addr, r.to_port) for r in (out, inn)}
    assert all(0 <= int(m["age"]) <= 5 for m in got.values())
    proc = labkit(lab, "nat", "list", "node-a", "--json", "--show-command")
    assert proc.returncode == 0, proc.stderr
    data = sorted(json.loads(proc.stdout), key=lambda r: r["dir"], reverse=True)
    assert all(0 <= row.pop("age") <= 5 for row in data)  # how long ago, by the lab clock when listed
    assert data == [out.to_json(), inn.to_json()]
    assert proc.stderr.strip() == f"# bpftool map dump pinned {lab.pin_dir('node-a')}/{NAT_MAP}"
    empty = labkit(lab, "nat", "list", "node-b")
    assert (empty.returncode, empty.stdout) == (0, "\n")


def test_bpftool_dumps_the_same_two_entries(lab):
    """`bpftool map dump pinned <pin>/cilium_snat_v4_external` shows the two entries labkit wrote, byte for byte."""
    write_pair(lab)
    pin = f"{lab.pin_dir('node-a')}/{NAT_MAP}"
    with nat_map(lab, "node-a") as m:
        written = {bytes(k): bytes(v) for k, v in m.items()}
    proc = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", pin], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    entries = json.loads(proc.stdout)
    assert len(entries) == 2
    dumped = {bytes(int(b, 16) for b in e["key"]): bytes(int(b, 16) for b in e["value"]) for e in entries}
    assert dumped == written
    for e in entries:  # with BTF (BCC attaches it) bpftool names the members of both structs
        if "formatted" in e:
            assert set(e["formatted"]["key"]) == {"daddr", "saddr", "dport", "sport", "nexthdr", "flags"}
            assert {"created", "needs_ct", "to_addr", "to_port"} <= set(e["formatted"]["value"])


def test_reset_empties_nat_map(lab):
    """lab.reset() flushes the NAT map of every node along with CT."""
    write_pair(lab, "node-a")
    write_pair(lab, "node-b")
    assert len(lab.nat("node-a")) == len(lab.nat("node-b")) == 2
    lab.reset()
    assert lab.nat("node-a") == [] and lab.nat("node-b") == []


def test_datapath_does_not_use_nat_map_yet(lab):
    """Pod traffic across nodes makes CT rows but no NAT entries: the datapath does not touch the map yet."""
    r = lab.pod("a1").exec("ping", "-c", "1", "-W", "2", lab.pod("b1").ip)
    assert r.returncode == 0, r.stdout + r.stderr
    assert lab.ct("node-a") and lab.ct("node-b")
    assert lab.nat("node-a") == [] and lab.nat("node-b") == []
