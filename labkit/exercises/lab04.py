"""Lab 04, a ClusterIP Service: the service maps, one connection's rows on the
client's node and the backend's, reverse NAT on the reply, the backend choice
and where it is remembered, a terminating backend, and a break-it fault.

The backend a connection gets is random, so no answer names one unless the
notebook made sure of it first (lab 04 keeps opening connections until one
lands on b1). Graders find connections by what the notebook fixes (a1, the
Service ``web``, its VIP and ports) and read the client's port from the live
SVC row, never from the answer.

The small service helpers at the top are shared by the graders of labs 05 and 06.
"""
from __future__ import annotations

import socket
from typing import Any

from ..checks import Outcome, compare_rows, exercise
from ..errors import NotFoundError
from ..maps.ct import CtRow, TcpFlags
from ..trace import Flow
from .lab01 import addr, hook_name, kinds_answer, newest, recent_flows, row_kind, unanswered, words

__all__ = ["service", "tcp_rows", "svc_rows", "conn_rows", "src", "dst", "is_syn", "pod_name", "addr_port",
           "backend_ips", "ab_answer", "flatten"]

_TCP = socket.IPPROTO_TCP
_SYN, _ACK, _PSH, _RST = TcpFlags.SYN, TcpFlags.ACK, TcpFlags.PSH, TcpFlags.RST


# -- helpers shared by the graders of labs 04-06 ----------------------------------------------
def service(lab, name: str):
    """The Service ``name`` of ``lab``, or None when it does not exist."""
    try:
        return lab.services.get(name)
    except NotFoundError:
        return None


def tcp_rows(lab, node: str) -> list[CtRow]:
    """``node``'s TCP rows (the RELATED twins left out)."""
    return [r for r in lab.ct(node) if r.proto_name == "TCP" and not r.related]


def svc_rows(lab, node: str, svc) -> list[CtRow]:
    """``node``'s TCP SVC rows of connections to ``svc``'s VIP:port."""
    return [r for r in tcp_rows(lab, node) if r.dir == "SVC" and (r.dst, r.dport) == (svc.vip, svc.port)]


def conn_rows(lab, node: str, sport: int, ports: set[int]) -> list[CtRow]:
    """``node``'s TCP rows of the connection whose client port is ``sport`` (responder port in ``ports``)."""
    return [r for r in tcp_rows(lab, node) if r.sport == sport and r.dport in ports]


def src(t) -> tuple[str, int]:
    """(address, port) of a trace tuple's source."""
    return addr(t.saddr), socket.ntohs(t.sport)


def dst(t) -> tuple[str, int]:
    """(address, port) of a trace tuple's destination."""
    return addr(t.daddr), socket.ntohs(t.dport)


def is_syn(t, ack: bool = False) -> bool:
    """A TCP SYN (``ack=False``) or SYN|ACK (``ack=True``)."""
    return t.proto == _TCP and t.tcp_flags & (_SYN | _ACK) == (_SYN | (_ACK if ack else 0))


def pod_name(lab, ip: str) -> str:
    """The pod (or node) holding ``ip``, else the address itself."""
    return lab.topology.owner_of(ip) or ip


def backend_ips(lab, svc) -> dict[str, str]:
    """Address → pod name of every backend of ``svc``."""
    return {lab.pod(b.pod).ip: b.pod for b in svc.backends}


def addr_port(lab, text: Any) -> str | None:
    """``'198.19.0.10:80'`` from a learner's address:port (a pod name may stand for its address); None if unreadable."""
    if isinstance(text, (tuple, list)) and len(text) == 2:
        text = f"{text[0]}:{text[1]}"
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not port.strip().isdigit():
        return None
    host = host.strip()
    if host in lab.topology.names():
        kind = lab.topology.kind_of(host)
        host = lab.pod(host).ip if kind == "pod" else host
    return f"{host}:{int(port)}"


def flatten(answer: dict) -> list[str]:
    """``{'node-a': ['TCP OUT']}`` → ``['node-a: TCP OUT']`` (kinds normalised)."""
    out = []
    for key, kinds in answer.items():
        for kind in kinds_answer(kinds) or []:
            out.append(f"{key}: {kind}")
    return out


def ab_answer(answer: Any, keys: dict[str, tuple[str, ...]]) -> dict[str, Any] | None:
    """A dict answer with its keys mapped to canonical ones: ``keys`` is canonical → accepted spellings.
    None when it is not a dict or a key cannot be placed."""
    if not isinstance(answer, dict):
        return None
    out = {}
    for key, value in answer.items():
        k = str(key).strip().lower().replace("_", "-").replace(" ", "-")
        canon = next((c for c, spellings in keys.items() if k == c or k in spellings), None)
        if canon is None or canon in out:
            return None
        out[canon] = value
    return out


def _web(lab, fixup: str = "run the cell that adds it (lab.services.add('web', ...))"):
    """(service web, None) or (None, a failed Outcome saying what to run)."""
    svc = service(lab, "web")
    if svc is None:
        return None, Outcome(False, f"lab '{lab.name}' has no Service 'web': {fixup}, then check.")
    return svc, None


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
)
def head_of_web(answer, lab) -> Outcome:
    """(count, rev_nat) of web's slot 0 on node-a, read from the live services map and checked against web's backends."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _web(lab)
    if missing:
        return missing
    rows = [r for r in lab.services.lb("node-a").rows() if (r.vip, r.port) == (svc.vip, svc.port)]
    if not rows:
        return Outcome(False, f"node-a's cilium_lb4_services_v2 holds no head for {svc.frontend}: run the cell that "
                              "adds web again (lab.reset() first if it says web exists).")
    head = rows[0]
    if head.count != len(svc.active) or head.id != svc.id:
        return Outcome(False, f"node-a's head says count={head.count} rev_nat={head.id}, but web has "
                              f"{len(svc.active)} active backend(s) and id {svc.id}: the maps and the agent disagree.")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in answer):
        return Outcome(False, f"expected two whole numbers, (count, rev_nat), got {answer!r}.")
    count, rev_nat = answer
    diff = (("=" if count == head.count else "-", f"count={head.count}", f"count={count}"),
            ("=" if rev_nat == head.id else "-", f"rev_nat={head.id}", f"rev_nat={rev_nat}"))
    if (count, rev_nat) == (head.count, head.id):
        return Outcome(True, f"count={head.count}: the datapath picks slot rand % {head.count} + 1, so only slots "
                             f"1..{head.count} are ever chosen. rev_nat={head.id} is web's service id: it keys "
                             f"cilium_lb4_reverse_nat ({svc.vip}:{svc.port}) and is copied into every row the "
                             "connection makes.", diff)
    problems = []
    if count != head.count:
        problems.append(f"count {count} is not what slot 0 says: count is the number of slots to pick from "
                        f"(active backends), and web has {len(svc.active)}")
    if rev_nat != head.id:
        if rev_nat == socket.htons(head.id):
            problems.append(f"{rev_nat} is the rev_nat_index bpftool prints: it is stored in network byte order, "
                            f"so read it as a big-endian 16-bit number")
        else:
            problems.append(f"rev_nat {rev_nat} is not web's service id as slot 0 holds it")
    return Outcome(False, "; ".join(problems) + ".", diff)


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
)
def rows_by_node(answer, lab) -> Outcome:
    """Kinds of the TCP rows of a1's newest connection to web on node-a and node-b, live and by the rule."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _web(lab)
    if missing:
        return missing
    svcs = svc_rows(lab, "node-a", svc)
    if not svcs:
        return Outcome(False, "node-a has no TCP SVC row towards web's VIP: run the cell that opens conn, then check.")
    cp = newest(svcs).sport
    ports = {svc.port} | {b.port for b in svc.backends}
    live = {node: sorted({row_kind(r) for r in conn_rows(lab, node, cp, ports)}) for node in ("node-a", "node-b")}
    rule = {"node-a": ["TCP OUT", "TCP SVC"], "node-b": ["TCP IN"]}
    if live != rule:
        return Outcome(False, f"the connection from port {cp} left {live}, not the rows a ClusterIP connection makes "
                              f"({rule}); faults on: {lab.faults() or 'none'}. Run lab.reset() and the cells from "
                              "section 1 again.")
    got = ab_answer(answer, {"node-a": (), "node-b": ()})
    if got is None or any(kinds_answer(v) is None for v in got.values()):
        return Outcome(False, f"expected a dict {{'node-a': [...], 'node-b': [...]}} of row kinds such as 'TCP OUT', "
                              f"got {answer!r}.")
    out = compare_rows(flatten(live), flatten(got), "TCP rows of a1's connection to web")
    if out.passed:
        return Outcome(True, "node-a, the client's node, made the SVC row (a1 → VIP, with the chosen BackendID) and "
                             "the OUT row (a1 → backend, after DNAT). node-b only ever saw a1 talking to its pod: "
                             "an IN row, no trace of the Service.", out.diff)
    return out


# -- 04.3 ---------------------------------------------------------------------------------
@exercise(
    "04.3",
    "Reverse NAT on the reply",
    hints=(
        "a1 sent its SYN to the VIP; the SYN|ACK left the backend with the backend's address as source.",
        "Find the SYN|ACK's node-a line with `=>` in it: the hook name is before the device, the new source after `=>`.",
        "The answer is ('to-container', '198.19.0.10:80'): to-container on lxc-a1 rewrote the source back to the VIP.",
    ),
)
def reverse_nat(answer, lab) -> Outcome:
    """(hook, source a1 receives) of the newest reply from a web backend translated on node-a, from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _web(lab)
    if missing:
        return missing
    bips, a1 = backend_ips(lab, svc), lab.pod("a1").ip
    replies = [f for f in recent_flows(lab) if f.node == "node-a" and is_syn(f.event.before, ack=True)
               and f.translated and addr(f.event.before.saddr) in bips and dst(f.event.after)[0] == a1]
    if not replies:
        return Outcome(False, "the trace holds no SYN|ACK from a web backend rewritten on node-a: run the cell that "
                              "opens conn, then check.")
    f = replies[-1]
    live_hook, (ip, port) = f.hook.label, src(f.event.after)
    live_addr = f"{ip}:{port}"
    if live_hook != "to-container" or live_addr != f"{svc.vip}:{svc.port}":
        return Outcome(False, f"the newest reply was rewritten at {live_hook} to {live_addr}, not what a per-packet "
                              f"ClusterIP does; faults on: {lab.faults() or 'none'}.")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair (hook, 'address:port'), got {answer!r}.")
    hook, where = hook_name(answer[0]), addr_port(lab, answer[1])
    diff = (("=" if hook == live_hook else "-", live_hook, hook),
            ("=" if where == live_addr else "-", live_addr, str(where or answer[1])))
    if hook == live_hook and where == live_addr:
        return Outcome(True, f"to-container on lxc-a1 found the OUT row (ct=reply), took its RevNAT={svc.id}, looked "
                             f"it up in cilium_lb4_reverse_nat and rewrote the source to {live_addr}: a1's socket, "
                             "connected to the VIP, accepts the reply.", diff)
    problems = []
    if hook != live_hook:
        problems.append(f"{answer[0]!r} is not where node-a rewrote the reply: find the SYN|ACK's line with `=>`")
    if where is None:
        problems.append(f"{answer[1]!r} is not an address:port")
    elif where != live_addr:
        if where.split(":")[0] in bips:
            problems.append(f"{where} is the backend, where the reply came from; a1 never sees that address: read "
                            "the right-hand side of `=>`")
        else:
            problems.append(f"{where} is not the source a1 receives the reply from")
    return Outcome(False, "; ".join(problems) + ".", diff)


# -- 04.4 ---------------------------------------------------------------------------------
@exercise(
    "04.4",
    "Where the backend choice is remembered",
    hints=(
        "The pick is random, yet every later packet of a connection reaches the same backend.",
        "Compare the SVC and OUT rows of one connection: which of them names a backend id, and in which field?",
        "The answer is ('TCP SVC', 'BackendID'): the SVC row stores the pick; the OUT row says BackendID=0.",
    ),
)
def choice_remembered(answer, lab) -> Outcome:
    """The row kind and field that keep a connection's backend, checked on node-a's live SVC and OUT rows."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _web(lab)
    if missing:
        return missing
    ids = {b.id: b.pod for b in svc.backends}
    svcs = svc_rows(lab, "node-a", svc)
    picked = {ids.get(r.backend_id) for r in svcs}
    if len(svcs) < 4 or len(picked - {None}) < 2:
        return Outcome(False, f"node-a holds {len(svcs)} SVC row(s) towards web, reaching {sorted(p for p in picked if p)}: "
                              "run the cell that opens several connections, then check.")
    ports = {b.port for b in svc.backends}
    for r in svcs:
        outs = [o for o in conn_rows(lab, "node-a", r.sport, ports) if o.dir == "OUT"]
        pod = ids.get(r.backend_id)
        if pod is None or not outs or any(o.dst != lab.pod(pod).ip or o.backend_id for o in outs):
            return Outcome(False, f"the SVC row from port {r.sport} names BackendID={r.backend_id} but its OUT row does "
                                  f"not go there: faults on: {lab.faults() or 'none'}.")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair (row kind, field name), got {answer!r}.")
    kind = (kinds_answer([answer[0]]) or [""])[0]
    field = str(answer[1]).strip().lower().replace("_", "").replace(" ", "")
    kind_ok, field_ok = kind == "TCP SVC", field in ("backendid", "backend")
    diff = (("=" if kind_ok else "-", "TCP SVC", str(answer[0])), ("=" if field_ok else "-", "BackendID", str(answer[1])))
    if kind_ok and field_ok:
        return Outcome(True, f"the SVC row: BackendID is the pick ({', '.join(sorted(p for p in picked if p))} over "
                             f"{len(svcs)} connections). Every later packet to the VIP finds the SVC row and goes to "
                             "the same backend; the OUT row, keyed by the backend address, needs no BackendID (0).",
                       diff)
    problems = []
    if not kind_ok:
        problems.append(f"{answer[0]!r}: that row does not hold the pick; look for the row keyed by the VIP")
    if not field_ok:
        problems.append(f"{answer[1]!r} is not the field that names the backend (RevNAT names the service)")
    return Outcome(False, "; ".join(problems) + ".", diff)


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
        "Read the `send` step's echo line (who answered keep?) and the SVC rows of the six new connections (BackendID).",
        "The answer is ('b1', ['b2']): b1 still echoed on its established connection; every new connection went to b2.",
    ),
)
def terminating(answer, lab) -> Outcome:
    """(pod that echoed on keep, pods of the new connections) after b1 turned terminating, from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _web(lab)
    if missing:
        return missing
    if not svc.terminating:
        return Outcome(False, "web has no terminating backend: run the cell with lab.services.set_backend_state(...), "
                              "then the cells after it, then check.")
    bips, a1 = backend_ips(lab, svc), lab.pod("a1").ip
    gone = {b.pod for b in svc.terminating}
    flows = recent_flows(lab)
    echoes = [i for i, f in enumerate(flows) if f.node == "node-a" and f.hook.label == "to-container"
              and f.event.before.proto == _TCP and f.event.before.tcp_flags & _PSH
              and bips.get(src(f.event.before)[0]) in gone and f.translated and dst(f.event.after)[0] == a1]
    if not echoes:
        return Outcome(False, "the trace holds no echo from the terminating backend: run keep.send(...), then check.")
    first = echoes[-1]
    echo_pod = bips[src(flows[first].event.before)[0]]
    new = [f for f in flows[first:] if f.node == "node-a" and f.hook.label == "from-container"
           and is_syn(f.event.before) and dst(f.event.before) == (svc.vip, svc.port) and f.translated]
    if len(new) < 3:
        return Outcome(False, f"after keep's echo the trace holds {len(new)} new connection(s) to web: run the cell "
                              "that opens new ones, then check.")
    new_pods = sorted({bips.get(dst(f.event.after)[0], dst(f.event.after)[0]) for f in new})
    active = {b.pod for b in svc.active}
    if not set(new_pods) <= active:
        return Outcome(False, f"new connections reached {new_pods}, but only {sorted(active)} are active: "
                              f"faults on: {lab.faults() or 'none'}.")
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
        problems.append(f"{answer[0]!r} did not echo on keep: the echo's line before `=>` names its source")
    if new_got != new_pods:
        problems.append(f"{answer[1]!r} is not where the {len(new)} new connections went: read their BackendID")
    return Outcome(False, "; ".join(problems) + ".", diff)


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
)
def skip_rev_nat(answer, lab) -> Outcome:
    """With skip-rev-nat on: (source of the SYN|ACK a1 got, flags of a1's answer), from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "skip-rev-nat" not in lab.faults():
        return Outcome(False, "the fault is off: run the break-it cell (it resets the lab, adds web and switches the "
                              "fault on), then check.")
    svc, missing = _web(lab, "run the break-it cell")
    if missing:
        return missing
    bips, a1 = backend_ips(lab, svc), lab.pod("a1").ip
    flows = recent_flows(lab)
    idx = [i for i, f in enumerate(flows) if f.node == "node-a" and f.hook.label == "to-container"
           and is_syn(f.event.before, ack=True) and src(f.event.before)[0] in bips and dst(f.event.before)[0] == a1]
    if not idx:
        return Outcome(False, "the trace holds no SYN|ACK delivered to a1 on node-a: run the break-it cell, then check.")
    synack = flows[idx[-1]]
    if synack.translated:
        return Outcome(False, "the newest SYN|ACK was still rewritten to the VIP: it came before the fault. Run the "
                              "break-it cell again, then check.")
    peer, cp = src(synack.event.before), dst(synack.event.before)[1]
    answers = [f for f in flows[idx[-1]:] if f.node == "node-a" and f.hook.label == "from-container"
               and f.event.before.proto == _TCP and src(f.event.before) == (a1, cp) and dst(f.event.before) == peer]
    if not answers or not answers[0].event.before.tcp_flags & _RST:
        return Outcome(False, "the trace does not show a1 answering the stray SYN|ACK with an RST yet: run the "
                              "break-it cell again, then check.")
    live_src, live_flag = f"{peer[0]}:{peer[1]}", TcpFlags.text(answers[0].event.before.tcp_flags)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('address:port', 'FLAG'), got {answer!r}.")
    got_src = addr_port(lab, answer[0])
    got_flags = {w.upper() for w in str(answer[1]).replace("|", " ").replace(",", " ").split()}
    src_ok, flag_ok = got_src == live_src, got_flags == set(live_flag.split("|"))
    diff = (("=" if src_ok else "-", live_src, str(got_src or answer[0])), ("=" if flag_ok else "-", live_flag, str(answer[1])))
    if src_ok and flag_ok:
        return Outcome(True, f"the SYN|ACK reached a1 from {live_src} ({bips[peer[0]]}), not from "
                             f"{svc.vip}:{svc.port}: no socket of a1 waits for that address, so its kernel answered "
                             f"{live_flag} and retried the SYN until connect() gave up. The trace says where: "
                             "to-container forwarded the reply without `=>`.", diff)
    problems = []
    if not src_ok:
        if got_src == f"{svc.vip}:{svc.port}":
            problems.append(f"{got_src} is what a1 expected; under the fault the SYN|ACK's to-container line has no "
                            "`=>`: read its source")
        else:
            problems.append(f"{answer[0]!r} is not where the SYN|ACK came from")
    if not flag_ok:
        problems.append(f"{answer[1]!r} is not what a1 sent back: read a1's next node-a from-container line")
    return Outcome(False, "; ".join(problems) + ".", diff)
