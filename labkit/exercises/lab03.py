"""Lab 03, pod to pod across nodes: OUT on one node and IN on the other, the
RELATED twins at work, same-node traffic, the path through the tunnel and
without it, and a break-it fault.

Rows are named by kind (``"ICMP IN related"``), paths by hook names, so no
answer depends on a random port or ICMP id. The native-routing question reads
the second lab, ``<this lab>-native``.
"""
from __future__ import annotations

import socket
from typing import Any

from ..checks import Outcome, compare_rows, exercise
from ..maps.ct import CtResult
from ..trace import Flow
from .lab01 import addr, hook_name, kinds_answer, recent_flows, row_kind, rows_between, unanswered

_ICMP = socket.IPPROTO_ICMP
_ECHO_REQUEST, _DEST_UNREACH = 8, 3
_TUNNEL_PATH = ["from-container", "to-overlay", "to-netdev"]
_NATIVE_PATH = ["from-container", "to-netdev"]


def _kinds_check(lab, node: str, rows, rule: list[str], answer: Any, what: str, fixup: str) -> Outcome:
    """compare_rows of the learner's kinds with the live kinds, after checking the live rows follow ``rule``."""
    live = sorted({row_kind(r) for r in rows})
    if not live:
        return Outcome(False, f"{node} has no rows for this traffic yet: {fixup}")
    if live != sorted(rule):
        return Outcome(False, f"{node} holds {live} for this traffic, not what the datapath makes here "
                              f"({sorted(rule)}); faults on: {lab.faults() or 'none'}. {fixup}")
    got = kinds_answer(answer)
    if got is None:
        return Outcome(False, f"expected a list of row kinds such as ['UDP OUT', 'ICMP IN related'], got {answer!r}.")
    return compare_rows(live, got, what)


def _hook_list(answer: Any) -> list[str] | None:
    """Hooks in order from a list or from text such as 'from-container -> to-netdev'."""
    if isinstance(answer, str):
        answer = answer.replace("→", ",").replace("->", ",").replace(">", ",").split(",")
    if not isinstance(answer, (list, tuple)):
        return None
    return [hook_name(h) for h in answer if str(h).strip()]


def _request_path(lab, node: str, src: str, dst: str) -> list[Flow]:
    """The records on ``node`` of the newest echo request ``src`` → ``dst``, in order (inner packet too)."""
    s, d = lab.pod(src).ip, lab.pod(dst).ip

    def is_request(t) -> bool:
        return t.proto == _ICMP and t.icmp_type == _ECHO_REQUEST and (addr(t.saddr), addr(t.daddr)) == (s, d)

    flows = [f for f in recent_flows(lab) if f.node == node and (is_request(f.event.before) or is_request(f.event.inner))]
    starts = [i for i, f in enumerate(flows) if f.hook.label == "from-container"]
    if not starts:
        return []
    return flows[starts[-1]:]


def _path_check(answer: Any, live: list[str], rule: list[str], where: str) -> Outcome:
    got = _hook_list(answer)
    if got is None:
        return Outcome(False, f"expected the hooks in order, e.g. ['from-netdev', 'to-container'], got {answer!r}.")
    n = max(len(rule), len(got))
    diff = tuple(
        ("=" if i < len(rule) and i < len(got) and rule[i] == got[i] else "-",
         rule[i] if i < len(rule) else "(nothing)", got[i] if i < len(got) else "(missing)")
        for i in range(n)
    )
    if got == live:
        return Outcome(True, f"{' → '.join(live)}: {where}", diff)
    right = sum(1 for m, _, _ in diff if m == "=")
    return Outcome(False, f"{right} of your {len(got)} hook(s) are in the right place; the echo request met "
                          f"{len(live)} hook(s) on node-a. Read the step's node-a lines of the echo request, in order.",
                   diff)


# -- 03.1 ---------------------------------------------------------------------------------
@exercise(
    "03.1",
    "The rows on the receiving node",
    hints=(
        "node-b first meets the ping when it is delivered into b1; what direction is that from b1's point of view?",
        "Read the step's node-b rows, or run kinds('node-b', 'a1', 'b1').",
        "The answer is ['ICMP IN', 'ICMP IN related'].",
    ),
)
def rows_on_node_b(answer, lab) -> Outcome:
    """Kinds of node-b's ICMP rows of the a1 → b1 ping, live and by the rule."""
    if (blank := unanswered(answer)) is not None:
        return blank
    rows = rows_between(lab, "node-b", "a1", "b1", "ICMP", either_way=True)
    out = _kinds_check(lab, "node-b", rows, ["ICMP IN", "ICMP IN related"], answer,
                       "node-b's rows of the ping a1 → b1", "run lab.reset() and the cross-node ping cell, then check.")
    if out.passed:
        return Outcome(True, "node-b's to-container made an IN row (and its RELATED twin): for node-b the flow came "
                             "in to b1. The OUT rows stay on node-a.", out.diff)
    return out


# -- 03.2 ---------------------------------------------------------------------------------
@exercise(
    "03.2",
    "What lets an ICMP error through",
    hints=(
        "The port-unreachable is a new packet with new addresses, yet node-a lets it into a1.",
        "Find the node-a to-container line of the ICMP DestUnreachable in the UDP step: what does ct= say?",
        "The answer is 'related': the lookup found the RELATED twin made with the UDP row.",
    ),
)
def icmp_error_verdict(answer, lab) -> Outcome:
    """The CT result node-a's to-container gave b1's ICMP error, from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    a1, b1 = lab.pod("a1").ip, lab.pod("b1").ip
    errors = [f for f in recent_flows(lab) if f.node == "node-a" and f.hook.label == "to-container"
              and f.event.before.proto == _ICMP and f.event.before.icmp_type == _DEST_UNREACH
              and (addr(f.event.before.saddr), addr(f.event.before.daddr)) == (b1, a1)]
    if not errors:
        return Outcome(False, "the trace holds no ICMP error from b1 delivered to a1: run the UDP cell "
                              "(lab.pod('a1').udp('b1', 9999)), then check.")
    live = errors[-1].ct_result
    if live != CtResult.RELATED:
        return Outcome(False, f"node-a's to-container gave the ICMP error ct={live.name.lower()}, not the verdict "
                              f"of an error about a known flow: faults on: {lab.faults() or 'none'}. "
                              "Run lab.reset() and the UDP cell again.")
    got = str(answer).strip().lower().removeprefix("ct=").removeprefix("ct_")
    if got.split("/")[0] == "related":
        return Outcome(True, "related: the error matched the RELATED twin (ICMP, ports 0) that was made with the "
                             "UDP flow's row, so it is let in; look how that twin's report time for the error's "
                             "direction moved.")
    names = [r.name.lower() for r in CtResult if r != CtResult.NONE]
    if got not in names:
        return Outcome(False, f"{answer!r} is not a CT result; the results are {', '.join(names)}.")
    return Outcome(False, f"{answer!r}: that is not what node-a's to-container line of the DestUnreachable says "
                          "after ct=.", (("-", "ct= of the ICMP error at to-container", got),))


# -- 03.3 ---------------------------------------------------------------------------------
@exercise(
    "03.3",
    "Both ends on one node",
    hints=(
        "a1 and a2 both sit on node-a, so both hooks that make rows for this ping run on node-a.",
        "Read the step's rows, or run kinds('node-a', 'a1', 'a2').",
        "The answer is ['ICMP OUT', 'ICMP OUT related', 'ICMP IN', 'ICMP IN related'].",
    ),
)
def same_node_rows(answer, lab) -> Outcome:
    """Kinds of node-a's rows of the a1 → a2 ping, live and by the rule."""
    if (blank := unanswered(answer)) is not None:
        return blank
    rows = rows_between(lab, "node-a", "a1", "a2", either_way=True)
    out = _kinds_check(lab, "node-a", rows, ["ICMP OUT", "ICMP OUT related", "ICMP IN", "ICMP IN related"], answer,
                       "node-a's rows of the ping a1 → a2", "run the same-node ping cell, then check.")
    if out.passed:
        return Outcome(True, "from-container of lxc-a1 made the OUT pair and to-container of lxc-a2 the IN pair: "
                             "one node, two endpoints, two sets of rows.", out.diff)
    return out


# -- 03.4 ---------------------------------------------------------------------------------
@exercise(
    "03.4",
    "The echo request's hooks on node-a through the tunnel",
    hints=(
        "The request leaves a1, is encapsulated, and leaves node-a; a hook reports at every device it crosses.",
        "Filter the cross-node step's lines to node-a and the EchoRequest (also inside [vxlan: ...]).",
        "The answer is ['from-container', 'to-overlay', 'to-netdev'].",
    ),
)
def tunnel_path(answer, lab) -> Outcome:
    """Hooks of the newest a1 → b1 echo request on node-a, from the trace, in tunnel mode."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if lab.config.routing != "tunnel":
        return Outcome(False, f"this lab routes {lab.config.routing}; this question is about the tunnel lab (start()).")
    path = _request_path(lab, "node-a", "a1", "b1")
    if not path:
        return Outcome(False, "the trace holds no echo request from a1 to b1 on node-a: run the cross-node ping, then check.")
    live = [f.hook.label for f in path]
    if live != _TUNNEL_PATH:
        return Outcome(False, f"the newest echo request met {live} on node-a, not the tunnel path; "
                              f"faults on: {lab.faults() or 'none'}. Run the cross-node ping again, then check.")
    return _path_check(answer, live, _TUNNEL_PATH, "from-container redirects it to cilium_vxlan (to-overlay), which "
                       "encapsulates it; eth0's to-netdev sees the outer UDP packet with the ping inside.")


# -- 03.5 ---------------------------------------------------------------------------------
@exercise(
    "03.5",
    "The same request with native routing",
    hints=(
        "Without a tunnel there is no cilium_vxlan device at all.",
        "Print the native step's lines for node-a and the EchoRequest.",
        "The answer is ['from-container', 'to-netdev'].",
    ),
)
def native_path(answer, lab) -> Outcome:
    """Hooks of the newest a1 → b1 echo request on node-a of the native lab, from its trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    from ..lab import Lab

    name = f"{lab.name}-native"
    try:
        native = Lab.attach(name)
    except Exception:
        return Outcome(False, f"the native lab '{name}' is not up: run the cell with Lab.up(..., routing='native'), "
                              "then the ping in it, then check.")
    path = _request_path(native, "node-a", "a1", "b1")
    if not path:
        return Outcome(False, f"the trace of '{name}' holds no echo request from a1 to b1 on node-a: run the native "
                              "ping, then check.")
    live = [f.hook.label for f in path]
    if live != _NATIVE_PATH:
        return Outcome(False, f"the native lab's newest echo request met {live} on node-a, not the native path.")
    return _path_check(answer, live, _NATIVE_PATH, "node-a's kernel routes the request itself, straight out of eth0, "
                       "with the pod addresses on the wire: no encapsulation, no to-overlay.")


# -- 03.6 (break it) ----------------------------------------------------------------------
@exercise(
    "03.6",
    "Break it: what node-b believes",
    hints=(
        "Under this fault one hook makes no rows; the reply then looks like something else to node-b.",
        "Run kinds('node-b', 'a1', 'b1'), and look at which address comes first in node-b's lines.",
        "The answer is ['ICMP OUT', 'ICMP OUT related']: no IN rows; b1's reply made OUT rows as if b1 had started.",
    ),
    break_it=True,
)
def no_in_entry(answer, lab) -> Outcome:
    """With no-in-entry on: the kinds of node-b's rows for the a1 ↔ b1 ping, live, with no IN row."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "no-in-entry" not in lab.faults():
        return Outcome(False, "the fault is off: run the break-it cell (it resets the lab and switches the fault on), "
                              "then the ping after it, then check.")
    rows = rows_between(lab, "node-b", "a1", "b1", "ICMP", either_way=True)
    if not rows:
        return Outcome(False, "node-b has no rows for a1 ↔ b1: run the ping under the fault, then check.")
    if any(r.dir == "IN" for r in rows):
        return Outcome(False, "node-b still has IN rows from before the fault: run the break-it cell again "
                              "(it resets the lab first), then check.")
    out = _kinds_check(lab, "node-b", rows, ["ICMP OUT", "ICMP OUT related"], answer,
                       "node-b's rows of the ping under the fault", "run the break-it cell and its ping again.")
    if out.passed:
        b1 = lab.pod("b1").ip
        firsts = sorted({r.src for r in rows})
        return Outcome(True, f"no IN row: to-container let the request in without writing one, so b1's reply looked "
                             f"new at from-container and got OUT rows that start at {', '.join(firsts)} "
                             f"({'b1' if firsts == [b1] else 'see the lines'}): node-b believes b1 opened the flow.",
                       out.diff)
    return out
