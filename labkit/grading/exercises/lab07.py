"""Lab 07, traffic from outside: a LoadBalancer VIP reached by the external client, the node that
load-balances and the node that answers (DSR), the same traffic in snat mode, a Maglev prediction, and a
break-it fault that stops the backend's node from restoring the VIP on the reply.

Graders read what the notebook's cells recorded: ext's connection to ``web`` (section 1; connections taken
under section 6's fault are left out), the snat lab's connection (``<this lab>-snat``, section 3), the
Service maps snapshotted when ``dns`` was added and ext's datagram from port 40001 (section 4), and the
connection of section 6, taken with the fault on.
"""
from __future__ import annotations

import re
import socket
from typing import Any

from labkit.grading.checks import Outcome, compare_rows, exercise
from labkit.constants import Hook
from labkit.maglev import backend_name, flow_slot, lookup_table
from labkit.maps.ct import TcpFlags
from labkit.grading.exercises.common import (ab_answer, addr_port, dst, flatten, kinds_answer, row_kind, src, step_rows,
                     unhealthy)

__all__ = ["PREDICT_PORT", "MAGLEV_SNAPSHOT"]

DSR, SNAT, MAGLEV, BREAK = ("1. A LoadBalancer VIP, from outside", "3. The same traffic in snat mode", "4. Maglev",
                            "6. Break it")
#: The client port of the flow whose backend 07.4 asks to predict.
PREDICT_PORT = 40001
#: The title of the snapshot section 4 takes when it adds ``dns``.
MAGLEV_SNAPSHOT = "dns and its Maglev table"
_FAULT = "no-dsr-snat"  #: section 6's fault, which breaks what section 1 asks about on purpose
_LOGGED = re.compile(r"tcp accept pod=b1 client=([\d.]+):(\d+)")


def _web(ev, broken: bool = False):
    """ext's newest open step to web:80, taken with section 6's fault on (``broken``) or without it."""
    return ev.step(op="tcp-open", actor="ext", target="web", port=80,
                   faults=(lambda f: _FAULT in f) if broken else (lambda f: _FAULT not in f))


def _synack_leaving(step, ext: str) -> list:
    """The records of the step's SYN|ACKs towards ext at node-b's to-netdev."""
    return [f for f in step.flows if f.node == "node-b" and f.hook == Hook.TO_NETDEV
            and f.event.after.proto == socket.IPPROTO_TCP
            and f.event.after.tcp_flags & (TcpFlags.SYN | TcpFlags.ACK) == TcpFlags.SYN | TcpFlags.ACK
            and dst(f.event.after)[0] == ext]


def _ext_rows(step, node: str, ext: str) -> list:
    """``node``'s TCP rows of the step's connection (ext's client port, either way round)."""
    cp = step.attrs["sport"]
    return [r for r in step_rows(step, node, "TCP") if (ext, cp) in ((r.src, r.sport), (r.dst, r.dport))]


def _addr_port(ev, value: Any) -> str:
    """``'203.0.113.10:80'`` from a learner's address:port or pair (a pod's name for its address); the value as
    text when it has no port."""
    return addr_port(value, ev.topology) or str(value).strip()


# -- 07.1 ---------------------------------------------------------------------------------
@exercise(
    "07.1",
    "Who gives the reply its VIP",
    hints=(
        "The reply never passes node-a in dsr mode; something on the backend's node makes it come from the VIP.",
        "Print lab.nat('node-a') and lab.nat('node-b'): which one has a row, and what does XLATE_SRC say?",
        "The answer is ('node-b', '203.0.113.10:80'): node-b's NAT row rewrites b1:8080 to the VIP at to-netdev.",
    ),
    fault="no-dsr-snat",
    cells=(DSR,),
)
def reply_source(answer, ev) -> Outcome:
    """(node, address:port) of the NAT row that rewrote the replies of ext's connection, from the open step's
    NAT rows and its SYN|ACK leaving node-b."""
    step = _web(ev)
    if step is None:
        return Outcome.needs(DSR, "conn.open() records ext's connection and both nodes' NAT rows")
    ext, cp, vip = ev.topology.external("ext").ip, step.attrs["sport"], f"{step.attrs['dst']}:80"
    found = [(node, f"{r.to_addr}:{r.to_port}") for node, rows in step.nat_after.items() for r in rows
             if r.dir == "OUT" and (r.dst, r.dport) == (ext, cp)]
    leaving = _synack_leaving(step, ext)
    sent_as = "{}:{}".format(*src(leaving[-1].event.after)) if leaving else None
    if not step.ok or found != [("node-b", vip)] or sent_as != vip or ev.config.lb_mode != "dsr":
        return unhealthy(DSR, f"NAT rows for ext's replies {found or 'nowhere'}, the SYN|ACK leaving node-b as "
                              f"{sent_as or 'nothing'}", step)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('node', 'address:port'), got {answer!r}.")
    node, where = found[0]
    got_node, got_addr = str(answer[0]).strip().lower(), _addr_port(ev, answer[1])
    diff = (("=" if got_node == node else "-", node, got_node), ("=" if got_addr == where else "-", where, got_addr))
    if got_node == node and got_addr == where:
        return Outcome(True, f"node-b: its NAT row, keyed by the reply b1:8080 -> ext, says XLATE_SRC {where}. The "
                             "DSR option carried the frontend from node-a; node-b wrote it down on the SYN and "
                             "rewrites every reply at to-netdev, so ext's socket sees the VIP it connected to.", diff)
    problems = []
    if got_node == "node-a":
        problems.append("node-a load-balanced the request but never sees the reply in dsr mode; its NAT map holds "
                        "nothing for it")
    elif got_node != node:
        problems.append(f"{answer[0]!r} is not a node that held a NAT row for ext's replies")
    if got_addr != where:
        if got_addr.rpartition(":")[0] in {n.ip for n in ev.topology.nodes}:
            problems.append(f"{got_addr} is a NodePort frontend on a node's address; ext connected to the "
                            "LoadBalancer VIP, and the reply must come from what ext connected to")
        else:
            problems.append(f"{got_addr} is not what the NAT row writes into the reply's source: read its XLATE_SRC")
    return Outcome(False, "; ".join(problems) + ".", diff, reveal=f"('{node}', '{where}')")


# -- 07.2 ---------------------------------------------------------------------------------
@exercise(
    "07.2",
    "One connection, rows on two nodes",
    hints=(
        "node-a chose the backend; node-b read the DSR option, delivered to b1 and answered. Neither keeps what "
        "the other keeps.",
        "Print the TCP rows of both nodes (lb_rows in the notebook): node-a has one, node-b has two.",
        "The answer is {'node-a': ['TCP SVC'], 'node-b': ['TCP OUT', 'TCP IN']}: the OUT row on node-b carries "
        "DSRInternal, the IN row is b1's own.",
    ),
    fault="no-in-entry",
    cells=(DSR,),
)
def dsr_rows(answer, ev) -> Outcome:
    """Kinds of the TCP rows of ext's connection to web on node-a and node-b right after its open, by the dsr
    rule."""
    step = _web(ev)
    if step is None:
        return Outcome.needs(DSR, "conn.open() records ext's connection and both nodes' rows")
    ext = ev.topology.external("ext").ip
    live = {node: sorted({row_kind(r) for r in _ext_rows(step, node, ext)}) for node in ("node-a", "node-b")}
    rule = {"node-a": ["TCP SVC"], "node-b": ["TCP IN", "TCP OUT"]}
    if live != rule or not step.ok:
        return unhealthy(DSR, f"ext's connection leaving {live}", step)
    got = ab_answer(answer, {"node-a": ("a",), "node-b": ("b",)})
    if got is None or set(got) != set(rule) or any(kinds_answer(v) is None for v in got.values()):
        return Outcome(False, f"expected a dict {{'node-a': [...], 'node-b': [...]}} of row kinds such as 'TCP OUT', "
                              f"got {answer!r}.")
    got = {k: kinds_answer(v) for k, v in got.items()}
    out = compare_rows(flatten(live), flatten(got), "TCP rows of ext's connection to web")
    if out.passed:
        return Outcome(True, "node-a keeps only the SVC row: enough to send every packet of the flow to the same "
                             "backend. It never sees a reply, so it tracks nothing else. node-b keeps the entry it "
                             "wrote when it read the DSR option, an OUT row ext -> b1:8080 flagged DSRInternal, which "
                             "marks b1's replies as a DSR flow to rewrite with the NAT row; and b1's own IN row, made "
                             "at to-container as for any packet into a pod.", out.diff)
    problems = []
    if set(got["node-a"]) - {"TCP SVC"}:
        problems.append("node-a only load-balanced the request and never sees a reply: the row written from the DSR "
                        "option is not on node-a")
    if "TCP OUT" not in got["node-b"] and "TCP OUT" not in got["node-a"]:
        problems.append("node-b wrote a second row when it read the DSR option, besides b1's own")
    if "TCP IN" not in got["node-b"]:
        problems.append("b1 received the SYN at to-container like any pod: that makes a row too")
    msg = "; ".join(problems) + "." if problems else out.message
    return Outcome(False, msg, out.diff, reveal=out.reveal)


# -- 07.3 ---------------------------------------------------------------------------------
def _main_faults_during(ev, rec) -> tuple:
    """The faults on in the notebook's main lab when the second lab recorded ``rec``."""
    before = [r for r in ev.records("fault") if r.seq < rec.seq]
    return tuple(before[-1].data) if before else ()


@exercise(
    "07.3",
    "snat mode: who called?",
    hints=(
        "In snat mode node-a rewrites the source of the request before it hands it to node-b.",
        "Read the last line of snat.pod('b1').server_log(), or the XLATE_SRC of snat.nat('node-a').",
        "The answer is '198.51.100.11': node-a's own address (with a port node-a chose).",
    ),
    fault="no-snat",
    cells=(SNAT,),
)
def snat_client(answer, ev) -> Outcome:
    """The client address b1 saw in the snat lab: the SYN's source at node-b's to-container, tied to node-a's
    NAT row there and to b1's server log."""
    snat = ev.variant("snat")
    rec = snat.journal.latest(snat.lab_name, "step", op="tcp-open", actor="ext", target="web", port=80)
    if rec is None:
        return Outcome.needs(SNAT, "it starts the snat lab and opens ext's connection there")
    step, ext = rec.data, ev.topology.external("ext").ip
    # The notebook's faults are switched on in its main lab only, where no-snat has nothing to act on (dsr): a
    # step taken while one was on is not the world this question is about either.
    faults = tuple(step.attrs.get("faults", ())) + _main_faults_during(ev, rec)
    if faults:
        return unhealthy(SNAT, f"the snat lab's connection made while {', '.join(faults)} was on in your labs")
    b1 = ev.topology.pod("b1").ip
    syns = [f for f in step.flows if f.node == "node-b" and f.hook == Hook.TO_CONTAINER
            and f.event.before.proto == socket.IPPROTO_TCP and f.event.before.tcp_flags & TcpFlags.SYN
            and dst(f.event.before)[0] == b1]
    seen = src(syns[0].event.before) if syns else None
    nat = [r for r in step.nat_after.get("node-a", []) if r.dir == "OUT" and r.src == ext and seen
           and (r.to_addr, r.to_port) == seen]
    logged = {(i, int(p)) for m in map(_LOGGED.search, step.server_log.get("b1", [])) if m for i, p in [m.groups()]}
    if not step.ok or seen is None or seen[0] != ev.topology.node("node-a").ip or not nat or \
            (logged and seen not in logged):
        return unhealthy(SNAT, f"the SYN reaching b1 from {seen[0] if seen else 'nobody'}, "
                               f"{'with' if nat else 'without'} a NAT row on node-a", step)
    ip = seen[0]
    got = _addr_port(ev, answer)
    got = got.rpartition(":")[0] if ":" in got else got
    if got in ev.topology.names():
        got = ev.topology.node(got).ip if got.startswith("node-") else got
    diff = (("=" if got == ip else "-", ip, got),)
    if got == ip:
        return Outcome(True, f"{ip}, node-a's own address: node-a SNATed the request (NAT row OUT: XLATE_SRC "
                             f"{ip}:{seen[1]}) so that b1's reply comes back to it, where the IN row turns it into a "
                             "reply to ext. The price: the server never learns the client's address, and every "
                             "reply crosses node-a.", diff)
    if got == ext:
        msg = f"{got} is ext's address: that is what b1 saw in dsr mode (section 1). In snat mode the request's " \
              "source was rewritten on its way: read the snat lab's server log."
    elif got == step.attrs["dst"]:
        msg = "the VIP is the destination ext connected to; b1 logs the source of what reached it."
    elif got == ev.topology.node("node-b").ip:
        msg = "node-b did nothing to the request's source: the node that load-balanced rewrote it before the tunnel."
    else:
        msg = f"{answer!r} is not the client b1's server logged in the snat lab."
    return Outcome(False, msg, diff, reveal=ip)


# -- 07.4 ---------------------------------------------------------------------------------
def _maglev_pick(names: dict[int, str], ids: dict[str, int], m: int, src: str, sport: int, dport: int,
                 proto: int) -> str | None:
    """The pod Maglev gives this flow: ``names`` backend id -> pod, ``ids`` backend name -> id."""
    return names.get(lookup_table(ids, m)[flow_slot(src, sport, dport, proto, m)])


@exercise(
    "07.4",
    "Predict Maglev",
    hints=(
        "The flow hash uses the client's address, both ports and the protocol; the slot is the hash modulo M.",
        "slot = flow_slot(ext_ip, 40001, 53, 17, M); the backend id is table[slot]; dns.backends maps ids to pods.",
        "The answer is names[bpf_table.backend_ids[flow_slot(ext.ip, 40001, 53, 17, M)]]: b2, with a1, a2, b1 and b2 "
        "as dns's backends.",
    ),
    fault="maglev-wrong-hash",
    cells=(MAGLEV,),
)
def maglev_prediction(answer, ev) -> Outcome:
    """The pod node-a chose for ext's datagram from port 40001 to dns (its SVC row), and the same pod from the
    Maglev table of dns's backends as the snapshot of section 4 holds them and the flow hash."""
    snap = ev.snapshot(MAGLEV_SNAPSHOT)
    step = ev.step(op="udp", actor="ext", target="dns", sport=PREDICT_PORT)
    if snap is None or step is None:
        return Outcome.needs(MAGLEV, "the cell that adds dns keeps the Service maps; the cell after your answer "
                                     "sends ext's datagram")
    ext, vip, port = ev.topology.external("ext").ip, step.attrs["dst"], step.attrs["port"]
    front = next((r for r in snap.lb["node-a"].rows() if (r.vip, r.port, r.scope) == (vip, port, 0)), None)
    rows = [r for r in step_rows(step, "node-a", "UDP", "SVC") if (r.src, r.sport) == (ext, PREDICT_PORT)]
    if front is None or not rows:
        return unhealthy(MAGLEV, f"{'no SVC row' if not rows else 'no dns frontend in the snapshot'} for ext's "
                                 "datagram", step)
    pods = {p.ip: p.name for p in ev.topology.pods}
    names = {b.backend_id: pods.get(b.address, f"backend {b.backend_id}") for b in front.backends}
    ids = {backend_name(b.address, b.port, "UDP", ev.config.cilium): b.backend_id for b in front.backends
           if b.state == "active"}
    m = ev.config.maglev_table_size
    live = names.get(rows[0].backend_id, f"backend {rows[0].backend_id}")
    predicted = _maglev_pick(names, ids, m, ext, PREDICT_PORT, port, socket.IPPROTO_UDP)
    if predicted != live or not step.ok:
        return unhealthy(MAGLEV, f"node-a sending the flow to {live} where dns's Maglev table and the flow hash give "
                                 f"{predicted}", step)
    got = str(answer).strip()
    if got == live:
        return Outcome(True, f"{live}: slot {flow_slot(ext, PREDICT_PORT, port, socket.IPPROTO_UDP, m)} of {m}. "
                             "Every node holds the same table and hashes the same fields, so whichever node the "
                             "router picks, the flow lands on the same backend: no shared state needed.",
                       (("=", live, got),))
    swapped = _maglev_pick(names, ids, m, ext, port, PREDICT_PORT, socket.IPPROTO_UDP)
    tcp = _maglev_pick(names, ids, m, ext, PREDICT_PORT, port, socket.IPPROTO_TCP)
    if got == swapped:
        msg = "the ports go in as the datagram carries them: the client's port is the source port, dns's the " \
              "destination."
    elif got == tcp:
        msg = "dns is a UDP Service, and the protocol number is one of the fields the flow hash takes."
    elif got not in names.values():
        msg = f"{answer!r} is not one of dns's backends: answer with a pod's name."
    else:
        msg = f"{answer!r} is not where node-a sent the flow: compute the slot, then table[slot]."
    return Outcome(False, msg, (("-", live, got),), reveal=live)


# -- 07.5 (break it) ----------------------------------------------------------------------
@exercise(
    "07.5",
    "Break it: a reply from the wrong address",
    hints=(
        "Find the SYN|ACK lines: where did it leave node-b, and what source did it carry?",
        "Read the to-netdev line of node-b for the SYN|ACK: there is no `=>` on it now.",
        "The answer is '198.18.2.11:8080': the reply left with b1's own address, and ext had no socket for it.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def no_dsr_snat(answer, ev) -> Outcome:
    """With no-dsr-snat on: the source the SYN|ACK to ext carried when it left node-b, from the step's trace."""
    step = ev.step(op="tcp-open", actor="ext", target="web", port=80)  # section 6's is the last
    if step is None or _web(ev, broken=True) is None:
        return Outcome.needs(BREAK, "it switches the fault on, then ext connects to web")
    if _FAULT not in step.attrs["faults"]:
        return unhealthy(BREAK, "your newest connection to web made without the fault")
    ext, b1 = ev.topology.external("ext").ip, ev.topology.pod("b1").ip
    leaving = _synack_leaving(step, ext)
    s_addr, s_port = src(leaving[-1].event.after) if leaving else (None, None)
    if step.ok or s_addr != b1:
        saw = f"the SYN|ACK leaving node-b as {s_addr}:{s_port}" if leaving else "no SYN|ACK leaving node-b"
        return unhealthy(BREAK, f"{saw}, and connect() {'succeeding' if step.ok else 'failing'}", step)
    live = f"{s_addr}:{s_port}"
    got = _addr_port(ev, answer)
    if got == live:
        return Outcome(True, f"{live}: without its NAT row applied, the reply leaves node-b with the backend's own "
                             "address. ext connected to the VIP, so no socket of ext expects a packet from b1 and "
                             "connect() times out: in dsr mode the backend's node alone is responsible for making "
                             "the reply look like the Service's.", (("=", live, got),))
    host = got.rpartition(":")[0]
    if host == step.attrs["dst"]:
        msg = "the VIP is what a healthy node-b writes into the reply at to-netdev, from its NAT row; with the fault " \
              "that line has no `=>`."
    elif host in {n.ip for n in ev.topology.nodes}:
        msg = "node-b did not masquerade the reply to its own address: nothing rewrote its source at all."
    else:
        msg = f"{answer!r} is not the source the SYN|ACK carried out of node-b: read its to-netdev line."
    return Outcome(False, msg, (("-", live, got),), reveal=live)
