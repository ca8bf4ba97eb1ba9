"""Lab 07, traffic from outside: a LoadBalancer VIP reached by the external
client, the node that load-balances and the node that answers (DSR), the same
traffic in snat mode, a Maglev prediction, and a break-it fault that stops the
backend's node from restoring the VIP on the reply.

Graders find the flows by what the notebook fixes (the LoadBalancer Service
``web`` backed by b1:8080, the Maglev Service ``dns``, the snat lab beside the
main one) and read ports and rows from the live maps and the trace, never from
the answer.
"""
from __future__ import annotations

import re
from typing import Any

from ..checks import Outcome, compare_rows, exercise
from ..maglev import backend_name, flow_slot, lookup_table
from .lab01 import kinds_answer, newest, recent_flows, row_kind, unanswered, variant_lab, variant_missing
from .lab04 import ab_answer, addr_port, dst, flatten, is_syn, service, src

__all__ = ["ext_rows", "snat_lab", "PREDICT_PORT"]

_ACCEPT = re.compile(r"tcp accept pod=(\S+) client=([\d.]+):(\d+)")
#: The client port of the flow whose backend 07.4 asks to predict.
PREDICT_PORT = 40000


def _lb(lab, name: str = "web"):
    """(the LoadBalancer Service, None) or (None, a failed Outcome saying what to run)."""
    svc = service(lab, name)
    if svc is None or not svc.lb_vip:
        return None, Outcome(False, f"lab '{lab.name}' has no LoadBalancer Service '{name}': run the cell that adds "
                                    "it, then check.")
    return svc, None


def ext_rows(lab, node: str, ext_ip: str, cp: int) -> list:
    """``node``'s TCP rows of the external client's connection from port ``cp`` (either way round)."""
    out = []
    for r in lab.ct(node):
        if r.proto_name != "TCP" or r.related:
            continue
        if (r.src, r.sport) == (ext_ip, cp) or (r.dst, r.dport) == (ext_ip, cp):
            out.append(r)
    return out


def snat_lab(lab):
    """The snat-mode lab the notebook started beside ``lab`` (``<name>-snat``), or None."""
    other = variant_lab(lab, "snat")
    return other if other is not None and other.config.lb_mode == "snat" else None


def _newest_client_port(lab, svc) -> int | None:
    rows = [r for r in lab.ct("node-a") if r.proto_name == "TCP" and r.dir == "SVC" and r.dst == svc.lb_vip]
    return newest(rows).sport if rows else None


# -- 07.1 ---------------------------------------------------------------------------------
@exercise(
    "07.1",
    "Who gives the reply its VIP",
    hints=(
        "The reply never passes node-a in dsr mode; something on the backend's node makes it come from the VIP.",
        "Print lab.nat('node-a') and lab.nat('node-b'): which one has a row, and what does XLATE_SRC say?",
        "The answer is ('node-b', '203.0.113.10:80'): node-b's NAT row rewrites b1:8080 to the VIP at to-netdev.",
    ),
)
def reply_source(answer, lab) -> Outcome:
    """(node, address:port) of the NAT row that rewrites web's replies, read from both nodes' NAT maps."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _lb(lab)
    if missing:
        return missing
    ext = lab.topology.external("ext").ip
    found = [(node, f"{r.to_addr}:{r.to_port}") for node in ("node-a", "node-b") for r in lab.nat(node)
             if r.dir == "OUT" and r.dst == ext and r.to_addr == svc.lb_vip]
    if len(found) != 1 or found[0][0] != "node-b" or lab.config.lb_mode != "dsr":
        return Outcome(False, f"the NAT rows that give ext's replies the VIP are {found or 'none'} in an "
                              f"{lab.config.lb_mode} lab: not what dsr makes. Run lab.reset() and section 1 again.")
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        return Outcome(False, f"expected a pair ('node', 'address:port'), got {answer!r}.")
    node, where = found[0]
    got_node, got_addr = str(answer[0]).strip().lower(), addr_port(lab, answer[1])
    diff = (("=" if got_node == node else "-", node, got_node), ("=" if got_addr == where else "-", where,
                                                                   str(got_addr)))
    if got_node == node and got_addr == where:
        return Outcome(True, f"node-b: its NAT row, keyed by the reply b1:8080 -> ext, says XLATE_SRC {where}. The "
                             "DSR option carried the frontend from node-a; node-b wrote it down on the SYN and "
                             "rewrites every reply at to-netdev, so ext's socket sees the VIP it connected to.", diff)
    if got_node == "node-a":
        return Outcome(False, "node-a load-balanced the request but never sees the reply in dsr mode; its NAT map is "
                              "empty. Look at node-b's.", diff)
    return Outcome(False, f"{answer!r} is not the row that rewrites the reply: print both nodes' NAT maps.", diff)


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
)
def dsr_rows(answer, lab) -> Outcome:
    """Kinds of the TCP rows of ext's newest connection to web on node-a and node-b, live and by the dsr rule."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _lb(lab)
    if missing:
        return missing
    cp = _newest_client_port(lab, svc)
    if cp is None:
        return Outcome(False, "node-a has no SVC row of ext towards web's VIP: run the cell that opens conn, then "
                              "check.")
    ext = lab.topology.external("ext").ip
    live = {node: sorted({row_kind(r) for r in ext_rows(lab, node, ext, cp)}) for node in ("node-a", "node-b")}
    rule = {"node-a": ["TCP SVC"], "node-b": ["TCP IN", "TCP OUT"]}
    if live != rule:
        return Outcome(False, f"ext's connection from port {cp} left {live}, not what a dsr connection to a backend "
                              f"on node-b makes ({rule}); faults on: {lab.faults() or 'none'}. Run lab.reset() and "
                              "section 1 again.")
    got = ab_answer(answer, {"node-a": (), "node-b": ()})
    if got is None or any(kinds_answer(v) is None for v in got.values()):
        return Outcome(False, f"expected a dict {{'node-a': [...], 'node-b': [...]}} of row kinds such as 'TCP OUT', "
                              f"got {answer!r}.")
    out = compare_rows(flatten(live), flatten(got), "TCP rows of ext's connection to web")
    if out.passed:
        return Outcome(True, "node-a keeps only the SVC row: enough to send every packet of the flow to the same "
                             "backend. It never sees a reply, so it tracks nothing else. node-b keeps the entry it "
                             "wrote when it read the DSR option, an OUT row ext -> b1:8080 flagged DSRInternal, which "
                             "marks b1's replies as a DSR flow to rewrite with the NAT row; and b1's own IN row, made "
                             "at to-container as for any packet into a pod.", out.diff)
    return out


# -- 07.3 ---------------------------------------------------------------------------------
@exercise(
    "07.3",
    "snat mode: who called?",
    hints=(
        "In snat mode node-a rewrites the source of the request before it hands it to node-b.",
        "Read the last line of snat.pod('b1').server_log(), or the XLATE_SRC of snat.nat('node-a').",
        "The answer is '198.51.100.11': node-a's own address (with a port node-a chose).",
    ),
)
def snat_client(answer, lab) -> Outcome:
    """The client address b1's server logged in the snat lab, tied to node-a's NAT row there."""
    if (blank := unanswered(answer)) is not None:
        return blank
    other = snat_lab(lab)
    if other is None:
        return variant_missing(lab, "snat", "snat = start(variant='snat', lb_mode='snat')")
    accepts = [m for m in map(_ACCEPT.search, other.pod("b1").server_log()) if m]
    if not accepts:
        return Outcome(False, "b1's server in the snat lab has logged no connection yet: run section 3, then check.")
    _, ip, port = accepts[-1].groups()
    rows = [r for r in other.nat("node-a") if r.dir == "OUT" and (r.to_addr, r.to_port) == (ip, int(port))]
    if not rows:
        return Outcome(False, f"the newest connection b1's server logged in the snat lab ({ip}:{port}) has no NAT "
                              "row on node-a: run section 3 again, then check.")
    got = str(answer).strip().rpartition(":")[0] if ":" in str(answer) else str(answer).strip()
    if got in other.topology.names():
        got = other.address_of(got)
    if got == ip:
        return Outcome(True, f"{ip}, node-a's own address: node-a SNATed the request (NAT row OUT: XLATE_SRC "
                             f"{ip}:{port}) so that b1's reply comes back to it, where the IN row turns it into a "
                             "reply to ext. The price: the server never learns the client's address, and every "
                             "reply crosses node-a.")
    if got == lab.topology.external("ext").ip:
        return Outcome(False, f"{got} is ext's address: that is what b1 saw in dsr mode (section 1). Read the snat "
                              "lab's server log.", (("-", ip, got),))
    return Outcome(False, f"{answer!r} is not the client b1's server logged in the snat lab.", (("-", ip, got),))


# -- 07.4 ---------------------------------------------------------------------------------
@exercise(
    "07.4",
    "Predict Maglev",
    hints=(
        "The flow hash uses the client's address, both ports and the protocol; the slot is the hash modulo M.",
        "slot = flow_slot(ext_ip, 40000, 53, 17, M); the backend id is table[slot]; dns.backends maps ids to pods.",
        "The answer is the pod named by names[bpf_table.backend_ids[flow_slot(ext.ip, 40000, 53, 17, M)]].",
    ),
)
def maglev_prediction(answer, lab) -> Outcome:
    """The pod node-a chose for ext's datagram from port 40000 to dns (sent by the check if needed), and the same pod from the Python table and hash."""
    if (blank := unanswered(answer)) is not None:
        return blank
    svc, missing = _lb(lab, "dns")
    if missing:
        return missing
    ext = lab.topology.external("ext").ip

    def flow_rows():
        return [r for r in lab.ct("node-a") if r.dir == "SVC" and r.proto_name == "UDP" and r.src == ext
                and r.sport == PREDICT_PORT and r.dst == svc.lb_vip]

    if not flow_rows():  # predict first, then watch: the check sends the datagram itself
        lab.external("ext").udp("dns", svc.port, b"who answers?", sport=PREDICT_PORT)
    rows = flow_rows()
    if not rows:
        return Outcome(False, f"ext's datagram from port {PREDICT_PORT} left no SVC row on node-a; faults on: "
                              f"{lab.faults() or 'none'}. Run lab.reset() and section 4 again.")
    by_id = {b.id: b.pod for b in svc.backends}
    live = by_id.get(rows[0].backend_id, f"backend {rows[0].backend_id}")
    m = lab.config.maglev_table_size
    names = {backend_name(lab.topology.pod(b.pod).ip, b.port, svc.protocol, lab.config.cilium): b.id
             for b in svc.active}
    predicted = by_id.get(lookup_table(names, m)[flow_slot(ext, PREDICT_PORT, svc.port, 17, m)])
    if predicted != live:
        return Outcome(False, f"node-a sent the flow to {live}, labkit.maglev predicts {predicted}: the table or the "
                              "hash differ from the datapath's. Run lab.reset() and section 4 again.")
    got = str(answer).strip()
    if got == live:
        return Outcome(True, f"{live}: slot {flow_slot(ext, PREDICT_PORT, svc.port, 17, m)} of {m}. Every node holds "
                             "the same table and hashes the same fields, so whichever node the router picks, the "
                             "flow lands on the same backend: no shared state needed.")
    return Outcome(False, f"{answer!r} is not where node-a sent the flow: compute the slot, then table[slot].",
                   (("-", live, got),))


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
)
def no_dsr_snat(answer, lab) -> Outcome:
    """With no-dsr-snat on: the source the newest SYN|ACK to ext carried when it left node-b, from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "no-dsr-snat" not in lab.faults():
        return Outcome(False, "the fault is off: run the break-it cell (it resets the lab, adds web and switches the "
                              "fault on), then check.")
    ext = lab.topology.external("ext").ip
    leaving = [f for f in recent_flows(lab) if f.node == "node-b" and f.hook.label == "to-netdev"
               and is_syn(f.event.after, ack=True) and dst(f.event.after)[0] == ext]
    if not leaving:
        return Outcome(False, "the trace holds no SYN|ACK leaving node-b for ext: run the break-it cell, then check.")
    s_addr, s_port = src(leaving[-1].event.after)
    live = f"{s_addr}:{s_port}"
    if s_addr != lab.pod("b1").ip:
        return Outcome(False, f"the newest SYN|ACK left node-b as {live}: it was made before the fault. Run the "
                              "break-it cell again, then check.")
    got = addr_port(lab, answer)
    if got == live:
        return Outcome(True, f"{live}: without its NAT row applied, the reply leaves node-b with the backend's own "
                             "address. ext connected to the VIP, so no socket of ext expects a packet from b1 and "
                             "connect() times out: in dsr mode the backend's node alone is responsible for making "
                             "the reply look like the Service's.", (("=", live, got),))
    return Outcome(False, f"{answer!r} is not the source the SYN|ACK carried out of node-b: read its to-netdev line.",
                   (("-", live, str(got)),))
