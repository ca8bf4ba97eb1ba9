"""Lab 12, around the stack: what same-node pod traffic looks like at the veth hooks once sockets talk to sockets
(sockmap), what conntrack still counts, where ext's NodePort traffic is translated with and without XDP, what the
XDP program drops before an skb exists, and a break-it fault that takes the XDP program out of the path.

Graders read what the notebook's cells recorded: each step's trace records (hook, TCP flags, translation, drop
reason) and the CT rows before and after it. The rules the answers follow:

- Cilium 1.4-1.13's bpf/sockops/ (``--sockops-enable``; labkit's bpf_sockops.c and bpf_redir.c): sock_ops records
  an *established* socket whose peer is a local endpoint in the sockhash cilium_sock_ops, and sk_msg redirects every
  later send to the peer socket (``msg_redirect_hash(..., BPF_F_INGRESS)``). The handshake happens before either end
  is recorded and the teardown (FIN, ACK) is built by TCP itself, not by a send, so both still cross the tc hooks;
  the data and its ACKs never become segments. Conntrack counts only what crosses a hook (bpf/lib/conntrack.h
  counts each lookup that finds the entry, with CONNTRACK_ACCOUNTING).
- Cilium v1.16's bpf_xdp.c (``--bpf-lb-acceleration=native``): nodeport_lb4 runs in XDP for traffic from outside
  to a NodePort/LoadBalancer frontend, with the same maps and rows as cil_from_netdev; a frontend without backends
  is DROP_NO_SERVICE (lb4_local, ``svc->count == 0``), answered with ICMP port unreachable (XDP_TX, the default
  --service-no-backend-response=reject), and an IPv4 fragment DROP_FRAG_NOSUPPORT, before the kernel builds an skb. Without the XDP program (tc only), cil_from_netdev takes the same decisions on the skb.

(tests/datapath/test_sockmap.py and tests/datapath/test_xdp_nodeport.py pin the same behaviour packet by packet.)
"""
from __future__ import annotations

import re
from typing import Any

from labkit.constants import DropReason, Hook, TraceFlags
from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.grading.exercises.common import broken_step, hook_name, is_syn, src, unhealthy
from labkit.maps.ct import TcpFlags

SAME, COUNT, NODEPORT, DROPS, BREAK = (
    "1. Same node, socket to socket", "2. What conntrack counted", "3. NodePort: tc, then XDP",
    "4. Dropped before an skb", "5. Break it")
_FAULT = "xdp-pass"  #: section 5's fault (its crafted fragment is a step of its own kind: sections 3 and 4 never match it)
_LXC = (Hook.FROM_CONTAINER, Hook.TO_CONTAINER)
_FLAG_BITS = {f.name: f for f in TcpFlags if f.name}


def _conn_steps(ev, actor: str, target: str) -> dict[str, Any] | None:
    """The newest open of ``actor`` -> ``target``:8080 and the send and close of that same connection."""
    opened = ev.step(op="tcp-open", actor=actor, target=target, port=8080)
    if opened is None:
        return None
    conn = opened.attrs.get("conn")
    out = {"open": opened}
    for op in ("send", "close"):
        out[op] = next((s for s in reversed(ev.steps(op=f"tcp-{op}", actor=actor, target=target, port=8080))
                        if s.attrs.get("conn") == conn), None)
    return out


def _flag_set(text: Any) -> frozenset[str] | None:
    """``'SYN|ACK'``, ``'ack+syn'``, ``'SYN ACK'`` -> ``{'SYN', 'ACK'}``; None when a word is not a TCP flag."""
    names = [w.upper() for w in re.split(r"[|+,\s/]+", str(text).strip()) if w]
    if not names or any(n not in _FLAG_BITS for n in names):
        return None
    return frozenset(names)


def _flag_text(flags: frozenset[str]) -> str:
    return TcpFlags.text(sum(_FLAG_BITS[n] for n in flags))


def _out_packets(step, node: str, sport: int) -> int | None:
    """Packets of ``node``'s OUT row of the connection from ``sport`` to port 8080, after ``step``."""
    rows = [r for r in step.after.get(node, []) if r.proto_name == "TCP" and r.dir == "OUT" and not r.related
            and r.sport == sport and r.dport == 8080]
    return rows[0].packets if rows else None


def _reason(text: Any) -> DropReason | None:
    """A drop reason as the learner wrote it: its text (``'Service backend not found'``), its name
    (``'NO_SERVICE'``, ``'DROP_NO_SERVICE'``) or its number (-158)."""
    if isinstance(text, DropReason):
        return text
    if isinstance(text, int) and not isinstance(text, bool):
        return DropReason(text) if text in set(DropReason) else None
    s = str(text).strip()
    for reason in DropReason:
        if s.lower() == DropReason.text(reason).lower():
            return reason
    name = s.upper().replace("-", "_").replace(" ", "_")
    name = name[5:] if name.startswith("DROP_") else name
    return DropReason.__members__.get(name)


def _reason_text(reason: DropReason) -> str:
    return DropReason.text(reason)


def _hook_and_reason(answer: Any) -> tuple[str, DropReason | None] | None:
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return None
    return hook_name(answer[0]), _reason(answer[1])


# -- 12.1 ---------------------------------------------------------------------------------
@exercise(
    "12.1",
    "What the veths still see",
    hints=(
        "Read the lines of the three steps of a1's connection to a2 (open, send, close): every line at node-a's "
        "from-container or to-container shows the segment's TCP flags.",
        "The send step printed no line at all. Which segments are left: those of the handshake, and those that "
        "TCP builds itself when a socket closes.",
        "The answer is ['SYN', 'SYN|ACK', 'ACK', 'FIN|ACK']: the handshake and the teardown cross the hooks; the "
        "data (PSH|ACK) and its ACKs go socket to socket.",
    ),
    fault="sock-no-redirect",
    cells=(SAME,),
)
def flags_at_the_veths(answer, ev) -> Outcome:
    """The TCP flag combinations node-a's lxc hooks saw of a1 -> a2's open, send and close (section 1), with
    sockmap on."""
    conn = _conn_steps(ev, "a1", "a2")
    if conn is None or conn["send"] is None or conn["close"] is None:
        return Outcome.needs(SAME, "a1's connection to a2: open, send, close")
    steps = (conn["open"], conn["send"], conn["close"])
    if not all(s.ok for s in steps):
        failed = next(s for s in steps if not s.ok)
        return unhealthy(SAME, f"'{failed.title}' failing", failed)
    live = {frozenset(TcpFlags.text(f.event.before.tcp_flags).split("|")) for s in steps for f in s.flows
            if f.node == "node-a" and f.hook in _LXC and f.event.before.proto == 6}
    if not isinstance(answer, (list, tuple, set)) or not answer:
        return Outcome(False, f"expected a list of TCP flag combinations such as ['SYN', 'FIN|ACK'], got {answer!r}.")
    got = [_flag_set(a) for a in answer]
    if any(g is None for g in got):
        bad = [a for a, g in zip(answer, got) if g is None]
        return Outcome(False, f"{bad} are not TCP flags: write combinations as they appear on the lines, e.g. "
                              "'SYN|ACK'.")
    out = compare_rows([_flag_text(f) for f in live], [_flag_text(g) for g in got], "flag combinations at node-a's "
                       "lxc hooks")
    if out.passed:
        return Outcome(True, "only the handshake and the teardown crossed a1's and a2's veths: sock_ops put both "
                             "sockets into cilium_sock_ops once they were established, and from then on every "
                             "sendmsg() was handed by sk_msg straight to the peer socket's receive queue. No data "
                             "segment, no ACK of data. The FINs are not sends: TCP builds them when a socket closes, "
                             "so they take the stack.", out.diff)
    have = set(got)
    if frozenset({"PSH", "ACK"}) in have:
        msg = "a segment carrying data (PSH) never reached a veth in this connection: look at the send step's lines."
    elif not have & {frozenset({"FIN", "ACK"}), frozenset({"FIN"})}:
        msg = "the redirect handles sends only; closing a socket is not a send, and its segments take the stack."
    elif frozenset({"SYN"}) not in have:
        msg = "sock_ops records a socket once it is established: the handshake before that crossed the hooks."
    else:
        msg = out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 12.2 ---------------------------------------------------------------------------------
@exercise(
    "12.2",
    "What conntrack counted",
    hints=(
        "Read node-a's OUT row of a1 -> a2 after the open and after the send: `Packets=` on its line (the rows "
        "section 2 printed, or each step's rows).",
        "A row counts a packet each time a hook's lookup finds it. How many packets of that connection reached a "
        "hook before the send, and how many during it?",
        "The answer is (3, 3): SYN, SYN|ACK and ACK each passed one lookup of the OUT row, and the send added no "
        "packet to count.",
    ),
    fault="no-accounting",
    cells=(SAME, COUNT),
)
def packets_counted(answer, ev) -> Outcome:
    """(Packets of node-a's OUT row of a1 -> a2 after its open, after its send), from section 1's connection; graded
    only when section 2's a1 -> b1 send was counted (accounting on)."""
    conn = _conn_steps(ev, "a1", "a2")
    if conn is None or conn["send"] is None:
        return Outcome.needs(SAME, "a1's connection to a2 records its rows")
    far = _conn_steps(ev, "a1", "b1")
    if far is None or far["send"] is None:
        return Outcome.needs(COUNT, "a1's connection to b1 records what a counted send looks like")
    sport = conn["open"].attrs.get("sport")
    live = (_out_packets(conn["open"], "node-a", sport), _out_packets(conn["send"], "node-a", sport))
    far_sport = far["open"].attrs.get("sport")
    far_counts = (_out_packets(far["open"], "node-a", far_sport), _out_packets(far["send"], "node-a", far_sport))
    if None in live or None in far_counts or not far_counts[1] or far_counts[1] <= far_counts[0] or not live[0]:
        saw = "no OUT row of a1 -> a2 on node-a" if None in live else \
            f"a1 -> b1's OUT row counting {far_counts[0]} then {far_counts[1]} packets" if None not in far_counts \
            else "no OUT row of a1 -> b1 on node-a"
        return unhealthy(COUNT, saw, far["send"])
    if not isinstance(answer, (tuple, list)) or len(answer) != 2 or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in answer):
        return Outcome(False, f"expected a pair of numbers (after open, after send), got {answer!r}.")
    got = tuple(answer)
    diff = tuple(("=" if g == want else "-", str(want), str(g)) for want, g in zip(live, got))
    if got == live:
        return Outcome(True, f"the OUT row counted the {live[0]} segments of the handshake and not one more: the "
                             f"send's bytes and the echo went socket to socket and never met a lookup. a1 -> b1, on "
                             f"another node, counted its send ({far_counts[0]} -> {far_counts[1]}): only same-node pairs "
                             "are redirected. With sockmap, conntrack (and anything that reads it: Hubble, "
                             "accounting, GC by activity) sees a connection open and close, not live.", diff)
    problems = []
    if got[0] != live[0]:
        if got[0] == 0:
            problems.append("the handshake crossed the hooks like any other: sock_ops records a socket only once it "
                            "is established")
        else:
            problems.append(f"{got[0]} is not what the OUT row held after the open: count the handshake's segments "
                            "that reached a hook of node-a")
    if got[1] != live[1]:
        if got[1] > got[0]:
            problems.append("the send added nothing to count: its data and the echo never became packets at a hook")
        else:
            problems.append(f"{got[1]} is not what the OUT row held after the send: read its Packets= then")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")


# -- 12.3 ---------------------------------------------------------------------------------
def _translated_syn_hook(step, node: str) -> str | None:
    """The hook of ``node`` that rewrote ext's SYN of ``step`` (the DNAT to the backend)."""
    sport = step.attrs.get("sport")
    hits = [f for f in step.flows if f.node == node and f.translated and is_syn(f.event.before)
            and src(f.event.before)[1] == sport]
    return hits[0].hook.label if hits else None


@exercise(
    "12.3",
    "Where the NodePort was translated",
    hints=(
        "In each lab, find the line of ext's SYN on node-a that shows `=>` (the packet before and after the "
        "translation): the hook's name is the third word.",
        "The tc lab has one program on node-a's eth0 for incoming packets; the XDP lab has one more, which runs "
        "before the kernel builds an skb.",
        "The answer is ('from-netdev', 'xdp'): cil_from_netdev (tc) translates in the lab without acceleration, "
        "cil_xdp_entry in the lab with it.",
    ),
    fault="xdp-pass",
    cells=(NODEPORT,),
)
def nodeport_hook(answer, ev) -> Outcome:
    """(hook that translated ext's SYN to node-a:30080 in the tc lab, the same in the XDP lab), from section 3's
    two opens."""
    tc = ev.step(op="tcp-open", actor="ext", target="node-a", port=30080)
    xdp = ev.variant("xdp").step(op="tcp-open", actor="ext", target="node-a", port=30080)
    if tc is None or xdp is None:
        return Outcome.needs(NODEPORT, "ext's connection to node-a:30080 in both labs")
    live = (_translated_syn_hook(tc, "node-a"), _translated_syn_hook(xdp, "node-a"))
    if not tc.ok or not xdp.ok or None in live:
        bad = tc if (not tc.ok or live[0] is None) else xdp
        return unhealthy(NODEPORT, f"'{bad.title}' {'failing' if not bad.ok else 'with no translated SYN on node-a'}",
                         bad)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('hook', 'hook'), got {answer!r}.")
    got = (hook_name(answer[0]), hook_name(answer[1]))
    diff = tuple(("=" if g == want else "-", want, g) for want, g in zip(live, got))
    if got == live:
        return Outcome(True, f"tc's {live[0]} translated the SYN in the first lab, the XDP program in the second, "
                             "before any skb existed, and sent it straight back out of eth0 (REDIRECTED, XDP_TX): "
                             "the packet never reached tc on node-a. The rows it left are the same rows, made by the "
                             "same lookups (nodeport_lb4).", diff)
    problems = []
    if got[0] != live[0]:
        if got[0] == "xdp":
            problems.append("the first lab was brought up without --nodeport-accel: it has no XDP program to run")
        else:
            problems.append(f"{answer[0]!r} is not the hook of the tc lab's `=>` line on node-a")
    if got[1] != live[1]:
        if got[1] == "from-netdev":
            problems.append("in the XDP lab the SYN was rewritten before tc could see it: read the hook of its `=>` "
                            "line")
        else:
            problems.append(f"{answer[1]!r} is not the hook of the XDP lab's `=>` line on node-a")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"{live}")


def _drop_answer(answer: Any, live: tuple[str, int]):
    """A ('hook', 'drop reason') answer read against the DROPPED line's ``live`` (hook, reason): (an Outcome when
    the answer cannot be read, else None; the expected/yours diff; the hook; the reason)."""
    parsed = _hook_and_reason(answer)
    if parsed is None:
        return Outcome(False, f"expected a pair ('hook', 'drop reason'), got {answer!r}."), None, None, None
    got_hook, got_reason = parsed
    if got_reason is None:
        return (Outcome(False, f"{answer[1]!r} is not a drop reason: copy the words in parentheses after DROPPED."),
                None, None, None)
    diff = (("=" if got_hook == live[0] else "-", live[0], got_hook),
            ("=" if got_reason == live[1] else "-", _reason_text(live[1]), _reason_text(got_reason)))
    return None, diff, got_hook, got_reason


# -- 12.4 ---------------------------------------------------------------------------------
@exercise(
    "12.4",
    "A Service without backends",
    hints=(
        "Find the line of ext's datagram to the Service `void` in the XDP lab (REDIRECTED [no-backend-reply]: node-a "
        "answered it instead of forwarding it): which hook, and the reason in parentheses.",
        "The Service exists but has no backend to choose: the frontend lookup finds it, the backend pick fails. "
        "Which program of node-a looked it up first?",
        "The answer is ('xdp', 'Service backend not found'): DROP_NO_SERVICE, answered in XDP before an skb exists.",
    ),
    fault="xdp-pass",
    cells=(DROPS,),
)
def no_backend_drop(answer, ev) -> Outcome:
    """(hook, reason) of ext's datagram to the LoadBalancer void (no backends) in the XDP lab, section 4: the record
    of the packet answered with ICMP port unreachable (v1.16's --service-no-backend-response=reject) in its place."""
    step = ev.variant("xdp").step(op="udp", actor="ext", target="void")
    if step is None:
        return Outcome.needs(DROPS, "ext's datagram to the Service without backends in the XDP lab")
    drops = [f for f in step.flows if (f.dropped or f.event.flags & TraceFlags.NO_BACKEND_REPLY)
             and f.node == "node-a" and src(f.event.before)[1] == step.attrs.get("sport")]
    if step.ok or not drops:
        return unhealthy(DROPS, "the datagram to void answered by a server" if step.ok
                         else "no record of the datagram answered or dropped on node-a", step)
    live = (drops[0].hook.label, drops[0].event.drop_reason)
    unreadable, diff, got_hook, got_reason = _drop_answer(answer, live)
    if unreadable is not None:
        return unreadable
    if (got_hook, got_reason) == live:
        return Outcome(True, f"{live[0]}: {_reason_text(live[1])} (DROP_NO_SERVICE). The VIP is a frontend, so the "
                             "XDP program looked it up, found no backend to pick (lb4_local) and, as a v1.16 node "
                             "does by default (--service-no-backend-response=reject), turned the frame into an ICMP "
                             "port unreachable and sent it straight back (XDP_TX): no skb, no CT row, no tc program. "
                             "A flood to such a Service costs the node the least it can.", diff)
    problems = []
    if got_hook != live[0]:
        if got_hook == "from-netdev":
            problems.append("XDP does not only forward: the program that finds the Service decides its drop too, and "
                            "tc never saw this datagram")
        else:
            problems.append(f"{answer[0]!r} is not the hook on the DROPPED line")
    if got_reason != live[1]:
        if got_reason == DropReason.POLICY:
            problems.append("no policy is in force in this lab: the Service itself had nothing to offer")
        else:
            problems.append(f"{_reason_text(got_reason)!r} is not the reason on the DROPPED line")
    return Outcome(False, "; ".join(problems) + ".", diff,
                   reveal=f"('{live[0]}', '{_reason_text(live[1])}')")


# -- 12.5 (break it) ----------------------------------------------------------------------
@exercise(
    "12.5",
    "Break it: the XDP program steps aside",
    hints=(
        "Find the DROPPED line of the fragment the break-it cell sent: which hook, which reason? Compare it with "
        "the fragment of section 4.",
        "With the fault on, the XDP program passes every frame as it came. Which program of node-a's eth0 is next "
        "in line, and does it judge fragments differently?",
        "The answer is ('from-netdev', 'IP fragmentation not supported'): tc drops it for the same reason, after "
        "the kernel built an skb for it.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def xdp_stepped_aside(answer, ev) -> Outcome:
    """With xdp-pass on in the XDP lab: (hook, drop reason) of the IP fragment ext sent to the VIP of lb, from the
    break-it cell."""
    step, missing = broken_step(ev.variant("xdp"), _FAULT, BREAK, "it switches the fault on, then sends the fragment",
                                op="raw", actor="ext")
    if missing:
        return missing
    drops = [f for f in step.flows if f.dropped and f.node == "node-a"]
    if not drops:
        return unhealthy(BREAK, "no drop of the fragment on node-a", step)
    live = (drops[0].hook.label, drops[0].event.drop_reason)
    unreadable, diff, got_hook, got_reason = _drop_answer(answer, live)
    if unreadable is not None:
        return unreadable
    if (got_hook, got_reason) == live:
        return Outcome(True, f"{live[0]} dropped it: {_reason_text(live[1])}. With the XDP program out of the way "
                             "the same decision is taken by tc, on an skb the kernel had to allocate and fill first: "
                             "the verdict is the same, the cost is not. The trace line's hook is how you tell the "
                             "two apart on a node.", diff)
    problems = []
    if got_hook != live[0]:
        if got_hook == "xdp":
            problems.append("with the fault on, the XDP program judged nothing: it passed the frame untouched")
        else:
            problems.append(f"{answer[0]!r} is not the hook on the DROPPED line")
    if got_reason != live[1]:
        problems.append("tc parses the frame as the XDP program does and gives the same reasons: read the one on "
                        "the DROPPED line")
    return Outcome(False, "; ".join(problems) + ".", diff,
                   reveal=f"('{live[0]}', '{_reason_text(live[1])}')")
