"""Steps as a notebook shows them: one call that sent traffic, and what it did.

    >>> step = lab.pod("a1").ping("b1")          # doctest: +SKIP
    >>> step.flows, step.diff["node-a"], step.rows["node-b"]   # doctest: +SKIP

A :class:`Step` is made on the privileged side (:mod:`labkit.lab.traffic`: labkitd snapshots every node's CT
maps, acts, waits for the trace and snapshots again) and reaches the notebook as data; here it renders as the
packet path on the topology (SVG written by labkit), the one numbered list of its hops (repeats grouped ×N),
its raw records folded, a TCP step's ladder diagram, and the CT rows it added, changed or removed in the row
grammar. ``step.save("path.svg")`` keeps the picture; ``conn.ladder()`` draws all the steps of a connection.
"""
from __future__ import annotations

import html
import socket
from dataclasses import dataclass, field
from typing import Any, Callable

from labkit.errors import ConfigError
from labkit.maps.ct import CtDiff, CtRow, diff_rows
from labkit.notebook import ladder, stepview, viz
from labkit.observe.trace import Flow

__all__ = ["Step", "LadderView"]

_TCP = socket.IPPROTO_TCP


@dataclass
class Step:
    """What one traffic step did: flows, CT and NAT rows before and after, their diff, the lines the pods'
    servers logged meanwhile, and what it was (``attrs``: kind, actor, target, port, the faults that were
    on). Each step is also recorded as evidence (:mod:`labkit.observe.evidence`) for the checks."""

    title: str
    lab: Any = field(repr=False)  #: the lab it ran in (the notebook's client of it, or the datapath side's)
    flows: list[Flow]
    before: dict[str, list[CtRow]] = field(repr=False)
    after: dict[str, list[CtRow]] = field(repr=False)
    result: dict = field(default_factory=dict)
    now: int = 0
    seconds: float = 0.0
    attrs: dict = field(default_factory=dict)
    nat_before: dict[str, list] = field(default_factory=dict, repr=False)
    nat_after: dict[str, list] = field(default_factory=dict, repr=False)
    server_log: dict[str, list[str]] = field(default_factory=dict, repr=False)  #: pod -> lines logged meanwhile
    diff: dict[str, CtDiff] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.diff = {node: diff_rows(self.before[node], self.after[node]) for node in self.after}

    @property
    def rows(self) -> dict[str, list[CtRow]]:
        """Every node's CT rows after the step."""
        return self.after

    @property
    def ok(self) -> bool:
        """Whether the client saw the outcome it asked for (connected, answered, ...)."""
        return bool(self.result.get("ok", True))

    def lines(self) -> list[str]:
        """One Hubble-like line per packet per hook, in time order."""
        return [f.line() for f in self.flows]

    def diff_lines(self) -> list[str]:
        """``node: + row`` / ``- row`` / ``~ row: field old→new`` for every node that changed."""
        return [f"{node}: {line}" for node, d in self.diff.items() for line in d.lines()]

    def picture(self):
        """The packet path drawn on the topology (matplotlib Figure)."""
        return viz.draw(self.lab.topology, self.lab.config.routing, self.flows, title=self.title)

    def ladder(self, title: str | None = None) -> "LadderView":
        """This step's packets as a ladder (sequence) diagram (:mod:`labkit.notebook.ladder`)."""
        return LadderView([self], self.lab.topology, title or self.title)

    def svg(self) -> str:
        """The path picture as SVG text (:mod:`labkit.notebook.svgpath`, no matplotlib)."""
        return viz.svg(self.lab.topology, self.lab.config.routing, self.flows, title=self.title)

    def save(self, path: str) -> str:
        """Write the path picture to ``path`` for slides and handouts; returns the path.

        ``.svg`` is written by labkit (no matplotlib). ``.png`` is drawn by matplotlib
        (:func:`labkit.notebook.viz.draw`, imported only then): labkit has no SVG rasteriser of its own,
        and that picture is the older one (every hop its own badge, no ×N groups, no loops).

        >>> step.save("path.svg")   # doctest: +SKIP
        'path.svg'
        """
        return _save(str(path), self.svg, lambda: self.picture())

    def explorer(self):
        """An interactive hop-by-hop view (ipywidgets)."""
        return viz.PathExplorer(self.lab.topology, self.lab.config.routing, self.flows)

    def __str__(self) -> str:
        out = [f"step: {self.title} ({'ok' if self.ok else self.result.get('error', 'failed')})"]
        out += ["  " + line for line in self.lines()]
        out += ["  " + line for line in self.diff_lines()] or ["  (no CT rows changed)"]
        return "\n".join(out)

    def _repr_html_(self) -> str:
        """The step as one display: the path picture, its numbered hop list (repeats grouped ×N, with
        trace tags, CT verdicts and drop reasons), the raw records folded, for TCP the step's ladder
        diagram, then the CT diff in the row grammar."""
        status = "ok" if self.ok else html.escape(str(self.result.get("error", "failed")))
        parts = [f"<div class='lk-step'><h4>{html.escape(self.title)} — {status}</h4>"]
        parts.append(viz.path_html(self.lab.topology, self.lab.config.routing, self.flows, title=self.title))
        parts.append(stepview.records_html(self.lines()))
        if any(f.event.before.proto == _TCP or f.event.inner.proto == _TCP for f in self.flows):
            parts.append("<div class='lk-ladder'>" + ladder.svg([self], self.lab.topology, self.title) + "</div>")
        parts.append(stepview.diff_html(self.diff, self.lab.clock.now()))
        cmds = [c for n in self.lab.topology.nodes for c in self.lab.ct_command(n.name)]
        parts.append("<details><summary>the same rows with real tools</summary><pre>" +
                     html.escape("\n".join(cmds)) + "</pre></details></div>")
        return "".join(parts)


def _save(path: str, svg_text: Callable[[], str], figure: Callable[[], Any]) -> str:
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if suffix == "svg":
        with open(path, "w", encoding="utf-8") as f:
            f.write('<?xml version="1.0" encoding="UTF-8"?>\n' + svg_text())
    elif suffix == "png":
        figure().savefig(path, format="png", dpi=150)
    else:
        raise ConfigError(f"save {path!r}: expected a file name ending in .svg or .png, got {suffix or 'no suffix'!r}")
    return path


class LadderView:
    """A ladder diagram of a connection's steps: shows as SVG in a notebook, ``.svg`` text, ``save()``.

    >>> view = conn.ladder()          # doctest: +SKIP
    >>> view.save("ladder.svg")       # doctest: +SKIP
    """

    def __init__(self, steps: list, topology, title: str | None = None):
        self.steps = list(steps)
        self.topology = topology
        self.title = title

    @property
    def svg(self) -> str:
        """The diagram as SVG text (deterministic)."""
        return ladder.svg(self.steps, self.topology, self.title)

    def _repr_svg_(self) -> str:
        return self.svg

    def save(self, path: str) -> str:
        """Write the diagram to ``path`` (``.svg`` only: the ladder has no matplotlib drawing)."""
        if not str(path).lower().endswith(".svg"):
            raise ConfigError(f"save {path!r}: a ladder is saved as .svg, got {path!r}")
        return _save(str(path), lambda: self.svg, lambda: None)


