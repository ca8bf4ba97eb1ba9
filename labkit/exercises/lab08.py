"""Lab 08, conntrack over time: which rows a GC run leaves, the interval it
picks next, what an LRU map under pressure forgets, and a break-it fault that
lets the GC delete an established connection.

Graders read the live maps, the GC's own record of its runs (``lab.gc``) and
the trace; the small-map lab is the ``-small`` lab beside the main one.
"""
from __future__ import annotations

from ..checks import Outcome, compare_rows, exercise
from ..gc import next_interval
from ..maps.ct import CT_MAPS
from .lab01 import kinds_answer, row_kind, unanswered, variant_lab, variant_missing

__all__ = ["small_lab"]


def small_lab(lab):
    """(the small-CT-map lab the notebook started beside ``lab``, None) or (None, a failed Outcome)."""
    small = variant_lab(lab, "small")
    if small is None:
        return None, variant_missing(lab, "small", "small = start(variant='small', ...)")
    return small, None


def _last_run(lab) -> dict | None:
    runs = lab.gc.history()
    return runs[-1] if runs else None


# -- 08.1 ---------------------------------------------------------------------------------
@exercise(
    "08.1",
    "Which rows survive a GC",
    hints=(
        "A row survives when its lifetime is still ahead of the clock: compare each row's expires= with now.",
        "61 s is past the close timeout (10 s) and the 60 s of ICMP rows and RELATED twins, not 8,000 s.",
        "The answer is ['TCP OUT']: only the open connection's own row on node-a is left.",
    ),
)
def survivors(answer, lab) -> Outcome:
    """Kinds of node-a's rows left after the newest GC run, live, checked against the run's clock."""
    if (blank := unanswered(answer)) is not None:
        return blank
    run = _last_run(lab)
    if run is None:
        return Outcome(False, "the GC has not run in this lab yet: run the cell with lab.gc.run(), then check.")
    rows = lab.ct("node-a")
    early = [r for r in rows if r.lifetime < run["now"]]
    if early:
        return Outcome(False, f"node-a holds {len(early)} row(s) that expired before the last GC run: the run "
                              "cannot have been the last thing done. Run section 1's cells again, then check.")
    live = sorted({row_kind(r) for r in rows})
    if not any(r.proto_name == "TCP" and r.dir == "OUT" and r.flags & 0x10 for r in rows):
        return Outcome(False, f"node-a has no open TCP connection left ({live}): run section 1 from the top.")
    got = kinds_answer(answer)
    if got is None:
        return Outcome(False, f"expected a list of row kinds such as ['TCP OUT'], got {answer!r}.")
    out = compare_rows(live, got, "rows left on node-a")
    if out.passed:
        return Outcome(True, "Only the open connection's OUT row: its lifetime runs 8,000 s from its last packet. "
                             "The closed connection had 10 s, the ping and every RELATED twin 60 s; the clock moved "
                             "61 s and the run deleted them all. The GC never looks at flags, only at lifetimes.",
                       out.diff)
    return out


# -- 08.2 ---------------------------------------------------------------------------------
@exercise(
    "08.2",
    "The next interval",
    hints=(
        "The rule reads the largest ratio deleted / max_entries over the maps, and only compares it with 5% and 25%.",
        "Above 25% the interval is multiplied by (1 - ratio), rounded to whole seconds (never below 10 s).",
        "The answer is next_interval(run.interval, run.ratio): print small.gc.state()['interval'] to see it.",
    ),
)
def interval_after(answer, lab) -> Outcome:
    """The small lab's interval after its newest GC run, live, and by the rule from that run's ratio."""
    if (blank := unanswered(answer)) is not None:
        return blank
    small, missing = small_lab(lab)
    if missing:
        return missing
    run = _last_run(small)
    if run is None:
        return Outcome(False, "the small lab's GC has not run yet: run the churn cell of section 3, then check.")
    live = small.gc.state()["interval"]
    rule = next_interval(run["interval"], run["ratio"])
    if live != rule:
        return Outcome(False, f"the small lab's interval is {live} s but its last run ({run['interval']} s, ratio "
                              f"{run['ratio']:.3f}) gives {rule} s: another run happened since. Run the churn cell "
                              "again, then check.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Outcome(False, f"expected a number of seconds, got {answer!r}.")
    if round(answer) == live:
        return Outcome(True, f"{live} s: the run deleted {run['ratio']:.1%} of the fullest map, more than a quarter, "
                             f"so the GC comes back sooner: {run['interval']} s × (1 − {run['ratio']:.3f}). A node "
                             "with many short connections converges on a short interval; an idle one grows it "
                             "by half each run up to 12 hours.", (("=", f"{live} s", f"{answer} s"),))
    return Outcome(False, f"{answer!r} s is not the interval the rule gives for ratio {run['ratio']:.3f} after "
                          f"{run['interval']} s.", (("-", f"{live} s", f"{answer} s"),))


# -- 08.3 ---------------------------------------------------------------------------------
FLOOD = 400  #: connections the notebook's flood cell makes from a2 to b2 in the small lab


@exercise(
    "08.3",
    "A full table forgets",
    hints=(
        "Every one of the flood's connections made an OUT row on node-a, and no GC ran since.",
        "Count the TCP OUT rows from a2 still in small.ct('node-a'); the rest are gone.",
        "The answer is 400 minus that count: the LRU map evicted them to make room.",
    ),
)
def evicted(answer, lab) -> Outcome:
    """How many of the flood's OUT rows the small lab's 16-entry TCP map on node-a no longer holds, live."""
    if (blank := unanswered(answer)) is not None:
        return blank
    small, missing = small_lab(lab)
    if missing:
        return missing
    a2 = small.pod("a2").ip
    rows = [r for r in small.ct("node-a") if r.proto_name == "TCP" and r.dir == "OUT" and r.src == a2
            and not r.related]
    size = small.config.ct_tcp_size
    if not rows:
        return Outcome(False, "node-a of the small lab holds no row of a2's connections: run the flood cell, then "
                              "check.")
    live = FLOOD - len(rows)
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome(False, f"expected a number of rows, got {answer!r}.")
    if answer == live:
        return Outcome(True, f"{live} of {FLOOD}: the map holds {size} entries, so every new connection past that "
                             "made the kernel evict one. Nothing had expired and no GC ran: an LRU map forgets under "
                             "pressure, whatever the lifetimes say. Which entry goes is the kernel's guess at the one "
                             "used longest ago, made per CPU.", (("=", str(live), str(answer)),))
    return Outcome(False, f"{answer!r} is not how many of the flood's {FLOOD} rows are gone: count a2's OUT rows "
                          "left.", (("-", str(live), str(answer)),))


# -- 08.4 (break it) ----------------------------------------------------------------------
@exercise(
    "08.4",
    "Break it: the GC takes a live connection",
    hints=(
        "Which lifetime did idle's rows carry with the fault on? Compare it with the 61 s the clock moved.",
        "The last GC run says how many TCP rows it deleted: print lab.gc.history()[-1]['maps'].",
        "The answer is 2: idle's OUT row on node-a and its IN row on node-b.",
    ),
    break_it=True,
)
def gc_takes_live(answer, lab) -> Outcome:
    """With wrong-lifetime on: the TCP rows the newest GC run deleted on both nodes, from the GC's own record."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "wrong-lifetime" not in lab.faults():
        return Outcome(False, "the fault is off: run the break-it cell, then check.")
    run = _last_run(lab)
    if run is None:
        return Outcome(False, "the GC has not run since the fault went on: run the break-it cell, then check.")
    tcp = sum(m["deleted"] for m in run["maps"] if m["map"] == CT_MAPS[0])
    a1, b1 = lab.pod("a1").ip, lab.pod("b1").ip
    left = [f"{n}: {r.line()[:80]}" for n in ("node-a", "node-b") for r in lab.ct(n)
            if r.proto_name == "TCP" and not r.related and {r.src, r.dst} == {a1, b1} and r.lifetime >= run["now"]]
    if left or tcp == 0:
        return Outcome(False, f"idle's rows are not gone after the last run ({'; '.join(left) or 'it deleted none'}):"
                              " run the break-it cell from the top.")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome(False, f"expected a number of rows, got {answer!r}.")
    if answer == tcp:
        return Outcome(True, f"{tcp}: with SeenNonSyn never set, idle's rows kept the 60 s SYN lifetime; a minute of "
                             "quiet later the GC deleted them as it deletes any expired row. The connection itself "
                             "is still open in both pods: its next packet finds no row at all.",
                       (("=", str(tcp), str(answer)),))
    return Outcome(False, f"{answer!r} is not how many TCP rows the last run deleted: print "
                          "lab.gc.history()[-1]['maps'].", (("-", str(tcp), str(answer)),))
