"""labkitd's listener: one unix socket, a thread per connection, frames in and out.

Each connection's caller is read once from the kernel (:meth:`Caller.of_socket`). Each request is read
whole (at most :data:`~labkit.door.api.MAX_REQUEST` bytes, with at most :data:`~labkit.door.api.MAX_FDS`
descriptors), handed to :func:`labkit.door.verbs.call`, and answered with one frame. A request that is
malformed or too large is answered with one clear error and changes nothing; one too large also ends
the connection (its body is never read). Limits per user: open connections and requests in progress.
"""
from __future__ import annotations

import array
import os
import socket
import socketserver
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from labkit.door import api
from labkit.door.owners import Caller
from labkit.errors import LimitError, RequestError

__all__ = ["Door", "read_frame", "send_frame"]

#: How long the rest of a frame may take once its first byte arrived (a client that stalls mid-request).
FRAME_TIMEOUT = 30.0


def read_frame(sock: socket.socket, limit: int = api.MAX_REQUEST, max_fds: int = api.MAX_FDS
               ) -> tuple[bytes, list[int]] | None:
    """One frame's body and the descriptors that came with it; None at a clean end of the connection.
    RequestError (after closing any descriptors) when the frame is larger than ``limit``."""
    fds = array.array("i")
    head = b""
    while len(head) < api.HEADER.size:
        try:
            data, anc, flags, _ = sock.recvmsg(api.HEADER.size - len(head), socket.CMSG_SPACE(max_fds * fds.itemsize))
        except InterruptedError:
            continue
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if flags & socket.MSG_CTRUNC:
            _close(fds)
            raise RequestError(f"request: carried more than {max_fds} file descriptors")
        if not data:
            _close(fds)
            if head:
                raise RequestError("request: the connection ended inside a frame's header")
            return None
        head += data
    (length,) = api.HEADER.unpack(head)
    if length > limit:
        _close(fds)
        raise RequestError(f"request: {length} bytes; labkitd reads at most {limit} bytes per request")
    body = bytearray()
    sock.settimeout(FRAME_TIMEOUT)
    try:
        while len(body) < length:
            chunk = sock.recv(min(length - len(body), 1 << 20))
            if not chunk:
                _close(fds)
                raise RequestError(f"request: the connection ended after {len(body)} of {length} bytes")
            body += chunk
    except TimeoutError:
        _close(fds)
        raise RequestError(f"request: the rest of a {length}-byte frame did not come within {FRAME_TIMEOUT} s") from None
    finally:
        sock.settimeout(None)
    return bytes(body), list(fds)


def send_frame(sock: socket.socket, obj, fds: list[int] | None = None) -> None:
    """Write one frame (with ``fds`` attached to its first byte)."""
    data = api.frame(obj)
    if fds:
        sent = sock.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        data = data[sent:]
    sock.sendall(data)


def _close(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _PerUser:
    """Counts per uid (connections, requests in progress), refusing past a limit."""

    def __init__(self):
        self._mutex = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}

    def take(self, what: str, uid: int, limit: int, refusal: str) -> None:
        with self._mutex:
            n = self._counts.get((what, uid), 0)
            if uid != 0 and n >= limit:
                raise LimitError(refusal.format(n=n, limit=limit))
            self._counts[(what, uid)] = n + 1

    def give(self, what: str, uid: int) -> None:
        with self._mutex:
            n = self._counts.get((what, uid), 1) - 1
            if n <= 0:
                self._counts.pop((what, uid), None)
            else:
                self._counts[(what, uid)] = n


class Door(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The listening socket. ``handle(caller, body, fds)`` answers one request (a dict for the frame)."""

    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, path: Path, handle: Callable[[Caller, bytes, list[int]], dict], limits,
                 log: Callable[[str], None] | None = None):
        self.path = Path(path)
        self.handle_request_body = handle
        self.limits = limits
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.per_user = _PerUser()
        self.started = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o755)
        _unlink_stale(self.path)
        super().__init__(str(self.path), _Handler)
        os.chmod(self.path, 0o666)  # anyone may knock; SO_PEERCRED says who did

    def server_close(self) -> None:
        super().server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def _unlink_stale(path: Path) -> None:
    """Remove a socket file no one listens on (a labkitd that was killed); refuse to start beside a live one."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise RequestError(f"labkitd socket {path}: a file that is not a socket is in the way; expected none")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    finally:
        probe.close()
    raise LimitError(f"labkitd socket {path}: another labkitd is answering there; expected one per machine")


class _Handler(socketserver.BaseRequestHandler):
    server: Door

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            caller = Caller.of_socket(sock)
        except OSError:
            return
        door = self.server
        try:
            door.per_user.take("conn", caller.uid, door.limits.connections_per_user,
                               "connection refused: you have {n} connections open to labkitd; it allows {limit}")
        except LimitError as exc:
            _try_send(sock, api.failure(exc))
            return
        try:
            self._serve(sock, caller)
        finally:
            door.per_user.give("conn", caller.uid)

    def _serve(self, sock: socket.socket, caller: Caller) -> None:
        door = self.server
        while True:
            try:
                got = read_frame(sock)
            except RequestError as exc:
                _try_send(sock, api.failure(exc))
                return  # the stream's framing is lost: this connection ends
            except (ConnectionResetError, BrokenPipeError, OSError):
                return
            if got is None:
                return
            body, fds = got
            try:
                try:
                    door.per_user.take("req", caller.uid, door.limits.concurrent_per_user,
                                       "request refused: you have {n} requests in progress; labkitd allows {limit}")
                except LimitError as exc:
                    reply = api.failure(exc)
                else:
                    try:
                        reply = door.handle_request_body(caller, body, fds)
                    finally:
                        door.per_user.give("req", caller.uid)
            finally:
                _close(fds)  # a verb that keeps a descriptor dup()s it
            if not _try_send(sock, reply):
                return


def _try_send(sock: socket.socket, obj) -> bool:
    try:
        send_frame(sock, obj)
        return True
    except (BrokenPipeError, ConnectionResetError, OSError):
        return False
