"""Lab 01, a tour: the hook that writes an OUT row, what a row counts, the map that holds ICMP rows, and a
break-it fault.

Graders read what the notebook's cells recorded: the first ping a1 → b1 (section 5) and the ping ×3
(section 6) with their trace records and rows, the snapshot of node-a's rows that section 7 prints, and the
ping taken with the fault on (section 8). Steps taken under section 8's fault (``no-related``) never
answer the questions of sections 5-7, so a learner who runs everything first and answers at the end is
graded on the cells the questions are about.
"""
from __future__ import annotations

import os
import re
import socket

from labkit.grading.checks import Outcome, exercise
from labkit.addr import ipv4
from labkit.constants import Hook
from labkit.maps.ct import CT_MAPS, CtResult, CtRow
from labkit.grading.exercises import common

RUN, PING, TABLE, LINE, BREAK = ("Run this cell", "5. One ping, step by step", "6. A live table",
                                 "7. Reading a CT line", "8. Break it")
#: The title of section 7's snapshot of node-a's rows.
ROWS = "node-a's rows in section 7"
_ICMP = socket.IPPROTO_ICMP
_ECHO_REQUEST = 8
_HOOKS = tuple(h.label for h in Hook)


def _ping_records(ev, **attrs):
    """Records of a1's pings to b1 taken outside section 8's fault (``no-related``)."""
    return ev.records("step", op="ping", actor="a1", target="b1", faults=lambda f: "no-related" not in f, **attrs)


def _ping(ev, **attrs):
    """The newest ping from a1 to b1 taken outside section 8's fault, or None."""
    recs = _ping_records(ev, **attrs)
    return recs[-1].data if recs else None


def _out_rows(step, a1: str, b1: str) -> list[CtRow]:
    """node-a's ICMP OUT rows a1 → b1 (not the twin) that the step wrote or updated."""
    return [r for r in common.touched(step, "node-a") if r.proto_name == "ICMP" and r.dir == "OUT"
            and not r.related and (r.src, r.dst) == (a1, b1)]


def _pair_rows(step, node: str, a1: str, b1: str) -> list[CtRow]:
    """``node``'s ICMP rows between a1 and b1 (either way, twins too) after the step."""
    return [r for r in common.step_rows(step, node, "ICMP", related=None) if {r.src, r.dst} == {a1, b1}]


# -- 01.1 ---------------------------------------------------------------------------------
@exercise(
    "01.1",
    "The hook that creates an OUT row",
    hints=(
        "An OUT row is written where node-a first sees the echo request leave the pod.",
        "Look at the step's trace lines for node-a: which hook reports ct=new/egress for the echo request?",
        "The answer is 'from-container': the program on lxc-a1's tc ingress, where packets from a1 arrive.",
    ),
    fault="no-out-entry",
    cells=(PING,),
)
def hook_creating_out_row(answer, ev) -> Outcome:
    """The hook whose CT lookup created node-a's ICMP OUT row, read from the first ping's trace and rows."""
    step = _ping(ev, count=1)
    if step is None:
        return Outcome.needs(PING, "the ping records each hook's line and the rows it wrote")
    a1, b1 = ev.topology.pod("a1").ip, ev.topology.pod("b1").ip
    created = [f for f in step.flows if f.node == "node-a" and f.ct_result == CtResult.NEW
               and f.event.before.proto == _ICMP and f.event.before.icmp_type == _ECHO_REQUEST
               and (ipv4(f.event.before.saddr), ipv4(f.event.before.daddr)) == (a1, b1)]
    if not step.ok or not created or not _out_rows(step, a1, b1):
        rows = [common.row_kind(r) for r in common.touched(step, "node-a")]
        return common.unhealthy(PING, f"a ping that left node-a with {rows or 'no new rows'} "
                                      f"({'answered' if step.ok else 'not answered'})", step)
    live = created[0].hook.label
    got = common.hook_name(answer)
    if got == live:
        return Outcome(True, f"{live}: the program on lxc-a1's tc ingress, the first hook the echo request meets, "
                             "found no row (ct=new) and wrote the OUT row.")
    diff = (("-", f"the hook that wrote node-a's OUT row: {live}", got),)
    if got not in _HOOKS:
        return Outcome.unreadable(f"{answer!r} is not a hook name; the hooks are {', '.join(sorted(_HOOKS))}.")
    if got == "to-container":
        msg = ("to-container hands packets into a pod: on node-a it only met the echo reply on its way back to a1, "
               "and that found the row already there (ct=reply).")
    elif got in ("to-overlay", "to-netdev"):
        msg = (f"{got} saw the echo request only after the row existed: its node-a line has no ct= at all. Conntrack "
               "runs at the pod's veth, before the packet is routed out of the node.")
    else:
        msg = (f"{got} on node-a only saw the echo reply arriving from node-b: the row was written before the "
               "request ever left node-a.")
    return Outcome(False, msg, diff, reveal=f"{live!r}")


# -- 01.2 ---------------------------------------------------------------------------------
@exercise(
    "01.2",
    "Packets counted after ping ×3",
    hints=(
        "With CT accounting on, the OUT row on node-a counts every packet of the flow that passes a1's veth, in "
        "both directions.",
        "Find the new `ICMP OUT 198.18.1.11:<id> -> 198.18.2.11:0` row of the ping ×3 (not the related one) and "
        "read Packets=.",
        "The answer is 6: three echo requests leaving a1 plus three echo replies coming back.",
    ),
    fault="no-accounting",
    cells=(TABLE,),
)
def packets_after_ping3(answer, ev) -> Outcome:
    """Packets= of the OUT row the ping ×3 made on node-a: 2 × 3 with CT accounting on, and the answer."""
    if not ev.config.ct_accounting:
        return Outcome(False, "this lab counts no packets: like a default Cilium v1.16 node it was built without CT "
                              "accounting, so every row says Packets=0. Run the setup cell as the notebook has it "
                              "(start(ct_accounting=True)), then the ping ×3, then check.", missing=RUN)
    step = _ping(ev, count=3)
    if step is None:
        return Outcome.needs(TABLE, "the ping ×3 records the row it made")
    a1, b1 = ev.topology.pod("a1").ip, ev.topology.pod("b1").ip
    rows = _out_rows(step, a1, b1)
    rule = 2 * 3
    if not step.ok or len(rows) != 1 or rows[0].packets != rule:
        counts = ", ".join(f"Packets={r.packets}" for r in rows) or "no new OUT row"
        return common.unhealthy(TABLE, f"a ping ×3 whose node-a OUT row says {counts}", step)
    row = rows[0]
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome.unreadable(f"expected a whole number of packets, got {answer!r}.")
    if answer == row.packets:
        return Outcome(True, f"{row.packets} packets: 3 echo requests leaving a1 and 3 echo replies entering it, "
                             "all counted on the one OUT row.")
    diff = (("-", f"Packets={row.packets}", f"Packets={answer}"),)
    if answer == 3:
        msg = "the row counts both directions of its flow: what came back to a1 passed the same row."
    elif answer == 2 * rule:
        msg = ("each packet is counted once on node-a's row, however many hooks it passes, and node-b's IN row keeps "
               "a count of its own.")
    elif answer > rule:
        msg = ("a new ping is a new flow: ping picked a new ICMP identifier, so the ping ×3 got a row of its own; the "
               "first ping's packets stay on the first ping's row.")
    else:
        msg = f"you answered {answer}; the ping ×3's OUT row on node-a counts another number. Which packets of the " \
              "ping pass lxc-a1?"
    return Outcome(False, msg, diff, reveal=f"{row.packets} (3 echo requests + 3 echo replies)")


# -- 01.3 ---------------------------------------------------------------------------------
_NOT_CT = {
    "cilium_lxc": "cilium_lxc lists node-a's local endpoints, one entry per pod: it holds no connections",
    "cilium_ipcache": "cilium_ipcache says which node owns which address: it holds no connections",
    "labkit_events": "labkit_events is the ring buffer of trace records: it holds no rows",
    "labkit_config": "labkit_config holds the lab clock offset and the faults: it holds no rows",
}


@exercise(
    "01.3",
    "The map that holds ICMP rows",
    hints=(
        "A node has two CT maps; one of them is only for TCP.",
        "Look at the pins list (ls of lab.pin_dir('node-a')) and at the `map` field of an ICMP row (section 7's "
        "loop prints it).",
        "The answer is 'cilium_ct_any4_global'.",
    ),
    fault="no-out-entry",
    cells=(TABLE, LINE),
)
def map_of_icmp_rows(answer, ev) -> Outcome:
    """The pinned map that holds node-a's ICMP rows in section 7's snapshot, with the ping ×3's row among them."""
    snap_rec = ev.latest("snapshot", title=ROWS)
    if snap_rec is None:
        return Outcome.needs(LINE, "it keeps node-a's rows as it prints them")
    before = [r for r in _ping_records(ev) if r.seq < snap_rec.seq]
    if not before:
        return Outcome.needs(TABLE, "the ping ×3 makes the rows section 7 reads")
    step, snap = before[-1].data, snap_rec.data
    a1, b1 = ev.topology.pod("a1").ip, ev.topology.pod("b1").ip
    mine = {r.key for r in _out_rows(step, a1, b1)}
    rows = snap.rows("node-a")
    icmp = [r for r in rows if r.proto_name == "ICMP"]
    if not mine or not mine <= {r.key for r in icmp}:
        return common.unhealthy(TABLE, "node-a's rows without the OUT row of your last ping a1 → b1", step)
    live = sorted({r.map for r in icmp})
    if live != [CT_MAPS[1]]:
        return common.unhealthy(LINE, f"node-a's ICMP rows in {live}")
    items = answer if isinstance(answer, (list, tuple, set)) else [answer]
    got = [os.path.basename(str(a).strip().rstrip("/")) for a in items]
    diff = (("-", f"the map of node-a's {len(icmp)} ICMP row(s)", ", ".join(got)),)
    if got == live:
        return Outcome(True, f"{live[0]}: ICMP, UDP and the RELATED twins share the 'any' map; "
                             f"{CT_MAPS[0]} is for TCP only.")
    if len(got) > 1:
        msg = "each row lives in exactly one CT map, chosen by its protocol: name the one that holds ICMP rows."
    elif got[0] == CT_MAPS[0]:
        tcp = sum(1 for r in rows if r.map == CT_MAPS[0])
        msg = (f"{CT_MAPS[0]} holds TCP rows only ({tcp} in your snapshot, and no ICMP among them): the '4' is IPv4, "
               "not 'every IPv4 protocol'.")
    elif got[0] in _NOT_CT:
        msg = _NOT_CT[got[0]] + "; the rows are in one of the two CT maps."
    else:
        msg = f"{answer!r} is not one of node-a's pinned maps: the pins list of section 4 names them."
    return Outcome(False, msg, diff, reveal=f"'{live[0]}'")


# -- 01.4 (break it) ----------------------------------------------------------------------
#: The words that name the twins.
_TWIN = {"related", "twin", "twins"}


def _several_kinds(answer) -> bool:
    """Whether the answer names several kinds of row where one is asked for: a list of alternatives
    (``['IN', 'related']``, ``'OUT or related'``, ``'related, ICMP'``) or both directions at once. ``'ICMP IN related'``
    names one kind: the twin, as its line spells it."""
    items = answer if isinstance(answer, (list, tuple, set)) else re.split(r"[,;/|]|\bor\b|\band\b", str(answer).lower())
    alts = [set(common.words(a)) for a in items]
    alts = [a for a in alts if a]
    if len(alts) > 1 and not all(a & _TWIN for a in alts):
        return True
    return any({"in", "out"} <= a for a in alts)


@exercise(
    "01.4",
    "Break it: which rows are missing?",
    hints=(
        "Compare the rows of this ping with those of the first ping of the notebook, node by node.",
        "Before the fault every ping left two rows per node; count them now. The missing ones have ports 0 and one "
        "extra word.",
        "The answer is 'related': the RELATED twins (ICMP, ports 0, the word `related` in the line) are not created.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def missing_related(answer, ev) -> Outcome:
    """With no-related on: the word that marks the rows the ping no longer made, checked on its rows."""
    step, missing = common.broken_step(ev, "no-related", BREAK, "it switches the fault on, empties the CT maps "
                                       "and pings", op="ping", actor="a1", target="b1")
    if missing:
        return missing
    a1, b1 = ev.topology.pod("a1").ip, ev.topology.pod("b1").ip
    a_rows, b_rows = _pair_rows(step, "node-a", a1, b1), _pair_rows(step, "node-b", a1, b1)
    outs = [r for r in a_rows if r.dir == "OUT" and not r.related]
    ins = [r for r in b_rows if r.dir == "IN" and not r.related]
    twins = [r for r in a_rows + b_rows if r.related]
    if not outs or not ins or twins:
        saw = (f"{len(twins)} twin row(s) left from before the fault" if twins
               else f"node-a {sorted(map(common.row_kind, a_rows))}, node-b {sorted(map(common.row_kind, b_rows))}")
        return Outcome(False, f"your cells recorded {saw}, not the rows this question is about: run the cells under "
                              f"'{BREAK}' again (the fault, then the cell that empties the maps and pings).",
                       missing=BREAK)
    if _several_kinds(answer):
        return Outcome.unreadable(f"{answer!r} names several kinds of row: name one, the kind of row the ping no "
                                  "longer made.")
    said = set(common.words(answer))
    if said & _TWIN:
        return Outcome(True, f"related: node-a has {len(a_rows)} row(s) and node-b {len(b_rows)} for the ping, and "
                             "none is a RELATED twin, so an ICMP error about this flow would now find no row.")
    diff = (("-", "the word of the missing rows", str(answer)),)
    if "in" in said:
        msg = "node-b still has its IN row for this ping: the receiving side was tracked as before."
    elif "out" in said:
        msg = "node-a still has its OUT row for this ping: the sending side was tracked as before."
    elif "icmp" in said:
        msg = ("the ping's own rows are ICMP too, and they are there on both nodes: the missing rows are marked by "
               "another word of the line.")
    else:
        msg = (f"{answer!r} does not name what is missing: node-a still has its OUT row and node-b its IN row "
               f"({len(a_rows)} and {len(b_rows)} row(s)); after the first ping each node had two. Which kind of row "
               "is gone?")
    return Outcome(False, msg, diff, reveal="'related': the RELATED twins (ports 0) are not created")
