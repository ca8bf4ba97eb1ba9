"""Read-only ``bpftool`` for learners: labkitd runs it as root, on their own lab's objects only.

A learner's notebook reads the datapath as Cilium's docs do — ``bpftool map dump pinned
/sys/fs/bpf/labkit/<lab>/<node>/cilium_ct4_global``, ``bpftool net show`` in a node — but an ordinary
user cannot call bpf(2) (``kernel.unprivileged_bpf_disabled=2``). labkitd runs bpftool for them after
:func:`check_args` has passed the arguments, which are untrusted. What passes:

==========================================================  ==================================================
``[-j|--json] [-p|--pretty] [-n|--nomount]``                 global options, anywhere (``-jp`` too)
``map dump|show|list|peek pinned PATH``                      PATH under one of the lab's pin roots
``map lookup|getnext pinned PATH [key [hex] BYTE...]``       the key's bytes: ``0x0a``, ``10``, or hex after ``hex``
``prog show|list pinned PATH``                               PATH under one of the lab's pin roots
``net show|list [dev IFNAME]``                               in the namespace :func:`run` is given
``cgroup show|list CGROUP [effective]``                      CGROUP one of the lab's cgroups or under one
``version``, ``help``, ``map|prog|net|cgroup help``          usage text
==========================================================  ==================================================

Everything else is refused with one line: every verb that writes (update, delete, pin, create, load,
attach, detach, push, pop, freeze, ...), ``id``/``name``/``tag`` (ids are global: they would show other
users' labs), ``prog``/``map show`` without ``pinned``, ``cgroup tree``, ``batch``, ``btf``, ``-f``
(``--bpffs`` lists every pin), ``-d``. A PATH is absolute, has no ``..``, and is replaced by its
``os.path.realpath`` in the arguments returned, so what passed the check is what bpftool opens (a symlink
into another lab is refused; one swapped after the check is never followed).

    >>> roots = ["/sys/fs/bpf/labkit/demo_u1000"]
    >>> check_args(["-j", "map", "dump", "pinned", "/sys/fs/bpf/labkit/demo_u1000/node-a/cilium_ct4_global"],
    ...            roots, [])
    ['-j', 'map', 'dump', 'pinned', '/sys/fs/bpf/labkit/demo_u1000/node-a/cilium_ct4_global']
    >>> check_args(["map", "show", "id", "12"], roots, [])
    Traceback (most recent call last):
    labkit.errors.ConfigError: bpftool map show id: refused (ids are global; name your lab's object with pinned PATH); allowed: ...
    >>> check_args(["map", "update", "pinned", "/sys/fs/bpf/labkit/demo_u1000/node-a/m"], roots, [])
    Traceback (most recent call last):
    labkit.errors.ConfigError: bpftool map update: refused (only reading is allowed); allowed: ...
"""
from __future__ import annotations

import os
import re
import subprocess

from labkit.errors import ConfigError, LabTimeoutError, NotFoundError, PrivilegeError
from labkit.net import netns as _netns

__all__ = ["BPFTOOL", "ALLOWED", "MAX_ARGS", "MAX_ARG_LEN", "check_args", "run"]

_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _find_bpftool() -> str | None:
    for d in _PATH.split(":"):
        path = os.path.join(d, "bpftool")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


#: bpftool's path, found once at import in root's fixed PATH (never the user's).
BPFTOOL = _find_bpftool()
MAX_ARGS = 64
MAX_ARG_LEN = 4096
#: What a refusal lists as allowed.
ALLOWED = ("map dump|show|list|peek pinned PATH, map lookup|getnext pinned PATH [key BYTES], "
           "prog show|list pinned PATH, net show|list [dev IFNAME], cgroup show|list CGROUP [effective], "
           "with -j|-p|-n")

_OPTIONS = {"-j": "-j", "--json": "--json", "-p": "-p", "--pretty": "--pretty", "-n": "-n", "--nomount": "--nomount"}
_SHORT = set("jpn")
_WRITES = {"update", "delete", "pin", "create", "load", "loadall", "attach", "detach", "push", "pop", "enqueue",
           "dequeue", "freeze", "event_pipe", "run", "register", "unregister"}
_BYTE = re.compile(r"^(0[xX][0-9a-fA-F]{1,2}|[0-9]{1,3})$")
_HEX_BYTE = re.compile(r"^[0-9a-fA-F]{1,2}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@][A-Za-z0-9_.:@-]{0,14}$")


def _refuse(words: list[str], why: str):
    shown = " ".join(w if len(w) <= 80 else w[:77] + "..." for w in words)
    raise ConfigError(f"bpftool {shown}: refused ({why}); allowed: {ALLOWED}")


def _under(path: str, roots: list[str], equal_ok: bool) -> bool:
    for root in roots:
        real_root = os.path.realpath(root)
        if real_root == "/":
            continue  # a root of "/" would allow everything: never meant
        if (equal_ok and path == real_root) or path.startswith(real_root + "/"):
            return True
    return False


def _path(words: list[str], path: str, roots: list[str], what: str, equal_ok: bool) -> str:
    """``path`` resolved, when it is absolute, has no ``..`` and resolves under one of ``roots``."""
    if not path.startswith("/"):
        _refuse(words, f"{what} {path!r} is not an absolute path")
    if ".." in path.split("/"):
        _refuse(words, f"{what} {path!r} has a '..' component")
    real = os.path.realpath(path)
    if not _under(real, roots, equal_ok):
        where = ", ".join(roots) if roots else "none given"
        _refuse(words, f"{what} {path!r} resolves to {real!r}, outside your lab's ({where})")
    return real


def _key(words: list[str], rest: list[str]) -> list[str]:
    """``key [hex] BYTE...`` after a lookup/getnext map, checked."""
    if not rest:
        return []
    if rest[0] != "key":
        _refuse(words, f"expected `key BYTES` after the map, got {rest[0]!r}")
    body = rest[1:]
    pattern = _BYTE
    if body and body[0] == "hex":
        body, pattern = body[1:], _HEX_BYTE
    if not body:
        _refuse(words, "`key` without bytes")
    for b in body:
        if not pattern.match(b):
            _refuse(words, f"key byte {b!r} is not a byte (0x0a, 10, or 0a after hex)")
    return rest


def _map_or_prog(words: list[str], obj: str, cmd: str, rest: list[str], pin_roots: list[str]) -> list[str]:
    if not rest:
        _refuse(words, f"{obj} {cmd} without `pinned PATH` lists every lab's {obj}s")
    if rest[0] in ("id", "name", "tag"):
        _refuse(words[:3], f"{rest[0]}s are global; name your lab's object with pinned PATH")
    if rest[0] != "pinned" or len(rest) < 2:
        _refuse(words, f"expected `pinned PATH` after {obj} {cmd}, got {' '.join(rest[:2])!r}")
    path = _path(words, rest[1], pin_roots, "pinned path", equal_ok=False)
    tail = rest[2:]
    if obj == "map" and cmd in ("lookup", "getnext"):
        tail = _key(words, tail)
    elif tail:
        _refuse(words, f"unexpected {' '.join(tail[:3])!r} after {obj} {cmd} pinned PATH")
    return [obj, cmd, "pinned", path, *tail]


def _positional(words: list[str], pin_roots: list[str], cgroups: list[str]) -> list[str]:
    if not words:
        _refuse(["(nothing)"], "no object given")
    obj, cmd, rest = words[0], (words[1] if len(words) > 1 else None), words[2:]
    if obj in ("version", "help") and len(words) == 1:
        return [obj]
    if obj in ("map", "prog", "net", "cgroup") and cmd == "help" and not rest:
        return [obj, cmd]
    if obj not in ("map", "prog", "net", "cgroup"):
        _refuse(words[:2], f"object {obj!r} is not one learners read")
    if cmd is None:
        _refuse(words, "no command given")
    if cmd in _WRITES:
        _refuse(words[:2], "only reading is allowed")
    if obj == "cgroup" and cmd == "tree":
        _refuse(words[:2], "cgroup tree shows every lab's cgroups; name yours with cgroup show CGROUP")
    if obj == "map" and cmd in ("dump", "show", "list", "peek", "lookup", "getnext"):
        return _map_or_prog(words, obj, cmd, rest, pin_roots)
    if obj == "prog" and cmd in ("show", "list"):
        return _map_or_prog(words, obj, cmd, rest, pin_roots)
    if obj == "net" and cmd in ("show", "list"):
        if not rest:
            return [obj, cmd]
        if len(rest) == 2 and rest[0] == "dev" and _IFNAME.match(rest[1]):
            return [obj, cmd, *rest]
        _refuse(words, f"expected nothing or `dev IFNAME` after net {cmd}")
    if obj == "cgroup" and cmd in ("show", "list"):
        if not rest or len(rest) > 2 or (len(rest) == 2 and rest[1] != "effective"):
            _refuse(words, f"expected `cgroup {cmd} CGROUP [effective]`")
        return [obj, cmd, _path(words, rest[0], cgroups, "cgroup", equal_ok=True), *rest[1:]]
    _refuse(words[:2], f"{obj} {cmd} is not among the commands labkit runs for you")
    raise AssertionError("unreachable")


def check_args(args: list[str], pin_roots: list[str], cgroups: list[str]) -> list[str]:
    """The arguments to give bpftool (options first, paths resolved), or ConfigError naming what is refused
    and what is allowed. ``pin_roots`` are the caller's lab's pin directories, ``cgroups`` its cgroup
    directories.

    >>> check_args(["net", "show", "-j"], [], [])
    ['-j', 'net', 'show']
    >>> check_args(["map", "dump", "pinned", "/sys/fs/bpf/labkit/demo_u1000/../demo_u1001/node-a/m"],
    ...            ["/sys/fs/bpf/labkit/demo_u1000"], [])
    Traceback (most recent call last):
    labkit.errors.ConfigError: bpftool map dump pinned /sys/fs/bpf/labkit/demo_u1000/../demo_u1001/node-a/m: refused (pinned path '/sys/fs/bpf/labkit/demo_u1000/../demo_u1001/node-a/m' has a '..' component); allowed: ...
    """
    if not isinstance(args, (list, tuple)):
        raise ConfigError(f"bpftool arguments: expected a list of strings, got {type(args).__name__}")
    if len(args) > MAX_ARGS:
        raise ConfigError(f"bpftool arguments: expected at most {MAX_ARGS}, got {len(args)}")
    for a in args:
        if not isinstance(a, str):
            raise ConfigError(f"bpftool argument {a!r:.80}: expected a string, got {type(a).__name__}")
        if "\0" in a:
            raise ConfigError(f"bpftool argument {a[:80]!r}: expected no NUL bytes")
        if len(a) > MAX_ARG_LEN:
            raise ConfigError(f"bpftool argument {a[:40]!r}...: expected at most {MAX_ARG_LEN} characters, "
                              f"got {len(a)}")
    options, words = [], []
    for a in args:
        if a.startswith("-"):
            if a in _OPTIONS:
                options.append(_OPTIONS[a])
            elif len(a) > 2 and a[1] != "-" and set(a[1:]) <= _SHORT:
                options.append(a)
            else:
                _refuse([a], f"option {a!r} is not one of -j, --json, -p, --pretty, -n, --nomount")
        else:
            words.append(a)
    return options + _positional(words, [str(r) for r in pin_roots], [str(c) for c in cgroups])


def run(args: list[str], *, netns: str | None, pin_roots: list[str], cgroups: list[str],
        timeout: float = 30) -> subprocess.CompletedProcess:
    """Run bpftool (at :data:`BPFTOOL`) with ``args`` once :func:`check_args` has passed them, inside network
    namespace ``netns`` when one is given (for ``net show``); its output as text, its return code as is.

    ``run(["-j", "map", "dump", "pinned", pin], netns=None, pin_roots=[lab_pins], cgroups=[])`` is
    ``bpftool -j map dump pinned PIN`` as root. ConfigError when refused, NotFoundError for a missing
    namespace, PrivilegeError when bpftool is not installed, LabTimeoutError after ``timeout`` seconds.
    """
    argv = check_args(args, pin_roots, cgroups)
    if BPFTOOL is None:
        raise PrivilegeError(f"bpftool: expected it in {_PATH}, found none (apt-get install bpftool)")
    preexec = None
    if netns is not None:
        if not _netns.exists(netns):
            raise NotFoundError(f"network namespace {netns!r}: expected {_netns.NETNS_DIR}/{netns}, found none")
        preexec = _netns.preexec(netns, None, new_session=False)
    try:
        return subprocess.run([BPFTOOL, *argv], capture_output=True, text=True, errors="replace", timeout=timeout,
                              stdin=subprocess.DEVNULL, cwd="/", env={"PATH": _PATH, "LC_ALL": "C"},
                              preexec_fn=preexec, check=False)
    except subprocess.TimeoutExpired:
        raise LabTimeoutError(f"bpftool {' '.join(argv)[:200]}: expected it done within {timeout} s, "
                              "it was not (killed)") from None
