"""Every number the BPF headers #define has the same value in its Python mirror."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit import config as labconfig
from labkit import constants
from labkit.constants import DropReason, Hook, PolicyMatch, TraceFlags, Verdict
from labkit.maps import config as mconfig
from labkit.maps import ct, eps, lb, nat
from labkit.observe.hubble import OBS_POINTS
from labkit.observe.trace import Report

BPF_LIB = Path(__file__).resolve().parents[2] / "bpf" / "lib"
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+(-?(?:0[xX][0-9a-fA-F]+|\d+))\b", re.M)


def defines(header: str) -> dict[str, int]:
    """``{NAME: value}`` of the object-like, integer-valued macros of a header."""
    return {m[1]: int(m[2], 0) for m in _DEFINE.finditer((BPF_LIB / header).read_text())}


def group(header: str, prefix: str, exclude: tuple[str, ...] = ()) -> dict[str, int]:
    """Macros of ``header`` starting with ``prefix``, keyed by the rest of the name."""
    out = {k[len(prefix):]: v for k, v in defines(header).items() if k.startswith(prefix) and k not in exclude}
    assert out, f"no {prefix}* macros parsed from {header}"
    return out


def members(enum_cls) -> dict[str, int]:
    """``{name: value}`` of an enum's canonical members (OUT=0 included)."""
    return {m.name: int(m.value) for m in enum_cls.__members__.values()}


def test_parser_reads_known_values():
    """The #define parser itself reads hex, decimal and negative values (sanity check of the test tool)."""
    ctd = defines("ct_types.h")
    assert ctd["CT_NONE"] == 255 and ctd["CT_F_FROM_TUNNEL"] == 1024
    assert defines("trace_types.h")["DROP_NO_SERVICE"] == -158
    assert "LABKIT_CT_TYPES_H" not in ctd  # header guards have no value
    assert defines("nat_types.h")["NAT_MAP_SIZE"] == 524288  # a default inside #ifndef is read too


def test_hooks():
    """Hook mirrors HOOK_* both ways."""
    assert members(Hook) == group("trace_types.h", "HOOK_")


def test_verdicts():
    """Verdict mirrors VERDICT_* both ways."""
    assert members(Verdict) == group("trace_types.h", "VERDICT_")


def test_drop_reasons():
    """Every C DROP_* has a DropReason member with the same (negative) value, and vice versa."""
    assert members(DropReason) == group("trace_types.h", "DROP_")


def test_trace_modes():
    """TraceMode mirrors TRACE_* both ways."""
    assert members(mconfig.TraceMode) == group("trace_types.h", "TRACE_", exclude=tuple(
        n for n in defines("trace_types.h") if n.startswith(("TRACE_F_", "TRACE_AGGREGATE_"))))


def test_monitor_aggregation_levels():
    """MonitorAggregation mirrors MONITOR_AGG_* both ways, and the thresholds are Cilium's (trace.h)."""
    assert members(mconfig.MonitorAggregation) == group("trace_types.h", "MONITOR_AGG_")
    assert group("trace_types.h", "TRACE_AGGREGATE_") == {"RX": 1, "ACTIVE_CT": 3}


def test_report_bits():
    """Report mirrors REPORT_* both ways."""
    assert members(Report) == group("trace_types.h", "REPORT_")


def test_observation_points():
    """Every OBS_* is Cilium's trace_point number with the Hubble name labkit prints for it."""
    names = {"TO_LXC": "TO_ENDPOINT", "FROM_LXC": "FROM_ENDPOINT"}
    for name, value in group("trace_types.h", "OBS_").items():
        assert OBS_POINTS[value][0] == names.get(name, name)


def test_trace_flags():
    """TraceFlags mirrors TRACE_F_* both ways."""
    assert members(TraceFlags) == group("trace_types.h", "TRACE_F_")


def test_tuple_flags():
    """TupleFlags mirrors TUPLE_F_* both ways (OUT is 0)."""
    assert members(ct.TupleFlags) == group("ct_types.h", "TUPLE_F_")


C_DIRS = ("CT_EGRESS", "CT_INGRESS", "CT_SERVICE")


def test_ct_dirs():
    """CtDir mirrors CT_EGRESS/CT_INGRESS/CT_SERVICE."""
    c = defines("ct_types.h")
    assert members(ct.CtDir) == {name[len("CT_"):]: c[name] for name in C_DIRS}


def test_ct_results():
    """CtResult mirrors every other plain CT_* macro (CT_NEW..CT_RELATED and CT_NONE), both ways."""
    c = {k: v for k, v in group("ct_types.h", "CT_").items() if not k.startswith("F_") and f"CT_{k}" not in C_DIRS}
    assert set(c) >= {"NEW", "ESTABLISHED", "REPLY", "RELATED", "NONE"}
    assert members(ct.CtResult) == c


def test_ct_flags():
    """CtFlags mirrors CT_F_* both ways, except CT_F_RESERVED9 which Python leaves out on purpose."""
    assert members(ct.CtFlags) == group("ct_types.h", "CT_F_", exclude=("CT_F_RESERVED9",))
    assert "RESERVED9" not in ct.CtFlags.__members__


def test_faults():
    """Fault mirrors FAULT_* both ways."""
    assert members(mconfig.Fault) == group("config_types.h", "FAULT_")


@pytest.mark.parametrize("prefix", ["IDENTITY_", "IPCACHE_F_", "ENDPOINT_KEY_"])
def test_eps_constants(prefix):
    """labkit.maps.eps exports each IDENTITY_*, IPCACHE_F_* and ENDPOINT_KEY_* macro under its C name and value."""
    c = {prefix + k: v for k, v in group("eps_types.h", prefix).items()}
    py = {name: getattr(eps, name) for name in eps.__all__ if name.startswith(prefix)}
    assert py == c


def test_ipcache_prefix_len():
    """IpcacheKey.for_ip counts prefix bits as IPCACHE_PREFIX_LEN(p) does."""
    m = re.search(r"#define\s+IPCACHE_PREFIX_LEN\(p\)\s+\((\d+)\s*\+\s*\(p\)\)", (BPF_LIB / "eps_types.h").read_text())
    assert m, "IPCACHE_PREFIX_LEN(p) not found in eps_types.h"
    base = int(m[1])
    for p in (0, 16, 24, 32):
        assert eps.IpcacheKey.for_ip("198.18.0.0", p).prefixlen == base + p


def test_vxlan_port_is_cilium_default():
    """The tunnel port is Cilium's default VXLAN port, 8472."""
    assert labconfig.VXLAN_PORT == 8472


def test_service_flags():
    """ServiceFlags mirrors the SVC_FLAG_* of lb4_service.flags and ServiceFlags2 those of flags2, both ways."""
    text = (BPF_LIB / "lb_types.h").read_text()
    first, second = text.split("lb4_service.flags2", 1)
    both = group("lb_types.h", "SVC_FLAG_")
    in_first = {m[1][len("SVC_FLAG_"):] for m in _DEFINE.finditer(first) if m[1].startswith("SVC_FLAG_")}
    assert members(lb.ServiceFlags) == {k: v for k, v in both.items() if k in in_first}
    assert members(lb.ServiceFlags2) == {k: v for k, v in both.items() if k not in in_first}


def test_backend_states():
    """BackendState mirrors BE_STATE_* both ways."""
    assert members(lb.BackendState) == group("lb_types.h", "BE_STATE_")


def test_lookup_scopes():
    """LookupScope mirrors LB_LOOKUP_SCOPE_* both ways."""
    assert members(lb.LookupScope) == group("lb_types.h", "LB_LOOKUP_SCOPE_")


def test_nat_dirs():
    """NatDir mirrors NAT_DIR_* both ways, and EGRESS/INGRESS are TUPLE_F_OUT/TUPLE_F_IN."""
    assert members(nat.NatDir) == group("nat_types.h", "NAT_DIR_")
    flags = group("ct_types.h", "TUPLE_F_")
    assert (nat.NatDir.EGRESS, nat.NatDir.INGRESS) == (flags["OUT"], flags["IN"])


def test_nat_map_size():
    """NAT_MAP_SIZE is the same in nat_types.h and labkit.maps.nat: Cilium's --bpf-nat-global-max default."""
    assert defines("nat_types.h")["NAT_MAP_SIZE"] == nat.NAT_MAP_SIZE == 524288


def test_policy_match_types():
    """PolicyMatch mirrors POLICY_MATCH_* of policy_types.h (Cilium v1.16's values) both ways."""
    assert members(PolicyMatch) == group("policy_types.h", "POLICY_MATCH_")


def test_policy_directions():
    """POLICY_INGRESS/EGRESS are 1 and 2 in C and Python (Cilium's policy verdict notification values)."""
    c = defines("policy_types.h")
    assert (c["POLICY_INGRESS"], c["POLICY_EGRESS"]) == (constants.POLICY_INGRESS, constants.POLICY_EGRESS) == (1, 2)


def test_policy_verdict_bits():
    """The POLICY_V_* layout of the trace record's policy byte is the same in trace_types.h and constants.py."""
    c = group("trace_types.h", "POLICY_V_")
    assert c == {name[len("POLICY_V_"):]: getattr(constants, name) for name in dir(constants)
                 if name.startswith("POLICY_V_")}


def test_policy_drop_reasons_are_cilium_numbers():
    """DROP_POLICY is -133 and DROP_POLICY_DENY -181, as in Cilium v1.16's bpf/lib/common.h."""
    assert (DropReason.POLICY, DropReason.POLICY_DENY) == (-133, -181)
    assert (DropReason.text(-133), DropReason.text(-181)) == ("Policy denied", "Policy denied by denylist")
