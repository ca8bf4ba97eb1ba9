"""What ``labkit observe`` shows, in a notebook: the lab's Hubble ring read through ``hubble observe``'s filters,
shown beside the two commands that print the same (``labkit observe ...`` and the ``hubble observe ...`` it
mirrors), and recorded as evidence (kind ``observe``) for lab 13's checks.

    >>> view = observe(lab, "one connection at medium", port=conn.sport)   # doctest: +SKIP
    >>> len(view.flows), view.points()                                      # doctest: +SKIP
    (16, Counter({'TO_OVERLAY': 8, 'TO_ENDPOINT': 8}))

A view copies what it read (the responses, the ring's capacity and how many entries the monitor has written,
the lab's aggregation level and faults), so it does not change when the ring moves on.
"""
from __future__ import annotations

import html
from collections import Counter
from dataclasses import dataclass, field

from labkit.observe.evidence import JOURNAL
from labkit.observe.hubble import FlowFilter, compact, last_flows
from labkit.observe.monitor import flushed_past
from labkit.observe.ring import HubbleRing

__all__ = ["ObserveView", "observe", "commands", "SHOWN"]

SHOWN = 40  #: lines a view shows before it folds the rest

#: observe() keyword -> (the flag of labkit observe and hubble observe, FlowFilter field)
_FLAGS = {"from_pod": ("--from-pod", "from_pods"), "to_pod": ("--to-pod", "to_pods"),
          "verdict": ("--verdict", "verdicts"), "protocol": ("--protocol", "protocols"), "port": ("--port", "ports")}


def commands(lab_name: str, filters: dict, last: int) -> tuple[str, str]:
    """(``labkit --lab NAME observe ...``, ``hubble observe ...``) for ``filters`` (observe()'s keywords).

    >>> commands("demo", {"port": 42000, "protocol": "tcp"}, 20)[1]
    'hubble observe --protocol tcp --port 42000 --last 20'
    """
    args = []
    for key, (flag, _) in _FLAGS.items():
        if filters.get(key) is not None:
            args += [flag, str(filters[key])]
    args += ["--last", str(last)]
    tail = " ".join(args)
    return f"labkit --lab {lab_name} observe {tail}", f"hubble observe {tail}"


@dataclass(frozen=True)
class ObserveView:
    """The responses ``labkit observe`` printed once, with what the ring and the lab were then."""

    title: str
    lab: str
    level: str  #: the lab's monitor aggregation level when read
    filters: dict
    last: int
    responses: tuple = ()  #: GetFlowsResponse dicts, oldest first
    capacity: int = 0  #: entries the Hubble ring keeps
    written: int = 0  #: entries the monitor had written into it since the lab was built
    faults: tuple = ()  #: the faults on when read
    attrs: dict = field(default_factory=dict)

    @property
    def flows(self) -> list[dict]:
        """The flows shown (lost-event entries left out)."""
        return [r["flow"] for r in self.responses if "flow" in r]

    @property
    def lost_entries(self) -> list[dict]:
        """The ``EVENTS LOST`` entries shown."""
        return [r["lost_events"] for r in self.responses if "lost_events" in r]

    @property
    def lost(self) -> int:
        """Records the shown lost-event entries say the nodes' event rings had no room for."""
        return sum(int(e["num_events_lost"]) for e in self.lost_entries)

    @property
    def overwritten(self) -> int:
        """Entries the Hubble ring has overwritten so far (written beyond its capacity)."""
        return max(0, self.written - self.capacity)

    def points(self) -> Counter:
        """How many shown flows each Hubble observation point has (``trace_observation_point``; drops and policy
        verdicts under their event type)."""
        return Counter(f.get("trace_observation_point", "DROP" if f.get("drop_reason") else "POLICY_VERDICT")
                       for f in self.flows)

    def commands(self) -> tuple[str, str]:
        return commands(self.lab, self.filters, self.last)

    def lines(self) -> list[str]:
        """The ``-o compact --print-node-name`` lines."""
        return [compact(r, node_name=True) for r in self.responses]

    def summary(self) -> str:
        lost = f", {len(self.lost_entries)} EVENTS LOST lines ({self.lost} records)" if self.lost_entries else ""
        return (f"{self.title}: {len(self.responses)} entries shown, {len(self.flows)} flows{lost}; aggregation "
                f"{self.level}; the ring keeps {self.capacity}, {self.written} written so far")

    def _shown(self) -> list[str]:
        lines = self.lines()
        if len(lines) <= SHOWN:
            return lines
        return lines[:10] + [f"... {len(lines) - SHOWN} more ..."] + lines[-(SHOWN - 10):]

    def __str__(self) -> str:
        labkit_cmd, hubble_cmd = self.commands()
        return "\n".join([f"$ {labkit_cmd}", f"  (on a Cilium node: {hubble_cmd})", *self._shown(), self.summary()])

    __repr__ = __str__

    def _repr_html_(self) -> str:
        labkit_cmd, hubble_cmd = self.commands()
        return (f"<div class='lk-observe'><pre>$ {html.escape(labkit_cmd)}\n"
                f"<span style='color:#555'># on a Cilium node: {html.escape(hubble_cmd)}</span></pre>"
                f"<pre style='font-size:11px'>{html.escape(chr(10).join(self._shown()))}</pre>"
                f"<b>{html.escape(self.summary())}</b></div>")


def observe(lab, title: str, last: int | None = None, from_pod: str | None = None, to_pod: str | None = None,
            verdict: str | None = None, protocol: str | None = None, port: int | None = None, **attrs) -> ObserveView:
    """Read ``lab``'s Hubble ring as ``labkit observe`` does (every record the kernel produced so far included),
    keep the last ``last`` matching entries (all the ring holds with None), and record the view as evidence
    under ``title``; ``attrs`` are kept with it for the checks."""
    filters = {k: v for k, v in dict(from_pod=from_pod, to_pod=to_pod, verdict=verdict, protocol=protocol,
                                     port=port).items() if v is not None}
    flt = FlowFilter(**{_FLAGS[k][1]: [v] for k, v in filters.items()})
    flushed_past(lab.name, lab.pin_dirs)
    from labkit.net.ledger import lab_dir

    ring = HubbleRing.open(lab_dir(lab.name) / "hubble.ring")
    try:
        capacity, written = ring.capacity, ring.refresh()
    finally:
        ring.close()
    shown = last if last is not None else capacity
    resps = tuple(last_flows(lab, flt, last=shown))
    view = ObserveView(title, lab.name, lab.monitor_aggregation(), filters, shown, resps, capacity, written,
                       tuple(lab.faults()), dict(attrs))
    JOURNAL.record(lab.name, "observe", title, view, level=view.level, faults=view.faults, **attrs)
    return view
