"""Lab 02, TCP through conntrack: flags seen, SeenNonSyn and the lifetime jump, closing, the RST of a closed
port, expiry on the lab clock, and a break-it fault.

Graders read what the notebook's cells recorded: the open, close and refused steps of a1 → b1 (their rows
and trace records), the snapshot taken after the clock moved, and conn2's steps taken with the fault on.
Each compares the answer with that evidence and with the rule the exercise teaches; evidence that breaks
the rule (a fault was on) sends the learner back to the cell, at no cost.
"""
from __future__ import annotations

import socket
from typing import Any

from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.maps.ct import CtFlags, CtResult, CtRow, TcpFlags
from labkit.grading.exercises.common import conn_rows, flag_list, kinds_answer, row_kind, step_rows, unhealthy

_CLOSING = CtFlags.RX_CLOSING | CtFlags.TX_CLOSING
OPEN, CLOSE, REFUSED, CLOCK, BREAK = ("1. Open: SYN, SYN-ACK, ACK", "4. Close: FIN both ways",
                                      "5. RST: a port nobody listens on", "6. Moving the clock", "7. Break it")


def _step(ev, op: str, port: int = 8080, **attrs):
    """The newest a1 → b1 step ``op`` on ``port`` taken outside section 7 (whose fault, wrong-lifetime, breaks
    what sections 1-6 ask about on purpose)."""
    return ev.step(op=op, actor="a1", target="b1", port=port, faults=lambda f: "wrong-lifetime" not in f, **attrs)


def _closing(row: CtRow) -> bool:
    return row.flags & _CLOSING == _CLOSING


def _tcp_flags(answer: Any) -> set[str] | None:
    """``["SYN", "ACK"]``, ``"SYN|ACK"``, ``"syn, ack"`` or ``0x12`` as a set of flag names; None if unreadable."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        return set(TcpFlags.text(answer).split("|")) - {"-"}
    names = flag_list(answer, TcpFlags.__members__)
    return None if names is None else {n.upper() for n in names}


# -- 02.1 ---------------------------------------------------------------------------------
@exercise(
    "02.1",
    "TCP flags a1 sent during the handshake",
    hints=(
        "TxFlagsSeen collects flags over time: it is not the flags of one packet.",
        "a1 sent two packets in the handshake; print TcpFlags.text(row.tx_flags_seen) of node-a's TCP OUT row "
        "(describe(...) in section 1 prints it).",
        "The answer is ['SYN', 'ACK']: a1's SYN, then its ACK (RxFlagsSeen holds b1's SYN|ACK).",
    ),
    fault="no-flags-seen",
    cells=(OPEN,),
)
def tx_flags_after_open(answer, ev) -> Outcome:
    """TxFlagsSeen of node-a's OUT row right after the open step, against the handshake rule SYN|ACK."""
    step = _step(ev, "tcp-open", ok=True)
    if step is None:
        return Outcome.needs(OPEN, "conn.open() records the handshake")
    rows = conn_rows(step, "node-a", "OUT")
    live = {n for r in rows for n in TcpFlags.text(r.tx_flags_seen).split("|")} - {"-"}
    if live != {"SYN", "ACK"}:
        return unhealthy(OPEN, f"node-a's OUT row with TxFlagsSeen={'|'.join(sorted(live)) or '-'} after the "
                               "handshake", step)
    got = _tcp_flags(answer)
    if got is None:
        return Outcome.unreadable(f"{answer!r}: expected TCP flag names ({', '.join(TcpFlags.__members__)}), "
                                  "e.g. ['FIN'] or 'SYN|ACK'.")
    out = compare_rows(sorted(live), sorted(got), "TCP flags a1 sent (TxFlagsSeen of node-a's OUT row)")
    if out.passed:
        return Outcome(True, "SYN|ACK: a1 sent the SYN and then the last ACK of the handshake; b1's SYN|ACK went "
                             "into RxFlagsSeen.", out.diff)
    if got == {"SYN"}:
        msg = "the SYN was not a1's only packet: TxFlagsSeen ORs every packet a1 sent into the row."
    elif got == {"ACK"}:
        msg = "the row keeps more than the last packet's flags: TxFlagsSeen is an OR over everything a1 sent."
    elif "PSH" in got or "FIN" in got:
        msg = "no data and no FIN had been sent yet: the question is about the row right after open()."
    else:
        msg = out.message + " Which packets of the handshake did a1 itself send?"
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 02.2 ---------------------------------------------------------------------------------
@exercise(
    "02.2",
    "The lifetime jump at the first non-SYN packet",
    hints=(
        "Each CT lookup in the trace carries the lifetime the row got from that packet.",
        "Section 2's loop prints lifetime = now + N for each packet of the open step; compare with "
        "lab.config.timeouts.",
        "The answer is (60, 8000): the SYN timeout (syn), then the established TCP lifetime (tcp).",
    ),
    fault="wrong-lifetime",
    cells=(OPEN,),
)
def lifetime_jump(answer, ev) -> Outcome:
    """(lifetime after the SYN, after the ACK) in seconds, read from the open step's own trace records."""
    step = _step(ev, "tcp-open", ok=True)
    if step is None:
        return Outcome.needs(OPEN, "conn.open() records the handshake's trace")
    a1, b1, sport = ev.topology.pod("a1").ip, ev.topology.pod("b1").ip, step.attrs["sport"]
    out = [f for f in step.flows if f.node == "node-a" and f.hook.label == "from-container"
           and f.event.before.proto == socket.IPPROTO_TCP and socket.ntohs(f.event.before.sport) == sport]
    syn = next((f for f in out if f.event.before.tcp_flags & (TcpFlags.SYN | TcpFlags.ACK) == TcpFlags.SYN
                and f.event.ct_result == CtResult.NEW), None)
    ack = next((f for f in out if not f.event.before.tcp_flags & TcpFlags.SYN), None)
    t = ev.config.timeouts
    if syn is None or ack is None:
        return unhealthy(OPEN, "no SYN and ACK of a1 at node-a's from-container", step)
    jump = ack.event.ct_lifetime - syn.event.ct_lifetime
    if abs(jump - (t.tcp - t.syn)) > 2 or not ack.event.ct_flags & CtFlags.SEEN_NON_SYN:
        return unhealthy(OPEN, f"an ACK that moved the lifetime by {jump} s with flags "
                               f"[{' '.join(CtFlags.names(ack.event.ct_flags))}]", step)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in answer):
        return Outcome.unreadable(f"expected two whole numbers of seconds, (after the SYN, after the ACK), got "
                                  f"{answer!r}.")
    expected = (t.syn, t.tcp)
    if tuple(answer) == expected:
        return Outcome(True, f"{expected}: a new TCP row lives CT_SYN_TIMEOUT ({t.syn} s) until a packet without "
                             f"SYN sets SeenNonSyn; from then on CT_CONNECTION_LIFETIME_TCP ({t.tcp} s). The trace "
                             f"shows the ACK moving the lifetime by {jump} s.")
    diff = tuple(("=" if e == g else "-", f"{what} {e} s", f"{g} s")
                 for what, e, g in zip(("after the SYN", "after the ACK"), expected, answer))
    first, second = answer
    if first == second:
        msg = (f"your two lifetimes are equal, but in your open step the ACK moved the row's lifetime by {jump} s: "
               "something about the ACK changed which timeout the row gets.")
    elif first > second:
        msg = "a half-open connection does not get the longer lifetime: the jump goes the other way."
    else:
        msg = f"in your open step the ACK moved the lifetime by {jump} s; the two values are timeouts you can read " \
              "in lab.config.timeouts."
    return Outcome(False, msg, diff, reveal=f"{expected}")


# -- 02.3 ---------------------------------------------------------------------------------
@exercise(
    "02.3",
    "Flags of a closed connection",
    hints=(
        "Each FIN marks the direction it travelled as closing; the handshake's flag stays.",
        "Read the [ ... ] after Flags= in node-a's TCP OUT line after conn.close() (row.flag_names).",
        "The answer is ['RxClosing', 'TxClosing', 'SeenNonSyn'].",
    ),
    fault="no-close",
    cells=(CLOSE,),
)
def flags_after_close(answer, ev) -> Outcome:
    """Flag names of node-a's OUT row after the close step, live and by the rule."""
    step = _step(ev, "tcp-close", ok=True)
    if step is None:
        return Outcome.needs(CLOSE, "conn.close() records both FINs")
    rows = conn_rows(step, "node-a", "OUT")
    rule = ["RxClosing", "TxClosing", "SeenNonSyn"]
    if len(rows) != 1 or sorted(rows[0].flag_names) != sorted(rule):
        return unhealthy(CLOSE, "node-a's OUT row as [ " + " ".join(rows[0].flag_names if rows else ["no row"]) + " ]",
                         step)
    got = flag_list(answer, CtFlags.names(0xFFFF))
    if got is None:
        return Outcome.unreadable(f"{answer!r}: expected CT flag names as the line prints them between [ ], e.g. "
                                  f"['NodePort']; the names are {', '.join(CtFlags.names(0x07FF))}.")
    out = compare_rows(rows[0].flag_names, got, "Flags of node-a's closed OUT row")
    if out.passed:
        return Outcome(True, "RxClosing (b1's FIN came in), TxClosing (a1's FIN went out) and SeenNonSyn from the "
                             "handshake. With both closing flags the row is dead and gets the close timeout.", out.diff)
    have = set(got)
    if have == {"RxClosing", "TxClosing"}:
        msg = "closing does not clear what the handshake set: a flag set by the ACK is sticky."
    elif have <= {"TxClosing", "SeenNonSyn"}:
        msg = "a1's FIN closed one direction; the connection was closed from both ends."
    else:
        msg = out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 02.4 ---------------------------------------------------------------------------------
@exercise(
    "02.4",
    "Lifetime of a connection refused with RST",
    hints=(
        "An RST closes a row in both directions at once: what does a dead row get?",
        "Look at node-b's TCP IN row for port 9999 (section 5 prints it): its Flags= and its seconds left, and "
        "lab.config.timeouts.",
        "The answer is 10: the close timeout (lab.config.timeouts.close).",
    ),
    fault="no-close",
    cells=(REFUSED,),
)
def rst_lifetime(answer, ev) -> Outcome:
    """Seconds node-b's IN row of the refused connection lives: the close timeout, row closed both ways."""
    step = _step(ev, "tcp-open", port=9999)
    if step is None:
        return Outcome.needs(REFUSED, "the connection to port 9999 records the RST")
    t = ev.config.timeouts
    rows = conn_rows(step, "node-b", "IN")
    if len(rows) != 1 or not _closing(rows[0]) or rows[0].remaining(step.now) > t.close:
        saw = (f"node-b's IN row for port 9999 as [ {' '.join(rows[0].flag_names)} ] with "
               f"{rows[0].remaining(step.now)} s left") if rows else "no IN row on node-b for port 9999"
        return unhealthy(REFUSED, saw, step)
    row = rows[0]
    if isinstance(answer, bool) or not isinstance(answer, int):
        return Outcome.unreadable(f"expected a whole number of seconds, got {answer!r}.")
    if answer == t.close:
        return Outcome(True, f"{t.close} s: the RST set RxClosing and TxClosing together, so the row was dead at once "
                             f"and got CT_CLOSE_TIMEOUT; it had {row.remaining(step.now)} s left after the step.")
    if answer == t.syn:
        msg = "the row did start with the SYN timeout, but the RST changed it: what happens to a row whose " \
              "both directions are closing?"
    elif answer == t.tcp:
        msg = "SeenNonSyn is set (the RST|ACK had no SYN), but a dead row does not get the established lifetime."
    else:
        msg = "node-b's IN row is closed both ways right after the RST (RxClosing and TxClosing): which timeout " \
              "does a dead row get?"
    return Outcome(False, msg, (("-", f"{t.close} s", f"{answer} s"),), reveal=f"{t.close} (the close timeout)")


# -- 02.5 ---------------------------------------------------------------------------------
@exercise(
    "02.5",
    "Which rows expired when the clock moved",
    hints=(
        "Dead TCP rows got the close timeout; the RELATED twin got the SYN timeout when it was written.",
        "The loop after lab.clock.advance(11) prints EXPIRED or alive and the kind of every row of node-a.",
        "The answer is ['TCP OUT']: both closed TCP rows expired; the ICMP OUT related twin still has time left.",
    ),
    fault="no-close",
    cells=(CLOCK,),
)
def expired_rows(answer, ev) -> Outcome:
    """Kinds of node-a's expired rows in the snapshot taken after the clock moved."""
    snap = ev.snapshot("after the clock moved")
    if snap is None:
        return Outcome.needs(CLOCK, "it moves the clock and records node-a's rows")
    rows = snap.rows("node-a")
    expired = sorted({row_kind(r) for r in rows if r.expired(snap.now)})
    closed = [r for r in rows if r.proto_name == "TCP" and _closing(r)]
    if not closed or any(not r.expired(snap.now) for r in closed) or not expired:
        return unhealthy(CLOCK, f"{len(closed)} closed TCP row(s) on node-a, expired: {expired or 'none'}")
    got = kinds_answer(answer)
    if got is None:
        return Outcome.unreadable(f"expected a list of row kinds such as ['UDP IN', 'ICMP OUT related'], got "
                                  f"{answer!r}.")
    out = compare_rows(expired, got, f"expired rows of node-a at lab clock {snap.now}")
    if out.passed:
        alive = sorted({row_kind(r) for r in rows if not r.expired(snap.now)})
        return Outcome(True, f"{expired} expired: the closed connections had only the close timeout. Still alive: "
                             f"{alive or 'nothing'}. Expired rows stay until garbage collection deletes them.", out.diff)
    if not got:
        msg = "a row is expired once the clock passes its lifetime, whether or not anything deleted it yet."
    elif any("related" in g for g in got):
        msg = "the twin does not share its connection's fate: nothing about the close touched it."
    else:
        msg = out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 02.6 (break it) ----------------------------------------------------------------------
@exercise(
    "02.6",
    "Break it: an established connection that does not look established",
    hints=(
        "Compare conn2's OUT row with conn's right after its open(): Flags=, and its seconds left.",
        "One flag that the handshake's ACK set before is missing, and the row kept the lifetime it had after the SYN.",
        "The answer is ('SeenNonSyn', 60): SeenNonSyn is never set, so the row keeps the SYN timeout.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def wrong_lifetime(answer, ev) -> Outcome:
    """With wrong-lifetime on: the missing flag and the kept lifetime of conn2's established row."""
    step = ev.step(op="tcp-send", actor="a1", target="b1", port=8080, faults=lambda f: "wrong-lifetime" in f)
    if step is None:
        return Outcome.needs(BREAK, "it switches the fault on, then opens and uses conn2")
    t = ev.config.timeouts
    rows = conn_rows(step, "node-a", "OUT")
    if len(rows) != 1 or "SeenNonSyn" in rows[0].flag_names or rows[0].remaining(step.now) > t.syn:
        return unhealthy(BREAK, "conn2's row looking healthy", step)
    row = rows[0]
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome.unreadable(f"expected (missing flag name, seconds of lifetime it keeps), got {answer!r}.")
    flag, seconds = answer
    flag_ok = str(flag).strip().lower() == "seennonsyn"
    seconds_ok = isinstance(seconds, int) and not isinstance(seconds, bool) and seconds == t.syn
    diff = (("=" if flag_ok else "-", "the missing flag", str(flag)),
            ("=" if seconds_ok else "-", "the lifetime it keeps", f"{seconds} s"))
    if flag_ok and seconds_ok:
        return Outcome(True, f"SeenNonSyn never gets set, so every packet gives the row CT_SYN_TIMEOUT ({t.syn} s) "
                             f"again: it had {row.remaining(step.now)} s left and would expire a minute after the "
                             "connection goes quiet.", diff)
    problems = []
    if not flag_ok:
        problems.append(f"{flag!r} is not the missing flag: conn2's row shows [ {' '.join(row.flag_names)} ]; "
                        "a closing flag would only come with a FIN or RST")
    if not seconds_ok:
        problems.append(f"{seconds!r} s is not the lifetime it kept: compare conn2's seconds left after the send "
                        "with conn's after the handshake, and with lab.config.timeouts")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"('SeenNonSyn', {t.syn})")
