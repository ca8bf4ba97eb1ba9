"""The Service agent against the real kernel: what `lab.services` writes into
every node's pinned cilium_lb4_* maps (read back with PinnedMap and bpftool),
`lb list` and `lb list --bpf`, removal, refusals that leave the maps byte-identical,
terminating backends, `lab.reset()`, one connection through the VIP; and the same
on a Cilium 1.20 lab, whose keys carry the protocol."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.config import DatapathConfig
from labkit.errors import ConfigError, NotFoundError
from labkit.maps.base import PinnedMap
from labkit.maps.lb import (
    BACKENDS_MAP,
    LB_MAPS,
    MAGLEV_MAP,
    REVNAT_MAP,
    SERVICES_MAP,
    BackendState,
    Lb4BackendKey,
    Lb4Key,
    Lb4RevNatKey,
    PinnedMaglev,
)

from labtag import tagged

from .test_services import _gets
from .util import TcpClient

VIP = "198.19.0.10"
LB_VIEW_MAPS = (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP)
LABKIT = [sys.executable, "-m", "labkit", "cli"]


def read(lab, node: str, map_name: str) -> dict[bytes, object]:
    """``{raw key: value}`` of one pinned LB map, read with PinnedMap (not through the agent)."""
    if map_name == MAGLEV_MAP:  # an outer map of inner tables
        m = PinnedMaglev(f"{lab.pin_dir(node)}/{map_name}", lab.config.maglev_table_size)
        try:
            return {bytes(k): v for k, v in m.items()}
        finally:
            m.close()
    key_type, value_type = LB_MAPS[map_name]
    with PinnedMap(f"{lab.pin_dir(node)}/{map_name}", key_type, value_type) as m:
        return {bytes(k): v for k, v in m.items()}


def bpftool_dump(lab, node: str, map_name: str) -> list:
    """``bpftool map dump pinned … -j``: the kernel's own view of the map."""
    proc = subprocess.run(["bpftool", "-j", "map", "dump", "pinned", f"{lab.pin_dir(node)}/{map_name}"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def raw_dumps(lab) -> dict:
    """The raw text of every node's three LB maps as bpftool prints them."""
    out = {}
    for node in lab.topology.nodes:
        for m in LB_VIEW_MAPS:
            proc = subprocess.run(["bpftool", "map", "dump", "pinned", f"{lab.pin_dir(node.name)}/{m}"],
                                  capture_output=True, text=True, timeout=30)
            assert proc.returncode == 0, proc.stderr
            out[(node.name, m)] = proc.stdout
    return out


def labkit(lab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(LABKIT + ["--lab", lab.name, *args], capture_output=True, text=True, timeout=60)


def test_add_writes_every_node(lab):
    """After add("web", 80, [b1, b2]) every node holds the head, two slots, two backends and the reverse NAT;
    as Cilium v1.16's agent writes them, every key and backend carries protocol 0 and the slots flags 0."""
    web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    assert (web.vip, web.id) == (VIP, 1)
    for node in lab.topology.nodes:
        svc = read(lab, node.name, SERVICES_MAP)
        assert {raw[8] for raw in svc} == {0}  # lb4_key.proto
        head = svc[bytes(Lb4Key.make(VIP, 80, 0))]
        assert head.count == 2
        assert bytes(head)[6:8] == web.id.to_bytes(2, "big")  # rev_nat_index, network order
        slots = [svc[bytes(Lb4Key.make(VIP, 80, 0, slot=i))] for i in (1, 2)]
        assert [(v.backend_id, v.flags, v.flags2) for v in slots] == [(b.id, 0, 0) for b in web.backends]
        backends = read(lab, node.name, BACKENDS_MAP)
        got = {backends[bytes(Lb4BackendKey(b.id))].l4addr for b in web.backends}
        assert got == {f"{lab.pod(p).ip}:8080/ANY" for p in ("b1", "b2")}  # lb4_backend.proto 0
        revnat = read(lab, node.name, REVNAT_MAP)
        assert str(revnat[bytes(Lb4RevNatKey.make(web.id))]) == f"{VIP}:80"
        assert len(svc) == 3 and len(backends) == 2 and len(revnat) == 1


def test_bpftool_sees_the_same_entries(lab):
    """bpftool dumps as many entries of cilium_lb4_services_v2 as the agent wrote (head + slots)."""
    lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    lab.services.add("dns", 53, ["a1:8080"], protocol="UDP")
    for node in lab.topology.nodes:
        assert len(bpftool_dump(lab, node.name, SERVICES_MAP)) == 3 + 2
        assert len(bpftool_dump(lab, node.name, BACKENDS_MAP)) == 3
        assert len(bpftool_dump(lab, node.name, REVNAT_MAP)) == 2


def test_lb_list_lines(lab):
    """lb list node-a reads the maps back in v1.16's `cilium service list` form, in Python and on the command
    line, padded as Go's tabwriter pads every tab-terminated cell (cilium-dbg/cmd/service_list.go)."""
    lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    expected = (
        "ID   Frontend         Service Type   Backend" + " " * 26 + "\n"
        f"1    {VIP}:80   ClusterIP      1 => 198.18.2.11:8080 (active)   \n"
        "                                     2 => 198.18.2.12:8080 (active)   \n")
    assert lab.services.lb("node-a").text() == expected
    proc = labkit(lab, "lb", "list", "node-a")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected


def test_lb_list_bpf_lines(lab):
    """`labkit lb list NODE --bpf` prints v1.16's `cilium-dbg bpf lb list` of the pinned map: one line per slot key
    `VIP:port (slot)` (Service4Key.String appends the slot: pkg/maps/lbmap/ipv4.go:256@82999990), the head
    `0.0.0.0:0 (id) (0) [flags] ` first, then the slots (cilium-dbg/cmd/bpf_lb_list.go:104-116@82999990)."""
    web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    lab.services.add("dns", 53, ["a1:8080"], protocol="UDP", affinity=60)
    head_dns = "0.0.0.0:0 (2) (0) [ClusterIP, sessionAffinity, non-routable] "  # 61 characters: the column's 64
    proc = labkit(lab, "lb", "list", "node-b", "--bpf")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "".join(line + "\n" for line in [
        "SERVICE ADDRESS      BACKEND ADDRESS (REVNAT_ID) (SLOT)",
        f"{VIP}:80 (0)   " + "0.0.0.0:0 (1) (0) [ClusterIP, non-routable] ".ljust(64),
        f"{VIP}:80 (1)   " + f"198.18.2.11:8080 ({web.id}) (1)".ljust(64),
        f"{VIP}:80 (2)   " + f"198.18.2.12:8080 ({web.id}) (2)".ljust(64),
        "198.19.0.11:53 (0)   " + head_dns + "   ",
        "198.19.0.11:53 (1)   " + "198.18.1.11:8080 (2) (1)".ljust(64),
    ])
    assert len(head_dns) == 61


def test_another_process_sees_the_services(lab):
    """`labkit service list --json` in another process lists what this one added; its adds show up here."""
    lab.services.add("web", 80, ["b1:8080"])
    proc = labkit(lab, "service", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [(s["name"], s["vip"], s["port"], s["id"]) for s in data] == [("web", VIP, 80, 1)]
    proc = labkit(lab, "service", "add", "api", "--port", "8080", "--backend", "a2:8080")
    assert proc.returncode == 0, proc.stderr
    assert [s.name for s in lab.services.list()] == ["web", "api"]
    assert lab.services.get("api").vip == "198.19.0.11"


def test_remove_empties_maps(lab):
    """Removing the only service leaves all three maps of every node empty."""
    lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    lab.services.remove("web")
    for node in lab.topology.nodes:
        for m in LB_VIEW_MAPS:
            assert read(lab, node.name, m) == {}, f"{node.name} {m}"
    assert lab.services.list() == []


@pytest.mark.parametrize("kw,exc", [
    (dict(name="bad", port=0, backends=["b1:8080"]), ConfigError),
    (dict(name="bad", port=80, backends=["zz:8080"]), NotFoundError),
    (dict(name="bad", port=80, backends=["b1:99999"]), ConfigError),
    (dict(name="web", port=81, backends=["b1:8080"]), ConfigError),  # the name is taken
    (dict(name="bad", port=80, vip=VIP), ConfigError),  # the frontend is taken
    (dict(name="bad", port=80, vip=VIP, protocol="UDP"), ConfigError),  # v1.16: its key too, whatever the protocol
    (dict(name="bad", port=80, vip="203.0.113.5"), ConfigError),
    (dict(name="bad", port=80, affinity=-5), ConfigError),
])
def test_bad_input_leaves_maps_identical(lab, kw, exc):
    """A refused add leaves every node's LB maps byte-identical in bpftool's dump."""
    lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    before = raw_dumps(lab)
    with pytest.raises(exc):
        lab.services.add(**kw)
    assert raw_dumps(lab) == before
    assert [s.name for s in lab.services.list()] == ["web"]


def test_terminating_backend_moves_after_count(lab):
    """A terminating backend leaves the head's count and sits in the slot after it, flagged terminating."""
    web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    b1, b2 = (b.id for b in web.backends)
    lab.services.set_backend_state("web", "b1:8080", "terminating")
    for node in lab.topology.nodes:
        svc = read(lab, node.name, SERVICES_MAP)
        assert svc[bytes(Lb4Key.make(VIP, 80, 0))].count == 1
        assert [svc[bytes(Lb4Key.make(VIP, 80, 0, slot=i))].backend_id for i in (1, 2)] == [b2, b1]
        assert read(lab, node.name, BACKENDS_MAP)[bytes(Lb4BackendKey(b1))].flags == BackendState.TERMINATING
    # service list numbers backends by id, whatever their slot; the column is 35 ("... (terminating)") + 3 wide
    lines = lab.services.lb("node-b").lines()
    assert lines[1].endswith("1 => 198.18.2.11:8080 (terminating)   ")
    assert lines[2].endswith("2 => 198.18.2.12:8080 (active)" + " " * 8)


def test_reset_flushes_services(lab):
    """lab.reset() removes every service from the maps and the service list, and ids start at 1 again."""
    lab.services.add("web", 80, ["b1:8080"])
    lab.services.add("api", 81, ["a1:8080"], affinity=30)
    lab.reset()
    assert lab.services.list() == []
    for node in lab.topology.nodes:
        for m in LB_MAPS:
            assert read(lab, node.name, m) == {}, f"{node.name} {m}"
    assert lab.services.add("again", 80).id == 1


def test_connection_through_the_vip(lab):
    """With the agent's rows in place, a1 reaches a backend of web through VIP:80 and gets its echo."""
    lab.services.add("web", 80, ["b1:8080"])
    client = TcpClient(lab, "a1", VIP, 80)
    try:
        assert client.send() == "echo hello labkit"
    finally:
        client.close()
    svc_rows = [r for r in lab.ct("node-a") if r.dir == "SVC"]
    assert [(r.rev_nat, r.backend_id) for r in svc_rows] == [(1, lab.services.get("web").backends[0].id)]


# -- a Cilium 1.20 lab: keys per protocol ---------------------------------------------------
@pytest.fixture(scope="module")
def _lab20(_require_datapath):
    """A lab of Cilium 1.20 (per-protocol service keys), its GC timer off as the shared labs'."""
    from .conftest import _shared_lab

    yield from _shared_lab(tagged("dplb20"), DatapathConfig(cilium="1.20", gc_timer=False))


@pytest.fixture
def lab_1_20(_lab20):
    """The 1.20 lab, healed and reset for this test."""
    return _lab20.get()


def test_1_20_keys_carry_the_protocol_and_both_services_answer(lab_1_20):
    """On 1.20 a TCP and a UDP service share VIP:80: their keys carry protocol 6 and 17, the backends theirs,
    `lb list --bpf` prints one line per entry with its slot, and the datapath sends each protocol to its own
    service's backends, the TCP ones balanced over both."""
    lab = lab_1_20
    web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])
    udp = lab.services.add("web-udp", 80, ["a2:8080"], vip=VIP, protocol="UDP")
    for node in lab.topology.nodes:
        svc = read(lab, node.name, SERVICES_MAP)
        assert sorted((raw[8], int.from_bytes(raw[6:8], "little")) for raw in svc) == [
            (6, 0), (6, 1), (6, 2), (17, 0), (17, 1)]
        backends = read(lab, node.name, BACKENDS_MAP)
        assert {bytes(v)[6] for v in backends.values()} == {6, 17}
    proc = labkit(lab, "lb", "list", "node-a", "--bpf")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "SERVICE ADDRESS          BACKEND ADDRESS (REVNAT_ID) (SLOT)",
        f"{VIP}:80/TCP (0)   " + "0.0.0.0:0 (1) (0) [ClusterIP, non-routable] ".ljust(47),
        f"{VIP}:80/TCP (1)   " + f"198.18.2.11:8080/TCP ({web.id}) (1)".ljust(47),
        f"{VIP}:80/TCP (2)   " + f"198.18.2.12:8080/TCP ({web.id}) (2)".ljust(47),
        f"{VIP}:80/UDP (0)   " + f"0.0.0.0:0 ({udp.id}) (0) [ClusterIP, non-routable] ".ljust(47),
        f"{VIP}:80/UDP (1)   " + f"198.18.1.12:8080/UDP ({udp.id}) (1)".ljust(47),
    ]
    for _ in range(3):
        step = lab.pod("a1").udp("web-udp", 80, b"x")
        assert step.ok and step.result["reply_text"].startswith("pod=a2 "), step.result
    served = _gets(lab, "a1", VIP, 30)
    assert set(served) == {"b1", "b2"}, served  # both TCP backends, never a2 (30 picks miss one with p=2^-29)
