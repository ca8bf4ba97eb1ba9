"""The ``labkit`` command line against a real lab through a real labkitd: the shared ``dptest`` lab (root's,
made in-process and reset per test; labkitd adopts it by name), and a lab an unprivileged user brings up
with the command alone.

A labkitd must answer on the default socket: :func:`labkitd` starts one for this module when none does (and
stops it after), or uses the one that runs (and leaves it running).
"""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time

import pytest

from labtag import tagged

LABKIT = [sys.executable, "-m", "labkit", "cli"]
CT_JSON_KEYS = {"proto", "dir", "src", "dst", "flags", "rev_nat", "backend_id", "packets", "bytes", "expires",
                "related", "remaining", "expired"}
#: The unprivileged user the module makes for itself (and removes).
LEARNER = "labkit-clitest"


@pytest.fixture(scope="module", autouse=True)
def labkitd(_require_datapath):
    """A labkitd answering on the default socket for the whole module: the running one, or one started here
    (and stopped after the module)."""
    from labkit.door import api, daemon

    path = api.socket_path()
    started = False
    if daemon.status(path) is None:
        started, _ = daemon.start(path)
    yield path
    if started:
        daemon.stop(path)


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


def test_ct_list_is_lab_ct(lab):
    """`labkit ct list node-a` (through labkitd) prints exactly the rows lab.ct('node-a') reads in-process, in
    cilium-dbg's grammar, and --json the same rows."""
    from labkit.maps.ct import CT_MAPS, list_text

    assert ping(lab).returncode == 0
    proc = labkit(lab, "ct", "list", "node-a")
    assert proc.returncode == 0, proc.stderr
    rows = lab.ct("node-a")
    assert rows, "the ping left rows"
    assert proc.stdout == list_text([[r for r in rows if r.map == m] for m in CT_MAPS], None)
    proc = labkit(lab, "ct", "list", "node-a", "--json")
    drop = ("remaining", "expired")  # measured on the clock at each read
    assert [{k: v for k, v in r.items() if k not in drop} for r in json.loads(proc.stdout)] == \
        [{k: v for k, v in r.to_json(0).items() if k not in drop} for r in rows]


def test_ct_list_show_command(lab):
    """ct list --show-command starts with the bpftool commands as '# ' lines."""
    proc = labkit(lab, "ct", "list", "node-a", "--show-command")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == [f"# {c}" for c in lab.ct_command("node-a")]


def test_ct_list_imports_no_pyroute2_or_bcc(lab):
    """ct list and nat list, clients of labkitd, load neither pyroute2 nor bcc (their speed is measured in
    `make bench`)."""
    code = (
        "import sys; from labkit.cli import main\n"
        f"rc = main(['--lab', {lab.name!r}, 'ct', 'list', 'node-a'])\n"
        f"rc = rc or main(['--lab', {lab.name!r}, 'nat', 'list', 'node-a'])\n"
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


def test_no_labkitd_is_one_line(lab, tmp_path):
    """With LABKIT_DOOR where no labkitd listens, a lab command prints one line saying how to start it (exit 1)."""
    sock = tmp_path / "none.sock"
    proc = subprocess.run(LABKIT + ["--lab", lab.name, "ct", "list", "node-a"], capture_output=True, text=True,
                          timeout=30, env={**os.environ, "LABKIT_DOOR": str(sock)})
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith(f"labkit: error: no labkitd answers on {sock} (") and proc.stderr.count("\n") == 1


# -- an unprivileged user --------------------------------------------------------------------
class Learner:
    """The module's unprivileged user; :meth:`labkit` runs the command as them."""

    def __init__(self, name: str, door):
        entry = pwd.getpwnam(name)
        self.name, self.uid, self.home, self.door = name, entry.pw_uid, entry.pw_dir, door

    def key(self, lab: str) -> str:
        return f"{lab}_u{self.uid}"

    def labkit(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """``labkit ARGS`` run as this user (runuser), on the module's labkitd, in their home."""
        argv = ["runuser", "-u", self.name, "--", "env", "-u", "LABKIT_LAB", f"LABKIT_DOOR={self.door}",
                sys.executable, "-m", "labkit", "cli", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.home,
                              stdin=subprocess.DEVNULL)


def _root_cleanup(key: str) -> None:
    """Root (an instructor) removes what user lab ``key`` recorded, if anything."""
    subprocess.run(LABKIT + ["--lab", key, "cleanup"], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def learner(labkitd):
    """A user made for this module (useradd -m), neither root nor an instructor; removed with their home and
    labs at the end."""
    subprocess.run(["userdel", "-r", "-f", LEARNER], capture_output=True)  # a previous run's, if it was left
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", LEARNER], check=True, capture_output=True)
    user = Learner(LEARNER, labkitd)
    _root_cleanup(user.key("demo"))
    try:
        yield user
    finally:
        _root_cleanup(user.key("demo"))
        subprocess.run(["userdel", "-r", "-f", LEARNER], capture_output=True)


def test_a_user_runs_their_own_lab(lab, learner):
    """As an unprivileged user: `labkit up` brings up their lab demo (key demo_u<uid>), `labkit list` shows it
    and not root's, `labkit exec a1 -- id -u` runs as them, naming another's lab is refused or not theirs, an
    instructor (root) reaches it by key, and `labkit down` removes it."""
    key = learner.key("demo")
    up = learner.labkit("up", timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "lab demo is up" in up.stdout and "labkit --lab demo exec a1 -- ping -c1 198.18.2.11" in up.stdout

    listed = learner.labkit("list", "--json")
    assert listed.returncode == 0, listed.stderr
    labs = json.loads(listed.stdout)
    assert [(d["name"], d["key"], d["owner_uid"], d["owner"]) for d in labs] == [("demo", key, learner.uid, LEARNER)]
    assert lab.name not in {d["key"] for d in labs} | {d["name"] for d in labs}
    table = learner.labkit("list").stdout.splitlines()
    owner = table[0].index("OWNER")
    assert table[1].split()[0] == "demo" and table[1][owner:].split()[0] == LEARNER

    me = learner.labkit("exec", "a1", "--", "id", "-u")
    assert me.returncode == 0, me.stderr
    assert me.stdout.strip() == str(learner.uid)
    ping = learner.labkit("exec", "a1", "--", "ping", "-c", "1", "-W", "2", "198.18.2.11")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    ct = learner.labkit("ct", "list", "node-a")
    assert ct.returncode == 0 and "ICMP OUT 198.18.1.11:" in ct.stdout, ct.stdout + ct.stderr

    # root's lab by its name is the user's own lab of that name, which is not up
    theirs = learner.labkit("--lab", lab.name, "ct", "list", "node-a")
    assert theirs.returncode == 1 and theirs.stdout == ""
    assert theirs.stderr == f"labkit: error: lab '{lab.name}' is not up; start it with `labkit --lab {lab.name} up`\n"
    # another user's lab by key is refused, whether or not it exists
    other = learner.labkit("--lab", f"demo_u{learner.uid + 1}", "ct", "list", "node-a")
    assert other.returncode == 1 and other.stderr.count("\n") == 1
    assert other.stderr.startswith("labkit: error: ") and "refused" in other.stderr

    st = subprocess.run(LABKIT + ["--lab", key, "status", "--json"], capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["key"] == key

    down = learner.labkit("down", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert down.stdout == "lab demo: taken down by labkitd; nothing of it is left\n"
    assert json.loads(learner.labkit("list", "--json").stdout) == []
    again = learner.labkit("down")
    assert again.returncode == 0 and again.stdout == "lab demo is not up: nothing to take down\n"


def test_a_user_runs_doctor_and_not_answers(learner):
    """As an unprivileged user, `labkit doctor` reports what it can see and leaves the rest to sudo; `labkit
    answers` is refused in one line."""
    doc = learner.labkit("doctor", timeout=120)
    assert doc.returncode in (0, 1) and "Traceback" not in doc.stderr, doc.stderr
    lines = doc.stdout.splitlines()
    assert lines[0].split()[:2] == ["ok", "labkitd"]
    assert lines[-1].endswith("`sudo labkit doctor` checks the rest")
    ans = learner.labkit("answers", "02")
    assert ans.returncode == 1 and ans.stdout == ""
    assert ans.stderr == "labkit: error: answers are for instructors (root or the group labkit-instructors)\n"
