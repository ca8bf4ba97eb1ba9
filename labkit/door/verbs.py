"""What labkitd does for a request: one function per verb, each a thin call into the datapath side.

A verb is registered with :func:`verb`: its name, whether it names a lab (``lab``), whether it changes
the lab (``change``: it runs under the lab's lock, one change at a time) and whether only instructors
may use it. :func:`handle` decodes a request, finds the verb, resolves the lab the caller means
(:func:`labkit.door.owners.resolve`: their own, or refused), checks the arguments (:class:`Args`: every
argument typed and bounded, an unknown one refused) and answers with the verb's value as
:mod:`labkit.door.wire` JSON. Nothing is done before every check has passed, so a refused or malformed
request changes nothing.

The verbs of one lab group by what they touch: the lab's life (``up``, ``down``, ``reset``, ``status``),
its maps (``ct``, ``nat``, ``lb``, ``policy.get`` ... as typed rows), its clock, faults, trace and GC,
the agent's API (``agent``: Services and policy), traffic (:mod:`labkit.door.traffic`: steps,
connections, processes in pods) and checks.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from labkit.door import api, wire
from labkit.door.labs import Held, Labs
from labkit.door.owners import Caller, name_of, resolve
from labkit.errors import AccessError, LabkitError, NotFoundError, RequestError

__all__ = ["Verb", "VERBS", "verb", "Args", "Ctx", "handle"]


@dataclass(frozen=True)
class Verb:
    name: str
    fn: Callable[["Ctx"], Any]
    lab: bool = True  #: the request names a lab (its ``lab`` field must be set)
    change: bool = False  #: runs under the lab's lock
    instructor: bool = False  #: root and labkit-instructors only
    fds: int = 0  #: descriptors it takes


VERBS: dict[str, Verb] = {}


def verb(name: str, *, lab: bool = True, change: bool = False, instructor: bool = False, fds: int = 0):
    """Register ``fn(ctx)`` as verb ``name``."""

    def register(fn):
        if name in VERBS:
            raise ValueError(f"verb {name!r} registered twice")
        VERBS[name] = Verb(name, fn, lab, change, instructor, fds)
        return fn

    return register


class Args:
    """A request's arguments, read one by one with their type and bounds; :meth:`done` refuses the rest.

    >>> a = Args("ct", {"node": "node-a"})
    >>> a.str("node"), a.done()
    ('node-a', None)
    >>> Args("clock", {"advance": -5}).int("advance", 0, 10**9)
    Traceback (most recent call last):
    labkit.errors.RequestError: `clock`: argument 'advance' must be from 0 to 1000000000, got -5
    """

    def __init__(self, verb: str, args: dict):
        self.verb = verb
        self.args = dict(args)
        self.seen: set[str] = set()

    def _get(self, key: str, default: Any, required: bool):
        self.seen.add(key)
        if key not in self.args or self.args[key] is None:
            if required:
                raise RequestError(f"`{self.verb}`: argument '{key}' is missing")
            return default
        return self.args[key]

    def _bad(self, key: str, what: str, value: Any) -> RequestError:
        shown = repr(value)
        return RequestError(f"`{self.verb}`: argument '{key}' must be {what}, got {shown[:80]}")

    def str(self, key: str, default: Any = ..., max_len: int = 256) -> Any:
        value = self._get(key, None if default is ... else default, default is ...)
        if value is None or (default is not ... and value is default):
            return value
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        if len(value) > max_len:
            raise self._bad(key, f"at most {max_len} characters", f"{len(value)} characters")
        if "\x00" in value:
            raise self._bad(key, "a string without NUL", value)
        return value

    def int(self, key: str, lo: int, hi: int, default: Any = ...) -> Any:
        value = self._get(key, None if default is ... else default, default is ...)
        if value is None or (default is not ... and value is default):
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "a whole number", value)
        if not lo <= value <= hi:
            raise self._bad(key, f"from {lo} to {hi}", value)
        return value

    def bool(self, key: str, default: Any = ...) -> Any:
        value = self._get(key, None if default is ... else default, default is ...)
        if value is None or (default is not ... and value is default):
            return value
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def strs(self, key: str, max_items: int = 256, max_len: int = 4096, default: Any = ...) -> Any:
        value = self._get(key, None if default is ... else default, default is ...)
        if value is None or (default is not ... and value is default):
            return value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of strings", value)
        if len(value) > max_items:
            raise self._bad(key, f"at most {max_items} items", f"{len(value)} items")
        for v in value:
            if len(v) > max_len or "\x00" in v:
                raise self._bad(key, f"strings of at most {max_len} characters without NUL", v)
        return value

    def mapping(self, key: str, default: Any = ..., max_items: int = 256) -> Any:
        value = self._get(key, None if default is ... else default, default is ...)
        if value is None or (default is not ... and value is default):
            return value
        if not isinstance(value, dict) or len(value) > max_items:
            raise self._bad(key, f"an object of at most {max_items} entries", value)
        return value

    def hex(self, key: str, max_bytes: int, default: Any = ...) -> Any:
        value = self.str(key, default, max_len=2 * max_bytes)
        if value is None or (default is not ... and value is default):
            return value
        try:
            return bytes.fromhex(value)
        except ValueError:
            raise self._bad(key, "hex bytes", value) from None

    def plain(self, key: str, default: Any = ...) -> Any:
        value = self._get(key, None if default is ... else default, default is ...)
        return wire.plain_from_json(value, f"`{self.verb}` argument '{key}'")

    def any(self, key: str, default: Any = None) -> Any:
        """The raw JSON value (the verb checks it itself)."""
        return self._get(key, default, False)

    def done(self) -> None:
        unknown = sorted(set(self.args) - self.seen)
        if unknown:
            raise RequestError(f"`{self.verb}`: unknown arguments {', '.join(repr(u)[:40] for u in unknown[:5])}")


@dataclass
class Ctx:
    """One request as a verb sees it."""

    labs: Labs
    caller: Caller
    verb: str
    name: str | None  #: the lab as the caller named it
    key: str | None  #: the lab's key
    args: Args
    fds: list[int] = field(default_factory=list)
    door: Any = None  #: the daemon (its limits, its log)

    @property
    def held(self) -> Held:
        """The lab the request names, opened (NotFoundError when it is not up)."""
        try:
            return self.labs.get(self.key)
        except NotFoundError:
            raise NotFoundError(f"lab '{self.name}' is not up; start it with `labkit --lab {self.name} up`") from None

    @property
    def lab(self):
        return self.held.lab


def handle(labs: Labs, caller: Caller, body: bytes, fds: list[int], door: Any = None) -> dict:
    """Answer one request body (an answer frame's object); never raises."""
    t0 = time.monotonic()
    verb_name, lab_name = "?", None
    try:
        verb_name, lab_name, raw_args = api.decode_request(body)
        v = VERBS.get(verb_name)
        if v is None:
            raise RequestError(f"request: unknown verb {verb_name[:40]!r}; labkitd knows {', '.join(sorted(VERBS))}")
        if v.instructor and not caller.instructor:
            raise AccessError(f"`{verb_name}` refused: it is for instructors (root or the group labkit-instructors)")
        if len(fds) > v.fds:
            raise RequestError(f"`{verb_name}`: carried {len(fds)} file descriptors, expected {v.fds or 'none'}")
        key = None
        if v.lab:
            if lab_name is None:
                raise RequestError(f"`{verb_name}`: the request names no lab")
            key = resolve(caller, lab_name, verb_name)
        ctx = Ctx(labs, caller, verb_name, lab_name, key, Args(verb_name, raw_args), list(fds), door)
        if v.change and key is not None:
            with labs.lock(key):
                value = v.fn(ctx)
        else:
            value = v.fn(ctx)
        reply = api.answer(wire.to_json(value))
    except LabkitError as exc:
        reply = api.failure(exc)
    except Exception as exc:  # labkitd's own bug: answered, logged with its traceback
        import traceback

        traceback.print_exc(file=sys.stderr)
        reply = api.failure(exc)
    if door is not None:
        door.log(f"{caller.name}({caller.uid}) {verb_name} {lab_name or '-'} "
                 f"{'ok' if reply['ok'] else reply['error']['type']} {1000 * (time.monotonic() - t0):.1f} ms")
    return reply


# -- who, what ----------------------------------------------------------------------------------
@verb("hello", lab=False)
def _hello(ctx: Ctx):
    """Who labkitd thinks you are, and its version."""
    ctx.args.done()
    return {"version": api.VERSION, "uid": ctx.caller.uid, "user": ctx.caller.name,
            "instructor": ctx.caller.instructor,
            "limits": ctx.labs.limits.to_dict()}


def name_in(ctx: Ctx, key: str) -> str:
    """How ``ctx``'s caller names lab ``key``: its name when it is theirs, else its key."""
    from labkit.door.owners import owner_of

    return name_of(key) if owner_of(key) == ctx.caller.uid else key


# the verbs of each group register themselves when their module is imported
from labkit.door import labverbs as _labverbs  # noqa: E402,F401
from labkit.door import measure as _measure  # noqa: E402,F401
from labkit.door import traffic as _traffic  # noqa: E402,F401
