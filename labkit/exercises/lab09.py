"""Lab 09, kube-proxy vs eBPF: the same ClusterIP connection through iptables
and through the BPF maps, where each records it, hairpin in both, and a
break-it fault that shows who undoes the DNAT in the eBPF datapath.

Graders read the iptables lab (``<name>-ipt``, started by the notebook) and
the main eBPF lab: their maps, Linux conntrack, server logs and trace.
"""
from __future__ import annotations

import re

from ..checks import Outcome, exercise
from .lab01 import recent_flows, unanswered, variant_lab, variant_missing
from .lab04 import addr_port, is_syn, service, src

__all__ = ["ipt_lab"]

_ACCEPT = re.compile(r"tcp accept pod=(\S+) client=([\d.]+):(\d+)")


def ipt_lab(lab):
    """(the iptables-mode lab beside ``lab``, None) or (None, a failed Outcome)."""
    other = variant_lab(lab, "ipt")
    if other is None or getattr(other.config, "service_mode", "ebpf") != "iptables":
        return None, variant_missing(lab, "ipt", "ipt = start(variant='ipt', service_mode='iptables')")
    return other, None


def _newest_out(ipt, svc):
    """node-a's newest TCP OUT row of a1 towards ``svc``'s VIP in the iptables lab, or None."""
    a1 = ipt.pod("a1").ip
    rows = [r for r in ipt.ct("node-a") if r.proto_name == "TCP" and r.dir == "OUT" and not r.related
            and r.src == a1 and r.dport == svc.port]
    return max(rows, key=lambda r: r.sport, default=None) if rows else None


# -- 09.1 ---------------------------------------------------------------------------------
@exercise(
    "09.1",
    "What the BPF CT saw in iptables mode",
    hints=(
        "The BPF programs still run at a1's veth, before the packet enters node-a's stack, where iptables is.",
        "Print the iptables lab's TCP rows of node-a (tcp_rows(ipt)): which address:port is the OUT row's destination?",
        "The answer is '198.19.0.10:80': the VIP. iptables' DNAT happens after the tc hook has seen the packet.",
    ),
)
def bpf_row_in_iptables_mode(answer, lab) -> Outcome:
    """The destination of node-a's BPF OUT row of a1's connection to web in the iptables lab, live."""
    if (blank := unanswered(answer)) is not None:
        return blank
    ipt, missing = ipt_lab(lab)
    if missing:
        return missing
    svc = service(ipt, "web")
    row = _newest_out(ipt, svc) if svc else None
    if row is None:
        return Outcome(False, "node-a of the iptables lab has no TCP OUT row of a1 towards web: run section 1, "
                              "then check.")
    live = f"{row.dst}:{row.dport}"
    got = addr_port(ipt, answer)
    if got == live:
        return Outcome(True, f"{live}: tc ingress on lxc-a1 runs before netfilter's PREROUTING, so the BPF CT keys "
                             "the flow by the VIP; the backend only appears in Linux conntrack's reply tuple. In "
                             "the eBPF lab the OUT row names the backend, because bpf_lxc itself did the DNAT.",
                       (("=", live, str(got)),))
    return Outcome(False, f"{answer!r} is not the destination of the BPF OUT row: print tcp_rows(ipt).",
                   (("-", live, str(got)),))


# -- 09.2 ---------------------------------------------------------------------------------
@exercise(
    "09.2",
    "Where iptables remembers the backend",
    hints=(
        "In iptables mode no BPF map holds the backend: Linux conntrack does, in the entry's reply tuple.",
        "Print ipt.conntrack('node-a'): the part after `reply` starts with the address that will answer.",
        "The answer is the reply source of a1's conntrack entry, e.g. '198.18.2.11:8080' (b1) or b2's.",
    ),
)
def conntrack_backend(answer, lab) -> Outcome:
    """The backend in the reply tuple of node-a's Linux conntrack entry of a1's newest connection to web."""
    if (blank := unanswered(answer)) is not None:
        return blank
    ipt, missing = ipt_lab(lab)
    if missing:
        return missing
    svc = service(ipt, "web")
    a1 = ipt.pod("a1").ip
    rows = [r for r in ipt.conntrack("node-a") if r.src == a1 and svc and (r.dst, r.dport) == (svc.vip, svc.port)]
    if not rows:
        return Outcome(False, "node-a of the iptables lab has no conntrack entry of a1 towards web: run section 1, "
                              "then check.")
    row = max(rows, key=lambda r: r.sport)
    live = f"{row.reply_src}:{row.reply_sport}"
    got = addr_port(ipt, answer)
    if got is None and str(answer).strip() in ipt.topology.names():
        got = f"{ipt.pod(str(answer).strip()).ip}:{row.reply_sport}"
    if got == live:
        return Outcome(True, f"{live}: the DNAT lives in the conntrack entry: original a1 -> {svc.vip}:{svc.port}, "
                             f"reply {live} -> a1. Every later packet of the connection is translated from it "
                             "without walking the rules again; the eBPF datapath keeps the same fact as the SVC "
                             "row's BackendID.", (("=", live, str(got)),))
    return Outcome(False, f"{answer!r} is not the backend in the reply tuple: print ipt.conntrack('node-a').",
                   (("-", live, str(got)),))


# -- 09.3 ---------------------------------------------------------------------------------
@exercise(
    "09.3",
    "Hairpin, the kube-proxy way",
    hints=(
        "The KUBE-SEP chain's first rule matches packets from the endpoint itself and marks them for masquerade.",
        "Read the last line of ipt.pod('a1').server_log().",
        "The answer is node-a's address, '198.51.100.11': MASQUERADE picked it as the packet left for a1.",
    ),
)
def hairpin_masq(answer, lab) -> Outcome:
    """The client address a1's server logged for the newest hairpin connection in the iptables lab."""
    if (blank := unanswered(answer)) is not None:
        return blank
    ipt, missing = ipt_lab(lab)
    if missing:
        return missing
    accepts = [m for m in map(_ACCEPT.search, ipt.pod("a1").server_log()) if m]
    if not accepts or service(ipt, "self") is None:
        return Outcome(False, "a1's server in the iptables lab has logged no hairpin connection: run section 2, "
                              "then check.")
    ip = accepts[-1].group(2)
    node_a = {ipt.topology.node("node-a").ip, ipt.topology.node("node-a").router_ip}
    if ip not in node_a:
        return Outcome(False, f"a1's newest connection came from {ip}, not from node-a: run section 2 again.")
    got = str(answer).strip().rpartition(":")[0] if ":" in str(answer) else str(answer).strip()
    if got in ipt.topology.names():
        got = ipt.address_of(got)
    if got == ip:
        return Outcome(True, f"{ip}: kube-proxy marks a packet from an endpoint to itself and MASQUERADEs it to an "
                             "address of the node, so the reply has to come back through node-a's conntrack. "
                             "Cilium does the same job with 169.254.42.1, an address that belongs to no one.")
    if got == "169.254.42.1":
        return Outcome(False, "169.254.42.1 is what the eBPF lab's server saw; the iptables lab's saw a node "
                              "address. Read ipt.pod('a1').server_log().", (("-", ip, got),))
    return Outcome(False, f"{answer!r} is not the client the iptables lab's a1 logged.", (("-", ip, got),))


# -- 09.4 (break it) ----------------------------------------------------------------------
@exercise(
    "09.4",
    "Break it: nobody undoes the DNAT",
    hints=(
        "In the eBPF lab only the datapath knows the connection went to a VIP; the kernel's conntrack never saw "
        "a DNAT.",
        "Find the SYN|ACK's line at node-a's to-container: what source does it carry into a1?",
        "The answer is the backend's address:port, e.g. '198.18.2.11:8080': the reply reached a1 untranslated.",
    ),
    break_it=True,
)
def no_rev_nat(answer, lab) -> Outcome:
    """With skip-rev-nat on in the eBPF lab: the source of the newest SYN|ACK delivered into a1, from the trace."""
    if (blank := unanswered(answer)) is not None:
        return blank
    if "skip-rev-nat" not in lab.faults():
        return Outcome(False, "the fault is off: run the break-it cell, then check.")
    svc = service(lab, "web")
    if svc is None:
        return Outcome(False, "the eBPF lab has no Service web: run the break-it cell, then check.")
    backends = {lab.pod(b.pod).ip for b in svc.backends}
    delivered = [f for f in recent_flows(lab) if f.node == "node-a" and f.hook.label == "to-container"
                 and is_syn(f.event.after, ack=True) and src(f.event.after)[0] in backends | {svc.vip}]
    if not delivered:
        return Outcome(False, "the trace holds no SYN|ACK delivered into a1: run the break-it cell, then check.")
    s_addr, s_port = src(delivered[-1].event.after)
    live = f"{s_addr}:{s_port}"
    if s_addr == svc.vip:
        return Outcome(False, "the newest SYN|ACK reached a1 from the VIP: it came before the fault. Run the "
                              "break-it cell again.")
    got = addr_port(lab, answer)
    if got == live:
        return Outcome(True, f"{live}: without the RevNAT at to-container the reply enters a1 from the backend, "
                             "and a1's socket, connected to the VIP, does not recognise it. In iptables mode "
                             "netfilter's conntrack undoes its own DNAT, so this fault has nothing to break there.",
                       (("=", live, str(got)),))
    return Outcome(False, f"{answer!r} is not the source the SYN|ACK carried into a1: read its to-container line.",
                   (("-", live, str(got)),))
