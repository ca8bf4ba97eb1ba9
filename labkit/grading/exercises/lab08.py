"""Lab 08, conntrack over time: which rows a GC run leaves, the interval it picks next, what an LRU map under
pressure forgets, and a break-it fault that lets the GC delete an established connection.

Graders read what the notebook's cells recorded: section 1's GC run and the snapshot taken right after it;
the first GC run of the small lab (``ev.variant("small")``, section 3); the snapshot the flood cell took in
the small lab (section 5); and the steps of ``idle`` taken with the fault on, with the GC run that followed
them (section 6). Each compares the answer with that evidence and with the rule the exercise teaches;
evidence that breaks the rule (a GC that deleted nothing, kept its interval, a map that evicted nothing)
sends the learner back to the cell, at no cost.
"""
from __future__ import annotations

import math

from typing import Any

from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.agent.gc import MIN_INTERVAL
from labkit.maps.ct import CT_MAPS, CtRow
from labkit.grading.exercises.common import conn_rows, kinds_answer, row_kind, unhealthy

ONE_RUN, INTERVAL, FULL, BREAK = ("1. Rows with three lifetimes, and one GC run", "3. The interval, on a small map",
                                  "5. A full table", "6. Break it")
FLOOD = 400  #: connections the flood cell makes from a2 to b2 in the small lab


def _number(answer: Any) -> bool:
    return isinstance(answer, (int, float)) and not isinstance(answer, bool)


def _before(ev, rec, kind: str):
    """The newest ``kind`` record made before ``rec`` (None if there is none)."""
    found = [r for r in ev.records(kind) if r.seq < rec.seq]
    return found[-1] if found else None


def _tcp_deleted(run) -> int:
    """TCP rows (``cilium_ct4_global``, every node) a GC run deleted."""
    return sum(m.deleted for m in run.maps if m.map == CT_MAPS[0])


def _seen_non_syn(row: CtRow) -> bool:
    return "SeenNonSyn" in row.flag_names


# -- 08.1 ---------------------------------------------------------------------------------
@exercise(
    "08.1",
    "Which rows survive a GC",
    hints=(
        "A row survives when its lifetime is still ahead of the clock: the GC never looks at flags or at whether "
        "a connection is open.",
        "The clock moved 61 s: compare that with what show(lab) printed before, 'expires in … s' for each row "
        "(10 s for a closed connection, 60 s for ICMP and every RELATED twin, 8,000 s for an open connection).",
        "The answer is ['TCP OUT']: only the open connection's own row on node-a is left.",
    ),
    fault="gc-noop",
    cells=(ONE_RUN,),
)
def survivors(answer, ev) -> Outcome:
    """Kinds of node-a's rows in the snapshot taken right after section 1's GC run."""
    rec = ev.latest("snapshot", title="after the GC run")
    gc = _before(ev, rec, "gc") if rec is not None else None
    if rec is None or gc is None:
        return Outcome.needs(ONE_RUN, "it moves the clock, runs the GC and records node-a's rows")
    snap, run = rec.data, gc.data
    rows = snap.rows("node-a")
    stale = [r for r in rows if r.expired(run.now)]
    if run.deleted == 0 or stale:
        return unhealthy(ONE_RUN, f"a GC run that deleted {run.deleted} row(s) and left {len(stale)} row(s) on "
                                  "node-a whose lifetime was already behind its clock")
    left = sorted({row_kind(r) for r in rows})
    if not any(r.proto_name == "TCP" and r.dir == "OUT" and not r.related and _seen_non_syn(r) for r in rows):
        return unhealthy(ONE_RUN, f"no open TCP connection left on node-a after the run (rows left: "
                                  f"{left or 'none'})")
    got = kinds_answer(answer)
    if got is None:
        return Outcome(False, f"expected a list of row kinds such as ['UDP IN', 'ICMP IN related'], got {answer!r}.")
    out = compare_rows(left, got, "rows left on node-a after the run")
    if out.passed:
        return Outcome(True, f"{left}: only the open connection's OUT row, whose lifetime runs 8,000 s from its "
                             f"last packet. The run at lab clock {run.now} deleted {run.deleted} rows: the closed "
                             "connection's (10 s), the ping's and every RELATED twin (60 s). The GC never looks at "
                             "flags, only at lifetimes.", out.diff)
    extra = set(got) - set(left)
    if not got:
        msg = "the GC deletes only rows whose lifetime is behind the clock, and keep's last packet pushed its " \
              "row's lifetime far ahead of 61 s."
    elif any("related" in g for g in extra):
        msg = "a RELATED twin does not live as long as its connection: it kept the lifetime its flow's first " \
              "packet gave it, and no later packet refreshed it."
    elif extra & {"ICMP OUT", "ICMP IN"}:
        msg = "a ping's row lives ICMP's 60 s after its last packet, and the clock moved more than that."
    elif extra & {"TCP IN"}:
        msg = "node-a holds the client side of its pods' connections: an IN row would be on the server's node."
    else:
        msg = out.message + " Which lifetimes were still ahead of the clock when the GC ran?"
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 08.2 ---------------------------------------------------------------------------------
@exercise(
    "08.2",
    "The next interval",
    hints=(
        "The rule reads the largest ratio deleted / max_entries over the maps, and compares it with 5% and 25%.",
        "Above 25% the interval is multiplied by (1 - ratio), rounded to whole seconds (never below 10 s); the run "
        "printed its ratio and the interval it was scheduled with.",
        "The answer is round(run.interval × (1 − run.ratio)): 188 s when the run deleted 6 of 16 rows.",
    ),
    fault="gc-fixed-interval",
    cells=(INTERVAL,),
)
def interval_after(answer, ev) -> Outcome:
    """The small lab's interval after its first GC run (section 3), as the run recorded it and by the rule."""
    runs = ev.variant("small").records("gc")
    if not runs:
        return Outcome.needs(INTERVAL, "it starts the small lab, churns and runs its GC once")
    run = runs[0].data  # the first run since start(variant="small"): the one section 3 prints
    rule = run.rule()  # GetInterval as the run read it (early-run scaling, cap), Go's rounding
    if run.ratio <= 0.25:
        return unhealthy(INTERVAL, f"a first run that deleted {run.ratio:.1%} of its fullest map, not more than a "
                                   "quarter (6 short connections in 16-entry maps)")
    if run.next_interval != rule:
        return unhealthy(INTERVAL, f"a GC that went from {run.interval} s to {run.next_interval} s after deleting "
                                   f"{run.ratio:.1%} of a map, against Cilium's rule")
    if not _number(answer):
        return Outcome(False, f"expected a number of seconds, got {answer!r}.")
    whole = math.floor(answer + 0.5)  # Go's Duration.Round: a half goes up (1012.5 s is 1013 s)
    diff = (("=" if whole == rule else "-", f"{rule} s", f"{answer} s"),)
    if whole == rule:
        return Outcome(True, f"{rule} s: the run deleted {run.ratio:.1%} of the fullest map, more than a quarter, so "
                             f"the GC comes back sooner: {run.interval} s × (1 − {run.ratio:.3f}). A node with many "
                             "short connections converges on a short interval; an idle one grows it by half each "
                             "run, up to 12 hours.", diff)
    first = run.interval
    if round(answer) == round(first * 1.5):
        msg = "×1.5 is what a run gets that deletes under 5% of a map, as section 1's did; this run deleted more " \
              "than a quarter of one."
    elif round(answer) == first:
        msg = "the interval is not fixed: a run that deletes more than a quarter of a map brings the next one " \
              "closer."
    elif round(answer) in (round(first * run.ratio), int(first * run.ratio)):
        msg = "the interval keeps the part of itself that was not deleted: it is scaled by one minus the ratio, " \
              "not by the ratio."
    elif round(answer) == MIN_INTERVAL:
        msg = "10 s is only the floor the rule never goes under; this ratio does not take the interval that low."
    else:
        msg = f"{answer!r} s is not what the rule gives for ratio {run.ratio:.3f} after {first} s."
    return Outcome(False, msg, diff, reveal=f"{rule} s = round({first} × (1 − {run.ratio:.3f}))")


# -- 08.3 ---------------------------------------------------------------------------------
@exercise(
    "08.3",
    "A full table forgets",
    hints=(
        "Every one of the flood's connections made an OUT row on node-a, and no GC ran since: whatever is "
        "missing, the map itself threw out.",
        "Count a2's TCP OUT rows in the snapshot the flood cell took (flood.rows('node-a')); the rest are gone.",
        "The answer is 400 - len(a2_rows): the LRU map evicted them to make room.",
    ),
    fault="no-out-entry",
    cells=(FULL,),
)
def evicted(answer, ev) -> Outcome:
    """How many of the flood's OUT rows node-a's 16-entry TCP map of the small lab no longer held, from the
    snapshot the flood cell took."""
    small = ev.variant("small")
    rec = small.latest("snapshot", title="after the flood")
    if rec is None:
        return Outcome.needs(FULL, "it floods node-a's small map and records its rows")
    snap = rec.data
    opened = [r.seq for r in small.records("step", op="tcp-open", actor="a1", target="b1") if r.seq < rec.seq]
    collected = [g for g in small.records("gc") if (opened[-1] if opened else 0) < g.seq < rec.seq]
    size = small.config.ct_tcp_size if small.config is not None else 16
    a2 = (small.topology or ev.topology).pod("a2").ip
    rows = [r for r in snap.rows("node-a") if r.proto_name == "TCP" and r.dir == "OUT" and not r.related
            and r.src == a2]
    tcp = [r for r in snap.rows("node-a") if r.proto_name == "TCP" and not r.related]
    if not rows or len(rows) >= FLOOD or len(tcp) > size or collected:
        during = f" and {len(collected)} GC run(s) during the flood" if collected else ""
        return unhealthy(FULL, f"{len(rows)} OUT row(s) of a2's {FLOOD} connections in node-a's {size}-entry "
                               f"map{during}")
    gone = FLOOD - len(rows)
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome(False, f"expected a whole number of rows, got {answer!r}.")
    diff = (("=" if answer == gone else "-", str(gone), str(answer)),)
    if answer == gone:
        return Outcome(True, f"{gone} of {FLOOD}: the map holds {size} entries, so new connections past that made "
                             "the kernel evict others. Nothing had to expire and no GC ran: an LRU map forgets under "
                             "pressure, whatever the lifetimes say. Which entry goes is the kernel's guess at the one "
                             "used longest ago, made per CPU" + (f", which is why only {len(rows)} of the {size} "
                                                                 "slots held a2's rows." if len(rows) < size else "."),
                       diff)
    if answer == 0:
        msg = f"nothing had to expire: node-a's map holds {size} entries, and a full LRU map makes room for a new " \
              "row by throwing an old one out, without a GC."
    elif answer == FLOOD:
        msg = "some of a2's rows are still in node-a's map: eviction makes room for each new row, it does not " \
              "empty the map."
    elif answer == FLOOD - size:
        msg = f"not every one of the map's {size} slots held one of a2's rows after the flood: count a2's rows left " \
              "instead of assuming."
    elif answer < 0 or answer > FLOOD:
        msg = f"the flood made {FLOOD} rows: the answer is between 0 and {FLOOD}."
    else:
        msg = f"{answer!r} is not how many of the flood's {FLOOD} rows are gone: count a2's OUT rows left on node-a."
    return Outcome(False, msg, diff, reveal=f"{gone} ({FLOOD} − {len(rows)} of a2's rows left)")


# -- 08.4 (break it) ----------------------------------------------------------------------
@exercise(
    "08.4",
    "Break it: the GC takes a live connection",
    hints=(
        "Which lifetime did idle's rows carry with the fault on? Compare it with the 61 s the clock moved.",
        "The GC run's report lists what it deleted per map and node: cilium_ct4_global holds the TCP rows.",
        "The answer is 2: idle's OUT row on node-a and its IN row on node-b.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def gc_takes_live(answer, ev) -> Outcome:
    """With wrong-lifetime on: idle's TCP rows (as its last step left them) that the GC run after it deleted."""
    recs = ev.records("step", actor="a1", target="b1", ok=True, faults=lambda f: "wrong-lifetime" in f)
    if not recs:
        return Outcome.needs(BREAK, "it opens idle with the fault on, lets it sit and runs the GC")
    step_rec = recs[-1]
    gcs = ev.after(step_rec, "gc")
    if not gcs:
        return Outcome.needs(BREAK, "it runs the GC after idle's minute of quiet")
    step, run = step_rec.data, gcs[0].data
    idle = conn_rows(step, "node-a", "OUT") + conn_rows(step, "node-b", "IN")
    taken = [r for r in idle if r.expired(run.now) and not _seen_non_syn(r)]
    if not idle or len(taken) != len(idle) or _tcp_deleted(run) < len(taken):
        return unhealthy(BREAK, f"idle's {len(idle)} TCP row(s) with [ "
                                f"{' '.join(sorted({n for r in idle for n in r.flag_names}))} ] and a GC run that "
                                f"deleted {_tcp_deleted(run)} TCP row(s)", step)
    n = len(taken)
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome(False, f"expected a whole number of rows, got {answer!r}.")
    diff = (("=" if answer == n else "-", str(n), str(answer)),)
    if answer == n:
        return Outcome(True, f"{n}: with SeenNonSyn never set, idle's rows kept the {ev.config.timeouts.syn} s SYN "
                             "lifetime; a minute of quiet later the GC deleted them as it deletes any expired row. "
                             "The connection itself is still open in both pods: its next packet finds no row at "
                             "all.", diff)
    if answer == 0:
        msg = "the GC does not know a connection is open: it compares each row's lifetime with the clock, and " \
              "idle's rows had fallen behind it."
    elif answer == 1:
        msg = "idle had a row at each end, one on the client's node and one on the server's, and the fault gave " \
              "both the same short lifetime."
    elif answer > n:
        msg = "the RELATED twins are ICMP rows in the other map (cilium_ct_any4_global): the question counts " \
              "idle's TCP rows."
    else:
        msg = f"{answer!r} is not how many of idle's TCP rows the run deleted: read its report per map and node."
    return Outcome(False, msg, diff, reveal=f"{n} (idle's OUT row on node-a and IN row on node-b)")
