"""Lab life cycle on the real kernel: idempotent up, rebuild, down leaves nothing,
bad input leaves nothing, and the host namespace is never touched."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit import Lab, Topology
from labkit.net import netns as _netns
from labkit.errors import (
    DatapathError,
    LabBusyError,
    LabkitError,
    NotFoundError,
    PrivilegeError,
    TopologyError,
)
from labkit.lab import BPFFS_ROOT
from labkit.net.ledger import RUN_DIR, LabLock, Ledger, lab_dir, process_start_time

from labtag import tagged

from .hostsnap import differences, snapshot
from .util import wait_for

REPO = Path(__file__).resolve().parents[2]


def assert_nothing_left(name: str, topo: Topology | None = None) -> None:
    """No namespace, pin, state, lock or cgroup of lab ``name`` exists."""
    topo = topo or Topology.default(name)
    left = [ns for ns in topo.all_netns() if _netns.exists(ns)]
    assert not left, f"namespaces left: {left}"
    assert not (BPFFS_ROOT / name).exists(), "pins left"
    assert not lab_dir(name).exists(), "state left"
    assert not (RUN_DIR / f"{name}.lock").exists(), "lock left"
    from labkit.net.build import cgroup_root

    root = cgroup_root()
    assert root is None or not (root / "labkit" / name).exists(), "cgroup left"


def test_up_is_idempotent(lab):
    """Lab.up on a healthy lab attaches to it instead of rebuilding."""
    created = lab.state.created
    t = time.monotonic()
    again = Lab.up(lab.name, config=lab.config)
    assert again.state.created == created
    assert time.monotonic() - t < 1.0
    assert again.health() == []


def test_two_labs_side_by_side(lab, native_lab):
    """Two labs with the same addresses work at once, each in its own namespaces and maps."""
    for each in (lab, native_lab):
        r = each.pod("a1").exec("ping", "-c", "1", "-W", "2", each.pod("b2").ip)
        assert r.returncode == 0, (each.name, r.stdout)
    assert len([r for r in lab.ct("node-a") if not r.related]) == 1
    assert len([r for r in native_lab.ct("node-a") if not r.related]) == 1
    assert lab.pin_dir("node-a") != native_lab.pin_dir("node-a")


def test_down_leaves_nothing():
    """down removes every object the ledger recorded and nothing of the lab remains."""
    name = tagged("dpdown")
    lab = Lab.up(name, routing="native")
    entries = Ledger(name).entries()
    kinds = {e["kind"] for e in entries}
    assert {"netns", "pin", "pindir", "process", "tc-filter", "cgroup", "file", "dir"} <= kinds
    pids = [(e["pid"], e["start"]) for e in entries if e["kind"] == "process"]
    t = time.monotonic()
    lab.down()
    assert time.monotonic() - t < 5
    assert_nothing_left(name)
    assert all(process_start_time(pid) != start for pid, start in pids)


def _echo_hooks(step) -> list:
    """The hooks an echo request and its reply passed, in order (packets of the fabric's own that happen to
    cross a node in the step's window are not the ping's)."""
    return [f.hook for f in step.flows if f.event.before.proto == socket.IPPROTO_ICMP]


def test_a_build_loaded_ahead_is_the_same_datapath():
    """A build that came twice in a row is loaded ahead: the third build of a lab in one process takes the images
    its loader loaded while the network was made; it forwards, tracks and lists rows as the first, and goes down
    leaving nothing."""
    from labkit.lab.standby import STANDBY

    STANDBY.forget()  # the builds of this process's earlier tests: this test makes a pattern of its own
    name = tagged("dpahead")
    first = Lab.up(name, routing="native")
    first.reset()
    ping = first.pod("a1").ping("b1")
    rows = sorted((r.proto_name, r.dir, r.related) for r in first.ct("node-a"))
    assert first.state.images == {"node-a": "cached", "node-b": "cached"}
    first.down()
    Lab.up(name, routing="native").down()
    lab = Lab.up(name, routing="native")
    try:
        assert lab.state.images == {"node-a": "preloaded", "node-b": "preloaded"}
        lab.reset()
        again = lab.pod("a1").ping("b1")
        assert ping.ok and again.ok and _echo_hooks(ping) and _echo_hooks(again) == _echo_hooks(ping)
        assert sorted((r.proto_name, r.dir, r.related) for r in lab.ct("node-a")) == rows
    finally:
        lab.down()
    assert_nothing_left(name)


def test_broken_lab_is_rebuilt():
    """Lab.up rebuilds a lab whose pod server died, from its ledger (a dead agent alone is restarted:
    test_agent.py)."""
    name = tagged("dpbroken")
    lab = Lab.up(name, routing="native")
    try:
        server = next(e for e in Ledger(name).entries("process") if e["name"] == "podserver-a1")
        os.kill(server["pid"], signal.SIGKILL)
        wait_for(lambda: process_start_time(server["pid"]) is None, what="the pod server to die")
        assert any("podserver-a1" in p for p in lab.health())
        rebuilt = Lab.up(name, routing="native")
        assert rebuilt.state.created != lab.state.created
        assert rebuilt.health() == []
        assert rebuilt.pod("a1").exec("ping", "-c", "1", "-W", "2", rebuilt.pod("b1").ip).returncode == 0
    finally:
        Lab.cleanup(name)
    assert_nothing_left(name)


def test_cleanup_after_the_building_process_was_killed():
    """`labkit cleanup` removes what a killed `up` had created, by its ledger."""
    name = tagged("dpkilled")
    proc = subprocess.Popen([sys.executable, "-m", "labkit", "cli", "--lab", name, "up"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(Ledger(name).entries("netns")) >= 4, timeout=20, what="the build to start")
    finally:
        proc.kill()
        proc.wait()
    assert Ledger(name).entries()
    r = subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", name, "cleanup"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert_nothing_left(name)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: Topology.build(tagged("dpbad"), {"node-a": ["a1", "a1"]}), TopologyError, "'a1' is used twice"),
        (lambda: Topology.build(tagged("dpbad"), {"node-a": ["a-very-long-name"]}), TopologyError, "at most 15"),
        (lambda: Topology.build(tagged("dpbad"), {"node-a": ["a1"], "a1": []}), TopologyError, "used twice"),
    ],
)
def test_bad_topology_builds_nothing(make, error, message):
    """A topology error is raised before anything is created."""
    with pytest.raises(error, match=message):
        Lab.up(tagged("dpbad"), topology=make())
    assert_nothing_left(tagged("dpbad"))


def test_overlapping_cidrs_build_nothing():
    """Overlapping pod CIDRs are refused before any namespace exists."""
    topo = Topology.default(tagged("dpbad"))
    node_b = topo.nodes[1].__class__("node-b", topo.nodes[1].ip, topo.nodes[0].pod_cidr, 2)
    bad = Topology(tagged("dpbad"), (topo.nodes[0], node_b), ())
    with pytest.raises(TopologyError, match="overlaps"):
        Lab.up(tagged("dpbad"), topology=bad)
    assert_nothing_left(tagged("dpbad"))


def test_unknown_pod_and_node_name_the_choices(lab):
    """Asking for a pod or node that does not exist lists the ones that do."""
    with pytest.raises(NotFoundError, match=rf"pod 'a9' not found in lab '{tagged('dptest')}' \(pods: a1, a2, b1, b2\)"):
        lab.pod("a9")
    with pytest.raises(LookupError, match=r"node 'node-z' not found .*node-a, node-b"):
        lab.node("node-z")


def test_lab_held_by_another_process():
    """While another live process holds a lab, up fails naming it and creates nothing."""
    name = tagged("dpbusy")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys,time;from labkit.net.ledger import LabLock;LabLock(sys.argv[1],'test holder').acquire();"
         "print('held',flush=True);time.sleep(60)", name],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LabBusyError, match=rf"pid {holder.pid} \(test holder\)"):
            Lab.up(name)
        assert not lab_dir(name).exists() and not _netns.exists(f"lk-{name}-node-a")
    finally:
        holder.kill()
        holder.wait()
    lock = LabLock(name, "test").acquire()
    lock.release(remove=True)
    assert_nothing_left(name)


def test_compile_error_leaves_nothing(tmp_path):
    """A datapath that fails to compile raises DatapathError with BCC's message; nothing is left."""
    bpf = tmp_path / "bpf"
    shutil.copytree(REPO / "bpf", bpf)
    (bpf / "bpf_lxc.c").write_text((bpf / "bpf_lxc.c").read_text() + "\nthis is not C;\n")
    code = (
        "from labkit import Lab\nfrom labkit.errors import DatapathError\n"
        "try:\n Lab.up('" + tagged("dpcc") + "')\nexcept DatapathError as e:\n print('DatapathError', str(e)[:2000])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "LABKIT_BPF_DIR": str(bpf)}, timeout=120)
    assert r.stdout.startswith("DatapathError"), r.stdout + r.stderr
    assert "could not compile" in r.stdout
    assert_nothing_left(tagged("dpcc"))


def test_no_root_gets_doctors_message():
    """Without root, up fails with the doctor's explanation and the command that fixes it."""
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run as an unprivileged user")
    code = "from labkit import Lab\ntry:\n Lab.up('" + tagged("dpnoroot") + "')\nexcept PermissionError as e:\n print(e)"
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all",
                        sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "HOME": "/tmp"},
                       cwd="/tmp")
    assert "cannot run the lab datapath" in r.stdout, r.stdout + r.stderr
    assert "fix: run as root" in r.stdout
    assert_nothing_left(tagged("dpnoroot"))


def test_host_namespace_unchanged(host_before):
    """After every lab of the run is down, the host's links, addresses, routes, rules,
    sysctls and qdiscs are exactly as before the first lab came up."""
    for name in (tagged("dptest"), tagged("dpnative")):
        Lab.cleanup(name)
        assert_nothing_left(name)
    assert host_before, "the session did not snapshot the host"
    assert differences(host_before, snapshot()) == []


def test_doctor_passes_on_this_machine():
    """`labkit doctor --json` runs every check, including compiling and attaching a probe, and all pass."""
    import json

    proc = subprocess.Popen([sys.executable, "-m", "labkit", "cli", "doctor", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=120)
    checks = {c["name"]: c for c in json.loads(out)}
    assert "compile+attach" in checks
    assert [c for c in checks.values() if not c["ok"]] == [] and proc.returncode == 0
    # The probe is named after the doctor's pid (another test run's doctor may be probing right now).
    assert f"lk-doctor-{proc.pid}" not in os.listdir(_netns.NETNS_DIR), "doctor left its probe"
