"""One node's BPF build: its macros, its programs and the pasted translation unit."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.config import CtTimeouts, DatapathConfig
from labkit.datapath.source import MAP_NAMES, POLICY_MAP_NAMES, PROGRAMS, SOCKMAP_ATTACH, SOCKMAP_MAP_NAMES, node_build
from labkit.maglev import FLOW_HASH_SEED
from labkit.net.topology import Topology

BPF = Path(__file__).resolve().parents[2] / "bpf"
TUNNEL_FUNCS = {"cil_from_container", "cil_to_container", "cil_from_netdev", "cil_to_netdev", "cil_from_overlay", "cil_to_overlay"}
OVERLAY_FUNCS = {"cil_from_overlay", "cil_to_overlay"}
SOCK_FUNCS = {"cil_sock4_connect", "cil_sock4_sendmsg", "cil_sock4_recvmsg", "cil_sock4_getpeername"}
# 169.254.42.1 as the kernel holds it (network byte order) read as a little-endian u32
LOOPBACK_MACRO = (169 | 254 << 8 | 42 << 16 | 1 << 24)
_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"')
_SYSTEM_INCLUDE = re.compile(r"^\s*#\s*include\s+<([^>]+)>")


@pytest.fixture
def topo() -> Topology:
    return Topology.default("demo")


def test_tunnel_macros(topo):
    """Tunnel mode: NODE_ID from the node, ROUTING_TUNNEL=1, the vxlan ifindex, map sizes, port and lifetimes."""
    cfg = DatapathConfig(timeouts=CtTimeouts(syn=7), ct_tcp_size=4096, ct_any_size=2048)
    b = node_build(topo, cfg, "node-b", vxlan_ifindex=42)
    assert b.node == "node-b"
    assert b.macros == {
        "NODE_ID": 2,
        "NODE_IP": int.from_bytes(bytes([198, 51, 100, 12]), "little"),
        "NATIVE_DEV_IFINDEX": 0,
        "LB_MODE": 1,  # dsr
        "LB_MAGLEV_LUT_SIZE": 16381,  # DatapathConfig.maglev_table_size: Cilium's default
        "LB_FLOW_HASH_SEED": FLOW_HASH_SEED,
        "ROUTING_TUNNEL": 1,
        "VXLAN_IFINDEX": 42,
        "VXLAN_PORT": 8472,
        "LB_LOOPBACK_IPV4": LOOPBACK_MACRO,
        "EVENTS_RING_PAGES": 256,  # DatapathConfig.events_ring_pages: 1 MiB per node
        "CT_MAP_SIZE_TCP": 4096,
        "CT_MAP_SIZE_ANY": 2048,
        "LB_MAP_SIZE": 65536,
        "CT_CONNECTION_LIFETIME_TCP": 8000,
        "CT_CONNECTION_LIFETIME_NONTCP": 60,
        "CT_SERVICE_LIFETIME_TCP": 8000,
        "CT_SERVICE_LIFETIME_NONTCP": 60,
        "CT_SERVICE_CLOSE_REBALANCE": 60,
        "CT_SYN_TIMEOUT": 7,
        "CT_CLOSE_TIMEOUT": 10,
        "CILIUM_SVC_CLOSE_BOTH": 1,  # the 1.16 profile's one release behaviour (labkit/release.py)
        "ENABLE_POLICY": 1,  # policy mode 'default', a node's: policy code compiled in
    }


def test_native_macros(topo):
    """Native routing: no ROUTING_TUNNEL and no VXLAN_IFINDEX macro, the rest as in tunnel mode."""
    b = node_build(topo, DatapathConfig(routing="native"), "node-a")
    assert "ROUTING_TUNNEL" not in b.macros and "VXLAN_IFINDEX" not in b.macros
    assert b.macros["NODE_ID"] == 1
    assert b.macros["CT_MAP_SIZE_TCP"] == 524288 and b.macros["CT_MAP_SIZE_ANY"] == 262144


def test_cflags(topo):
    """cflags() is -I<bpf dir> then one sorted -DNAME=value per macro."""
    b = node_build(topo, DatapathConfig(), "node-a", vxlan_ifindex=3)
    flags = b.cflags()
    assert flags[0].startswith("-I")
    assert flags[1:] == [f"-D{k}={v}" for k, v in sorted(b.macros.items())]


@pytest.mark.parametrize("vxlan_ifindex", [0, -1])
def test_tunnel_without_vxlan_ifindex_raises(topo, vxlan_ifindex):
    """Tunnel mode needs the cilium_vxlan ifindex; without one the build raises ValueError naming the node."""
    with pytest.raises(ValueError) as info:
        node_build(topo, DatapathConfig(), "node-a", vxlan_ifindex=vxlan_ifindex)
    assert "node-a" in str(info.value)


def test_unknown_node_raises(topo):
    """Building an unknown node raises LookupError."""
    with pytest.raises(LookupError):
        node_build(topo, DatapathConfig(routing="native"), "node-z")


def test_programs_tunnel(topo):
    """Tunnel mode attaches the six tc programs (overlay ones on the overlay device) and, with socket LB, the
    four cgroup programs, compiled from four files."""
    b = node_build(topo, DatapathConfig(), "node-a", vxlan_ifindex=9)
    assert {p.function for p in b.programs} == TUNNEL_FUNCS | SOCK_FUNCS
    assert {p.function for p in b.programs if p.device == "overlay"} == OVERLAY_FUNCS
    assert {p.function for p in b.programs if p.device == "cgroup"} == SOCK_FUNCS
    assert set(b.files) == {"bpf_lxc.c", "bpf_host.c", "bpf_overlay.c", "bpf_sock.c"}
    assert len(b.files) == len(set(b.files))


def test_programs_native(topo):
    """Native routing has no overlay programs and does not compile bpf_overlay.c."""
    b = node_build(topo, DatapathConfig(routing="native"), "node-a")
    assert {p.function for p in b.programs} == (TUNNEL_FUNCS - OVERLAY_FUNCS) | SOCK_FUNCS
    assert "bpf_overlay.c" not in b.files


def test_socket_lb_off_builds_no_cgroup_programs(topo):
    """With socket LB off, bpf_sock.c is not compiled and no cgroup program attaches."""
    b = node_build(topo, DatapathConfig(socket_lb="off"), "node-a", vxlan_ifindex=9)
    assert not {p.function for p in b.programs} & SOCK_FUNCS and "bpf_sock.c" not in b.files


def test_program_table():
    """Each program's hook name is its function minus 'cil_' with dashes, on tc ingress/egress (or its cgroup
    attach type) as Cilium attaches it."""
    for p in PROGRAMS:
        assert re.search(rf"\bint\s+{p.function}\s*\(", (BPF / p.source).read_text()), p
        if p.device.startswith("xdp"):  # XDP is attached to the device, not a tc hook: bpf_xdp.c's two programs
            assert (p.function, p.hook, p.direction) in {("cil_xdp_entry", "xdp", "xdp"),
                                                          ("lab_xdp_pass", "xdp-peer", "xdp")}
            continue
        assert p.hook == p.function[len("cil_"):].replace("_", "-")
        if p.device == "cgroup":
            assert p.direction == p.function.rsplit("_", 1)[1] + "4"
            continue
        if p.device in ("pods", "sockmap"):  # socket redirect: sock_ops on the pods' cgroups, sk_msg on the map
            assert p.direction in SOCKMAP_ATTACH
            continue
        assert p.direction == ("ingress" if p.function.startswith("cil_from_") else "egress")
        assert p.filter_name == f"labkit-{p.hook}"
        assert re.search(rf"\bint\s+{p.function}\s*\(", (BPF / p.source).read_text()), p


@pytest.mark.parametrize("routing", ["tunnel", "native"])
def test_text_pastes_local_headers(topo, routing):
    """text() has no #include "..." line left but keeps the #include <...> lines of the sources."""
    b = node_build(topo, DatapathConfig(routing=routing), "node-a", vxlan_ifindex=5)
    text = b.text()
    assert not [line for line in text.splitlines() if _LOCAL_INCLUDE.match(line)]
    sources = [BPF / f for f in b.files] + list((BPF / "lib").glob("*.h"))
    system = {m[1] for f in sources for line in f.read_text().splitlines() if (m := _SYSTEM_INCLUDE.match(line))}
    assert system, "the BPF sources include system headers"
    kept = {m[1] for line in text.splitlines() if (m := _SYSTEM_INCLUDE.match(line))}
    assert kept == system


def test_text_contains_every_header_once(topo):
    """Each local header's guard is pasted exactly once (sockmap on: its headers are pasted only then;
    nodeport_xdp.h in the XDP build only; xdp.h also in every build, inside bpf_host.c's
    #ifdef ENABLE_NODEPORT_ACCELERATION), and every attach-point function is in the text."""
    b = node_build(topo, DatapathConfig(sockmap="on"), "node-a", vxlan_ifindex=5)
    text = b.text()
    xdp_text = node_build(topo, DatapathConfig(routing="native", nodeport_accel="xdp"), "node-a").text()
    for header in (BPF / "lib").glob("*.h"):
        if header.name == "nodeport_xdp.h":
            guard = re.search(r"^#define\s+(\w+)\s*$", header.read_text(), re.M)[1]
            assert len(re.findall(rf"^#define\s+{guard}\s*$", xdp_text, re.M)) == 1, header.name
            assert guard not in text
            continue
        first_define = re.search(r"^#define\s+(\w+)\s*$", header.read_text(), re.M)
        if first_define:
            assert len(re.findall(rf"^#define\s+{first_define[1]}\s*$", text, re.M)) == 1, header.name
    for fn in TUNNEL_FUNCS:
        assert re.search(rf"\bint\s+{fn}\s*\(", text), fn


def test_text_native_omits_overlay_functions(topo):
    """Native routing's text has no overlay program definitions."""
    text = node_build(topo, DatapathConfig(routing="native"), "node-a").text()
    for fn in OVERLAY_FUNCS:
        assert not re.search(rf"\bint\s+{fn}\s*\(", text)


def test_text_line_directives(topo):
    """#line directives name real files and, after each pasted file, the including file's next line."""
    b = node_build(topo, DatapathConfig(), "node-a", vxlan_ifindex=5)
    lines = b.text().splitlines()
    directives = [(i, re.match(r'^#line (\d+) "([^"]+)"$', ln)) for i, ln in enumerate(lines) if ln.startswith("#line")]
    assert directives and all(m for _, m in directives)
    for _, m in directives:
        assert Path(m[2]).is_file()
    # The text after every #line N "file" is that file from line N on, up to the next directive.
    for (i, m), nxt in zip(directives, [d[0] for d in directives[1:]] + [len(lines)]):
        src = Path(m[2]).read_text().splitlines()
        start = int(m[1]) - 1
        body = [ln for ln in lines[i + 1 : nxt]]
        k = start
        for ln in body:
            while k < len(src) and _LOCAL_INCLUDE.match(src[k]):
                k += 1  # pasted away; the next directive resumes after it
            assert ln == src[k], f"{m[2]}:{k + 1}"
            k += 1


def test_text_header_names_node_and_macros(topo):
    """The text starts with a comment naming the node and listing each macro."""
    b = node_build(topo, DatapathConfig(), "node-b", vxlan_ifindex=5)
    head = b.text().split('#line', 1)[0]
    assert "node-b" in head
    for k, v in b.macros.items():
        assert f"{k}={v}" in head


def test_map_names():
    """The pinned map names are Cilium's CT/lxc/ipcache names plus labkit's two."""
    text = "\n".join(p.read_text() for p in (BPF / "lib").glob("*.h"))
    for name in MAP_NAMES:
        assert re.search(rf"\b{name}\b", text), name


@pytest.mark.parametrize("mode", ["default", "always"])
def test_policy_macros(topo, mode):
    """policy default/always compiles policy in (ENABLE_POLICY=1); audit mode adds POLICY_AUDIT_MODE=1."""
    b = node_build(topo, DatapathConfig(policy=mode), "node-a", vxlan_ifindex=3)
    assert b.macros["ENABLE_POLICY"] == 1 and "POLICY_AUDIT_MODE" not in b.macros
    a = node_build(topo, DatapathConfig(policy=mode, policy_audit=True), "node-a", vxlan_ifindex=3)
    assert a.macros["POLICY_AUDIT_MODE"] == 1
    assert set(a.macros) - set(node_build(topo, DatapathConfig(policy="never"), "node-a", vxlan_ifindex=3).macros) == \
        {"ENABLE_POLICY", "POLICY_AUDIT_MODE"}


def test_policy_never_adds_nothing(topo):
    """policy 'never' compiles no policy code: no ENABLE_POLICY, the plain pinned maps; the default ('default', as on
    a node) is the same build plus ENABLE_POLICY=1 and the two policy maps."""
    b = node_build(topo, DatapathConfig(policy="never"), "node-a", vxlan_ifindex=3)
    assert not {"ENABLE_POLICY", "POLICY_AUDIT_MODE"} & set(b.macros)
    assert b.map_names == MAP_NAMES
    d = node_build(topo, DatapathConfig(), "node-a", vxlan_ifindex=3)
    assert {k: v for k, v in d.macros.items() if k != "ENABLE_POLICY"} == b.macros and d.macros["ENABLE_POLICY"] == 1
    assert d.map_names == MAP_NAMES + POLICY_MAP_NAMES


def test_policy_build_pins_labkit_policy(topo):
    """A policy build pins labkit_policy and labkit_policy_filter besides the usual maps; both are declared in
    bpf/lib/maps_policy.h."""
    b = node_build(topo, DatapathConfig(policy="default"), "node-a", vxlan_ifindex=3)
    assert b.map_names == MAP_NAMES + POLICY_MAP_NAMES == MAP_NAMES + ("labkit_policy", "labkit_policy_filter")
    text = (BPF / "lib" / "maps_policy.h").read_text()
    assert re.search(r"BPF_HASH_OF_MAPS\(labkit_policy\b", text)
    assert re.search(r"BPF_HASH\(labkit_policy_filter\b", text)


def test_policy_code_is_behind_enable_policy():
    """Every policy include in the existing files sits inside #ifdef ENABLE_POLICY, so other builds compile as before."""
    for path, header in ((BPF / "bpf_lxc.c", "lib/policy.h"), (BPF / "lib" / "maps.h", "maps_policy.h")):
        text = path.read_text()
        assert re.search(rf'#ifdef ENABLE_POLICY\n#include "{re.escape(header)}"\n#endif', text), path.name


def test_sockmap_off_adds_nothing(topo):
    """sockmap 'off' (the default) builds the same text, cflags, programs and pinned maps as a config without the
    option: no ENABLE_SOCKMAP, no bpf_sockops.c or bpf_redir.c, no cilium_sock_ops."""
    for node in ("node-a", "node-b"):
        b = node_build(topo, DatapathConfig(sockmap="off"), node, vxlan_ifindex=3)
        d = node_build(topo, DatapathConfig(), node, vxlan_ifindex=3)
        assert (b.text(), b.cflags(), b.programs, b.map_names) == (d.text(), d.cflags(), d.programs, d.map_names)
        assert "ENABLE_SOCKMAP" not in b.macros and "sockops" not in b.text()
        assert not {"bpf_sockops.c", "bpf_redir.c"} & set(b.files) and b.map_names == MAP_NAMES + POLICY_MAP_NAMES


def test_sockmap_on_adds_the_two_programs_and_the_sockhash(topo):
    """sockmap 'on' adds ENABLE_SOCKMAP=1, the sk_msg program on the sockhash before the sock_ops program on the
    pods' cgroups, and pins cilium_sock_ops (Cilium 1.4-1.13's SOCK_OPS_MAP, bpf/sockops/sockops_config.h)."""
    b = node_build(topo, DatapathConfig(sockmap="on"), "node-a", vxlan_ifindex=3)
    d = node_build(topo, DatapathConfig(), "node-a", vxlan_ifindex=3)
    assert set(b.macros) - set(d.macros) == {"ENABLE_SOCKMAP"}
    extra = [(p.function, p.source, p.device, p.direction) for p in b.programs if p not in d.programs]
    assert extra == [("cil_redir", "bpf_redir.c", "sockmap", "sk_msg"), ("cil_sockops", "bpf_sockops.c", "pods", "sock_ops")]
    assert b.map_names == d.map_names + SOCKMAP_MAP_NAMES and SOCKMAP_MAP_NAMES == ("cilium_sock_ops",)
    assert re.search(r"BPF_SOCKHASH\(cilium_sock_ops\b", (BPF / "lib" / "maps_sockops.h").read_text())
    assert SOCKMAP_ATTACH == {"sock_ops": 3, "sk_msg": 7}  # BPF_CGROUP_SOCK_OPS, BPF_SK_MSG_VERDICT (uapi bpf.h)


def test_nodeport_accel_none_adds_nothing(topo):
    """nodeport_accel 'none' (the default) compiles the same text with the same macros as a config without it."""
    b = node_build(topo, DatapathConfig(routing="native", nodeport_accel="none"), "node-a")
    plain = node_build(topo, DatapathConfig(routing="native"), "node-a")
    assert "ENABLE_NODEPORT_ACCELERATION" not in b.macros and "bpf_xdp.c" not in b.files
    assert (b.text(), b.cflags(), b.programs) == (plain.text(), plain.cflags(), plain.programs)


def test_nodeport_accel_xdp_builds_the_xdp_programs(topo):
    """nodeport_accel 'xdp' adds ENABLE_NODEPORT_ACCELERATION, bpf_xdp.c, cil_xdp_entry for eth0 and the peer's
    lab_xdp_pass, and pins the same maps (one translation unit: the XDP program shares the tc programs' maps)."""
    b = node_build(topo, DatapathConfig(routing="native", nodeport_accel="xdp"), "node-a")
    assert b.macros["ENABLE_NODEPORT_ACCELERATION"] == 1 and "bpf_xdp.c" in b.files
    assert {(p.function, p.device) for p in b.programs if p.source == "bpf_xdp.c"} == {
        ("cil_xdp_entry", "xdp"), ("lab_xdp_pass", "xdp-peer")}
    assert b.map_names == node_build(topo, DatapathConfig(routing="native"), "node-a").map_names


def test_no_backend_response_drop_adds_the_drop_macro_only(topo):
    """--service-no-backend-response: 'reject' (the default) builds the same as a config without it; 'drop' adds
    SERVICE_NO_BACKEND_DROP and changes nothing else."""
    reject = node_build(topo, DatapathConfig(routing="native", no_backend_response="reject"), "node-a")
    plain = node_build(topo, DatapathConfig(routing="native"), "node-a")
    drop = node_build(topo, DatapathConfig(routing="native", no_backend_response="drop"), "node-a")
    assert (reject.text(), reject.cflags()) == (plain.text(), plain.cflags())
    assert "SERVICE_NO_BACKEND_DROP" not in plain.macros
    assert {k: v for k, v in drop.macros.items() if k != "SERVICE_NO_BACKEND_DROP"} == plain.macros
    assert drop.macros["SERVICE_NO_BACKEND_DROP"] == 1 and drop.programs == plain.programs


def test_xdp_code_is_behind_enable_nodeport_acceleration():
    """bpf_host.c reads the XDP marker only inside #ifdef ENABLE_NODEPORT_ACCELERATION, so other builds compile as
    before."""
    text = (BPF / "bpf_host.c").read_text()
    assert re.search(r'#ifdef ENABLE_NODEPORT_ACCELERATION\n#include "lib/xdp.h"\n#endif', text)
    guarded = re.search(r"#ifdef ENABLE_NODEPORT_ACCELERATION\n(.*?)#endif", text.split("int cil_from_netdev")[1], re.S)
    assert guarded and "skb_xfer_no_svc" in guarded.group(1)
