"""labkit.door.sandbox and labkit.door.bpftool on the real kernel, as root: a process started in a pod runs as
its user with exactly CAP_NET_RAW and CAP_NET_ADMIN, in the pod's namespace and cgroup and nowhere else.

The file owns everything it uses, named after its pid: two namespaces ``lk-sbtest-<pid>-x`` and ``-y`` joined
by a veth (198.18.250.1/24 ↔ .2/24), a cgroup ``lk-sbtest-<pid>`` under the cgroup2 mount, a user
``lksbt<pid>`` (home in a temporary directory) with a supplementary group ``lksbg<pid>``, and a bpffs
directory ``/sys/fs/bpf/lk-sbtest-<pid>``; all removed at the end.
"""
from __future__ import annotations

import ctypes
import grp
import json
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit.door import bpftool
from labkit.door.sandbox import Person, Started, send_signal, spawn
from labkit.errors import ConfigError
from labkit.net import netns
from labkit.net.build import cgroup_root
from labkit.net.ledger import process_start_time

PID = os.getpid()
NS_X, NS_Y = f"lk-sbtest-{PID}-x", f"lk-sbtest-{PID}-y"
VETH_X, VETH_Y = "sbx0", "sby0"
ADDR_X, ADDR_Y = "198.18.250.1", "198.18.250.2"
USER, GROUP = f"lksbt{PID}", f"lksbg{PID}"
CAPS = "0000000000003000"  # CAP_NET_ADMIN (12) and CAP_NET_RAW (13)
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Pod:
    cgroup: str
    cgroup_rel: str


@dataclass
class Ran:
    started: Started
    status: str
    out: str
    err: str


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _links(name: str) -> dict[str, int]:
    from pyroute2 import IPRoute

    with netns.entered(name):
        with IPRoute() as ipr:
            return {link.get_attr("IFLA_IFNAME"): link.get_attr("IFLA_MTU") for link in ipr.get_links()}


@pytest.fixture(scope="module")
def person(datapath_ready):
    """A user of our own with a home it owns and one supplementary group; removed at the end."""
    home = tempfile.mkdtemp(prefix="lk-sbtest-home-")
    _sh("groupadd", GROUP)
    try:
        _sh("useradd", "-M", "-d", home, "-s", "/usr/sbin/nologin", "-G", GROUP, USER)
        try:
            entry = pwd.getpwnam(USER)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            os.chmod(home, 0o700)
            yield Person.of_uid(entry.pw_uid)
        finally:
            subprocess.run(["userdel", USER], capture_output=True, check=False)
    finally:
        subprocess.run(["groupdel", GROUP], capture_output=True, check=False)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def pod(person):
    """Two namespaces joined by a veth, and a cgroup; every process left in the cgroup is killed at the end."""
    from pyroute2 import IPRoute

    root = cgroup_root()
    assert root is not None, "no cgroup2 mount"
    cgroup = root / f"lk-sbtest-{PID}"
    netns.create(NS_X)
    try:
        netns.create(NS_Y)
        try:
            with netns.entered(NS_X):
                with IPRoute() as ipr:
                    ipr.link("add", ifname=VETH_X, kind="veth",
                             peer={"ifname": VETH_Y, "net_ns_fd": f"{netns.NETNS_DIR}/{NS_Y}"})
                    ipr.addr("add", index=ipr.link_lookup(ifname=VETH_X)[0], address=ADDR_X, prefixlen=24)
                    for name in ("lo", VETH_X):
                        ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
            with netns.entered(NS_Y):
                with IPRoute() as ipr:
                    ipr.addr("add", index=ipr.link_lookup(ifname=VETH_Y)[0], address=ADDR_Y, prefixlen=24)
                    for name in ("lo", VETH_Y):
                        ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
            cgroup.mkdir()
            try:
                yield Pod(str(cgroup), "/" + str(cgroup.relative_to(root)))
            finally:
                _empty_cgroup(cgroup)
                cgroup.rmdir()
        finally:
            netns.remove(NS_Y)
    finally:
        netns.remove(NS_X)


def _empty_cgroup(cgroup: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    from labkit.door import sandbox

    for proc in list(sandbox._wrappers.values()):
        proc.wait(timeout=5)
    sandbox.reap()


def _read_all(fds: dict[str, int], timeout: float) -> dict[str, str]:
    """Read each descriptor to EOF (all at once, so neither pipe fills); closes them."""
    out = {k: b"" for k in fds}
    sel = selectors.DefaultSelector()
    for k, fd in fds.items():
        sel.register(fd, selectors.EVENT_READ, k)
    deadline = time.monotonic() + timeout
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            assert left > 0, f"no EOF within {timeout} s; so far {out}"
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if chunk:
                    out[key.data] += chunk
                else:
                    sel.unregister(key.fd)
    finally:
        for fd in fds.values():
            os.close(fd)
    return {k: v.decode(errors="replace") for k, v in out.items()}


def start(pod: Pod, who: Person, argv: list[str], *, env=None, cwd=None, stdin: bytes | None = None):
    """spawn with pipes for stdio and the status; returns the Started and a function that collects them."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    st_r, st_w = os.pipe()
    in_r, in_w = os.pipe()
    try:
        started = spawn(NS_X, pod.cgroup, who, argv, env=env, cwd=cwd, stdin=in_r, stdout=out_w, stderr=err_w,
                        status_fd=st_w)
    finally:
        for fd in (out_w, err_w, st_w, in_r):
            os.close(fd)
    os.write(in_w, stdin or b"")
    os.close(in_w)

    def collect(timeout: float = 30) -> Ran:
        got = _read_all({"out": out_r, "err": err_r, "status": st_r}, timeout)
        return Ran(started, got["status"], got["out"], got["err"])

    return started, collect


def run(pod: Pod, who: Person, argv: list[str], **kw) -> Ran:
    return start(pod, who, argv, **kw)[1]()


def sh(pod: Pod, who: Person, script: str, **kw) -> Ran:
    return run(pod, who, ["sh", "-c", script], **kw)


def _status(text: str) -> dict[str, str]:
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in text.splitlines() if ":" in line}


def test_runs_as_the_user(pod, person):
    """Real, effective, saved and filesystem uid and gid are the user's, with the user's supplementary groups."""
    ran = sh(pod, person, "id -u; id -g; id -G; grep -E '^(Uid|Gid):' /proc/self/status")
    assert ran.status == "0\n", ran.err
    lines = ran.out.splitlines()
    assert lines[:2] == [str(person.uid), str(person.gid)]
    assert sorted(int(g) for g in lines[2].split()) == sorted(person.groups)
    assert grp.getgrnam(GROUP).gr_gid in person.groups
    status = _status("\n".join(lines[3:]))
    assert status["Uid"].split() == [str(person.uid)] * 4
    assert status["Gid"].split() == [str(person.gid)] * 4


def test_exactly_net_raw_and_net_admin(pod, person):
    """CapInh, CapPrm, CapEff, CapAmb and CapBnd are each 0x3000 (NET_ADMIN + NET_RAW), and NoNewPrivs is 1."""
    ran = run(pod, person, ["cat", "/proc/self/status"])
    status = _status(ran.out)
    assert {k: status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")} == dict.fromkeys(
        ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd"), CAPS)
    assert status["NoNewPrivs"] == "1"


def test_root_is_sandboxed_the_same_way(pod):
    """Root as the person runs as uid 0 with the same two capabilities in every set, and no_new_privs."""
    status = _status(run(pod, Person.of_uid(0), ["cat", "/proc/self/status"]).out)
    assert status["Uid"].split() == ["0"] * 4
    assert [status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")] == [CAPS] * 5
    assert status["NoNewPrivs"] == "1"


def test_setuid_binary_gives_nothing(pod, person):
    """A setuid-root binary runs with the user's ids (no_new_privs): sudo or su cannot give root back."""
    home = Path(person.home)
    suid = home / "suid-id"
    shutil.copy("/usr/bin/id", suid)
    os.chown(suid, 0, 0)
    os.chmod(suid, 0o4755)
    try:
        ran = run(pod, person, [str(suid), "-u"])
        assert (ran.status, ran.out) == ("0\n", f"{person.uid}\n")
        ran = run(pod, person, ["su", "-c", "id -u", "root"])
        assert ran.status != "0\n"
    finally:
        suid.unlink()


def test_ping_and_raw_socket(pod, person):
    """ping reaches the veth peer, and the user's own program (python, no file capabilities) opens a raw socket
    through the ambient CAP_NET_RAW."""
    ran = run(pod, person, ["ping", "-c", "1", "-W", "2", ADDR_Y])
    assert ran.status == "0\n", ran.out + ran.err
    assert "1 received" in ran.out
    ran = run(pod, person, ["/usr/bin/python3", "-c",
                            "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"])
    assert ran.status == "0\n", ran.err


def test_net_admin_in_its_own_namespace(pod, person):
    """`ip link set dev <its veth> mtu 1400` works, as the host sees."""
    try:
        ran = run(pod, person, ["ip", "link", "set", "dev", VETH_X, "mtu", "1400"])
        assert ran.status == "0\n", ran.err
        assert _links(NS_X)[VETH_X] == 1400
    finally:
        run(pod, Person.of_uid(0), ["ip", "link", "set", "dev", VETH_X, "mtu", "1500"])


def test_netns_directories_are_empty(pod, person):
    """/run/netns (and /var/run/netns) show no namespace: other labs' handles cannot be opened."""
    ran = sh(pod, person, "ls -A /run/netns; ls -A /var/run/netns; ip netns list; echo end")
    assert ran.out == "end\n", ran.out
    assert os.listdir(netns.NETNS_DIR), "the host's /run/netns is untouched"
    assert NS_X in os.listdir(netns.NETNS_DIR)


def test_proc_shows_only_its_pid_namespace(pod, person):
    """/proc lists the new PID namespace only: pid 1 is the wrapper, the command is a small pid, and no host
    process (this test's own pid) is there."""
    ran = sh(pod, person, "echo $$; ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; cat /proc/1/cmdline | tr '\\0' ' '")
    me, pids, init = ran.out.split("\n", 2)  # the wrapper's cmdline holds its script's newlines
    listed = {int(p) for p in pids.split()}
    assert int(me) in listed and max(listed) < 50, listed
    assert PID not in listed and os.getppid() not in listed
    assert init.startswith("/bin/sh -c ") and "setpriv" in init


def test_cannot_reach_other_namespaces(pod, person):
    """Opening /proc/1/ns/net, and creating or moving a link into another namespace by path, by pid or by
    name, all fail; nothing moved."""
    before_y = _links(NS_Y)
    script = "\n".join([
        "cat /proc/1/ns/net >/dev/null 2>&1; echo open-init=$?",
        "ip link add lksbp type veth peer name lksbq netns /proc/1/ns/net 2>/dev/null; echo peer-init=$?",
        f"ip link add lksbp type veth peer name lksbq netns {PID} 2>/dev/null; echo peer-pid=$?",
        f"ip link set dev {VETH_X} netns {PID} 2>/dev/null; echo move-pid=$?",
        f"ip link set dev {VETH_X} netns {os.getppid()} 2>/dev/null; echo move-ppid=$?",
        f"ip link set dev {VETH_X} netns {NS_Y} 2>/dev/null; echo move-name=$?",
        f"ip link set dev {VETH_X} netns {netns.NETNS_DIR}/{NS_Y} 2>/dev/null; echo move-path=$?",
        f"ip link set dev {VETH_X} netns /proc/{PID}/ns/net 2>/dev/null; echo move-proc=$?",
        "ip netns add lk-sbtest-evil 2>/dev/null; echo netns-add=$?",
    ])
    ran = sh(pod, person, script)
    results = dict(line.split("=") for line in ran.out.split())
    assert len(results) == 9 and all(rc != "0" for rc in results.values()), results
    assert VETH_X in _links(NS_X)
    assert _links(NS_Y) == before_y
    assert "lksbp" not in _links(NS_X)
    assert not os.path.exists(f"{netns.NETNS_DIR}/lk-sbtest-evil")


_NSID_MOVE = """
import sys
from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
with IPRoute() as ipr:
    msg = ifinfmsg()
    msg["index"] = ipr.link_lookup(ifname=sys.argv[1])[0]
    msg["attrs"] = [("IFLA_IF_NETNSID", int(sys.argv[2]))]
    try:
        ipr.nlm_request(msg, msg_type=RTM_NEWLINK, msg_flags=NLM_F_REQUEST | NLM_F_ACK)
    except Exception as exc:
        sys.exit(f"refused: {exc}")
"""


def _nsids(pod, who) -> dict[int, str]:
    ran = run(pod, who, ["ip", "netns", "list-id"])
    return {int(line.split()[1]): line for line in ran.out.splitlines() if line.startswith("nsid ")}


def test_netnsids_name_only_the_pods_peers(pod, person):
    """The only namespace with an id in the pod's (what IFLA_TARGET_NETNSID can name) is the far side of its
    veth; the host's namespace has none."""
    run(pod, person, ["ip", "-d", "link", "show", VETH_X])  # the kernel gives the peer an id when it shows it
    assert list(_nsids(pod, person)) == [0]
    from pyroute2 import IPRoute

    with netns.entered(NS_Y):
        with IPRoute() as ipr:
            assert ipr.link_lookup(ifname=VETH_Y)  # id 0 is NS_Y, the veth's far side


def test_netnsid_reaches_the_peer_namespace_and_no_other(pod, person):
    """What CAP_NET_ADMIN in the host's user namespace allows and what it does not: a raw RTM_NEWLINK with
    IFLA_TARGET_NETNSID moves a link into the veth peer's namespace (in a lab, the pod's own node: the module
    docstring's known limit, kept inside the lab), and into no namespace without an id in the pod's (ids 1-16 are
    refused, the host's has none)."""
    root = Person.of_uid(0)
    run(pod, root, ["ip", "link", "add", "sbm0", "type", "veth", "peer", "name", "sbm1"])
    try:
        for nsid in range(1, 17):
            ran = run(pod, person, [sys.executable, "-c", _NSID_MOVE, "sbm1", str(nsid)])
            assert ran.status != "0\n", f"moved into nsid {nsid}"
        assert "sbm1" in _links(NS_X) and "sbm1" not in _links(NS_Y)
        ran = run(pod, person, [sys.executable, "-c", _NSID_MOVE, "sbm1", str(next(iter(_nsids(pod, person))))])
        assert ran.status == "0\n" and "sbm1" in _links(NS_Y)  # the peer: the lab's own node
    finally:
        run(pod, root, ["ip", "link", "del", "sbm0"])
        if "sbm1" in _links(NS_Y):
            from pyroute2 import IPRoute

            with netns.entered(NS_Y):
                with IPRoute() as ipr:
                    ipr.link("del", index=ipr.link_lookup(ifname="sbm1")[0])


def test_in_the_pods_cgroup(pod, person):
    """The command is in the pod's cgroup: /proc/self/cgroup says so, and the host sees its pid in cgroup.procs."""
    started, collect = start(pod, person, ["sh", "-c", "cat /proc/self/cgroup; exec sleep 30"])
    deadline = time.monotonic() + 5
    while Path(f"/proc/{started.pid}/comm").read_text() != "sleep\n" and time.monotonic() < deadline:
        time.sleep(0.01)  # cat has written its line once sh has moved on to sleep
    procs = Path(pod.cgroup, "cgroup.procs").read_text().split()
    assert send_signal(started, "KILL") is True
    ran = collect()
    assert f"0::{pod.cgroup_rel}" in ran.out.splitlines()
    assert str(started.pid) in procs


def test_exit_status_on_status_fd(pod, person):
    """The status fd gets "0\\n", the exit code, or 128+N for a death by signal N (a shell's $?)."""
    assert run(pod, person, ["true"]).status == "0\n"
    assert sh(pod, person, "exit 7").status == "7\n"
    assert sh(pod, person, "kill -KILL $$").status == "137\n"
    assert sh(pod, person, "kill -TERM $$").status == "143\n"


def test_signal_reaches_the_command(pod, person):
    """A SIGTERM through send_signal reaches the user's command (its trap runs); once it has exited send_signal
    says False."""
    script = "trap 'echo got TERM; exit 5' TERM; echo ready; while :; do sleep 0.05; done"
    started, collect = start(pod, person, ["sh", "-c", script])
    assert started.start is not None
    deadline = time.monotonic() + 5
    while not int(_status(Path(f"/proc/{started.pid}/status").read_text())["SigCgt"], 16) & 1 << (signal.SIGTERM - 1):
        assert time.monotonic() < deadline, "the command never set its TERM trap"
        time.sleep(0.01)
    assert send_signal(started, signal.SIGTERM) is True
    ran = collect()
    assert (ran.out, ran.status) == ("ready\ngot TERM\n", "5\n")
    assert send_signal(started, "TERM") is False


def test_sigterm_default_and_sigkill_end_the_namespace(pod, person):
    """SIGTERM ends a command without a handler (status 143); SIGKILL ends it and its background children."""
    started, collect = start(pod, person, ["sleep", "30"])
    assert send_signal(started, "TERM") is True
    assert collect().status == "143\n"
    started, collect = start(pod, person, ["sh", "-c", "sleep 30 & sleep 31"])
    time.sleep(0.2)
    assert send_signal(started, signal.SIGKILL) is True
    ran = collect()
    assert (ran.status, ran.err) == ("137\n", "")  # the wrapper shell does not add its "Killed"
    deadline = time.monotonic() + 5
    while Path(pod.cgroup, "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(pod.cgroup, "cgroup.procs").read_text().strip() == ""


_SPAWNER = """
import json, os, sys, time
from labkit.door.sandbox import Person, spawn
ns, cg, uid, out, st, info = sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(int, sys.argv[4:7])
s = spawn(ns, cg, Person.of_uid(uid), ["sh", "-c", "sleep 1; echo alive"], env=None, cwd=None,
          stdin=0, stdout=out, stderr=out, status_fd=st)
os.write(info, (json.dumps([s.pid, s.start]) + "\\n").encode())
time.sleep(60)
"""


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_survives_the_death_of_its_spawner(pod, person):
    """A command outlives the process that spawned it (SIGKILLed): it finishes, writes its output, and its
    status still arrives."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0  # the orphaned wrapper comes to us, to reap
    out_r, out_w = os.pipe()
    st_r, st_w = os.pipe()
    info_r, info_w = os.pipe()
    try:
        spawner = subprocess.Popen([sys.executable, "-c", _SPAWNER, NS_X, pod.cgroup, str(person.uid),
                                    str(out_w), str(st_w), str(info_w)], pass_fds=(out_w, st_w, info_w),
                                   stdin=subprocess.DEVNULL, cwd=str(Path(__file__).parents[2]))
        for fd in (out_w, st_w, info_w):
            os.close(fd)
        with os.fdopen(info_r) as info:
            pid, start_time = json.loads(info.readline())
        assert start_time == process_start_time(pid)
        wrapper = _ppid(_ppid(pid))
        spawner.kill()
        spawner.wait()
        got = _read_all({"out": out_r, "status": st_r}, 20)
        assert got == {"out": "alive\n", "status": "0\n"}
        assert os.waitpid(wrapper, 0)[0] == wrapper
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_stdio_as_given(pod, person):
    """stdin, stdout and stderr are the caller's descriptors, and the command holds no other descriptor."""
    ran = sh(pod, person, "cat; echo to-err >&2; ls /proc/self/fd | tr '\\n' ' '", stdin=b"hello\n")
    assert ran.out.splitlines() == ["hello", "0 1 2 3 "]  # 3 is ls's own directory
    assert ran.err == "to-err\n"


def test_cwd_or_home(pod, person):
    """A directory the user may enter is the cwd; one they may not (or that does not exist) gives their home."""
    assert run(pod, person, ["pwd"], cwd="/tmp").out == "/tmp\n"
    assert run(pod, person, ["pwd"], cwd="/root").out == person.home + "\n"
    assert run(pod, person, ["pwd"], cwd="/nonexistent/lk-sbtest").out == person.home + "\n"
    assert run(pod, person, ["pwd"], cwd=None).out == person.home + "\n"


def test_environment_as_given(pod, person):
    """The command's environment is the caller's plus HOME/USER/LOGNAME/PATH and the shell's PWD, nothing
    of root's wrapper."""
    ran = run(pod, person, ["env"], env={"LANG": "C.UTF-8", "LK_X": "a  b $c 'd\" `id` $(id)"}, cwd="/tmp")
    env = dict(line.split("=", 1) for line in ran.out.splitlines())
    assert env == {"LK_X": "a  b $c 'd\" `id` $(id)", "LANG": "C.UTF-8", "HOME": person.home, "USER": USER,
                   "LOGNAME": USER, "PWD": "/tmp",
                   "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def test_ld_preload_reaches_only_the_command(pod, person):
    """A caller's LD_PRELOAD reaches the user's command only, never the programs that run as root."""
    ran = run(pod, person, ["true"], env={"LD_PRELOAD": "/nonexistent/lk-sbtest.so"})
    assert ran.status == "0\n"
    assert ran.err.count("cannot be preloaded") == 1, ran.err


def test_command_found_on_the_users_path(pod, person):
    """The command is looked up on the caller's PATH as the user: a directory the user cannot search is
    skipped; a missing command is 127 with a clear line."""
    private = Path(tempfile.mkdtemp(prefix="lk-sbtest-root-"))
    mine = Path(person.home, "bin")
    try:
        for d, word in ((private, "root-only"), (mine, "mine")):
            d.mkdir(exist_ok=True)
            (d / "lksbhello").write_text(f"#!/bin/sh\necho {word}\n")
            (d / "lksbhello").chmod(0o755)
        os.chown(mine, person.uid, person.gid)
        os.chmod(private, 0o700)
        ran = run(pod, person, ["lksbhello"], env={"PATH": f"{private}:{mine}:/usr/bin:/bin"})
        assert (ran.status, ran.out) == ("0\n", "mine\n")
        ran = run(pod, person, ["lksb-no-such-command"])
        assert ran.status == "127\n"
        assert ran.err.startswith("labkit: lksb-no-such-command: command not found (PATH=")
    finally:
        shutil.rmtree(private)
        shutil.rmtree(mine)


# --- bpftool ---------------------------------------------------------------------------------------------

@pytest.fixture
def pinned_map(datapath_ready):
    """A hash map pinned under a bpffs directory of our own, with one entry (1 -> 2); removed at the end."""
    d = Path(f"/sys/fs/bpf/lk-sbtest-{PID}")
    d.mkdir()
    m = d / "m"
    try:
        _sh(bpftool.BPFTOOL, "map", "create", str(m), "type", "hash", "key", "4", "value", "4", "entries", "8",
            "name", "lktest")
        _sh(bpftool.BPFTOOL, "map", "update", "pinned", str(m), "key", "1", "0", "0", "0", "value", "2", "0", "0", "0")
        yield d, m
    finally:
        if m.exists():
            m.unlink()
        d.rmdir()


def test_bpftool_dumps_own_pinned_map(pinned_map):
    """bpftool.run dumps a real pinned map under the caller's pin root, as JSON."""
    root, m = pinned_map
    done = bpftool.run(["-j", "map", "dump", "pinned", str(m)], netns=None, pin_roots=[str(root)], cgroups=[])
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["key"], r["value"]) for r in rows] == [(["0x01", "0x00", "0x00", "0x00"], ["0x02", "0x00", "0x00", "0x00"])]
    shown = bpftool.run(["map", "show", "pinned", str(m), "-j"], netns=None, pin_roots=[str(root)], cgroups=[])
    assert json.loads(shown.stdout)["name"] == "lktest"


def test_bpftool_refuses_update_and_other_roots(pinned_map):
    """An update is refused before bpftool runs (the map is unchanged), and so is a dump outside the pin roots."""
    root, m = pinned_map
    with pytest.raises(ConfigError, match="only reading is allowed"):
        bpftool.run(["map", "update", "pinned", str(m), "key", "1", "0", "0", "0", "value", "9", "9", "9", "9"],
                    netns=None, pin_roots=[str(root)], cgroups=[])
    with pytest.raises(ConfigError, match="outside your lab's"):
        bpftool.run(["map", "dump", "pinned", str(m)], netns=None, pin_roots=["/sys/fs/bpf/labkit/lk-sbtest-none"],
                    cgroups=[])
    done = bpftool.run(["-j", "map", "lookup", "pinned", str(m), "key", "1", "0", "0", "0"], netns=None,
                       pin_roots=[str(root)], cgroups=[])
    assert json.loads(done.stdout)["value"] == ["0x02", "0x00", "0x00", "0x00"]


def test_bpftool_net_and_cgroup_show(pod):
    """net show runs inside the given namespace, cgroup show on the lab's own cgroup."""
    done = bpftool.run(["-j", "net", "show"], netns=NS_X, pin_roots=[], cgroups=[])
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)
    done = bpftool.run(["cgroup", "show", pod.cgroup], netns=None, pin_roots=[], cgroups=[pod.cgroup])
    assert done.returncode == 0, done.stderr
