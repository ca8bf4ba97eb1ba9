"""labkit.door.sandbox without root: the command it builds, the environment it gives, who it runs as, the
checks that refuse before anything starts, and signalling by pid and start time."""
from __future__ import annotations

import doctest
import grp
import os
import pwd
import signal
import subprocess
import time

import pytest

from labkit.door import sandbox
from labkit.door.sandbox import (CAPS, DEFAULT_PATH, ENV_CARRIER, MAX_ENV_BYTES, MAX_ENV_VARS, Person, Started,
                                 check_env, check_tool, command_line, send_signal, user_environment)
from labkit.errors import ConfigError, NotFoundError, PrivilegeError
from labkit.net.ledger import process_start_time

ALICE = Person(4242, 4343, "alice", "/home/alice", (4343, 4444))


def _unused_uid() -> int:
    uid = 3_999_999_000
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


def _unused_gid() -> int:
    gid = 3_999_999_000
    while True:
        try:
            grp.getgrgid(gid)
        except KeyError:
            return gid
        gid += 1


def test_doctests():
    """The module's examples run and give what they show."""
    result = doctest.testmod(sandbox, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_command_line_layers():
    """The command is nsenter (the setns) → unshare with a new mount and PID namespace → /bin/sh → the argv."""
    argv = command_line("lk-demo-a1", None, ALICE, ["ping", "-c", "1", "192.0.2.1"])
    assert argv[:2] == ["nsenter", "--net=/run/netns/lk-demo-a1"]
    assert os.path.basename(argv[2]) == "unshare"
    assert argv[3:11] == ["--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private", "--kill-child",
                          "--"]
    assert argv[11:13] == ["/bin/sh", "-c"]
    assert argv[-5:] == ["--", "ping", "-c", "1", "192.0.2.1"]


def test_root_script_drops_to_exactly_two_caps():
    """The root shell runs setpriv with the user's ids, initgroups, the two capabilities in the inheritable,
    ambient and bounding sets, and no_new_privs."""
    script = command_line("lk-demo-a1", None, ALICE, ["id"])[13]
    caps = "-all," + ",".join("+" + c for c in CAPS)
    assert caps == "-all,+net_admin,+net_raw"
    for option in ("--reuid=4242", "--regid=4343", "--init-groups", f"--inh-caps={caps}", f"--ambient-caps={caps}",
                   f"--bounding-set={caps}", "--no-new-privs"):
        assert f" {option}" in script
    assert "setpriv" in script.splitlines()[-4]


def test_root_script_covers_each_netns_dir(monkeypatch, tmp_path):
    """Each directory ip netns keeps handles in gets an empty tmpfs mounted over it, before setpriv runs."""
    monkeypatch.setattr(sandbox, "netns_dirs", lambda: ["/run/netns", "/var/run/netns"])
    lines = command_line("lk-demo-a1", None, ALICE, ["id"])[13].splitlines()
    assert "-t tmpfs" in lines[0] and lines[0].split()[-5] == "/run/netns"
    assert "-t tmpfs" in lines[1] and lines[1].split()[-5] == "/var/run/netns"
    assert all(line.endswith("|| exit 125") for line in lines[:2])


def test_root_script_writes_the_status_and_hides_its_fd():
    """The root shell keeps its own messages off the caller's stderr, closes the status descriptor for the
    command and writes `$?` to it afterwards."""
    lines = command_line("lk-demo-a1", None, ALICE, ["id"])[13].splitlines()
    assert lines[-5] == "exec 5>&2 2>/dev/null"
    assert lines[-4].startswith("(exec ") and lines[-4].endswith(' labkit-exec "$@" 2>&5 5>&- 3>&-)')
    assert lines[-3:] == ["rc=$?", 'echo "$rc" >&3', 'exit "$rc"']


def test_netns_dirs_skips_a_symlinked_var_run(monkeypatch, tmp_path):
    """/var/run/netns is covered too when it is a directory of its own, not when it is /run/netns by a symlink."""
    run = tmp_path / "run" / "netns"
    run.mkdir(parents=True)
    own = tmp_path / "var" / "run" / "netns"
    own.mkdir(parents=True)
    monkeypatch.setattr(sandbox, "_NETNS_DIRS", (str(run), str(own)))
    assert sandbox.netns_dirs() == [str(run), str(own)]
    linked = tmp_path / "var2"
    linked.mkdir()
    os.symlink(tmp_path / "run", linked / "run")
    monkeypatch.setattr(sandbox, "_NETNS_DIRS", (str(run), str(linked / "run" / "netns")))
    assert sandbox.netns_dirs() == [str(run)]


def test_env_values_never_in_argv():
    """The caller's variables travel in the environment under ENV_CARRIER names, never in argv (which
    other users may read in /proc/<pid>/cmdline); argv carries only their names."""
    argv = command_line("lk-demo-a1", None, ALICE, ["env"], env={"TOKEN": "s3cret", "LANG": "C.UTF-8"})
    assert not any("s3cret" in a for a in argv)
    assert argv[14:16] == ["labkit-sandbox", sandbox._USER_SCRIPT]
    names = argv[18: argv.index("--", 18)]
    assert names == ["HOME", "LANG", "LOGNAME", "PATH", "TOKEN", "USER"]
    assert f"${{{ENV_CARRIER}$1}}" in argv[15]


def test_cwd_absolute_or_home():
    """An absolute cwd is handed on (the user's shell falls back to home if they may not enter it); a
    relative or missing one becomes the home directory."""
    def where(cwd):
        argv = command_line("lk-demo-a1", None, ALICE, ["pwd"], cwd=cwd)
        return argv[16:18]

    assert where("/srv/lab") == ["/srv/lab", "/home/alice"]
    assert where(None) == ["/home/alice", "/home/alice"]
    assert where("relative/dir") == ["/home/alice", "/home/alice"]


def test_user_script_falls_back_and_finds_on_path():
    """The user's shell reports its pid, tries cwd then home then /, and runs the command from its own PATH
    with a clear message when it is not found."""
    script = sandbox._USER_SCRIPT
    assert script.startswith('echo "$$" >&4; exec 4>&-\n')
    assert 'cd -- "$1" 2>/dev/null || cd -- "$2" 2>/dev/null || cd /' in script
    assert "command not found (PATH=$PATH)" in script and "exit 127" in script
    assert script.rstrip().endswith('exec "$@"')


def test_user_environment_defaults():
    """HOME, USER and LOGNAME come from the passwd entry (a caller's value is replaced); PATH is filled when
    absent and kept when given; other variables pass."""
    env = user_environment(ALICE, {"USER": "root", "HOME": "/root", "LANG": "C"})
    assert env == {"USER": "alice", "LOGNAME": "alice", "HOME": "/home/alice", "LANG": "C", "PATH": DEFAULT_PATH}
    assert user_environment(ALICE, {"PATH": "/opt/bin"})["PATH"] == "/opt/bin"
    assert user_environment(ALICE, None)["PATH"] == DEFAULT_PATH


def test_env_bounds():
    """At most 256 variables and 64 KiB in all; one more of either is refused with the limit and the count."""
    assert len(check_env({f"V{i}": "x" for i in range(MAX_ENV_VARS)})) == MAX_ENV_VARS
    with pytest.raises(ConfigError, match=r"expected at most 256 variables, got 257"):
        check_env({f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)})
    fits = {"BIG": "x" * (MAX_ENV_BYTES - len("BIG") - 2)}
    assert check_env(fits) == fits
    with pytest.raises(ConfigError, match=r"expected at most 65536 bytes in all, got 65537"):
        check_env({"BIG": "x" * (MAX_ENV_BYTES - len("BIG") - 1)})


@pytest.mark.parametrize("env,why", [
    ({"1X": "a"}, "expected letters, digits and _"),
    ({"A-B": "a"}, "expected letters, digits and _"),
    ({"A=B": "a"}, "expected letters, digits and _"),
    ({"A B": "a"}, "expected letters, digits and _"),
    ({"$(id)": "a"}, "expected letters, digits and _"),
    ({ENV_CARRIER + "X": "a"}, "are labkit's own"),
    ({"A": "a\0b"}, "without NUL bytes"),
    ({"A": 1}, "expected a string name and value"),
    ([("A", "b")], "expected a mapping"),
])
def test_env_refusals(env, why):
    """Names a shell cannot export (and so could not be carried safely), the carrier prefix, NUL bytes and
    non-strings are refused."""
    with pytest.raises(ConfigError, match=why):
        check_env(env)


@pytest.mark.parametrize("argv", [[], "ping", ["ping", "a\0b"], ["ping", 3]])
def test_argv_refusals(argv):
    """An empty command, a string instead of a list, NUL bytes and non-strings are refused."""
    with pytest.raises(ConfigError, match="command"):
        command_line("lk-demo-a1", None, ALICE, argv)


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "../lk-other-a1", "a\0b"])
def test_netns_name_refusals(name):
    """A namespace is named as `ip netns list` shows it: no slash, not . or .., not empty."""
    with pytest.raises(ConfigError, match="network namespace"):
        command_line(name, None, ALICE, ["id"])


def test_spawn_refuses_missing_namespace():
    """spawn raises NotFoundError for a namespace that does not exist, before it starts anything."""
    with pytest.raises(NotFoundError, match="lk-sbtest-none-x"):
        sandbox.spawn("lk-sbtest-none-x", None, ALICE, ["id"], env=None, cwd=None, stdin=0, stdout=1, stderr=2,
                      status_fd=None)


def test_spawn_checks_env_first():
    """spawn refuses an oversized environment before it looks at the namespace."""
    with pytest.raises(ConfigError, match="257"):
        sandbox.spawn("lk-sbtest-none-x", None, ALICE, ["id"], env={f"V{i}": "" for i in range(257)}, cwd=None,
                      stdin=0, stdout=1, stderr=2, status_fd=None)


def test_cgroup_must_be_under_the_cgroup2_mount(tmp_path):
    """A cgroup outside the cgroup2 mount is refused (labkitd writes a pid into its cgroup.procs as root)."""
    (tmp_path / "cgroup.procs").write_text("")
    with pytest.raises(ConfigError, match="expected a directory under the cgroup2 mount"):
        sandbox._check_cgroup(str(tmp_path))
    assert sandbox._check_cgroup(None) is None


def test_person_of_uid_root():
    """Person.of_uid reads the passwd entry and the groups initgroups would give."""
    root = Person.of_uid(0)
    assert (root.uid, root.gid, root.name, root.home) == (0, 0, "root", "/root")
    assert 0 in root.groups and root.group_names()[root.groups.index(0)] == "root"


def test_person_of_unknown_uid():
    """A uid without a passwd entry is NotFoundError (a LookupError) naming the uid."""
    uid = _unused_uid()
    with pytest.raises(NotFoundError, match=f"uid {uid}") as exc:
        Person.of_uid(uid)
    assert isinstance(exc.value, LookupError)


def test_person_of_fake_passwd_entry():
    """A passwd entry unknown to the group database gives its primary group alone (named by number); an empty
    home becomes /."""
    gid = _unused_gid()
    entry = pwd.struct_passwd(("lk-nobody-x", "x", 4242, gid, "", "", "/usr/sbin/nologin"))
    person = Person.of_passwd(entry)
    assert person == Person(4242, gid, "lk-nobody-x", "/", (gid,))
    assert person.group_names() == [str(gid)]


def test_check_tool_names_missing_options():
    """A too-old unshare or setpriv is PrivilegeError naming the options it lacks and how to get them."""
    with pytest.raises(PrivilegeError, match=r"unshare \(/usr/bin/unshare\) lacks --kill-child: expected util-linux"):
        check_tool("unshare", "/usr/bin/unshare", "--mount --pid --fork --mount-proc --propagation")
    with pytest.raises(PrivilegeError, match="setpriv: expected it in"):
        check_tool("setpriv", None, "")
    check_tool("setpriv", "/usr/bin/setpriv",
               "--reuid --regid --init-groups --inh-caps --ambient-caps --bounding-set --nnp, --no-new-privs")


def test_require_tools_on_this_machine():
    """This machine's unshare and setpriv pass the check (util-linux 2.38 on Debian 12)."""
    tools = sandbox.require_tools()
    assert {os.path.basename(tools[t]) for t in ("unshare", "setpriv", "mount")} == {"unshare", "setpriv", "mount"}


@pytest.mark.parametrize("sig,number", [("TERM", 15), ("SIGINT", 2), ("hup", 1), (9, 9), (signal.SIGUSR1, 10)])
def test_signal_names_and_numbers(sig, number):
    """A signal is given by number, Signals member, or name with or without SIG."""
    assert sandbox._signal_number(sig) == number


@pytest.mark.parametrize("sig", ["TERMINATE", 0, 999, -1, True, None, "9"])
def test_bad_signals_refused(sig):
    """Anything but a real signal is ConfigError."""
    with pytest.raises(ConfigError, match="expected a signal name or number"):
        sandbox._signal_number(sig)


def test_send_signal_checks_start_time():
    """send_signal signals a pid only when its start time matches; a mismatch or an exited process gives
    False."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        start = process_start_time(proc.pid)
        assert start is not None
        assert send_signal(Started(proc.pid, start + 1, "lk-x"), "TERM") is False
        time.sleep(0.05)
        assert proc.poll() is None
        assert send_signal(Started(proc.pid, start, "lk-x"), "TERM") is True
        assert proc.wait(timeout=5) == -signal.SIGTERM
        assert send_signal(Started(proc.pid, start, "lk-x"), "TERM") is False
    finally:
        proc.kill()
        proc.wait()


def test_send_signal_to_nothing():
    """A Started without a start time (the command had ended before spawn looked) is never signalled."""
    assert send_signal(Started(0, None, "lk-x"), signal.SIGKILL) is False
    assert send_signal(Started(os.getpid(), None, "lk-x"), signal.SIGKILL) is False
