"""The golden corpus on the real kernel: every kind of row (OUT, IN, SVC, RELATED, hairpin, DSRInternal,
NAT both directions; tunnel and native; the 1.16 and 1.20 profiles) produced by real traffic on labs
with a default node's options, and compared byte for byte with the line Cilium's formatting code
prints (tests/datapath/golden.py says where each line comes from)."""
from __future__ import annotations

import pytest

from labkit.config import DatapathConfig

from labtag import tagged

from .golden import CORPUS, NAT_CORPUS, for_release, render

CPORT, UPORT = 40123, 40124  # the clients' ports, in SNAT's range so that the NAT keeps them
LABS = {  # (release, routing, lb mode) -> lab name
    ("1.16", "tunnel", "dsr"): "dpg16t",
    ("1.16", "native", "dsr"): "dpg16n",
    ("1.20", "tunnel", "dsr"): "dpg20t",
    ("1.16", "native", "snat"): "dpg16s",
}
SCENARIOS = ("pod-to-pod", "udp", "clusterip", "hairpin", "dsr", "snat")


def _where(scenario: str) -> list[tuple[str, str, str]]:
    """The (release, routing, lb mode) labs a scenario runs on."""
    if scenario == "snat":
        return [("1.16", "native", "snat")]
    return [k for k in LABS if k[2] == "dsr"]


@pytest.fixture(scope="module")
def labs(_require_datapath):
    from labkit import Lab

    up = {}
    try:
        for (release, routing, mode), name in LABS.items():
            up[(release, routing, mode)] = Lab.up(tagged(name), config=DatapathConfig(
                cilium=release, routing=routing, lb_mode=mode, gc_timer=False))
        yield up
    finally:
        for lab in up.values():
            lab.down()


def _run(lab, scenario: str) -> dict:
    """Send the scenario's traffic on a freshly reset lab; the names its templates use and the lab-clock
    window the traffic ran in."""
    lab.reset()
    topo = lab.topology
    names = {"a1": topo.pod("a1").ip, "b1": topo.pod("b1").ip, "b2": topo.pod("b2").ip,
             "ext": topo.external("ext").ip, "node_a": topo.node("node-a").ip,
             "id_a1": topo.pod("a1").identity, "cport": CPORT, "uport": UPORT}
    t0 = lab.clock.now()
    if scenario == "pod-to-pod":
        _tcp(lab.pod("a1").tcp("b1", 8080, sport=CPORT))
    elif scenario == "udp":
        assert lab.pod("a1").udp("b2", 8080, sport=UPORT).ok
    elif scenario in ("clusterip", "hairpin"):
        svc = lab.services.add("web", 80, ["b1:8080" if scenario == "clusterip" else "a1:8080"])
        names.update(vip=svc.vip, svc_id=svc.id, backend_id=svc.backends[0].id)
        _tcp(lab.pod("a1").tcp("web", 80, sport=CPORT))
    else:  # dsr, snat: from outside to a LoadBalancer VIP, backend on the other node
        svc = lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
        lb = next(fe for fe in svc.frontends if fe.type == "LoadBalancer")
        names.update(lbvip=lb.address, lb_id=lb.id, backend_id=svc.backends[0].id)
        _tcp(lab.external("ext").tcp("web", 80, sport=CPORT))
    names["t0"], names["t1"] = t0, lab.clock.now()
    return names


def _tcp(conn) -> None:
    for step in (conn.open(), conn.send(b"golden"), conn.close()):
        assert step.ok, step


def _check(lab, golden, names: dict, rows) -> None:
    proto, direction, related, src, dst = golden.find
    src, dst = src.format(**names), dst.format(**names)
    found = [r for r in rows if (r.proto_name, r.dir, r.related, r.src, r.dst) == (proto, direction, related, src, dst)]
    assert len(found) == 1, f"{golden.scenario} on {golden.node}: expected one {golden.find} row, got {found}"
    line = found[0].line()
    template = golden.template if golden.release else for_release(golden.template, lab.config.cilium)
    expected, clocks = render(template, names, line)
    assert line == expected, f"{golden.scenario} ({lab.name}), {golden.node}:\n  got      {line!r}\n  expected {expected!r}"
    for var, value in clocks.items():  # report times lie in the traffic's window, ages within its length
        low, high = (0, names["t1"] - names["t0"] + 1) if var == "age" else (names["t0"], names["t1"])
        assert low <= value <= high, f"{golden.scenario}: ${var}={value} outside [{low}, {high}] in {line!r}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_golden_rows(labs, scenario):
    """Each scenario's CT and NAT rows print exactly the corpus lines, on every lab the scenario runs on."""
    checked = 0
    for key in _where(scenario):
        lab = labs[key]
        release, routing, _ = key
        names = _run(lab, scenario)
        for golden in (g for g in CORPUS + NAT_CORPUS if g.scenario == scenario):
            if golden.routing not in (None, routing) or golden.release not in (None, release):
                continue
            rows = lab.nat(golden.node) if golden in NAT_CORPUS else lab.ct(golden.node)
            _check(lab, golden, names, rows)
            checked += 1
    assert checked, f"no corpus line was checked for {scenario}"


def test_default_node_counts_nothing(labs):
    """A default lab (no --ct-accounting) leaves Packets=0 Bytes=0 on every row, as a default v1.16 node does."""
    lab = labs[("1.16", "tunnel", "dsr")]
    _run(lab, "pod-to-pod")
    rows = lab.ct("node-a") + lab.ct("node-b")
    assert rows and all((r.packets, r.bytes) == (0, 0) for r in rows)


def test_ct_list_prints_a_blank_line_after_each_map(labs):
    """`labkit ct list` is Cilium's output: each line with its trailing space, a blank line after each map."""
    import subprocess
    import sys

    lab = labs[("1.16", "tunnel", "dsr")]
    _run(lab, "pod-to-pod")
    out = subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", lab.name, "ct", "list", "node-a"],
                         capture_output=True, text=True, check=True).stdout
    tcp = [r.line() for r in lab.ct("node-a") if r.map == "cilium_ct4_global"]
    other = [r.line() for r in lab.ct("node-a") if r.map != "cilium_ct4_global"]
    assert out == "".join(f"{line}\n" for line in tcp) + "\n" + "".join(f"{line}\n" for line in other) + "\n"
    assert all(line.endswith("BackendID=0 ") for line in tcp + other)
