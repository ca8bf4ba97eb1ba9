"""The CT garbage collector on the real maps: it deletes exactly what expired on the lab clock, never a live
entry, the same set in batch and per-entry mode, the NAT twin of a DSR entry, and runs on its own timer."""
from __future__ import annotations

import math
import socket
import subprocess
import time

import pytest

from labkit.addr import be32
from labkit.agent.gc import SCAN_MODES, fill_synthetic
from labkit.maps.base import PinnedMap
from labkit.maps.ct import CT_MAPS, CtEntry, CtFlags, CtKey4

from labtag import tagged

from .util import TcpClient, wait_for


def keys(lab, node: str) -> set[bytes]:
    """Every key of both CT maps of ``node``."""
    out = set()
    for map_name in CT_MAPS:
        with PinnedMap(f"{lab.pin_dir(node)}/{map_name}", CtKey4, CtEntry) as m:
            out |= {(map_name, bytes(k)) for k, _ in m.items()}
    return out


def test_gc_never_deletes_a_live_connection(any_lab):
    """An open connection keeps working across ten GC runs, the clock moved 1,000 s (less than its 8,000 s
    lifetime) before each, and none of its TCP rows is deleted (only the two idle RELATED twins go)."""
    lab = any_lab
    client = TcpClient(lab, "a1", lab.pod("b1").ip, 8080)
    try:
        assert client.send() == "echo hello labkit"
        def conn_rows(n):
            return {(r.dir, r.sport, r.dport) for r in lab.ct(n)
                    if client.port in (r.sport, r.dport) and r.proto_name == "TCP"}

        rows = {n: conn_rows(n) for n in ("node-a", "node-b")}
        assert rows["node-a"] and rows["node-b"]
        for i in range(10):
            lab.clock.advance(1000)
            run = lab.gc.run()
            # only the ICMP RELATED twins (60 s, refreshed by no TCP packet) may go, on the first run
            assert run.deleted == (2 if i == 0 else 0)
            assert all(conn_rows(n) == rows[n] for n in rows)
            assert client.send() == "echo hello labkit"  # refreshes the rows: 8,000 s from now
    finally:
        client.close()


def test_gc_deletes_closed_connections_after_the_close_timeout(any_lab):
    """Once the clock passes the 10 s close timeout, one run deletes the closed connection's rows on both nodes,
    and the counts it reports are the rows that disappeared."""
    lab = any_lab
    conn = lab.pod("a1").tcp("b1", 8080)
    conn.open()
    conn.close()
    ping = lab.pod("a2").ping("b2")  # a 60 s ICMP row that must survive
    assert ping.ok
    before = {n: keys(lab, n) for n in ("node-a", "node-b")}
    lab.clock.advance(11)
    run = lab.gc.run()
    after = {n: keys(lab, n) for n in ("node-a", "node-b")}
    for n in ("node-a", "node-b"):
        gone = before[n] - after[n]
        for map_name in CT_MAPS:
            reported = next(m.deleted for m in run.maps if (m.node, m.map) == (n, map_name))
            assert reported == sum(1 for m, _ in gone if m == map_name)
        assert not after[n] - before[n]
    assert not [r for n in ("node-a", "node-b") for r in lab.ct(n) if conn.sport in (r.sport, r.dport)]
    assert [r for r in lab.ct("node-a") if r.proto_name == "ICMP" and not r.related]  # the ping's row lives on
    assert run.deleted == sum(len(before[n] - after[n]) for n in before)


def _fill(lab, node: str, n: int, now: int) -> set[bytes]:
    """Write ``n`` synthetic TCP entries into ``node``'s TCP map, every other one expired; return those keys."""
    expired = set()
    with PinnedMap(f"{lab.pin_dir(node)}/{CT_MAPS[0]}", CtKey4, CtEntry) as m:
        for i in range(n):
            key = CtKey4()
            key.daddr = be32(f"198.18.200.{i % 250 + 1}")
            key.saddr = be32("198.18.1.11")
            key.dport, key.sport, key.nexthdr, key.flags = socket.htons(10000 + i), socket.htons(80), 6, 0
            entry = CtEntry()
            entry.lifetime = now - 1 if i % 2 else now + 100
            entry.packets = 1
            m[key] = entry
            if i % 2:
                expired.add(bytes(key))
    return expired


@pytest.mark.parametrize("mode", ["batch", "per-entry"])
def test_scan_modes_delete_the_same_entries(lab, mode):
    """A map filled with 2,000 known entries, half of them expired: each scan mode deletes exactly the
    expired half, and reports 2,000 read."""
    lab.flush_ct()
    now = lab.clock.now()
    expired = _fill(lab, "node-a", 2000, now)
    run = lab.gc.run(mode)
    tcp = next(m for m in run.maps if (m.node, m.map) == ("node-a", CT_MAPS[0]))
    assert (tcp.scanned, tcp.deleted) == (2000, 1000)
    left = {k for m, k in keys(lab, "node-a") if m == CT_MAPS[0]}
    assert len(left) == 1000 and not left & expired


def _closed_from_outside(lab) -> int:
    """ext opens, uses and closes a connection to a LoadBalancer service with its backend on node-b; its port."""
    lab.services.add("web", 80, ["b1:8080"], type="LoadBalancer")
    conn = lab.external("ext").tcp("web", 80)
    cp = conn.open().result["sport"]
    conn.send(b"gc")
    conn.close()
    return cp


@pytest.mark.parametrize("mode", SCAN_MODES)
def test_gc_removes_a_closed_dsr_flow_on_the_backend_node(any_lab, mode):
    """dsr: node-b holds the DSRInternal OUT row (ext -> b1), b1's own IN row and the NAT row; once the close
    timeout has passed, one GC run deletes all three — the NAT row as the DSR entry's, found by swapping the
    entry's ports (Cilium's purgeCtEntry4 -> DeleteSwappedMapping4), in either scan mode (batch: the NAT map
    read once, the keys derived from the raw CT keys)."""
    lab = any_lab
    cp = _closed_from_outside(lab)
    ext, b1 = lab.topology.external("ext").ip, lab.pod("b1").ip

    def flow_rows():
        return {(r.dir, r.flags & CtFlags.DSR_INTERNAL != 0) for r in lab.ct("node-b")
                if not r.related and (r.src, r.sport, r.dst, r.dport) == (ext, cp, b1, 8080)}

    assert flow_rows() == {("OUT", True), ("IN", False)}
    (nat,) = lab.nat("node-b")
    assert (nat.src, nat.sport, nat.dst, nat.dport) == (b1, 8080, ext, cp)
    lab.clock.advance(lab.config.timeouts.close + 1)
    run = lab.gc.run(mode)
    assert sum(m.nat_deleted for m in run.maps if m.node == "node-b") == 1
    assert flow_rows() == set() and lab.nat("node-b") == []


@pytest.mark.parametrize("mode", SCAN_MODES)
def test_gc_removes_a_closed_snat_flow_and_both_nat_entries(snat_gc_lab, mode):
    """snat: node-a's NodePort OUT row goes with both entries of its SNAT pair (Cilium's DeleteMapping4: the OUT
    entry found by the CT key with its addresses swapped, then the reverse IN entry it points at), in either
    scan mode."""
    lab = snat_gc_lab
    cp = _closed_from_outside(lab)
    ext = lab.topology.external("ext").ip
    assert sorted(r.dir for r in lab.nat("node-a")) == ["IN", "OUT"]
    assert [r for r in lab.ct("node-a") if r.dir == "OUT" and (r.src, r.sport) == (ext, cp)]
    lab.clock.advance(lab.config.timeouts.close + 1)
    run = lab.gc.run(mode)
    assert sum(m.nat_deleted for m in run.maps if m.node == "node-a") == 2
    assert lab.nat("node-a") == []
    assert not [r for r in lab.ct("node-a") if r.dir == "OUT" and (r.src, r.sport) == (ext, cp)]


@pytest.fixture(scope="module")
def _snat_gc(_require_datapath):
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("dpgcsnat"), config=DatapathConfig(routing="native", lb_mode="snat", gc_timer=False))
    yield lab
    lab.down()


@pytest.fixture
def snat_gc_lab(_snat_gc):
    _snat_gc.reset()
    return _snat_gc


def _expire(lab, n: int) -> None:
    """Make ``n`` entries of node-a's TCP map expired at the lab clock's now (and ``n`` more alive)."""
    fill_synthetic(lab.pin_dir("node-a"), 2 * n, lab.clock.now())


def test_interval_rounds_as_go_does(lab):
    """Three quiet runs, each on time and deleting a few expired entries: 300 s → 450 s → 675 s → 1013 s. Go's
    Duration.Round(time.Second) rounds 1012.5 s up (pkg/maps/ctmap/ctmap.go:911@82999990); Python's round gave
    1012."""
    lab.flush_ct()
    seen = []
    for _ in range(3):
        lab.clock.advance(lab.gc.state()["interval"])
        _expire(lab, 2)
        run = lab.gc.run()
        assert 0 < run.ratio < 0.05 and run.adjusted_ratio == run.ratio  # on time: not scaled
        seen.append(run.next_interval)
    assert seen == [450, 675, 1013]


def test_an_early_run_scales_its_ratio(lab):
    """GetInterval multiplies the ratio of a run that came before the expected interval by expected/actual
    (pkg/maps/ctmap/ctmap.go:861-866@82999990): 10% of the TCP map deleted 150 s into a 450 s interval counts as
    30%, and the interval drops to 450 × 0.7 = 315 s where an on-time run would keep 450 s."""
    lab.flush_ct()
    tcp_size = lab.config.ct_tcp_size
    _expire(lab, tcp_size // 100 + 1)  # just over 1%: 300 s → 450 s
    first = lab.gc.run()
    assert (first.interval, first.next_interval) == (300, 450)
    lab.clock.advance(150)
    _expire(lab, tcp_size // 10 + 1)  # just over 10%, 150 s of an expected 450 s
    run = lab.gc.run()
    # The lab clock also moves with wall time: the writes above may take a second, so the run came 150-152 s in.
    assert 0.1 < run.ratio < 0.1001 and 150 <= run.actual <= 152 and run.expected == 450
    scaled = run.ratio * 450 / run.actual  # ~0.3 (> 0.25): the interval shrinks by it, to the nearest second
    want = math.floor(450 * (1 - scaled) + 0.5)  # Go's Round: half away from zero (positive here)
    assert want in (315, 316) and run.next_interval == want and lab.gc.state()["interval"] == want


def test_max_interval_caps_the_next_interval(lab):
    """--conntrack-gc-max-interval caps the result (pkg/maps/ctmap/ctmap.go:869-871@82999990) and not the value
    the next calculation starts from (ctmap.go:917@82999990): capped at 400 s, the next run 400 s later counts as
    early against 450 s."""
    lab.flush_ct()
    lab.gc.set_max_interval(400)
    try:
        _expire(lab, 2)
        run = lab.gc.run()
        assert run.next_interval == 400 and lab.gc.state()["cached"] == 450
        lab.clock.advance(400)
        _expire(lab, 2)
        run = lab.gc.run()
        assert (run.actual, run.expected, run.next_interval) == (400, 450, 400)
        assert run.adjusted_ratio == run.ratio * 450 / 400
    finally:
        lab.gc.set_max_interval(0)


def test_gc_scans_as_the_release_does(lab):
    """Without --mode, a 1.16 lab's GC reads one entry per syscall (per-entry), as v1.16's agent does."""
    assert lab.config.cilium == "1.16" and lab.gc.run().mode == "per-entry"


def test_timer_runs_when_the_lab_clock_is_due(lab):
    """With the timer on, moving the lab clock past the interval makes the lab's GC process run within a few
    seconds, and the history records the run; off again, nothing more runs."""
    runs = len(lab.gc.history())
    lab.gc.set_timer(True)
    try:
        interval = lab.gc.state()["interval"]
        lab.clock.advance(interval + 1)
        wait_for(lambda: len(lab.gc.history()) > runs, timeout=5, what="the timer's GC run")
    finally:
        lab.gc.set_timer(False)
    assert lab.gc.state()["last_run"] is not None
    n = len(lab.gc.history())
    lab.clock.advance(lab.gc.state()["interval"] + 1)
    time.sleep(2)  # two of the process's checks: it must not run with the timer off
    assert len(lab.gc.history()) == n


@pytest.fixture
def own_lab(_require_datapath):
    """A lab of its own: deleting a pod changes the topology, which the shared labs must keep."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("dpdel"), config=DatapathConfig(routing="native", gc_timer=False))
    yield lab
    lab.down()


def test_deleting_a_pod_flushes_its_entries_everywhere(own_lab):
    """Deleting b2 removes it from its Services, its endpoint and ipcache entries, and every CT and NAT row
    naming 198.18.2.12 on both nodes (rows of other pods stay); its namespace is gone and the lab is healthy."""
    lab = own_lab
    b2 = lab.pod("b2").ip
    lab.services.add("web", 80, ["b2:8080"], type="LoadBalancer")
    ext = lab.external("ext").tcp("web", 80)
    assert ext.open().ok  # DSR: node-b's NAT row names b2
    keep = lab.pod("a2").tcp("b1", 8080)
    assert keep.open().ok
    assert lab.pod("a1").tcp("b2", 8080).open().ok
    naming = lambda: [(n, r) for n in ("node-a", "node-b") for r in lab.ct(n) if b2 in (r.src, r.dst)]  # noqa: E731
    assert naming() and [r for r in lab.nat("node-b") if b2 in (r.src, r.dst)]
    others = {n: {(r.dir, r.src, r.dst, r.sport) for r in lab.ct(n) if b2 not in (r.src, r.dst)}
              for n in ("node-a", "node-b")}

    before = len(naming())
    gone = lab.delete_pod("b2")
    assert gone["backends"] == ["web/b2:8080"]
    assert sum(gone["ct"].values()) == before and gone["nat"] == {"node-a": 0, "node-b": 1}
    assert naming() == [] and lab.nat("node-b") == []
    for n in ("node-a", "node-b"):
        assert others[n] <= {(r.dir, r.src, r.dst, r.sport) for r in lab.ct(n)}
    assert lab.services.get("web").backends == ()
    assert "b2" not in lab.topology.names() and "lk-dpdel-b2" not in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert lab.health() == []
    assert keep.send(b"still here").ok



def test_cli_gc_run_status_and_timer(lab):
    """`labkit gc run --json` reports each map's counts and the next interval; `gc status` shows the run;
    `gc timer on|off` switches the timer the lab's GC process reads."""
    import json
    import sys

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", lab.name, *argv],
                              capture_output=True, text=True, check=True).stdout

    lab.pod("a1").ping("b1")
    lab.clock.advance(61)
    run = json.loads(cli("gc", "run", "--json", "--mode", "per-entry"))
    assert run["mode"] == "per-entry" and run["deleted"] >= 2 and run["interval"] == 300
    assert {(m["node"], m["map"]) for m in run["maps"]} == {(n, m) for n in ("node-a", "node-b") for m in CT_MAPS}
    status = cli("gc", "status")
    assert f"interval {run['next_interval']} s" in status and f"last run at lab clock {run['now']}" in status
    assert "is on" in cli("gc", "timer", "on") and lab.gc.state()["timer"] is True
    cli("gc", "timer", "off")
    assert lab.gc.state()["timer"] is False
    assert "CT GC" in cli("status")
