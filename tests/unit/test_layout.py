"""The ctypes mirrors in labkit have exactly the layout of the C structs the
BPF programs use, as clang lays them out (read back from the object's BTF),
and the CT, service and NAT structs have Cilium v1.16's layout."""
from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from labkit.observe import trace
from labkit.maps import config as mconfig
from labkit.maps import ct, eps, lb, nat, sockmap

ROOT = Path(__file__).resolve().parents[2]
BPF_LIB = ROOT / "bpf" / "lib"
HEADERS = ("ct_types.h", "eps_types.h", "config_types.h", "trace_types.h", "lb_types.h", "nat_types.h",
           "policy_types.h", "sockops_types.h")

#: Python class ↔ C struct name.
PAIRS = [
    (ct.CtKey4, "ipv4_ct_tuple"),
    (ct.CtEntry, "ct_entry"),
    (eps.EndpointKey, "endpoint_key"),
    (eps.EndpointInfo, "endpoint_info"),
    (eps.IpcacheKey, "ipcache_key"),
    (eps.RemoteEndpointInfo, "remote_endpoint_info"),
    (mconfig.LabConfig, "lab_config"),
    (trace.TraceEvent, "trace_event"),
    (trace.TraceTuple, "trace_tuple"),
    (lb.Lb4Key, "lb4_key"),
    (lb.Lb4Service, "lb4_service"),
    (lb.Lb4Backend, "lb4_backend"),
    (lb.Lb4ReverseNat, "lb4_reverse_nat"),
    (lb.Lb4AffinityKey, "lb4_affinity_key"),
    (lb.LbAffinityVal, "lb_affinity_val"),
    (lb.LbAffinityMatch, "lb_affinity_match"),
    (lb.Ipv4RevnatTuple, "ipv4_revnat_tuple"),
    (lb.Ipv4RevnatEntry, "ipv4_revnat_entry"),
    (nat.NatKey4, "ipv4_ct_tuple"),  # the NAT map's key is the CT key (ports not swapped)
    (nat.NatEntry, "ipv4_nat_entry"),
    (sockmap.SockKey, "sock_key"),
]
#: Test ids: the C name, plus the Python class where a C struct has a second mirror.
_C_NAMES = [c for _, c in PAIRS]
IDS = [c if _C_NAMES.index(c) == i else f"{c}-{p.__name__}" for i, (p, c) in enumerate(PAIRS)]
#: Python field name → C member name where they differ (none today: the
#: mirrors use the C names verbatim; an entry here documents a deliberate rename).
RENAMES: dict[str, dict[str, str]] = {}

_SIGNED_CTYPES = (ctypes.c_int8, ctypes.c_int16, ctypes.c_int32, ctypes.c_int64)
_UNSIGNED_CTYPES = (ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64)

# Cilium v1.16: struct ipv4_ct_tuple and struct ct_entry, member → (offset, size).
CILIUM_CT_TUPLE = {"daddr": (0, 4), "saddr": (4, 4), "dport": (8, 2), "sport": (10, 2), "nexthdr": (12, 1), "flags": (13, 1)}
CILIUM_CT_ENTRY = {
    "reserved0": (0, 8),
    "backend_id": (8, 8),
    "packets": (16, 8),
    "bytes": (24, 8),
    "lifetime": (32, 4),
    "flags": (36, 2),
    "rev_nat_index": (38, 2),
    "ifindex": (40, 2),
    "tx_flags_seen": (42, 1),
    "rx_flags_seen": (43, 1),
    "src_sec_id": (44, 4),
    "last_tx_report": (48, 4),
    "last_rx_report": (52, 4),
}

# Cilium v1.16 (bpf/lib/nat.h): struct ipv4_nat_entry, 40 bytes. Cilium's union of to_saddr/to_sport
# (OUT) and to_daddr/to_dport (IN) is to_addr/to_port here; pad3 names Cilium's 2 bytes of tail padding.
CILIUM_NAT_ENTRY = {
    "created": (0, 8),
    "needs_ct": (8, 8),
    "pad1": (16, 8),
    "pad2": (24, 8),
    "to_addr": (32, 4),
    "to_port": (36, 2),
    "pad3": (38, 2),
}


# Cilium v1.16 (bpf/lib/common.h): the service map structs, member → (offset, size).
CILIUM_LB = {
    "lb4_key": (12, {"address": (0, 4), "dport": (4, 2), "backend_slot": (6, 2), "proto": (8, 1),
                     "scope": (9, 1), "pad": (10, 2)}),
    "lb4_service": (12, {"backend_id": (0, 4), "count": (4, 2), "rev_nat_index": (6, 2), "flags": (8, 1),
                         "flags2": (9, 1), "pad": (10, 2)}),
    "lb4_backend": (12, {"address": (0, 4), "port": (4, 2), "proto": (6, 1), "flags": (7, 1),
                         "cluster_id": (8, 2), "zone": (10, 1), "pad": (11, 1)}),
    "lb4_reverse_nat": (6, {"address": (0, 4), "port": (4, 2)}),
    "lb4_affinity_key": (16, {"client_id": (0, 8), "rev_nat_id": (8, 2), "netns_cookie": (10, 1),
                              "pad1": (11, 1), "pad2": (12, 4)}),
    "lb_affinity_val": (16, {"last_used": (0, 8), "backend_id": (8, 4), "pad": (12, 4)}),
    # bpf/lib/common.h:1138-1142@82999990
    "lb_affinity_match": (8, {"backend_id": (0, 4), "rev_nat_id": (4, 2), "pad": (6, 2)}),
    "ipv4_revnat_tuple": (16, {"cookie": (0, 8), "address": (8, 4), "port": (12, 2), "pad": (14, 2)}),
    "ipv4_revnat_entry": (8, {"address": (0, 4), "port": (4, 2), "rev_nat_index": (6, 2)}),
}


def _tool(name: str, fallback: str) -> str:
    path = shutil.which(name) or (fallback if os.access(fallback, os.X_OK) else None)
    if path is None:
        reason = f"{name} not found (install clang and bpftool: make provision-dev)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def _include_dirs() -> list[str]:
    dirs = ["/usr/include", f"/usr/include/{platform.machine()}-linux-gnu"]
    return [f"-I{d}" for d in dirs if os.path.isdir(d)]


@pytest.fixture(scope="module")
def btf(tmp_path_factory) -> dict:
    """``{struct name: BTF struct}`` plus ``_types`` (id → type) from a compiled object."""
    clang = _tool("clang", "/usr/bin/clang")
    bpftool = _tool("bpftool", "/usr/sbin/bpftool")
    d = tmp_path_factory.mktemp("btf")
    src = d / "layout.c"
    lines = ["#include <linux/types.h>"]
    lines += [f'#include "{BPF_LIB / h}"' for h in HEADERS]
    lines += [f"struct {c_name} lk_layout_{c_name};" for c_name in dict.fromkeys(c for _, c in PAIRS)]
    lines += [f"struct {c_name} lk_layout_{c_name};" for c_name in POLICY_LAYOUT]
    src.write_text("\n".join(lines) + "\n")
    obj = d / "layout.o"
    cc = subprocess.run(
        [clang, "-target", "bpf", "-O2", "-g", "-c", str(src), "-o", str(obj), *_include_dirs()],
        capture_output=True,
        text=True,
    )
    assert cc.returncode == 0, f"clang failed:\n{cc.stderr}"
    dump = subprocess.run([bpftool, "btf", "dump", "file", str(obj), "-j"], capture_output=True, text=True)
    assert dump.returncode == 0, f"bpftool failed:\n{dump.stderr}"
    types = {t["id"]: t for t in json.loads(dump.stdout)["types"]}
    out = {t["name"]: t for t in types.values() if t["kind"] == "STRUCT"}
    out["_types"] = types
    return out


def _resolve(types: dict, type_id: int) -> dict:
    t = types[type_id]
    while t["kind"] in ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG"):
        t = types[t["type_id"]]
    return t


def _size(types: dict, type_id: int) -> int:
    t = _resolve(types, type_id)
    if t["kind"] == "ARRAY":
        return t["nr_elems"] * _size(types, t["type_id"])
    if t["kind"] == "PTR":
        return 8
    return t["size"]


def _c_members(btf: dict, c_name: str) -> dict[str, tuple[int, int]]:
    types = btf["_types"]
    struct = btf[c_name]
    out = {}
    for m in struct["members"]:
        assert "bitfield_size" not in m or not m["bitfield_size"], f"{c_name}.{m['name']} is a bitfield"
        assert m["bits_offset"] % 8 == 0, f"{c_name}.{m['name']} is not byte aligned"
        out[m["name"]] = (m["bits_offset"] // 8, _size(types, m["type_id"]))
    return out


def _py_members(cls) -> dict[str, tuple[int, int]]:
    renames = RENAMES.get(cls.__name__, {})
    out = {}
    for name, _ctype in cls._fields_:
        desc = getattr(cls, name)
        out[renames.get(name, name)] = (desc.offset, desc.size)
    return out


@pytest.mark.parametrize("cls,c_name", PAIRS, ids=IDS)
def test_python_mirror_matches_btf_layout(btf, cls, c_name):
    """Each ctypes mirror has the C struct's size and every member at the same offset with the same size."""
    assert c_name in btf, f"struct {c_name} missing from BTF of the compiled headers"
    assert ctypes.sizeof(cls) == btf[c_name]["size"], f"sizeof {cls.__name__} vs struct {c_name}"
    assert _py_members(cls) == _c_members(btf, c_name)
    # member order is part of the layout too
    assert [m["name"] for m in btf[c_name]["members"]] == list(_py_members(cls))


@pytest.mark.parametrize("cls,c_name", PAIRS, ids=IDS)
def test_python_mirror_matches_btf_types(btf, cls, c_name):
    """Integer members agree in signedness, nested structs map to their mirror and arrays to ctypes arrays."""
    types = btf["_types"]
    by_c = {c: p for p, c in reversed(PAIRS)}  # a struct's first mirror
    py_types = {RENAMES.get(cls.__name__, {}).get(n, n): t for n, t in cls._fields_}
    checked = 0
    for m in btf[c_name]["members"]:
        t = _resolve(types, m["type_id"])
        py = py_types[m["name"]]
        if t["kind"] == "INT":
            signed = "SIGNED" in t.get("encoding", "")
            assert py in (_SIGNED_CTYPES if signed else _UNSIGNED_CTYPES), f"{c_name}.{m['name']}: signedness"
        elif t["kind"] == "STRUCT":
            assert py is by_c[t["name"]], f"{c_name}.{m['name']}: expected the mirror of struct {t['name']}"
        elif t["kind"] == "ARRAY":
            assert issubclass(py, ctypes.Array) and py._length_ == t["nr_elems"], f"{c_name}.{m['name']}"
        else:  # pragma: no cover - a new kind of member would need a rule here
            pytest.fail(f"{c_name}.{m['name']}: unexpected BTF kind {t['kind']}")
        checked += 1
    assert checked == len(cls._fields_)


def test_btf_ct_structs_have_cilium_layout(btf):
    """The compiled ipv4_ct_tuple is 14 packed bytes and ct_entry 56 bytes, members where Cilium v1.16 has them."""
    assert btf["ipv4_ct_tuple"]["size"] == 14
    assert btf["ct_entry"]["size"] == 56
    assert _c_members(btf, "ipv4_ct_tuple") == CILIUM_CT_TUPLE
    assert _c_members(btf, "ct_entry") == CILIUM_CT_ENTRY


def test_btf_nat_entry_has_cilium_layout(btf):
    """The compiled ipv4_nat_entry is 40 bytes with to_addr at 32 and to_port at 36, as Cilium v1.16 has them."""
    assert btf["ipv4_nat_entry"]["size"] == 40
    assert _c_members(btf, "ipv4_nat_entry") == CILIUM_NAT_ENTRY


def test_python_nat_mirrors_have_cilium_layout():
    """NatKey4 is the 14-byte CT tuple and NatEntry Cilium's 40-byte ipv4_nat_entry, even without clang."""
    def layout(cls):
        return {n: (getattr(cls, n).offset, getattr(cls, n).size) for n, _ in cls._fields_}

    assert ctypes.sizeof(nat.NatKey4) == 14 and nat.NatKey4._fields_ == ct.CtKey4._fields_
    assert layout(nat.NatKey4) == CILIUM_CT_TUPLE
    assert ctypes.sizeof(nat.NatEntry) == 40
    assert layout(nat.NatEntry) == CILIUM_NAT_ENTRY


@pytest.mark.parametrize("c_name", list(CILIUM_LB))
def test_btf_lb_structs_have_cilium_layout(btf, c_name):
    """The compiled service map structs have Cilium v1.16's sizes (12/12/12/6/16/16/16/8) and member offsets."""
    size, members = CILIUM_LB[c_name]
    assert btf[c_name]["size"] == size
    assert _c_members(btf, c_name) == members


def test_python_ct_mirrors_have_cilium_layout():
    """CtKey4/CtEntry have Cilium's sizes and offsets (flag word at 36, rev_nat at 38) even without clang."""
    assert ctypes.sizeof(ct.CtKey4) == 14
    assert ctypes.sizeof(ct.CtEntry) == 56
    assert {n: (getattr(ct.CtKey4, n).offset, getattr(ct.CtKey4, n).size) for n, _ in ct.CtKey4._fields_} == CILIUM_CT_TUPLE
    assert {n: (getattr(ct.CtEntry, n).offset, getattr(ct.CtEntry, n).size) for n, _ in ct.CtEntry._fields_} == CILIUM_CT_ENTRY
    assert ct.CtEntry.flags.offset == 36 and ct.CtEntry.rev_nat_index.offset == 38


def test_python_mirror_sizes_match_docstrings():
    """The byte sizes the eps/config/trace docstrings promise are the ctypes sizes (EndpointInfo: next test)."""
    expected = {
        eps.EndpointKey: 20,  # 4 + 3*4 + 1 + 1 + 2, packed
        eps.IpcacheKey: 24,  # 4+2+1+1+4+3*4, packed
        eps.RemoteEndpointInfo: 12,  # 4+4+2+1+1
        mconfig.LabConfig: 16,  # 4*4
        trace.TraceTuple: 16,  # 4+4+2+2+4*1
        trace.TraceEvent: 104,  # 8+4+4+4*1+2+2+4+4*1+4+4+3*16+2+2+1+1+2+4+4
    }
    assert {c: ctypes.sizeof(c) for c in expected} == expected


def test_endpoint_info_has_cilium_layout():
    """EndpointInfo is Cilium's 48-byte endpoint_info: mac_t is a __u64, so mac sits at 16, node_mac 24, sec_id 32."""
    # Cilium: u32 ifindex @0, u16 unused @4, u16 lxc_id @6, u32 flags @8, mac_t mac (u64, 8-aligned) @16,
    # mac_t node_mac @24, u32 sec_id @32, u32 pad[3] @36..48 (the eps.py docstring also says 48 bytes).
    offsets = {n: getattr(eps.EndpointInfo, n).offset for n, _ in eps.EndpointInfo._fields_}
    assert (offsets["ifindex"], offsets["lxc_id"], offsets["flags"]) == (0, 6, 8)
    assert (offsets["mac"], offsets["node_mac"], offsets["sec_id"]) == (16, 24, 32)
    assert ctypes.sizeof(eps.EndpointInfo) == 48


# Cilium v1.16 (bpf/lib/common.h): struct policy_key (12 B, egress:1 pad:7 in one byte) and struct
# policy_entry (24 B, deny:1 wildcard_protocol:1 wildcard_dport:1 pad:5 in one byte), member → (bit offset, bits).
# labkit/maps/policy.py reads each bitfield byte whole (PolicyKey.egress, PolicyEntry.flag_bits).
POLICY_LAYOUT = {
    "policy_key": (12, {"prefixlen": (0, 32), "sec_label": (32, 32), "egress": (64, 1), "pad": (65, 7),
                        "protocol": (72, 8), "dport": (80, 16)}),
    "policy_entry": (24, {"proxy_port": (0, 16), "deny": (16, 1), "wildcard_protocol": (17, 1),
                          "wildcard_dport": (18, 1), "pad": (19, 5), "auth_type": (24, 8), "pad1": (32, 16),
                          "pad2": (48, 16), "packets": (64, 64), "bytes": (128, 64)}),
}


@pytest.mark.parametrize("c_name", POLICY_LAYOUT)
def test_policy_structs_have_cilium_layout(btf, c_name):
    """policy_key and policy_entry have v1.16's size and every member (bitfields too) at v1.16's bits."""
    size, want = POLICY_LAYOUT[c_name]
    types = btf["_types"]
    struct = btf[c_name]
    got = {m["name"]: (m["bits_offset"], m.get("bitfield_size") or _size(types, m["type_id"]) * 8)
           for m in struct["members"]}
    assert (struct["size"], got) == (size, want)


def test_policy_mirrors_match_the_layout():
    """PolicyKey and PolicyEntry put their fields at the C structs' bytes: the bitfield bytes read whole."""
    from labkit.maps.policy import PolicyEntry, PolicyKey

    key = {n: (getattr(PolicyKey, n).offset * 8, getattr(PolicyKey, n).size * 8) for n, _ in PolicyKey._fields_}
    assert ctypes.sizeof(PolicyKey) == 12 and key == {"prefixlen": (0, 32), "sec_label": (32, 32),
                                                      "egress": (64, 8), "protocol": (72, 8), "dport_be": (80, 16)}
    entry = {n: (getattr(PolicyEntry, n).offset * 8, getattr(PolicyEntry, n).size * 8) for n, _ in PolicyEntry._fields_}
    assert ctypes.sizeof(PolicyEntry) == 24 and entry == {
        "proxy_port_be": (0, 16), "flag_bits": (16, 8), "auth_type": (24, 8), "pad1": (32, 16), "pad2": (48, 16),
        "packets": (64, 64), "bytes": (128, 64)}


# Cilium 1.4-1.13 (bpf/sockops/bpf_sockops.h:7-31@c9723a8d, v1.13.0; gone at v1.16.0): struct sock_key, __packed,
# 44 bytes; each IPv4 address is the first word of a union with an IPv6 address (sip6, dip6), the rest of the
# 16 bytes padding; after family come pad7 and pad8, no protocol.
CILIUM_SOCK_KEY = {"sip4": (0, 4), "pad1": (4, 4), "pad2": (8, 4), "pad3": (12, 4), "dip4": (16, 4), "pad4": (20, 4),
                   "pad5": (24, 4), "pad6": (28, 4), "family": (32, 1), "pad7": (33, 1), "pad8": (34, 2),
                   "sport": (36, 4), "dport": (40, 4)}


def test_sock_key_mirror_has_cilium_layout():
    """labkit.maps.sockmap.SockKey is Cilium's packed 44-byte struct sock_key, member for member."""
    assert ctypes.sizeof(sockmap.SockKey) == 44
    got = {name: (getattr(sockmap.SockKey, name).offset, getattr(sockmap.SockKey, name).size)
           for name, _ in sockmap.SockKey._fields_}
    assert got == CILIUM_SOCK_KEY
