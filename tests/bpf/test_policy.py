"""Network policy at the pod's veth (bpf/lib/policy.h, bpf_lxc.c with
ENABLE_POLICY), on node-a's compiled programs run by BPF_PROG_TEST_RUN.

Facts, from Cilium v1.16's source:

- bpf/lib/policy.h ``__policy_can_access``: a lookup with the peer's identity,
  then one with identity 0; six steps: id/proto/port (L3-L4), ANY/proto/port
  (L4-Only), id/proto/ANY (L3-Proto), ANY/proto/ANY (Proto-Only), id/ANY/ANY
  (L3-Only), ANY/ANY/ANY (all); no match is DROP_POLICY (-133), a deny entry
  DROP_POLICY_DENY (-181). ``__account_and_check`` counts packets and bytes on
  the entry that decided. ``policy_can_egress`` / ``policy_can_access_ingress``:
  POLICY_AUDIT_MODE turns a drop into an allow, ``audited`` set.
- bpf_lxc.c ``handle_ipv4_from_lxc``: ``switch (ct_status) { case CT_NEW: case
  CT_ESTABLISHED: ... if (hairpin_flow) break; verdict = policy_can_egress4(...)``;
  ``case CT_RELATED: case CT_REPLY: /* Skip policy enforcement for return
  traffic. */``; the verdict notification is sent ``if (verdict != CTX_ACT_OK ||
  ct_status != CT_ESTABLISHED)``; a denied packet returns before ``ct_create4``.
  The destination identity is cilium_ipcache's for the (DNATed) daddr, WORLD
  when unknown.
- bpf_lxc.c ``ipv4_policy``: ``case CT_REPLY: case CT_RELATED: /* Skip policy
  enforcement for return traffic. */``; otherwise a CT_NEW packet from
  IPV4_LOOPBACK with a loopback egress entry, or an entry with ``loopback``,
  skips policy (hairpin); the same notification rule; ``ct_create4`` only after
  an allow.

(The search index holds no copy of bpf_lxc.c at the v1.16 branch point; the
lines above were read in two stored revisions on either side of it, one that
still has CT_REOPENED and one with the switch on ct_status, and both enforce
CT_NEW/CT_ESTABLISHED, skip CT_REPLY/CT_RELATED and hairpin flows, and notify
on the same condition. labkit's CT has no CT_REOPENED.)

Expectations for the lookup tables come from labkit's Python statement of the
same lookup, :meth:`labkit.policy.resolve.EndpointPolicy.verdict`, and from
hand-computed values.
"""
from __future__ import annotations

import ctypes
import os
import socket

import pytest

from labkit.constants import DropReason, PolicyMatch
from labkit.datapath import bpf as _bpf
from labkit.datapath.testrun import TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT
from labkit.maps.ct import CtFlags, CtResult
from labkit.maps.eps import IpcacheKey, RemoteEndpointInfo
from labkit.maps.policy import Direction, PolicyEntry, PolicyKey, PolicyRow
from labkit.observe.trace import Flow
from labkit.policy.identity import IdentityAllocator, pod_labels
from labkit.policy.resolve import Endpoint, EndpointPolicy, masked_ports, resolve
from labkit.policy.rules import parse_policies

from .harness import A1, A2, B1, B2, EXT, LOOPBACK, VIP, VPORT
from .packets import ACK, SYN, icmp_echo, tcp, udp

TCP, UDP, ICMP = socket.IPPROTO_TCP, socket.IPPROTO_UDP, socket.IPPROTO_ICMP
IN, EG = Direction.INGRESS, Direction.EGRESS
WORLD, REMOTE_NODE = 2, 6
CIDR_ADDR, CIDR_ID = "198.18.9.1", (1 << 24) | 1  #: a local-scope CIDR identity needs bit 24
NODE_B_IP = "198.51.100.12"  #: remote-node in node-a's ipcache
ECHO_REQUEST = 8  #: ICMP type: with ENABLE_ICMP_RULE the lookup's port (icmp_echo sends one)

#: EndpointPolicy.verdict's match names → the datapath's POLICY_MATCH_*.
MATCH = {"L3-L4": PolicyMatch.L3_L4, "L4-only": PolicyMatch.L4_ONLY, "L3-proto": PolicyMatch.L3_PROTO,
         "proto-only": PolicyMatch.PROTO_ONLY, "L3-only": PolicyMatch.L3_ONLY, "all": PolicyMatch.ALL,
         "none": PolicyMatch.NONE}

#: Peers by identity: the address whose ipcache entry carries it.
PEERS = {B1.identity: B1.ip, B2.identity: B2.ip, A2.identity: A2.ip, WORLD: EXT, REMOTE_NODE: NODE_B_IP,
         CIDR_ID: CIDR_ADDR}


def allow(identity, direction, proto=0, port=0, mask=0xFFFF):
    k = PolicyKey.make(identity, direction, proto, port, mask)
    return k, PolicyEntry.allow(k)


def deny(identity, direction, proto=0, port=0, mask=0xFFFF):
    k = PolicyKey.make(identity, direction, proto, port, mask)
    return k, PolicyEntry.deny(k)


def model(rows) -> EndpointPolicy:
    """a1's policy as the Python model holds it."""
    ep = Endpoint("a1", pod_labels({"app": "a1"}), A1.identity, A1.ip)
    return EndpointPolicy(ep, True, True, [PolicyRow(k, e) for k, e in rows])


def add_cidr_peer(node) -> None:
    """An ipcache entry for CIDR_ADDR with a CIDR identity (as toCIDR policy makes one)."""
    with node.map("cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as ipc:
        ipc[IpcacheKey.for_ip(CIDR_ADDR)] = RemoteEndpointInfo.make(CIDR_ID)


def packet(direction, peer_ip, proto, port, sport):
    """(hook, frame): a1 sending to the peer (egress) or receiving from it (ingress)."""
    if direction == EG:
        src, dst, hook = A1.ip, peer_ip, "cil_from_container"
    else:
        src, dst, hook = peer_ip, A1.ip, "cil_to_container"
    if proto == TCP:
        return hook, tcp(src, dst, sport, port, SYN)
    if proto == UDP:
        return hook, udp(src, dst, sport, port)
    return hook, icmp_echo(src, dst, ident=sport)


def check_table(node, rows, cases):
    """Each case (identity, direction, proto, port) gets, from the datapath, the verdict the model gives."""
    add_cidr_peer(node)
    node.policy(A1, rows)
    pol = model(rows)
    for n, (ident, direction, proto, port) in enumerate(cases):
        want = pol.verdict(ident, direction, proto, port if proto != ICMP else ECHO_REQUEST)
        hook, frame = packet(direction, PEERS[ident], proto, port, 20000 + n)
        r = node.run(hook, frame)
        ev = r.event
        flow = Flow(ev, "node-a", "lxc-a1")
        what = f"{direction.name} {ident} proto {proto} port {port}: model says {want}"
        assert (r.retval == TC_ACT_OK) == want.allowed, what
        assert flow.policy is not None, what + "; no verdict in the trace"
        assert flow.policy.match == MATCH[want.match], what + f"; datapath matched {flow.policy.match}"
        assert flow.policy.egress == (direction == EG) and ev.remote_id == ident, what
        assert flow.policy.denied == (not want.allowed), what
        if not want.allowed:
            deny_hit = want.key is not None and pol.entries()[want.key].is_deny
            assert ev.drop_reason == (DropReason.POLICY_DENY if deny_hit else DropReason.POLICY), what


# -- the lookup: datapath against the model ------------------------------------------------
def test_allow_from_identity(policy):
    """An L3-L4 allow lets exactly that identity in on that port; other ports and identities are denied (none)."""
    rows = [allow(B1.identity, IN, TCP, 8080)]
    check_table(policy, rows, [(B1.identity, IN, TCP, 8080), (B1.identity, IN, TCP, 80), (B2.identity, IN, TCP, 8080),
                               (B1.identity, IN, UDP, 8080), (B1.identity, EG, TCP, 8080)])


def test_allow_port_only(policy):
    """An identity-0 port allow (L4-Only) admits every identity, world and CIDR ones too, on that port only."""
    rows = [allow(0, EG, TCP, 80)]
    check_table(policy, rows, [(B1.identity, EG, TCP, 80), (WORLD, EG, TCP, 80), (CIDR_ID, EG, TCP, 80),
                               (REMOTE_NODE, EG, TCP, 80), (B1.identity, EG, TCP, 81), (WORLD, EG, UDP, 80)])


def test_six_precedence_steps(policy):
    """With an entry at every step, each packet is decided by the most specific step v1.16 lists first."""
    rows = [allow(B1.identity, EG, TCP, 80), deny(0, EG, TCP, 443), allow(B1.identity, EG, UDP),
            deny(0, EG, UDP), allow(B2.identity, EG), deny(0, EG, TCP, 8080), allow(0, EG)]
    check_table(policy, rows, [
        (B1.identity, EG, TCP, 80),     # 1 L3-L4 allow
        (B1.identity, EG, TCP, 443),    # 2 L4-Only deny beats the L3 entries
        (B1.identity, EG, UDP, 53),     # 3 L3-Proto allow
        (B2.identity, EG, UDP, 53),     # 4 Proto-Only deny beats B2's L3-Only allow
        (B2.identity, EG, TCP, 22),     # 5 L3-Only allow
        (WORLD, EG, TCP, 22),           # 6 all
        (WORLD, EG, TCP, 8080),         # 2 L4-Only deny
    ])


def test_deny_overrides_allow_with_agent_rows(policy):
    """Rows the resolver writes for 'anyone on 8080' plus 'deny b1': b1 is denied even on 8080, b2 gets 8080 only."""
    alloc = IdentityAllocator()
    eps = [Endpoint(p.name, pod_labels({"app": p.name}), alloc.allocate(pod_labels({"app": p.name})), p.ip)
           for p in (A1, A2, B1, B2)]
    assert [e.identity for e in eps] == [A1.identity, A2.identity, B1.identity, B2.identity]
    res = resolve(eps, parse_policies("""
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a1}
spec:
  endpointSelector: {matchLabels: {app: a1}}
  ingress: [{toPorts: [{ports: [{port: "8080", protocol: TCP}]}]}]
  ingressDeny: [{fromEndpoints: [{matchLabels: {app: b1}}]}]
"""), alloc)
    rows = [(r.key, r.entry) for r in res.endpoints["a1"].rows]
    check_table(policy, rows, [(B1.identity, IN, TCP, 8080), (B2.identity, IN, TCP, 8080), (B2.identity, IN, TCP, 22),
                               (B1.identity, IN, TCP, 22)])
    # hand-computed: b1 must not get in on 8080 although an identity-0 allow exists for it
    r = policy.run("cil_to_container", tcp(B1.ip, A1.ip, 30000, 8080, SYN))
    assert r.retval == TC_ACT_SHOT and r.event.drop_reason == DropReason.POLICY_DENY


def test_wildcard_identity_allows_everything(policy):
    """The identity-0 ANY/ANY key (what an unselected direction holds) allows every peer and protocol: match 'all'."""
    rows = [allow(0, IN)]
    check_table(policy, rows, [(B1.identity, IN, TCP, 1), (WORLD, IN, UDP, 53), (CIDR_ID, IN, ICMP, 0)])


def test_port_ranges_by_mask(policy):
    """A port range becomes masked prefixes (9000-9010: 9000/13, 9008/15, 9010/16): inside allowed, either side denied."""
    rows = [allow(B1.identity, EG, TCP, port, mask) for port, mask in masked_ports(9000, 9010)]
    cases = [(B1.identity, EG, TCP, port) for port in (8999, 9000, 9007, 9008, 9009, 9010, 9011)]
    check_table(policy, rows, cases)
    got = [policy.run("cil_from_container", tcp(A1.ip, B1.ip, 31000 + i, port, SYN)).retval == TC_ACT_OK
           for i, port in enumerate((8999, 9000, 9010, 9011))]
    assert got == [False, True, True, False]  # hand-computed ends of the range


def test_entry_counts_packets_and_bytes(policy):
    """The entry that decided counts each packet and its skb->len, a deny entry too (v1.16 __account_and_check)."""
    policy.policy(A1, [allow(B1.identity, EG, TCP, 80), deny(B2.identity, EG)])
    f1, f2, f3 = tcp(A1.ip, B1.ip, 40000, 80, SYN), tcp(A1.ip, B1.ip, 40001, 80, SYN), tcp(A1.ip, B2.ip, 40002, 80, SYN)
    for f in (f1, f2, f3):
        policy.run("cil_from_container", f)
    with policy.policy_map(A1) as m:
        rows = {k.sec_label: v for k, v in m.items()}
    assert (rows[B1.identity].packets, rows[B1.identity].bytes) == (2, len(f1) + len(f2))
    assert (rows[B2.identity].packets, rows[B2.identity].bytes) == (1, len(f3))


# -- the hooks ---------------------------------------------------------------------------------
def test_denied_syn_egress_creates_no_ct_row(policy):
    """A SYN no entry allows: DROP_POLICY, 'policy-verdict:none EGRESS DENIED' on b1's identity, and no CT row at all."""
    policy.policy(A1, [allow(B2.identity, EG)])
    r = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_SHOT
    ev = r.event
    assert ev.drop_reason == DropReason.POLICY and DropReason.text(ev.drop_reason) == "Policy denied"
    assert ev.ct_result == CtResult.NEW
    flow = Flow(ev, "node-a", "lxc-a1")
    assert flow.policy.text() == "policy-verdict:none EGRESS DENIED" and ev.remote_id == B1.identity
    assert "policy-verdict:none EGRESS DENIED (ID:258) DROPPED (Policy denied)" in flow.line()
    assert policy.ct() == [], [x.line() for x in policy.ct()]


def test_denied_syn_ingress_creates_no_ct_row(policy):
    """At to-container a SYN a1's ingress does not allow is dropped before its IN row exists."""
    policy.policy(A1, [allow(0, EG)])
    r = policy.run("cil_to_container", tcp(B1.ip, A1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_SHOT and r.event.drop_reason == DropReason.POLICY
    assert Flow(r.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:none INGRESS DENIED"
    assert r.event.remote_id == B1.identity
    assert policy.ct() == []


def test_allowed_new_creates_ct_row_and_reports(policy):
    """An allowed SYN creates the OUT row and reports 'policy-verdict:L3-L4 EGRESS ALLOWED'."""
    policy.policy(A1, [allow(B1.identity, EG, TCP, 8080)])
    r = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK
    assert Flow(r.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:L3-L4 EGRESS ALLOWED"
    row = policy.ct_row("OUT", A1.ip, 40000, B1.ip, 8080)
    assert row is not None and row.src_sec_id == A1.identity


def _open(node):
    """a1 → b1:8080 SYN, SYN-ACK, ACK under an allow for it."""
    node.policy(A1, [allow(B1.identity, EG, TCP, 8080)])
    first = node.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    reply = node.run("cil_to_container", tcp(B1.ip, A1.ip, 8080, 40000, SYN | ACK))
    est = node.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, ACK))
    return first, reply, est


def test_established_allowed_reports_no_verdict(policy):
    """An allowed established packet passes without a verdict (v1.16 notifies only drops and non-established allows)."""
    _, reply, est = _open(policy)
    assert reply.retval == TC_ACT_OK and Flow(reply.event, "node-a", "lxc-a1").policy is None, "a reply skips policy"
    assert est.retval == TC_ACT_OK and est.event.ct_result == CtResult.ESTABLISHED
    assert Flow(est.event, "node-a", "lxc-a1").policy is None
    with policy.policy_map(A1) as m:
        assert [v.packets for v in m.values()] == [2], "yet the entry counts it: SYN and ACK"


def test_established_after_allow_removed_is_dropped(policy):
    """v1.16 enforces CT_ESTABLISHED at egress: once the allow entry is gone the next packet is DROP_POLICY, verdict reported."""
    _open(policy)
    with policy.policy_map(A1) as m:
        del m[PolicyKey.make(B1.identity, EG, TCP, 8080)]
    r = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, ACK))
    assert r.retval == TC_ACT_SHOT and r.event.drop_reason == DropReason.POLICY
    assert r.event.ct_result == CtResult.ESTABLISHED
    assert Flow(r.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:none EGRESS DENIED"
    assert policy.ct_row("OUT", A1.ip, 40000, B1.ip, 8080) is not None, "the row stays (the CT lookup ran first)"


def test_reply_after_allow_removed_passes(policy):
    """Replies skip policy (CT_REPLY): with a1's map emptied, b1's answer still reaches a1, with no verdict."""
    _open(policy)
    with policy.policy_map(A1) as m:
        for k in list(m.keys()):
            del m[k]
    r = policy.run("cil_to_container", tcp(B1.ip, A1.ip, 8080, 40000, ACK))
    assert r.retval == TC_ACT_OK and r.event.ct_result == CtResult.REPLY
    assert Flow(r.event, "node-a", "lxc-a1").policy is None


def test_ingress_established_after_allow_removed_is_dropped(policy):
    """At to-container too, an established connection's next packet is checked again and dropped once its allow is gone."""
    policy.policy(A1, [allow(B1.identity, IN, TCP, 8080)])
    assert policy.run("cil_to_container", tcp(B1.ip, A1.ip, 40000, 8080, SYN)).retval == TC_ACT_OK
    policy.run("cil_from_container", tcp(A1.ip, B1.ip, 8080, 40000, SYN | ACK))
    assert policy.run("cil_to_container", tcp(B1.ip, A1.ip, 40000, 8080, ACK)).retval == TC_ACT_OK
    with policy.policy_map(A1) as m:
        del m[PolicyKey.make(B1.identity, IN, TCP, 8080)]
    r = policy.run("cil_to_container", tcp(B1.ip, A1.ip, 40000, 8080, ACK))
    assert r.retval == TC_ACT_SHOT and r.event.ct_result == CtResult.ESTABLISHED
    assert r.event.drop_reason == DropReason.POLICY


def _service(node, backend):
    node.service(VIP, VPORT, [(1, backend.ip, 8080, 0)])


def test_service_verdict_on_backend_identity(policy):
    """Through a ClusterIP the egress verdict is taken after DNAT, on the backend's identity (a2), not the VIP's (world)."""
    _service(policy, A2)
    policy.policy(A1, [allow(A2.identity, EG, TCP, 8080)])
    r = policy.run("cil_from_container", tcp(A1.ip, VIP, 40000, VPORT, SYN))
    assert r.retval == TC_ACT_OK and r.event.remote_id == A2.identity
    assert Flow(r.event, "node-a", "lxc-a1").policy.match == PolicyMatch.L3_L4
    policy.policy(A1, [allow(WORLD, EG, TCP, VPORT)])
    r = policy.run("cil_from_container", tcp(A1.ip, VIP, 40001, VPORT, SYN))
    assert r.retval == TC_ACT_SHOT and r.event.remote_id == A2.identity


def test_hairpin_skips_policy_under_deny_all(policy):
    """a1 reaching itself through its Service passes both hooks with an empty (deny-all) map: no verdict, LBLoopback rows."""
    _service(policy, A1)
    policy.policy(A1, [])
    out = policy.run("cil_from_container", tcp(A1.ip, VIP, 40000, VPORT, SYN))
    assert out.retval == TC_ACT_OK and Flow(out.event, "node-a", "lxc-a1").policy is None
    pkt = out.pkt
    assert (pkt.src, pkt.dst) == (LOOPBACK, A1.ip)
    into = policy.run("cil_to_container", out.frame)
    assert into.retval == TC_ACT_OK and Flow(into.event, "node-a", "lxc-a1").policy is None
    row = policy.ct_row("IN", LOOPBACK, 40000, A1.ip, 8080)
    assert row is not None and row.flags & CtFlags.LB_LOOPBACK
    again = policy.run("cil_to_container", tcp(LOOPBACK, A1.ip, 40000, 8080, ACK))
    assert again.retval == TC_ACT_OK and again.event.ct_result == CtResult.ESTABLISHED, "its IN row's LBLoopback"
    # the same map denies a1 → a2 directly: the bypass is the hairpin's alone
    assert policy.run("cil_from_container", tcp(A1.ip, A2.ip, 40001, 8080, SYN)).retval == TC_ACT_SHOT


def test_loopback_source_without_loopback_entry_is_checked(policy):
    """A packet from the loopback address with no LBLoopback OUT entry gets no hairpin pass: ingress policy applies."""
    policy.policy(A1, [])
    r = policy.run("cil_to_container", tcp(LOOPBACK, A1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_SHOT and r.event.drop_reason == DropReason.POLICY


def test_no_policy_map_allows(policy):
    """A pod with no map in labkit_policy is not enforced: allowed, CT row created, no verdict in the trace."""
    r = policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK and Flow(r.event, "node-a", "lxc-a1").policy is None
    assert policy.ct_row("OUT", A1.ip, 40000, B1.ip, 8080) is not None
    r = policy.run("cil_to_container", tcp(B1.ip, A1.ip, 40001, 80, SYN))
    assert r.retval == TC_ACT_OK and Flow(r.event, "node-a", "lxc-a1").policy is None


def test_other_pods_map_does_not_apply(policy):
    """a2's deny-all map leaves a1 alone: the program picks the map by the sending pod's endpoint id."""
    policy.policy(A2, [])
    assert policy.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN)).retval == TC_ACT_OK
    r = policy.run("cil_from_container", tcp(A2.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_SHOT and r.event.drop_reason == DropReason.POLICY


def test_audit_mode_passes_marked_audited(audit):
    """POLICY_AUDIT_MODE: a packet policy denies passes, its verdict 'AUDITED' with the match, and its CT row exists."""
    audit.policy(A1, [allow(B2.identity, EG)])
    r = audit.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK and r.event.drop_reason == 0
    flow = Flow(r.event, "node-a", "lxc-a1")
    assert flow.policy.text() == "policy-verdict:none EGRESS AUDITED" and flow.policy.audited
    assert audit.ct_row("OUT", A1.ip, 40000, B1.ip, 8080) is not None
    r = audit.run("cil_from_container", tcp(A1.ip, B2.ip, 40001, 8080, SYN))
    assert Flow(r.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:L3-Only EGRESS ALLOWED"


def test_audit_mode_deny_entry_is_audited_too(audit):
    """In audit mode a deny entry's drop (DROP_POLICY_DENY) passes as well, reported audited with its match type."""
    audit.policy(A1, [deny(B1.identity, IN)])
    r = audit.run("cil_to_container", tcp(B1.ip, A1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK
    assert Flow(r.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:L3-Only INGRESS AUDITED"


def test_world_peer_identity(policy):
    """An address the ipcache maps only through 0.0.0.0/0 is world (2); world allowed on 443 only."""
    policy.policy(A1, [allow(WORLD, EG, TCP, 443)])
    ok = policy.run("cil_from_container", tcp(A1.ip, "198.51.100.200", 40000, 443, SYN))
    bad = policy.run("cil_from_container", tcp(A1.ip, "198.51.100.200", 40001, 80, SYN))
    assert (ok.retval, bad.retval) == (TC_ACT_OK, TC_ACT_SHOT)
    assert ok.event.remote_id == WORLD == bad.event.remote_id


def test_cidr_identity_in_trace(policy):
    """A CIDR identity (bit 24 set) travels whole in the trace's remote_id."""
    add_cidr_peer(policy)
    policy.policy(A1, [allow(CIDR_ID, EG)])
    r = policy.run("cil_from_container", tcp(A1.ip, CIDR_ADDR, 40000, 443, SYN))
    assert r.retval == TC_ACT_OK and r.event.remote_id == CIDR_ID


def test_icmp_looks_up_its_type_as_port(policy):
    """With ENABLE_ICMP_RULE (the agent's --enable-icmp-rules, on by default) the ICMP type is the lookup's port:
    an allow for type 8 admits an echo request (L3-L4), one for type 13 does not, an ICMP allow without a type
    admits it (L3-Proto)."""
    rows = [allow(B1.identity, EG, ICMP, ECHO_REQUEST), allow(B2.identity, EG, ICMP, 13), allow(A2.identity, EG, ICMP)]
    check_table(policy, rows, [(B1.identity, EG, ICMP, 0), (B2.identity, EG, ICMP, 0), (A2.identity, EG, ICMP, 0),
                               (WORLD, EG, ICMP, 0)])
    policy.policy(A1, [allow(B1.identity, EG, ICMP, ECHO_REQUEST)])
    r = policy.run("cil_from_container", icmp_echo(A1.ip, B1.ip, ident=77))
    assert r.retval == TC_ACT_OK  # hand-computed: key (258, egress, ICMP, port 8) matches the request whatever its id
    assert Flow(r.event, "node-a", "lxc-a1").policy.match == PolicyMatch.L3_L4


@pytest.fixture(scope="module")
def never(_require_bpf):
    """node-a's pod programs built with policy 'never' (`up --policy-mode never`: no policy code). The shared
    builds are a default node's, policy compiled in."""
    from dataclasses import replace

    from . import harness

    harness.BUILDS.setdefault("never", (replace(harness.BUILDS["native"][0], policy="never"), ("bpf_lxc.c",)))
    build = harness.loaded_build("never")
    node = harness.Node("never", build)
    node.reset()
    yield node
    build.close()


def test_never_build_has_no_policy_map(never):
    """A build with policy 'never' has no labkit_policy map and reports no verdicts."""
    assert "labkit_policy" not in never.build.loaded.maps
    r = never.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK and Flow(r.event, "node-a", "lxc-a1").policy is None
    assert r.event.remote_id == 0


def test_default_build_without_a_pods_map_reports_no_verdict(native):
    """The default build (policy 'default', a node's) has labkit_policy; a pod no policy selects has no map in it
    and its packets pass with no verdict."""
    assert native.config.policy == "default" and "labkit_policy" in native.build.loaded.maps
    r = native.run("cil_from_container", tcp(A1.ip, B1.ip, 40000, 8080, SYN))
    assert r.retval == TC_ACT_OK and Flow(r.event, "node-a", "lxc-a1").policy is None



def test_image_pairs_policy_map_with_its_own_template(policy):
    """Loaded from its image, labkit_policy takes the LPM tries the agent makes and refuses a Maglev-shaped inner map."""
    policy.policy(A1, [allow(0, EG)])  # an LPM trie like labkit_policy_inner: accepted
    lut_bytes = 4 * policy.config.maglev_table_size  # labkit_maglev_inner's value: M backend ids
    fd = _bpf.map_create(_bpf.BPF_MAP_TYPE_ARRAY, 4, lut_bytes, 1, "lb4_maglev_lut")
    try:
        with pytest.raises(OSError):
            _bpf.update(policy.build.map_fd("labkit_policy"), ctypes.c_uint32(2), ctypes.c_uint32(fd))
        _bpf.update(policy.build.map_fd("cilium_lb4_maglev"), ctypes.c_uint16(1), ctypes.c_uint32(fd))
    finally:
        os.close(fd)


MARK_FROM_OVERLAY = 0x40000000  #: bpf/lib/common.h: decapsulated by cilium_vxlan (Cilium's CB_FROM_TUNNEL)


def test_tunnel_ingress_uses_source_identity(policy_tunnel):
    """From the tunnel, a1's ingress decides on the source's identity: b1 allowed (IN row with FromTunnel), b2 denied."""
    node = policy_tunnel
    node.policy(A1, [allow(B1.identity, IN, TCP, 8080)])
    ok = node.run("cil_to_container", tcp(B1.ip, A1.ip, 40000, 8080, SYN), mark=MARK_FROM_OVERLAY)
    assert ok.retval == TC_ACT_OK and ok.event.remote_id == B1.identity
    assert Flow(ok.event, "node-a", "lxc-a1").policy.text() == "policy-verdict:L3-L4 INGRESS ALLOWED"
    row = node.ct_row("IN", B1.ip, 40000, A1.ip, 8080)
    assert row is not None and row.flags & CtFlags.FROM_TUNNEL
    bad = node.run("cil_to_container", tcp(B2.ip, A1.ip, 40001, 8080, SYN), mark=MARK_FROM_OVERLAY)
    assert bad.retval == TC_ACT_SHOT and bad.event.drop_reason == DropReason.POLICY
    assert bad.event.remote_id == B2.identity
    assert node.ct_row("IN", B2.ip, 40001, A1.ip, 8080) is None


def test_tunnel_egress_denied_before_encapsulation(policy_tunnel):
    """In tunnel mode a denied SYN is dropped before any tunnel key is set; an allowed one goes to cilium_vxlan."""
    node = policy_tunnel
    node.policy(A1, [allow(B1.identity, EG, TCP, 8080)])
    bad = node.run("cil_from_container", tcp(A1.ip, B2.ip, 40000, 8080, SYN))
    assert bad.retval == TC_ACT_SHOT and bad.event.tunnel_endpoint == 0
    ok = node.run("cil_from_container", tcp(A1.ip, B1.ip, 40001, 8080, SYN))
    assert ok.retval == TC_ACT_REDIRECT and ok.event.tunnel_endpoint != 0
