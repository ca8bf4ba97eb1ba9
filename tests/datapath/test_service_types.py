"""NodePort and LoadBalancer services on the real kernel, from a pod: the per-packet LB in
bpf_lxc serves every frontend the agent writes (node address:nodePort, LB VIP:port) the same
way as the ClusterIP. External clients reaching these frontends (the node-side datapath) are
not covered here."""
from __future__ import annotations

import subprocess
import sys

from labkit.maps.lb import ServiceFlags

from .util import rows

LABKIT = [sys.executable, "-m", "labkit", "cli"]
_GET = r"""
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.sendall(b"GET / HTTP/1.0\r\n\r\n")
data = b""
while True:
    c = s.recv(500)
    if not c:
        break
    data += c
print(s.getsockname()[1], data.split(b"\r\n\r\n", 1)[1].decode().split()[0], flush=True)
"""


def _get(lab, address: str, port: int) -> tuple[int, str]:
    """One HTTP GET from a1 to address:port in a1's namespace: (client port, ``pod=…`` of the server)."""
    r = lab.pod("a1").exec(sys.executable, "-c", _GET, address, str(port), timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]
    sport, served = r.stdout.split()
    return int(sport), served


def _svc_row(lab, sport: int, address: str, port: int, node: str = "node-a"):
    """``node``'s one SVC row, from a1:sport to the frontend address:port."""
    a1 = lab.pod("a1").ip
    svc_rows = rows(lab, node, "TCP", "SVC")
    assert [(r.src, r.sport, r.dst, r.dport) for r in svc_rows] == [(a1, sport, address, port)]
    return svc_rows[0]


def test_nodeport_from_a_pod_via_node_b_address(lab):
    """a1 → node-b's address:nodePort is not load-balanced at node-a, whose maps hold only node-a's NodePort address
    and 0.0.0.0 (pkg/k8s/service.go:203-216,244-248@82999990): node-b's from-netdev balances it to b1 with that
    frontend's own rev NAT id, and b1's reply, going back through the tunnel, gets node-b:nodePort as its source at
    b1's from-container (bpf/bpf_lxc.c:1031-1037@82999990)."""
    svc = lab.services.add("web", 80, ["b1:8080"], type="NodePort", node_port=30080)
    node_b = lab.topology.node("node-b").ip
    fe = next(f for f in svc.frontends if f.address == node_b)
    sport, served = _get(lab, node_b, 30080)
    assert served == "pod=b1"
    assert not rows(lab, "node-a", "TCP", "SVC")
    row = _svc_row(lab, sport, node_b, 30080, node="node-b")
    assert row.rev_nat == fe.id != svc.id


def test_nodeport_from_a_pod_via_node_a_address(lab):
    """a1 → its own node's address:nodePort is load-balanced to b1 as well."""
    svc = lab.services.add("web", 80, ["b1:8080"], type="NodePort")
    node_a = lab.topology.node("node-a").ip
    sport, served = _get(lab, node_a, svc.node_port)
    assert served == "pod=b1"
    row = _svc_row(lab, sport, node_a, svc.node_port)
    assert row.rev_nat == next(f.id for f in svc.frontends if f.address == node_a)


def test_loadbalancer_vip_from_a_pod(lab):
    """a1 → the LoadBalancer VIP:port (auto-allocated 203.0.113.10) is load-balanced to b1."""
    svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    assert svc.lb_vip == "203.0.113.10"
    conn = lab.pod("a1").tcp(svc.lb_vip, 80)
    opened = conn.open()
    assert opened.ok and opened.result["peer"] == f"{svc.lb_vip}:80"  # reverse NAT back to the LB VIP
    row = _svc_row(lab, conn.sport, svc.lb_vip, 80)
    assert row.rev_nat == svc.frontends[-1].id
    conn.send(b"ping")
    assert any(f"client={lab.pod('a1').ip}:{conn.sport}" in line for line in lab.pod("b1").server_log())
    conn.close()


def test_tcp_step_to_a_nodeport_address(lab):
    """a1.tcp(node-b address, nodePort).open() is a step through node-b's NodePort frontend: its SVC row is on
    node-b, the node that address belongs to (node-a's maps do not hold it)."""
    svc = lab.services.add("web", 80, ["b1:8080"], type="NodePort")
    node_b = lab.topology.node("node-b").ip
    step = lab.pod("a1").tcp(node_b, svc.node_port).open()
    assert step.ok
    assert [(r.dst, r.dport) for r in step.rows["node-b"] if r.dir == "SVC"] == [(node_b, svc.node_port)]
    assert not [r for r in step.rows["node-a"] if r.dir == "SVC"]


def test_lb_list_shows_every_frontend_with_its_type(lab):
    """`lb list node-a` (Python and CLI) lists the ClusterIP, NodePort and LoadBalancer frontends with their flags:
    node-a's own NodePort address and the surrogate 0.0.0.0 (NodePort, non-routable: pkg/maps/lbmap/lbmap.go:573
    @82999990), not node-b's (pkg/k8s/service.go:203-216@82999990)."""
    np_ = lab.services.add("np", 80, ["b1:8080"], type="NodePort", node_port=30080)
    lb = lab.services.add("lb", 81, ["b2:8080"], type="LoadBalancer", node_port=30081, lb_vip="203.0.113.20")
    a, b = (lab.topology.node(n).ip for n in ("node-a", "node-b"))
    got = {r.frontend: (r.type, r.id, r.flags) for r in lab.services.lb("node-a").rows()}
    np_flags, lb_flags = ServiceFlags.NODEPORT | ServiceFlags.ROUTABLE, ServiceFlags.LOADBALANCER | ServiceFlags.ROUTABLE
    assert got == {  # v1.16's service list prints no protocol after a frontend
        "198.19.0.10:80": ("ClusterIP", np_.ids[0], 0),
        f"{a}:30080": ("NodePort", np_.ids[1], np_flags),
        "0.0.0.0:30080": ("NodePort", np_.ids[3], ServiceFlags.NODEPORT),
        "198.19.0.11:81": ("ClusterIP", lb.ids[0], 0),
        f"{a}:30081": ("NodePort", lb.ids[1], np_flags),
        "0.0.0.0:30081": ("NodePort", lb.ids[3], ServiceFlags.NODEPORT),
        "203.0.113.20:81": ("LoadBalancer", lb.ids[4], lb_flags),
    }
    assert f"{b}:30080" in {r.frontend for r in lab.services.lb("node-b").rows()}
    proc = subprocess.run(LABKIT + ["--lab", lab.name, "lb", "list", "node-a"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    cli_types = {line.split()[1]: line.split()[2] for line in proc.stdout.splitlines()[1:] if line[:1].strip()}
    assert cli_types == {fe: t for fe, (t, _, _) in got.items()}
    lab.services.remove("lb")
    assert {r.frontend for r in lab.services.lb("node-a").rows()} == {"198.19.0.10:80", f"{a}:30080", "0.0.0.0:30080"}
