"""The peer tier itself: every Cilium test file of the families labkit has is translated or declared, and the
header model the translations use (peer.py) reproduces each of Cilium's checksum constants from Cilium's own
addresses — so the same model with the lab's addresses is what Cilium's CHECK asserts, translated.

No root needed: these tests read this package's sources and, when the Cilium mirror is on the machine, the tag.
"""
from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from .. import packets
from . import CILIUM_COMMIT, DECLARED, DECLARED_CHECKS, FAMILIES
from .peer import (CILIUM as C, DEFAULT_DATA, XDP_REQUESTS_ONLY, dsr_option, icmp_port_unreachable, ip_header,
                   l3_check, lab_difference)

HERE = Path(__file__).parent
MIRROR = Path("/work/.mirror/cybozu-go+cilium/repo")
#: Names of bpf/tests files that belong to a family labkit has (see FAMILIES).
FAMILY_PATTERN = re.compile(r"nodeport|_lb[46]_|hairpin|conntrack|ct_tests|nat_tests|affinity|terminating|^xdp_|l4lb|"
                            r"socket_lb|wildcard")


def _citations() -> dict[str, set[int]]:
    """``bpf/tests/<file>:<line>[-<line>][, <line>-<line>...]`` citations in this package's test modules: file →
    every line they name (a range counts each of its lines)."""
    cited: dict[str, set[int]] = {}
    for path in HERE.glob("test_*.py"):
        if path.name == "test_tier.py":
            continue
        text = re.sub(r"\s+", " ", path.read_text())
        for name, spans in re.findall(r"bpf/tests/([\w.]+\.c):((?:\d+(?:-\d+)?(?:, )?)+)", text):
            lines = cited.setdefault(name, set())
            for span in re.findall(r"(\d+)(?:-(\d+))?", spans):
                first = int(span[0])
                lines.update(range(first, int(span[1] or first) + 1))
    return cited


def _tag_file(name: str) -> str:
    return subprocess.run(["git", "-C", str(MIRROR), "show", f"{CILIUM_COMMIT}:bpf/tests/{name}"],
                          capture_output=True, text=True, check=True).stdout


def test_every_family_file_translated_or_declared():
    """Each Cilium test file of the chosen families is cited by a translation or declared with a reason, not both."""
    cited = _citations()
    files = [f for group in FAMILIES.values() for f in group]
    assert len(files) == len(set(files)), "a file in two families"
    missing = [f for f in files if f not in cited and f not in DECLARED]
    assert not missing, f"neither translated nor declared: {missing}"
    both = [f for f in files if f in cited and f in DECLARED]
    assert not both, f"translated and declared: {both}"
    assert set(DECLARED) <= set(files) and all(DECLARED.values())
    stray = set(cited) - set(files) - {"pktgen.h"}
    assert not stray, f"cited but in no family: {stray}"
    for check, reason in DECLARED_CHECKS.items():
        name = check.split(":")[0]
        assert name in cited and reason, check


def test_families_are_complete_at_the_tag():
    """Every bpf/tests file at v1.16.0 whose name says it belongs to one of these families is listed in FAMILIES."""
    if not (MIRROR / "HEAD").exists():
        pytest.skip(f"the Cilium mirror is not on this machine ({MIRROR})")
    names = subprocess.run(["git", "-C", str(MIRROR), "ls-tree", "--name-only", f"{CILIUM_COMMIT}:bpf/tests/"],
                           capture_output=True, text=True, check=True).stdout.split()
    at_tag = {n for n in names if n.endswith(".c") and FAMILY_PATTERN.search(n)}
    listed = {f for group in FAMILIES.values() for f in group}
    assert at_tag - listed == set(), "family files at the tag not in FAMILIES"
    assert listed - set(names) == set(), "FAMILIES names files the tag does not have"


def test_every_check_of_a_translated_file_translated_or_declared():
    """Each CHECK of a translated file at the tag is cited (a cited line falls between it and the next CHECK) or is
    in DECLARED_CHECKS."""
    if not (MIRROR / "HEAD").exists():
        pytest.skip(f"the Cilium mirror is not on this machine ({MIRROR})")
    cited = _citations()
    missing = []
    for name in sorted(cited):
        if name == "pktgen.h":
            continue
        lines = _tag_file(name).splitlines()
        checks = [i + 1 for i, line in enumerate(lines) if line.startswith("CHECK(")]
        assert checks, name
        for first, end in zip(checks, checks[1:] + [len(lines) + 1]):
            if f"{name}:{first}" in DECLARED_CHECKS:
                continue
            if not any(first <= line < end for line in cited[name]):
                missing.append(f"{name}:{first} {lines[first - 1]}")
    assert not missing, "CHECKs neither translated nor declared:\n" + "\n".join(missing)


def _opt(svc: str) -> bytes:
    return dsr_option(C[svc], 80)


#: (what, the header the CHECK expects rebuilt from Cilium's addresses, Cilium's constant, where)
CONSTANTS = [
    ("DSR request at the LB, TTL 63", ip_header(C["v4_ext_one"], C["v4_pod_two"], ttl=63, options=_opt("v4_svc_two")),
     0x434A, "tc_nodeport_lb4_dsr_lb.c:179"),
    ("DSR request at the backend's node (pktgen's 20-byte sum), TTL 63",
     ip_header(C["v4_ext_one"], C["v4_pod_one"], ttl=63, options=_opt("v4_svc_one"), csum_options=False),
     0x400A, "tc_nodeport_lb4_dsr_backend.c:230"),
    ("DSR reply, TTL 64", ip_header(C["v4_svc_one"], C["v4_ext_one"]), 0x4BAA, "tc_nodeport_lb4_dsr_backend.c:350"),
    ("DSR request from a second client, TTL 63",
     ip_header(C["v4_ext_two"], C["v4_pod_one"], ttl=63, options=_opt("v4_svc_one"), csum_options=False),
     0x3509, "tc_nodeport_lb4_dsr_backend.c:499"),
    ("NodePort to a local backend, TTL 63", ip_header(C["v4_ext_one"], C["v4_pod_one"], ttl=63), 0x4212,
     "tc_nodeport_lb4_nat_lb.c:243"),
    ("its reply, TTL 64", ip_header(C["v4_svc_one"], C["v4_ext_one"]), 0x4BAA, "tc_nodeport_lb4_nat_lb.c:336"),
    ("UDP to a local backend, TTL 63", ip_header(C["v4_ext_one"], C["v4_pod_one"], proto=17, ttl=63), 0x4213,
     "tc_nodeport_lb4_nat_lb.c:628"),
    ("SNAT to a remote backend, TTL 63", ip_header(C["v4_node_one"], C["v4_pod_two"], ttl=63), 0xA711,
     "tc_nodeport_lb4_nat_lb.c:733"),
    ("SNATed request at the backend's node, TTL 63", ip_header(C["v4_node_one"], C["v4_pod_one"], ttl=63), 0xA712,
     "tc_nodeport_lb4_nat_backend.c:156"),
    ("UDP to a local backend that is terminating, TTL 63",
     ip_header(C["v4_ext_one"], C["v4_pod_one"], proto=17, ttl=63), 0x4213,
     "tc_nodeport_lb_terminating_backend.c:185"),
    ("XDP to a local backend, passed up, TTL 64", ip_header(C["v4_ext_one"], C["v4_pod_one"]), 0x4112,
     "xdp_nodeport_lb4_nat_lb.c:207"),
    ("XDP SNAT to a remote backend, TTL 63", ip_header(C["v4_node_one"], C["v4_pod_two"], ttl=63), 0xA711,
     "xdp_nodeport_lb4_nat_lb.c:312"),
    ("XDP at the backend's node, passed up, TTL 64", ip_header(C["v4_node_one"], C["v4_pod_one"]), 0xA612,
     "xdp_nodeport_lb4_nat_backend.c:157"),
    ("XDP DSR request at the LB, TTL 63",
     ip_header(C["v4_ext_one"], C["v4_pod_two"], ttl=63, options=_opt("v4_svc_two")), 0x434A,
     "xdp_nodeport_lb4_dsr_lb.c:176"),
    ("hairpin request delivered to the pod, TTL 63", ip_header(C["IPV4_LOOPBACK"], C["v4_pod_one"], ttl=63),
     -0x4F02 & 0xFFFF, "tc_nodeport_test.c:151"),
    ("hairpin request at the pod's ingress, TTL 64", ip_header(C["IPV4_LOOPBACK"], C["v4_pod_one"]),
     -0x5002 & 0xFFFF, "tc_nodeport_test.c:276"),
    ("hairpin reply at the pod's ingress, reverse-NATed, TTL 64", ip_header(C["v4_svc_one"], C["v4_pod_one"]),
     0x402, "tc_nodeport_test.c:474"),
]


@pytest.mark.parametrize("what, header, constant, where", CONSTANTS, ids=[c[3] for c in CONSTANTS])
def test_header_model_reproduces_cilium_constant(what, header, constant, where):
    """The header rebuilt from Cilium's addresses and the TTL the scenario implies has the CHECK's checksum."""
    assert l3_check(header) == constant, f"{where}: {what}"


def test_icmp_model_reproduces_cilium_constants():
    """The no-backend ICMP reply rebuilt from pktgen's packet has Cilium's IP and ICMP checksums
    (tc_nodeport_lb4_no_backend.c:136 0x4b8e and :150 0x2de7, the same in tc_lxc_lb4_no_backend.c:132,146)."""
    # pktgen leaves the TCP checksum 0 (pktgen.h:930-965 never sets it), so the sample carries 0 there
    seg = struct.pack("!HH", 111, 80) + struct.pack("<I", 123456) + struct.pack("!IBBHHH", 0, 5 << 4, 2, 65535, 0, 0)
    frame = packets.eth(packets.ipv4(C["v4_ext_one"], C["v4_svc_two"], 6, seg + DEFAULT_DATA, ident=0))
    reply = icmp_port_unreachable(frame, C["v4_svc_two"], C["v4_ext_one"])
    assert l3_check(reply) == 0x4B8E
    assert struct.unpack_from("!H", reply, 22)[0] == 0x2DE7


def test_declarations_rest_on_lab_differences():
    """The declared XDP reply CHECKs and the DSR Geneve file rest on entries LAB_DIFFERENCES still has."""
    assert "LAB_DIFFERENCES" in DECLARED_CHECKS["xdp_nodeport_lb4_nat_lb.c:435"]
    lab_difference(XDP_REQUESTS_ONLY)
    assert "LAB_DIFFERENCES" in DECLARED["nodeport_geneve_dsr_lb_xdp.c"]
    lab_difference("dsr dispatch is the IPv4 option")
