"""labkitd's API: what both sides of the door agree on — where it listens, how a request is framed,
how big it may be, and how an error crosses back.

One unix socket per machine, ``/run/labkitd/labkitd.sock`` (``LABKIT_DOOR`` names another), mode
0666: anyone may knock, and labkitd asks the kernel who knocked (``SO_PEERCRED``). A connection
carries requests one after another; each request and each answer is one *frame*: a 4-byte
big-endian length, then that many bytes of UTF-8 JSON. A request is an object::

    {"verb": "ct", "lab": "demo", "args": {"node": "node-a"}}

and its answer is ``{"ok": true, "value": ...}`` or ``{"ok": false, "error": {"type": "NotFoundError",
"message": "...", "errno": null}}`` — the class and message labkitd raised, so the client raises
the same (:func:`error_of`). A request may carry open file descriptors (``SCM_RIGHTS``, at most
:data:`MAX_FDS`, sent with the frame's first byte): a process started in a pod writes to the
caller's own pipes. A request larger than :data:`MAX_REQUEST` is refused before it is read.

    >>> frame({"verb": "hello"})[:4]
    b'\\x00\\x00\\x00\\x10'
    >>> decode_request(b'{"verb": "ct", "lab": "demo", "args": {"node": "node-a"}}')
    ('ct', 'demo', {'node': 'node-a'})
    >>> error_of({"type": "NotFoundError", "message": "pod 'a9' not found"})
    NotFoundError("pod 'a9' not found")
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from labkit import errors
from labkit.errors import LabkitError, RequestError

__all__ = ["SOCKET", "socket_path", "MAX_REQUEST", "MAX_FDS", "HEADER", "frame", "encode", "decode_request",
           "answer", "failure", "error_of", "START_HINT", "VERSION"]

#: Where labkitd listens unless ``LABKIT_DOOR`` says otherwise.
SOCKET = Path("/run/labkitd/labkitd.sock")
#: The protocol's version; ``hello`` answers it, and a client of another version is told so.
VERSION = 1
#: The largest request labkitd reads (a 50,000-service apply fits with room to spare).
MAX_REQUEST = 12 * 1024 * 1024
#: File descriptors one request may carry (a process's stdin, stdout, stderr and its exit-status pipe).
MAX_FDS = 4
HEADER = struct.Struct(">I")
#: What a client that finds no labkitd is told.
START_HINT = ("start it with `sudo systemctl start labkitd` (the VM), or `sudo labkit daemon start` "
              "(a host without systemd), or run `sudo labkit daemon run` in the foreground")


def socket_path() -> Path:
    """The socket labkitd listens on (``$LABKIT_DOOR`` or :data:`SOCKET`)."""
    return Path(os.environ.get("LABKIT_DOOR") or SOCKET)


def encode(obj) -> bytes:
    """``obj`` as the JSON of a frame's body (compact, UTF-8)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def frame(obj) -> bytes:
    """One frame: the length, then ``obj``'s JSON."""
    body = encode(obj)
    return HEADER.pack(len(body)) + body


def decode_request(body: bytes) -> tuple[str, str | None, dict]:
    """(verb, lab, args) of a request body; :class:`RequestError` saying what is wrong with it."""
    try:
        req = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RequestError(f"request: expected UTF-8 JSON, got undecodable bytes ({exc.reason} at {exc.start})") from None
    except ValueError as exc:
        raise RequestError(f"request: expected a JSON object, got invalid JSON ({exc})") from None
    if not isinstance(req, dict):
        raise RequestError(f"request: expected a JSON object, got {type(req).__name__}")
    verb, lab, args = req.get("verb"), req.get("lab"), req.get("args", {})
    if not isinstance(verb, str) or not verb:
        raise RequestError(f"request: expected 'verb' to be a non-empty string, got {verb!r:.60}")
    if lab is not None and not isinstance(lab, str):
        raise RequestError(f"request {verb!r}: expected 'lab' to be a string or null, got {type(lab).__name__}")
    if not isinstance(args, dict):
        raise RequestError(f"request {verb!r}: expected 'args' to be an object, got {type(args).__name__}")
    unknown = set(req) - {"verb", "lab", "args"}
    if unknown:
        raise RequestError(f"request {verb!r}: unknown fields {sorted(unknown)!r:.100}; expected verb, lab, args")
    return verb, lab, args


def answer(value) -> dict:
    """A successful answer."""
    return {"ok": True, "value": value}


def failure(exc: BaseException) -> dict:
    """The answer that carries ``exc`` back (its class name, message and errno)."""
    if isinstance(exc, LabkitError):
        name = type(exc).__name__
        name = name if isinstance(getattr(errors, name, None), type) else _base_name(exc)
        message = exc.strerror if isinstance(exc, OSError) and exc.errno is not None and exc.strerror else str(exc)
    else:  # a bug in labkitd: say so, without its insides
        name, message = "LabStateError", f"labkitd failed: {type(exc).__name__}: {exc}"
    errno = getattr(exc, "errno", None)
    return {"ok": False, "error": {"type": name, "message": message, "errno": errno if isinstance(errno, int) else None}}


def _base_name(exc: LabkitError) -> str:
    """The nearest class of :mod:`labkit.errors` an error derives from (a subclass defined elsewhere)."""
    for cls in type(exc).__mro__:
        if getattr(errors, cls.__name__, None) is cls:
            return cls.__name__
    return "LabkitError"


def error_of(err: dict) -> LabkitError:
    """The exception an error answer stands for: the class labkitd raised (one of :mod:`labkit.errors`)."""
    cls = getattr(errors, str(err.get("type", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, LabkitError)):
        cls = errors.LabStateError
    message = str(err.get("message", "labkitd refused the request"))
    if issubclass(cls, OSError) and isinstance(err.get("errno"), int):
        return cls(err["errno"], message)
    return cls(message)
