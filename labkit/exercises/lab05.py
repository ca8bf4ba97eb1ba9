"""Lab 05, hairpin: a pod calling its own Service. The server sees the loopback
address, the three rows with LBLoopback, where the reply is rewritten, and a
break-it fault that drops the loopback SNAT.

Graders find the connection by what the notebook fixes (a1, the Service
``self`` backed by a1:8080) and read the client's port from the live rows or
the server's log, never from the answer.
"""
from __future__ import annotations

import re
from typing import Any

from ..checks import Outcome, compare_rows, exercise
from ..maps.ct import CtFlags
from ..topology import LOOPBACK_SNAT_ADDR
from .lab01 import hook_name, kinds_answer, newest, recent_flows, row_kind, unanswered
from .lab04 import conn_rows, dst, is_syn, service, src, svc_rows

_ACCEPT = re.compile(r"tcp accept pod=(\S+) client=([\d.]+):(\d+)")


def _self(lab):
    """(Service self, None) or (None, a failed Outcome saying what to run)."""
    svc = service(lab, "self")
    if svc is None:
        return None, Outcome(False, f"lab '{lab.name}' has no Service 'self': run the cell that adds it "
                                    "(lab.services.add('self', 80, ['a1:8080'])), then check.")
    return svc, None


def _ip(answer: Any) -> str:
    """The address part of ``'1.2.3.4'`` or ``'1.2.3.4:5'``."""
    return str(answer).strip().rpartition(":")[0] if ":" in str(answer) else str(answer).strip()


# -- 05.1 ---------------------------------------------------------------------------------
@exercise(
    "05.1",
    "Who the server thinks called",
    hints=(
        "The request left a1 and came back to a1, but not with a1's address as its source.",
        "Read the last lines of lab.pod('a1').server_log(), or the client= in the GET's answer.",
        f"The answer is '{LOOPBACK_SNAT_ADDR}': Cilium's service loopback address.",
    ),
)
def server_view(answer, lab) -> Outcome:
    """The client address a1's server logged for the newest hairpin connection, tied to its live OUT row."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _self(lab)
    if missing:
        return missing
    accepts = [m for m in map(_ACCEPT.search, lab.pod("a1").server_log()) if m]
    if not accepts:
        return Outcome(False, "a1's server has logged no connection yet: run the GET cell, then check.")
    _, ip, port = accepts[-1].groups()
    a1 = lab.pod("a1").ip
    rows = [r for r in conn_rows(lab, "node-a", int(port), {8080}) if r.dir == "OUT" and r.dst == a1]
    if not rows:
        return Outcome(False, f"the newest connection a1's server logged (from {ip}:{port}) is not one a1 made to "
                              "self: run the GET cell again, then check.")
    if ip != LOOPBACK_SNAT_ADDR or not rows[0].flags & CtFlags.LB_LOOPBACK:
        return Outcome(False, f"a1's server saw {ip}, and the row says [ {' '.join(rows[0].flag_names)} ]: not a "
                              f"hairpin connection as the datapath makes it; faults on: {lab.faults() or 'none'}.")
    got = _ip(answer)
    if got == ip:
        return Outcome(True, f"{ip}: node-a rewrote the source of a1's request to the loopback address, so a1's "
                             "server cannot tell that a1 itself called. Access logs and allow-lists keyed on the "
                             "client address see this address for every pod that calls its own Service.")
    if got == a1:
        return Outcome(False, f"{got} is a1's own address, where the request really came from; that is not what the "
                              "server logged. Read the server log.", (("-", ip, got),))
    return Outcome(False, f"{answer!r} is not the client a1's server logged for the newest connection.",
                   (("-", ip, got),))


# -- 05.2 ---------------------------------------------------------------------------------
@exercise(
    "05.2",
    "The rows that carry LBLoopback",
    hints=(
        "One connection, three TCP rows on node-a; the flag marks the flow after the loopback SNAT.",
        "Print node-a's TCP rows of the connection and look for LBLoopback between Flags=[ ].",
        "The answer is ['TCP OUT', 'TCP IN']: the SVC row, keyed by what a1 sent, has no LBLoopback.",
    ),
)
def loopback_rows(answer, lab) -> Outcome:
    """Kinds of node-a's rows of a1's newest connection to self that carry LBLoopback, live and by the rule."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _self(lab)
    if missing:
        return missing
    svcs = svc_rows(lab, "node-a", svc)
    if not svcs:
        return Outcome(False, "node-a has no TCP SVC row towards self's VIP: run the connection cells, then check.")
    rows = conn_rows(lab, "node-a", newest(svcs).sport, {svc.port, 8080})
    kinds = sorted(row_kind(r) for r in rows)
    live = sorted(row_kind(r) for r in rows if r.flags & CtFlags.LB_LOOPBACK)
    if kinds != ["TCP IN", "TCP OUT", "TCP SVC"] or live != ["TCP IN", "TCP OUT"]:
        return Outcome(False, f"the newest connection to self left {kinds}, with LBLoopback on {live}: not what a "
                              f"hairpin makes; faults on: {lab.faults() or 'none'}. Run lab.reset() and the cells "
                              "from section 1 again.")
    got = kinds_answer(answer)
    if got is None:
        return Outcome(False, f"expected a list of row kinds such as ['TCP SVC'], got {answer!r}.")
    out = compare_rows(live, got, "rows with LBLoopback")
    if out.passed:
        return Outcome(True, f"OUT and IN, both {LOOPBACK_SNAT_ADDR} -> a1:8080: a1 is client and server of one "
                             "flow, so node-a tracks it from both sides, and marks both rows as a loopback flow. The "
                             "SVC row is keyed by what a1 sent (a1 -> VIP) and is an ordinary service row.", out.diff)
    return out


# -- 05.3 ---------------------------------------------------------------------------------
@exercise(
    "05.3",
    "Where the hairpin reply is rewritten",
    hints=(
        "In lab 04 the reply came from node-b and was rewritten on its way into a1. Here the server is a1 itself.",
        "Find the SYN|ACK's line with `=>` in the open step: which hook is it?",
        "The answer is 'from-container': the reply leaves a1 towards 169.254.42.1 and is rewritten, then handed straight back.",
    ),
)
def hairpin_reply_hook(answer, lab) -> Outcome:
    """The hook that rewrote the newest hairpin SYN|ACK back to the VIP, from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _self(lab)
    if missing:
        return missing
    a1 = lab.pod("a1").ip
    replies = [f for f in recent_flows(lab) if f.node == "node-a" and is_syn(f.event.before, ack=True)
               and f.translated and src(f.event.before) == (a1, 8080) and src(f.event.after) == (svc.vip, svc.port)]
    if not replies:
        return Outcome(False, "the trace holds no SYN|ACK from a1:8080 rewritten to self's VIP: run the connection "
                              "cells, then check.")
    f = replies[-1]
    live = f.hook.label
    if live != "from-container" or dst(f.event.before)[0] != LOOPBACK_SNAT_ADDR:
        return Outcome(False, f"the newest hairpin reply was rewritten at {live}, addressed to "
                              f"{dst(f.event.before)[0]}: not what the datapath does; faults on: {lab.faults() or 'none'}.")
    got = hook_name(answer)
    if got == live:
        return Outcome(True, f"from-container: the SYN|ACK leaves a1 addressed to {LOOPBACK_SNAT_ADDR}, the very "
                             "first hook finds the OUT row (ct=reply), rewrites source and destination back to "
                             f"{svc.vip}:{svc.port} -> a1, and hands it straight back into a1 (REDIRECTED). Without "
                             "the loopback SNAT the reply would never leave a1, and nothing could rewrite it.")
    if got == "to-container":
        return Outcome(False, "to-container is where lab 04's reply was rewritten, coming back from node-b; this "
                              "reply is not rewritten there. Find the SYN|ACK's line with `=>`.",
                       (("-", live, got),))
    return Outcome(False, f"{answer!r} is not where this reply was rewritten: find the SYN|ACK's line with `=>`.",
                   (("-", live, got),))


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
)
def no_loopback_snat(answer, lab) -> Outcome:
    """With no-loopback-snat on: (source of the SYN delivered into a1, SYN|ACKs a1 sent), from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "no-loopback-snat" not in lab.faults():
        return Outcome(False, "the fault is off: run the break-it cell (it resets the lab, adds self and switches the "
                              "fault on), then check.")
    a1 = lab.pod("a1").ip
    flows = recent_flows(lab)
    idx = [i for i, f in enumerate(flows) if f.node == "node-a" and f.hook.label == "to-container"
           and is_syn(f.event.before) and dst(f.event.before) == (a1, 8080)]
    if not idx:
        return Outcome(False, "the trace holds no SYN delivered into a1:8080: run the break-it cell, then check.")
    syn = flows[idx[-1]]
    live_src, cp = src(syn.event.before)
    synacks = [f for f in flows[idx[0]:] if f.node == "node-a" and is_syn(f.event.before, ack=True)
               and src(f.event.before) == (a1, 8080) and dst(f.event.before)[1] == cp]
    if live_src != a1:
        return Outcome(False, f"the newest SYN came into a1 from {live_src}: it was made before the fault. Run the "
                              "break-it cell again, then check.")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('address', number of SYN|ACKs), got {answer!r}.")
    got_src, got_n = _ip(answer[0]), answer[1]
    src_ok = got_src == live_src
    n_ok = isinstance(got_n, int) and not isinstance(got_n, bool) and got_n == len(synacks)
    diff = (("=" if src_ok else "-", live_src, got_src), ("=" if n_ok else "-", f"{len(synacks)} SYN|ACK", str(got_n)))
    if src_ok and n_ok:
        return Outcome(True, f"the SYN reached a1 as {live_src} -> {a1}: a packet from the outside claiming a1's own "
                             f"address, a martian source. a1's kernel dropped it without a word ({len(synacks)} "
                             "SYN|ACKs) and connect() timed out. The loopback SNAT exists to avoid exactly this, and "
                             "to make the reply leave a1 so it can be rewritten.", diff)
    problems = []
    if not src_ok:
        problems.append(f"{answer[0]!r} is not the source the SYN carried into a1: read the to-container line of the SYN")
    if not n_ok:
        problems.append(f"{got_n!r}: count the SYN|ACK lines from a1:8080 after the SYNs")
    return Outcome(False, "; ".join(problems) + ".", diff)
