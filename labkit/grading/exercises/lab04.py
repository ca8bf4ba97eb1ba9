"""Lab 04, a ClusterIP Service: the service maps, one connection's rows on the client's node and the backend's,
reverse NAT on the reply, where the backend choice is remembered, a terminating backend, and a break-it fault.

Graders read what the notebook's cells recorded: the snapshot of the Service maps taken when ``web`` was added
(with the Service as the agent knows it, in ``service``), the connection opened in section 2 (its rows and its
trace), every connection a1 opened to web (section 4), the snapshot taken when b1 turned terminating with the
send on ``keep`` and the connections opened after it (section 5), and the connection opened under section 6's
fault. Steps taken under that fault (``skip-rev-nat``) never answer the questions of sections 1-5. The backend
a connection gets is random, so no answer names one unless the notebook made sure of it first (section 5 keeps
opening connections until one lands on b1).
"""
from __future__ import annotations

import socket
from typing import Any

from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.maps.ct import CtRow, TcpFlags
from labkit.grading.exercises import common
from labkit.grading.exercises.common import ab_answer, addr_port, dst, flatten, hook_name, is_syn, kinds_answer, row_kind, src

MAPS, CONN, PICK, TERM, BREAK = ("1. A Service in the maps", "2. One connection, two nodes", "4. Picking a backend",
                                 "5. A terminating backend", "6. Break it")
#: Titles of the notebook's snapshots: web's maps when it was added, and when b1 turned terminating.
WEB_MAPS, TERMINATING = "web in the maps", "web with b1 terminating"
_TCP = socket.IPPROTO_TCP
_PSH, _RST = TcpFlags.PSH, TcpFlags.RST
_NODES = {"node-a": ("a", "nodea"), "node-b": ("b", "nodeb")}


def _opens(ev) -> list:
    """Records of a1's connections to web opened outside section 6's fault (``skip-rev-nat``)."""
    return ev.records("step", op="tcp-open", actor="a1", target="web", faults=lambda f: "skip-rev-nat" not in f)


def _open(ev):
    """The newest connection a1 opened to web outside section 6's fault, or failing that under it (so that the
    check can say the fault was on)."""
    recs = _opens(ev)
    return recs[-1].data if recs else ev.step(op="tcp-open", actor="a1", target="web")


def _conn(step, node: str, a1: str) -> list[CtRow]:
    """The TCP rows (twins left out) of the step's own connection on ``node``, found by a1's port."""
    sport = step.attrs.get("sport")
    return [r for r in common.step_rows(step, node, "TCP") if r.src == a1 and r.sport == sport]


def _pod(ev, ip: str) -> str:
    return ev.topology.owner_of(ip) or ip


# -- 04.1 ---------------------------------------------------------------------------------
@exercise(
    "04.1",
    "The head of a service: count and rev_nat",
    hints=(
        "Slot 0 of a frontend holds no backend: it says how many slots there are to pick from, and the service id.",
        "Read the `slot 0 head:` line of the raw view (lab.services.lb('node-a').raw_lines()).",
        "The answer is (2, 1): two active backends, and web is service id 1 (bpftool prints rev_nat_index 256, "
        "which is 1 in network byte order).",
    ),
    fault="lb-wrong-count",
    cells=(MAPS,),
)
def head_of_web(answer, ev) -> Outcome:
    """(count, rev_nat) of web's slot 0 in node-a's maps as recorded when web was added, against web's backends."""
    snap = ev.snapshot(WEB_MAPS)
    web = getattr(snap, "service", None)
    if snap is None or not hasattr(web, "active") or "node-a" not in snap.lb:
        return Outcome.needs(MAPS, "it adds web and keeps the Service maps as the agent wrote them")
    heads = [r for r in snap.lb["node-a"].rows() if (r.vip, r.port) == (web.vip, web.port)]
    if not heads or heads[0].count != len(web.active) or heads[0].id != web.id:
        saw = (f"web's head on node-a saying count={heads[0].count} rev_nat={heads[0].id} for {len(web.active)} active "
               f"backend(s) and service id {web.id}") if heads else "node-a's maps with no head for web"
        return common.unhealthy(MAPS, saw + " (lab.reset() first if the cell then says web exists)")
    head = heads[0]
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in answer):
        return Outcome(False, f"expected two whole numbers, (count, rev_nat), got {answer!r}.")
    count, rev_nat = answer
    diff = (("=" if count == head.count else "-", f"count={head.count}", f"count={count}"),
            ("=" if rev_nat == head.id else "-", f"rev_nat={head.id}", f"rev_nat={rev_nat}"))
    if (count, rev_nat) == (head.count, head.id):
        return Outcome(True, f"count={head.count}: the datapath picks slot rand % {head.count} + 1, so only slots "
                             f"1..{head.count} are ever chosen. rev_nat={head.id} is web's service id: it keys "
                             f"cilium_lb4_reverse_nat ({web.vip}:{web.port}) and is copied into every row the "
                             "connection makes.", diff)
    problems = []
    if count != head.count:
        if count == head.count + 1:
            problems.append("count is the number of backend slots to pick from: slot 0, the head itself, is not one "
                            "of them")
        elif count == 0:
            problems.append("the head names no backend (backend_id 0), but its count is not empty: it says how many "
                            "slots follow it")
        else:
            problems.append(f"count {count} is not what slot 0 says: count is the number of slots to pick from, one "
                            "per active backend")
    if rev_nat != head.id:
        if rev_nat == socket.htons(head.id):
            problems.append(f"{rev_nat} is the rev_nat_index bpftool prints: it is stored in network byte order, so "
                            "read its two bytes as a big-endian number")
        elif rev_nat == 0:
            problems.append("rev_nat 0 would mean no service: slot 0 carries web's service id")
        else:
            problems.append(f"rev_nat {rev_nat} is not web's service id as slot 0 holds it")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"({head.count}, {head.id})")


# -- 04.2 ---------------------------------------------------------------------------------
@exercise(
    "04.2",
    "One connection's rows, node by node",
    hints=(
        "The client's node does the load balancing; the backend's node sees an ordinary pod-to-pod connection.",
        "Print the TCP rows of both nodes after conn.open(): node-a has one row towards the VIP and one towards "
        "the backend; node-b has one.",
        "The answer is {'node-a': ['TCP SVC', 'TCP OUT'], 'node-b': ['TCP IN']}.",
    ),
    fault="no-svc-entry",
    cells=(CONN,),
)
def rows_by_node(answer, ev) -> Outcome:
    """Kinds of the TCP rows of a1's connection to web on node-a and node-b, recorded and by the rule."""
    step = _open(ev)
    if step is None:
        return Outcome.needs(CONN, "conn.open() records the rows of both nodes")
    a1 = ev.topology.pod("a1").ip
    live = {node: sorted({row_kind(r) for r in _conn(step, node, a1)}) for node in ("node-a", "node-b")}
    rule = {"node-a": ["TCP OUT", "TCP SVC"], "node-b": ["TCP IN"]}
    if not step.ok or live != rule:
        return common.unhealthy(CONN, f"a connection to web that left {live}"
                                      f"{'' if step.ok else ' and did not open'}", step)
    got = ab_answer(answer, _NODES)
    if got is None or any(kinds_answer(v) is None for v in got.values()):
        return Outcome(False, f"expected a dict {{'node-a': [...], 'node-b': [...]}} of row kinds such as 'TCP OUT', "
                              f"got {answer!r}.")
    out = compare_rows(flatten(live), flatten(got), "TCP rows of a1's connection to web")
    if out.passed:
        return Outcome(True, "node-a, the client's node, made the SVC row (a1 → VIP, with the chosen BackendID) and "
                             "the OUT row (a1 → backend, after DNAT). node-b only ever saw a1 talking to its pod: "
                             "an IN row, no trace of the Service.", out.diff)
    svc_on = {node for node, kinds in got.items() if "TCP SVC" in (kinds_answer(kinds) or [])}
    if svc_on == {"node-b"}:
        msg = ("a Service is not handled where its backends live: the load balancing happened where the SYN left a1, "
               "before any routing.")
    elif svc_on == {"node-a", "node-b"}:
        msg = "node-b never saw the VIP: only the client's node has a row keyed by it."
    elif not svc_on:
        msg = ("a connection to a Service leaves one more row than a pod-to-pod one: node-a also keeps a row keyed by "
               "what a1 sent.")
    else:
        msg = out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 04.3 ---------------------------------------------------------------------------------
@exercise(
    "04.3",
    "Reverse NAT on the reply",
    hints=(
        "a1 sent its SYN to the VIP; the SYN|ACK left the backend with the backend's address as source.",
        "Find the SYN|ACK's node-a line with `=>` in it: the hook name is before the device, the new source after `=>`.",
        "The answer is ('to-container', '198.19.0.10:80'): to-container on lxc-a1 rewrote the source back to the VIP.",
    ),
    fault="skip-rev-nat",
    cells=(CONN,),
)
def reverse_nat(answer, ev) -> Outcome:
    """(hook, source a1 receives) of the SYN|ACK of a1's connection to web, from its trace."""
    step = _open(ev)
    if step is None:
        return Outcome.needs(CONN, "conn.open() records the handshake's trace")
    a1, vip, port = ev.topology.pod("a1").ip, step.attrs["dst"], step.attrs["port"]
    replies = [f for f in step.flows if f.node == "node-a" and is_syn(f.event.before, ack=True) and f.translated
               and dst(f.event.after)[0] == a1]
    if not step.ok or not replies or src(replies[0].event.after) != (vip, port):
        return common.unhealthy(CONN, "a SYN|ACK that reached a1 without its source rewritten to web's VIP", step)
    f = replies[0]
    live_hook, live_addr = f.hook.label, f"{vip}:{port}"
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair (hook, 'address:port'), got {answer!r}.")
    hook, where = hook_name(answer[0]), addr_port(answer[1], ev.topology)
    diff = (("=" if hook == live_hook else "-", live_hook, hook),
            ("=" if where == live_addr else "-", live_addr, str(where or answer[1])))
    if hook == live_hook and where == live_addr:
        return Outcome(True, f"to-container on lxc-a1 found the OUT row (ct=reply), took its RevNAT, looked it up in "
                             f"cilium_lb4_reverse_nat and rewrote the source to {live_addr}: a1's socket, connected "
                             "to the VIP, accepts the reply.", diff)
    problems = []
    if hook != live_hook:
        if hook == "from-container":
            problems.append("from-container sees what a1 sends; the SYN|ACK was on its way to a1")
        elif hook in ("from-overlay", "from-netdev"):
            problems.append(f"node-a's {hook} passed the SYN|ACK on unchanged (its line has no `=>`): the reply is "
                            "translated back only where the connection's own row is looked up")
        elif hook in ("to-overlay", "to-netdev"):
            problems.append(f"{hook} is on the way out of node-a; the SYN|ACK came in")
        else:
            problems.append(f"{answer[0]!r} is not where node-a rewrote the reply: find the SYN|ACK's line with `=>`")
    if where is None:
        problems.append(f"{answer[1]!r} is not an address:port")
    elif where != live_addr:
        if ev.topology.owner_of(where.rpartition(":")[0]) is not None:
            problems.append(f"{where} is a pod's own address: the reply left its backend with it, but a1 never sees "
                            "it; read the right-hand side of `=>`")
        else:
            problems.append(f"{where} is not the source a1 receives the reply from")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"({live_hook!r}, {live_addr!r})")


# -- 04.4 ---------------------------------------------------------------------------------
@exercise(
    "04.4",
    "Where the backend choice is remembered",
    hints=(
        "The pick is random, yet every later packet of a connection reaches the same backend.",
        "Compare the SVC and OUT rows of one connection: which of them names a backend id, and in which field?",
        "The answer is ('TCP SVC', 'BackendID'): the SVC row stores the pick; the OUT row says BackendID=0.",
    ),
    fault="no-svc-entry",
    cells=(PICK,),
)
def choice_remembered(answer, ev) -> Outcome:
    """The row kind and field that keep a connection's backend, checked on the SVC and OUT rows of every connection
    a1 opened to web."""
    steps = [r.data for r in _opens(ev)]
    if len(steps) < 2:
        return Outcome.needs(PICK, "the loop opens connections until both backends were picked")
    a1 = ev.topology.pod("a1").ip
    picks: dict[int, set[str]] = {}
    revnats = set()
    for step in steps:
        rows = _conn(step, "node-a", a1)
        svc = [r for r in rows if r.dir == "SVC" and (r.dst, r.dport) == (step.attrs["dst"], step.attrs["port"])]
        out = [r for r in rows if r.dir == "OUT"]
        if not step.ok or len(svc) != 1 or len(out) != 1 or out[0].backend_id:
            return common.unhealthy(PICK, f"a connection from port {step.attrs.get('sport')} that left "
                                          f"{sorted(map(row_kind, rows)) or 'no rows'} on node-a", step)
        picks.setdefault(svc[0].backend_id, set()).add(out[0].dst)
        revnats.add(svc[0].rev_nat)
    if len(picks) < 2 or any(len(d) != 1 for d in picks.values()):
        return common.unhealthy(PICK, f"{len(steps)} connections whose SVC rows name BackendID "
                                      f"{sorted(picks)} for backends {sorted(set().union(*picks.values()))}")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair (row kind, field name), got {answer!r}.")
    kind = (kinds_answer([answer[0]]) or [""])[0] if isinstance(answer[0], str) else ""
    field = str(answer[1]).strip().lower().replace("_", "").replace(" ", "")
    kind_ok, field_ok = kind == "TCP SVC", field in ("backendid", "backend")
    diff = (("=" if kind_ok else "-", "TCP SVC", str(answer[0])), ("=" if field_ok else "-", "BackendID", str(answer[1])))
    pods = sorted(_pod(ev, ip) for d in picks.values() for ip in d)
    if kind_ok and field_ok:
        return Outcome(True, f"the SVC row: BackendID is the pick ({', '.join(pods)} over {len(steps)} connections). "
                             "Every later packet to the VIP finds the SVC row and goes to the same backend; the OUT "
                             "row, keyed by the backend address, needs no BackendID (0).", diff)
    problems = []
    if not kind_ok:
        if kind == "TCP OUT":
            problems.append("the OUT row says BackendID=0 in every one of your connections: it is keyed by the "
                            "backend's address already, and a packet to the VIP cannot find it before the pick")
        elif kind == "TCP IN":
            problems.append("node-b's IN row belongs to the backend's node, which never saw the VIP: the pick is made "
                            "and kept where the SYN left a1")
        else:
            problems.append(f"{answer[0]!r}: that row does not hold the pick; look for the row keyed by the VIP")
    if not field_ok:
        if field == "revnat":
            problems.append(f"RevNAT is the service id: every connection to web carries the same one "
                            f"({', '.join(map(str, sorted(revnats)))}), whichever backend it got")
        else:
            problems.append(f"{answer[1]!r} is not the field that names the backend")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal="('TCP SVC', 'BackendID')")


# -- 04.5 ---------------------------------------------------------------------------------
def _pods(answer: Any) -> list[str] | None:
    items = [answer] if isinstance(answer, str) else answer
    if not isinstance(items, (list, tuple, set)):
        return None
    return sorted({str(p).strip().lower() for p in items})


@exercise(
    "04.5",
    "A terminating backend",
    hints=(
        "Terminating takes a backend out of the count in slot 0, nothing more.",
        "Read the `send` step's echo line (who answered keep?) and the SVC rows of the ten new connections "
        "(BackendID).",
        "The answer is ('b1', ['b2']): b1 still echoed on its established connection; every new connection went to b2.",
    ),
    fault="pick-terminating",
    cells=(TERM,),
)
def terminating(answer, ev) -> Outcome:
    """(pod that echoed on keep, pods of the new connections) after b1 turned terminating, from the steps recorded
    after the snapshot of the maps."""
    snap_rec = ev.latest("snapshot", title=TERMINATING)
    sends = ev.after(snap_rec, "step", op="tcp-send", actor="a1", target="web") if snap_rec else []
    if snap_rec is None or not sends:
        return Outcome.needs(TERM, "they keep a connection on b1, turn b1 terminating, send on keep and open new "
                                   "connections")
    send_rec = sends[-1]
    send, snap = send_rec.data, snap_rec.data
    a1, vip = ev.topology.pod("a1").ip, send.attrs["dst"]
    lb = snap.lb.get("node-a")
    heads = [r for r in lb.rows() if (r.vip, r.port) == (vip, send.attrs["port"])] if lb is not None else []
    if not heads:
        return Outcome.needs(TERM, "it keeps web's maps once b1 is terminating")
    states = {_pod(ev, b.address): b.state for b in heads[0].backends}
    gone = {p for p, s in states.items() if s != "active"}
    active = {p for p, s in states.items() if s == "active"}
    echoes = [f for f in send.flows if f.node == "node-a" and f.hook.label == "to-container"
              and f.event.before.proto == _TCP and f.event.before.tcp_flags & _PSH and f.translated
              and dst(f.event.after)[0] == a1]
    if not send.ok or not gone or not echoes or _pod(ev, src(echoes[0].event.before)[0]) not in gone:
        who = _pod(ev, src(echoes[0].event.before)[0]) if echoes else "nobody"
        return common.unhealthy(TERM, f"keep's data answered by {who} while {sorted(gone) or 'no backend'} was "
                                      "terminating", send)
    echo_pod = _pod(ev, src(echoes[0].event.before)[0])
    closes = ev.after(send_rec, "step", op="tcp-close", conn=send.attrs.get("conn"))
    until = closes[0].seq if closes else float("inf")
    new = [r.data for r in ev.after(send_rec, "step", op="tcp-open", actor="a1", target="web", ok=True,
                                    faults=lambda f: "skip-rev-nat" not in f) if r.seq < until]
    reached = []
    for step in new:
        out = [r for r in _conn(step, "node-a", a1) if r.dir == "OUT"]
        reached.append(_pod(ev, out[0].dst) if out else "?")
    if len(new) < 3:
        return Outcome.needs(TERM, f"the cell after keep's send opens new connections ({len(new)} recorded)")
    new_pods = sorted(set(reached))
    if not set(new_pods) <= active:
        return common.unhealthy(TERM, f"new connections reaching {new_pods} while only {sorted(active)} was active",
                                new[-1])
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or _pods(answer[1]) is None:
        return Outcome(False, f"expected a pair (pod, [pods]), e.g. ('b2', ['b1']), got {answer!r}.")
    echo_got, new_got = str(answer[0]).strip().lower(), _pods(answer[1])
    diff = (("=" if echo_got == echo_pod else "-", f"keep answered by {echo_pod}", echo_got),
            ("=" if new_got == new_pods else "-", f"new connections to {new_pods}", str(new_got)))
    if echo_got == echo_pod and new_got == new_pods:
        return Outcome(True, f"{echo_pod} is terminating, yet keep's packets still find its SVC row (BackendID) and go "
                             f"there: established connections drain. New connections draw from slots 1..count, and "
                             f"count now covers only {', '.join(new_pods)}.", diff)
    problems = []
    if echo_got != echo_pod:
        if echo_got in active:
            problems.append("keep's data still reached the pod it was connected to: terminating does not move an "
                            "established connection")
        elif echo_got in ("", "none", "nobody", "no one"):
            problems.append("keep got its echo back: a terminating backend still answers its established connections")
        else:
            problems.append(f"{answer[0]!r} did not echo on keep: the echo's line before `=>` names its source")
    if new_got != new_pods:
        if gone & set(new_got):
            problems.append(f"after the state change none of the {len(new)} new connections went to the terminating "
                            "backend: count no longer covers its slot")
        else:
            problems.append(f"{answer[1]!r} is not where the {len(new)} new connections went: read their BackendID")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"({echo_pod!r}, {new_pods!r})")


# -- 04.6 (break it) ----------------------------------------------------------------------
@exercise(
    "04.6",
    "Break it: the reply nobody expected",
    hints=(
        "a1's socket is connected to the VIP; look at the SYN|ACK as to-container hands it to a1.",
        "The SYN|ACK's node-a to-container line has no `=>`; the next node-a line from a1 is its kernel's answer.",
        "The answer is ('198.18.2.11:8080', 'RST'): the reply still came from b1, so a1's kernel reset it.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def skip_rev_nat(answer, ev) -> Outcome:
    """With skip-rev-nat on: (source of the SYN|ACK a1 got, flags of a1's answer), from the connection's trace."""
    step, missing = common.broken_step(ev, "skip-rev-nat", BREAK, "it switches the fault on, recreates web with b1 "
                                       "alone and connects", op="tcp-open", actor="a1", target="web")
    if missing:
        return missing
    a1, vip, port = ev.topology.pod("a1").ip, step.attrs["dst"], step.attrs["port"]
    flows = step.flows
    idx = [i for i, f in enumerate(flows) if f.node == "node-a" and f.hook.label == "to-container"
           and is_syn(f.event.before, ack=True) and dst(f.event.before)[0] == a1]
    answers = []
    if idx and not flows[idx[0]].translated:
        peer, cp = src(flows[idx[0]].event.before), dst(flows[idx[0]].event.before)[1]
        answers = [f for f in flows[idx[0]:] if f.node == "node-a" and f.hook.label == "from-container"
                   and f.event.before.proto == _TCP and src(f.event.before) == (a1, cp) and dst(f.event.before) == peer]
    if not answers or not answers[0].event.before.tcp_flags & _RST:
        return Outcome(False, f"your cells recorded a connection whose SYN|ACK {'reached a1 rewritten to the VIP' if idx else 'never reached a1'}"
                              f", not what this question is about: run the cells under '{BREAK}' again (the fault, "
                              "then the cell that recreates web and connects).", missing=BREAK)
    live_src, live_flag = f"{peer[0]}:{peer[1]}", TcpFlags.text(answers[0].event.before.tcp_flags)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('address:port', 'FLAG'), got {answer!r}.")
    got_src = addr_port(answer[0], ev.topology)
    got_flags = {w.upper() for w in str(answer[1]).replace("|", " ").replace(",", " ").split()}
    src_ok, flag_ok = got_src == live_src, got_flags == set(live_flag.split("|"))
    diff = (("=" if src_ok else "-", live_src, str(got_src or answer[0])), ("=" if flag_ok else "-", live_flag, str(answer[1])))
    if src_ok and flag_ok:
        return Outcome(True, f"the SYN|ACK reached a1 from {live_src} ({_pod(ev, peer[0])}), not from {vip}:{port}: "
                             f"no socket of a1 waits for that address, so its kernel answered {live_flag} and retried "
                             "the SYN until connect() gave up. The trace says where: to-container forwarded the reply "
                             "without `=>`.", diff)
    problems = []
    if not src_ok:
        if got_src == f"{vip}:{port}":
            problems.append(f"{got_src} is what a1 expected; under the fault the SYN|ACK's to-container line has no "
                            "`=>`: read its source")
        else:
            problems.append(f"{answer[0]!r} is not where the SYN|ACK came from")
    if not flag_ok:
        if got_flags == {"ACK"}:
            problems.append("a1's kernel did not acknowledge it: no socket of a1 waits for a SYN|ACK from that address")
        elif "FIN" in got_flags:
            problems.append("a FIN closes a connection that exists; a1 never had one with that address")
        else:
            problems.append(f"{answer[1]!r} is not what a1 sent back: read a1's next node-a from-container line")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"({live_src!r}, {live_flag!r})")
