"""The ledger of created objects, lab.json, and the lab lock — all under a temporary RUN_DIR."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import pytest

from labkit.net import ledger as ledger_mod
from labkit.errors import LabBusyError, LabkitError, LabStateError
from labkit.net.ledger import LabLock, Ledger, lab_dir, list_labs, process_start_time


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr("labkit.net.ledger.RUN_DIR", tmp_path)
    return tmp_path


def test_lab_dir_reads_run_dir_at_call_time(run_dir):
    """lab_dir follows the module's RUN_DIR as it is when called."""
    assert ledger_mod.RUN_DIR == run_dir
    assert lab_dir("demo") == run_dir / "demo"


def test_start_creates_dir_and_records_it(run_dir):
    """start() makes <RUN_DIR>/<lab>/ledger.jsonl and records the directory as the first entry, once."""
    led = Ledger("demo")
    assert not led.exists() and led.entries() == []
    led.start()
    assert led.exists() and led.path == run_dir / "demo" / "ledger.jsonl"
    assert led.entries() == [{"kind": "dir", "path": str(run_dir / "demo")}]
    led.start()  # restarting an existing lab does not record the directory again
    assert len(led.entries()) == 1
    assert list_labs() == ["demo"]


def test_record_appends_json_lines(run_dir):
    """record() appends one sorted-key JSON line per object and returns the entry; entries(kind) filters."""
    led = Ledger("demo")
    led.start()
    e = led.record("netns", name="lk-demo-a1")
    assert e == {"kind": "netns", "name": "lk-demo-a1"}
    led.record("pin", path="/sys/fs/bpf/x")
    led.record("netns", name="lk-demo-a2")
    lines = led.path.read_text().splitlines()
    assert json.loads(lines[-1]) == {"kind": "netns", "name": "lk-demo-a2"}
    assert lines[1] == json.dumps({"kind": "netns", "name": "lk-demo-a1"}, sort_keys=True)
    assert [x["name"] for x in led.entries("netns")] == ["lk-demo-a1", "lk-demo-a2"]
    assert [x["kind"] for x in led.entries()] == ["dir", "netns", "pin", "netns"]


def test_record_process_has_start_time(run_dir):
    """record_process stores the pid with its /proc start time."""
    led = Ledger("demo")
    led.start()
    e = led.record_process("monitor", os.getpid(), role="x")
    assert e["pid"] == os.getpid() and e["start"] == process_start_time(os.getpid()) and e["role"] == "x"


def test_forget(run_dir):
    """forget() rewrites the ledger without the entries the predicate accepts, keeping order."""
    led = Ledger("demo")
    led.start()
    for i in range(4):
        led.record("file", path=f"/f{i}")
    led.forget(lambda e: e.get("path") in ("/f1", "/f3"))
    assert [e.get("path") for e in led.entries("file")] == ["/f0", "/f2"]
    assert not list(run_dir.glob("demo/*.tmp"))


def test_state(run_dir):
    """read_state raises LabStateError before write_state; write_state is recorded once in the ledger."""
    led = Ledger("demo")
    led.start()
    with pytest.raises(LabStateError) as info:
        led.read_state()
    assert "demo" in str(info.value) and isinstance(info.value, RuntimeError)
    led.write_state({"status": "building"})
    led.write_state({"status": "up", "n": 1})
    assert led.read_state() == {"status": "up", "n": 1}
    assert led.entries("file") == [{"kind": "file", "path": str(run_dir / "demo" / "lab.json")}]


def test_list_labs_ignores_dirs_without_ledger(run_dir):
    """list_labs lists only directories holding a ledger."""
    (run_dir / "stray").mkdir()
    Ledger("b").start()
    Ledger("a").start()
    assert list_labs() == ["a", "b"]


def test_lock_second_holder_busy(run_dir):
    """A second LabLock on the same lab (own fd) raises LabBusyError naming the holder's pid and purpose."""
    first = LabLock("demo", "up").acquire()
    try:
        with pytest.raises(LabBusyError) as info:
            LabLock("demo", "down").acquire()
        err = info.value
        assert isinstance(err, BlockingIOError) and isinstance(err, LabkitError)
        assert err.errno in (errno.EAGAIN, errno.EWOULDBLOCK)
        assert f"pid {os.getpid()}" in str(err) and "(up)" in str(err) and "'demo'" in str(err)
    finally:
        first.release()


def test_lock_other_labs_independent(run_dir):
    """Locks of different labs do not conflict, and a released lock can be taken again."""
    with LabLock("one", "up"), LabLock("two", "up"):
        pass
    with LabLock("one", "again") as lock:
        assert lock.fd is not None
    assert lock.fd is None


def test_lock_release_remove(run_dir):
    """release(remove=True) deletes the lock file; plain release keeps it."""
    lock = LabLock("demo", "up").acquire()
    path = run_dir / "demo.lock"
    assert path.exists() and f"pid {os.getpid()} (up)" == path.read_text()
    lock.release()
    assert path.exists()
    lock = LabLock("demo", "down").acquire()
    lock.release(remove=True)
    assert not path.exists()
    lock.release(remove=True)  # idempotent


def test_process_start_time_self():
    """The start time of this process is an int that does not change."""
    t = process_start_time(os.getpid())
    assert isinstance(t, int) and t > 0
    assert process_start_time(os.getpid()) == t


def test_process_start_time_dead_pid():
    """A reaped pid has no start time."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert process_start_time(proc.pid) is None


def test_process_start_time_zombie_is_gone():
    """An exited, unreaped child counts as gone (None) and is reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    else:
        pytest.fail("child did not exit")
    assert process_start_time(proc.pid) is None
    assert not os.path.exists(f"/proc/{proc.pid}")
    proc.wait()  # Popen copes with the already-reaped child


def test_mkdir_shared_parent_makes_the_parent_again_when_another_lab_removed_it(tmp_path, monkeypatch):
    """A lab's pin or cgroup directory is made even when another lab's cleanup removes the shared, empty parent
    between its creation and the child's (labs graded side by side met this as FileNotFoundError/FileExistsError)."""
    from pathlib import Path

    parent, child = tmp_path / "labkit", tmp_path / "labkit" / "g0"
    real_mkdir, removed = Path.mkdir, []

    def racing_mkdir(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self == parent and not removed:  # the other lab's _remove_shared_parents runs right now
            removed.append(True)
            os.rmdir(parent)

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    ledger_mod.mkdir_shared_parent(child)
    assert removed and child.is_dir()
    with pytest.raises(FileExistsError):  # a lab's own directory is new: one already there is an error
        ledger_mod.mkdir_shared_parent(child)
