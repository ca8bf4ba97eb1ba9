"""Lab 02, TCP through conntrack: flags seen, SeenNonSyn and the lifetime jump,
closing, the RST of a closed port, expiry on the lab clock, and a break-it fault.

Graders find the connection's rows by what the notebook fixes (a1 → b1, port
8080 or the closed port 9999, the state of the row), never by the client's
random port, and compare the answer with the live row and with the rule.
"""
from __future__ import annotations

import socket
from typing import Any

from ..checks import Outcome, compare_rows, exercise
from ..maps.ct import CtFlags, CtResult, CtRow, TcpFlags
from .lab01 import addr, kinds_answer, newest, recent_flows, row_kind, rows_between, unanswered

_TCP = socket.IPPROTO_TCP
_CLOSING = CtFlags.RX_CLOSING | CtFlags.TX_CLOSING
_CT_FLAG_NAMES = {n.lower(): n for n in CtFlags.names(0xFFFF) if not n.startswith("Unknown")}


def _tcp_rows(lab, node: str, direction: str, dport: int) -> list[CtRow]:
    """TCP rows of a1 → b1:dport with direction ``direction`` on ``node``."""
    return [r for r in rows_between(lab, node, "a1", "b1", "TCP") if r.dir == direction and r.dport == dport]


def _closing(row: CtRow) -> bool:
    return row.flags & _CLOSING == _CLOSING


def _tcp_flags(answer: Any) -> set[str] | None:
    """``["SYN", "ACK"]``, ``"SYN|ACK"``, ``"syn, ack"`` or ``0x12`` as a set of flag names; None if unreadable."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        return set(TcpFlags.text(answer).split("|")) - {"-"}
    items = answer if isinstance(answer, (list, tuple, set)) else [answer]
    names = set()
    for item in items:
        for word in str(item).replace("|", " ").replace(",", " ").split():
            if word.upper() not in TcpFlags.__members__:
                return None
            names.add(word.upper())
    return names


def _ct_flags(answer: Any) -> list[str] | None:
    """CT flag names as Cilium prints them (case forgiven); None if one is not a flag name."""
    items = answer if isinstance(answer, (list, tuple, set)) else str(answer).replace(",", " ").split()
    out = []
    for item in items:
        name = _CT_FLAG_NAMES.get(str(item).strip().lower())
        if name is None:
            return None
        out.append(name)
    return out


# -- 02.1 ---------------------------------------------------------------------------------
@exercise(
    "02.1",
    "TCP flags a1 sent during the handshake",
    hints=(
        "TxFlagsSeen ORs together the TCP flags of every packet the OUT row saw leaving a1 (egress).",
        "a1 sent two packets in the handshake; print TcpFlags.text(row.tx_flags_seen) of node-a's TCP OUT row.",
        "The answer is ['SYN', 'ACK']: a1's SYN, then its ACK (RxFlagsSeen holds b1's SYN|ACK).",
    ),
)
def tx_flags_after_open(answer, lab) -> Outcome:
    """TxFlagsSeen of node-a's open a1 → b1:8080 OUT row, against the handshake rule SYN|ACK."""
    if (blank := unanswered(answer)) is not None:
        return blank
    rows = [r for r in _tcp_rows(lab, "node-a", "OUT", 8080) if not _closing(r)]
    if not rows:
        return Outcome(False, "node-a has no open TCP OUT row from a1 to b1:8080: run conn.open(), then check.")
    row = newest(rows)
    live = set(TcpFlags.text(row.tx_flags_seen).split("|")) - {"-"}
    rule = {"SYN", "ACK"}
    if live != rule:
        return Outcome(False, f"node-a's OUT row has seen {TcpFlags.text(row.tx_flags_seen)} from a1, more than the "
                              "handshake: this question is about the row right after open(). Run the cells again "
                              "from conn = ... and check before sending data.")
    got = _tcp_flags(answer)
    if got is None:
        return Outcome(False, f"{answer!r}: expected TCP flag names ({', '.join(TcpFlags.__members__)}), "
                              "e.g. ['FIN'] or 'SYN|ACK'.")
    out = compare_rows(sorted(live), sorted(got), "TCP flags a1 sent (TxFlagsSeen of node-a's OUT row)")
    if out.passed:
        return Outcome(True, f"{TcpFlags.text(row.tx_flags_seen)}: a1 sent the SYN and then the last ACK of the "
                             "handshake; b1's SYN|ACK went into RxFlagsSeen.", out.diff)
    return out


# -- 02.2 ---------------------------------------------------------------------------------
@exercise(
    "02.2",
    "The lifetime jump at the first non-SYN packet",
    hints=(
        "Each CT lookup in the trace carries the lifetime the row got from that packet.",
        "Print the open step's from-container/to-container records with f.event.ct_lifetime - opened.now, "
        "and compare with lab.config.timeouts.",
        "The answer is (60, 8000): the SYN timeout (syn), then the established TCP lifetime (tcp).",
    ),
)
def lifetime_jump(answer, lab) -> Outcome:
    """(lifetime after the SYN, after the ACK) in seconds, checked against the trace's handshake and the timeouts."""
    if (blank := unanswered(answer)) is not None:
        return blank
    a1, b1 = lab.pod("a1").ip, lab.pod("b1").ip
    out = [f for f in recent_flows(lab) if f.node == "node-a" and f.hook.label == "from-container"
           and f.event.before.proto == _TCP and (addr(f.event.before.saddr), addr(f.event.before.daddr)) == (a1, b1)
           and socket.ntohs(f.event.before.dport) == 8080]
    syns = [i for i, f in enumerate(out) if f.event.before.tcp_flags & (TcpFlags.SYN | TcpFlags.ACK) == TcpFlags.SYN
            and f.event.ct_result == CtResult.NEW]
    if not syns:
        return Outcome(False, "the trace holds no handshake of a1 → b1:8080: run conn.open(), then check.")
    syn = out[syns[-1]]
    acks = [f for f in out[syns[-1] + 1:] if f.event.before.sport == syn.event.before.sport
            and not f.event.before.tcp_flags & TcpFlags.SYN]
    if not acks:
        return Outcome(False, "the newest handshake in the trace has no ACK from a1 yet: run conn.open() again.")
    ack = acks[0]
    t = lab.config.timeouts
    jump = ack.event.ct_lifetime - syn.event.ct_lifetime
    if abs(jump - (t.tcp - t.syn)) > 2 or not ack.event.ct_flags & CtFlags.SEEN_NON_SYN:
        return Outcome(False, f"in the newest handshake the ACK moved the lifetime by {jump} s "
                              f"(flags [{' '.join(CtFlags.names(ack.event.ct_flags))}]), not by tcp - syn = "
                              f"{t.tcp - t.syn} s: is a fault on? (lab.faults() = {lab.faults()})")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in answer):
        return Outcome(False, f"expected two whole numbers of seconds, (after the SYN, after the ACK), got {answer!r}.")
    expected = (t.syn, t.tcp)
    if tuple(answer) == expected:
        return Outcome(True, f"{expected}: a new TCP row lives CT_SYN_TIMEOUT ({t.syn} s) until a packet without SYN "
                             f"sets SeenNonSyn; from then on CT_CONNECTION_LIFETIME_TCP ({t.tcp} s). The trace shows "
                             f"the ACK moving the lifetime by {jump} s.")
    diff = tuple(("=" if e == g else "-", f"{what} {e} s", f"{g} s")
                 for what, e, g in zip(("after the SYN", "after the ACK"), expected, answer))
    return Outcome(False, f"you answered {tuple(answer)}; in the trace the ACK moved the row's lifetime by {jump} s. "
                          "The two values are timeouts you can read in lab.config.timeouts.", diff)


# -- 02.3 ---------------------------------------------------------------------------------
@exercise(
    "02.3",
    "Flags of a closed connection",
    hints=(
        "Each FIN marks the direction it travelled as closing; the handshake's flag stays.",
        "Read the [ ... ] after Flags= in node-a's TCP OUT line after conn.close() (row.flag_names).",
        "The answer is ['RxClosing', 'TxClosing', 'SeenNonSyn'].",
    ),
)
def flags_after_close(answer, lab) -> Outcome:
    """Flag names of node-a's closed a1 → b1:8080 OUT row, live and by the rule."""
    if (blank := unanswered(answer)) is not None:
        return blank
    rows = [r for r in _tcp_rows(lab, "node-a", "OUT", 8080) if _closing(r)]
    if not rows:
        return Outcome(False, "node-a has no closed TCP OUT row from a1 to b1:8080: run conn.close(), then check.")
    row = newest(rows)
    rule = ["RxClosing", "TxClosing", "SeenNonSyn"]
    if sorted(row.flag_names) != sorted(rule):
        return Outcome(False, f"node-a's closed OUT row shows [ {' '.join(row.flag_names)} ], not what a graceful "
                              f"close leaves: is a fault on? (lab.faults() = {lab.faults()})")
    got = _ct_flags(answer)
    if got is None:
        return Outcome(False, f"{answer!r}: expected CT flag names as the line prints them between [ ], "
                              f"e.g. ['NodePort']; the names are {', '.join(CtFlags.names(0xFFFF)[:-1])}.")
    out = compare_rows(row.flag_names, got, "Flags of node-a's closed OUT row")
    if out.passed:
        return Outcome(True, "RxClosing (b1's FIN came in), TxClosing (a1's FIN went out) and SeenNonSyn from "
                             "the handshake. With both closing flags the row is dead and gets the close timeout.",
                       out.diff)
    return out


# -- 02.4 ---------------------------------------------------------------------------------
@exercise(
    "02.4",
    "Lifetime of a connection refused with RST",
    hints=(
        "An RST before the handshake completed closes a row in both directions at once; what lifetime does a dead "
        "row get?",
        "Look at node-b's TCP IN row for port 9999: its Flags= and (remaining: …), and lab.config.timeouts.",
        "The answer is 10: the close timeout (lab.config.timeouts.close).",
    ),
)
def rst_lifetime(answer, lab) -> Outcome:
    """Seconds node-b's IN row of the refused connection lives: the close timeout, row closed both ways."""
    if (blank := unanswered(answer)) is not None:
        return blank
    rows = _tcp_rows(lab, "node-b", "IN", 9999)
    if not rows:
        return Outcome(False, "node-b has no TCP IN row from a1 to b1:9999: run the refused connection cell, then check.")
    row = newest(rows)
    t, now = lab.config.timeouts, lab.clock.now()
    if not _closing(row) or row.remaining(now) > t.close:
        return Outcome(False, f"node-b's IN row for port 9999 shows [ {' '.join(row.flag_names)} ] with "
                              f"{row.remaining(now)} s left; after the RST it should be closed both ways with at most "
                              f"{t.close} s left. Is a fault on? (lab.faults() = {lab.faults()})")
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome(False, f"expected a whole number of seconds, got {answer!r}.")
    if answer == t.close:
        return Outcome(True, f"{t.close} s: the RST set RxClosing and TxClosing together, so the row was dead at "
                             f"once and got CT_CLOSE_TIMEOUT; it has {row.remaining(now)} s left now.")
    return Outcome(False, f"you answered {answer} s; node-b's IN row is closed both ways (RxClosing and TxClosing) "
                          f"and has {row.remaining(now)} s left on the lab clock. Which timeout does a dead row get?",
                   (("-", "lifetime of a dead row", f"{answer} s"),))


# -- 02.5 ---------------------------------------------------------------------------------
@exercise(
    "02.5",
    "Which rows expired when the clock moved",
    hints=(
        "Dead TCP rows got the close timeout; a RELATED twin keeps the SYN timeout it was written with.",
        "The loop after lab.clock.advance(11) prints EXPIRED or alive and the kind of every row of node-a.",
        "The answer is ['TCP OUT']: both closed TCP rows expired; the ICMP OUT related twin still has time left.",
    ),
)
def expired_rows(answer, lab) -> Outcome:
    """Kinds of node-a's expired rows, live, after the clock moved past the close timeout."""
    if (blank := unanswered(answer)) is not None:
        return blank
    now = lab.clock.now()
    rows = lab.ct("node-a")
    expired = sorted({row_kind(r) for r in rows if r.expired(now)})
    if not expired:
        return Outcome(False, "no row of node-a has expired yet: run the cell that advances the lab clock "
                              "(lab.clock.advance(...)), then check.")
    stale = [r for r in rows if _closing(r) and not r.expired(now)]
    if stale:
        return Outcome(False, f"{len(stale)} closed TCP row(s) of node-a still have time left: advance the clock past "
                              f"the close timeout ({lab.config.timeouts.close} s), then check.")
    got = kinds_answer(answer)
    if got is None:
        return Outcome(False, f"expected a list of row kinds such as ['UDP IN', 'ICMP OUT related'], got {answer!r}.")
    out = compare_rows(expired, got, f"expired rows of node-a at lab clock {now}")
    if out.passed:
        alive = sorted({row_kind(r) for r in rows if not r.expired(now)})
        return Outcome(True, f"{expired} expired: the closed connections had only the close timeout. "
                             f"Still alive: {alive or 'nothing'}. Expired rows stay until garbage collection "
                             "deletes them.", out.diff)
    return out


# -- 02.6 (break it) ----------------------------------------------------------------------
@exercise(
    "02.6",
    "Break it: an established connection that does not look established",
    hints=(
        "Compare conn2's OUT row with conn's right after its open(): Flags=, and (remaining: …).",
        "One flag that the handshake's ACK set before is missing, and the row kept the lifetime it had after the SYN.",
        "The answer is ('SeenNonSyn', 60): SeenNonSyn is never set, so the row keeps the SYN timeout.",
    ),
    break_it=True,
)
def wrong_lifetime(answer, lab) -> Outcome:
    """With wrong-lifetime on: the missing flag and the kept lifetime of an established row, seen live."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "wrong-lifetime" not in lab.faults():
        return Outcome(False, "the fault is off: run the cell that switches it on (lab.fault('wrong-lifetime')) and "
                              "the cells that open and use conn2, then check.")
    t, now = lab.config.timeouts, lab.clock.now()
    rows = [r for r in _tcp_rows(lab, "node-a", "OUT", 8080) if not _closing(r) and r.tx_flags_seen & TcpFlags.ACK]
    if not rows:
        return Outcome(False, "node-a has no open, established TCP OUT row from a1 to b1:8080: run conn2.open(), "
                              "then check.")
    row = newest(rows)
    if "SeenNonSyn" in row.flag_names or row.remaining(now) > t.syn:
        return Outcome(False, f"node-a's newest open row looks healthy ([ {' '.join(row.flag_names)} ], "
                              f"{row.remaining(now)} s left): was it opened before the fault? Run conn2's cells again.")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected (missing flag name, seconds of lifetime it keeps), got {answer!r}.")
    flag, seconds = answer
    flag_ok = str(flag).strip().lower() == "seennonsyn"
    seconds_ok = isinstance(seconds, int) and not isinstance(seconds, bool) and seconds == t.syn
    diff = (("=" if flag_ok else "-", "the missing flag", str(flag)),
            ("=" if seconds_ok else "-", "the lifetime it keeps", f"{seconds} s"))
    if flag_ok and seconds_ok:
        return Outcome(True, f"SeenNonSyn never gets set, so every packet gives the row CT_SYN_TIMEOUT ({t.syn} s) "
                             f"again: it has {row.remaining(now)} s left and would expire a minute after the "
                             "connection goes quiet.", diff)
    problems = []
    if not flag_ok:
        problems.append(f"{flag!r} is not the missing flag: the row shows [ {' '.join(row.flag_names)} ] after "
                        f"TxFlagsSeen={TcpFlags.text(row.tx_flags_seen)}")
    if not seconds_ok:
        problems.append(f"{seconds!r} s is not the lifetime it kept: the row has {row.remaining(now)} s left")
    return Outcome(False, "; ".join(problems) + ".", diff)
