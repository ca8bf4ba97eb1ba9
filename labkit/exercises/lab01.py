"""Lab 01, a tour: the hooks, the maps, a ping's rows and a break-it fault.

Every grader reads the running lab (CT maps and the trace) and compares the
learner's answer with what it finds there *and* with the rule the answer
should follow, so a check never passes on a lab that did not do the thing.

The small helpers at the top (reading answers, naming rows, reading the
trace) are shared by the graders of the other labs.
"""
from __future__ import annotations

import os
import re
import socket
import struct
from typing import Any, Iterable

from ..checks import Outcome, exercise
from ..maps.ct import CT_MAPS, CtResult, CtRow
from ..trace import EVENT_SIZE, Flow

__all__ = ["NO_ANSWER", "unanswered", "row_kind", "norm_kind", "kinds_answer", "rows_between", "recent_flows",
           "addr", "newest", "hook_name", "words", "variant_lab", "variant_missing"]

#: What a check says while the answer cell still holds its placeholder.
NO_ANSWER = "no answer yet: replace None in the answer cell with your answer, run it, then run this check again."

_ICMP, _TCP = socket.IPPROTO_ICMP, socket.IPPROTO_TCP


# -- helpers shared by the lab graders ------------------------------------------------------
def variant_lab(lab, variant: str):
    """The second lab a notebook started beside ``lab`` with ``start(variant=...)``
    (``<name>-<variant>``), or None when it is not running."""
    from ..lab import Lab

    try:
        return Lab.attach(f"{lab.name}-{variant}")
    except Exception:
        return None


def variant_missing(lab, variant: str, how: str) -> Outcome:
    """The failed Outcome of a check whose second lab is not running; ``how`` is the cell that starts it."""
    return Outcome(False, f"no lab '{lab.name}-{variant}' is running: run the cell that starts it ({how}), then "
                          "check.")


def unanswered(answer: Any) -> Outcome | None:
    """A failed Outcome while the answer is still the placeholder, else None."""
    if answer is None or answer is Ellipsis or (isinstance(answer, str) and not answer.strip()):
        return Outcome(False, NO_ANSWER)
    return None


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


def rows_between(lab, node: str, a: str, b: str, proto: str | None = None, either_way: bool = False) -> list[CtRow]:
    """``node``'s CT rows of flows from pod ``a`` to pod ``b`` (or back too, with ``either_way``)."""
    ia, ib = lab.pod(a).ip, lab.pod(b).ip
    pairs = {(ia, ib), (ib, ia)} if either_way else {(ia, ib)}
    return [r for r in lab.ct(node) if (r.src, r.dst) in pairs and (proto is None or r.proto_name == proto)]


def newest(rows: Iterable[CtRow]) -> CtRow:
    """The row touched last (largest lifetime; most packets on a tie)."""
    return max(rows, key=lambda r: (r.lifetime, max(r.last_tx_report, r.last_rx_report), r.packets))


def recent_flows(lab, last: int = 20000) -> list[Flow]:
    """The lab's last ``last`` trace records, in time order."""
    log = lab.events()
    try:
        size = os.stat(log.path).st_size
    except FileNotFoundError:
        return []
    log.offset = max(0, size - size % EVENT_SIZE - last * EVENT_SIZE)
    return sorted(log.read(), key=lambda f: f.event.ts_ns)


def addr(be32: int) -> str:
    """Dotted address of a trace record's field."""
    return socket.inet_ntoa(struct.pack("=I", be32))


def hook_name(text: Any) -> str:
    """A hook as the learner wrote it, in Cilium's form: ``from-container``."""
    name = str(text).strip().lower().replace("_", "-").replace(" ", "-")
    return name[4:] if name.startswith("cil-") else name


def _pings(lab, node: str, src: str, dst: str) -> list[CtRow]:
    """ICMP OUT rows (not the twins) of ``src`` pinging ``dst`` on ``node``."""
    return [r for r in rows_between(lab, node, src, dst, "ICMP") if r.dir == "OUT" and not r.related]


# -- 01.1 ---------------------------------------------------------------------------------
@exercise(
    "01.1",
    "The hook that creates an OUT row",
    hints=(
        "An OUT row is written where node-a first sees the echo request leave the pod.",
        "Look at the step's trace lines for node-a: which hook reports ct=new/egress for the echo request?",
        "The answer is 'from-container': the program on lxc-a1's tc ingress, where packets from a1 arrive.",
    ),
)
def hook_creating_out_row(answer, lab) -> Outcome:
    """The hook whose CT lookup created node-a's ICMP OUT row, read from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if not _pings(lab, "node-a", "a1", "b1"):
        return Outcome(False, "node-a has no ICMP OUT row from a1 to b1 yet: run the ping cell "
                              "(lab.pod('a1').ping('b1')), then check again.")
    a1, b1 = lab.pod("a1").ip, lab.pod("b1").ip
    created = [f for f in recent_flows(lab) if f.node == "node-a" and f.event.ct_result == CtResult.NEW
               and f.event.before.proto == _ICMP and (addr(f.event.before.saddr), addr(f.event.before.daddr)) == (a1, b1)]
    if not created:
        return Outcome(False, "the trace holds no record of node-a creating the a1 → b1 row (ct=new): "
                              "run the ping cell again, then check.")
    live = created[-1].hook.label
    if live != "from-container":
        return Outcome(False, f"the trace shows node-a creating the row at {live}, not at from-container where "
                              f"labkit's datapath creates OUT rows: is a fault on? (lab.faults() = {lab.faults()})")
    got = hook_name(answer)
    if got == live:
        return Outcome(True, f"{live}: the program on lxc-a1's tc ingress, the first hook the echo request meets, "
                             "found no row (ct=new) and wrote the OUT row.")
    hooks = {"from-container", "to-container", "from-netdev", "to-netdev", "from-overlay", "to-overlay"}
    if got not in hooks:
        return Outcome(False, f"{answer!r} is not a hook name; the hooks are {', '.join(sorted(hooks))}.")
    return Outcome(False, f"{answer!r} is not where node-a's OUT row was made: the record there does not say "
                          "ct=new/egress. Find the one node-a line of the echo request that does.")


# -- 01.2 ---------------------------------------------------------------------------------
@exercise(
    "01.2",
    "Packets counted after ping ×3",
    hints=(
        "With CT accounting on, the OUT row on node-a counts every packet of the flow that passes a1's veth, in "
        "both directions.",
        "Find the newest `ICMP OUT 198.18.1.11:<id> -> 198.18.2.11:0` row (not the related one) and read Packets=.",
        "The answer is 6: three echo requests leaving a1 plus three echo replies coming back.",
    ),
)
def packets_after_ping3(answer, lab) -> Outcome:
    """node-a's newest ICMP OUT row must count 2×3 packets (CT accounting on), and the answer must say so."""
    if (blank := unanswered(answer)) is not None:
        return blank
    rule = 2 * 3
    rows = _pings(lab, "node-a", "a1", "b1")
    if not rows:
        return Outcome(False, "node-a has no ICMP OUT row from a1 to b1: run the ping ×3 cell, then check again.")
    row = newest(rows)
    if not lab.config.ct_accounting:
        return Outcome(False, f"lab '{lab.name}' counts no packets: like a default Cilium v1.16 node it is built "
                              "without CT accounting, so every row says Packets=0. Run the setup cell as the notebook "
                              "has it (start(ct_accounting=True)), then the ping ×3 cell, then check.")
    if row.packets != rule:
        return Outcome(False, f"node-a's newest ICMP OUT row counts {row.packets} packets, not the {rule} a ping ×3 "
                              "leaves (3 requests + 3 replies): run the ping ×3 cell again, then check.")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome(False, f"expected a whole number of packets, got {answer!r}.")
    if answer == row.packets:
        return Outcome(True, f"{row.packets} packets: 3 echo requests leaving a1 and 3 echo replies entering it, "
                             "all counted on the one OUT row.")
    return Outcome(False, f"you answered {answer}, but node-a's newest ICMP OUT row (the ping ×3) counts "
                          f"{row.packets} packets. Which packets of the ping pass lxc-a1?",
                   (("-", f"Packets={row.packets}", f"Packets={answer}"),))


# -- 01.3 ---------------------------------------------------------------------------------
@exercise(
    "01.3",
    "The map that holds ICMP rows",
    hints=(
        "A node has two CT maps; one of them is only for TCP.",
        "Look at the pins list (ls of lab.pin_dir('node-a')) and at the `map` field of an ICMP row: lab.ct('node-a')[0].map.",
        "The answer is 'cilium_ct_any4_global'.",
    ),
)
def map_of_icmp_rows(answer, lab) -> Outcome:
    """The pinned map that holds node-a's ICMP rows, compared with the rows' real map."""
    if (blank := unanswered(answer)) is not None:
        return blank
    rows = lab.ct("node-a")
    icmp = [r for r in rows if r.proto_name == "ICMP"]
    if not icmp:
        return Outcome(False, "node-a holds no ICMP row right now: run a ping cell, then check again.")
    live = sorted({r.map for r in icmp})
    if live != ["cilium_ct_any4_global"]:
        return Outcome(False, f"node-a's ICMP rows are in {live}; expected them all in one non-TCP map.")
    got = os.path.basename(str(answer).strip().rstrip("/"))
    if got == live[0]:
        return Outcome(True, f"{got}: ICMP, UDP and the RELATED twins share the 'any' map; "
                             "cilium_ct4_global is for TCP only.")
    if got in CT_MAPS:
        tcp = sum(1 for r in rows if r.map == got)
        return Outcome(False, f"{got} holds node-a's TCP rows only ({tcp} now, no ICMP among them). "
                              "ICMP rows are in the node's other CT map.",
                       (("-", "the map of the ICMP rows", got),))
    return Outcome(False, f"{answer!r} is not one of node-a's CT maps ({', '.join(CT_MAPS)}).")


# -- 01.4 (break it) ----------------------------------------------------------------------
@exercise(
    "01.4",
    "Break it: which rows are missing?",
    hints=(
        "Compare the rows of this ping with those of the first ping of the notebook, node by node.",
        "Before the fault every ping left two rows per node; count them now. The missing ones have ports 0 and one extra word.",
        "The answer is 'related': the RELATED twins (ICMP, ports 0, the word `related` in the line) are not created.",
    ),
    break_it=True,
)
def missing_related(answer, lab) -> Outcome:
    """With no-related on, the learner names the missing RELATED twins, checked against the live rows."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "no-related" not in lab.faults():
        return Outcome(False, "the fault is off: run the cell that resets the lab and switches it on "
                              "(lab.fault('no-related')), then the ping after it, then check.")
    a_rows = rows_between(lab, "node-a", "a1", "b1", "ICMP")
    b_rows = rows_between(lab, "node-b", "a1", "b1", "ICMP")
    if not [r for r in a_rows if not r.related]:
        return Outcome(False, "node-a has no ICMP OUT row from a1 to b1: run the ping cell under the fault, then check.")
    twins = [r for r in a_rows + b_rows if r.related]
    if twins:
        return Outcome(False, f"there are still {len(twins)} twin row(s) from before the fault: run the break-it cell "
                              "again (it resets the lab first), then check.")
    if "related" in words(answer) or "twin" in words(answer) or "twins" in words(answer):
        return Outcome(True, f"related: node-a has {len(a_rows)} row(s) and node-b {len(b_rows)} for the ping, "
                             "and none is a RELATED twin, so an ICMP error about this flow would now find no row.")
    return Outcome(False, f"{answer!r} does not name what is missing: node-a still has its ICMP OUT row and node-b its "
                          f"ICMP IN row ({len(a_rows)} and {len(b_rows)} row(s)); after the first ping each node had "
                          "two. Which kind of row is gone?",
                   (("-", "the missing kind of row", str(answer)),))
