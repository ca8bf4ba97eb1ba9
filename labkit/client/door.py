"""The client end of labkitd's socket: one request, one answer, as typed objects.

    >>> door = DoorClient()                               # doctest: +SKIP
    >>> door.call("hello")["user"]                        # doctest: +SKIP
    'vagrant'
    >>> rows = door.call("ct", lab="demo", node="node-a")  # a list of CtRow  # doctest: +SKIP

Each thread has its own connection, kept open between calls (a live table refreshing on a timer does
not wait behind a step), and each process its own: a child forked after a call opens a connection of its own
rather than read answers meant for its parent (``labkit grade`` forks one child per notebook). A request that finds the connection closed — labkitd restarted since the last
call — is sent again once on a new one; a request whose answer is cut off is not (it may have been
done). No labkitd at all is one :class:`~labkit.errors.DoorDownError` saying how to start it.
"""
from __future__ import annotations

import array
import json
import os
import socket
import threading
from pathlib import Path

from labkit.door import api, wire
from labkit.errors import DoorDownError

__all__ = ["DoorClient", "default_door"]

_CONNECT_TIMEOUT = 10.0


class _Gone(Exception):
    """The connection was closed before the request went out."""


class DoorClient:
    """Requests to labkitd on ``path`` (default :func:`labkit.door.api.socket_path`)."""

    def __init__(self, path: str | Path | None = None):
        self.path = str(path or api.socket_path())
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"DoorClient({self.path!r})"

    # -- the connection ------------------------------------------------------------------------
    def _sock(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is not None and self._local.pid != os.getpid():  # inherited by a fork: the parent's connection
            sock.close()  # this process's copy of it only; the parent's stays open
            sock = self._local.sock = None
        if sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(_CONNECT_TIMEOUT)
            try:
                sock.connect(self.path)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                sock.close()
                raise DoorDownError(f"no labkitd answers on {self.path} ({exc.strerror}): {api.START_HINT}") from None
            except PermissionError:
                sock.close()
                raise DoorDownError(f"labkitd's socket {self.path} refused this user (permission denied); "
                                    f"expected mode 0666") from None
            except TimeoutError:
                sock.close()
                raise DoorDownError(f"labkitd on {self.path} did not accept within {_CONNECT_TIMEOUT} s") from None
            sock.settimeout(None)
            self._local.sock, self._local.pid = sock, os.getpid()
        return sock

    def close(self) -> None:
        """Close this thread's connection (the next call opens another)."""
        sock = getattr(self._local, "sock", None)
        if sock is not None:
            sock.close()
            self._local.sock = None

    def _send(self, sock: socket.socket, data: bytes, fds: list[int] | None) -> None:
        try:
            if fds:
                sent = sock.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
                if sent < 1:
                    raise _Gone()
                data = data[1:]
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError, ConnectionRefusedError):
            raise _Gone() from None

    def _recv(self, sock: socket.socket, n: int, verb: str) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                chunk = sock.recv(min(n - len(out), 1 << 20))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.close()
                raise DoorDownError(f"labkitd closed the connection while answering `{verb}` (it stopped or "
                                    f"restarted); the request may or may not have been done: {api.START_HINT}")
            out += chunk
        return bytes(out)

    # -- a request -----------------------------------------------------------------------------
    def request(self, verb: str, lab: str | None = None, args: dict | None = None,
                fds: list[int] | None = None) -> dict:
        """Send one request, return labkitd's answer object (``{"ok": …}``) as JSON data."""
        req = {"verb": verb, "args": args or {}}
        if lab is not None:
            req["lab"] = lab
        data = api.frame(req)
        for attempt in (0, 1):
            sock = self._sock()
            try:
                self._send(sock, data, fds)
                break
            except _Gone:
                self.close()
                if attempt:
                    raise DoorDownError(f"labkitd closed the connection before `{verb}` was sent: {api.START_HINT}")
        (length,) = api.HEADER.unpack(self._recv(sock, api.HEADER.size, verb))
        body = self._recv(sock, length, verb)
        return json.loads(body)

    def call(self, verb: str, lab: str | None = None, *, fds: list[int] | None = None, context: dict | None = None,
             **args):
        """One verb with keyword arguments; its value as typed objects (``context`` gives what decoding needs,
        e.g. the lab a Step belongs to), or the error labkitd raised, raised here."""
        reply = self.request(verb, lab, wire.to_json(args), fds)
        if not reply.get("ok"):
            raise api.error_of(reply.get("error") or {})
        return wire.from_json(reply.get("value"), context)


_DEFAULT: DoorClient | None = None


def default_door() -> DoorClient:
    """This process's client of the labkitd ``$LABKIT_DOOR`` names (or the default socket)."""
    global _DEFAULT
    path = str(api.socket_path())
    if _DEFAULT is None or _DEFAULT.path != path:
        _DEFAULT = DoorClient(path)
    return _DEFAULT
