"""The golden corpus: the exact line a real Cilium node prints for each kind of row, written from
Cilium's own formatting code and datapath, not from labkit's output.

Grammar (``cilium-dbg bpf ct list global``), cilium/cilium pkg/maps/ctmap/types.go:

- key, ``CtKey4Global.Dump(sb, reverse=true)``: ``"%s SVC %s:%d -> %s:%d "`` for TUPLE_F_SERVICE
  (source first), else ``"%s IN %s:%d -> %s:%d "`` / ``"%s OUT %s:%d -> %s:%d "`` with the stored
  daddr:sport first, then ``"related "`` for TUPLE_F_RELATED;
- value, ``CtEntry.StringWithTimeDiff`` in v1.16: ``"expires=%d%s Packets=%d Bytes=%d RxFlagsSeen=%#02x
  LastRxReport=%d TxFlagsSeen=%#02x LastTxReport=%d %s RevNAT=%d SourceSecurityID=%d IfIndex=%d
  BackendID=%d \\n"`` (Packets/Bytes since #31087, BackendID last since #32563, both in v1.16.0);
  1.18 drops ``IfIndex=%d `` (commit 105cd80bf473), 1.19 appends ``NatPort=%d `` (#43017);
- flags, ``flagsString``: ``"Flags=%#04x [ "``, each set name and a space in the order RxClosing TxClosing
  Nat64 LBLoopback SeenNonSyn NodePort ProxyRedirect DSRInternal FromL7LB FromTunnel, then ``"]"``.

``cilium-dbg bpf nat list``: key ``TupleKey4Global.Dump(sb, reverse=false)`` = ``"%s OUT|IN %s:%d ->
%s:%d "`` (no port swap), value ``NatEntry4.Dump``: ``"XLATE_%s %s:%d Created=%s NeedsCT=%d\\n"`` with
``"%dsec ago"`` from the agent's clock source (pkg/maps/nat/map.go ``DumpEntriesWithTimeDiff``).

What each row holds comes from the datapath (bpf/lib/conntrack.h and the callers named per row):
flags seen are OR-ed per direction (``__ct_update_timeout``), SeenNonSyn is set by the first TCP packet
without SYN, a FIN or RST marks its direction closing and once both are the entry gets
CT_CLOSE_TIMEOUT (10 s) at that packet and is no longer refreshed; a SVC entry closes both directions
on the client's FIN (#33907, in v1.16.0). Counters stay 0: a default node has no CONNTRACK_ACCOUNTING.
RELATED twins are written by ``ct_create4`` before the counters, as the entry was created.

A template is the line with ``{name}`` for what the scenario fixes (addresses, ports, ids) and
``{$var}`` / ``{$var+N}`` for clock seconds: ``$tx``/``$rx`` are the LastTxReport/LastRxReport the row
reports, which the test checks lie within the step's lab-clock window; ``expires`` is then exact.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Golden", "CORPUS", "render", "for_release", "NAT_CORPUS"]

CLOSE, SYN_T, ANY_T, TCP_T = 10, 60, 60, 8000  # Cilium's defaults (facts §3)


@dataclass(frozen=True)
class Golden:
    """One expected row: where it is, how to find it, the line, and where the line comes from."""

    scenario: str  #: which traffic makes it
    node: str
    find: tuple  #: (proto, dir, related, src, dst) of the row, with {names}
    template: str
    source: str  #: the Cilium code (and real output) behind the row's content
    routing: str | None = None  #: only in this routing mode (None: both)
    release: str | None = None  #: only in this release's profile (None: both, see for_release)


_OUT_ = "Packets=0 Bytes=0"  # no CONNTRACK_ACCOUNTING on a default node


def _ct(key: str, value: str) -> str:
    return f"{key}{value} "


CORPUS = (
    # -- pod to pod: a1 (node-a) -> b1:8080 (node-b), SYN .. data .. FIN/FIN/ACK ------------------
    Golden(
        "pod-to-pod", "node-a", ("TCP", "OUT", False, "{a1}", "{b1}"),
        _ct("TCP OUT {a1}:{cport} -> {b1}:8080 ",
            f"expires={{$rx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT=0 "
            "SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "bpf_lxc.c handle_ipv4_from_lxc: ct_create4(CT_EGRESS) with SECLABEL; a1's FIN closes tx, b1's FIN rx "
        "and gives CT_CLOSE_TIMEOUT (conntrack.h __ct_lookup ACTION_CLOSE)"),
    Golden(
        "pod-to-pod", "node-b", ("TCP", "IN", False, "{a1}", "{b1}"),
        _ct("TCP IN {a1}:{cport} -> {b1}:8080 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0413 [ RxClosing TxClosing SeenNonSyn FromTunnel ] RevNAT=0 "
            "SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "bpf_lxc.c tail_ipv4_policy: from_tunnel = CB_FROM_TUNNEL (set by bpf_overlay), ipv4_policy "
        "ct_create4(CT_INGRESS) with ct_state_new.from_tunnel (#30877); real output cilium/cilium#26723: "
        "Flags=0x0413 [ RxClosing TxClosing SeenNonSyn FromTunnel ]", routing="tunnel"),
    Golden(
        "pod-to-pod", "node-b", ("TCP", "IN", False, "{a1}", "{b1}"),
        _ct("TCP IN {a1}:{cport} -> {b1}:8080 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT=0 "
            "SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "bpf_lxc.c ipv4_policy ct_create4(CT_INGRESS); no tunnel, so no FromTunnel", routing="native"),
    Golden(
        "pod-to-pod", "node-a", ("ICMP", "OUT", True, "{a1}", "{b1}"),
        _ct("ICMP OUT {a1}:0 -> {b1}:0 related ",
            f"expires={{$tx+{SYN_T}}} {_OUT_} RxFlagsSeen=0x00 LastRxReport=0 TxFlagsSeen=0x02 "
            "LastTxReport={$tx} Flags=0x0000 [ ] RevNAT=0 SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "conntrack.h ct_create4: the RELATED twin (ICMP, ports 0, flags|TUPLE_F_RELATED) is written with the "
        "entry as the SYN created it (TxFlagsSeen SYN, CT_SYN_TIMEOUT) before the counters"),
    Golden(
        "pod-to-pod", "node-b", ("ICMP", "IN", True, "{a1}", "{b1}"),
        _ct("ICMP IN {a1}:0 -> {b1}:0 related ",
            f"expires={{$rx+{SYN_T}}} {_OUT_} RxFlagsSeen=0x02 LastRxReport={{$rx}} TxFlagsSeen=0x00 "
            "LastTxReport=0 Flags=0x0400 [ FromTunnel ] RevNAT=0 SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "conntrack.h ct_create4 (CT_INGRESS: RxFlagsSeen) with ct_create_fill_entry copying from_tunnel",
        routing="tunnel"),
    Golden(
        "pod-to-pod", "node-b", ("ICMP", "IN", True, "{a1}", "{b1}"),
        _ct("ICMP IN {a1}:0 -> {b1}:0 related ",
            f"expires={{$rx+{SYN_T}}} {_OUT_} RxFlagsSeen=0x02 LastRxReport={{$rx}} TxFlagsSeen=0x00 "
            "LastTxReport=0 Flags=0x0000 [ ] RevNAT=0 SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "conntrack.h ct_create4 (CT_INGRESS: RxFlagsSeen)", routing="native"),
    # -- UDP a1 -> b2:8080, one datagram and its answer -----------------------------------------------
    Golden(
        "udp", "node-a", ("UDP", "OUT", False, "{a1}", "{b2}"),
        _ct("UDP OUT {a1}:{uport} -> {b2}:8080 ",
            f"expires={{$rx+{ANY_T}}} {_OUT_} RxFlagsSeen=0x00 LastRxReport={{$rx}} TxFlagsSeen=0x00 "
            "LastTxReport={$tx} Flags=0x0000 [ ] RevNAT=0 SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "conntrack.h ct_update_timeout: non-TCP gets CT_CONNECTION_LIFETIME_NONTCP from each packet, flags "
        "seen stay 0 but the report times move"),
    # -- ClusterIP: a1 -> web (198.19.0.10:80) -> b1:8080 ----------------------------------------------
    Golden(
        "clusterip", "node-a", ("TCP", "SVC", False, "{a1}", "{vip}"),
        _ct("TCP SVC {a1}:{cport} -> {vip}:80 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x00 LastRxReport=0 TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT={svc_id} "
            "SourceSecurityID=0 IfIndex=0 BackendID={backend_id}"),
        "lb.h lb4_local: ct_create4(CT_SERVICE) with a fresh ct_state (no identity) and no related map; "
        "__ct_lookup closes both directions of a SVC entry on FIN (#33907, backport #33941 in v1.16.0); key "
        "printed source first since #28913"),
    Golden(
        "clusterip", "node-a", ("TCP", "OUT", False, "{a1}", "{b1}"),
        _ct("TCP OUT {a1}:{cport} -> {b1}:8080 ",
            f"expires={{$rx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT={svc_id} "
            "SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "bpf_lxc.c: the egress entry of the DNATed tuple carries the service's rev_nat_index for the reply"),
    # -- hairpin: a1 -> self (198.19.0.10:80 -> a1:8080), SNAT to 169.254.42.1 ---------------------------
    Golden(
        "hairpin", "node-a", ("TCP", "SVC", False, "{a1}", "{vip}"),
        _ct("TCP SVC {a1}:{cport} -> {vip}:80 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x00 LastRxReport=0 TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT={svc_id} "
            "SourceSecurityID=0 IfIndex=0 BackendID={backend_id}"),
        "seed 003 (1.20.1): `TCP SVC P:48766 -> S:80 ... RevNAT=177 BackendID=216`; lb.h lb4_local"),
    Golden(
        "hairpin", "node-a", ("TCP", "OUT", False, "169.254.42.1", "{a1}"),
        _ct("TCP OUT 169.254.42.1:{cport} -> {a1}:8080 ",
            f"expires={{$rx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x001b [ RxClosing TxClosing LBLoopback SeenNonSyn ] RevNAT={svc_id} "
            "SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "seed 003 (1.20.1): `TCP OUT 169.254.42.1:48766 -> P:8000 ... Flags=0x001b [ RxClosing TxClosing "
        "LBLoopback SeenNonSyn ] RevNAT=177`; lb.h lb4_dnat_request (service_loopback_ipv4), ct_state.loopback"),
    Golden(
        "hairpin", "node-a", ("TCP", "IN", False, "169.254.42.1", "{a1}"),
        _ct("TCP IN 169.254.42.1:{cport} -> {a1}:8080 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x001b [ RxClosing TxClosing LBLoopback SeenNonSyn ] RevNAT={svc_id} "
            "SourceSecurityID={id_a1} IfIndex=0 BackendID=0"),
        "v1.16 conntrack.h ct_has_loopback_egress_entry4(map, tuple, &rev_nat_index): the IN entry copies the "
        "OUT entry's rev_nat_index (kept for downgrades after #32480); delivered with the pod's SECLABEL",
        release="1.16"),
    Golden(
        "hairpin", "node-a", ("TCP", "IN", False, "169.254.42.1", "{a1}"),
        _ct("TCP IN 169.254.42.1:{cport} -> {a1}:8080 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x001b [ RxClosing TxClosing LBLoopback SeenNonSyn ] RevNAT=0 "
            "SourceSecurityID={id_a1} BackendID=0 NatPort=0"),
        "seed 003 (1.20.1): `TCP IN 169.254.42.1:48766 -> P:8000 ... Flags=0x001b [ RxClosing TxClosing "
        "LBLoopback SeenNonSyn ]`; 1.17 stopped copying rev_nat_index (commit dc9b047d0940)",
        release="1.20"),
    # -- from outside, dsr mode: ext -> LoadBalancer VIP:80 on node-a, backend b1 on node-b --------------
    Golden(
        "dsr", "node-a", ("TCP", "SVC", False, "{ext}", "{lbvip}"),
        _ct("TCP SVC {ext}:{cport} -> {lbvip}:80 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x00 LastRxReport=0 TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT={lb_id} "
            "SourceSecurityID=0 IfIndex=0 BackendID={backend_id}"),
        "nodeport.h nodeport_lb4 -> lb4_local with a fresh ct_state: the SVC entry has no NodePort flag (that "
        "goes on the CT_EGRESS entry, which dsr to a remote backend does not create: 'Reply from DSR packet is "
        "never seen on this node again')"),
    Golden(
        "dsr", "node-b", ("TCP", "OUT", False, "{ext}", "{b1}"),
        _ct("TCP OUT {ext}:{cport} -> {b1}:8080 ",
            f"expires={{$rx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0093 [ RxClosing TxClosing SeenNonSyn DSRInternal ] RevNAT=0 "
            "SourceSecurityID=2 IfIndex=0 BackendID=0"),
        "nodeport.h nodeport_dsr_ingress_ipv4: tuple reversed, ct_create4(map, NULL, CT_EGRESS) with "
        "dsr_internal and WORLD_ID; replies found by nodeport_rev_dnat_fwd_ipv4 (CT_INGRESS); bpf/tests "
        "tc_nodeport_dsr_backend checks ct_entry->dsr_internal on the reversed tuple; real output "
        "cilium/cilium#43017: `TCP OUT C:57716 -> B:8080 ... Flags=0x0093 [ RxClosing TxClosing SeenNonSyn "
        "DSRInternal ] RevNAT=0` (SourceSecurityID 9 there is world-ipv4 of a dual-stack cluster)"),
    Golden(
        "dsr", "node-b", ("TCP", "IN", False, "{ext}", "{b1}"),
        _ct("TCP IN {ext}:{cport} -> {b1}:8080 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT=0 "
            "SourceSecurityID=2 IfIndex=0 BackendID=0"),
        "the backend pod's own ingress entry (bpf_lxc ipv4_policy, CT_NEW); real output cilium/cilium#26723 "
        "shows the IN entry beside the DSR one", routing="native"),
    Golden(
        "dsr", "node-b", ("TCP", "IN", False, "{ext}", "{b1}"),
        _ct("TCP IN {ext}:{cport} -> {b1}:8080 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0413 [ RxClosing TxClosing SeenNonSyn FromTunnel ] RevNAT=0 "
            "SourceSecurityID=2 IfIndex=0 BackendID=0"),
        "as native, and the request came through the overlay: FromTunnel (real output cilium/cilium#26723, "
        "DSR with Geneve: Flags=0x0413 [ RxClosing TxClosing SeenNonSyn FromTunnel ])", routing="tunnel"),
    # -- from outside, snat mode: ext -> LB VIP on node-a, SNAT to node-a's address, backend b1 -----------
    Golden(
        "snat", "node-a", ("TCP", "OUT", False, "{ext}", "{b1}"),
        _ct("TCP OUT {ext}:{cport} -> {b1}:8080 ",
            f"expires={{$rx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0033 [ RxClosing TxClosing SeenNonSyn NodePort ] RevNAT={lb_id} "
            "SourceSecurityID=2 IfIndex=0 BackendID=0"),
        "nodeport.h nodeport_lb4: ct_create4(map, NULL, CT_EGRESS) with node_port=1, WORLD_ID and the "
        "service's rev_nat_index, no RELATED twin; the reply counts as its ingress (rev_nodeport_lb4)"),
    Golden(
        "snat", "node-b", ("TCP", "IN", False, "{node_a}", "{b1}"),
        _ct("TCP IN {node_a}:{cport} -> {b1}:8080 ",
            f"expires={{$tx+{CLOSE}}} {_OUT_} RxFlagsSeen=0x1b LastRxReport={{$rx}} TxFlagsSeen=0x1b "
            "LastTxReport={$tx} Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT=0 "
            "SourceSecurityID=6 IfIndex=0 BackendID=0"),
        "the backend's own ingress entry for a request SNATed to node-a's address: ipcache identity "
        "remote-node (6)"),
)

NAT_CORPUS = (
    Golden(
        "dsr", "node-b", ("TCP", "OUT", False, "{b1}", "{ext}"),
        "TCP OUT {b1}:8080 -> {ext}:{cport} XLATE_SRC {lbvip}:80 Created={$age}sec ago NeedsCT=0",
        "nat.h snat_v4_create_dsr: key {saddr=B, daddr=C, sport=bp, dport=cp, TUPLE_F_OUT}, to_saddr/to_sport "
        "the frontend, created=bpf_mono_now(), needs_ct 0"),
    Golden(
        "snat", "node-a", ("TCP", "OUT", False, "{ext}", "{b1}"),
        "TCP OUT {ext}:{cport} -> {b1}:8080 XLATE_SRC {node_a}:{cport} Created={$age}sec ago NeedsCT=0",
        "nat.h snat_v4_new_mapping: the client's port is kept when it is in [32768, 65535] "
        "(__snat_try_keep_port); tail_nodeport_nat_egress_ipv4's target sets no needs_ct"),
    Golden(
        "snat", "node-a", ("TCP", "IN", False, "{b1}", "{node_a}"),
        "TCP IN {b1}:8080 -> {node_a}:{cport} XLATE_DST {ext}:{cport} Created={$age}sec ago NeedsCT=0",
        "nat.h snat_v4_new_mapping: the reverse entry {saddr=B, daddr=node, sport=bp, dport=port, TUPLE_F_IN}"),
)


def for_release(template: str, release: str) -> str:
    """A v1.16 CT line template in another release's grammar: 1.18 drops ``IfIndex=%d ``, 1.19 appends
    ``NatPort=%d `` (labkit writes no NAT port into CT entries, so 0)."""
    if release == "1.16" or "XLATE_" in template:
        return template
    return template.replace(" IfIndex=0 ", " ").rstrip(" ") + " NatPort=0 "


_VAR = re.compile(r"\{(\$?)(\w+)(?:\+(\d+))?\}")


def render(template: str, names: dict, line: str) -> tuple[str, dict[str, int]]:
    """Fill ``template`` with ``names`` and with the clock variables ``line`` reports; returns the rendered
    line and the clock variables, for the caller to check against the step's window."""
    parts, pattern, seen = [], [], set()
    pos = 0
    for m in _VAR.finditer(template):
        literal = template[pos:m.start()]
        pattern.append(re.escape(literal))
        clock, name, plus = m.groups()
        if clock:
            if name in seen or plus:
                pattern.append(r"\d+")
            else:
                pattern.append(rf"(?P<{name}>\d+)")
                seen.add(name)
        else:
            pattern.append(re.escape(str(names[name])))
        pos = m.end()
    pattern.append(re.escape(template[pos:]))
    m = re.fullmatch("".join(pattern), line)
    clocks = {k: int(v) for k, v in m.groupdict().items()} if m else {}

    def fill(m: re.Match) -> str:
        clock, name, plus = m.groups()
        if clock:
            if name not in clocks:
                return m.group(0)
            return str(clocks[name] + int(plus or 0))
        return str(names[name])

    parts.append(_VAR.sub(fill, template))
    return "".join(parts), clocks
