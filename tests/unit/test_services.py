"""The Service agent (labkit.agent.services) without a kernel: checks before any write,
the order in which maps are written, ids, rollback, the shared service list,
and the `service`/`lb` commands. Maps are labkit.agent.services.MemoryMaps, which
records every update and delete in order."""
from __future__ import annotations

import copy
import doctest
import errno
import json

import pytest

from labkit import cli

from labkit.net import ledger
from labkit.agent import services as services_mod
from labkit.agent.services import core as services_core
from labkit.config import DatapathConfig
from labkit.errors import ConfigError, DatapathError, NotFoundError
from labkit.maps.lb import (
    AFFINITY_MAP,
    BACKENDS_MAP,
    REVNAT_MAP,
    SERVICES_MAP,
    BackendState,
    Lb4AffinityKey,
    Lb4BackendKey,
    Lb4Key,
    Lb4RevNatKey,
    LbAffinityVal,
    ServiceFlags,
    LookupScope,
    MAGLEV_MAP,
    ServiceFlags2,
)
from labkit.maglev import cilium_seed, lookup_table
from labkit.agent.services import Backend, JsonStore, MemoryMaps, MemoryStore, Service, Services
from labkit.net.topology import Topology

NODES = ("node-a", "node-b")
VIP = "198.19.0.10"


@pytest.fixture
def svcs() -> Services:
    """An agent for the default topology writing into memory, as Cilium v1.16's (the default release)."""
    return Services.in_memory(Topology.default("demo"))


@pytest.fixture
def svcs20() -> Services:
    """The same agent as Cilium 1.20's: keys and backends carry the L4 protocol."""
    return Services.in_memory(Topology.default("demo"), cilium="1.20")


def ops(s: Services, node: str = "node-a") -> list[str]:
    """The writes to ``node``, shortened to ``verb map-suffix key``."""
    short = {SERVICES_MAP: "svc", BACKENDS_MAP: "be", REVNAT_MAP: "revnat", AFFINITY_MAP: "aff"}
    out = []
    for line in s.maps.ops:
        verb, n, map_name, key = line.split(" ", 3)
        if n == node:
            out.append(f"{verb} {short[map_name]} {key}")
    return out


def snapshot(s: Services) -> dict:
    return copy.deepcopy(s.maps.data)


def head(s: Services, node: str, vip: str = VIP, port: int = 80, proto: str | int = 0):
    """The head of ``vip:port``; ``proto`` is the key's protocol byte (0 on v1.16, the service's on 1.17+)."""
    return s.maps.get(node, SERVICES_MAP, Lb4Key.make(vip, port, proto))


def slot(s: Services, node: str, n: int, vip: str = VIP, port: int = 80, proto: str | int = 0):
    return s.maps.get(node, SERVICES_MAP, Lb4Key.make(vip, port, proto, slot=n))


# -- adding --------------------------------------------------------------------
def test_add_returns_the_service(svcs):
    """add() allocates VIP 198.19.0.10 and id 1, and returns a frozen Service with its backends."""
    web = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    assert web == Service("web", VIP, 80, "TCP", (Backend("b1", 8080), Backend("b2", 8080)), 0, 1, "ClusterIP")
    assert [b.id for b in web.backends] == [1, 2]
    assert svcs.get("web") == web and svcs.list() == [web] and "web" in svcs and len(svcs) == 1
    with pytest.raises(AttributeError):
        web.port = 81


def test_add_writes_every_node_in_safe_order(svcs):
    """Adding writes backends, then slots 1..n, then reverse NAT, and the slot 0 head last, on every node."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    expected = [
        "update be backend 1",
        "update be backend 2",
        f"update svc {VIP}:80/ANY slot 1",
        f"update svc {VIP}:80/ANY slot 2",
        "update revnat rev_nat 1",
        f"update svc {VIP}:80/ANY slot 0",
    ]
    assert ops(svcs, "node-a") == expected
    assert ops(svcs, "node-b") == expected
    assert svcs.maps.ops[0].split()[1] == "node-a" and svcs.maps.ops[-1].split()[1] == "node-b"


def test_add_row_contents(svcs):
    """Head: count and rev_nat (network order); slots: backend ids; backends: pod address, port and protocol 0
    (v1.16's agent writes u8proto.ANY); revnat: VIP:port."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    for node in NODES:
        h = head(svcs, node)
        assert (h.count, h.rev_nat, bytes(h)[6:8], h.flags, h.backend_id) == (2, 1, b"\x00\x01", 0, 0)
        assert [slot(svcs, node, i).backend_id for i in (1, 2)] == [1, 2]
        assert all(slot(svcs, node, i).rev_nat == 1 for i in (1, 2))
        assert slot(svcs, node, 3) is None
        be = svcs.maps.get(node, BACKENDS_MAP, Lb4BackendKey(1))
        assert (be.ip, be.host_port, be.proto, be.flags) == ("198.18.2.11", 8080, 0, BackendState.ACTIVE)
        assert svcs.maps.get(node, BACKENDS_MAP, Lb4BackendKey(2)).ip == "198.18.2.12"
        assert str(svcs.maps.get(node, REVNAT_MAP, Lb4RevNatKey.make(1))) == f"{VIP}:80"


def test_add_udp_and_affinity(svcs):
    """A UDP service's keys carry protocol 0 too (v1.16); affinity sets SVC_FLAG_AFFINITY and the timeout in the
    head's backend_id, and only the head: its slots carry flags 0."""
    svcs.add("dns", 53, ["a1:5353"], protocol="udp", affinity=300)
    h = head(svcs, "node-a", port=53)
    assert h.flags == ServiceFlags.AFFINITY and h.affinity_timeout == 300 and h.count == 1
    assert (slot(svcs, "node-a", 1, port=53).flags, slot(svcs, "node-a", 1, port=53).flags2) == (0, 0)
    assert head(svcs, "node-a", port=53, proto="UDP") is None
    assert svcs.get("dns").protocol == "UDP"


@pytest.mark.parametrize("cilium, tcp, udp", [("1.16", 0, 0), ("1.20", 6, 17)])
def test_key_and_backend_protocol_bytes(cilium, tcp, udp):
    """Every key (head and slots) and backend carries protocol 0 on v1.16 and the L4 protocol on 1.20
    (cilium/cilium#33434): byte 8 of lb4_key, byte 6 of lb4_backend."""
    s = Services.in_memory(Topology.default("demo"), cilium=cilium)
    s.add("web", 80, ["b1:8080", "b2:8080"])
    s.add("dns", 53, ["a1:5353"], protocol="UDP")
    for node in NODES:
        keys = {bytes(k)[:6]: set() for k, _ in s.maps.items(node, SERVICES_MAP)}
        for k, _ in s.maps.items(node, SERVICES_MAP):
            keys[bytes(k)[:6]].add(bytes(k)[8])
        assert keys == {bytes.fromhex("c613000a0050"): {tcp}, bytes.fromhex("c613000b0035"): {udp}}
        protos = {k.backend_id: bytes(v)[6] for k, v in s.maps.items(node, BACKENDS_MAP)}
        assert protos == {1: tcp, 2: tcp, 3: udp}
        assert bytes(head(s, node, port=80, proto=tcp)) == bytes.fromhex("000000000200000100000000")
        assert bytes(slot(s, node, 2, port=80, proto=tcp)) == bytes.fromhex("020000000000000100000000")


def test_service_without_backends(svcs):
    """A service with no backends gets a head with count 0 (the datapath drops its traffic)."""
    svcs.add("empty", 80)
    assert head(svcs, "node-b").count == 0 and slot(svcs, "node-b", 1) is None


def test_vip_allocation(svcs):
    """VIPs are handed out from 198.19.0.10 on, skipping taken ones; a freed VIP is reused."""
    assert svcs.add("a", 80).vip == "198.19.0.10"
    assert svcs.add("b", 80, vip="198.19.0.11").vip == "198.19.0.11"
    assert svcs.add("c", 80).vip == "198.19.0.12"
    svcs.remove("a")
    assert svcs.add("d", 80).vip == "198.19.0.10"
    assert svcs.add("e", 81, vip="198.19.0.10").frontend == "198.19.0.10:81/TCP"  # another port, same VIP


def test_service_ids_are_not_reused_at_once(svcs):
    """Service ids count up (a removed id is not handed out again until they wrap); flush starts at 1."""
    assert svcs.add("a", 80).id == 1
    assert svcs.add("b", 80).id == 2
    svcs.remove("a")
    assert svcs.add("c", 80).id == 3
    svcs.flush()
    assert svcs.add("d", 80).id == 1


def test_backend_ids_shared_and_freed(svcs):
    """One address:port/protocol has one backend id for every service; it is freed with its last user."""
    web = svcs.add("web", 80, ["b1:8080", "b2:8080"])
    api = svcs.add("api", 81, ["b2:8080", "a1:8080"])
    assert [b.id for b in web.backends] == [1, 2] and [b.id for b in api.backends] == [2, 3]
    udp = svcs.add("u", 82, ["b2:8080"], protocol="UDP")
    assert udp.backends[0].id == 4  # another protocol, another backend
    svcs.remove("web")
    assert svcs.maps.get("node-a", BACKENDS_MAP, Lb4BackendKey(1)) is None  # b1: nobody uses it
    assert svcs.maps.get("node-a", BACKENDS_MAP, Lb4BackendKey(2)) is not None  # b2: api still does
    assert svcs.add("web2", 83, ["b1:8080"]).backends[0].id == 5


# -- shrinking, growing, removing ---------------------------------------------
def test_remove_backend_shrinks_head_first(svcs):
    """Taking a backend out writes the head (new count) first, then slots, then deletes the unused backend."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.maps.ops.clear()
    web = svcs.remove_backend("web", "b1:8080")
    assert [b.ref for b in web.backends] == ["b2:8080"]
    assert ops(svcs) == [
        f"update svc {VIP}:80/ANY slot 0",
        f"update svc {VIP}:80/ANY slot 1",
        f"delete svc {VIP}:80/ANY slot 2",
        "delete be backend 1",
    ]
    assert head(svcs, "node-b").count == 1 and slot(svcs, "node-b", 1).backend_id == 2


def test_terminating_moves_after_count(svcs):
    """A terminating backend leaves the count: head first, then the slots reordered, active ones first."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.maps.ops.clear()
    web = svcs.set_backend_state("web", "b1:8080", "terminating")
    assert [str(b) for b in web.backends] == ["b1:8080 (terminating)", "b2:8080"]
    assert ops(svcs)[0] == f"update svc {VIP}:80/ANY slot 0"
    for node in NODES:
        assert head(svcs, node).count == 1
        assert [slot(svcs, node, i).backend_id for i in (1, 2)] == [2, 1]
        assert svcs.maps.get(node, BACKENDS_MAP, Lb4BackendKey(1)).flags == BackendState.TERMINATING
    assert [(b.slot, b.state) for b in svcs.lb("node-a").rows()[0].backends] == [(1, "active"), (2, "terminating")]


def test_back_to_active_grows_head_last(svcs):
    """A backend made active again: backend and slots are written before the head's larger count."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.set_backend_state("web", "b1:8080", "terminating")
    svcs.maps.ops.clear()
    svcs.set_backend_state("web", "b1:8080", "active")
    written = ops(svcs)
    assert written[-1] == f"update svc {VIP}:80/ANY slot 0"
    assert written[0] == "update be backend 1"
    assert head(svcs, "node-a").count == 2


def test_same_state_writes_nothing(svcs):
    """Setting the state a backend already has touches no map."""
    svcs.add("web", 80, ["b1:8080"])
    svcs.maps.ops.clear()
    svcs.set_backend_state("web", "b1:8080", "active")
    assert svcs.maps.ops == []


def test_add_backend_grows_head_last(svcs):
    """Adding a backend writes it and its slot before the head's new count."""
    svcs.add("web", 80, ["b1:8080"])
    svcs.maps.ops.clear()
    svcs.add_backend("web", "a2:8080")
    assert ops(svcs) == ["update be backend 2", f"update svc {VIP}:80/ANY slot 2", f"update svc {VIP}:80/ANY slot 0"]
    svcs.maps.ops.clear()
    svcs.add_backend("web", "a1:8080", state="terminating")
    assert ops(svcs) == ["update be backend 3", f"update svc {VIP}:80/ANY slot 3"]  # count unchanged
    assert head(svcs, "node-a").count == 2


def test_remove_order(svcs):
    """Removing a service deletes its head first, then slots, reverse NAT and backends."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.maps.ops.clear()
    svcs.remove("web")
    assert ops(svcs) == [
        f"delete svc {VIP}:80/ANY slot 0",
        f"delete svc {VIP}:80/ANY slot 2",
        f"delete svc {VIP}:80/ANY slot 1",
        "delete revnat rev_nat 1",
        "delete be backend 1",
        "delete be backend 2",
    ]
    assert all(not t for node in NODES for t in svcs.maps.data[node].values())
    assert svcs.list() == []


def test_affinity_match_rows_follow_the_backends(svcs):
    """An affinity service has one cilium_lb_affinity_match row per (frontend id, backend), terminating backends
    included (v1.16 adds every svc.backends ID, pkg/service/service.go:1486-1499@82999990, key {backend_id,
    rev_nat_id (network order)}, pkg/maps/lbmap/affinity.go:68-106@82999990); removing a backend deletes its rows
    (service.go:1503) and leaves clients' affinity entries to the datapath, which drops one whose backend has no
    match (bpf/lib/lb.h:1429-1432@82999990). A service without affinity has none."""
    from labkit.maps.lb import AFFINITY_MATCH_MAP

    svc = svcs.add("web", 80, ["b1:8080", "b2:8080"], affinity=60, type="NodePort")
    svcs.set_backend_state("web", "b2:8080", "terminating")
    svcs.add("plain", 81, ["b1:8080"])
    b1, b2 = svc.backend("b1:8080").id, svc.backend("b2:8080").id
    for node in NODES:
        svcs.maps.update(node, AFFINITY_MAP, Lb4AffinityKey.make("198.18.1.11", 1), LbAffinityVal(5, b1))
        rows = {(k.rev_nat, k.backend_id) for k, _ in svcs.maps.items(node, AFFINITY_MATCH_MAP)}
        here = [fe.id for fe in svc.frontends if svc.on_node(fe, svcs.topology.node(node).ip)]
        assert rows == {(fid, bid) for fid in here for bid in (b1, b2)}
    svcs.remove_backend("web", "b1:8080")
    for node in NODES:
        here = [fe.id for fe in svc.frontends if svc.on_node(fe, svcs.topology.node(node).ip)]
        assert {(k.rev_nat, k.backend_id) for k, _ in svcs.maps.items(node, AFFINITY_MATCH_MAP)} == \
            {(fid, b2) for fid in here}
        assert [v.backend_id for _, v in svcs.maps.items(node, AFFINITY_MAP)] == [b1]  # the datapath's to drop
    svcs.remove("web")
    assert all(not svcs.maps.items(node, AFFINITY_MATCH_MAP) for node in NODES)


def test_flush_clears_everything(svcs):
    """flush() removes every service, clears stray entries of all five maps and resets the ids."""
    svcs.add("web", 80, ["b1:8080"])
    svcs.add("api", 81, ["a1:8080"], affinity=10)
    svcs.maps.update("node-b", AFFINITY_MAP, Lb4AffinityKey.make("198.18.1.11", 2), LbAffinityVal(1, 2))
    svcs.maps.update("node-a", BACKENDS_MAP, Lb4BackendKey(99), svcs.maps.get("node-a", BACKENDS_MAP, Lb4BackendKey(1)))
    svcs.flush()
    assert svcs.list() == []
    assert all(not t for node in NODES for t in svcs.maps.data[node].values())
    assert svcs.store.data["next_service_id"] == 1 and svcs.store.data["next_backend_id"] == 1


def test_flush_of_nothing_saves_nothing():
    """Flushing a lab that never had a service creates no service list, and skips maps a datapath lacks."""
    topo = Topology.default("demo")
    store = MemoryStore()
    maps = MemoryMaps([n.name for n in topo.nodes], maps=[SERVICES_MAP])  # the others "not pinned"
    Services("demo", topo, maps, store).flush()
    assert store.saves == 0 and store.data == {}


# -- checks before writing -------------------------------------------------------
BAD_ADDS = [
    (dict(name="web", port=0), ConfigError, "service 'web': port 0 is out of range; expected 1-65535"),
    (dict(name="web", port=65536), ConfigError, "service 'web': port 65536 is out of range; expected 1-65535"),
    (dict(name="web", port="80"), ConfigError, "service 'web': port '80' is not a whole number"),
    (dict(name="web", port=80, backends=["b9:8080"]), NotFoundError,
     "service 'web': backend 'b9:8080': pod 'b9' not found in lab 'demo'"),
    (dict(name="web", port=80, backends=["b1:0"]), ConfigError,
     "service 'web': backend 'b1:0' port 0 is out of range; expected 1-65535"),
    (dict(name="web", port=80, backends=["b1:70000"]), ConfigError,
     "service 'web': backend 'b1:70000' port 70000 is out of range; expected 1-65535"),
    (dict(name="web", port=80, backends=["b1"]), ConfigError, "service 'web': backend 'b1': expected POD:PORT"),
    (dict(name="web", port=80, backends=["b1:8080", "b1:8080"]), ConfigError,
     "service 'web': backend 'b1:8080' is listed twice"),
    (dict(name="web", port=80, vip="10.0.0.1"), ConfigError,
     "service 'web': VIP 10.0.0.1 is outside the ClusterIP range 198.19.0.0/16"),
    (dict(name="web", port=80, vip="198.19.0.300"), ConfigError, "service 'web': VIP '198.19.0.300' is not an IPv4"),
    (dict(name="web", port=80, vip="198.19.255.255"), ConfigError, "network or broadcast address"),
    (dict(name="web", port=80, affinity=-1), ConfigError,
     "service 'web': session affinity timeout -1 s; expected 0 (off) to 86400 seconds"),
    (dict(name="web", port=80, affinity=86401), ConfigError, "expected 0 (off) to 86400 seconds"),
    (dict(name="web", port=80, protocol="SCTP"), ConfigError, "service 'web': protocol 'SCTP'; expected one of TCP, UDP"),
    (dict(name="Web_1", port=80), ConfigError, "service name 'Web_1': expected a DNS label"),
]


@pytest.mark.parametrize("kw,exc,message", BAD_ADDS, ids=[m[:40] for _, _, m in BAD_ADDS])
def test_bad_add_touches_nothing(svcs, kw, exc, message):
    """Each bad add raises its error class with a message naming the object, and writes no map or state."""
    svcs.add("api", 8080, ["a1:8080"])
    before, saves = snapshot(svcs), svcs.store.saves
    svcs.maps.ops.clear()
    with pytest.raises(exc) as info:
        svcs.add(**kw)
    assert message in str(info.value)
    assert svcs.maps.ops == [] and snapshot(svcs) == before and svcs.store.saves == saves


def test_duplicate_name_and_frontend(svcs):
    """A second service of the same name, or on the same VIP:port/protocol, is refused untouched."""
    svcs.add("web", 80, ["b1:8080"])
    before = snapshot(svcs)
    with pytest.raises(ConfigError, match=r"service 'web' already exists in lab 'demo' \(198.19.0.10:80/TCP\)"):
        svcs.add("web", 81)
    with pytest.raises(ConfigError, match=r"service 'web2': frontend 198.19.0.10:80/TCP is already service 'web'"):
        svcs.add("web2", 80, vip=VIP)
    assert snapshot(svcs) == before


def test_other_protocol_on_one_frontend_refused_on_1_16(svcs):
    """v1.16 writes protocol 0 in every key, so a UDP service on a TCP service's VIP:port would share its keys:
    refused before any write, naming both services, the frontend and why."""
    svcs.add("web", 80, ["b1:8080"])
    before, saves = snapshot(svcs), svcs.store.saves
    svcs.maps.ops.clear()
    with pytest.raises(ConfigError) as info:
        svcs.add("web-udp", 80, ["b2:8080"], vip=VIP, protocol="UDP")
    assert str(info.value) == (
        "service 'web-udp': frontend 198.19.0.10:80/UDP would share its cilium_lb4_services_v2 key with service "
        "'web' (198.19.0.10:80/TCP): Cilium 1.16 writes protocol 0 in every service key, so one VIP:port holds one "
        "service whatever its protocol (keys per protocol came with 1.17, cilium/cilium#33434); expected another "
        "VIP or port, or a lab of Cilium 1.20 (`labkit up --cilium 1.20`)")
    assert svcs.maps.ops == [] and snapshot(svcs) == before and svcs.store.saves == saves
    svcs.add("np", 81, ["b1:8080"], type="NodePort", node_port=30000)
    with pytest.raises(ConfigError, match=r"frontend 198.51.100.11:30000/UDP would share .* service 'np'"):
        svcs.add("np-udp", 82, ["b1:8080"], protocol="UDP", type="NodePort", node_port=30000)
    assert svcs.add("np-udp", 82, ["b1:8080"], protocol="UDP", type="NodePort").node_port == 30001  # any protocol's


def test_other_protocol_on_one_frontend_accepted_on_1_20(svcs20):
    """1.20 keys carry the protocol: TCP and UDP on one VIP:port (and one node port) are two services, two keys."""
    svcs20.add("web", 80, ["b1:8080"], type="NodePort", node_port=30080)
    udp = svcs20.add("web-udp", 80, ["b2:8080"], vip=VIP, protocol="UDP", type="NodePort", node_port=30080)
    assert udp.frontend == "198.19.0.10:80/UDP" and udp.node_port == 30080
    assert head(svcs20, "node-a", proto="TCP").rev_nat == 1 and head(svcs20, "node-a", proto="UDP").rev_nat == 5
    assert svcs20.add("dns", 53, ["a1:53"], protocol="UDP", type="NodePort").node_port == 30000  # UDP's own range


def test_unknown_service_and_backend(svcs):
    """Unknown services and backends are NotFoundErrors listing what exists; bad states are ConfigErrors."""
    svcs.add("web", 80, ["b1:8080"])
    before = snapshot(svcs)
    with pytest.raises(NotFoundError, match=r"service 'nope' not found in lab 'demo' \(services: web\)"):
        svcs.remove("nope")
    with pytest.raises(NotFoundError, match="service 'nope' not found"):
        svcs.get("nope")
    with pytest.raises(NotFoundError, match=r"service 'web': backend 'b2:8080' not found \(backends: b1:8080\)"):
        svcs.set_backend_state("web", "b2:8080", "terminating")
    with pytest.raises(NotFoundError, match="backend 'b1:9090' not found"):
        svcs.remove_backend("web", "b1:9090")
    with pytest.raises(ConfigError, match="backend state 'gone'; expected one of active, terminating"):
        svcs.set_backend_state("web", "b1:8080", "gone")
    with pytest.raises(ConfigError, match="backend 'b1:8080' is already one of its backends"):
        svcs.add_backend("web", "b1:8080")
    with pytest.raises(NotFoundError, match="pod 'zz' not found"):
        svcs.add_backend("web", "zz:8080")
    assert snapshot(svcs) == before


def test_no_services_message(svcs):
    """With no services the NotFoundError says so."""
    with pytest.raises(NotFoundError, match=r"\(services: none\)"):
        svcs.get("web")


# -- rollback --------------------------------------------------------------------
def _fail_on(node: str, map_name: str, slot_no: int | None = None, op: str = "update"):
    def fail(verb, n, m, key):
        if verb == op and n == node and m == map_name and (slot_no is None or key.backend_slot == slot_no):
            raise OSError(errno.E2BIG, "map update: Argument list too long")
    return fail


def test_add_rolls_back_on_kernel_error(svcs):
    """An OSError on node-b's head write undoes every write of the call on both nodes and saves nothing."""
    svcs.add("api", 8080, ["b1:8080"])
    before, saves = snapshot(svcs), svcs.store.saves
    svcs.maps.fail = _fail_on("node-b", SERVICES_MAP, slot_no=0)
    with pytest.raises(DatapathError) as info:
        svcs.add("web", 80, ["b1:8080", "b2:8080"])
    svcs.maps.fail = None
    assert snapshot(svcs) == before and svcs.store.saves == saves
    assert [s.name for s in svcs.list()] == ["api"]
    msg = str(info.value)
    assert "adding service 'web'" in msg and "cilium_lb4_services_v2 on node 'node-b'" in msg
    assert "every map is as it was" in msg
    # the head was written last, so the rollback deletes it before anything it points at
    undo = [o for o in svcs.maps.ops if o.startswith("delete node-a")]
    assert undo[0].endswith("slot 0")


def test_shrink_rolls_back_on_kernel_error(svcs):
    """A failing delete while removing a service restores the rows already deleted, head included."""
    svcs.add("web", 80, ["b1:8080", "b2:8080"])
    before = snapshot(svcs)
    svcs.maps.fail = _fail_on("node-b", REVNAT_MAP, op="delete")
    with pytest.raises(DatapathError, match="removing service 'web'"):
        svcs.remove("web")
    svcs.maps.fail = None
    assert snapshot(svcs) == before and svcs.get("web").id == 1


def test_missing_map_rolls_back(svcs):
    """A node without the LB maps (NotFoundError) rolls back the nodes already written and re-raises."""
    del svcs.maps.data["node-b"][REVNAT_MAP]
    before = snapshot(svcs)
    with pytest.raises(NotFoundError, match="does not exist"):
        svcs.add("web", 80, ["b1:8080"])
    assert snapshot(svcs) == before


# -- the shared service list ------------------------------------------------------
@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """A private /run/labkit with a lab 'demo' ledger."""
    monkeypatch.setattr(ledger, "RUN_DIR", tmp_path)
    ledger.Ledger("demo").start()
    return tmp_path


def test_json_store_shared_between_agents(run_dir):
    """Two agents on the same services.json (two processes) see each other's services."""
    topo = Topology.default("demo")
    maps = MemoryMaps(n.name for n in topo.nodes)
    one = Services("demo", topo, maps, JsonStore("demo"))
    two = Services("demo", topo, maps, JsonStore("demo"))
    one.add("web", 80, ["b1:8080"])
    assert two.get("web").vip == VIP
    assert two.add("api", 81).id == 2
    assert [s.name for s in one.list()] == ["web", "api"]  # one caught up with two's journal line
    lines = (run_dir / "demo" / "services.journal").read_text().splitlines()
    assert [json.loads(line)["service"]["name"] for line in lines] == ["web", "api"]
    assert [s["name"] for s in JsonStore("demo").data["services"]] == ["web", "api"]


def test_json_store_in_ledger_once(run_dir):
    """services.json and its journal are recorded in the ledger before their first write, once each."""
    topo = Topology.default("demo")
    s = Services("demo", topo, MemoryMaps(n.name for n in topo.nodes), JsonStore("demo"))
    s.add("web", 80)
    s.add("api", 81)
    s.flush()
    paths = [e["path"] for e in ledger.Ledger("demo").entries("file")]
    assert paths.count(str(run_dir / "demo" / "services.json")) == 1
    assert paths.count(str(run_dir / "demo" / "services.journal")) == 1
    assert not [p for p in paths if p.endswith(".tmp")]
    assert (run_dir / "demo" / "services.journal").read_text() == ""  # flush: an empty snapshot, no journal
    assert json.loads((run_dir / "demo" / "services.json").read_text())["services"] == []


def test_lab_services_property(run_dir):
    """Lab.services is one lazily built client of the lab's agent; its map views read the lab's pins and
    services.json in this process."""
    from labkit.lab import Lab
    from labkit.net.ledger import LabState

    topo = Topology.default("demo")
    state = {"pin_dirs": {n.name: f"/sys/fs/bpf/labkit/demo/{n.name}" for n in topo.nodes}}
    lab = Lab("demo", topo, DatapathConfig(), LabState.from_dict(state))
    assert lab.services is lab.services
    assert lab.services.client.path == str(run_dir / "demo" / "agent.sock")
    local = lab.services.local
    assert isinstance(local.store, JsonStore) and local.store.path == run_dir / "demo" / "services.json"
    assert lab.services.lb_command("node-a")[0] == \
        "bpftool map dump pinned /sys/fs/bpf/labkit/demo/node-a/cilium_lb4_services_v2"
    assert lab.services.lb_command("node-a")[-1] == \
        "bpftool map dump pinned /sys/fs/bpf/labkit/demo/node-a/cilium_lb_affinity_match"


def test_doctests():
    """The examples in labkit.agent.services run and give what they show."""
    result = doctest.testmod(services_mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# -- the command line --------------------------------------------------------------
class _FakeLab:
    def __init__(self):
        self.name = "demo"
        self.topology = Topology.default("demo")
        self.services = Services.in_memory(self.topology)


@pytest.fixture
def fake_lab(monkeypatch):
    """`labkit` commands attach to an in-memory lab."""
    monkeypatch.delenv("LABKIT_LAB", raising=False)
    lab = _FakeLab()
    monkeypatch.setattr(cli.common, "attach", lambda args: lab)
    monkeypatch.setattr(cli.common, "agent_services", lambda args: lab.services)
    return lab


def test_cli_service_add_and_list(fake_lab, capsys):
    """`service add` writes the service; `service list` shows it as a table and as JSON."""
    assert cli.main(["service", "add", "web", "--port", "80", "--backend", "b1:8080", "--backend", "b2:8080"]) == 0
    out = capsys.readouterr().out
    assert "service web added on every node: 198.19.0.10:80/TCP id 1" in out and "lb list node-a" in out
    assert cli.main(["service", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "VIP", "PORT", "PROTOCOL", "ID", "NODEPORT", "LB-VIP", "BACKENDS"]
    assert lines[1].split()[:8] == ["web", "ClusterIP", VIP, "80", "TCP", "1", "-", "-"]
    assert cli.main(["service", "list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["backends"][0] == {"pod": "b1", "port": 8080, "state": "active", "backend_id": 1,
                                      "address": "198.18.2.11"}
    assert (data[0]["id"], data[0]["type"], data[0]["protocol"]) == (1, "ClusterIP", "TCP")


def test_cli_service_backend_and_del(fake_lab, capsys):
    """`service backend --state terminating` moves it after the count; `service del` removes the service."""
    cli.main(["service", "add", "web", "--port", "80", "--backend", "b1:8080", "--backend", "b2:8080",
              "--protocol", "udp", "--vip", "198.19.1.1", "--affinity", "30"])
    assert cli.main(["service", "backend", "web", "b1:8080", "--state", "terminating"]) == 0
    assert "b1:8080 (terminating)" in capsys.readouterr().out
    assert fake_lab.services.lb("node-a").rows()[0].count == 1
    assert cli.main(["service", "del", "web"]) == 0
    assert "service web (198.19.1.1:80/UDP, id 1) removed from every node" in capsys.readouterr().out
    assert fake_lab.services.list() == []


def test_cli_service_backend_add_remove(fake_lab, capsys):
    """`service backend --add` and `--remove` add and take out one backend of one service."""
    cli.main(["service", "add", "web", "--port", "80", "--backend", "b1:8080"])
    assert cli.main(["service", "backend", "web", "a2:8080", "--add"]) == 0
    assert "b1:8080 (active), a2:8080 (active)" in capsys.readouterr().out
    assert cli.main(["service", "backend", "web", "b1:8080", "--remove"]) == 0
    assert [b.ref for b in fake_lab.services.get("web").backends] == ["a2:8080"]
    assert cli.main(["service", "backend", "web", "b1:8080"]) == 2  # one of --add, --remove, --state


def test_cli_service_apply(fake_lab, capsys, tmp_path):
    """`service apply FILE` takes YAML or JSON (a list, or services: [...]) and reports each name's fate."""
    (tmp_path / "s.yaml").write_text("services:\n- name: web\n  port: 80\n  backends: [b1:8080]\n"
                                     "- {name: api, port: 8080, backends: [{pod: a2, port: 8080, state: terminating}]}\n")
    assert cli.main(["service", "apply", str(tmp_path / "s.yaml")]) == 0
    assert "applied 2 services from" in capsys.readouterr().out
    assert fake_lab.services.get("api").backends[0].state == "terminating"
    (tmp_path / "s.json").write_text(json.dumps([{"name": "web", "port": 80, "backends": ["b1:8080", "b2:8080"]}]))
    assert cli.main(["service", "apply", str(tmp_path / "s.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["updated"] == ["web"]
    (tmp_path / "bad.yaml").write_text("name: web\n")
    assert cli.main(["service", "apply", str(tmp_path / "bad.yaml")]) == 1
    assert "expected a list of services" in capsys.readouterr().err


def test_cli_lb_list(fake_lab, capsys):
    """`lb list NODE` prints cilium service list (v1.16: no protocol, every line padded by Go's tabwriter);
    --bpf cilium-dbg bpf lb list; --raw every entry; --json plain data."""
    cli.main(["service", "add", "web", "--port", "80", "--backend", "b1:8080", "--backend", "b2:8080"])
    capsys.readouterr()
    assert cli.main(["lb", "list", "node-a"]) == 0
    # cilium-dbg/cmd/service_list.go: tabwriter(5, 0, 3, ' '), every cell tab-terminated. Column widths:
    # ID 5, Frontend 14+3, Service Type 12+3, Backend 30+3 ("1 => 198.18.2.11:8080 (active)").
    assert capsys.readouterr().out == (
        "ID   Frontend         Service Type   Backend" + " " * 26 + "\n"
        "1    198.19.0.10:80   ClusterIP      1 => 198.18.2.11:8080 (active)   \n"
        "                                     2 => 198.18.2.12:8080 (active)   \n")
    assert cli.main(["lb", "list", "node-a", "--bpf"]) == 0
    # cilium-dbg/cmd/bpf_lb_list.go + helpers.go TablePrinter: header "%s\t%s\n", rows "%s\t%s\t\n".
    # v1.16's key string carries the slot (pkg/maps/lbmap/ipv4.go:256@82999990): one group per entry.
    # Column 1: "198.19.0.10:80 (0)" 18+3; column 2 (rows only): "0.0.0.0:0 (1) (0) [ClusterIP, non-routable] " 44+3.
    assert capsys.readouterr().out == (
        "SERVICE ADDRESS      BACKEND ADDRESS (REVNAT_ID) (SLOT)\n"
        "198.19.0.10:80 (0)   0.0.0.0:0 (1) (0) [ClusterIP, non-routable]    \n"
        "198.19.0.10:80 (1)   198.18.2.11:8080 (1) (1)" + " " * 23 + "\n"
        "198.19.0.10:80 (2)   198.18.2.12:8080 (1) (2)" + " " * 23 + "\n")
    assert cli.main(["lb", "list", "node-b", "--raw"]) == 0
    raw = capsys.readouterr().out.splitlines()
    assert raw[0] == "# cilium_lb4_services_v2" and raw[1].startswith("198.19.0.10:80/ANY slot 0 head: count=2")
    assert cli.main(["lb", "list", "node-a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["count"] == 2
    assert cli.main(["lb", "list", "node-a", "--raw", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["cilium_lb4_services_v2"]) == 3


def test_cli_errors(fake_lab, capsys):
    """Agent errors exit 1 with `labkit: error: …`; bad ports and protocols are usage errors (2)."""
    assert cli.main(["service", "add", "web", "--port", "80", "--backend", "b9:8080"]) == 1
    assert "labkit: error: service 'web': backend 'b9:8080': pod 'b9' not found" in capsys.readouterr().err
    assert cli.main(["service", "del", "web"]) == 1
    assert "service 'web' not found" in capsys.readouterr().err
    assert cli.main(["lb", "list", "node-z"]) == 1
    assert "node-z" in capsys.readouterr().err
    assert cli.main(["service", "add", "web", "--port", "0"]) == 2
    assert cli.main(["service", "add", "web", "--port", "80", "--protocol", "sctp"]) == 2
    capsys.readouterr()


def test_failed_save_rolls_back_maps(svcs):
    """If the change cannot be journaled, the maps written for the call are put back too."""
    before = snapshot(svcs)

    def refuse(record):
        raise OSError(errno.ENOSPC, "No space left on device", "/run/labkit/demo/services.tmp")

    svcs.store.append = refuse
    with pytest.raises(DatapathError, match=r"writing the service list \(/run/labkit/demo/services.tmp\) failed"):
        svcs.add("web", 80, ["b1:8080"])
    assert snapshot(svcs) == before


# -- NodePort and LoadBalancer ------------------------------------------------------
NODE_IPS = ("198.51.100.11", "198.51.100.12")
NP_FLAGS = ServiceFlags.NODEPORT | ServiceFlags.ROUTABLE
LB_FLAGS = ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE


def revnat(s: Services, node: str, rev_nat: int) -> str | None:
    value = s.maps.get(node, REVNAT_MAP, Lb4RevNatKey.make(rev_nat))
    return None if value is None else str(value)


def test_nodeport_frontends_flags_and_ids(svcs):
    """A NodePort is its ClusterIP frontend plus nodeIP:nodePort per node and the surrogate 0.0.0.0:nodePort, each
    with its own id and reverse NAT. A node's maps hold its own address's frontend and the surrogate, not the other
    node's (pkg/k8s/service.go:203-216@82999990 appends IPv4Unspecified to the node's own nodePortAddrs, and
    :244-248 makes one frontend per address); the surrogate is NodePort but not routable
    (pkg/maps/lbmap/lbmap.go:573@82999990: isRoutable := !fe.IsSurrogate() && ...)."""
    svc = svcs.add("web", 80, ["b1:8080", "b2:8080"], type="NodePort", node_port=30080)
    assert (svc.type, svc.node_port, svc.lb_vip, svc.id) == ("NodePort", 30080, None, 1)
    assert [(f.type, f.address, f.port, f.id) for f in svc.frontends] == [
        ("ClusterIP", VIP, 80, 1), ("NodePort", NODE_IPS[0], 30080, 2), ("NodePort", NODE_IPS[1], 30080, 3),
        ("NodePort", "0.0.0.0", 30080, 4)]
    for node, own, other in ((NODES[0], svc.frontends[1], svc.frontends[2]),
                             (NODES[1], svc.frontends[2], svc.frontends[1])):
        assert head(svcs, node).flags == 0 and head(svcs, node).rev_nat == 1
        for fe, flags in ((own, NP_FLAGS), (svc.frontends[3], ServiceFlags.NODEPORT)):
            h = head(svcs, node, fe.address, 30080)
            assert (h.count, h.rev_nat, h.flags) == (2, fe.id, flags)
            slots = [svcs.maps.get(node, SERVICES_MAP, Lb4Key.make(fe.address, 30080, 0).with_slot(i))
                     for i in (1, 2)]
            assert [(v.backend_id, v.rev_nat, v.flags) for v in slots] == [(1, fe.id, 0), (2, fe.id, 0)]
            assert revnat(svcs, node, fe.id) == f"{fe.address}:30080"
        assert head(svcs, node, other.address, 30080) is None and revnat(svcs, node, other.id) is None
        assert len(svcs.maps.data[node][BACKENDS_MAP]) == 2  # shared by every frontend
    rows = svcs.lb("node-a").rows()
    assert [(r.id, r.frontend, r.type, r.count) for r in rows] == [
        (1, f"{VIP}:80", "ClusterIP", 2), (2, f"{NODE_IPS[0]}:30080", "NodePort", 2), (4, "0.0.0.0:30080", "NodePort", 2)]
    assert "non-routable" not in rows[1].to_json()["flags"] and "non-routable" in rows[0].to_json()["flags"]
    assert "non-routable" in rows[2].to_json()["flags"]


def test_loadbalancer_frontends_and_allocation(svcs):
    """A LoadBalancer adds lbVIP:port (LOADBALANCER, ROUTABLE); node ports and LB VIPs are allocated in turn."""
    svcs.add("api", 8080, ["a2:8080"])
    lb1 = svcs.add("web", 80, ["b1:8080"], type="LoadBalancer", affinity=30)
    lb2 = svcs.add("web2", 80, ["b2:8080"], type="loadbalancer")
    assert (lb1.node_port, lb1.lb_vip, lb1.id, lb1.ids) == (30000, "203.0.113.10", 2, (2, 3, 4, 5, 6))
    assert (lb2.node_port, lb2.lb_vip, lb2.ids) == (30001, "203.0.113.11", (7, 8, 9, 10, 11))
    assert [f.type for f in lb1.frontends] == ["ClusterIP", "NodePort", "NodePort", "NodePort", "LoadBalancer"]
    h = head(svcs, "node-b", "203.0.113.10", 80)
    assert (h.rev_nat, h.flags, h.affinity_timeout) == (6, LB_FLAGS | ServiceFlags.AFFINITY, 30)
    assert revnat(svcs, "node-b", 6) == "203.0.113.10:80"
    assert head(svcs, "node-a", NODE_IPS[0], 30000).flags == NP_FLAGS | ServiceFlags.AFFINITY
    types = {r.frontend: r.type for r in svcs.lb("node-b").rows()}
    assert types["203.0.113.11:80"] == "LoadBalancer" and types[f"{NODE_IPS[1]}:30001"] == "NodePort"
    given = svcs.add("udp", 53, ["b1:5353"], protocol="udp", type="LoadBalancer", node_port=30005,
                     lb_vip="203.0.113.10")  # web's LB VIP on another port: fine
    assert given.frontends[-1].l4("UDP") == "203.0.113.10:53/UDP"


def test_nodeport_write_order_heads_last(svcs):
    """Every frontend's slots come after the backends, reverse NAT after the slots, every head last."""
    svcs.add("web", 80, ["b1:8080"], type="NodePort", node_port=30080)
    assert ops(svcs) == [
        "update be backend 1",
        "update svc 0.0.0.0:30080/ANY slot 1",
        f"update svc {VIP}:80/ANY slot 1",
        f"update svc {NODE_IPS[0]}:30080/ANY slot 1",
        "update revnat rev_nat 1", "update revnat rev_nat 2", "update revnat rev_nat 4",
        "update svc 0.0.0.0:30080/ANY slot 0",
        f"update svc {VIP}:80/ANY slot 0",
        f"update svc {NODE_IPS[0]}:30080/ANY slot 0",
    ]
    svcs.maps.ops.clear()
    svcs.add_backend("web", "b2:8080")
    assert [o for o in ops(svcs) if "slot 0" in o][-3:] == ops(svcs)[-3:]  # heads (new counts) last


def test_remove_nodeport_removes_every_frontend(svcs):
    """Removing a LoadBalancer takes all its heads (first), slots, reverse NAT entries and backends away."""
    svcs.add("web", 80, ["b1:8080"], type="LoadBalancer")
    svcs.maps.ops.clear()
    svcs.remove("web")
    for node in NODES:
        assert all(not svcs.maps.data[node][m] for m in (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP))
    got = ops(svcs)
    assert all("slot 0" in o for o in got[:4]) and got[-1] == "delete be backend 1"
    again = svcs.add("web", 80, ["b1:8080"], type="NodePort")
    assert again.node_port == 30000 and again.ids == (6, 7, 8, 9)  # ids go on from where they were


@pytest.mark.parametrize("kwargs, match", [
    (dict(type="ExternalName"), r"type 'ExternalName'; expected one of ClusterIP, NodePort, LoadBalancer"),
    (dict(node_port=30080), r"node port 30080 given for a ClusterIP service"),
    (dict(type="NodePort", node_port=80), r"node port 80 is outside the node port range; expected 30000-32767"),
    (dict(type="NodePort", node_port=32768), r"outside the node port range"),
    (dict(type="NodePort", node_port="30080"), r"node port '30080' is not a whole number"),
    (dict(type="NodePort", lb_vip="203.0.113.10"), r"LoadBalancer VIP '203.0.113.10' given for a NodePort service"),
    (dict(type="LoadBalancer", lb_vip="198.19.0.50"), r"LoadBalancer VIP 198.19.0.50 is outside the LoadBalancer range 203.0.113.0/24"),
    (dict(type="LoadBalancer", lb_vip="203.0.113.255"), r"network or broadcast address"),
    (dict(type="LoadBalancer", lb_vip="nope"), r"LoadBalancer VIP 'nope' is not an IPv4 address"),
])
def test_nodeport_loadbalancer_refusals(svcs, kwargs, match):
    """Bad types, node ports and LB VIPs are ConfigErrors before any map is touched."""
    before = snapshot(svcs)
    with pytest.raises(ConfigError, match=match):
        svcs.add("web", 80, ["b1:8080"], **kwargs)
    assert snapshot(svcs) == before and svcs.list() == []


def test_node_port_and_lb_frontend_conflicts(svcs):
    """A node port is unique per protocol, an LB VIP:port/protocol per lab; refusals write nothing."""
    svcs.add("web", 80, ["b1:8080"], type="LoadBalancer", node_port=30080, lb_vip="203.0.113.20")
    before = snapshot(svcs)
    with pytest.raises(ConfigError, match=r"node port 30080/TCP is already service 'web'"):
        svcs.add("api", 81, ["b1:8080"], type="NodePort", node_port=30080)
    with pytest.raises(ConfigError, match=r"frontend 203.0.113.20:80/TCP is already service 'web'"):
        svcs.add("api", 80, ["b1:8080"], type="LoadBalancer", lb_vip="203.0.113.20")
    assert snapshot(svcs) == before
    other = svcs.add("api", 81, ["b1:8080"], type="LoadBalancer", lb_vip="203.0.113.20")  # other port: fine
    assert (other.node_port, other.lb_vip) == (30000, "203.0.113.20")


def test_loadbalancer_rollback_on_kernel_error(svcs):
    """An OSError writing node-b's LoadBalancer head undoes every frontend on both nodes and saves nothing."""
    svcs.add("api", 8080, ["b1:8080"], type="NodePort")
    before, saves = snapshot(svcs), svcs.store.saves

    def fail(verb, n, m, key):
        if verb == "update" and n == "node-b" and m == SERVICES_MAP and key.vip == "203.0.113.10" \
                and key.backend_slot == 0:
            raise OSError(errno.E2BIG, "map update: Argument list too long")

    svcs.maps.fail = fail
    with pytest.raises(DatapathError, match=r"adding service 'web'.*every map is as it was"):
        svcs.add("web", 80, ["b1:8080", "b2:8080"], type="LoadBalancer")
    svcs.maps.fail = None
    assert snapshot(svcs) == before and svcs.store.saves == saves
    assert [s.name for s in svcs.list()] == ["api"]


def test_frontends_survive_the_service_list(svcs):
    """Frontends, node port and LB VIP round-trip through the saved list; an old ClusterIP entry still loads."""
    svc = svcs.add("web", 80, ["b1:8080"], type="LoadBalancer", node_port=31000)
    again = Services(svcs.lab, svcs.topology, svcs.maps, MemoryStore(svcs.store.data))
    assert again.get("web") == svc
    assert svc.to_json()["frontends"][4] == {"address": "203.0.113.10", "port": 80, "type": "LoadBalancer",
                                             "id": 5, "frontend": "203.0.113.10:80/TCP"}
    assert svc.to_json()["frontends"][3]["frontend"] == "0.0.0.0:31000/TCP"
    old = Service.from_json({"name": "old", "vip": VIP, "port": 80, "protocol": "TCP", "id": 7, "backends": []})
    assert (old.type, old.node_port, old.ids, old.frontends[0].type) == ("ClusterIP", 0, (7,), "ClusterIP")


def test_cli_nodeport_and_loadbalancer(fake_lab, capsys):
    """`service add --type LoadBalancer --node-port --lb-vip`; `service list` shows them; `lb list` every frontend."""
    assert cli.main(["service", "add", "web", "--port", "80", "--backend", "b1:8080", "--type", "LoadBalancer",
                     "--node-port", "30080", "--lb-vip", "203.0.113.50"]) == 0
    out = capsys.readouterr().out
    assert "LoadBalancer frontend 203.0.113.50:80/TCP id 5" in out and f"NodePort frontend {NODE_IPS[1]}:30080/TCP id 3" in out
    assert "NodePort frontend 0.0.0.0:30080/TCP id 4" in out
    assert cli.main(["service", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:8] == ["web", "LoadBalancer", VIP, "80", "TCP", "1", "30080", "203.0.113.50"]
    assert cli.main(["lb", "list", "node-a"]) == 0
    got = [line.split()[:3] for line in capsys.readouterr().out.splitlines()[1:]]
    assert got == [["1", f"{VIP}:80", "ClusterIP"], ["2", f"{NODE_IPS[0]}:30080", "NodePort"],
                   ["4", "0.0.0.0:30080", "NodePort"], ["5", "203.0.113.50:80", "LoadBalancer"]]  # node-a's own
    assert cli.main(["service", "add", "np", "--port", "80", "--type", "NodePort", "--node-port", "80"]) == 1
    assert "outside the node port range" in capsys.readouterr().err
    assert cli.main(["service", "add", "np", "--port", "80", "--type", "External"]) == 2
    capsys.readouterr()


# -- externalTrafficPolicy and Maglev ---------------------------------------------------------
def _heads(svcs: Services, node: str) -> dict:
    """(frontend, scope) → head of every frontend in ``node``'s services map."""
    return {(k.frontend, k.scope): v for k, v in svcs.maps.items(node, SERVICES_MAP) if k.backend_slot == 0}


def test_etp_local_scopes_differ_per_node(svcs):
    """eTP=Local: a NodePort/LB frontend's external scope lists only the node's own backends (flag Local,
    TWO_SCOPES), its internal scope all of them; the ClusterIP frontend is the same everywhere."""
    svc = svcs.add("web", 80, ["a1:8080", "b1:8080", "b2:8080"], type="LoadBalancer", etp="Local")
    lb = f"{svc.lb_vip}:80/ANY"
    for node, local in (("node-a", 1), ("node-b", 2)):
        heads = _heads(svcs, node)
        ext, int_ = heads[(lb, LookupScope.EXT)], heads[(lb, LookupScope.INT)]
        assert (ext.count, int_.count) == (local, 3)
        assert ext.flags & ServiceFlags.EXT_LOCAL_SCOPE and ext.flags2 & ServiceFlags2.TWO_SCOPES
        assert heads[(f"{VIP}:80/ANY", LookupScope.EXT)].count == 3
        assert (f"{VIP}:80/ANY", LookupScope.INT) not in heads  # ClusterIP: one scope
    slots = {k.backend_slot: v.backend_id for k, v in svcs.maps.items("node-a", SERVICES_MAP)
             if k.frontend == lb and k.scope == LookupScope.EXT and k.backend_slot}
    assert slots == {1: svc.backend("a1:8080").id}
    rows = [r for r in svcs.lb("node-b").rows() if r.vip == svc.lb_vip]
    assert [(r.frontend, r.count) for r in rows] == [(f"{svc.lb_vip}:80", 2), (f"{svc.lb_vip}:80/i", 3)]
    assert rows[0].to_json()["flags"] == ["LoadBalancer", "Local", "two-scopes"]


def test_etp_and_algorithm_refusals(svcs):
    """eTP Local needs a NodePort or LoadBalancer; unknown policies and algorithms are refused before any write."""
    with pytest.raises(ConfigError, match="externalTrafficPolicy Local given for a ClusterIP"):
        svcs.add("web", 80, ["b1:8080"], etp="Local")
    with pytest.raises(ConfigError, match="expected one of Cluster, Local"):
        svcs.add("web", 80, ["b1:8080"], type="NodePort", etp="Nearby")
    with pytest.raises(ConfigError, match="expected one of random, maglev"):
        svcs.add("web", 80, ["b1:8080"], algorithm="roundrobin")
    assert svcs.maps.ops == [] and svcs.list() == []


def test_maglev_tables_written_per_frontend(svcs):
    """--algorithm maglev: every NodePort and LoadBalancer frontend id gets a table (labkit.maglev.lookup_table of the
    active backends), written after the backends and before the head, and it follows a backend's removal; the
    ClusterIP frontend gets none (svcInfo.useMaglev: pkg/service/service.go:173@82999990)."""
    svc = svcs.add("dns", 53, ["a1:8080", "b1:8080"], protocol="UDP", type="LoadBalancer", algorithm="maglev")
    ops = [op for op in svcs.maps.ops if op.startswith("update node-a")]
    first_maglev = next(i for i, op in enumerate(ops) if MAGLEV_MAP in op)
    assert max(i for i, op in enumerate(ops) if "backends" in op) < first_maglev
    assert first_maglev < min(i for i, op in enumerate(ops) if "slot 0" in op)
    # v1.16 hashes "ip:port" (no protocol) with the seed of Cilium's default --bpf-lb-maglev-hash-seed
    names = {"198.18.1.11:8080": svc.backend("a1:8080").id, "198.18.2.11:8080": svc.backend("b1:8080").id}
    want = lookup_table(names, 16381, cilium_seed())
    for node in ("node-a", "node-b"):
        tables = svcs.maglev("dns", node)
        assert set(tables) == set(svc.ids)
        # no table: the ClusterIP, the surrogate (service.go:177@82999990) and the other node's NodePort address
        ip = svcs.topology.node(node).ip
        none = {fe.id for fe in svc.frontends if fe.type == "ClusterIP" or fe.surrogate or not svc.on_node(fe, ip)}
        assert len(none) == 3 and all(tables[i] == (None, None) for i in none)
        assert all(bpf == expected and list(bpf.backend_ids) == want for i, (bpf, expected) in tables.items()
                   if i not in none)
    svcs.remove_backend("dns", "a1:8080")
    bpf, _ = svcs.maglev("dns", "node-a")[svc.ids[-1]]
    assert set(bpf.backend_ids) == {svc.backend("b1:8080").id}
    svcs.remove("dns")
    assert svcs.maps.data["node-a"][MAGLEV_MAP] == {}


def test_maglev_names_on_1_20(svcs20):
    """1.20 hashes pkg/maglev's BackendInfo hashString, "[ip:port/UDP,State:active]", with Cilium's seed."""
    svc = svcs20.add("dns", 53, ["a1:8080", "b1:8080"], protocol="UDP", type="LoadBalancer", algorithm="maglev")
    names = {"[198.18.1.11:8080/UDP,State:active]": svc.backend("a1:8080").id,
             "[198.18.2.11:8080/UDP,State:active]": svc.backend("b1:8080").id}
    want = lookup_table(names, 16381, cilium_seed())
    assert want != lookup_table({n[1:].split("/")[0]: i for n, i in names.items()}, 16381, cilium_seed())
    for fid, (bpf, expected) in svcs20.maglev("dns", "node-b").items():
        if expected is not None:
            assert list(bpf.backend_ids) == want and bpf == expected


def test_random_service_has_no_maglev_table(svcs):
    """A service without --algorithm maglev leaves cilium_lb4_maglev empty (the datapath picks at random)."""
    svc = svcs.add("web", 80, ["b1:8080"], type="LoadBalancer")
    assert svc.algorithm == "random" and svcs.maps.data["node-a"][MAGLEV_MAP] == {}
    assert all(v == (None, None) for v in svcs.maglev("web", "node-a").values())


def test_cli_etp_algorithm_and_lb_maglev(fake_lab, capsys):
    """`service add --etp --algorithm` reach the agent; `lb maglev NAME` prints each frontend's table and
    whether it equals labkit's own computation."""
    assert cli.main(["service", "add", "dns", "--port", "53", "--protocol", "UDP", "--backend", "a1:8080",
                     "--backend", "b1:8080", "--type", "LoadBalancer", "--etp", "Cluster",
                     "--algorithm", "maglev"]) == 0
    assert "lb maglev dns" in capsys.readouterr().out
    fake_lab.pin_dir = lambda node: f"/sys/fs/bpf/labkit/demo/{node}"
    assert cli.main(["lb", "maglev", "dns", "--node", "node-b"]) == 0
    out = capsys.readouterr().out
    assert out.count("equals labkit.maglev.lookup_table") == 2 and "M=16381" in out  # node-b's NodePort, the LB
    assert "ClusterIP" in out and "a ClusterIP gets none" in out
    assert cli.main(["service", "add", "np", "--port", "81", "--type", "NodePort", "--etp", "Local"]) == 0
    assert fake_lab.services.get("np").etp == "Local"


# -- deltas against a full rebuild, and the journal ----------------------------------
class FullRebuild(services_mod.LbMapsWriter):
    """The writer as it was before deltas: every row of the whole state before and after, planned."""

    def commit(self, change, what, save):
        from types import SimpleNamespace

        from labkit.agent.services.plan import entries, plan

        was, now = change.before, change.after
        grow = now is not None and (was is None or len(now.active) >= len(was.active))
        old, new = SimpleNamespace(services=change.old_services()), SimpleNamespace(services=change.new_services())
        try:
            for node in (n.name for n in self.topology.nodes):
                for op in plan(entries(old, self.topology, node, self.maglev_m, self.cilium),
                               entries(new, self.topology, node, self.maglev_m, self.cilium), grow):
                    if op.value is None:
                        self.maps.delete(node, op.map_name, op.key)
                    else:
                        self.maps.update(node, op.map_name, op.key, op.value)
            save()
        finally:
            self.maps.close()


def random_ops(rng, n: int):
    """``n`` agent calls (some of them refused) over the default topology's pods."""
    pods, names = ["a1", "a2", "b1", "b2"], [f"s{i}" for i in range(12)]
    be = lambda: f"{rng.choice(pods)}:{rng.choice((8080, 8081, 9090))}"  # noqa: E731
    for _ in range(n):
        r, name = rng.random(), rng.choice(names)
        if r < 0.3:
            kind = rng.choice(("ClusterIP", "ClusterIP", "NodePort", "LoadBalancer"))
            kw = dict(type=kind, protocol=rng.choice(("TCP", "UDP")), algorithm=rng.choice(("random", "maglev")),
                      affinity=rng.choice((0, 0, 30)), port=rng.choice((80, 81, 443)))
            if kind != "ClusterIP":
                kw["etp"] = rng.choice(("Cluster", "Local"))
            yield "add", (name,), dict(kw, backends=list(dict.fromkeys(be() for _ in range(rng.randint(0, 4)))))
        elif r < 0.45:
            yield "remove", (name,), {}
        elif r < 0.7:
            yield "add_backend", (name, be()), dict(state=rng.choice(("active", "active", "terminating")))
        elif r < 0.85:
            yield "remove_backend", (name, be()), {}
        elif r < 0.98:
            yield "set_backend_state", (name, be(), rng.choice(("active", "terminating"))), {}
        else:
            yield "flush", (), {}


@pytest.mark.parametrize("cilium,seed", [("1.16", 1), ("1.16", 2), ("1.20", 3), ("1.20", 4)])
def test_deltas_write_what_a_full_rebuild_writes(cilium, seed, monkeypatch):
    """A random sequence of calls writes, through the delta path, the same map rows in the same order as
    a full rebuild of every service's rows, entry for entry; ids agree; the journal replays to the state."""
    import random

    monkeypatch.setattr(services_core, "COMPACT_MIN", 8)  # compact often, to replay across snapshots too
    topo = Topology.default("demo")
    delta = Services.in_memory(topo, cilium=cilium, maglev_m=251)
    full = Services.in_memory(topo, cilium=cilium, maglev_m=251)
    full.writer = FullRebuild(full.maps, topo, 251, full.cilium, full.faults)
    rng = random.Random(seed)
    for verb, args, kw in random_ops(rng, 400):
        results = []
        for agent in (delta, full):
            try:
                results.append(("ok", getattr(agent, verb)(*args, **kw)))
            except (ConfigError, NotFoundError) as exc:
                results.append(("refused", str(exc)))
        assert results[0] == results[1], (verb, args, kw)
        assert delta.maps.ops == full.maps.ops, (verb, args, kw)
        assert delta.maps.data == full.maps.data
        delta.maps.ops.clear(), full.maps.ops.clear()
        assert [(s, [b.id for b in s.backends]) for s in delta.list()] == \
            [(s, [b.id for b in s.backends]) for s in full.list()]
    assert len(delta) > 0 and delta.store.saves > 0
    again = Services(delta.lab, topo, delta.maps, MemoryStore(delta.store.data), cilium=cilium)
    assert again._state().to_json() == delta._state().to_json() == full._state().to_json()
    assert again._state().to_json() == Services.in_memory(topo)._state().from_json(
        delta.store.snapshot, delta.store.records).to_json()


def test_ids_as_before_across_removes(svcs):
    """Freed service and backend ids are found again from the next id on, wrapping, as Cilium's allocator does."""
    svcs.add("a", 80, ["a1:80", "a2:80"])
    svcs.add("b", 80, ["b1:80"], type="NodePort")
    svcs.remove("a")
    c = svcs.add("c", 80, ["a1:80"])
    assert (c.id, [b.id for b in c.backends]) == (6, [4])
    assert svcs.get("b").ids == (2, 3, 4, 5) and c.vip == VIP  # the freed VIP is handed out again


def test_journal_replayed_and_compacted(run_dir, monkeypatch):
    """Changes append journal lines; a second agent replays them; past COMPACT_RATIO records per service
    a new services.json is written and the journal emptied; a torn last line is not a record."""
    monkeypatch.setattr(services_core, "COMPACT_MIN", 4)
    topo = Topology.default("demo")
    maps = MemoryMaps(n.name for n in topo.nodes)
    one = Services("demo", topo, maps, JsonStore("demo"))
    journal, snap = run_dir / "demo" / "services.journal", run_dir / "demo" / "services.json"
    one.add("web", 80, ["b1:8080"])
    one.add_backend("web", "b2:8080")
    assert len(journal.read_text().splitlines()) == 2 and not snap.exists()
    two = Services("demo", topo, maps, JsonStore("demo"))
    assert [b.ref for b in two.get("web").backends] == ["b1:8080", "b2:8080"]
    for _ in range(2):
        one.remove_backend("web", "b2:8080")
        one.add_backend("web", "b2:8080")
    # the 5th record is more than max(4, 2 x 1 service): a snapshot, and the 6th starts a new journal
    assert snap.exists() and len(journal.read_text().splitlines()) == 1
    assert json.loads(snap.read_text())["services"][0]["name"] == "web"
    two.add("api", 81)  # two sees the new snapshot, reloads, then adds
    assert [s.name for s in one.list()] == ["web", "api"] and one.get("api").id == 2
    with open(journal, "ab") as f:
        f.write(b'{"op":"del","na')  # a writer killed mid-line
    assert [s.name for s in Services("demo", topo, maps, JsonStore("demo")).list()] == ["web", "api"]
    one.remove("api")  # the torn line is cut before the next record
    assert [s.name for s in Services("demo", topo, maps, JsonStore("demo")).list()] == ["web"]
    assert journal.read_text().endswith("}\n") and '"na{' not in journal.read_text()


def test_old_services_json_still_loads(run_dir):
    """A lab whose services.json was written before the journal existed loads as it was, and goes on."""
    topo = Topology.default("demo")
    old = Services.in_memory(topo)
    old.add("web", 80, ["b1:8080", "b2:8080"])
    old.add("api", 81, ["b2:8080"], type="NodePort")
    (run_dir / "demo" / "services.json").write_text(json.dumps(old.store.data))
    agent = Services("demo", topo, MemoryMaps(n.name for n in topo.nodes), JsonStore("demo"))
    assert agent.list() == old.list()
    assert agent.add("db", 82, ["b2:8080"]).backends[0].id == 2 and agent.get("db").id == 6


# -- apply: many services in one call -------------------------------------------------
def test_apply_adds_updates_and_leaves_alone(svcs):
    """apply adds new names, gives a known one its new backends with its ids kept, and writes nothing for an equal one."""
    first = svcs.apply([{"name": "web", "port": 80, "backends": ["b1:8080"]},
                        {"name": "api", "port": 8080, "backends": ["a2:8080"]}])
    assert first == {"added": ["web", "api"], "updated": [], "replaced": [], "unchanged": []}
    web_id = svcs.get("web").id
    b1_id = svcs.get("web").backends[0].id
    second = svcs.apply([{"name": "web", "port": 80, "backends": ["b1:8080", "b2:8080"]},
                         {"name": "api", "port": 8080, "backends": [{"pod": "a2", "port": 8080}]}])
    assert second == {"added": [], "updated": ["web"], "replaced": [], "unchanged": ["api"]}
    web = svcs.get("web")
    assert web.id == web_id and web.backends[0].id == b1_id and [b.ref for b in web.backends] == ["b1:8080", "b2:8080"]
    before = len(svcs.maps.ops)
    assert svcs.apply([{"name": "api", "port": 8080, "backends": ["a2:8080"]}])["unchanged"] == ["api"]
    assert len(svcs.maps.ops) == before


def test_apply_replaces_a_changed_frontend(svcs):
    """A known service whose port changes is removed and added again: the old frontend's rows are gone."""
    svcs.apply([{"name": "web", "port": 80, "backends": ["b1:8080"]}])
    out = svcs.apply([{"name": "web", "port": 81, "backends": ["b1:8080"]}])
    assert out["replaced"] == ["web"]
    assert head(svcs, "node-a", port=80) is None and head(svcs, "node-a", port=81) is not None


def test_apply_writes_what_adds_write(svcs):
    """apply's rows equal the rows the same services added one by one write, on every node."""
    specs = [{"name": f"s{i}", "port": 80, "backends": ["b1:8080", "a1:8080"][: 1 + i % 2]} for i in range(6)]
    specs.append({"name": "np", "port": 80, "type": "NodePort", "backends": ["b2:8080"], "algorithm": "maglev"})
    other = Services.in_memory(Topology.default("demo"))
    for spec in specs:
        other.add(**spec)
    svcs.apply(specs)
    assert svcs.maps.data == other.maps.data


def test_apply_is_all_or_nothing(svcs):
    """A spec refused half-way (its VIP is taken) undoes the ones applied before it: maps and list as they were."""
    svcs.add("web", 80, ["b1:8080"])
    maps, names = snapshot(svcs), [s.name for s in svcs.list()]
    with pytest.raises(ConfigError, match="198.19.0.10:80/TCP is already service 'web'"):
        svcs.apply([{"name": "web", "port": 80, "backends": ["b1:8080", "b2:8080"]},
                    {"name": "new", "port": 80, "backends": ["a1:8080"]},
                    {"name": "clash", "port": 80, "vip": VIP, "backends": ["a2:8080"]}])
    assert snapshot(svcs) == maps and [s.name for s in svcs.list()] == names
    assert [b.ref for b in svcs.get("web").backends] == ["b1:8080"]


@pytest.mark.parametrize("specs, message", [
    ({"name": "web"}, "expected a list of services"),
    (["web"], "item 1 is a str; expected a mapping"),
    ([{"name": "web", "port": 80, "colour": "red"}], "unknown field.*colour"),
    ([{"name": "web"}], "item 1: no port"),
    ([{"name": "web", "port": 80}, {"name": "web", "port": 81}], "'web' is listed twice"),
    ([{"name": "ok", "port": 80}, {"name": "Bad", "port": 80}], "service name 'Bad'"),
    ([{"name": "web", "port": 80, "backends": ["nobody:80"]}], "backend 'nobody:80'"),
])
def test_apply_checks_every_spec_first(svcs, specs, message):
    """Bad input is refused with a message naming the item and the field, and nothing is written."""
    with pytest.raises((ConfigError, NotFoundError), match=message):
        svcs.apply(specs)
    assert svcs.maps.ops == [] and svcs.list() == []


def test_journal_records_and_snapshot_carry_a_seq(run_dir, monkeypatch):
    """Each record's seq is one more than the one before, across a compaction: the snapshot starts with the
    seq of the last record it holds, and the journal after it goes on from there."""
    monkeypatch.setattr(services_core, "COMPACT_MIN", 4)
    topo = Topology.default("demo")
    agent = Services("demo", topo, MemoryMaps(n.name for n in topo.nodes), JsonStore("demo"))
    journal, snap = run_dir / "demo" / "services.journal", run_dir / "demo" / "services.json"
    agent.add("web", 80, ["b1:8080"])
    agent.add_backend("web", "b2:8080")
    assert [json.loads(line)["seq"] for line in journal.read_text().splitlines()] == [1, 2]
    for _ in range(2):
        agent.remove_backend("web", "b2:8080")
        agent.add_backend("web", "b2:8080")
    assert json.loads(snap.read_text())["seq"] == 5 and snap.read_text().startswith('{"seq":5,')
    assert [json.loads(line)["seq"] for line in journal.read_text().splitlines()] == [6]
    scan = JsonStore("demo").scan()
    assert (scan.damaged, scan.problems, scan.last_seq) == (False, [], 6)


def test_old_journal_without_seq_goes_on_counting(run_dir):
    """Records written before seq existed still load; the next record's seq counts them, so a scan finds no gap."""
    topo = Topology.default("demo")
    old = Services.in_memory(topo)
    old.add("web", 80, ["b1:8080"])
    old.add("api", 81, ["b2:8080"])
    lines = [json.dumps({k: v for k, v in rec.items() if k != "seq"}) + "\n" for rec in old.store.records]
    (run_dir / "demo" / "services.journal").write_text("".join(lines))
    agent = Services("demo", topo, MemoryMaps(n.name for n in topo.nodes), JsonStore("demo"))
    assert [s.name for s in agent.list()] == ["web", "api"]
    agent.add("db", 82)
    last = (run_dir / "demo" / "services.journal").read_text().splitlines()[-1]
    assert json.loads(last)["seq"] == 3
    assert JsonStore("demo").scan().problems == []


def test_journal_scan_names_damage():
    """A scan stops replaying at a gap or a line that is not a record, and says which line and what it expected."""
    store = MemoryStore()
    for n in range(1, 5):
        store.append({"op": "del", "name": f"s{n}", "next_service_id": 1, "next_backend_id": 1})
    del store.records[1]
    scan = store.scan()
    assert scan.damaged and len(scan.records) == 1 and len(scan.later) == 2
    assert scan.problems == ["journal line 2: expected record seq 2, found seq 3 (record 2 is missing)"]
    store.records[1] = {"seq": 2, "op": "put"}
    assert store.scan().problems == ["journal line 2: expected a put record with service, next_service_id, "
                                     "next_backend_id; found one without"]


def test_apply_of_new_services_writes_heads_last_in_one_batch(svcs):
    """An apply of many new services writes every node's backends, slots and reverse NAT of all of them
    before any head (a packet never meets a head whose slots are not there yet) and journals them at once."""
    svcs.apply([{"name": f"s{i}", "port": 80, "backends": ["b1:8080", "a1:8080"]} for i in range(5)])
    on_a = ops(svcs, "node-a")
    heads = [i for i, op in enumerate(on_a) if op.startswith("update svc") and op.endswith("slot 0")]
    others = [i for i, op in enumerate(on_a) if i not in heads]
    assert len(heads) == 5 and min(heads) > max(others)
    assert svcs.store.saves == 1 and len(svcs.store.records) == 5


def test_apply_refused_by_the_kernel_leaves_everything_as_it_was(svcs):
    """A kernel refusal in the middle of a bulk apply takes out every row written: maps, list and journal as before."""
    svcs.add("web", 80, ["b1:8080"])
    maps, records = snapshot(svcs), list(svcs.store.records)
    svcs.maps.fail = _fail_on("node-b", SERVICES_MAP, slot_no=0)
    with pytest.raises(DatapathError, match="adding 3 services: writing cilium_lb4_services_v2 on node 'node-b'"):
        svcs.apply([{"name": f"s{i}", "port": 80, "backends": ["b2:8080"]} for i in range(3)])
    svcs.maps.fail = None
    assert snapshot(svcs) == maps and svcs.store.records == records
    assert [s.name for s in svcs.list()] == ["web"]
    assert svcs.add("s0", 80, ["b2:8080"]).id == 2  # ids as if nothing happened


def test_flush_takes_every_head_out_first(svcs):
    """A flush deletes every node's heads before anything else, then empties the maps: no packet meets a head
    whose slots are gone, and no service is removed row by row."""
    for i in range(3):
        svcs.add(f"s{i}", 80 + i, ["b1:8080", "a1:8080"])
    n = len(svcs.maps.ops)
    svcs.flush()
    after = svcs.maps.ops[n:]
    assert len(after) == 6 and all(op.startswith("delete") and op.endswith("slot 0") for op in after)
    assert all(not table for node in svcs.maps.data.values() for table in node.values())
    assert svcs.list() == [] and svcs.add("web", 80).id == 1


def test_apply_in_batches_is_still_all_or_nothing(svcs, monkeypatch):
    """Batches of new services past the first are undone too when a later one is refused (their service ids
    are not handed out again at once, as ids never are)."""
    monkeypatch.setattr(services_core, "APPLY_CHUNK", 2)
    maps = snapshot(svcs)
    specs = [{"name": f"s{i}", "port": 80, "backends": ["b1:8080"]} for i in range(5)]
    specs.append({"name": "clash", "port": 80, "vip": "198.19.0.10"})  # s0's VIP
    with pytest.raises(ConfigError, match="already service 's0'"):
        svcs.apply(specs)
    assert snapshot(svcs) == maps and svcs.list() == []
    assert len(svcs.apply(specs[:5])["added"]) == 5 and min(s.id for s in svcs.list()) > 4
