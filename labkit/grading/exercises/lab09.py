"""Lab 09, kube-proxy vs eBPF: the same ClusterIP connection through iptables and through the BPF maps, where
each records it, hairpin in both, and a break-it fault that shows who undoes the DNAT in the eBPF datapath.

Graders read what the notebook's cells recorded. Exercises 09.1-09.3 are about the iptables lab
(``ev.variant("ipt")``): a1's connection to ``web`` (its BPF rows), the snapshot that keeps node-a's Linux
conntrack rows and ``iptables-save -t nat`` beside them, and a1's hairpin connection to ``self`` with the line
its server logged. 09.4 reads the eBPF lab's connection taken with the fault on, and its trace records.
Evidence that is not what a healthy lab makes (a row missing, a connection that failed, a backend that never
answered) sends the learner back to the cell, at no cost. No right answer depends on a random pick, so what a
learner typed from the screen still passes when grading runs the notebook again: 09.2 asks which part of a1's
conntrack entry names the backend (the backend itself is picked afresh each run), and section 4 gives ``web`` one
backend, so the source 09.4 asks for is the same in every run.
"""
from __future__ import annotations

import re

from labkit.grading.checks import Outcome, exercise
from labkit.grading.exercises.common import addr_port, conn_rows, is_syn, src, unhealthy, words

ONE_SVC, HAIRPIN, BREAK = "1. One ClusterIP, two ways", "2. Hairpin, both ways", "4. Break it"
REMEMBERS = "what each side remembers"  #: the title of section 1's snapshot of the iptables lab

_ACCEPT = re.compile(r"tcp accept pod=(\S+) client=([\d.]+):(\d+)")
#: What an answer naming several possibilities where one is asked for is read as.
SEVERAL = "(several)"


def _dnat_targets(save: str, service: str) -> set[str]:
    """``address:port`` of every DNAT rule of ``service``'s KUBE-SEP chains in ``iptables-save`` output."""
    out = set()
    for line in (save or "").splitlines():
        if line.startswith("-A KUBE-SEP-") and f'"default/{service}' in line:
            m = re.search(r"-j DNAT --to-destination (\S+)", line)
            if m:
                out.add(m.group(1))
    return out


def _open(ev, target: str, port: int, before=None):
    """The newest record of a1's open to ``target``:``port`` (made before the record ``before``, if given)."""
    recs = [r for r in ev.records("step", op="tcp-open", actor="a1", target=target, port=port)
            if before is None or r.seq < before.seq]
    return recs[-1] if recs else None


# -- 09.1 ---------------------------------------------------------------------------------
@exercise(
    "09.1",
    "What the BPF CT saw in iptables mode",
    hints=(
        "The BPF programs still run at a1's veth, before the packet enters node-a's stack, where iptables is.",
        "Print the iptables lab's TCP rows of node-a (tcp_rows(ipt)): which address:port is the OUT row's "
        "destination?",
        "The answer is '198.19.0.10:80': the VIP. iptables' DNAT happens after the tc hook has seen the packet.",
    ),
    fault="no-out-entry",
    cells=(ONE_SVC,),
)
def bpf_row_in_iptables_mode(answer, ev) -> Outcome:
    """The destination of node-a's BPF OUT row of a1's connection to web in the iptables lab, as the open step
    left it, and by the rule: the address a1 connected to (the VIP)."""
    rec = _open(ev.variant("ipt"), "web", 80)
    if rec is None:
        return Outcome.needs(ONE_SVC, "it opens a1's connection to web in both labs")
    step = rec.data
    vip = f"{step.attrs['dst']}:{step.attrs['port']}"
    rows = conn_rows(step, "node-a", "OUT")
    seen = sorted({f"{r.dst}:{r.dport}" for r in rows})
    if not step.ok or seen != [vip]:
        what = f"node-a's BPF OUT row(s) to {', '.join(seen)}" if seen else "no BPF OUT row on node-a"
        return unhealthy(ONE_SVC, f"{what} for a1's {'failed ' if not step.ok else ''}connection to web in the "
                                  "iptables lab", step)
    got = addr_port(answer, ev.topology)
    if got is None:
        return Outcome.unreadable(f"expected a string 'address:port', got {answer!r}.")
    diff = (("=" if got == vip else "-", vip, got),)
    if got == vip:
        return Outcome(True, f"{vip}: tc ingress on lxc-a1 runs before netfilter's PREROUTING, so the BPF CT keys "
                             "the flow by the VIP; the backend only appears in Linux conntrack's reply tuple. In "
                             "the eBPF lab the OUT row names the backend, because bpf_lxc itself did the DNAT.", diff)
    host = got.rsplit(":", 1)[0]
    pods = {p.ip for p in ev.topology.pods} if ev.topology is not None else set()
    if host in pods:
        msg = "that is where the packet went after the DNAT, as the eBPF lab's row says; in this lab the DNAT " \
              "is netfilter's, and the tc hook on lxc-a1 saw the packet before netfilter did."
    elif host == step.attrs["dst"]:
        msg = "kube-proxy's DNAT rewrites address and port together, after the hook: the port the hook saw is " \
              "the one a1 connected to."
    else:
        msg = f"{answer!r} is not the destination of node-a's BPF OUT row: print tcp_rows(ipt)."
    return Outcome(False, msg, diff, reveal=f"'{vip}': the VIP, as a1 sent it")


# -- 09.2 ---------------------------------------------------------------------------------
_TUPLES = {"original": ("original", "orig", "request"), "reply": ("reply", "replies", "return")}
_SIDES = {"src": ("src", "source", "sender"), "dst": ("dst", "destination", "dest")}
_PARTS = ("original src", "original dst", "reply src", "reply dst")


def _part(answer) -> str | None:
    """'reply src' from ``'reply src'``, ``'the source of the reply tuple'`` or ``('reply', 'source')``; SEVERAL when
    the answer names more than one tuple or side; None when it names no part of a conntrack entry."""
    said = set(words(answer))
    tuples = [t for t, spellings in _TUPLES.items() if said & set(spellings)]
    sides = [d for d, spellings in _SIDES.items() if said & set(spellings)]
    if len(tuples) > 1 or len(sides) > 1:
        return SEVERAL
    return f"{tuples[0]} {sides[0]}" if tuples and sides else None


@exercise(
    "09.2",
    "Where iptables remembers the backend",
    hints=(
        "In iptables mode no BPF map holds the backend: Linux conntrack does, in a1's entry.",
        "Print remembered.conntrack (node-a's Linux conntrack as it was): an entry has an original tuple (as a1 "
        "sent the packet) and a reply tuple (as the answer will come back); find the address that is one of web's "
        "DNAT targets.",
        "The answer is 'reply src': the reply tuple's source is the backend the rules picked (b1 or b2, a new pick "
        "each run), the original tuple still names the VIP.",
    ),
    fault="no-tunnel",
    cells=(ONE_SVC,),
)
def conntrack_backend(answer, ev) -> Outcome:
    """The part of node-a's Linux conntrack entry of a1's connection to web that names the backend, from the
    snapshot that recorded conntrack and the nat table: the one holding one of web's DNAT targets (by the rule,
    the reply tuple's source). The backend itself is a random pick, so the question asks where it is kept."""
    ipt = ev.variant("ipt")
    snap_rec = ipt.latest("snapshot", title=REMEMBERS)
    rec = _open(ipt, "web", 80, before=snap_rec) if snap_rec is not None else None
    if snap_rec is None or rec is None:
        return Outcome.needs(ONE_SVC, "it opens a1's connection to web, then records Linux conntrack of node-a")
    step, snap = rec.data, snap_rec.data
    vip, port, sport = step.attrs["dst"], step.attrs["port"], step.attrs["sport"]
    a1 = ev.topology.pod("a1").ip
    rows = [r for r in snap.conntrack if r.proto == "tcp" and (r.src, r.sport) == (a1, sport)
            and (r.dst, r.dport) == (vip, port)]
    backends = _dnat_targets(snap.iptables, "web")
    parts = {}
    if rows:
        r = rows[0]
        parts = dict(zip(_PARTS, (f"{r.src}:{r.sport}", f"{r.dst}:{r.dport}", f"{r.reply_src}:{r.reply_sport}",
                                  f"{r.reply_dst}:{r.reply_dport}")))
    live = [name for name, where in parts.items() if where in backends]
    if not step.ok or live != ["reply src"] or "UNREPLIED" in rows[0].flags:
        saw = (f"a1's conntrack entry as {rows[0].line()}" if rows else "no conntrack entry of a1's connection "
               "on node-a")
        return unhealthy(ONE_SVC, f"{saw}, web's rules DNATting to {', '.join(sorted(backends)) or 'nothing'}",
                         step)
    backend = parts["reply src"]
    got = _part(answer)
    if got == SEVERAL:
        return Outcome.unreadable(f"{answer!r} names several parts of the entry: name one.")
    if got is None:
        if addr_port(answer, ev.topology) is not None:
            return Outcome.unreadable(f"{answer!r} is an address: the question asks which part of a1's entry names "
                                      "the backend (which backend the rules pick changes from run to run; where "
                                      "conntrack keeps it does not), e.g. 'original dst'.")
        return Outcome.unreadable(f"expected a part of a conntrack entry: {', '.join(map(repr, _PARTS))}; got "
                                  f"{answer!r}.")
    diff = (("=" if got == "reply src" else "-", "reply src", got),)
    if got == "reply src":
        return Outcome(True, f"reply src, here {backend}: the DNAT lives in the conntrack entry, original a1 -> "
                             f"{vip}:{port}, reply {backend} -> a1. Every later packet of the connection is "
                             "translated from it without walking the rules again; the eBPF datapath keeps the same "
                             "fact as the SVC row's BackendID.", diff)
    if got == "original dst":
        msg = "the original tuple's destination is the VIP, where a1 sent the packet; the other tuple says who " \
              "will answer, after the DNAT."
    elif got == "reply dst":
        msg = "that is a1 itself, where the reply goes: the question is who sends the reply."
    else:
        msg = "that is a1's own address and port, as it sent the packet."
    return Outcome(False, msg, diff, reveal="'reply src' (the reply tuple's source: the backend)")


# -- 09.3 ---------------------------------------------------------------------------------
@exercise(
    "09.3",
    "Hairpin, the kube-proxy way",
    hints=(
        "The KUBE-SEP chain's first rule matches packets from the endpoint itself and marks them for masquerade.",
        "Read the line a1's server logged in the iptables lab (the loop prints it): client=ADDRESS:PORT.",
        "The answer is node-a's address, '198.51.100.11': MASQUERADE picked it as the packet left for a1.",
    ),
    fault="kp-no-masq",
    cells=(HAIRPIN,),
)
def hairpin_masq(answer, ev) -> Outcome:
    """The client address a1's server logged during a1's hairpin connection to self in the iptables lab, and by
    the rule: an address of node-a (masquerade), not a1's own and not 169.254.42.1."""
    ipt = ev.variant("ipt")
    rec = _open(ipt, "self", 81)
    if rec is None:
        return Outcome.needs(HAIRPIN, "it opens a1's connection to the Service self in both labs")
    step = rec.data
    accepts = [m for m in map(_ACCEPT.search, step.server_log.get("a1", [])) if m]
    node = ev.topology.node("node-a")
    node_a = {node.ip, node.router_ip}
    ip = accepts[-1].group(2) if accepts else None
    if not step.ok or ip not in node_a:
        snap = ipt.latest("snapshot", title="hairpin")
        sep = [line for line in snap.data.iptables.splitlines()
               if line.startswith("-A KUBE-SEP-") and '"default/self"' in line] if snap else []
        masq = "" if not sep or any("KUBE-MARK-MASQ" in line for line in sep) else \
            " and self's KUBE-SEP chain without its KUBE-MARK-MASQ rule"
        saw = f"a1's server logging a client {ip}" if ip else "a1's server logging no connection"
        return unhealthy(HAIRPIN, f"{saw} for a {'failed ' if not step.ok else ''}hairpin connection{masq}", step)
    text = str(answer).strip()
    got = text.rpartition(":")[0] if text.count(":") == 1 else text
    if ev.topology is not None and got in ev.topology.names():
        kind = ev.topology.kind_of(got)
        got = ev.topology.pod(got).ip if kind == "pod" else ev.topology.node(got).ip if kind == "node" else got
    diff = (("=" if got == ip else "-", ip, got),)
    if got == ip:
        return Outcome(True, f"{ip}: kube-proxy marks a packet from an endpoint to itself and MASQUERADEs it to an "
                             "address of the node, so the reply has to come back through node-a's conntrack. "
                             "Cilium does the same job with 169.254.42.1, an address that belongs to no one.", diff)
    a1 = ev.topology.pod("a1").ip
    if got == "169.254.42.1":
        msg = "169.254.42.1 is Cilium's hairpin address, what the eBPF lab's server saw; kube-proxy has no address " \
              "of its own for it."
    elif got == a1:
        msg = "with a1's own address as the source, a1 would answer itself directly, never through node-a's " \
              "conntrack that has to undo the DNAT: the hairpin packet's source was translated."
    elif got == step.attrs["dst"]:
        msg = "the VIP was where a1 sent the packet, never a source: the server logs who the packet came from."
    elif got in node_a:
        msg = "an address of node-a, but not the one MASQUERADE picked for the packet: read the line a1's server " \
              "logged."
    else:
        msg = f"{answer!r} is not the client the iptables lab's a1 logged."
    return Outcome(False, msg, diff, reveal=f"'{ip}' (node-a)")


# -- 09.4 (break it) ----------------------------------------------------------------------
@exercise(
    "09.4",
    "Break it: nobody undoes the DNAT",
    hints=(
        "In the eBPF lab only the datapath knows the connection went to a VIP; the kernel's conntrack never saw "
        "a DNAT.",
        "Find the SYN|ACK's line at node-a's to-container: what source does it carry into a1?",
        "The answer is web's one backend, '198.18.2.12:8080' (b2): the reply reached a1 untranslated.",
    ),
    break_it=True,
    cells=(BREAK,),
)
def no_rev_nat(answer, ev) -> Outcome:
    """With skip-rev-nat on in the eBPF lab: the source of the SYN|ACK to-container delivered into a1 during the
    broken open step, from its trace records. The notebook gives web one backend for this section, so the source
    is the same in every run of the notebook (a regrade included)."""
    step = ev.step(op="tcp-open", actor="a1", target="web", faults=lambda f: "skip-rev-nat" in f)
    if step is None:
        return Outcome.needs(BREAK, "it switches the fault on and connects from a1 to web")
    vip = step.attrs["dst"]
    a1 = ev.topology.pod("a1").ip
    pods = {p.ip for p in ev.topology.pods} - {a1}
    delivered = [src(f.event.after) for f in step.flows if f.node == "node-a" and f.hook.label == "to-container"
                 and is_syn(f.event.after, ack=True)]
    if not delivered or delivered[-1][0] not in pods:
        saw = f"a SYN|ACK delivered into a1 from {delivered[-1][0]}" if delivered else "no SYN|ACK delivered into a1"
        return unhealthy(BREAK, saw, step)
    live = f"{delivered[-1][0]}:{delivered[-1][1]}"
    got = addr_port(answer, ev.topology)
    if got is None:
        return Outcome.unreadable(f"expected a string 'address:port', got {answer!r}.")
    diff = (("=" if got == live else "-", live, got),)
    if got == live:
        return Outcome(True, f"{live}: without the RevNAT at to-container the reply enters a1 from the backend, and "
                             "a1's socket, connected to the VIP, does not recognise it. In iptables mode netfilter's "
                             "conntrack undoes its own DNAT, so this fault has nothing to break there.", diff)
    host = got.rsplit(":", 1)[0]
    nodes = {n.ip for n in ev.topology.nodes}
    if host == vip:
        msg = "nothing translated the reply back: in the eBPF lab the kernel's conntrack never saw a DNAT, and " \
              "the datapath's reverse NAT is what the fault switched off."
    elif host in nodes:
        msg = "a node's address is only on the tunnel's outer header, gone by the time to-container delivers the " \
              "inner packet: read the source the SYN|ACK itself carried."
    elif host in pods:
        msg = "a backend, but not the one this connection went to, or not on the port it answered from: read the " \
              "SYN|ACK's to-container line."
    else:
        msg = f"{answer!r} is not the source the SYN|ACK carried into a1: read its to-container line."
    return Outcome(False, msg, diff, reveal=f"'{live}' (the backend, untranslated)")
