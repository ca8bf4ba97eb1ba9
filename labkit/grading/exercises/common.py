"""What every lab's graders share: reading answers, naming rows, and finding a step's rows in its evidence.

Graders read only evidence (:mod:`labkit.observe.evidence`): the rows a step recorded when it ran, a snapshot a
cell took, a GC run. These helpers turn a learner's answer into comparable form and find rows in that
evidence; :func:`unhealthy` is the one way to say that the recorded world is not what the exercise is
about (a fault was on, a connection failed), which costs the learner no try.

    >>> norm_kind("tcp out"), kinds_answer(["ICMP in related"]), hook_name("cil_from_container")
    ('TCP OUT', ['ICMP IN related'], 'from-container')
"""
from __future__ import annotations

import re
import socket
from typing import Any, Iterable

from labkit.addr import ipv4
from labkit.grading.checks import Outcome
from labkit.maps.ct import CtRow

__all__ = ["words", "row_kind", "norm_kind", "kinds_answer", "hook_name",
           "step_rows", "conn_rows", "unhealthy", "broken_step", "flag_list", "touched", "src", "dst", "is_syn", "addr_port",
           "ab_answer", "flatten"]

def words(answer: Any) -> list[str]:
    """The lower-case words of a text answer (or of every item of a list answer)."""
    items = answer if isinstance(answer, (list, tuple, set)) else [answer]
    return [w for item in items for w in re.split(r"[^a-z0-9_-]+", str(item).lower()) if w]


def row_kind(row: CtRow) -> str:
    """``"ICMP OUT"``, ``"ICMP IN related"``: a row named without its addresses and ports."""
    return f"{row.proto_name} {row.dir}" + (" related" if row.related else "")


def norm_kind(text: Any) -> str:
    """A learner's row kind in :func:`row_kind` form (case and spacing forgiven)."""
    tokens = str(text).replace(",", " ").split()
    related = any(t.lower() == "related" for t in tokens)
    rest = [t.upper() for t in tokens if t.lower() != "related"]
    return " ".join(rest + (["related"] if related else []))


def kinds_answer(answer: Any) -> list[str] | None:
    """A list-of-row-kinds answer normalised, or None when it is not a list of strings."""
    if isinstance(answer, str):
        answer = [answer]
    if not isinstance(answer, (list, tuple, set)) or not all(isinstance(a, str) for a in answer):
        return None
    return [norm_kind(a) for a in answer]


def flag_list(answer: Any, names: Iterable[str]) -> list[str] | None:
    """Names from ``names`` (case forgiven) in a list or comma/space separated answer; None if one is not."""
    known = {n.lower(): n for n in names}
    items = answer if isinstance(answer, (list, tuple, set)) else str(answer).replace(",", " ").replace("|", " ").split()
    out = []
    for item in items:
        name = known.get(str(item).strip().lower())
        if name is None:
            return None
        out.append(name)
    return out


def hook_name(text: Any) -> str:
    """A hook as the learner wrote it, in Cilium's form: ``from-container``."""
    name = str(text).strip().lower().replace("_", "-").replace(" ", "-")
    return name[4:] if name.startswith("cil-") else name


def step_rows(step, node: str, proto: str | None = None, direction: str | None = None,
              related: bool | None = False, when: str = "after") -> list[CtRow]:
    """The CT rows of ``node`` the step recorded (``when`` 'after' or 'before'), filtered."""
    rows = (step.after if when == "after" else step.before).get(node, [])
    return [r for r in rows if (proto is None or r.proto_name == proto) and (direction is None or r.dir == direction)
            and (related is None or r.related == related)]


def conn_rows(step, node: str, direction: str, when: str = "after") -> list[CtRow]:
    """The rows of the step's own connection on ``node``: matched by the client's port and the port it
    connected to (``step.attrs['sport']``/``['port']``)."""
    sport, port = step.attrs.get("sport"), step.attrs.get("port")
    return [r for r in step_rows(step, node, direction=direction, when=when) if r.sport == sport and r.dport == port]


def unhealthy(cell: str, saw: str, step=None) -> Outcome:
    """The recorded world is not the one the exercise is about: say what the cells recorded and which cell
    to run again (no try is spent). Names the faults that were on when ``step`` ran."""
    faults = list(step.attrs.get("faults", ())) if step is not None else []
    on = f" (faults on then: {', '.join(faults)})" if faults else ""
    return Outcome(False, f"your cells recorded {saw}{on}, not what this question is about: switch faults off "
                          f"(lab.fault(name, on=False)) and run the cell under '{cell}' again.", missing=cell)



def broken_step(ev, fault: str, cell: str, what: str, **attrs):
    """The step a break-it cell took with its fault on: the newest step matching ``attrs`` (the break-it cell's
    traffic comes last), as ``(step, None)``; or ``(None, outcome)`` naming the cell under ``cell`` to run,
    when no such step was taken under ``fault`` (``what`` says what the cell records) or the newest one ran
    with the fault off (no try is spent either way)."""
    step = ev.step(**attrs)
    if step is None or not ev.steps(faults=lambda f: fault in f, **attrs):
        return None, Outcome.needs(cell, what)
    if fault not in step.attrs.get("faults", ()):
        return None, Outcome(False, f"your last {step.title} ran with the fault off: run the cells under '{cell}' "
                                    "again, the one that switches the fault on first.", missing=cell)
    return step, None

# -- trace tuples, rows a step touched, answers about addresses and nodes ------------------
def touched(step, node: str) -> list[CtRow]:
    """The CT rows of ``node`` that ``step`` added or changed, as they were after it."""
    d = step.diff.get(node)
    return [] if d is None else list(d.added) + [new for _, new, _ in d.changed]


def src(t) -> tuple[str, int]:
    """(address, port) of a trace tuple's source (``flow.event.before`` / ``.after`` / ``.inner``)."""
    return ipv4(t.saddr), socket.ntohs(t.sport)


def dst(t) -> tuple[str, int]:
    """(address, port) of a trace tuple's destination."""
    return ipv4(t.daddr), socket.ntohs(t.dport)


def is_syn(t, ack: bool = False) -> bool:
    """A TCP SYN (``ack=False``) or SYN|ACK (``ack=True``) trace tuple."""
    syn, ackf = 0x02, 0x10
    return t.proto == socket.IPPROTO_TCP and t.tcp_flags & (syn | ackf) == (syn | (ackf if ack else 0))


def addr_port(text: Any, topology=None) -> str | None:
    """``'198.19.0.10:80'`` from a learner's address:port (or an (address, port) pair); a pod's name stands
    for its address when ``topology`` (``ev.topology``) is given. None when unreadable.

    >>> addr_port(("198.19.0.10", "80")), addr_port("nowhere")
    ('198.19.0.10:80', None)
    """
    if isinstance(text, (tuple, list)) and len(text) == 2:
        text = f"{text[0]}:{text[1]}"
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not port.strip().isdigit():
        return None
    host = host.strip()
    if topology is not None and host in [p.name for p in topology.pods]:
        host = topology.pod(host).ip
    return f"{host}:{int(port)}"


def ab_answer(answer: Any, keys: dict[str, tuple[str, ...]]) -> dict[str, Any] | None:
    """A dict answer with its keys mapped to canonical ones (``keys``: canonical -> other accepted spellings);
    None when it is not a dict or a key cannot be placed.

    >>> ab_answer({"Node A": ["TCP OUT"]}, {"node-a": ("a",), "node-b": ("b",)})
    {'node-a': ['TCP OUT']}
    """
    if not isinstance(answer, dict):
        return None
    out = {}
    for key, value in answer.items():
        k = str(key).strip().lower().replace("_", "-").replace(" ", "-")
        canon = next((c for c, spellings in keys.items() if k == c or k in spellings), None)
        if canon is None or canon in out:
            return None
        out[canon] = value
    return out


def flatten(answer: dict) -> list[str]:
    """``{'node-a': ['TCP OUT']}`` -> ``['node-a: TCP OUT']`` (kinds normalised), for :func:`compare_rows`."""
    return [f"{key}: {kind}" for key, kinds in answer.items() for kind in kinds_answer(kinds) or []]
