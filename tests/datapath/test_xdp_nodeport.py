"""XDP NodePort acceleration (``--nodeport-accel xdp``, bpf/bpf_xdp.c) on the real kernel: the same CT and NAT
rows as tc's from-netdev for the same traffic, answers that arrive, and drops made before an skb exists.

Each comparison brings up a tc lab and an XDP lab of the same mode, sends the same traffic from ``ext`` to
both and compares every row field by field. Left out: the lifetimes and report stamps (seconds of the lab
clock when the packet passed), the NAT rows' ``created`` (the same), and the client's source port and the
SNAT port, which the kernel and bpf_get_prandom_u32() choose per run (Cilium's snat_v4_new_mapping keeps
the client's port when it is free, so those two match each other, not the other lab's).
"""
from __future__ import annotations

import sys
import time

import pytest

from labkit.addr import be32 as _be32
from labkit.config import DatapathConfig
from labkit.constants import DropReason, Hook, Verdict

from labtag import tagged

from .test_nodeport import MALFORMED, _malformed, send_malformed
from .util import wait_for

EXT = "198.51.100.100"
NODE_A = "198.51.100.11"

#: CtRow fields compared between the labs (all but lifetime, last_tx_report, last_rx_report: timestamps).
CT_FIELDS = ("map", "proto", "dir", "related", "src", "sport", "dst", "dport", "flags", "rev_nat", "backend_id",
             "packets", "bytes", "tx_flags_seen", "rx_flags_seen", "src_sec_id", "ifindex")
#: NatRow fields compared (all but created, a timestamp).
NAT_FIELDS = ("proto", "dir", "src", "sport", "dst", "dport", "to_addr", "to_port", "needs_ct")


def _lab(name: str, **options):
    from labkit import Lab

    lab = Lab.up(name, config=DatapathConfig(routing="native", gc_timer=False, ct_accounting=True, **options))
    yield lab
    lab.down()


@pytest.fixture(scope="module")
def _tc_dsr(_require_datapath):
    yield from _lab(tagged("xtcd"), lb_mode="dsr")


@pytest.fixture(scope="module")
def _xdp_dsr(_require_datapath):
    yield from _lab(tagged("xxdd"), lb_mode="dsr", nodeport_accel="xdp")


@pytest.fixture(scope="module")
def _tc_snat(_require_datapath):
    yield from _lab(tagged("xtcs"), lb_mode="snat")


@pytest.fixture(scope="module")
def _xdp_snat(_require_datapath):
    yield from _lab(tagged("xxds"), lb_mode="snat", nodeport_accel="xdp")


@pytest.fixture(params=["dsr", "snat"])
def pair(request):
    """(tc lab, XDP lab) of one LB mode, both reset."""
    tc_lab = request.getfixturevalue(f"_tc_{request.param}")
    xdp_lab = request.getfixturevalue(f"_xdp_{request.param}")
    tc_lab.reset()
    xdp_lab.reset()
    return tc_lab, xdp_lab


@pytest.fixture
def xdp_lab(_xdp_dsr):
    _xdp_dsr.reset()
    return _xdp_dsr


def _exchange(lab, kind: str) -> dict:
    """One TCP connection from ext through a LoadBalancer VIP or node-a's NodePort to b1, one request
    answered; what the rows are normalised with, and the step records."""
    if kind == "lb":
        svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
        conn, frontend = lab.external("ext").tcp("web", 80), (svc.lb_vip, 80)
    else:
        svc = lab.services.add("web", 80, ["b1:8080"], type="NodePort", node_port=30080)
        conn, frontend = lab.external("ext").tcp("node-a", 30080), (NODE_A, 30080)
    opened = conn.open()
    assert opened.ok and opened.result["peer"] == f"{frontend[0]}:{frontend[1]}"
    sent = conn.send(b"xdp")
    assert sent.result["reply"] == b"xdp".hex()  # the answer arrived, from the frontend
    nat_ports = {r.to_port for r in lab.nat("node-a") if r.dir == "OUT"}
    names = {fe.id: f"{fe.type}:{fe.address}" for fe in svc.frontends}
    return {"svc": svc, "frontend": frontend, "flows": opened.flows + sent.flows, "cp": opened.result["sport"],
            "nat_ports": nat_ports, "names": names, "backend": {svc.backend("b1:8080").id: "b1:8080"}}


def _norm_port(port: int, x: dict) -> object:
    return "client-port" if port == x["cp"] else "nat-port" if port in x["nat_ports"] else port


def _ct_rows(lab, node: str, x: dict) -> list[tuple]:
    out = []
    for r in lab.ct(node):
        row = {f: getattr(r, f) for f in CT_FIELDS}
        row["sport"], row["dport"] = _norm_port(r.sport, x), _norm_port(r.dport, x)
        row["rev_nat"] = x["names"].get(r.rev_nat, r.rev_nat)
        row["backend_id"] = x["backend"].get(r.backend_id, r.backend_id)
        out.append(tuple(sorted(row.items(), key=lambda kv: kv[0])))
    return sorted(out, key=repr)


def _nat_rows(lab, node: str, x: dict) -> list[tuple]:
    out = []
    for r in lab.nat(node):
        row = {f: getattr(r, f) for f in NAT_FIELDS}
        for f in ("sport", "dport", "to_port"):
            row[f] = _norm_port(row[f], x)
        out.append(tuple(sorted(row.items(), key=lambda kv: kv[0])))
    return sorted(out, key=repr)


def _requests(x: dict, node: str, hook: Hook) -> list:
    """Records at ``hook`` on ``node`` of ext's packets to the frontend (before translation)."""
    addr = _be32(x["frontend"][0])
    return [f for f in x["flows"] if f.node == node and f.hook == hook and f.event.before.daddr == addr
            and f.event.before.saddr == _be32(EXT)]


@pytest.mark.parametrize("kind", ["lb", "nodeport"])
def test_same_rows_as_tc(pair, kind):
    """ext -> LB VIP and -> NodePort, dsr and snat: node-a's and node-b's CT and NAT rows in the XDP lab equal
    the tc lab's field by field (timestamps and kernel-chosen ports aside), and the answers arrive."""
    tc_lab, xdp_lab = pair
    tc_x, xdp_x = _exchange(tc_lab, kind), _exchange(xdp_lab, kind)
    for node in ("node-a", "node-b"):
        assert _ct_rows(xdp_lab, node, xdp_x) == _ct_rows(tc_lab, node, tc_x), f"CT rows of {node}"
        assert _nat_rows(xdp_lab, node, xdp_x) == _nat_rows(tc_lab, node, tc_x), f"NAT rows of {node}"
    assert _ct_rows(tc_lab, "node-a", tc_x)  # not two empty tables: node-a's SVC row at least
    # The XDP lab's requests were translated and sent back out by XDP, not by tc:
    at_xdp = _requests(xdp_x, "node-a", Hook.XDP)
    assert at_xdp and all(f.verdict == Verdict.REDIRECTED and f.translated for f in at_xdp)
    assert _requests(xdp_x, "node-a", Hook.FROM_NETDEV) == []
    assert _requests(tc_x, "node-a", Hook.FROM_NETDEV) and _requests(tc_x, "node-a", Hook.XDP) == []


_NODE_A_CASES = sorted(c for c in MALFORMED if not c.startswith("dsr-"))  # the others go to node-b


@pytest.mark.parametrize("case", _NODE_A_CASES)
def test_malformed_dropped_in_xdp(xdp_lab, case):
    """A truncated IP or TCP header, or an IP fragment, sent to node-a's VIP is dropped by the XDP program with
    the reason tc's from-netdev gives it (test_nodeport's frames), tc never sees it, and no row is made."""
    lab = xdp_lab
    svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    node, packet = _malformed(case, svc.lb_vip)
    assert node == "node-a"
    drop, log = send_malformed(lab, node, packet, case)
    assert (drop.node, drop.hook, drop.event.drop_reason) == (node, Hook.XDP, MALFORMED[case])
    time.sleep(0.3)
    assert [f for f in log.read() if f.node == "node-a" and f.hook == Hook.FROM_NETDEV] == []
    for n in ("node-a", "node-b"):
        assert lab.ct(n) == [] and lab.nat(n) == []


_UDP_FLOOD = r"""
import socket, sys
vip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(n):
    s.sendto(b"x" * 64, (vip, port))
"""


def test_flood_to_service_without_backends_answered_in_xdp(xdp_lab):
    """200 UDP datagrams to a LoadBalancer without backends: 200 records at hook xdp on node-a, each the packet
    answered with ICMP port unreachable and sent back out (lb4_local finds svc->count == 0; Cilium's XDP build
    tail-calls tail_no_service_ipv4, bpf/lib/nodeport.h:2849-2856@82999990, bpf/lib/lb.h:1718-1836@82999990),
    none dropped, none at from-netdev, and no CT row."""
    from labkit.constants import TraceFlags

    lab = xdp_lab
    svc = lab.services.add("void", 53, [], protocol="UDP", type="LoadBalancer")
    log = lab.events()
    log.seek_end()
    lab.exec("ext", [sys.executable, "-c", _UDP_FLOOD, svc.lb_vip, "53", "200"], check=True)
    seen: list = []

    def all_answered():
        seen.extend(f for f in log.read() if f.node == "node-a")
        return len([f for f in seen if f.event.flags & TraceFlags.NO_BACKEND_REPLY]) >= 200

    wait_for(all_answered, timeout=10, what="200 answers at node-a")
    answered = [f for f in seen if f.event.flags & TraceFlags.NO_BACKEND_REPLY]
    assert {(f.hook, f.verdict, f.event.drop_reason) for f in answered} == {
        (Hook.XDP, Verdict.REDIRECTED, DropReason.NO_SERVICE)}
    assert len(answered) == 200 and not [f for f in seen if f.dropped]
    assert [f for f in seen if f.hook == Hook.FROM_NETDEV and f.event.before.daddr == _be32(svc.lb_vip)] == []
    assert lab.ct("node-a") == []
