"""A user's process in a pod: started by labkitd (root), run as the user, with exactly ``CAP_NET_RAW`` and
``CAP_NET_ADMIN``, inside the pod's network namespace and cgroup, unable to reach any other namespace.

``lab.pod("a1").exec("ping", ...)``, ``labkit exec a1 -- tcpdump ...`` and a notebook's ``lab.popen(...)``
all end here. The engines are util-linux's: ``unshare`` makes a new mount and PID namespace with its own
``/proc``, ``setpriv`` drops to the user; ``/bin/sh`` glues them (mounts the empty tmpfs, runs the
command, writes its exit status). The process tree of one :func:`spawn`, as ``ps`` on the host shows it::

    labkitd (root)
     └─ unshare --mount --pid --fork ...     root, setsid, already in the pod's netns and cgroup
         └─ /bin/sh (pid 1 of the new PID ns) root: tmpfs over /run/netns, waits, writes the status
             └─ the user's command            setpriv → /bin/sh (as the user: cd, environment) → exec argv;
                                              CapEff=CapPrm=CapInh=CapAmb=CapBnd=0x3000, NoNewPrivs=1

What each layer shuts out, for a process that holds ``CAP_NET_ADMIN`` in the host's user namespace:

- ``/run/netns`` (and ``/var/run/netns`` when it is a directory of its own) is an empty tmpfs in the new
  mount namespace: ``ip link set eth0 netns lk-other-a1`` and ``... netns /run/netns/<x>`` find nothing;
- the new PID namespace has its own ``/proc``: the user's other processes (their Jupyter kernel in the host
  namespace) are not there, so ``/proc/<pid>/ns/net`` cannot be opened and ``IFLA_NET_NS_PID`` cannot name
  them; ``/proc/1`` is the root wrapper (not ptrace-readable by the user) in the same namespace;
- ``no_new_privs``: sudo, su or any setuid binary cannot give root back; the bounding set holds the two
  capabilities only.

One door stays open that no path or PID closes: a *netnsid*. A namespace that already has an id in the
pod's namespace (the node's, the far side of the pod's veth: ``ip netns list-id``) can be named by
``IFLA_TARGET_NETNSID`` in a raw ``RTM_NEWLINK``, and the kernel lets a ``CAP_NET_ADMIN`` holder of the
host's user namespace move or create a link there. It reaches only the peers of the pod's own links (its
own lab's node), never a namespace without an id in the pod's (the host's, other labs'); see
``tests/datapath/test_sandbox.py``.

The exit status: the wrapper shell writes ``"<status>\\n"`` to ``status_fd`` when the command ends, so a
client learns it even if labkitd was restarted meanwhile. It is the shell's ``$?``: the exit code, or
``128 + N`` when the command died of signal N (``143`` for SIGTERM) — a shell cannot tell that from
``exit 143``, so neither can this. When the command ends the PID namespace ends with it (its background
children are killed). The process survives labkitd: it has its own session and holds none of labkitd's
pipes, only the caller's descriptors.

    >>> root = Person.of_uid(0)
    >>> root.name, root.home
    ('root', '/root')
    >>> argv = command_line("lk-demo-a1", None, root, ["ping", "-c", "1", "192.0.2.1"])
    >>> argv[:2], argv[3:10]
    (['nsenter', '--net=/run/netns/lk-demo-a1'], ['--mount', '--pid', '--fork', '--mount-proc', '--propagation', 'private', '--kill-child'])
    >>> print(argv[13])  # what pid 1 of the new PID namespace runs, as root
    /...mount -t tmpfs -o mode=0755,size=4k,nosuid,nodev,noexec labkit-no-netns /run/netns 2>&4 || exit 125
    ...user_script=$1; shift
    exec 5>&2 2>/dev/null
    (exec /...setpriv --reuid=0 --regid=0 --init-groups --inh-caps=-all,+net_admin,+net_raw --ambient-caps=-all,+net_admin,+net_raw --bounding-set=-all,+net_admin,+net_raw --no-new-privs -- /bin/sh -c "$user_script" labkit-exec "$@" 2>&5 5>&- 3>&-)
    rc=$?
    echo "$rc" >&3
    exit "$rc"
    <BLANKLINE>
    >>> argv[-5:]
    ['--', 'ping', '-c', '1', '192.0.2.1']
    >>> sorted(user_environment(root, {"LANG": "C.UTF-8"}))
    ['HOME', 'LANG', 'LOGNAME', 'PATH', 'USER']

labkitd starts and signals (root; the datapath tests run these)::

    started = spawn("lk-demo-a1", "/sys/fs/cgroup/labkit/demo/a1", Person.of_uid(caller.uid),
                    ["ping", "-c", "3", "192.0.2.1"], env=None, cwd="/home/alice",
                    stdin=fds[0], stdout=fds[1], stderr=fds[2], status_fd=fds[3])
    send_signal(started, signal.SIGINT)   # True; False once it has exited
"""
from __future__ import annotations

import errno
import fcntl
import functools
import grp
import os
import pwd
import re
import select
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from labkit.errors import ConfigError, LabTimeoutError, NetnsError, NotFoundError, PrivilegeError
from labkit.net import netns as _netns
from labkit.net.build import cgroup_root
from labkit.net.ledger import process_start_time

__all__ = ["Person", "Started", "spawn", "send_signal", "reap", "command_line", "user_environment", "check_env",
           "require_tools", "check_tool", "netns_dirs", "CAPS", "MAX_ENV_VARS", "MAX_ENV_BYTES", "DEFAULT_PATH",
           "ENV_CARRIER", "START_TIMEOUT"]

#: The capabilities a user's process holds, in every set (inheritable, permitted, effective, ambient, bounding).
CAPS = ("net_admin", "net_raw")
#: The most environment variables a caller may give, and their total size (``NAME=value\\0`` each).
MAX_ENV_VARS = 256
MAX_ENV_BYTES = 64 * 1024
#: PATH when the caller gives none: a learner's tools (ip, tc, tcpdump, bpftool) live in the sbin directories.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The caller's variables cross the root wrapper under this prefix (``LABKIT_ENV_LD_PRELOAD``), so none of
#: them (LD_PRELOAD, GCONV_PATH, ...) reaches a program that runs as root; the user's shell renames them.
ENV_CARRIER = "LABKIT_ENV_"
#: How long spawn waits for the command to be under way (the mounts done, setpriv through).
START_TIMEOUT = 10.0

_ROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STATUS_FD, _REPORT_FD = 3, 4  # where the wrapper finds the status pipe and the start report
_MIN_FD = 10  # our own copies of the caller's descriptors sit at or above this, clear of 0-4
_NETNS_DIRS = ("/run/netns", "/var/run/netns")

# What the user's shell (after setpriv) does, with "$@" = CWD HOME NAME... -- ARGV... (the root shell has it
# as its $1, so a learner reads it unquoted in command_line's output): tell spawn its pid,
# enter the directory if the user may, take the caller's variables off their carrier names, find and run
# the command on the user's PATH.
_USER_SCRIPT = f"""\
echo "$$" >&{_REPORT_FD}; exec {_REPORT_FD}>&-
cd -- "$1" 2>/dev/null || cd -- "$2" 2>/dev/null || cd /
unset OLDPWD; shift 2
while [ "$1" != -- ]; do eval "export $1=\\"\\${{{ENV_CARRIER}$1}}\\"" && unset "{ENV_CARRIER}$1"; shift; done
shift
command -v -- "$1" >/dev/null 2>&1 || {{ echo "labkit: $1: command not found (PATH=$PATH)" >&2; exit 127; }}
exec "$@"
"""


@dataclass(frozen=True)
class Person:
    """Who a process runs as: a passwd entry and its groups (what ``initgroups`` gives; spawn has setpriv's
    ``--init-groups`` give the same to the process).

    >>> Person.of_uid(0).uid, 0 in Person.of_uid(0).groups
    (0, True)
    """

    uid: int
    gid: int
    name: str
    home: str
    groups: tuple[int, ...]

    @classmethod
    def of_uid(cls, uid: int) -> "Person":
        """The user ``uid`` from the passwd and group databases; NotFoundError when there is none."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            raise NotFoundError(f"user with uid {uid}: expected a passwd entry, found none "
                                "(a process in a pod runs as a known user)") from None
        return cls.of_passwd(entry)

    @classmethod
    def of_passwd(cls, entry: pwd.struct_passwd) -> "Person":
        """The person of one passwd entry, with its groups from the group database."""
        try:
            groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
        except OSError:
            groups = [entry.pw_gid]
        return cls(entry.pw_uid, entry.pw_gid, entry.pw_name, entry.pw_dir or "/", tuple(sorted(set(groups))))

    def group_names(self) -> list[str]:
        """The names of :attr:`groups` (the gid where a group has no name), as ``id`` prints them."""
        out = []
        for gid in self.groups:
            try:
                out.append(grp.getgrgid(gid).gr_name)
            except KeyError:
                out.append(str(gid))
        return out


@dataclass(frozen=True)
class Started:
    """What :func:`spawn` started: the user's command as the host sees it.

    ``start`` is the command's start time (clock ticks, ``/proc/<pid>/stat`` field 22), so a recycled pid
    is never signalled; it is None (and ``pid`` 0) when the command had already ended by the time spawn
    looked — its status is on ``status_fd`` all the same.
    """

    pid: int
    start: int | None
    netns: str


# --- the engines ---------------------------------------------------------------------------------------

_NEEDS = {
    "unshare": ("--mount", "--pid", "--fork", "--mount-proc", "--propagation", "--kill-child"),
    "setpriv": ("--reuid", "--regid", "--init-groups", "--inh-caps", "--ambient-caps", "--bounding-set",
                "--no-new-privs"),
}


def _find(tool: str) -> str | None:
    for d in _ROOT_PATH.split(":"):
        path = os.path.join(d, tool)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def check_tool(tool: str, path: str | None, help_text: str) -> None:
    """Raise PrivilegeError unless ``path`` is ``tool`` and its ``--help`` lists every option spawn uses.

    >>> check_tool("setpriv", "/usr/bin/setpriv", "--reuid --regid --init-groups")
    Traceback (most recent call last):
    labkit.errors.PrivilegeError: setpriv (/usr/bin/setpriv) lacks --inh-caps, --ambient-caps, --bounding-set, --no-new-privs: expected util-linux >= 2.32 (apt-get install util-linux)
    """
    if path is None:
        raise PrivilegeError(f"{tool}: expected it in {_ROOT_PATH}, found none (apt-get install util-linux)")
    missing = [opt for opt in _NEEDS[tool] if not re.search(re.escape(opt) + r"\b", help_text)]
    if missing:
        raise PrivilegeError(f"{tool} ({path}) lacks {', '.join(missing)}: expected util-linux >= 2.32 "
                             "(apt-get install util-linux)")


@functools.lru_cache(maxsize=1)
def require_tools() -> dict[str, str]:
    """The paths of ``unshare``, ``setpriv``, ``mount`` and ``/bin/sh``, checked once; PrivilegeError names
    what is missing."""
    found = {}
    for tool in _NEEDS:
        path = _find(tool)
        text = ""
        if path is not None:
            try:
                text = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, check=False,
                                      env={"PATH": _ROOT_PATH, "LC_ALL": "C"}).stdout
            except (OSError, subprocess.SubprocessError) as exc:
                raise PrivilegeError(f"{tool} ({path}): expected it to run, got {exc}") from None
        check_tool(tool, path, text)
        found[tool] = path
    found["mount"] = _find("mount") or ""
    if not found["mount"] or not os.access("/bin/sh", os.X_OK):
        raise PrivilegeError(f"mount and /bin/sh: expected both, found mount={found['mount'] or 'none'} "
                             "(apt-get install mount dash)")
    found["sh"] = "/bin/sh"
    return found


def _tool_paths() -> dict[str, str]:
    """The tools' paths for building a command line: checked ones when they pass, their names otherwise."""
    try:
        return require_tools()
    except PrivilegeError:
        return {"unshare": "unshare", "setpriv": "setpriv", "mount": "mount", "sh": "/bin/sh"}


# --- what the command gets -----------------------------------------------------------------------------

def check_env(env: dict[str, str] | None) -> dict[str, str]:
    """The caller's environment, checked: at most :data:`MAX_ENV_VARS` variables and :data:`MAX_ENV_BYTES`
    in all, names a shell can export, no NUL. ConfigError says which limit and by how much.

    >>> check_env({"A": "1"})
    {'A': '1'}
    >>> check_env({"1A": "x"})
    Traceback (most recent call last):
    labkit.errors.ConfigError: environment variable name '1A': expected letters, digits and _ (not starting with a digit)
    """
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ConfigError(f"environment: expected a mapping of names to strings, got {type(env).__name__}")
    if len(env) > MAX_ENV_VARS:
        raise ConfigError(f"environment: expected at most {MAX_ENV_VARS} variables, got {len(env)}")
    total = 0
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigError(f"environment variable {name!r}: expected a string name and value, "
                              f"got {type(name).__name__}={type(value).__name__}")
        if not _NAME.match(name):
            raise ConfigError(f"environment variable name {name[:64]!r}: expected letters, digits and _ "
                              "(not starting with a digit)")
        if name.startswith(ENV_CARRIER):
            raise ConfigError(f"environment variable {name!r}: names starting with {ENV_CARRIER} are labkit's own")
        if "\0" in value:
            raise ConfigError(f"environment variable {name!r}: expected a value without NUL bytes")
        total += len(name.encode()) + len(value.encode()) + 2
    if total > MAX_ENV_BYTES:
        raise ConfigError(f"environment: expected at most {MAX_ENV_BYTES} bytes in all, got {total}")
    return dict(env)


def user_environment(person: Person, env: dict[str, str] | None) -> dict[str, str]:
    """What the command's environment will be: the caller's (checked), HOME/USER/LOGNAME from the passwd
    entry, and PATH (:data:`DEFAULT_PATH` when the caller gives none). The shell adds PWD.

    >>> user_environment(Person(1000, 1000, "alice", "/home/alice", (1000,)), {"USER": "root", "X": "1"})["USER"]
    'alice'
    """
    out = check_env(env)
    out.update(HOME=person.home, USER=person.name, LOGNAME=person.name)
    out.setdefault("PATH", DEFAULT_PATH)
    return out


def _check_argv(argv) -> list[str]:
    if not isinstance(argv, (list, tuple)) or not argv:
        raise ConfigError(f"command: expected a non-empty list of strings, got {argv!r:.80}")
    for arg in argv:
        if not isinstance(arg, str) or "\0" in arg:
            raise ConfigError(f"command argument {arg!r:.80}: expected a string without NUL bytes")
    return list(argv)


def _check_netns(name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\0" in name:
        raise ConfigError(f"network namespace {name!r}: expected a name as `ip netns list` shows it")
    return name


def netns_dirs() -> list[str]:
    """The directories ``ip netns`` keeps its handles in on this machine: ``/run/netns``, and
    ``/var/run/netns`` when it is not the same directory (``/var/run`` a symlink to ``/run`` on Debian)."""
    out, seen = [], set()
    for d in _NETNS_DIRS:
        if d == _NETNS_DIRS[0] or (os.path.isdir(d) and not os.path.islink(d)):
            real = os.path.realpath(d)
            if real not in seen:
                seen.add(real)
                out.append(d)
    return out


def _setpriv_argv(setpriv: str, person: Person) -> list[str]:
    caps = "-all," + ",".join("+" + c for c in CAPS)
    return [setpriv, f"--reuid={person.uid}", f"--regid={person.gid}", "--init-groups",
            f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}", "--no-new-privs"]


def _root_script(tools: dict[str, str], person: Person, dirs: list[str]) -> str:
    """What pid 1 of the new PID namespace (root) runs: cover the netns directories, run the command as the
    user, write its status."""
    lines = [f"{shlex.quote(tools['mount'])} -t tmpfs -o mode=0755,size=4k,nosuid,nodev,noexec labkit-no-netns "
             f"{shlex.quote(d)} 2>&{_REPORT_FD} || exit 125" for d in dirs]
    setpriv = " ".join(shlex.quote(a) for a in _setpriv_argv(tools["setpriv"], person))
    # The shell's own stderr goes to /dev/null (it would tell the user "Killed" after a SIGKILL); the command
    # gets the caller's stderr back, in a subshell (dash holds a command's redirections while it waits for
    # it), and neither the status descriptor nor the copy.
    lines += ['user_script=$1; shift',
              "exec 5>&2 2>/dev/null",
              f'(exec {setpriv} -- {tools["sh"]} -c "$user_script" labkit-exec "$@" 2>&5 5>&- {_STATUS_FD}>&-)',
              "rc=$?",
              f'echo "$rc" >&{_STATUS_FD}',
              'exit "$rc"']
    return "\n".join(lines) + "\n"


def _argv(person: Person, argv: list[str], env_names: list[str], cwd: str | None) -> list[str]:
    tools = _tool_paths()
    home = person.home if os.path.isabs(person.home) else "/"
    where = cwd if isinstance(cwd, str) and os.path.isabs(cwd) and "\0" not in cwd else home
    return [tools["unshare"], "--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private",
            "--kill-child", "--", tools["sh"], "-c", _root_script(tools, person, netns_dirs()), "labkit-sandbox",
            _USER_SCRIPT, where, home, *env_names, "--", *argv]


def command_line(netns: str, cgroup: str | None, person: Person, argv: list[str], *,
                 env: dict[str, str] | None = None, cwd: str | None = None) -> list[str]:
    """The command :func:`spawn` runs, to show a learner: ``nsenter --net=...`` stands for the ``setns`` spawn
    does before it (and the write of its pid to ``<cgroup>/cgroup.procs``, which no option shows).

    >>> " ".join(command_line("lk-demo-a1", None, Person.of_uid(0), ["id"])[3:11])
    '--mount --pid --fork --mount-proc --propagation private --kill-child --'
    """
    names = sorted(user_environment(person, env))
    return ["nsenter", f"--net={_netns.NETNS_DIR}/{_check_netns(netns)}",
            *_argv(person, _check_argv(argv), names, cwd)]


# --- start and signal ----------------------------------------------------------------------------------

_wrappers: dict[int, subprocess.Popen] = {}  # the unshare processes that are labkitd's children, to reap
_wrappers_lock = threading.Lock()


def reap() -> None:
    """Collect the exit of every wrapper (unshare) that has ended, so none stays a zombie of labkitd's
    (labkitd's supervisor calls it every few seconds; each spawn too)."""
    with _wrappers_lock:
        for pid, proc in list(_wrappers.items()):
            if proc.poll() is not None:
                del _wrappers[pid]


def _check_cgroup(cgroup: str | None) -> str | None:
    if cgroup is None:
        return None
    root = cgroup_root()
    real = os.path.realpath(cgroup)
    if root is None or not (real == str(root) or real.startswith(str(root) + "/")):
        raise ConfigError(f"cgroup {cgroup!r}: expected a directory under the cgroup2 mount ({root or 'none'})")
    if not os.path.exists(os.path.join(real, "cgroup.procs")):
        raise NotFoundError(f"cgroup {cgroup!r}: expected a cgroup directory with cgroup.procs, found none")
    return real


def _high_dup(fd: int, what: str) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _MIN_FD)
    except (OSError, TypeError) as exc:
        raise ConfigError(f"{what} {fd!r}: expected an open file descriptor ({exc})") from None


def _preexec(netns: str, cgroup: str | None, status: int, report: int):
    enter = _netns.preexec(netns, cgroup)  # setsid, setns into the pod's netns, join its cgroup

    def run() -> None:
        enter()
        os.dup2(status, _STATUS_FD)
        os.dup2(report, _REPORT_FD)
        # Close every other descriptor that would survive exec: labkitd may hold other users' descriptors
        # (received with SCM_RIGHTS) that are inheritable. Close-on-exec ones go by themselves.
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > _REPORT_FD:
                try:
                    if not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                        os.close(fd)
                except OSError:
                    pass

    return run


def _read_report(fd: int, timeout: float) -> str:
    """The first line on the start report (the command's pid in its namespace), or all that came before EOF."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data and len(data) < 4096:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _nspid(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(p) for p in line.split()[1:]]
    except OSError:
        pass
    return []


def _find_command(wrapper: int, nspid: int) -> tuple[int, int] | None:
    """The host pid and start time of the process that is ``nspid`` in the wrapper's new PID namespace (a
    child of its pid 1), None when it is gone. The start time read on both sides of the NSpid read: the
    pid named the same process throughout."""
    for init in _children(wrapper):
        for child in _children(init):
            start = process_start_time(child)
            ids = _nspid(child)
            if start is not None and ids and ids[-1] == nspid and process_start_time(child) == start:
                return child, start
    return None


def spawn(netns: str, cgroup: str | None, person: Person, argv: list[str], *, env: dict[str, str] | None,
          cwd: str | None, stdin: int, stdout: int, stderr: int, status_fd: int | None) -> Started:
    """Start ``argv`` as ``person`` in namespace ``netns`` and ``cgroup`` (root only; see the module docstring).

    ``stdin``/``stdout``/``stderr`` are the caller's descriptors, ``status_fd`` where ``"<status>\\n"`` is
    written when the command ends (None: nowhere). ``cwd`` is used if the person may enter it, else their
    home (else ``/``). Returns when the command is under way (or has already ended); raises ConfigError for a
    bad argument or environment, NotFoundError for a missing namespace or cgroup, NetnsError when the
    sandbox could not be set up, PrivilegeError when unshare/setpriv are missing or too old.
    """
    netns = _check_netns(netns)
    argv = _check_argv(argv)
    environment = user_environment(person, env)
    if not _netns.exists(netns):
        raise NotFoundError(f"network namespace {netns!r}: expected {_netns.NETNS_DIR}/{netns}, found none")
    cgroup = _check_cgroup(cgroup)
    require_tools()
    reap()
    names = sorted(environment)
    wrapper_env = {"PATH": _ROOT_PATH, **{ENV_CARRIER + k: v for k, v in environment.items()}}
    proc, report = _start(_argv(person, argv, names, cwd), netns, cgroup, wrapper_env,
                          (stdin, stdout, stderr), status_fd)
    line = report.strip()
    if not line.isdigit():
        code = _stop(proc, grace=2.0)
        raise NetnsError(errno.EPERM, f"starting {argv[0]!r} in {netns!r} as {person.name}: the sandbox did "
                         f"not start (wrapper status {code}){': ' + line if line else ''}")
    found = _find_command(proc.pid, int(line))
    if found is None:  # already ended and reaped by the wrapper: its status is on status_fd
        return Started(0, None, netns)
    return Started(found[0], found[1], netns)


def _start(cmd: list[str], netns: str, cgroup: str | None, wrapper_env: dict[str, str],
           stdio: tuple[int, int, int], status_fd: int | None) -> tuple[subprocess.Popen, str]:
    """Popen the wrapper with the status pipe at fd 3 and the start report at fd 4; wait for the report."""
    own: list[int] = []  # our copies, closed whatever happens
    try:
        if status_fd is None:
            own.append(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
        else:
            own.append(_high_dup(status_fd, "status_fd"))
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        own.append(report_r)
        try:
            own.append(_high_dup(report_w, "report pipe"))
        finally:
            os.close(report_w)
        try:
            proc = subprocess.Popen(cmd, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], env=wrapper_env,
                                    cwd="/", umask=0o022, close_fds=False,
                                    preexec_fn=_preexec(netns, cgroup, own[0], own[2]))
        except subprocess.SubprocessError as exc:  # the preexec failed: setns or the cgroup write
            raise NetnsError(errno.EPERM, f"entering {netns!r} (cgroup {cgroup}): {exc}") from None
        with _wrappers_lock:
            _wrappers[proc.pid] = proc
        os.close(own.pop())  # the report's write end: only the wrapper holds it now
        try:
            return proc, _read_report(report_r, START_TIMEOUT)
        except TimeoutError:
            _stop(proc)
            raise LabTimeoutError(f"starting {cmd[-1]!r} in {netns!r}: expected it under way within "
                                  f"{START_TIMEOUT:.0f} s, it was not") from None
    finally:
        for fd in own:
            os.close(fd)


def _stop(proc: subprocess.Popen, grace: float = 0.0) -> int | None:
    """Reap a wrapper that failed to start its command: its status if it ends within ``grace`` seconds,
    else SIGKILL (which reaches pid 1 of its namespace through --kill-child)."""
    try:
        if grace:
            try:
                return proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        proc.kill()
        proc.wait(timeout=5)
        return None
    finally:
        reap()


def _signal_number(sig: int | str) -> int:
    """``15``, ``signal.SIGTERM``, ``"SIGTERM"`` or ``"TERM"`` as a signal number; ConfigError otherwise.

    >>> _signal_number("INT"), _signal_number(9)
    (2, 9)
    """
    try:
        if isinstance(sig, str):
            name = sig.upper()
            return int(signal.Signals[name if name.startswith("SIG") else "SIG" + name])
        if isinstance(sig, bool):
            raise ValueError
        number = int(signal.Signals(sig))
    except (KeyError, ValueError, TypeError):
        raise ConfigError(f"signal {sig!r}: expected a signal name or number such as SIGTERM or 15") from None
    return number


def send_signal(started: Started, sig: int | str) -> bool:
    """Send ``sig`` to the user's command (never to the root wrapper); False when it has already exited.

    The pid is opened as a pidfd and its start time compared with :attr:`Started.start`, so a pid the
    kernel has given to another process is never signalled. A SIGKILL ends the command, and with it the
    PID namespace (its status, ``137``, is still written).

    >>> send_signal(Started(0, None, "lk-demo-a1"), "TERM")
    False
    """
    number = _signal_number(sig)
    reap()
    if started.start is None or started.pid <= 0:
        return False
    try:
        pidfd = os.pidfd_open(started.pid)
    except ProcessLookupError:
        return False
    try:
        if process_start_time(started.pid) != started.start:
            return False
        try:
            signal.pidfd_send_signal(pidfd, number)
        except ProcessLookupError:
            return False
        return True
    finally:
        os.close(pidfd)
