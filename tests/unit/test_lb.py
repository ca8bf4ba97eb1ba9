"""Service map rows (labkit.maps.lb): Cilium v1.16 layouts and byte orders, flag
names, key helpers, and the `cilium service list`, `cilium-dbg bpf lb list` and raw
views built from map rows, byte for byte for v1.16 and 1.20."""
from __future__ import annotations

import ctypes
import doctest
import socket

import pytest

from labkit.errors import ConfigError
from labkit.maps import lb
from labkit.maps.lb import (
    BackendState,
    Ipv4RevnatEntry,
    Ipv4RevnatTuple,
    Lb4AffinityKey,
    Lb4Backend,
    Lb4BackendKey,
    Lb4Key,
    Lb4ReverseNat,
    Lb4RevNatKey,
    Lb4Service,
    LbAffinityVal,
    LbSnapshot,
    ServiceFlags,
    ServiceFlags2,
)

# Cilium v1.16 bpf/lib/common.h: size, then member → (offset, size).
CILIUM = {
    Lb4Key: (12, {"address": (0, 4), "dport": (4, 2), "backend_slot": (6, 2), "proto": (8, 1), "scope": (9, 1),
                  "pad": (10, 2)}),
    Lb4Service: (12, {"backend_id": (0, 4), "count": (4, 2), "rev_nat_index": (6, 2), "flags": (8, 1),
                      "flags2": (9, 1), "pad": (10, 2)}),
    Lb4Backend: (12, {"address": (0, 4), "port": (4, 2), "proto": (6, 1), "flags": (7, 1), "cluster_id": (8, 2),
                      "zone": (10, 1), "pad": (11, 1)}),
    Lb4ReverseNat: (6, {"address": (0, 4), "port": (4, 2)}),
    Lb4AffinityKey: (16, {"client_id": (0, 8), "rev_nat_id": (8, 2), "netns_cookie": (10, 1), "pad1": (11, 1),
                          "pad2": (12, 4)}),
    LbAffinityVal: (16, {"last_used": (0, 8), "backend_id": (8, 4), "pad": (12, 4)}),
    Ipv4RevnatTuple: (16, {"cookie": (0, 8), "address": (8, 4), "port": (12, 2), "pad": (14, 2)}),
    Ipv4RevnatEntry: (8, {"address": (0, 4), "port": (4, 2), "rev_nat_index": (6, 2)}),
}
VIP = "198.19.0.10"


def _members(cls) -> dict[str, tuple[int, int]]:
    return {name: (getattr(cls, name).offset, getattr(cls, name).size) for name, _ in cls._fields_}


# -- layouts -------------------------------------------------------------------
@pytest.mark.parametrize("cls", list(CILIUM), ids=[c.__name__ for c in CILIUM])
def test_layout_is_cilium(cls):
    """Each mirror has Cilium's size and every member at Cilium's offset (no clang needed)."""
    size, members = CILIUM[cls]
    assert ctypes.sizeof(cls) == size
    assert _members(cls) == members


def test_sizes_in_order():
    """The eight structs are 12/12/12/6/16/16/16/8 bytes, as the brief and Cilium say."""
    assert [ctypes.sizeof(c) for c in CILIUM] == [12, 12, 12, 6, 16, 16, 16, 8]


def test_map_table_key_and_value_sizes():
    """LB_MAPS pairs each map with the key/value sizes the datapath creates it with."""
    sizes = {name: (ctypes.sizeof(k), ctypes.sizeof(v) if isinstance(v, type(ctypes.Structure)) else 0)
             for name, (k, v) in lb.LB_MAPS.items()}
    assert sizes == {
        "cilium_lb4_services_v2": (12, 12),
        "cilium_lb4_backends_v3": (4, 12),
        "cilium_lb4_reverse_nat": (2, 6),
        "cilium_lb4_affinity": (16, 16),
        "cilium_lb_affinity_match": (8, 1),  # the value is one unused byte
        "cilium_lb4_reverse_sk": (16, 8),
        "cilium_lb4_maglev": (2, 0),  # the value is a table of M ids; MaglevLut sizes itself
    }


# -- byte orders ---------------------------------------------------------------
def test_key_bytes_network_order():
    """Lb4Key stores the VIP and port in network order and the slot in host (little-endian) order."""
    key = Lb4Key.make(VIP, 80, "TCP", slot=2)
    raw = bytes(key)
    assert raw[0:4] == socket.inet_aton(VIP)
    assert raw[4:6] == (80).to_bytes(2, "big")
    assert raw[6:8] == (2).to_bytes(2, "little")
    assert raw[8:] == bytes([6, 0, 0, 0])


def test_key_protocols_and_scope():
    """TCP keys carry proto 6, UDP 17, and scope 0 (external) unless asked otherwise."""
    assert Lb4Key.make(VIP, 53, "UDP").proto == 17
    assert Lb4Key.make(VIP, 53, "tcp").proto == 6
    assert Lb4Key.make(VIP, 53).scope == lb.LookupScope.EXT == 0
    with pytest.raises(ValueError, match="expected TCP or UDP"):
        Lb4Key.make(VIP, 53, "SCTP")


def test_key_round_trip():
    """A key decodes back to its VIP, port, slot and frontend text."""
    key = Lb4Key.from_buffer_copy(bytes(Lb4Key.make(VIP, 8080, "UDP", slot=3)))
    assert (key.vip, key.port, key.backend_slot, key.frontend) == (VIP, 8080, 3, f"{VIP}:8080/UDP")
    assert str(key) == f"{VIP}:8080/UDP slot 3"
    assert key.with_slot(0).ident == key.ident and key.with_slot(0).backend_slot == 0


def test_service_head_and_slot_bytes():
    """The head keeps count and backend_id (affinity timeout) in host order and rev_nat_index in network order."""
    head = Lb4Service.head(count=2, rev_nat_index=0x0102, affinity_timeout=300, flags=ServiceFlags.AFFINITY)
    raw = bytes(head)
    assert raw[0:4] == (300).to_bytes(4, "little")
    assert raw[4:6] == (2).to_bytes(2, "little")
    assert raw[6:8] == bytes([0x01, 0x02])
    assert raw[8] == 0x10
    assert (head.rev_nat, head.affinity_timeout) == (0x0102, 300)
    slot = Lb4Service.slot(backend_id=7, rev_nat_index=1)
    assert bytes(slot)[0:4] == (7).to_bytes(4, "little") and slot.count == 0 and bytes(slot)[6:8] == b"\x00\x01"


def test_backend_bytes():
    """A backend stores address and port in network order, the protocol number and its state."""
    be = Lb4Backend.make("198.18.2.11", 8080, "TCP", BackendState.TERMINATING)
    raw = bytes(be)
    assert raw[0:4] == socket.inet_aton("198.18.2.11") and raw[4:6] == (8080).to_bytes(2, "big")
    assert (raw[6], raw[7]) == (6, 1)
    assert (be.ip, be.host_port, be.state, be.l4addr) == ("198.18.2.11", 8080, "terminating", "198.18.2.11:8080/TCP")
    assert str(be) == "198.18.2.11:8080/TCP (terminating)"


def test_backend_key_is_host_order():
    """The backends map key is the backend id as a host-order u32."""
    assert bytes(Lb4BackendKey(258)) == (258).to_bytes(4, "little")


def test_revnat_key_is_network_order():
    """The reverse NAT key is the service id as a u16 in network order (Cilium's RevNat4Key)."""
    assert bytes(Lb4RevNatKey.make(1)) == b"\x00\x01"
    assert bytes(Lb4RevNatKey.make(0x0203)) == b"\x02\x03"
    assert Lb4RevNatKey.from_buffer_copy(b"\x00\x05").rev_nat == 5


def test_reverse_nat_value():
    """A reverse NAT entry is VIP and port in network order, packed into 6 bytes."""
    rn = Lb4ReverseNat.make(VIP, 80)
    assert bytes(rn) == socket.inet_aton(VIP) + b"\x00\x50"
    assert str(rn) == f"{VIP}:80"


def test_affinity_key_bytes():
    """The affinity key holds the client's be32 address in client_id's low bytes and rev_nat_id in network order."""
    key = Lb4AffinityKey.make("198.18.1.11", 1)
    raw = bytes(key)
    assert raw[0:4] == socket.inet_aton("198.18.1.11") and raw[4:8] == b"\0\0\0\0"
    assert raw[8:10] == b"\x00\x01" and raw[10:] == b"\0" * 6
    assert key.rev_nat == 1 and str(key) == "client 198.18.1.11 rev_nat 1"


def test_socket_revnat_bytes():
    """The socket LB tuple and entry keep addresses, ports and the rev NAT index in network order."""
    t = Ipv4RevnatTuple.make(0x1122, "198.18.2.11", 8080)
    assert bytes(t)[0:8] == (0x1122).to_bytes(8, "little") and bytes(t)[12:14] == (8080).to_bytes(2, "big")
    e = Ipv4RevnatEntry.make(VIP, 80, 3)
    assert bytes(e) == socket.inet_aton(VIP) + b"\x00\x50" + b"\x00\x03"


# -- flags -----------------------------------------------------------------------
def test_flag_values():
    """Service flag bits have Cilium's values in both bytes."""
    assert {f.name: int(f) for f in ServiceFlags} == {
        "EXTERNAL_IP": 0x01, "NODEPORT": 0x02, "EXT_LOCAL_SCOPE": 0x04, "HOSTPORT": 0x08,
        "AFFINITY": 0x10, "LOADBALANCER": 0x20, "ROUTABLE": 0x40, "SOURCE_RANGE": 0x80}
    assert {f.name: int(f) for f in ServiceFlags2} == {
        "LOCALREDIRECT": 0x01, "NAT_46X64": 0x02, "L7LOADBALANCER": 0x04, "LOOPBACK": 0x08,
        "INT_LOCAL_SCOPE": 0x10, "TWO_SCOPES": 0x20}


@pytest.mark.parametrize("flags,flags2,words", [
    (0, 0, ["ClusterIP", "non-routable"]),
    (ServiceFlags.AFFINITY, 0, ["ClusterIP", "sessionAffinity", "non-routable"]),
    (ServiceFlags.NODEPORT | ServiceFlags.ROUTABLE, 0, ["NodePort"]),
    (ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE | ServiceFlags.SOURCE_RANGE, 0,
     ["LoadBalancer", "check source-range"]),
    (ServiceFlags.HOSTPORT | ServiceFlags.ROUTABLE, ServiceFlags2.LOOPBACK, ["HostPort", "loopback"]),
    (ServiceFlags.ROUTABLE, ServiceFlags2.TWO_SCOPES | 0x80, ["ClusterIP", "two-scopes", "Unknown=0x80"]),
    # pkg/loadbalancer ServiceFlags.String (v1.16): type, Local, InternalLocal, two-scopes, sessionAffinity,
    # non-routable, check source-range, 46x64, l7-load-balancer, loopback
    (ServiceFlags.NODEPORT | ServiceFlags.EXT_LOCAL_SCOPE | ServiceFlags.AFFINITY | ServiceFlags.SOURCE_RANGE,
     ServiceFlags2.TWO_SCOPES | ServiceFlags2.INT_LOCAL_SCOPE | ServiceFlags2.NAT_46X64 | ServiceFlags2.L7LOADBALANCER,
     ["NodePort", "Local", "InternalLocal", "two-scopes", "sessionAffinity", "non-routable", "check source-range",
      "46x64", "l7-load-balancer"]),
    (0, ServiceFlags2.LOCALREDIRECT, ["LocalRedirect", "non-routable"]),
])
def test_flag_names_in_cilium_order(flags, flags2, words):
    """flag_names reads the two bytes as Cilium's ServiceFlags.String() does, unknown bits last."""
    assert lb.flag_names(flags, flags2) == words


def test_backend_state_labels():
    """BackendState labels are what `cilium service list` prints in parentheses."""
    assert [s.label for s in BackendState] == ["active", "terminating", "quarantined", "maintenance"]
    assert BackendState.of(7) == "unknown(7)"


# -- the views -------------------------------------------------------------------
def _snapshot(**kw) -> LbSnapshot:
    return LbSnapshot.build(VIP, 80, "TCP", 1, [(1, "198.18.2.11", 8080), (2, "198.18.2.12", 8080)], **kw)


def _fixed(cilium: str) -> LbSnapshot:
    """A fixed node: ClusterIP 198.19.0.10:80/TCP (id 1, backends 1 and 2), ClusterIP 198.19.0.11:53/UDP without
    backends (id 2), and NodePort 198.51.100.11:30080/TCP with externalTrafficPolicy=Local (id 3): external
    scope backend 3 only, internal scope backends 3 and 1. Protocol bytes as the release's agent writes them."""
    tcp, udp = (0, 0) if cilium == "1.16" else (6, 17)
    np_flags = ServiceFlags.NODEPORT | ServiceFlags.ROUTABLE | ServiceFlags.EXT_LOCAL_SCOPE
    np_flags2 = ServiceFlags2.TWO_SCOPES
    web, dns = Lb4Key.make(VIP, 80, tcp), Lb4Key.make("198.19.0.11", 53, udp)
    ext = Lb4Key.make("198.51.100.11", 30080, tcp)
    int_ = Lb4Key.make("198.51.100.11", 30080, tcp, scope=lb.LookupScope.INT)
    services = [
        (web, Lb4Service.head(2, 1)), (web.with_slot(1), Lb4Service.slot(1, 1)), (web.with_slot(2), Lb4Service.slot(2, 1)),
        (dns, Lb4Service.head(0, 2)),
        (int_.with_slot(2), Lb4Service.slot(1, 3)), (ext, Lb4Service.head(1, 3, np_flags, np_flags2)),  # any order
        (ext.with_slot(1), Lb4Service.slot(3, 3)), (int_, Lb4Service.head(2, 3, np_flags, np_flags2)),
        (int_.with_slot(1), Lb4Service.slot(3, 3)),
    ]
    backends = [(Lb4BackendKey(1), Lb4Backend.make("198.18.2.11", 8080, tcp)),
                (Lb4BackendKey(2), Lb4Backend.make("198.18.2.12", 8080, tcp)),
                (Lb4BackendKey(3), Lb4Backend.make("198.18.1.11", 8080, tcp))]
    revnat = [(Lb4RevNatKey.make(1), Lb4ReverseNat.make(VIP, 80)),
              (Lb4RevNatKey.make(2), Lb4ReverseNat.make("198.19.0.11", 53)),
              (Lb4RevNatKey.make(3), Lb4ReverseNat.make("198.51.100.11", 30080))]
    return LbSnapshot.of(services, backends, revnat, cilium=cilium)


def _cells(widths, *cells) -> str:
    """One line of Go's tabwriter where every cell is tab-terminated: each cell padded to its column's width."""
    return "".join(c + " " * (w - len(c)) for c, w in zip(cells, widths))


def test_service_list_text_v1_16():
    """`cilium service list` of v1.16, byte for byte. cilium-dbg/cmd/service_list.go: tabwriter.NewWriter(os.Stdout,
    5, 0, 3, ' ', 0); header "ID\tFrontend\tService Type\tBackend\t"; "%d\t%s\t%s\t%s\t" with the first backend,
    "\t\t\t%s\t" per further one, "%d\t%s\t%s\t\t" without any; sorted by ID; backends "%d => %s (%s)" numbered in
    backend id order; addresses L3n4Addr.String() "%s:%d%s" (no protocol, "/i" for the internal scope).
    Every cell is terminated, so a column is max(5, widest + 3) wide and every line ends padded."""
    w = (5, len("198.51.100.11:30080/i") + 3, len("Service Type") + 3, len("1 => 198.18.2.11:8080 (active)") + 3)
    assert _fixed("1.16").text() == "".join(line + "\n" for line in [
        _cells(w, "ID", "Frontend", "Service Type", "Backend"),
        _cells(w, "1", "198.19.0.10:80", "ClusterIP", "1 => 198.18.2.11:8080 (active)"),
        _cells(w, "", "", "", "2 => 198.18.2.12:8080 (active)"),
        _cells(w, "2", "198.19.0.11:53", "ClusterIP", ""),
        _cells(w, "3", "198.51.100.11:30080", "NodePort", "1 => 198.18.1.11:8080 (active)"),
        _cells(w, "3", "198.51.100.11:30080/i", "NodePort", "1 => 198.18.2.11:8080 (active)"),
        _cells(w, "", "", "", "2 => 198.18.1.11:8080 (active)"),
    ])
    assert w == (5, 24, 15, 33)
    assert _fixed("1.16").lines()[3] == "2    198.19.0.11:53" + " " * 10 + "ClusterIP" + " " * 6 + " " * 33


def test_service_list_text_1_20():
    """`cilium service list` of 1.20: the same grammar, addresses L3n4Addr.StringWithProtocol() "ip:port/TCP"
    ("/i" after the protocol)."""
    w = (5, len("198.51.100.11:30080/TCP/i") + 3, 15, len("1 => 198.18.2.11:8080/TCP (active)") + 3)
    b1, b2, a1 = "198.18.2.11:8080/TCP (active)", "198.18.2.12:8080/TCP (active)", "198.18.1.11:8080/TCP (active)"
    rows = [("ID", "Frontend", "Service Type", "Backend"),
            ("1", "198.19.0.10:80/TCP", "ClusterIP", f"1 => {b1}"), ("", "", "", f"2 => {b2}"),
            ("2", "198.19.0.11:53/UDP", "ClusterIP", ""),
            ("3", "198.51.100.11:30080/TCP", "NodePort", f"1 => {a1}"),
            ("3", "198.51.100.11:30080/TCP/i", "NodePort", f"1 => {b1}"), ("", "", "", f"2 => {a1}")]
    assert _fixed("1.20").lines() == [_cells(w, *row) for row in rows]


def test_bpf_lb_list_text_v1_16():
    """`cilium-dbg bpf lb list` of v1.16, byte for byte. The key string is svcKey.String() = "ip:port[/i] (slot)"
    (pkg/maps/lbmap/ipv4.go:250-257@82999990: `addr = fmt.Sprintf("%s (%d)", addr, kHost.BackendSlot)`), so every
    entry is its own group and line (cilium-dbg/cmd/bpf_lb_list.go:116@82999990 `serviceList[svc] = append(...)`);
    head "%s:%d (%d) (%d) [%s] %s" (no L7LB port: a trailing space), slot "%s:%d (%d) (%d)"
    (bpf_lb_list.go:104,108@82999990); helpers.go TablePrinter: tabwriter(5, 0, 3, ' ', 0), header "%s\t%s\n"
    (second title not terminated: no padding), entries "%s\t%s\t\n". Sorted by frontend then slot (a node prints
    them in hash order)."""
    head_np = "0.0.0.0:0 (3) (0) [NodePort, Local, two-scopes] "
    w = (len("198.51.100.11:30080/i (2)") + 3, len(head_np) + 3)
    web, np_ = "198.19.0.10:80", "198.51.100.11:30080"
    entries = [(f"{web} (0)", "0.0.0.0:0 (1) (0) [ClusterIP, non-routable] "),
               (f"{web} (1)", "198.18.2.11:8080 (1) (1)"), (f"{web} (2)", "198.18.2.12:8080 (1) (2)"),
               ("198.19.0.11:53 (0)", "0.0.0.0:0 (2) (0) [ClusterIP, non-routable] "),
               (f"{np_} (0)", head_np), (f"{np_} (1)", "198.18.1.11:8080 (3) (1)"),
               (f"{np_}/i (0)", head_np), (f"{np_}/i (1)", "198.18.1.11:8080 (3) (1)"),
               (f"{np_}/i (2)", "198.18.2.11:8080 (3) (2)")]
    header = "SERVICE ADDRESS" + " " * (w[0] - 15) + "BACKEND ADDRESS (REVNAT_ID) (SLOT)"
    assert _fixed("1.16").bpf_lines() == [header] + [_cells(w, key, value) for key, value in entries]
    assert w == (28, 51)
    assert _fixed("1.16").bpf_json() == {key: [value] for key, value in entries}


def test_bpf_lb_list_text_1_20():
    """`cilium-dbg bpf lb list` of 1.20: the key string is "ip:port/TCP[/i] (slot)" (pkg/loadbalancer/maps
    Service4Key.String), so every entry is its own key and line; backends "%s:%d/%s (%d) (%d)"."""
    head_np = "0.0.0.0:0 (3) (0) [NodePort, Local, two-scopes] "
    w = (len("198.51.100.11:30080/TCP/i (2)") + 3, len(head_np) + 3)
    web, np_ = "198.19.0.10:80/TCP", "198.51.100.11:30080/TCP"
    entries = [(f"{web} (0)", "0.0.0.0:0 (1) (0) [ClusterIP, non-routable] "),
               (f"{web} (1)", "198.18.2.11:8080/TCP (1) (1)"), (f"{web} (2)", "198.18.2.12:8080/TCP (1) (2)"),
               ("198.19.0.11:53/UDP (0)", "0.0.0.0:0 (2) (0) [ClusterIP, non-routable] "),
               (f"{np_} (0)", head_np), (f"{np_} (1)", "198.18.1.11:8080/TCP (3) (1)"),
               (f"{np_}/i (0)", head_np), (f"{np_}/i (1)", "198.18.1.11:8080/TCP (3) (1)"),
               (f"{np_}/i (2)", "198.18.2.11:8080/TCP (3) (2)")]
    header = "SERVICE ADDRESS" + " " * (w[0] - 15) + "BACKEND ADDRESS (REVNAT_ID) (SLOT)"
    assert _fixed("1.20").bpf_lines() == [header] + [_cells(w, key, value) for key, value in entries]
    assert _fixed("1.20").bpf_json()["198.19.0.11:53/UDP (0)"] == ["0.0.0.0:0 (2) (0) [ClusterIP, non-routable] "]


def test_bpf_lb_list_missing_backend_and_l7lb():
    """A slot whose backend id is not in the backends map reads "backend %d not found"; an L7LB head carries
    "(L7LB Proxy Port: %d)" after its flags (the port, network order, in backend_id)."""
    key = Lb4Key.make(VIP, 80, 0)
    head = Lb4Service.head(1, 1, 0, ServiceFlags2.L7LOADBALANCER)
    head.backend_id = socket.htons(10000)
    snap = LbSnapshot.of([(key, head), (key.with_slot(1), Lb4Service.slot(9, 1))], [], [])
    assert snap.bpf_json() == {f"{VIP}:80 (0)": ["0.0.0.0:0 (1) (0) [ClusterIP, non-routable, l7-load-balancer] "
                                                 "(L7LB Proxy Port: 10000)"],
                               f"{VIP}:80 (1)": ["backend 9 not found"]}


def test_service_list_lines():
    """lb list prints Cilium's tabwriter columns, one line per backend, numbered from 1 (v1.16: no protocol)."""
    assert _snapshot().lines() == [
        "ID   Frontend         Service Type   Backend" + " " * 26,
        "1    198.19.0.10:80   ClusterIP      1 => 198.18.2.11:8080 (active)   ",
        "                                     2 => 198.18.2.12:8080 (active)   ",
    ]


def test_build_writes_the_release_protocol():
    """LbSnapshot.build gives keys and backends protocol 0 on v1.16 and the service's on 1.20."""
    assert {bytes(k)[8] for k, _ in _snapshot().services} == {0}
    assert {v.proto for _, v in _snapshot().backends} == {0}
    assert {bytes(k)[8] for k, _ in _snapshot(cilium="1.20").services} == {6}
    with pytest.raises(ConfigError, match="Cilium release"):
        _snapshot(cilium="1.17")


def test_terminating_after_count():
    """A backend in a slot after the head's count is listed as terminating, after the active ones."""
    rows = _snapshot(active=1).rows()
    assert [(b.slot, b.state) for b in rows[0].backends] == [(1, "active"), (2, "terminating")]
    assert rows[0].count == 1


def test_walk_stops_at_missing_slot():
    """Reading a service follows slots 1, 2, ... and stops at the first slot that is missing."""
    snap = _snapshot()
    services = [(k, v) for k, v in snap.services if k.backend_slot != 1]
    rows = LbSnapshot.of(services, snap.backends, snap.revnat).rows()
    assert rows[0].backends == ()


def test_walk_reads_past_count():
    """Slots after count are read too (Cilium keeps terminating backends there)."""
    snap = _snapshot()
    services = [(k, Lb4Service.head(0, 1) if k.backend_slot == 0 else v) for k, v in snap.services]
    rows = LbSnapshot.of(services, snap.backends, snap.revnat).rows()
    assert [b.backend_id for b in rows[0].backends] == [1, 2]
    assert all(b.state == "terminating" for b in rows[0].backends)


def test_missing_backend_is_shown():
    """A slot naming a backend id absent from the backends map is shown, not hidden."""
    snap = _snapshot()
    rows = LbSnapshot.of(snap.services, snap.backends[:1], snap.revnat).rows()
    assert rows[0].backends[1].state == "missing"
    assert "missing from cilium_lb4_backends_v3" in rows[0].backends[1].text(2)


def test_slots_without_head_are_not_services():
    """Only slot 0 heads start a service; orphan slots show up in the raw view only."""
    snap = _snapshot()
    services = [(k, v) for k, v in snap.services if k.backend_slot != 0]
    fixed = LbSnapshot.of(services, snap.backends, snap.revnat)
    assert fixed.rows() == [] and fixed.lines() == ["ID   Frontend   Service Type   Backend   "]
    assert any("slot 1 → backend 1" in line for line in fixed.raw_lines())


def test_raw_lines():
    """The raw view lists every slot with its key, then backends by id and reverse NAT by id."""
    assert _snapshot(active=1).raw_lines() == [
        "# cilium_lb4_services_v2",
        "198.19.0.10:80/ANY slot 0 head: count=1 rev_nat=1 flags=[ClusterIP, non-routable]",
        "198.19.0.10:80/ANY slot 1 → backend 1 [198.18.2.11:8080/ANY (active)] rev_nat=1",
        "198.19.0.10:80/ANY slot 2 → backend 2 [198.18.2.12:8080/ANY (terminating)] rev_nat=1",
        "# cilium_lb4_backends_v3",
        "backend 1 → 198.18.2.11:8080/ANY (active)",
        "backend 2 → 198.18.2.12:8080/ANY (terminating)",
        "# cilium_lb4_reverse_nat",
        "rev_nat 1 → 198.19.0.10:80",
    ]


def test_json_views():
    """--json gives services with backends; --raw --json gives the entries of each map."""
    data = _snapshot().to_json()
    assert data[0]["id"] == 1 and data[0]["frontend"] == "198.19.0.10:80" and data[0]["count"] == 2
    assert data[0]["protocol"] == "ANY" and _snapshot(cilium="1.20").to_json()[0]["frontend"] == "198.19.0.10:80/TCP"
    assert data[0]["flags"] == ["ClusterIP", "non-routable"] and data[0]["rev_nat"] == "198.19.0.10:80"
    assert [b["address"] for b in data[0]["backends"]] == ["198.18.2.11", "198.18.2.12"]
    raw = _snapshot().raw_json()
    assert [e["slot"] for e in raw["cilium_lb4_services_v2"]] == [0, 1, 2]
    assert raw["cilium_lb4_reverse_nat"] == [{"rev_nat": 1, "address": VIP, "port": 80}]


def test_services_sorted_by_id():
    """Several services are listed by service id."""
    a = LbSnapshot.build("198.19.0.11", 53, "UDP", 2, [(3, "198.18.1.11", 53)])
    b = _snapshot()
    snap = LbSnapshot.of(a.services + b.services, a.backends + b.backends, a.revnat + b.revnat)
    assert [r.id for r in snap.rows()] == [1, 2]
    assert snap.lines()[3].startswith("2    198.19.0.11:53   ClusterIP      1 => 198.18.1.11:53 (active)")


def test_doctests():
    """The examples in labkit.maps.lb run and give what they show."""
    result = doctest.testmod(lb, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
