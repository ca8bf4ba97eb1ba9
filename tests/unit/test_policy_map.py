"""labkit.maps.policy: v1.16's policy map key and entry, bytes and the `cilium-dbg bpf policy get` table."""
from __future__ import annotations

import ctypes

import pytest

from labkit.maps.policy import (
    STATIC_PREFIX_BITS,
    Direction,
    PolicyEntry,
    PolicyFlags,
    PolicyKey,
    PolicyRow,
    policy_get_lines,
    sort_rows,
)

# Facts, from Cilium v1.16 (default stored versions of these files; see the report):
# - bpf/lib/common.h struct policy_key: bpf_lpm_trie_key lpm_key; __u32 sec_label; __u8 egress:1, pad:7;
#   __u8 protocol; __u16 dport  -> 12 bytes, LPM trie (pkg/maps/policymap/policymap.go newMap: ebpf.LPMTrie).
# - struct policy_entry: __be16 proxy_port; __u8 deny:1, wildcard_protocol:1, wildcard_dport:1, pad:5;
#   __u8 auth_type; __u16 pad1; __u16 pad2; __u64 packets; __u64 bytes -> 24 bytes.
# - policymap.go: StaticPrefixBits = (sizeof key - sizeof prefixlen)*8 - FullPrefixBits = 40,
#   NexthdrBits 8, DestPortBits 16; NewKey adds 8 for a protocol or port, and 16 - trailing zeros of the mask.


def test_key_and_entry_sizes_and_offsets():
    """policy_key is 12 packed bytes in C's field order, policy_entry 24 (bpf/lib/common.h)."""
    assert ctypes.sizeof(PolicyKey) == 12 and ctypes.sizeof(PolicyEntry) == 24
    assert [PolicyKey.__dict__[f].offset for f in ("prefixlen", "sec_label", "egress", "protocol", "dport_be")] == [0, 4, 8, 9, 10]
    assert [PolicyEntry.__dict__[f].offset for f in ("proxy_port_be", "flag_bits", "auth_type", "packets", "bytes")] == [0, 2, 3, 8, 16]


def test_key_bytes_little_endian_header_network_order_port():
    """The prefix and identity are host (little-endian) order, the port network order (policymap.go DestPortNetwork)."""
    k = PolicyKey.make(257, Direction.EGRESS, proto=6, dport=80)
    assert bytes(k) == bytes([64, 0, 0, 0, 0x01, 0x01, 0, 0, 1, 6, 0x00, 0x50])
    assert PolicyKey.from_bytes(bytes(k)) == k and PolicyKey.from_bytes(bytes(k)).dport == 80


@pytest.mark.parametrize("proto,dport,mask,prefix", [
    (0, 0, 0xFFFF, STATIC_PREFIX_BITS),            # policymap_test.go: key.Prefixlen == StaticPrefixBits
    (6, 0, 0xFFFF, STATIC_PREFIX_BITS + 8),        # StaticPrefixBits + NexthdrBits
    (6, 80, 0xFFFF, STATIC_PREFIX_BITS + 24),      # StaticPrefixBits + FullPrefixBits
    (6, 0x100, 0xFF00, STATIC_PREFIX_BITS + 16),   # a port range 256-511: 16 - 8 trailing zeros
])
def test_prefix_lengths(proto, dport, mask, prefix):
    """NewKey's prefix: 40, +8 with a protocol, + the port mask's bits with a port (TestPolicyMapWildcarding)."""
    assert STATIC_PREFIX_BITS == 40
    assert PolicyKey.make(42, Direction.INGRESS, proto, dport, mask).prefixlen == prefix


@pytest.mark.parametrize("prefix_l4,proto,port,want", [
    # pkg/maps/policymap/policymap_test.go TestPortProtoString, case by case
    (0, 0, 0, "ANY"),
    (24, 0, 8080, "8080/ANY"),
    (24, 6, 8080, "8080/TCP"),
    (8, 6, 0, "TCP"),
    (16, 0, 0x0100, "256-511/ANY"),
])
def test_port_proto_string(prefix_l4, proto, port, want):
    """PortProtoString prints the table of Cilium's own test."""
    import socket
    k = PolicyKey(prefixlen=STATIC_PREFIX_BITS + prefix_l4, sec_label=0, egress=0, protocol=proto,
                  dport_be=socket.htons(port))
    assert k.port_proto() == want


@pytest.mark.parametrize("deny,proto,dport,flags,text", [
    (False, 6, 80, 0, "Allow"),
    (False, 6, 0, PolicyFlags.WILDCARD_DPORT, "Allow, WildcardPort"),
    (False, 0, 0, PolicyFlags.WILDCARD_PROTOCOL | PolicyFlags.WILDCARD_DPORT, "Allow, WildcardProtocol, WildcardPort"),
    (True, 6, 80, PolicyFlags.DENY, "Deny"),
    (True, 0, 0, 7, "Deny, WildcardProtocol, WildcardPort"),
])
def test_entry_flags(deny, proto, dport, flags, text):
    """newAllowEntry/newDenyEntry set wildcard bits from the key; policyEntryFlags.String names them."""
    k = PolicyKey.make(42, Direction.INGRESS, proto, dport)
    e = PolicyEntry.deny(k) if deny else PolicyEntry.allow(k)
    assert int(e.flags) == int(flags) and str(e.flags) == text and e.is_deny == deny


def test_entry_round_trip_and_deny_has_no_proxy():
    """An entry packs and unpacks unchanged; a deny carries no proxy port and no auth (newDenyEntry)."""
    k = PolicyKey.make(42, Direction.INGRESS, 6, 80)
    e = PolicyEntry.allow(k, proxy_port=23767, auth_type=1)
    e.packets, e.bytes = 3, 180
    back = PolicyEntry.from_bytes(bytes(e))
    assert back == e and back.proxy_port == 23767 and back.auth_type == 1 and back.packets == 3
    assert bytes(e)[:2] == (23767).to_bytes(2, "big")
    d = PolicyEntry.deny(k)
    assert d.proxy_port == 0 and d.auth_type == 0


def test_sort_denies_first_then_direction_then_identity():
    """PolicyEntriesDump.Less: deny before allow, ingress before egress, smaller identity first."""
    rows = [PolicyRow(PolicyKey.make(i, d), (PolicyEntry.deny if deny else PolicyEntry.allow)(PolicyKey.make(i, d)))
            for i, d, deny in [(5, Direction.EGRESS, False), (1, Direction.INGRESS, False),
                               (9, Direction.EGRESS, True), (0, Direction.INGRESS, False)]]
    assert [(r.key.sec_label, r.entry.is_deny) for r in sort_rows(rows)] == [(9, True), (0, False), (1, False), (5, False)]


def _cells(*cells, widths):
    """Go's tabwriter for tab-terminated cells: each padded to its column's width."""
    return "".join(c.ljust(w) for c, w in zip(cells, widths))


def test_policy_get_lines_golden():
    """The table follows bpf_policy_get.go formatMap's format strings: header, one line per label, PREFIX = prefixlen - 40."""
    labels = {256: ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=default"], 2: ["reserved:world"], 0: ["reserved:unknown"]}
    k_world = PolicyKey.make(2, Direction.INGRESS)
    k_web = PolicyKey.make(256, Direction.INGRESS, 6, 8080)
    k_any = PolicyKey.make(0, Direction.EGRESS)
    e_web = PolicyEntry.allow(k_web)
    e_web.packets, e_web.bytes = 2, 120
    rows = [PolicyRow(k_any, PolicyEntry.allow(k_any)), PolicyRow(k_web, e_web), PolicyRow(k_world, PolicyEntry.deny(k_world))]
    # Widths: the widest cell of each column + padding 3, at least minwidth 5 (tabwriter.NewWriter(os.Stdout, 5, 0, 3, ' ', 0)).
    w = [9, 12, 42, 13, 13, 12, 8, 10, 9]
    assert policy_get_lines(rows, labels.__getitem__) == [
        _cells("POLICY", "DIRECTION", "LABELS (source:key[=value])", "PORT/PROTO", "PROXY PORT", "AUTH TYPE", "BYTES", "PACKETS", "PREFIX", widths=w),
        _cells("Deny", "Ingress", "reserved:world", "ANY", "NONE", "disabled", "0", "0", "0", widths=w),
        _cells("Allow", "Ingress", "k8s:app=web", "8080/TCP", "NONE", "disabled", "120", "2", "24", widths=w),
        _cells("", "", "k8s:io.kubernetes.pod.namespace=default", "", "", "", "", "", "", widths=w),
        _cells("Allow", "Egress", "reserved:unknown", "ANY", "NONE", "disabled", "0", "0", "0", widths=w),
    ]


def test_policy_get_numeric():
    """With -n the third column is IDENTITY and holds the number (bpf_policy_get.go printIDs)."""
    k = PolicyKey.make(16777217, Direction.EGRESS, 17, 53)
    lines = policy_get_lines([PolicyRow(k, PolicyEntry.allow(k, proxy_port=40001))], numeric=True)
    assert lines[0].split()[:3] == ["POLICY", "DIRECTION", "IDENTITY"]
    assert lines[1].split() == ["Allow", "Egress", "16777217", "53/UDP", "40001", "disabled", "0", "0", "24"]
