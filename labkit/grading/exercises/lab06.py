"""Lab 06, socket LB against per-packet LB: the same connection in two labs, the rows and the first SYN of
each, what ``getpeername()`` says and why, a Service without backends, and a break-it fault that only one of
them survives.

The main lab (``start()``) leaves pods to the per-packet path (``socket_lb='hostns'``); the second,
``<this lab>-socklb``, rewrites ``connect()`` in every pod (``socket_lb='full'``). Answers are dicts keyed
``'per-packet'`` and ``'socket'``. Graders read the steps each lab recorded: a1's connections to ``web``
(section 2; those taken under section 5's fault are left out) and to ``empty`` (section 4), and the
connections of section 5, taken with the fault on in both labs.
"""
from __future__ import annotations

import socket
from typing import Any

from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.constants import Hook, TraceFlags
from labkit.grading.exercises.common import (ab_answer, addr_port, dst, flatten, is_syn, kinds_answer, row_kind, src, step_rows,
                     unhealthy, words)

SAME, EMPTY, BREAK = "2. The same connection, two ways", "4. A Service without backends", "5. Break it"
_FAULT = "skip-rev-nat"  #: section 5's fault, switched on in both labs
_KEYS = {
    "per-packet": ("perpacket", "per-packet-lb", "packet", "per", "tc", "hostns", "main"),
    "socket": ("socket-lb", "socketlb", "socklb", "sock", "full"),
}
_EXAMPLE = "{'per-packet': ..., 'socket': ...}"


def _steps(ev, target: str = "web", broken: bool = False) -> dict | None:
    """a1's newest open step to ``target`` in each lab ({'per-packet': step, 'socket': step}), taken with
    section 5's fault on (``broken``) or without it; None when one lab has none."""
    faults = (lambda f: _FAULT in f) if broken else (lambda f: _FAULT not in f)
    found = {which: e.step(op="tcp-open", actor="a1", target=target, port=80, faults=faults)
             for which, e in (("per-packet", ev), ("socket", ev.variant("socklb")))}
    return found if all(found.values()) else None


def _syn_at(step, hook: Hook, ack: bool = False) -> list:
    """node-a's records at ``hook`` of the step's SYNs (or SYN|ACKs), in time order."""
    return [f for f in step.flows if f.node == "node-a" and f.hook == hook and is_syn(f.event.before, ack)]


def _rows(step) -> list[str]:
    """Kinds of node-a's TCP rows of the step's connection (a1's client port)."""
    cp = step.attrs["sport"]
    return sorted({row_kind(r) for r in step_rows(step, "node-a", "TCP") if cp in (r.sport, r.dport)})


def _dict(answer: Any) -> dict | None:
    """A dict answer keyed 'per-packet' and 'socket' (other spellings forgiven), else None."""
    out = ab_answer(answer, _KEYS)
    return out if out is not None and set(out) == set(_KEYS) else None


def _bad_dict(answer: Any, what: str) -> Outcome:
    return Outcome.unreadable(f"expected a dict {_EXAMPLE} with {what} for each lab, got {answer!r}.")


#: What a lab's value normalises to when it names several possibilities where one is asked for.
SEVERAL = "(several)"


def _name_one(got: dict, norm: dict, what: str) -> Outcome | None:
    """An unreadable Outcome when a lab's value names several possibilities (``norm`` says SEVERAL), else None."""
    several = [k for k, v in norm.items() if v == SEVERAL]
    if not several:
        return None
    return Outcome.unreadable("; ".join(f"{k}: {got[k]!r} names several {what}" for k in several)
                              + ": name one for each lab.")


def _pair_diff(live: dict, got: dict) -> tuple:
    return tuple(("=" if got[k] == v else "-", f"{k}: {v}", f"{k}: {got[k]}") for k, v in live.items())


# -- 06.1 ---------------------------------------------------------------------------------
@exercise(
    "06.1",
    "The rows of the same connection, per packet and at the socket",
    hints=(
        "In one lab nothing on the packet path ever sees the VIP.",
        "Compare the two row listings of section 2: which kind of row is missing on one side?",
        "The answer is {'per-packet': ['TCP SVC', 'TCP OUT'], 'socket': ['TCP OUT']}.",
    ),
    fault="no-svc-entry",
    cells=(SAME,),
)
def rows_each_way(answer, ev) -> Outcome:
    """Kinds of node-a's TCP rows of a1's connection to web in both labs, right after each open."""
    steps = _steps(ev)
    if steps is None:
        return Outcome.needs(SAME, "it opens a connection to web in both labs")
    live = {which: _rows(step) for which, step in steps.items()}
    rule = {"per-packet": ["TCP OUT", "TCP SVC"], "socket": ["TCP OUT"]}
    if live != rule or not all(s.ok for s in steps.values()):
        sick = steps["per-packet"] if live["per-packet"] != rule["per-packet"] else steps["socket"]
        return unhealthy(SAME, f"node-a's rows {live} for the two connections", sick)
    got = _dict(answer)
    if got is None or any(kinds_answer(v) is None for v in got.values()):
        return _bad_dict(answer, "a list of row kinds")
    got = {k: sorted(set(kinds_answer(v))) for k, v in got.items()}
    out = compare_rows(flatten(live), flatten(got), "node-a's TCP rows in the two labs")
    if out.passed:
        return Outcome(True, "per packet, from-container met the VIP and made an SVC row before the OUT row; with "
                             "socket LB, connect() was pointed at the backend before any packet existed, so the "
                             "datapath only ever saw a1 talking to a pod: an OUT row, no SVC row.", out.diff)
    problems = []
    if "TCP SVC" in got["socket"]:
        problems.append("in the socket-LB lab no packet ever carried the VIP: the datapath had nothing to make a "
                        "service row from")
    elif not got["socket"]:
        problems.append("the socket-LB connection's packets still crossed from-container: pod-to-pod traffic is "
                        "tracked like any other")
    if "TCP SVC" in got["per-packet"] and "TCP OUT" not in got["per-packet"]:
        problems.append("per packet, from-container tracks the translated flow too: the SVC row only remembers the "
                        "backend")
    msg = "; ".join(problems) + "." if problems else out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 06.2 ---------------------------------------------------------------------------------
def _vip_or_backend(value: Any, vip: str, pods: dict[str, str]) -> str:
    """'VIP' or 'backend' for a learner's word or address (pods: address -> name), SEVERAL when it names both;
    else the value."""
    text = str(value).strip().lower()
    host = text.rpartition(":")[0] if ":" in text else text
    is_vip = host == vip or any(w in text for w in ("vip", "service", "clusterip"))
    is_backend = host in pods or host in pods.values() or any(w in text for w in ("backend", "pod"))
    if is_vip and is_backend:
        return SEVERAL
    return "VIP" if is_vip else "backend" if is_backend else str(value)


@exercise(
    "06.2",
    "Where the first SYN is addressed",
    hints=(
        "Read the first node-a line of each SYN, at from-container: its destination, before any `=>`.",
        "Print the SYN's from-container line of each open step (the first line of each).",
        "The answer is {'per-packet': 'VIP', 'socket': 'backend'}.",
    ),
    fault="no-out-entry",
    cells=(SAME,),
)
def first_syn(answer, ev) -> Outcome:
    """Whether a1's first SYN to web met from-container addressed to the VIP or a backend, in both labs."""
    steps = _steps(ev)
    if steps is None:
        return Outcome.needs(SAME, "it opens a connection to web in both labs")
    pods = {p.ip: p.name for p in ev.topology.pods}
    vip = steps["per-packet"].attrs["dst"]
    live, seen = {}, {}
    for which, step in steps.items():
        syns = _syn_at(step, Hook.FROM_CONTAINER)
        if not syns or not step.ok:
            return unhealthy(SAME, f"the {which} connection {'failing' if syns else 'with no SYN at from-container'}",
                             step)
        to = dst(syns[0].event.before)
        seen[which] = f"{to[0]}:{to[1]}" + (" => " + "{}:{}".format(*dst(syns[0].event.after))
                                            if syns[0].translated else "")
        live[which] = "VIP" if to == (vip, 80) and syns[0].translated else "backend" if to[0] in pods else "?"
    if live != {"per-packet": "VIP", "socket": "backend"}:
        return unhealthy(SAME, f"the first SYNs at from-container {seen}", steps["per-packet"])
    got = _dict(answer)
    if got is None:
        return _bad_dict(answer, "'VIP' or 'backend'")
    norm = {k: _vip_or_backend(v, vip, pods) for k, v in got.items()}
    several = _name_one(got, norm, "destinations")
    if several:
        return several
    diff = _pair_diff(live, norm)
    if norm == live:
        return Outcome(True, f"per packet the SYN leaves a1 for {seen['per-packet']}: from-container rewrites it; "
                             f"with socket LB it leaves a1 already addressed to {seen['socket']}: cgroup/connect4 "
                             "rewrote the address connect() was given, and no packet ever carries the VIP.", diff)
    problems = []
    if norm["socket"] != live["socket"]:
        problems.append("in the socket-LB lab the SYN's from-container line has no `=>`: connect() was pointed "
                        "elsewhere before the SYN existed")
    if norm["per-packet"] != live["per-packet"]:
        problems.append("per packet nothing in a1 picks a backend: from-container is the first to see the SYN, and "
                        "it rewrites it (`=>`)")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=str(live))


# -- 06.3 ---------------------------------------------------------------------------------
@exercise(
    "06.3",
    "What getpeername() says",
    hints=(
        "Applications must not notice the load balancing, whichever path does it.",
        "Print each open step's result['peer'], and dump cilium_lb4_reverse_sk of the socket-LB lab.",
        "The answer is {'per-packet': '198.19.0.10:80', 'socket': '198.19.0.10:80'}: the VIP in both.",
    ),
    fault="skip-rev-nat",
    cells=(SAME,),
)
def peer_name(answer, ev) -> Outcome:
    """The peer a1's socket reported in each lab's open step, against the reverse-NATed reply (per packet) and
    the backend the socket really reached (socket LB)."""
    steps = _steps(ev)
    if steps is None:
        return Outcome.needs(SAME, "it opens a connection to web in both labs; each step keeps getpeername()")
    per, sock = steps["per-packet"], steps["socket"]
    vip = f"{per.attrs['dst']}:80"
    pods = {p.ip for p in ev.topology.pods}
    replies = _syn_at(per, Hook.TO_CONTAINER, ack=True)
    if not per.ok or not replies or "{}:{}".format(*src(replies[-1].event.after)) != vip \
            or per.result.get("peer") != vip:
        return unhealthy(SAME, f"the per-packet connection {'opened' if per.ok else 'failing'}, its socket's peer "
                               f"{per.result.get('peer')}", per)
    real = str(sock.result.get("real_peer") or "")
    if not sock.ok or sock.result.get("peer") != vip or real.rpartition(":")[0] not in pods:
        return unhealthy(SAME, f"the socket-LB connection's socket showing {sock.result.get('peer')}, really "
                               f"connected to {real or 'nothing'}", sock)
    live = {"per-packet": vip, "socket": vip}
    got = _dict(answer)
    if got is None:
        return _bad_dict(answer, "an 'address:port'")
    norm = {k: addr_port(v, ev.topology) or str(v).strip() for k, v in got.items()}
    diff = _pair_diff(live, norm)
    if norm == live:
        return Outcome(True, "the VIP in both: per packet because to-container rewrites every reply's source back to "
                             f"it; with socket LB because the socket really is connected to the backend ({real}), and "
                             "cgroup/getpeername4 looks the socket up in cilium_lb4_reverse_sk and answers with the "
                             "VIP stored there.", diff)
    problems = []
    if norm["socket"] != vip:
        problems.append("a pod's address is what the packets carry in the socket-LB lab, but not what getpeername() "
                        "answers: it reads cilium_lb4_reverse_sk" if norm["socket"].rpartition(":")[0] in pods
                        else f"socket: {got['socket']!r} is not what a1's socket reported")
    if norm["per-packet"] != vip:
        problems.append("per packet, to-container rewrote every reply's source before a1 saw it: the socket never met "
                        "the backend" if norm["per-packet"].rpartition(":")[0] in pods
                        else f"per-packet: {got['per-packet']!r} is not what a1's socket reported")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=str(live))


# -- 06.4 ---------------------------------------------------------------------------------
def _failure(value: Any) -> str:
    """A learner's failure in canonical form: the errno name (a drop reason stays as written); SEVERAL when the
    value names more than one errno (a list of every possible error is not an answer).

    >>> _failure("connection refused"), _failure(["ECONNREFUSED", "EHOSTUNREACH"]) == SEVERAL
    ('ECONNREFUSED', True)
    """
    text = str(value).strip().lower()
    named = [errno for errno, spellings in (("EHOSTUNREACH", ("ehostunreach", "no route to host", "113")),
                                            ("ECONNREFUSED", ("econnrefused", "refused", "port unreachable", "111")),
                                            ("ETIMEDOUT", ("etimedout", "timeout", "timed out", "110")))
             if any(w in text for w in spellings)]
    return named[0] if len(named) == 1 else SEVERAL if named else str(value)


@exercise(
    "06.4",
    "A Service with no backends",
    hints=(
        "One lab answers the SYN, the other never sends one.",
        "Read each step's result['error'] (and the per-packet from-container line: what came back to a1?).",
        "The answer is {'per-packet': 'ECONNREFUSED', 'socket': 'EHOSTUNREACH'}.",
    ),
    fault="sock-no-reject",
    cells=(EMPTY,),
)
def no_backends(answer, ev) -> Outcome:
    """How a1's connection to a Service without backends failed in each lab: per packet, from-container answers
    the SYN with ICMP port unreachable (v1.16's --service-no-backend-response=reject), which connect() reports
    as ECONNREFUSED; with socket LB, connect() itself fails with EHOSTUNREACH."""
    steps = _steps(ev, "empty")
    if steps is None:
        return Outcome.needs(EMPTY, "it connects to 'empty' in both labs")
    per, sock = steps["per-packet"], steps["socket"]
    # The notebook's faults are switched on in its main lab only, where this fault has nothing to act on: a
    # step recorded with any fault on is not the world this question is about either.
    for step in steps.values():
        if step.attrs.get("faults"):
            return unhealthy(EMPTY, "the connections to 'empty' made with a fault on", step)
    answered = [f for f in _syn_at(per, Hook.FROM_CONTAINER) if f.event.flags & TraceFlags.NO_BACKEND_REPLY]
    sent = [f for f in sock.flows if f.event.before.proto == socket.IPPROTO_TCP]
    if per.ok or per.result.get("error") != "ECONNREFUSED" or not answered:
        return unhealthy(EMPTY, f"the per-packet connect() ending in {per.result.get('error') or 'success'} with "
                                f"{len(answered)} SYN(s) answered by from-container", per)
    if sock.ok or sock.result.get("error") != "EHOSTUNREACH" or sent:
        return unhealthy(EMPTY, f"the socket-LB connect() ending in {sock.result.get('error') or 'success'} after "
                                f"{len(sent)} TCP packet record(s)", sock)
    live = {"per-packet": "ECONNREFUSED", "socket": "EHOSTUNREACH"}
    got = _dict(answer)
    if got is None:
        return _bad_dict(answer, "what connect() returned (an errno name)")
    norm = {k: _failure(v) for k, v in got.items()}
    several = _name_one(got, norm, "errors")
    if several:
        return several
    diff = _pair_diff(live, norm)
    if norm == live:
        return Outcome(True, "per packet, the SYN leaves a1 and from-container finds a head with count=0: as a v1.16 "
                             "node does by default (--service-no-backend-response=reject) it turns the SYN into an "
                             "ICMP port unreachable from the VIP and hands it back to a1, and connect() fails with "
                             f"ECONNREFUSED ({per.seconds:.2f} s). At the socket, connect() itself finds count=0 and "
                             f"fails with EHOSTUNREACH ({sock.seconds:.2f} s): no packet at all.", diff)
    problems = []
    if norm["per-packet"] != live["per-packet"]:
        if "not found" in norm["per-packet"].lower() or "158" in norm["per-packet"]:
            problems.append("per-packet: the SYN was not simply dropped: from-container answered it with ICMP port "
                            "unreachable (its line says redirected); the question asks what connect() returned")
        elif norm["per-packet"] == "ETIMEDOUT":
            problems.append(f"per-packet: connect() did not wait: it failed after {per.seconds:.2f} s; read the "
                            "step's result['error']")
        else:
            problems.append(f"per-packet: {got['per-packet']!r}: the SYN did leave a1 there and something answered "
                            "it; read the step's result['error']")
    if norm["socket"] != live["socket"]:
        if norm["socket"] == "ETIMEDOUT":
            problems.append(f"connect() did not wait in the socket-LB lab: it failed after {sock.seconds:.2f} s; read "
                            "the step's result['error']")
        else:
            problems.append(f"socket: {got['socket']!r}: in the socket-LB lab no packet left a1 at all; connect() "
                            "itself failed, read the step's result['error']")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=str(live))


# -- 06.5 (break it) ----------------------------------------------------------------------
@exercise(
    "06.5",
    "Break it: reverse NAT switched off",
    hints=(
        "Which of the two paths needs to rewrite the replies at all?",
        "Compare the two steps' results, and look for `=>` on the SYN|ACK's to-container line in each lab.",
        "The answer is 'socket': with socket LB the packets never carried the VIP, so there is nothing to reverse.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def skip_rev_nat_both(answer, ev) -> Outcome:
    """With skip-rev-nat on in both labs: which lab's connection opened, from the two steps."""
    steps = {which: e.step(op="tcp-open", actor="a1", target="web", port=80)  # section 5's are the last
             for which, e in (("per-packet", ev), ("socket", ev.variant("socklb")))}
    if _steps(ev, broken=True) is None or not all(steps.values()):
        return Outcome.needs(BREAK, "it switches the fault on in both labs and connects in each")
    for which, step in steps.items():
        if _FAULT not in step.attrs["faults"]:
            return unhealthy(BREAK, f"your newest connection to web in the {which} lab made without the fault")
    per, sock = steps["per-packet"], steps["socket"]
    pods = {p.ip for p in ev.topology.pods}
    stray = _syn_at(per, Hook.TO_CONTAINER, ack=True)
    if per.ok or not stray or stray[-1].translated or src(stray[-1].event.before)[0] not in pods:
        return unhealthy(BREAK, f"the per-packet connection {'opening' if per.ok else 'failing'} with its SYN|ACK "
                                f"{'rewritten' if stray and stray[-1].translated else 'as it came'}", per)
    if not sock.ok:
        return unhealthy(BREAK, "the socket-LB connection failing too", sock)
    said = set(words(answer))
    said_sock = bool(said & {"socket", "sock", "socklb", "socket-lb", "full"})
    said_per = bool(said & {"per-packet", "per", "packet", "perpacket", "hostns", "tc"})
    diff = (("-", "socket", str(answer)),)
    if said_sock and not said_per and "both" not in said:
        return Outcome(True, "socket: its packets carried the backend's address from the first SYN, so the replies "
                             "need no rewriting and the fault has nothing to break. Per packet, the SYN|ACK reached "
                             "a1 from the backend's address and a1 reset it: reverse NAT is what keeps every "
                             "per-packet Service connection alive.", (("=", "socket", str(answer)),))
    if "both" in said or (said_sock and said_per):
        msg = "one of the two connections never completed its handshake: look for the SYN|ACK that reached a1 " \
              "without `=>`."
    elif said_per:
        msg = "the per-packet lab's connection is the one that failed: its SYN|ACK reached a1 without `=>`, from " \
              "the backend's address."
    elif said & {"none", "neither", "nothing"}:
        msg = "one of the two connections did open: compare the two steps' results."
    else:
        msg = f"{answer!r} does not name a lab: answer 'per-packet', 'socket', or 'both'."
    return Outcome(False, msg, diff, reveal="socket")
