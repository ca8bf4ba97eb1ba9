"""Entering network namespaces: for a thread (netlink sockets, sysctls) and
for a child process (pod servers, ``labkit exec``).

A netlink socket belongs to the namespace it was opened in, so
``with entered("lk-demo-node-a"): ipr = IPRoute()`` gives a handle that keeps
working in that namespace after the thread has left it.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from typing import Callable, Iterator

from labkit.errors import NetnsError

__all__ = ["entered", "preexec", "exists", "create", "create_many", "remove", "NETNS_DIR", "sysctl", "enter_process"]

NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(err, f"setns into {what}: {os.strerror(err)}")


def exists(name: str) -> bool:
    """Whether ``ip netns`` would list ``name``."""
    return os.path.exists(os.path.join(NETNS_DIR, name))


def create(name: str) -> None:
    """``ip netns add name``: a new namespace, bind-mounted at ``/run/netns/<name>``.

    pyroute2 makes it in a forked child; handing it this module's libc spares that child a
    ``find_library('c')``, which runs ``ldconfig -p`` once per namespace (about 30 ms each).
    """
    from pyroute2 import netns

    netns.create(name, libc=_libc)


def create_many(names: list[str], before=None) -> None:
    """``ip netns add`` for each of ``names``, in one thread of this process rather than a forked child each: the
    thread unshares a new network namespace and bind-mounts it at ``/run/netns/<name>``, then the next (a fork of a
    large process costs tens of ms; this costs well under one). ``before(name)`` runs first for each (the ledger
    records it before it exists). The calling thread's own namespace is untouched."""
    import threading

    from pyroute2.netns import _create

    failure: list[BaseException] = []

    def work() -> None:
        try:
            for name in names:
                if before is not None:
                    before(name)
                if _libc.unshare(_CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise NetnsError(err, f"ip netns add {name}: unshare: {os.strerror(err)}")
                _create(name, _libc, pid="thread-self")
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=work, name="netns-add")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def remove(name: str) -> None:
    """``ip netns delete name``: unmount ``/run/netns/<name>`` and remove the file."""
    from pyroute2 import netns

    netns.remove(name, libc=_libc)


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with this thread inside namespace ``name``, then come back."""
    path = os.path.join(NETNS_DIR, name)
    try:
        target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsError(errno.ENOENT, f"network namespace '{name}' does not exist ({path})") from None
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(target, name)
        try:
            yield
        finally:
            _setns(own, "the original namespace")
    finally:
        os.close(target)
        os.close(own)


def enter_process(name: str, cgroup: str | None = None) -> None:
    """Move the calling (single-threaded) process into ``name`` and ``cgroup``."""
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        _setns(fd, name)
    finally:
        os.close(fd)
    if cgroup:
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


def preexec(name: str, cgroup: str | None = None, new_session: bool = True) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that starts the child in ``name``."""

    def run() -> None:
        if new_session:
            os.setsid()
        enter_process(name, cgroup)

    return run


def sysctl(name: str, values: dict[str, str | int]) -> None:
    """Set sysctls (``net.ipv4.ip_forward`` style keys) inside namespace ``name``."""
    with entered(name):
        for key, value in values.items():
            path = "/proc/sys/" + key.replace(".", "/")
            try:
                with open(path, "w") as f:
                    f.write(str(value))
            except OSError as exc:
                raise NetnsError(exc.errno, f"sysctl {key}={value} in '{name}': {exc.strerror}") from None
