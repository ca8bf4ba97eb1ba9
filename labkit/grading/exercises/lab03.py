"""Lab 03, pod to pod across nodes: OUT on one node and IN on the other, the RELATED twins at work, same-node
traffic, the path through the tunnel and without it, and a break-it fault.

Graders read what the notebook's cells recorded: the cross-node ping a1 → b1 of section 1 (its rows and its
trace, which section 4 reads again), the UDP datagram to b1's closed port and the ICMP error it drew
(section 2), the ping a1 → a2 (section 3), the ping in the second lab ``<lab>-native`` (section 5,
``ev.variant("native")``) and the ping taken with section 6's fault on. Steps taken under that fault
(``no-in-entry``) never answer the questions of sections 1-4. Rows are named by kind (``"ICMP IN related"``),
paths by hook names, so no answer depends on a random port or ICMP id.
"""
from __future__ import annotations

import socket
from typing import Any

from labkit.addr import ipv4
from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.maps.ct import CtResult
from labkit.grading.exercises.common import broken_step, hook_name, kinds_answer, row_kind, step_rows, touched, unhealthy

ACROSS, RELATED, SAME, TUNNEL, NATIVE, BREAK = (
    "1. Across nodes: OUT here, IN there", "2. The RELATED twins at work", "3. Both ends on one node",
    "4. Through the tunnel", "5. Tunnel and native routing, side by side", "6. Break it")
_ICMP = socket.IPPROTO_ICMP
_ECHO_REQUEST, _DEST_UNREACH = 8, 3
_TUNNEL_PATH = ["from-container", "to-overlay", "to-netdev"]
_NATIVE_PATH = ["from-container", "to-netdev"]


def _ping(ev, target: str = "b1"):
    """The newest ping from a1 to ``target`` taken outside section 6's fault, or failing that under it (so that the
    check can say the fault was on)."""
    return (ev.step(op="ping", actor="a1", target=target, faults=lambda f: "no-in-entry" not in f)
            or ev.step(op="ping", actor="a1", target=target))


def _kinds(step, node: str, ips: set[str], proto: str | None = "ICMP") -> list[str]:
    """Kinds of ``node``'s rows between the pods at ``ips`` after the step (twins too), sorted, one per kind."""
    return sorted({row_kind(r) for r in step_rows(step, node, proto, related=None) if {r.src, r.dst} <= ips})


def _kinds_outcome(live: list[str], answer: Any, what: str, messages: dict[frozenset, str]) -> Outcome:
    """compare_rows of the learner's kinds with the recorded ones; a wrong answer that a misconception explains
    gets that misconception's message (``messages``: the answer's set of kinds -> message)."""
    got = kinds_answer(answer)
    if got is None:
        return Outcome(False, f"expected a list of row kinds such as ['UDP OUT', 'ICMP IN related'], got {answer!r}.")
    out = compare_rows(live, got, what)
    if out.passed:
        return out
    msg = messages.get(frozenset(got), out.message)
    return Outcome(False, msg, out.diff, reveal=out.reveal)


def _ping_kinds(ev, answer: Any, target: str, node: str, rule: list[str], cell: str,
                messages: dict[frozenset, str]) -> Outcome:
    """The learner's kinds against ``node``'s rows after the ping from a1 to ``target``, which must follow ``rule``."""
    step = _ping(ev, target)
    if step is None:
        return Outcome.needs(cell, f"the ping from a1 to {target} records the rows it left")
    what = f"the ping a1 → {target}"
    live = _kinds(step, node, {ev.topology.pod("a1").ip, ev.topology.pod(target).ip})
    if live != sorted(rule):
        return unhealthy(cell, f"{node} holding {live or 'no rows'} for {what}", step)
    return _kinds_outcome(live, answer, f"{node}'s rows of {what}", messages)


def _request_path(step, node: str, a: str, b: str):
    """The records on ``node`` of the step's echo request from address ``a`` to ``b`` (inner packet too), in order."""

    def is_request(t) -> bool:
        return t.proto == _ICMP and t.icmp_type == _ECHO_REQUEST and (ipv4(t.saddr), ipv4(t.daddr)) == (a, b)

    flows = [f for f in step.flows if f.node == node and (is_request(f.event.before) or is_request(f.event.inner))]
    starts = [i for i, f in enumerate(flows) if f.hook.label == "from-container"]
    return flows[starts[0]:] if starts else []


def _hook_list(answer: Any) -> list[str] | None:
    """Hooks in order from a list or from text such as 'from-container -> to-netdev'."""
    if isinstance(answer, str):
        answer = answer.replace("→", ",").replace("->", ",").replace(">", ",").split(",")
    if not isinstance(answer, (list, tuple)):
        return None
    return [hook_name(h) for h in answer if str(h).strip()]


def _path_outcome(answer: Any, live: list[str], where: str, messages: dict[tuple, str]) -> Outcome:
    """The learner's hooks against the recorded path, position by position."""
    got = _hook_list(answer)
    if got is None:
        return Outcome(False, f"expected the hooks in order, e.g. ['from-netdev', 'to-container'], got {answer!r}.")
    n = max(len(live), len(got))
    diff = tuple(
        ("=" if i < len(live) and i < len(got) and live[i] == got[i] else "-",
         live[i] if i < len(live) else "(nothing)", got[i] if i < len(got) else "(missing)")
        for i in range(n)
    )
    if got == live:
        return Outcome(True, f"{' → '.join(live)}: {where}", diff)
    right = sum(1 for m, _, _ in diff if m == "=")
    msg = messages.get(tuple(got), f"{right} of your {len(got)} hook(s) are in the right place. Read the step's "
                                   "node-a lines of the echo request, in order.")
    return Outcome(False, msg, diff, reveal=" → ".join(live))


# -- 03.1 ---------------------------------------------------------------------------------
@exercise(
    "03.1",
    "The rows on the receiving node",
    hints=(
        "node-b first meets the ping when it is delivered into b1; what direction is that from b1's point of view?",
        "Read the step's node-b rows, or run kinds('node-b', 'a1', 'b1').",
        "The answer is ['ICMP IN', 'ICMP IN related'].",
    ),
    fault="no-in-entry",
    cells=(ACROSS,),
)
def rows_on_node_b(answer, ev) -> Outcome:
    """Kinds of node-b's ICMP rows after the cross-node ping, recorded and by the rule."""
    out = _ping_kinds(ev, answer, "b1", "node-b", ["ICMP IN", "ICMP IN related"], ACROSS, {
        frozenset({"ICMP OUT", "ICMP OUT related"}):
            "OUT and IN are not the direction on the wire: each node names a row from its own pod's side, and b1 "
            "did not start this ping.",
        frozenset({"ICMP IN"}): "node-b's hook wrote a twin too: every row a pod's hook creates gets one, on either "
                                "node.",
        frozenset({"ICMP OUT", "ICMP IN"}): "node-b holds no row for a1's side of the ping: node-a's rows stay on "
                                            "node-a, and each node has only its own.",
    })
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
        "The answer is 'related': the lookup found the RELATED twin written with the UDP row.",
    ),
    fault="no-out-entry",
    cells=(RELATED,),
)
def icmp_error_verdict(answer, ev) -> Outcome:
    """The CT result node-a's to-container gave b1's ICMP error, from the UDP step's trace, with the UDP row and
    its twin on node-a."""
    step = ev.step(op="udp", actor="a1", target="b1", port=9999)
    if step is None:
        return Outcome.needs(RELATED, "the datagram to b1's port 9999 records the ICMP error it draws")
    a1, b1 = ev.topology.pod("a1").ip, ev.topology.pod("b1").ip
    flow = [r for r in touched(step, "node-a") if r.proto_name == "UDP" and r.dir == "OUT" and not r.related
            and (r.src, r.dst, r.dport) == (a1, b1, 9999)]
    twin = [r for r in step_rows(step, "node-a", "ICMP", "OUT", related=True) if (r.src, r.dst) == (a1, b1)]
    errors = [f for f in step.flows if f.node == "node-a" and f.hook.label == "to-container"
              and f.event.before.proto == _ICMP and f.event.before.icmp_type == _DEST_UNREACH
              and (ipv4(f.event.before.saddr), ipv4(f.event.before.daddr)) == (b1, a1)]
    if not flow or not twin or not errors:
        saw = ("no UDP OUT row on node-a for the datagram" if not flow else "no RELATED twin on node-a" if not twin
               else "no ICMP error from b1 reaching node-a's to-container")
        return unhealthy(RELATED, saw, step)
    live = errors[-1].ct_result
    if live != CtResult.RELATED:
        return unhealthy(RELATED, f"node-a's to-container giving the ICMP error ct={live.name.lower()}", step)
    got = str(answer).strip().lower().removeprefix("ct=").removeprefix("ct_").split("/")[0]
    if got == "related":
        return Outcome(True, "related: the error matched the RELATED twin (ICMP, ports 0) that was written with the "
                             "UDP flow's row, so it is let in; look how that twin's report time for the error's "
                             "direction moved.")
    names = [r.name.lower() for r in CtResult if r != CtResult.NONE]
    if got not in names:
        return Outcome(False, f"{answer!r} is not a CT result; the results are {', '.join(names)}.")
    diff = (("-", "ct= of the ICMP error at node-a's to-container", got),)
    msg = {
        "established": "the error is ICMP, not UDP: it carries none of the flow's ports, so it cannot match the UDP "
                       "row itself. It matched a row all the same.",
        "new": "a packet that finds no row is new, but the error did find one: node-a let it into a1 because the flow "
               "it is about was known.",
        "reply": "reply is what the flow's own packets back from b1 get; the error is not part of the flow, it is "
                 "about the flow.",
    }[got]
    return Outcome(False, msg, diff, reveal="'related'")


# -- 03.3 ---------------------------------------------------------------------------------
@exercise(
    "03.3",
    "Both ends on one node",
    hints=(
        "a1 and a2 both sit on node-a, so both hooks that make rows for this ping run on node-a.",
        "Read the step's rows, or run kinds('node-a', 'a1', 'a2').",
        "The answer is ['ICMP OUT', 'ICMP OUT related', 'ICMP IN', 'ICMP IN related'].",
    ),
    fault="no-related",
    cells=(SAME,),
)
def same_node_rows(answer, ev) -> Outcome:
    """Kinds of node-a's rows after the ping a1 → a2, recorded and by the rule."""
    out = _ping_kinds(ev, answer, "a2", "node-a", ["ICMP OUT", "ICMP OUT related", "ICMP IN", "ICMP IN related"],
                      SAME, {
                          frozenset({"ICMP OUT", "ICMP OUT related"}):
                              "node-a holds the rows of two endpoints here: each pod's hook tracks the flow from its "
                              "own pod's side, even when both pods share the node.",
                          frozenset({"ICMP OUT", "ICMP IN"}):
                              "every row a pod's hook creates gets its twin, whether the other pod is on the same "
                              "node or not.",
                      })
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
    fault="no-tunnel",
    cells=(ACROSS,),
)
def tunnel_path(answer, ev) -> Outcome:
    """Hooks of the cross-node ping's echo request on node-a, from its trace, in tunnel mode."""
    if ev.config.routing != "tunnel":
        return Outcome(False, f"this lab routes {ev.config.routing}; this question is about the tunnel lab: run the "
                              "setup cell as the notebook has it (start()).", missing="Run this cell")
    step = _ping(ev)
    if step is None:
        return Outcome.needs(ACROSS, "the ping from a1 to b1 records each hook's line")
    path = _request_path(step, "node-a", ev.topology.pod("a1").ip, ev.topology.pod("b1").ip)
    live = [f.hook.label for f in path]
    if not step.ok or any(f.dropped for f in path) or live != _TUNNEL_PATH:
        return unhealthy(ACROSS, f"an echo request that met {live or 'no hook'} on node-a"
                                 f"{', dropped' if any(f.dropped for f in path) else ''}", step)
    return _path_outcome(answer, live, "from-container redirects it to cilium_vxlan (to-overlay), which encapsulates "
                         "it; eth0's to-netdev sees the outer UDP packet with the ping inside.", {
                             ("from-container", "to-netdev"):
                                 "node-a's lines of the request show it crossing one more device before eth0: it was "
                                 "encapsulated on node-a, by a device with a hook of its own.",
                             ("from-container", "to-overlay", "to-netdev", "from-netdev", "from-overlay",
                              "to-container"):
                                 "the question is about node-a only: the last three of your hooks ran on node-b.",
                             ("to-container", "to-overlay", "to-netdev"):
                                 "the first hook is named from node-a's side of lxc-a1: to-container is for packets "
                                 "on their way into a pod.",
                         })


# -- 03.5 ---------------------------------------------------------------------------------
@exercise(
    "03.5",
    "The same request with native routing",
    hints=(
        "Without a tunnel there is no cilium_vxlan device at all.",
        "Print the native step's lines for node-a and the EchoRequest.",
        "The answer is ['from-container', 'to-netdev'].",
    ),
    fault="no-fib",
    cells=(NATIVE,),
)
def native_path(answer, ev) -> Outcome:
    """Hooks of the echo request on node-a of the native lab, from the native ping's trace."""
    step = ev.variant("native").step(op="ping", actor="a1", target="b1")
    if step is None or step.lab.config.routing != "native":
        return Outcome.needs(NATIVE, "it starts the native lab and pings from a1 to b1 in it")
    path = _request_path(step, "node-a", ev.topology.pod("a1").ip, ev.topology.pod("b1").ip)
    live = [f.hook.label for f in path]
    dropped = any(f.dropped for f in path)
    if not step.ok or dropped or live != _NATIVE_PATH:
        return unhealthy(NATIVE, f"a native echo request that met {live or 'no hook'} on node-a"
                                 f"{', dropped' if dropped else ''}{'' if step.ok else ', unanswered'}", step)
    return _path_outcome(answer, live, "node-a's kernel routes the request itself, straight out of eth0, with the pod "
                         "addresses on the wire: no encapsulation, no to-overlay.", {
                             tuple(_TUNNEL_PATH): "the native lab has no tunnel device: nothing on node-a encapsulated "
                                                  "this request.",
                             ("from-container",): "node-a's eth0 carries a hook in native routing too, and the request "
                                                  "left through it.",
                         })


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
    cells=(BREAK,),
)
def no_in_entry(answer, ev) -> Outcome:
    """With no-in-entry on: the kinds of node-b's rows for the a1 ↔ b1 ping, recorded, with no IN row."""
    step, missing = broken_step(ev, "no-in-entry", BREAK, "it switches the fault on, empties the CT maps and pings "
                                "twice", op="ping", actor="a1", target="b1")
    if missing:
        return missing
    a1, b1 = ev.topology.pod("a1").ip, ev.topology.pod("b1").ip
    rows = [r for r in step_rows(step, "node-b", "ICMP", related=None) if {r.src, r.dst} == {a1, b1}]
    live = sorted({row_kind(r) for r in rows})
    if not rows or any(r.dir == "IN" for r in rows):
        return Outcome(False, f"your cells recorded node-b holding {live or 'no rows'} for the ping, not the rows this "
                              f"question is about: run the cells under '{BREAK}' again (the fault, then the cell that "
                              "empties the maps and pings).", missing=BREAK)
    out = _kinds_outcome(live, answer, "node-b's rows of the ping under the fault", {
        frozenset(): "node-b does hold rows for this ping: the fault stopped one hook from writing, not the other.",
        frozenset({"ICMP IN", "ICMP IN related"}):
            "under this fault node-b wrote no IN row at all: read the direction word of node-b's lines again.",
    })
    if out.passed:
        firsts = sorted({r.src for r in rows})
        return Outcome(True, f"no IN row: to-container let the request in without writing one, so b1's reply looked "
                             f"new at from-container and got OUT rows that start at {', '.join(firsts)} "
                             f"({'b1' if firsts == [b1] else 'see the lines'}): node-b believes b1 opened the flow.",
                       out.diff)
    return out
