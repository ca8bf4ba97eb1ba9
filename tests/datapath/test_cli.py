"""The ``labkit`` command line against a real lab (the shared ``dptest`` lab, reset per test)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from labtag import tagged

LABKIT = [sys.executable, "-m", "labkit", "cli"]
CT_JSON_KEYS = {"proto", "dir", "src", "dst", "flags", "rev_nat", "backend_id", "packets", "bytes", "expires",
                "related", "remaining", "expired"}


def labkit(lab, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``labkit --lab <lab> ARGS`` and capture its output as text."""
    return subprocess.run(LABKIT + ["--lab", lab.name, *args], capture_output=True, text=True, timeout=timeout)


def ping(lab, src: str = "a1", dst: str = "b1", count: int = 2) -> subprocess.CompletedProcess:
    """Ping pod ``dst`` from pod ``src`` through ``labkit exec``."""
    return labkit(lab, "exec", src, "--", "ping", "-c", str(count), "-i", "0.2", "-W", "2", lab.topology.pod(dst).ip)


def test_status_json_lists_members(lab):
    """status --json lists every node and pod with the topology's addresses and netns."""
    proc = labkit(lab, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    st = json.loads(proc.stdout)
    assert st["lab"] == lab.name and st["routing"] == "tunnel" and st["health"] == []
    assert {n["name"]: (n["ip"], n["pod_cidr"], n["netns"]) for n in st["nodes"]} == {
        n.name: (n.ip, n.pod_cidr, lab.topology.netns(n.name)) for n in lab.topology.nodes}
    assert {p["name"]: (p["ip"], p["node"], p["netns"]) for p in st["pods"]} == {
        p.name: (p.ip, p.node, lab.topology.netns(p.name)) for p in lab.topology.pods}


def test_status_human(lab):
    """status prints the lab, routing, clock and one table line per member."""
    proc = labkit(lab, "status")
    assert proc.returncode == 0, proc.stderr
    assert f"{lab.name} (up)" in proc.stdout and "tunnel" in proc.stdout and "offset 0 s" in proc.stdout
    for p in lab.topology.pods:
        assert any(line.split()[:3] == [p.name, "pod", p.ip] for line in proc.stdout.splitlines())


def test_exec_ping_exits_0(lab):
    """exec a1 -- ping b1 runs ping inside pod a1 and passes its exit status 0 through."""
    proc = ping(lab)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 received" in proc.stdout


def test_exec_passes_exit_status_through(lab):
    """exec returns the command's own exit status, and 127 for a command that does not exist."""
    assert labkit(lab, "exec", "node-a", "--", "sh", "-c", "exit 7").returncode == 7
    proc = labkit(lab, "exec", "a1", "--", "no-such-command-labkit")
    assert proc.returncode == 127 and "command not found" in proc.stderr


def test_exec_runs_in_pod_namespace(lab):
    """exec a1 runs in a1's network namespace (it sees a1's address)."""
    proc = labkit(lab, "exec", "a1", "--", "ip", "-4", "-o", "addr", "show", "dev", "eth0")
    assert proc.returncode == 0, proc.stderr
    assert f" {lab.topology.pod('a1').ip}/" in proc.stdout


def test_ct_list_after_ping(lab):
    """After a ping, ct list node-a shows the ICMP OUT row and its related twin in cilium-dbg grammar."""
    a1, b1 = lab.topology.pod("a1").ip, lab.topology.pod("b1").ip
    assert (a1, b1) == ("198.18.1.11", "198.18.2.11")
    assert ping(lab).returncode == 0
    proc = labkit(lab, "ct", "list", "node-a")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    icmp = [line for line in lines if line.startswith(f"ICMP OUT {a1}:") and f"-> {b1}:0" in line]
    assert icmp, proc.stdout
    assert any(" related " in line for line in icmp), proc.stdout
    rows = [line for line in lines if line]
    assert all(line.split()[0] in ("TCP", "ICMP", "UDP", "ANY") for line in rows), "only rows are printed"
    assert lines.count("") == 2 and lines[-1] == "", "a blank line after each of the two maps"


def test_ct_list_json(lab):
    """ct list --json parses and every row has the documented keys, remaining/expired included."""
    assert ping(lab).returncode == 0
    proc = labkit(lab, "ct", "list", "node-a", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows
    for row in rows:
        assert CT_JSON_KEYS <= set(row), CT_JSON_KEYS - set(row)
    assert any(r["proto"] == "ICMP" and r["related"] for r in rows)


def test_ct_list_remaining(lab):
    """ct list -d adds '(remaining: N sec(s))' to every row."""
    assert ping(lab).returncode == 0
    proc = labkit(lab, "ct", "list", "node-a", "-d")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line]  # the blank line after each map aside
    assert lines and all("(remaining: " in line for line in lines)


def test_ct_list_show_command(lab):
    """ct list --show-command starts with the bpftool commands as '# ' lines."""
    proc = labkit(lab, "ct", "list", "node-a", "--show-command")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == [f"# {c}" for c in lab.ct_command("node-a")]


def test_ct_list_imports_no_pyroute2_or_bcc(lab):
    """ct list loads neither pyroute2 nor bcc (its speed is measured in `make bench`)."""
    code = (
        "import sys; from labkit.cli import main\n"
        f"rc = main(['--lab', {lab.name!r}, 'ct', 'list', 'node-a'])\n"
        "heavy = [m for m in ('pyroute2', 'bcc', 'networkx') if m in sys.modules]\n"
        "print('HEAVY', heavy); sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_clock_advance(lab):
    """clock advance 100 moves the lab clock now (clock show --json) forward by at least 100 s."""
    before = json.loads(labkit(lab, "clock", "show", "--json").stdout)
    proc = labkit(lab, "clock", "advance", "100")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("lab clock now ") and "(offset 100 s)" in proc.stdout
    after = json.loads(labkit(lab, "clock", "show", "--json").stdout)
    assert after["now"] - before["now"] >= 100
    assert after["offset"] == before["offset"] + 100


def test_clock_advance_negative_fails(lab):
    """clock advance -5 is refused with exit 1 and leaves the clock alone."""
    proc = labkit(lab, "clock", "advance", "-5")
    assert proc.returncode == 1 and proc.stderr.startswith("labkit: error:")
    assert lab.clock.offset == 0


def test_trace_after_ping(lab):
    """trace --last 20 --json after a ping has a from-container record of node-a for the echo request."""
    a1, b1 = lab.topology.pod("a1").ip, lab.topology.pod("b1").ip
    assert ping(lab, count=1).returncode == 0
    deadline = time.monotonic() + 5
    while True:
        proc = labkit(lab, "trace", "--last", "20", "--json")
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in proc.stdout.splitlines()]
        assert len(records) <= 20
        hits = [r for r in records if r["node"] == "node-a" and r["hook"] == "from-container"
                and r["before"]["src"] == a1 and r["before"]["dst"] == b1 and r["before"]["proto"] == "ICMP"]
        if hits or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert hits, records
    assert [r["ts_ns"] for r in records] == sorted(r["ts_ns"] for r in records)


def test_trace_node_filter(lab):
    """trace --node node-b prints only node-b's flows."""
    assert ping(lab, count=1).returncode == 0
    deadline = time.monotonic() + 5
    while True:  # the monitor writes what it drained within a fraction of a second
        proc = labkit(lab, "trace", "--node", "node-b", "--json")
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in proc.stdout.splitlines()]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert records and all(r["node"] == "node-b" for r in records)


def test_exec_unknown_name(lab):
    """exec of a name not in the lab fails with exit 1 and lists the lab's names."""
    proc = labkit(lab, "exec", "nosuchpod", "--", "true")
    assert proc.returncode == 1
    assert proc.stderr.startswith("labkit: error:")
    for name in lab.topology.names():
        assert name in proc.stderr


def test_ct_list_unknown_node(lab):
    """ct list of an unknown node fails with exit 1 and lists the nodes."""
    proc = labkit(lab, "ct", "list", "node-z")
    assert proc.returncode == 1
    assert "node-z" in proc.stderr and "node-a, node-b" in proc.stderr


def test_lab_not_up(lab):
    """A command for a lab that is not up says how to start it (exit 1)."""
    proc = subprocess.run(LABKIT + ["--lab", tagged("dpnotup"), "status"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert f"labkit --lab {tagged('dpnotup')} up" in proc.stderr
