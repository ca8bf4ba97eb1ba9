"""What crosses the door, and what labkitd keeps on disk: typed objects as JSON, and back.

Rows, flows, steps, snapshots and GC runs leave labkitd as JSON and arrive in the client as the
same classes the datapath side built (a :class:`~labkit.maps.ct.CtRow` is a ``CtRow`` on both
sides); the evidence journal is kept in the same form (:mod:`labkit.door.evidence`). JSON has no
tuples, sets or bytes, so those carry a tag, and so does every object of a known class::

    >>> dumps = lambda v: to_json(v)
    >>> dumps((60, 8000)), dumps({"a", "b"}) == {"$s": ["a", "b"]}, dumps(b"\\x01\\x02")
    ({'$t': [60, 8000]}, True, {'$b': '0102'})
    >>> from_json({"$t": [60, 8000]})
    (60, 8000)

**Which way is trusted.** A client decodes whatever labkitd sends (:func:`from_json`). labkitd decodes
what a client sends with :func:`plain_from_json` only: plain values (strings, numbers, lists, tuples,
sets, mappings), never an object of a class, bounded in depth and size — an answer to a check, the
arguments of a verb.

    >>> plain_from_json({"$c": "CtRow", "f": []})
    Traceback (most recent call last):
    labkit.errors.RequestError: a value: expected plain data (strings, numbers, lists, tuples, mappings), got an object of class 'CtRow'
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
from typing import Any, Callable

from labkit.errors import RequestError

__all__ = ["to_json", "from_json", "plain_from_json", "PLAIN_DEPTH", "PLAIN_ITEMS", "register"]

#: How deep and how large a client's plain value may be.
PLAIN_DEPTH = 16
PLAIN_ITEMS = 100_000

#: Class name -> "module:attribute", imported on first use (a client that never sees a GC run never loads the GC).
_WHERE = {
    "CtRow": "labkit.maps.ct:CtRow",
    "NatRow": "labkit.maps.nat:NatRow",
    "Flow": "labkit.observe.trace:Flow",
    "Step": "labkit.notebook.steps:Step",
    "Snapshot": "labkit.observe.evidence:Snapshot",
    "GcRun": "labkit.agent.gc:GcRun",
    "MapScan": "labkit.agent.gc:MapScan",
    "Lookup": "labkit.fqdn.lookup:Lookup",
    "ObserveView": "labkit.notebook.hubbleview:ObserveView",
    "ConntrackRow": "labkit.agent.kubeproxy.conntrack:ConntrackRow",
    "LbSnapshot": "labkit.maps.lb:LbSnapshot",
    "MaglevLut": "labkit.maps.lb:MaglevLut",
    "Service": "labkit.agent.services.model:Service",
    "CompletedProcess": "subprocess:CompletedProcess",
}
#: Class name -> (encode(obj) -> JSON value, decode(value, context) -> obj) for classes not encoded field by field.
_CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any, dict], Any]]] = {}
#: Classes whose lists travel as one table (``{"$cl": name, "v": [...]}``): rows read by the thousand.
_LISTS = ("CtRow", "Flow")


def register(name: str, encode: Callable[[Any], Any], decode: Callable[[Any, dict], Any]) -> None:
    """Give class ``name`` (a key of the table of known classes) its own encoding."""
    if name not in _WHERE:
        raise KeyError(f"wire class {name!r}: expected one of {', '.join(sorted(_WHERE))}")
    _CODECS[name] = (encode, decode)


@functools.lru_cache(maxsize=None)
def _cls(name: str):
    module, _, attr = _WHERE[name].partition(":")
    return getattr(importlib.import_module(module), attr)


# -- encoding ------------------------------------------------------------------------------------
def to_json(value: Any) -> Any:
    """``value`` as JSON-able data: plain values as they are (tuples, sets and bytes tagged), objects of
    the known classes as ``{"$c": name, ...}``. Anything else is a TypeError (labkitd's bug, not the user's)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, list):
        if value and type(value[0]).__name__ in _LISTS and all(type(v) is type(value[0]) for v in value):
            name = type(value[0]).__name__  # a table of rows: one tag for all of them
            return {"$cl": name, "v": [_CODECS[name][0](v) for v in value]}
        return [to_json(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return {"$t": [to_json(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"$s": sorted((to_json(v) for v in value), key=repr)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$b": bytes(value).hex()}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: to_json(v) for k, v in value.items()}
        return {"$m": [[to_json(k), to_json(v)] for k, v in value.items()]}
    name = type(value).__name__
    if name in _WHERE and isinstance(value, _cls(name)):
        if name in _CODECS:
            return {"$c": name, "v": _CODECS[name][0](value)}
        if dataclasses.is_dataclass(value):
            return {"$c": name, "f": {f.name: to_json(getattr(value, f.name))
                                      for f in dataclasses.fields(value) if f.init}}
    raise TypeError(f"wire: cannot send an object of class {type(value).__module__}.{name}")


# -- decoding ------------------------------------------------------------------------------------
def from_json(data: Any, context: dict | None = None) -> Any:
    """What :func:`to_json` made, back as objects. ``context`` gives what objects need from the receiving
    side (``lab``: the lab a Step belongs to). For data labkitd sent; a client's data goes through
    :func:`plain_from_json`."""
    context = context or {}
    if isinstance(data, list):
        return [from_json(v, context) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1:
        (tag, inner), = data.items()
        if tag == "$t":
            return tuple(from_json(v, context) for v in inner)
        if tag == "$s":
            return {from_json(v, context) for v in inner}
        if tag == "$b":
            return bytes.fromhex(inner)
        if tag == "$m":
            return {_key(from_json(k, context)): from_json(v, context) for k, v in inner}
    if "$cl" in data and len(data) == 2:
        name = data["$cl"]
        if name not in _LISTS:
            raise RequestError(f"wire: unknown class {name!r:.60}")
        decode = _CODECS[name][1]
        return [decode(v, context) for v in data["v"]]
    if "$c" in data:
        name = data["$c"]
        if name not in _WHERE:
            raise RequestError(f"wire: unknown class {name!r:.60}")
        if name in _CODECS:
            return _CODECS[name][1](data["v"], context)
        return _cls(name)(**{k: from_json(v, context) for k, v in data["f"].items()})
    return {k: from_json(v, context) for k, v in data.items()}


def _key(k):
    return tuple(k) if isinstance(k, list) else k


def plain_from_json(data: Any, what: str = "a value") -> Any:
    """A client's value as Python data, refusing anything but plain values (no ``$c`` objects), deeper than
    :data:`PLAIN_DEPTH` or with more than :data:`PLAIN_ITEMS` items in all: :class:`RequestError` naming ``what``."""
    count = [0]

    def walk(v, depth: int):
        count[0] += 1
        if count[0] > PLAIN_ITEMS:
            raise RequestError(f"{what}: expected at most {PLAIN_ITEMS} items in all, got more")
        if depth > PLAIN_DEPTH:
            raise RequestError(f"{what}: expected nesting at most {PLAIN_DEPTH} deep, got deeper")
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [walk(x, depth + 1) for x in v]
        if isinstance(v, dict):
            if "$c" in v:
                raise RequestError(f"{what}: expected plain data (strings, numbers, lists, tuples, mappings), "
                                   f"got an object of class {str(v['$c'])[:40]!r}")
            if len(v) == 1:
                (tag, inner), = v.items()
                if tag in ("$t", "$s") and isinstance(inner, list):
                    items = [walk(x, depth + 1) for x in inner]
                    if tag == "$t":
                        return tuple(items)
                    try:
                        return set(items)
                    except TypeError:
                        raise RequestError(f"{what}: a set of unhashable items") from None
                if tag == "$b" and isinstance(inner, str):
                    try:
                        return bytes.fromhex(inner)
                    except ValueError:
                        raise RequestError(f"{what}: bytes that are not hex") from None
                if tag == "$m" and isinstance(inner, list):
                    out = {}
                    for pair in inner:
                        if not (isinstance(pair, list) and len(pair) == 2):
                            raise RequestError(f"{what}: a mapping entry that is not a [key, value] pair")
                        k = walk(pair[0], depth + 1)
                        try:
                            out[_key(k)] = walk(pair[1], depth + 1)
                        except TypeError:
                            raise RequestError(f"{what}: an unhashable mapping key") from None
                    return out
            return {k: walk(x, depth + 1) for k, x in v.items()}
        raise RequestError(f"{what}: expected plain data, got {type(v).__name__}")

    return walk(data, 0)


# -- the classes with an encoding of their own --------------------------------------------------
_CT_FIELDS: list[str] = []  #: CtRow's fields in order, the key last (filled on first use)


def _ct_fields() -> list[str]:
    if not _CT_FIELDS:
        names = [f.name for f in dataclasses.fields(_cls("CtRow"))]
        _CT_FIELDS.extend([n for n in names if n != "key"] + ["key"])
    return _CT_FIELDS


def _ct_encode(row) -> list:
    # Field by field, in order, the key (bytes) last as hex: the live table reads a thousand rows at a time.
    d = row.__dict__
    values = [d[name] for name in _ct_fields()]
    values[-1] = values[-1].hex()
    return values


def _ct_decode(values: list, context: dict):
    names = _ct_fields()
    if not isinstance(values, list) or len(values) != len(names):
        got = len(values) if isinstance(values, list) else repr(values)[:60]
        raise TypeError(f"wire: a CtRow has {len(names)} values; got {got}")
    fields = dict(zip(names, values))
    fields["key"] = bytes.fromhex(fields["key"])
    return _cls("CtRow")._made(fields)


def _flow_encode(flow) -> list:
    return [bytes(flow.event).hex(), flow.node, flow.device, flow.wall]


def _flow_decode(values: list, context: dict):
    from labkit.observe.trace import EVENT_SIZE, Flow, TraceEvent

    raw = bytes.fromhex(values[0])
    return Flow(TraceEvent.from_buffer_copy(raw[:EVENT_SIZE]), values[1], values[2], values[3])


def _step_encode(step) -> dict:
    return {f.name: to_json(getattr(step, f.name)) for f in dataclasses.fields(step) if f.init and f.name != "lab"}


def _step_decode(values: dict, context: dict):
    return _cls("Step")(lab=context.get("lab"), **{k: from_json(v, context) for k, v in values.items()})


def _lb_encode(snap) -> dict:
    return {"services": [[bytes(k).hex(), bytes(v).hex()] for k, v in snap.services],
            "backends": [[bytes(k).hex(), bytes(v).hex()] for k, v in snap.backends],
            "revnat": [[bytes(k).hex(), bytes(v).hex()] for k, v in snap.revnat],
            "cilium": snap.cilium}


def _lb_decode(values: dict, context: dict):
    from labkit.maps import lb

    def pairs(items, kt, vt):
        return tuple((kt.from_buffer_copy(bytes.fromhex(k)), vt.from_buffer_copy(bytes.fromhex(v))) for k, v in items)

    return lb.LbSnapshot(pairs(values["services"], lb.Lb4Key, lb.Lb4Service),
                         pairs(values["backends"], lb.Lb4BackendKey, lb.Lb4Backend),
                         pairs(values["revnat"], lb.Lb4RevNatKey, lb.Lb4ReverseNat), values["cilium"])


def _service_encode(svc) -> dict:
    return svc.to_json()


def _service_decode(values: dict, context: dict):
    return _cls("Service").from_json(values)


def _proc_encode(done) -> dict:
    return {"args": to_json(done.args), "returncode": done.returncode, "stdout": to_json(done.stdout),
            "stderr": to_json(done.stderr)}


def _proc_decode(values: dict, context: dict):
    import subprocess

    return subprocess.CompletedProcess(from_json(values["args"]), values["returncode"], from_json(values["stdout"]),
                                       from_json(values["stderr"]))


register("CtRow", _ct_encode, _ct_decode)
register("MaglevLut", lambda lut: list(lut.backend_ids), lambda ids, context: _cls("MaglevLut")(ids))
register("Flow", _flow_encode, _flow_decode)
register("Step", _step_encode, _step_decode)
register("LbSnapshot", _lb_encode, _lb_decode)
register("Service", _service_encode, _service_decode)
register("CompletedProcess", _proc_encode, _proc_decode)
