"""Lab 06, socket LB against per-packet LB: the same connection in two labs, the
rows and the first SYN of each, what ``getpeername()`` says and why, a Service
without backends, and a break-it fault that only one of them survives.

The main lab (``start()``) leaves pods to the per-packet path (``socket_lb=
'hostns'``); the second, ``<this lab>-socklb``, rewrites ``connect()`` in every
pod (``socket_lb='full'``). Answers are dicts keyed ``'per-packet'`` and
``'socket'``; graders read both labs live.
"""
from __future__ import annotations

import socket
from typing import Any

from ..checks import Outcome, compare_rows, exercise
from ..constants import DropReason
from ..maps.base import PinnedMap
from ..maps.ct import TcpFlags
from ..maps.lb import REVERSE_SK_MAP, Ipv4RevnatEntry, Ipv4RevnatTuple
from .lab01 import addr, kinds_answer, newest, recent_flows, row_kind, unanswered, words
from .lab04 import ab_answer, addr_port, backend_ips, conn_rows, dst, flatten, is_syn, service, src, tcp_rows

_TCP = socket.IPPROTO_TCP
_KEYS = {
    "per-packet": ("perpacket", "per-packet-lb", "packet", "per", "tc", "hostns", "main"),
    "socket": ("socket-lb", "socketlb", "socklb", "sock", "full"),
}
_EXAMPLE = "{'per-packet': ..., 'socket': ...}"


def _both(lab, service_name: str = "web"):
    """((per-packet lab, socket lab), None) or (None, a failed Outcome saying what to run)."""
    from ..lab import Lab

    if lab.config.socket_lb != "hostns":
        return None, Outcome(False, f"lab '{lab.name}' rewrites connect() itself (socket_lb={lab.config.socket_lb}); "
                                    "these questions compare the main lab of start(), where pods use the per-packet path.")
    name = f"{lab.name}-socklb"
    try:
        sock = Lab.attach(name)
    except Exception:
        return None, Outcome(False, f"the socket-LB lab '{name}' is not up: run the cell with "
                                    "start(socket_lb='full', variant='socklb'), then the cells after it, then check.")
    if sock.config.socket_lb != "full":
        return None, Outcome(False, f"lab '{name}' has socket_lb={sock.config.socket_lb}, not 'full': run "
                                    "start(socket_lb='full', variant='socklb') again.")
    for which, l in (("per-packet", lab), ("socket", sock)):
        if service(l, service_name) is None:
            return None, Outcome(False, f"the {which} lab ('{l.name}') has no Service '{service_name}': run the cell "
                                        "that adds it to both labs, then check.")
    return (lab, sock), None


def _dict(answer: Any) -> dict | None:
    got = ab_answer(answer, _KEYS)
    return got if got is not None and set(got) == set(_KEYS) else None


def _bad_dict(answer: Any, what: str) -> Outcome:
    return Outcome(False, f"expected a dict {_EXAMPLE} with {what} for each lab, got {answer!r}.")


def _newest_conn(l, svc) -> int | None:
    """Client port of a1's newest connection to one of ``svc``'s backends on node-a (its OUT row)."""
    bips, a1 = backend_ips(l, svc), l.pod("a1").ip
    outs = [r for r in tcp_rows(l, "node-a") if r.dir == "OUT" and r.src == a1 and r.dst in bips]
    return newest(outs).sport if outs else None


# -- 06.1 ---------------------------------------------------------------------------------
@exercise(
    "06.1",
    "The rows of the same connection, per packet and at the socket",
    hints=(
        "In one lab nothing on the packet path ever sees the VIP.",
        "Compare the two row listings of section 2: which kind of row is missing on one side?",
        "The answer is {'per-packet': ['TCP SVC', 'TCP OUT'], 'socket': ['TCP OUT']}.",
    ),
)
def rows_each_way(answer, lab) -> Outcome:
    """Kinds of node-a's TCP rows of a1's newest connection to web in both labs, live and by the rule."""
    if (blank := unanswered(answer)) is not None:
        return blank
    labs, missing = _both(lab)
    if missing:
        return missing
    live = {}
    for which, l in zip(_KEYS, labs):
        svc = service(l, "web")
        cp = _newest_conn(l, svc)
        if cp is None:
            return Outcome(False, f"node-a of the {which} lab has no OUT row from a1 to a web backend: run the cell "
                                  "that opens a connection in both labs, then check.")
        live[which] = sorted({row_kind(r) for r in conn_rows(l, "node-a", cp, {svc.port, 8080})})
    rule = {"per-packet": ["TCP OUT", "TCP SVC"], "socket": ["TCP OUT"]}
    if live != rule:
        return Outcome(False, f"node-a holds {live} for the newest connections, not what each path makes ({rule}); "
                              "run the cells of section 2 again.")
    got = _dict(answer)
    if got is None or any(kinds_answer(v) is None for v in got.values()):
        return _bad_dict(answer, "a list of row kinds")
    out = compare_rows(flatten(live), flatten(got), "node-a's TCP rows in the two labs")
    if out.passed:
        return Outcome(True, "per packet, from-container met the VIP and made an SVC row before the OUT row; with "
                             "socket LB, connect() was pointed at the backend before any packet existed, so the "
                             "datapath only ever saw a1 talking to a pod: an OUT row, no SVC row.", out.diff)
    return out


# -- 06.2 ---------------------------------------------------------------------------------
def _vip_or_backend(value: Any, svc, bips: dict[str, str]) -> str | None:
    text = str(value).strip().lower()
    if text in (svc.vip, f"{svc.vip}:{svc.port}") or any(w in text for w in ("vip", "service", "clusterip")):
        return "vip"
    host = text.rpartition(":")[0] if ":" in text else text
    if host in bips or host in bips.values() or "backend" in text or "pod" in text:
        return "backend"
    return None


@exercise(
    "06.2",
    "Where the first SYN is addressed",
    hints=(
        "Read the first node-a line of each SYN, at from-container: its destination, before any `=>`.",
        "Print the SYN's from-container line of each open step (the first line of each).",
        "The answer is {'per-packet': 'VIP', 'socket': 'backend'}.",
    ),
)
def first_syn(answer, lab) -> Outcome:
    """Whether the newest SYN from a1 to web met from-container addressed to the VIP or a backend, in both labs."""
    if (blank := unanswered(answer)) is not None:
        return blank
    labs, missing = _both(lab)
    if missing:
        return missing
    live, seen = {}, {}
    for which, l in zip(_KEYS, labs):
        svc = service(l, "web")
        bips, a1 = backend_ips(l, svc), l.pod("a1").ip
        targets = {(svc.vip, svc.port)} | {(ip, 8080) for ip in bips}
        syns = [f for f in recent_flows(l) if f.node == "node-a" and f.hook.label == "from-container"
                and is_syn(f.event.before) and src(f.event.before)[0] == a1 and dst(f.event.before) in targets]
        if not syns:
            return Outcome(False, f"the {which} lab's trace holds no SYN from a1 to web: run the cell that opens a "
                                  "connection in both labs, then check.")
        to = dst(syns[-1].event.before)
        live[which] = "vip" if to == (svc.vip, svc.port) else "backend"
        seen[which] = f"{to[0]}:{to[1]}"
    if live != {"per-packet": "vip", "socket": "backend"}:
        return Outcome(False, f"the newest SYNs met from-container addressed to {seen}: not what the two paths do.")
    got = _dict(answer)
    if got is None:
        return _bad_dict(answer, "'VIP' or 'backend'")
    svc = service(labs[1], "web")
    norm = {k: _vip_or_backend(v, svc, backend_ips(labs[1], svc)) or str(v) for k, v in got.items()}
    out = compare_rows([f"{k}: {v}" for k, v in live.items()], [f"{k}: {v}" for k, v in norm.items()],
                       "what the SYN was addressed to at from-container")
    if out.passed:
        return Outcome(True, f"per packet the SYN leaves a1 for {seen['per-packet']} and from-container rewrites it; "
                             f"with socket LB it leaves a1 already addressed to {seen['socket']}: cgroup/connect4 "
                             "rewrote the address connect() was given, and no packet ever carries the VIP.", out.diff)
    return out


# -- 06.3 ---------------------------------------------------------------------------------
def _reverse_sk(l) -> list[tuple[Ipv4RevnatTuple, Ipv4RevnatEntry]]:
    with PinnedMap(f"{l.pin_dir('node-a')}/{REVERSE_SK_MAP}", Ipv4RevnatTuple, Ipv4RevnatEntry) as m:
        return m.items()


@exercise(
    "06.3",
    "What getpeername() says",
    hints=(
        "Applications must not notice the load balancing, whichever path does it.",
        "Print each open step's result['peer'], and dump cilium_lb4_reverse_sk of the socket-LB lab.",
        "The answer is {'per-packet': '198.19.0.10:80', 'socket': '198.19.0.10:80'}: the VIP in both.",
    ),
)
def peer_name(answer, lab) -> Outcome:
    """The peer a1's socket reports in each lab: checked against the reverse-NATed reply and the reverse_sk entry."""
    if (blank := unanswered(answer)) is not None:
        return blank
    labs, missing = _both(lab)
    if missing:
        return missing
    per, sock = labs
    svc = service(per, "web")
    vip = f"{svc.vip}:{svc.port}"
    a1 = per.pod("a1").ip
    replies = [f for f in recent_flows(per) if f.node == "node-a" and f.hook.label == "to-container"
               and is_syn(f.event.before, ack=True) and f.translated and dst(f.event.after)[0] == a1
               and "{}:{}".format(*src(f.event.after)) == vip]
    if not replies:
        return Outcome(False, "the per-packet lab's trace holds no reply rewritten back to web's VIP: run the cell "
                              "that opens a connection in both labs, then check.")
    ssvc = service(sock, "web")
    entries = [v for _, v in _reverse_sk(sock) if (addr(v.address), socket.ntohs(v.port)) == (ssvc.vip, ssvc.port)]
    if not entries:
        return Outcome(False, f"the socket-LB lab's {REVERSE_SK_MAP} holds no entry for web: run the cell that opens "
                              "a connection in both labs, then check.")
    live = {"per-packet": vip, "socket": f"{ssvc.vip}:{ssvc.port}"}
    got = _dict(answer)
    if got is None:
        return _bad_dict(answer, "an 'address:port'")
    norm = {k: addr_port(per, v) or str(v) for k, v in got.items()}
    out = compare_rows([f"{k}: {v}" for k, v in live.items()], [f"{k}: {v}" for k, v in norm.items()],
                       "what getpeername() returns in a1")
    if out.passed:
        return Outcome(True, "the VIP in both: per packet because to-container rewrites every reply's source back to "
                             "it; with socket LB because the socket really is connected to the backend, and "
                             f"cgroup/getpeername4 looks the socket up in {REVERSE_SK_MAP} and answers with the VIP "
                             "stored there.", out.diff)
    bips = backend_ips(sock, ssvc)
    if any(v.split(":")[0] in bips for v in norm.values()):
        return Outcome(False, f"{out.message} A backend's address is what the packets carry in the socket-LB lab, but "
                              f"not what getpeername() answers: it reads {REVERSE_SK_MAP}.", out.diff)
    return out


# -- 06.4 ---------------------------------------------------------------------------------
def _failure(value: Any) -> str | None:
    text = str(value).strip().lower()
    if any(w in text for w in ("backend not found", "no_service", "no service", "no backend", "-158")):
        return "drop: Service backend not found"
    if any(w in text for w in ("ehostunreach", "no route to host", "113")):
        return "EHOSTUNREACH"
    return None


@exercise(
    "06.4",
    "A Service with no backends",
    hints=(
        "One lab drops a packet, the other never sends one.",
        "Read the per-packet step's DROPPED (...) line, and the socket-LB step's result['error'].",
        "The answer is {'per-packet': 'Service backend not found', 'socket': 'EHOSTUNREACH'}.",
    ),
)
def no_backends(answer, lab) -> Outcome:
    """How a connection to a Service without backends fails in each lab: the drop reason, or no packet at all."""
    if (blank := unanswered(answer)) is not None:
        return blank
    labs, missing = _both(lab, "empty")
    if missing:
        return missing
    per, sock = labs
    for which, l in (("per-packet", per), ("socket", sock)):
        if service(l, "empty").backends:
            return Outcome(False, f"Service 'empty' of the {which} lab has backends: lab.reset() and run the cells of "
                                  "section 4 again.")
    e = service(per, "empty")
    drops = [f for f in recent_flows(per) if f.node == "node-a" and f.dropped and is_syn(f.event.before)
             and dst(f.event.before) == (e.vip, e.port)]
    if not drops:
        return Outcome(False, "the per-packet lab's trace holds no dropped SYN to 'empty': run the cell that connects "
                              "to it in both labs, then check.")
    reason = drops[-1].event.drop_reason
    es = service(sock, "empty")
    sent = [f for f in recent_flows(sock) if f.event.before.proto == _TCP and dst(f.event.before)[0] == es.vip]
    if reason != DropReason.NO_SERVICE or sent:
        return Outcome(False, f"the per-packet SYN was dropped with '{DropReason.text(reason)}' and the socket-LB lab "
                              f"sent {len(sent)} packet(s) to 'empty': not what the two paths do.")
    live = {"per-packet": "drop: Service backend not found", "socket": "EHOSTUNREACH"}
    got = _dict(answer)
    if got is None:
        return _bad_dict(answer, "what went wrong (a drop reason or an errno name)")
    norm = {k: _failure(v) or str(v) for k, v in got.items()}
    diff = tuple(("=" if norm[k] == v else "-", f"{k}: {v}", f"{k}: {norm[k]}") for k, v in live.items())
    if norm == live:
        return Outcome(True, "per packet, the SYN leaves a1 and from-container finds a head with count=0: it drops "
                             "the packet (Service backend not found), and connect() waits until it times out. At the "
                             "socket, connect() itself finds count=0 and fails at once with EHOSTUNREACH: no packet, "
                             "no wait.", diff)
    problems = []
    if norm["per-packet"] != live["per-packet"]:
        problems.append(f"per-packet: {got['per-packet']!r}: the SYN did leave a1 there, and from-container dropped "
                        "it; read the reason in its DROPPED (...) line")
    if norm["socket"] != live["socket"]:
        problems.append(f"socket: {got['socket']!r}: in the socket-LB lab no packet left a1 at all; connect() "
                        "itself failed, read the step's result['error']")
    return Outcome(False, "; ".join(problems) + ".", diff)


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
)
def skip_rev_nat_both(answer, lab) -> Outcome:
    """With skip-rev-nat on in both labs: which lab's connection opens, from the two traces."""
    if (blank := unanswered(answer)) is not None:
        return blank
    labs, missing = _both(lab)
    if missing:
        return missing
    per, sock = labs
    off = [l.name for l in labs if "skip-rev-nat" not in l.faults()]
    if off:
        return Outcome(False, f"the fault is off in {', '.join(off)}: run the break-it cell (it switches it on in both "
                              "labs and connects in each), then check.")
    svc = service(per, "web")
    bips, a1 = backend_ips(per, svc), per.pod("a1").ip
    stray = [f for f in recent_flows(per) if f.node == "node-a" and f.hook.label == "to-container"
             and is_syn(f.event.before, ack=True) and src(f.event.before)[0] in bips and dst(f.event.before)[0] == a1]
    if not stray or stray[-1].translated:
        return Outcome(False, "the per-packet lab's newest SYN|ACK was still rewritten: run the break-it cell again, "
                              "then check.")
    sflows = recent_flows(sock)
    ssvc = service(sock, "web")
    sbips = backend_ips(sock, ssvc)
    syns = [i for i, f in enumerate(sflows) if f.node == "node-a" and f.hook.label == "from-container"
            and is_syn(f.event.before) and src(f.event.before)[0] == a1 and dst(f.event.before)[0] in sbips]
    if not syns:
        return Outcome(False, "the socket-LB lab's trace holds no SYN from a1 to web: run the break-it cell, then check.")
    cp = src(sflows[syns[-1]].event.before)[1]
    acked = [f for f in sflows[syns[-1]:] if f.node == "node-a" and f.hook.label == "from-container"
             and src(f.event.before) == (a1, cp) and f.event.before.tcp_flags & (TcpFlags.SYN | TcpFlags.ACK | TcpFlags.RST)
             == TcpFlags.ACK]
    if not acked:
        return Outcome(False, "the socket-LB lab's newest connection did not complete its handshake: run the break-it "
                              "cell again, then check.")
    said = set(words(answer))
    said_sock = bool(said & {"socket", "sock", "socklb", "socket-lb", "full"})
    said_per = bool(said & {"per-packet", "per", "packet", "perpacket", "hostns", "tc", "both"})
    if said_sock and not said_per:
        return Outcome(True, "socket: its packets carried the backend's address from the first SYN, so the replies "
                             "need no rewriting and the fault has nothing to break. Per packet, the SYN|ACK reached "
                             "a1 from the backend's address and a1 reset it: reverse NAT is what keeps every "
                             "per-packet Service connection alive.")
    if said_per:
        return Outcome(False, f"{answer!r}: the per-packet lab's connection is the one that failed; its SYN|ACK reached "
                              "a1 without `=>`, from the backend's address.", (("-", "socket", str(answer)),))
    return Outcome(False, f"{answer!r} does not name a lab: answer 'per-packet', 'socket', or 'both'.",
                   (("-", "socket", str(answer)),))
