"""Lab 13, observing the datapath: how many flows Hubble keeps of one connection at each monitor aggregation
level, which observation points the lowest levels leave out, a flood that overflows the nodes' event rings and
the Hubble ring (lost events, history gone), the same flood at medium, and a break-it fault in the monitor.

Graders read the views of the Hubble ring the notebook's cells recorded (:mod:`labkit.notebook.hubbleview`,
evidence kind ``observe``) and the steps of the connections they show. The rules the answers follow are
Cilium v1.16's:

- bpf/lib/trace.h ``emit_trace_notify``: from TRACE_AGGREGATE_RX (``--monitor-aggregation`` lowest, low) on,
  no trace notification of a from-* observation point (FROM_LXC, FROM_OVERLAY, FROM_NETWORK...) is sent; from
  TRACE_AGGREGATE_ACTIVE_CT (medium, maximum) on, only those whose CT lookup returned a non-zero ``monitor``;
- bpf/lib/conntrack.h ``__ct_lookup`` / ``__ct_update_timeout``: ``monitor`` is non-zero for a new entry, when
  the direction's seen TCP flags change, on FIN/RST, and once per CT_REPORT_INTERVAL (5 s);
- bpf/lib/drop.h ``send_drop_notify``: drops are never aggregated;
- pkg/hubble/container/ring.go: Hubble keeps a fixed ring (``--hubble-event-buffer-capacity``, 4,095 by
  default) and overwrites the oldest entry; records the perf ring had no room for arrive as lost events
  (``LostEventSource PERF_EVENT_RING_BUFFER``, ``EVENTS LOST:`` in ``hubble observe`` from 1.17 on: v1.16's
  CLI prints none, hubble/pkg/printer/printer.go:797-811, so the flood variant runs the 1.20 profile).

(tests/datapath/test_observe.py counts the same rules on one connection of 100 segments.)
"""
from __future__ import annotations

from typing import Any

from labkit.grading.checks import Outcome, exercise
from labkit.grading.exercises.common import unhealthy
from labkit.observe.trace import Report

LEVELS, LOW, FLOOD, MEDIUM_FLOOD, BREAK = (
    "1. One connection, two levels", "2. What lowest and low leave out", "3. A flood",
    "4. The same flood at medium", "5. Break it")
_FAULT = "hubble-no-aggregation"  #: the monitor's fault: every record into the Hubble ring
_LOST_FAULT = "monitor-no-lost"  #: the monitor's fault: lost records never reported
AT_NONE, AT_MEDIUM, AT_LOW = "connection at none", "connection at medium", "connection at low"
OLD_BEFORE, AFTER_FLOOD, OLD_AFTER = "old connection before the flood", "after the flood", "old connection after the flood"
OLD2_BEFORE, OLD2_AFTER = "old connection at medium", "old connection after the flood at medium"
BROKEN = "connection with the fault on"


def _view(ev, title: str, variant: str | None = None):
    """The newest recorded view titled ``title`` (of the variant lab ``variant``), or None."""
    src = ev.variant(variant) if variant else ev
    rec = src.latest("observe", title=title)
    return rec.data if rec else None


def _faulty(*views) -> list[str]:
    """The monitor faults that were on when any of ``views`` was read."""
    return sorted({f for v in views if v is not None for f in v.faults if f in (_FAULT, _LOST_FAULT)})


def _sick(cell: str, saw: str, *views) -> Outcome:
    """:func:`unhealthy` for views (they carry the faults that were on)."""
    faults = _faulty(*views)
    on = f" (faults on then: {', '.join(faults)})" if faults else ""
    return unhealthy(cell, saw + on)


def _int(answer: Any) -> int | None:
    if isinstance(answer, bool) or not isinstance(answer, int):
        return None
    return answer


def _point(text: Any) -> str:
    """An observation point as the learner wrote it: ``'from-overlay'``, ``'FROM_OVERLAY'`` -> ``'FROM_OVERLAY'``."""
    return str(text).strip().upper().replace("-", "_").replace(" ", "_")


def _reported(ev, port: int) -> tuple[list, list]:
    """(every trace record, the records marked reported) of the steps of the connection with client port
    ``port``."""
    flows = [f for s in ev.steps(sport=port) for f in s.flows]
    return flows, [f for f in flows if f.event.report & Report.REPORTED]


def _syn_flows(view) -> int:
    return sum(1 for f in view.flows if f.get("l4", {}).get("TCP", {}).get("flags", {}).get("SYN"))


# -- 13.1 ---------------------------------------------------------------------------------
@exercise(
    "13.1",
    "What Hubble keeps of one connection at medium",
    hints=(
        "Read the second view of section 1: each line it prints is one flow Hubble kept of the connection.",
        "At medium a hook reports a packet only when its CT lookup asks for it: a new entry, a TCP flag that "
        "direction had not seen, a FIN or RST. Count the lines with a flag new to their direction and hook.",
        "The answer is len(kept.flows): 16 for a connection across nodes (handshake 6, first data and first echo 4, "
        "close 6): the other segments change no flag.",
    ),
    fault=_FAULT,
    cells=(LEVELS,),
)
def medium_count(answer, ev) -> Outcome:
    """The number of flows the medium view of section 1 printed, graded when the view is what the datapath
    reported (the connection's records marked reported) and fewer than the none view's."""
    every, kept = _view(ev, AT_NONE), _view(ev, AT_MEDIUM)
    if every is None or kept is None:
        return Outcome.needs(LEVELS, "it runs one connection at none and one at medium, and shows each")
    records, reported = _reported(ev, kept.filters.get("port"))
    if kept.level != "medium" or every.level != "none" or not kept.flows or _faulty(every, kept) \
            or len(kept.flows) >= len(every.flows) or len(reported) != len(kept.flows):
        return _sick(LEVELS, f"a view at {kept.level} with {len(kept.flows)} flows of {len(records)} trace records "
                             f"({len(reported)} reported), and one at {every.level} with {len(every.flows)}",
                     every, kept)
    live = len(kept.flows)
    got = _int(answer)
    if got is None:
        return Outcome(False, f"expected a number of flows, got {answer!r}.")
    diff = (("=" if got == live else "-", str(live), str(got)),)
    if got == live:
        return Outcome(True, f"{live} flows of {len(records)} trace records: at medium a hook reports a packet only "
                             "when its CT lookup returns a non-zero monitor (a new entry, a TCP flag new to that "
                             "direction, a FIN, or 5 s since the last report), and the tunnel hooks, which look no "
                             "CT entry up, never do. Every other segment of the connection is aggregated away.", diff)
    if got == len(every.flows):
        msg = "that is what Hubble kept at none, every record of the pods' hooks and of from-overlay; at medium " \
              "most packets of an open connection are not reported."
    elif got == _syn_flows(kept):
        msg = "more than the handshake's SYN and SYN-ACK asks for a report: a flag new to a direction (the first " \
              "ACK, the first PSH) and the close do too."
    elif got == len(records):
        msg = "that counts every trace record of the connection, as `labkit trace` shows them, not what Hubble kept."
    else:
        msg = f"{got} is not the number of flows the view at medium printed."
    return Outcome(False, msg, diff, reveal=str(live))


# -- 13.2 ---------------------------------------------------------------------------------
@exercise(
    "13.2",
    "What lowest and low leave out",
    hints=(
        "Compare the trace_observation_point of the flows in the view at none with those in the view at low "
        "(view.points() counts them).",
        "lowest and low drop whole observation points, whatever the packet: which point has flows at none and "
        "none at low? (Its name says where the packet came from.)",
        "The answer is ['FROM_OVERLAY']: from TRACE_AGGREGATE_RX on, trace.h sends no from-* notification.",
    ),
    fault=_FAULT,
    cells=(LEVELS, LOW),
)
def low_points(answer, ev) -> Outcome:
    """The observation points the none view of section 1 shows and the low view of section 2 does not."""
    every, low = _view(ev, AT_NONE), _view(ev, AT_LOW)
    if every is None:
        return Outcome.needs(LEVELS, "it shows one connection at none")
    if low is None:
        return Outcome.needs(LOW, "it shows one connection at low")
    gone = sorted(set(every.points()) - set(low.points()))
    if low.level != "low" or every.level != "none" or _faulty(every, low) or not gone or not low.flows:
        return _sick(LOW, f"a view at {low.level} with {len(low.flows)} flows of points {sorted(low.points())} and one "
                          f"at {every.level} with {len(every.flows)}", every, low)
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set)) or not all(isinstance(a, str) for a in items):
        return Outcome(False, f"expected a list of observation points such as ['TO_STACK'], got {answer!r}.")
    got = sorted({_point(a) for a in items})
    diff = tuple([("=", p, p) for p in gone if p in got] + [("-", p, "(missing)") for p in gone if p not in got]
                 + [("+", "(not expected)", p) for p in got if p not in gone])
    if got == gone:
        return Outcome(True, f"{', '.join(gone)}: from TRACE_AGGREGATE_RX (lowest, low) on, Cilium's "
                             "emit_trace_notify sends no trace of a from-* observation point, the packet arriving; "
                             "where it goes next (to-overlay, to-endpoint) is still reported, for every packet.", diff)
    kept = [p for p in got if p in low.points()]
    if kept:
        msg = f"{', '.join(kept)} flows are still in the view at low: compare the two views point by point."
    elif not got:
        msg = f"the view at low has {len(low.flows)} flows, the one at none {len(every.flows)}: some point is gone."
    else:
        msg = f"{', '.join(p for p in got if p not in gone)} is no point of the view at none."
    return Outcome(False, msg, diff, reveal=str(gone))


# -- 13.3 ---------------------------------------------------------------------------------
@exercise(
    "13.3",
    "A flood: lost events and lost history",
    hints=(
        "Read the view of the whole ring after the flood (its summary line counts what it printed), and the last "
        "view of the old connection's port.",
        "Hubble's ring stores a fixed number of entries, EVENTS LOST lines included, and overwrites the oldest. "
        "The old connection's flows are the oldest the ring ever held.",
        "The answer is (4095, 0): the ring's capacity, and nothing of the old connection.",
    ),
    fault=_LOST_FAULT,
    cells=(FLOOD,),
)
def flood(answer, ev) -> Outcome:
    """(entries the view of the whole ring printed after the flood, flows of the old connection still shown),
    graded when the flood overflowed both rings: the nodes' event rings (EVENTS LOST lines) and the Hubble ring."""
    before, after, old = (_view(ev, t, "flood") for t in (OLD_BEFORE, AFTER_FLOOD, OLD_AFTER))
    if before is None or after is None or old is None:
        return Outcome.needs(FLOOD, "it opens the old connection, floods, and shows the ring before and after")
    if after.level != "none" or _faulty(before, after, old) or not before.flows or not after.overwritten \
            or not after.lost_entries:
        return _sick(FLOOD, f"{len(after.lost_entries)} EVENTS LOST lines after a flood at {after.level}, the ring "
                            f"having overwritten {after.overwritten} entries", before, after, old)
    live = (len(after.responses), len(old.flows))
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or None in (_int(answer[0]), _int(answer[1])):
        return Outcome(False, f"expected a pair of numbers (entries, flows of the old connection), got {answer!r}.")
    got = (answer[0], answer[1])
    diff = tuple(("=" if g == want else "-", str(want), str(g)) for want, g in zip(live, got))
    if got == live:
        return Outcome(True, f"{live[0]} entries, the ring's capacity, {len(after.lost_entries)} of them EVENTS LOST "
                             f"lines for {after.lost} records the nodes' event rings had no room for (the monitor fell "
                             f"behind). The ring overwrote {after.overwritten} entries, the old connection's "
                             f"{len(before.flows)} flows among them: --last cannot show what the ring no longer holds.",
                       diff)
    problems = []
    if got[0] != live[0]:
        if got[0] > after.capacity:
            problems.append("no view prints more entries than the ring holds, however many records the flood made")
        elif got[0] == len(after.flows):
            problems.append("EVENTS LOST lines are entries of the ring too")
        else:
            problems.append(f"{got[0]} is not the number of entries the view of the whole ring printed")
    if got[1] != live[1]:
        if got[1] == len(before.flows):
            problems.append("the old connection's flows were overwritten: the Hubble ring stores nothing else")
        else:
            problems.append(f"{got[1]} is not what the last view of the old connection printed")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=str(live))


# -- 13.4 ---------------------------------------------------------------------------------
@exercise(
    "13.4",
    "The same flood at medium",
    hints=(
        "Read the two views of the second old connection in section 4, before and after the flood.",
        "At medium, how many flows does a flood of one UDP flow leave in the ring? (Which of its packets asks "
        "for a report?)",
        "The answer is len(old2_after.flows), all of the old connection's flows: only the flood's first datagram "
        "was reported at each hook, so the ring did not turn over.",
    ),
    fault=_FAULT,
    cells=(MEDIUM_FLOOD,),
)
def medium_flood(answer, ev) -> Outcome:
    """Flows of the old connection the view after the medium flood still shows."""
    before, after = _view(ev, OLD2_BEFORE, "flood"), _view(ev, OLD2_AFTER, "flood")
    if before is None or after is None:
        return Outcome.needs(MEDIUM_FLOOD, "it opens a connection at medium, floods, and shows it again")
    if before.level != "medium" or after.level != "medium" or _faulty(before, after) or not before.flows:
        return _sick(MEDIUM_FLOOD, f"a flood at {after.level} with {len(before.flows)} flows of the old connection "
                                   "before it", before, after)
    live = len(after.flows)
    got = _int(answer)
    if got is None:
        return Outcome(False, f"expected a number of flows, got {answer!r}.")
    diff = (("=" if got == live else "-", str(live), str(got)),)
    if got == live:
        return Outcome(True, f"{live} of {len(before.flows)}: at medium the flood's datagrams after the first asked "
                             "for no report (same flow, no TCP flags, well inside the 5 s interval), so the ring "
                             "took a handful of entries and the old connection is still there. Aggregation is what "
                             "makes Hubble's few thousand entries last minutes on a node.", diff)
    flood_view = _view(ev, OLD_BEFORE, "flood")
    if got == 0:
        msg = "at medium the flood's datagrams are one flow: most of them asked for no report, and the ring did " \
              "not turn over."
    elif flood_view is not None and got == len(flood_view.flows):
        msg = "that is section 3's connection at none; at medium the old connection made fewer flows to begin with."
    else:
        msg = f"{got} is not what the view after the flood at medium printed."
    return Outcome(False, msg, diff, reveal=str(live))


# -- 13.5 (break it) ----------------------------------------------------------------------
_LEVEL_WORDS = {"none": "none", "disabled": "none", "0": "none", "lowest": "low", "low": "low", "1": "low",
                "2": "low", "medium": "medium", "maximum": "medium", "max": "medium", "3": "medium", "4": "medium"}


@exercise(
    "13.5",
    "Break it: the level that is not",
    hints=(
        "Compare the view of the broken connection with section 1's views: how many flows, which points?",
        "lab.monitor_aggregation() still says medium and the datapath still marks records as at medium (the "
        "step's lines); which level's view does this one look like?",
        "The answer is 'none': the monitor put every record into the Hubble ring, reported or not.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def broken_level(answer, ev) -> Outcome:
    """With hubble-no-aggregation on: the level whose view the broken connection's view looks like."""
    view = _view(ev, BROKEN)
    faulted = [r for r in ev.records("observe", title=BROKEN) if _FAULT in r.data.faults]
    if view is None or not faulted:
        return Outcome.needs(BREAK, "it switches the fault on, then runs and shows one connection")
    if _FAULT not in view.faults:
        return Outcome(False, f"your last view of the broken connection was read with the fault off: run the cells "
                              f"under '{BREAK}' again, the one that switches the fault on first.", missing=BREAK)
    records, reported = _reported(ev, view.filters.get("port"))
    if view.level != "medium" or not reported or len(view.flows) <= len(reported):
        return _sick(BREAK, f"a view at {view.level} with {len(view.flows)} flows, {len(reported)} records marked "
                            "reported", view)
    points = view.points()
    live = "none" if "FROM_OVERLAY" in points else "low"
    got = _LEVEL_WORDS.get(str(answer).strip().lower())
    diff = (("=" if got == live else "-", live, str(answer)),)
    if got == live:
        return Outcome(True, f"{len(view.flows)} flows, FROM_OVERLAY among them: the view of a lab at {live}. The "
                             f"datapath still marked {len(reported)} records reported (the level is medium), but the "
                             "monitor put every record into the ring. Count a view against what the level promises "
                             "before trusting it.", diff)
    if got == "medium":
        msg = "lab.monitor_aggregation() says medium, but count the view's flows against section 1's view at medium."
    elif got == "low":
        msg = "the view has FROM_OVERLAY flows, which low leaves out."
    else:
        msg = f"{answer!r} is not a monitor aggregation level (none, lowest, low, medium, maximum)."
    return Outcome(False, msg, diff, reveal=repr(live))
