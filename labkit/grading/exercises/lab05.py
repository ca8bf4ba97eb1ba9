"""Lab 05, hairpin: a pod calling its own Service. The server sees the loopback address, the three rows with
LBLoopback, where the reply is rewritten, and a break-it fault that drops the loopback SNAT.

Graders read what the notebook's cells recorded: the GET of section 1 (its step's server log and rows), the
connection of section 2 (the one a1 closed: its rows after the close, its open step's trace), and the open
taken in section 4 with the fault on. Steps taken under that fault are left out of sections 1-3, so a learner
who ran everything first is graded on the hairpin as the datapath makes it.
"""
from __future__ import annotations

import re
from typing import Any

from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.constants import Hook
from labkit.maps.ct import CtFlags
from labkit.net.topology import LOOPBACK_SNAT_ADDR
from labkit.grading.exercises.common import dst, hook_name, is_syn, kinds_answer, row_kind, src, step_rows, unhealthy

GET, PATH, BREAK = "1. GET your own Service", "2. The path and the rows", "4. Break it"
_FAULT = "no-loopback-snat"  #: section 4's fault, which breaks what sections 1-3 ask about on purpose
_LOGGED = re.compile(r"(?:tcp accept|http \S+) pod=a1 client=([\d.]+):(\d+)")


def _step(ev, op: str, **attrs):
    """The newest a1 → self:80 step ``op`` taken without section 4's fault."""
    return ev.step(op=op, actor="a1", target="self", port=80, faults=lambda f: _FAULT not in f, **attrs)


def _conn(step, node: str = "node-a") -> list:
    """``node``'s TCP rows of the step's connection (client port ``sport``), SVC, OUT and IN."""
    return [r for r in step_rows(step, node, "TCP") if r.sport == step.attrs.get("sport")]


def _address_of(answer: Any) -> str:
    """The address part of ``'1.2.3.4'`` or ``'1.2.3.4:5'``."""
    text = str(answer).strip()
    return text.rpartition(":")[0] if ":" in text else text


# -- 05.1 ---------------------------------------------------------------------------------
@exercise(
    "05.1",
    "Who the server thinks called",
    hints=(
        "The request left a1 and came back to a1, but not with a1's address as its source.",
        "Read the last lines of lab.pod('a1').server_log(), or the client= in the GET's answer.",
        f"The answer is '{LOOPBACK_SNAT_ADDR}': Cilium's service loopback address.",
    ),
    fault="no-loopback-snat",
    cells=(GET,),
)
def server_view(answer, ev) -> Outcome:
    """The client address a1's server logged for section 1's GET, tied to that connection's OUT row."""
    gets = [s for s in ev.steps(op="tcp-send", actor="a1", target="self", port=80, ok=True,
                                faults=lambda f: _FAULT not in f)
            if any(" http " in f" {line}" for line in s.server_log.get("a1", []))]
    if not gets:
        return Outcome.needs(GET, "get.send(b'GET ...') records what a1's server logged")
    step = gets[-1]
    logged = [m.groups() for m in map(_LOGGED.search, step.server_log["a1"]) if m]
    ip = next((i for i, port in logged if int(port) == step.attrs["sport"]), None)
    outs = [r for r in _conn(step) if r.dir == "OUT" and r.flags & CtFlags.LB_LOOPBACK]
    if ip != LOOPBACK_SNAT_ADDR or not outs:
        return unhealthy(GET, f"a1's server logging the GET from {ip or 'nobody'}, "
                              f"{'with' if outs else 'and no'} LBLoopback OUT row on node-a", step)
    a1, vip = ev.topology.pod("a1").ip, step.attrs["dst"]
    got = _address_of(answer)
    diff = (("-", ip, got),)
    if got == ip:
        return Outcome(True, f"{ip}: node-a rewrote the source of a1's request to the loopback address, so a1's "
                             "server cannot tell that a1 itself called. Access logs and allow-lists keyed on the "
                             "client address see this address for every pod that calls its own Service.",
                       (("=", ip, got),))
    if got == a1:
        msg = ("that is a1's own address, where the request really came from, not what the server logged: a packet "
               "coming into a1 from a1's own address would be a martian.")
    elif got == vip:
        msg = "the VIP is where a1 sent the request, its destination; the server logs the source of what it accepted."
    elif got == ev.topology.node("node-a").ip:
        msg = "node-a did not masquerade the request to its own address: that is how kube-proxy does it (section 3)."
    else:
        msg = f"{answer!r} is not the client a1's server logged for the GET: read its server log."
    return Outcome(False, msg, diff, reveal=ip)


# -- 05.2 ---------------------------------------------------------------------------------
@exercise(
    "05.2",
    "The rows that carry LBLoopback",
    hints=(
        "One connection, three TCP rows on node-a; the flag marks the flow after the loopback SNAT.",
        "Print node-a's TCP rows of the connection and look for LBLoopback between Flags=[ ].",
        "The answer is ['TCP OUT', 'TCP IN']: the SVC row, keyed by what a1 sent, has no LBLoopback.",
    ),
    fault="no-in-entry",
    cells=(PATH,),
)
def loopback_rows(answer, ev) -> Outcome:
    """Kinds of node-a's rows of section 2's connection that carry LBLoopback after its close, by the rule."""
    step = _step(ev, "tcp-close", ok=True)
    if step is None:
        return Outcome.needs(PATH, "conn.open(), send() and close() record the connection's rows")
    rows = _conn(step)
    kinds = sorted(row_kind(r) for r in rows)
    live = sorted(row_kind(r) for r in rows if r.flags & CtFlags.LB_LOOPBACK)
    if kinds != ["TCP IN", "TCP OUT", "TCP SVC"] or live != ["TCP IN", "TCP OUT"]:
        return unhealthy(PATH, f"node-a's rows {kinds or 'none'} for the connection, LBLoopback on {live or 'none'}",
                         step)
    got = kinds_answer(answer)
    if got is None:
        return Outcome(False, f"expected a list of row kinds such as ['TCP SVC'], got {answer!r}.")
    out = compare_rows(live, got, "rows with LBLoopback")
    if out.passed:
        return Outcome(True, f"OUT and IN, both {LOOPBACK_SNAT_ADDR} -> a1:8080: a1 is client and server of one "
                             "flow, so node-a tracks it from both sides, and marks both rows as a loopback flow. The "
                             "SVC row is keyed by what a1 sent (a1 -> VIP) and is an ordinary service row.", out.diff)
    have = set(got)
    if have == {"TCP SVC"}:
        msg = ("LBLoopback does not mark the load balancer's choice: it marks the rows of the flow whose source was "
               "rewritten.")
    elif "TCP SVC" in have:
        msg = "the SVC row is keyed by what a1 sent, a1 -> the VIP, before any source was rewritten: nothing in it " \
              "is a loopback flow."
    elif have == {"TCP OUT"}:
        msg = "a1 is also the server of this flow: the row to-container made when the SYN came back in is a loopback " \
              "row as well."
    else:
        msg = out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 05.3 ---------------------------------------------------------------------------------
@exercise(
    "05.3",
    "Where the hairpin reply is rewritten",
    hints=(
        "In lab 04 the reply came from node-b and was rewritten on its way into a1. Here the server is a1 itself.",
        "Find the SYN|ACK's line with `=>` in the open step: which hook is it?",
        "The answer is 'to-container': from-container hands the reply back into a1 as it is, and a1's ingress "
        "rewrites it, as it rewrites every reply.",
    ),
    fault="skip-rev-nat",
    cells=(PATH,),
)
def hairpin_reply_hook(answer, ev) -> Outcome:
    """The hook that rewrote the SYN|ACK of section 2's connection back to the VIP, from its open step's trace:
    a1's ingress, as on a v1.16 node (bpf_lxc.c ipv4_policy → lb4_rev_nat with the loopback flag, 1870-1885@82999990;
    handle_ipv4_from_lxc hands the reply back untranslated, 1106-1119)."""
    closed = _step(ev, "tcp-close")
    opened = closed and _step(ev, "tcp-open", conn=closed.attrs["conn"])
    if opened is None:
        return Outcome.needs(PATH, "conn.open() records the hairpin's trace")
    a1, vip = ev.topology.pod("a1").ip, (opened.attrs["dst"], 80)
    replies = [f for f in opened.flows if f.node == "node-a" and is_syn(f.event.before, ack=True) and f.translated
               and src(f.event.before) == (a1, 8080) and src(f.event.after) == vip]
    if len(replies) != 1 or replies[0].hook != Hook.TO_CONTAINER \
            or dst(replies[0].event.before)[0] != LOOPBACK_SNAT_ADDR:
        saw = (f"the SYN|ACK rewritten to the VIP at {replies[-1].hook.label}" if replies
               else "no SYN|ACK rewritten back to the VIP")
        return unhealthy(PATH, saw, opened)
    live = replies[0].hook.label
    got = hook_name(answer)
    if got == live:
        return Outcome(True, f"to-container: the SYN|ACK leaves a1 addressed to {LOOPBACK_SNAT_ADDR}; from-container "
                             "finds the IN row (ct=reply) and hands it, untranslated, straight back to a1 (the "
                             "reply's source names the pod), and a1's ingress finds the OUT row and rewrites source "
                             f"and destination back to {vip[0]}:{vip[1]} -> a1. Without the loopback SNAT the reply "
                             "would never leave a1, and nothing could rewrite it.",
                       (("=", live, got),))
    if got == "from-container":
        msg = "from-container is the first hook the reply meets, but it only hands the reply back into a1 as it is: " \
              "find the SYN|ACK's line with `=>`."
    elif got in ("to-netdev", "from-netdev", "to-overlay", "from-overlay"):
        msg = "the hairpin reply never reaches node-a's eth0 or tunnel: it leaves a1 and is handed straight back."
    else:
        msg = f"{answer!r} is not where this reply was rewritten: find the SYN|ACK's line with `=>`."
    return Outcome(False, msg, (("-", live, got),), reveal=live)


# -- 05.4 (break it) ----------------------------------------------------------------------
@exercise(
    "05.4",
    "Break it: a packet from yourself",
    hints=(
        "Compare the SYN's line at to-container with the one in section 2: what is its source now?",
        "Read node-a's to-container lines of the SYN, and look for any SYN|ACK after them.",
        "The answer is ('198.18.1.11', 0): the SYN came in from a1's own address and a1 never answered it.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def no_loopback_snat(answer, ev) -> Outcome:
    """With no-loopback-snat on: (source of the SYN delivered into a1, SYN|ACKs a1 sent), from the step's trace."""
    step = ev.step(op="tcp-open", actor="a1", target="self", port=80)  # section 4's is the last
    if step is None or not ev.steps(op="tcp-open", actor="a1", target="self", faults=lambda f: _FAULT in f):
        return Outcome.needs(BREAK, "it switches the fault on, then tries to connect to self")
    if _FAULT not in step.attrs["faults"]:
        return unhealthy(BREAK, "your newest connection to self made without the fault")
    a1 = ev.topology.pod("a1").ip
    syns = [f for f in step.flows if f.node == "node-a" and f.hook == Hook.TO_CONTAINER and is_syn(f.event.before)
            and dst(f.event.before) == (a1, 8080)]
    synacks = [f for f in step.flows if f.node == "node-a" and is_syn(f.event.before, ack=True)
               and src(f.event.before) == (a1, 8080)]
    if not syns or step.ok or src(syns[-1].event.before)[0] != a1:
        saw = f"the SYN delivered into a1 from {src(syns[-1].event.before)[0]}" if syns else \
            "no SYN delivered into a1"
        return unhealthy(BREAK, f"{saw}, and connect() {'succeeding' if step.ok else 'failing'}", step)
    live_src, live_n = a1, len(synacks)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('address', number of SYN|ACKs), got {answer!r}.")
    got_src, got_n = _address_of(answer[0]), answer[1]
    src_ok = got_src == live_src
    n_ok = isinstance(got_n, int) and not isinstance(got_n, bool) and got_n == live_n
    diff = (("=" if src_ok else "-", live_src, got_src), ("=" if n_ok else "-", f"{live_n} SYN|ACK", str(got_n)))
    if src_ok and n_ok:
        return Outcome(True, f"the SYN reached a1 as {live_src} -> {a1}: a packet from the outside claiming a1's own "
                             f"address, a martian source. a1's kernel dropped it without a word ({live_n} SYN|ACKs, "
                             f"{len(syns)} SYNs delivered) and connect() timed out. The loopback SNAT exists to avoid "
                             "exactly this, and to make the reply leave a1 so it can be rewritten.", diff)
    problems = []
    if not src_ok:
        if got_src == LOOPBACK_SNAT_ADDR:
            problems.append("the loopback SNAT is what the fault switched off: the SYN did not carry that address "
                            "this time; read the source on its to-container line")
        else:
            problems.append(f"{answer[0]!r} is not the source the SYN carried into a1: read its to-container line")
    if not n_ok:
        problems.append(f"{got_n!r} SYN|ACKs: count the lines from a1:8080 in the step; a SYN arriving through eth0 "
                        "that claims to come from a1's own address is what Linux calls a martian")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"('{live_src}', {live_n})")
