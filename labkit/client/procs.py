"""A process labkitd started for you in a pod or node, handled like :class:`subprocess.Popen`.

labkitd starts the command as you, in the pod's namespace and cgroup, with exactly CAP_NET_RAW and
CAP_NET_ADMIN (:mod:`labkit.door.sandbox`); its stdin, stdout and stderr are *your* pipes (their ends
travel to labkitd with the request), and its exit status comes back on a fourth pipe of yours, so
waiting for it needs no labkitd at all::

    >>> p = lab.popen("a1", ["ping", "-c", "1", "198.18.2.11"], stdout=subprocess.PIPE, text=True)  # doctest: +SKIP
    >>> p.communicate()[0].splitlines()[-1], p.returncode                                       # doctest: +SKIP
    ('rtt min/avg/max/mdev = ...', 0)
"""
from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import threading
import time
from typing import Any, Sequence

__all__ = ["RemoteProcess", "run"]


def _child_fd(spec: Any, default: int, opened: list[int], ours: dict, which: str, reading: bool) -> int:
    """The descriptor labkitd gives the child for ``spec`` (PIPE, DEVNULL, None, an fd or a file object)."""
    if spec == subprocess.PIPE:
        r, w = os.pipe()
        child, mine = (r, w) if reading else (w, r)
        ours[which] = mine
        opened.append(child)
        return child
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDONLY if reading else os.O_WRONLY)
        opened.append(fd)
        return fd
    if spec is None:
        return default
    if isinstance(spec, int):
        return spec
    return spec.fileno()


#: What a command inherits of this process's environment when no ``env`` is given (labkitd fills in HOME,
#: USER, LOGNAME and a PATH).
_INHERITED = ("PATH", "LANG", "LANGUAGE", "TERM", "TZ", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHASHSEED")


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k in _INHERITED or k.startswith(("LC_", "LABKIT_"))}


class RemoteProcess:
    """:class:`subprocess.Popen`'s surface (``stdin``/``stdout``/``stderr``, ``poll``, ``wait``, ``communicate``,
    ``send_signal``, ``terminate``, ``kill``, ``returncode``) for a command labkitd runs in lab ``lab``'s member
    ``name``."""

    def __init__(self, lab, name: str, args: Sequence[str], stdin=None, stdout=None, stderr=None, *, text: bool = False,
                 universal_newlines: bool | None = None, encoding: str | None = None, errors: str | None = None,
                 env: dict | None = None, cwd: str | None = None, bufsize: int = -1):
        self.lab, self.name, self.args = lab, name, list(args)
        self.returncode: int | None = None
        text = bool(text or universal_newlines or encoding or errors)
        opened: list[int] = []
        ours: dict[str, int] = {}
        status_r, status_w = os.pipe()
        opened.append(status_w)
        try:
            fd_in = _child_fd(stdin, 0, opened, ours, "stdin", reading=True)
            fd_out = _child_fd(stdout, 1, opened, ours, "stdout", reading=False)
            fd_err = fd_out if stderr == subprocess.STDOUT else _child_fd(stderr, 2, opened, ours, "stderr", False)
            started = lab._call("exec", fds=[fd_in, fd_out, fd_err, status_w], name=name, argv=self.args,
                                env=_environment() if env is None else dict(env), cwd=cwd or os.getcwd())
        except BaseException:
            for fd in list(ours.values()) + [status_r]:
                os.close(fd)
            raise
        finally:
            for fd in opened:
                os.close(fd)
        self.id, self.pid = started["id"], started["pid"]
        self._status = status_r
        self._status_text = b""
        self._lock = threading.Lock()
        self._drain: tuple[dict, list] | None = None  #: communicate()'s readers and what they read
        self.stdin = self._file(ours.get("stdin"), "wb", text, encoding, errors, bufsize)
        self.stdout = self._file(ours.get("stdout"), "rb", text, encoding, errors, bufsize)
        self.stderr = self._file(ours.get("stderr"), "rb", text, encoding, errors, bufsize)

    @staticmethod
    def _file(fd, mode, text, encoding, errors, bufsize):
        if fd is None:
            return None
        f = io.open(fd, mode, buffering=bufsize)
        if text:
            f = io.TextIOWrapper(f, encoding=encoding, errors=errors, write_through=True, line_buffering=mode == "wb")
        return f

    def __repr__(self) -> str:
        return f"<RemoteProcess {self.name}: {self.args!r} pid {self.pid} returncode {self.returncode}>"

    # -- the exit status -------------------------------------------------------------------------
    def _read_status(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for the status pipe; True once the exit status is known."""
        with self._lock:
            if self.returncode is not None:
                return True
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, _, _ = select.select([self._status], [], [], left)
                if not ready:
                    return False
                chunk = os.read(self._status, 64)
                if chunk:
                    self._status_text += chunk
                    continue
                os.close(self._status)
                text = self._status_text.decode(errors="replace").strip()
                try:
                    self.returncode = int(text.splitlines()[-1])
                except (ValueError, IndexError):  # the sandbox died before it could say (SIGKILL)
                    self.returncode = -signal.SIGKILL
                return True

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None):
        """Send ``input``, read stdout and stderr to their ends, wait: ``(stdout, stderr)``. After a TimeoutExpired,
        a second call (``kill()`` first, as with Popen) goes on reading where the first left off."""
        if self._drain is None:  # the first call: its readers stay this process's until the output ends
            out: dict[str, Any] = {}

            def drain(name: str, f) -> None:
                out[name] = f.read()
                f.close()

            threads = [threading.Thread(target=drain, args=(n, f), daemon=True)
                       for n, f in (("stdout", self.stdout), ("stderr", self.stderr)) if f is not None]
            for t in threads:
                t.start()
            self._drain = (out, threads)
            if self.stdin is not None:
                try:
                    if input:
                        self.stdin.write(input)
                    self.stdin.close()
                except BrokenPipeError:
                    pass
        out, threads = self._drain
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return out.get("stdout"), out.get("stderr")

    # -- signals ----------------------------------------------------------------------------------
    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self.lab._call("signal", id=self.id, signal=signal.Signals(sig).name)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> "RemoteProcess":
        return self

    def __exit__(self, *exc) -> None:
        for f in (self.stdout, self.stderr, self.stdin):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.wait()


def run(lab, name: str, argv: Sequence[str], *, input=None, timeout: float | None = 30, check: bool = False,
        capture_output: bool = True, text: bool = True, stdout=None, stderr=None, **kw) -> subprocess.CompletedProcess:
    """:func:`subprocess.run` for a command in lab member ``name``: captured as text by default, as
    :meth:`labkit.lab.Lab.exec` always did."""
    if capture_output:
        stdout = subprocess.PIPE if stdout is None else stdout
        stderr = subprocess.PIPE if stderr is None else stderr
    stdin = subprocess.PIPE if input is not None else kw.pop("stdin", subprocess.DEVNULL)
    proc = RemoteProcess(lab, name, argv, stdin, stdout, stderr, text=text, **kw)
    try:
        out, err = proc.communicate(input, timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done
