"""Issue 17's acceptance matrix on one real lab: CiliumNetworkPolicies applied through the agent, real TCP
connects over four paths (pod→pod on one node, across nodes, through a ClusterIP, from ext through a NodePort),
the verdict in the trace, the CT rows each node keeps; an allow deleted under an open connection; hairpin
under deny-all.

What the expectations follow (Cilium v1.16, read in bpf_lxc.c, bpf/lib/nodeport.h, bpf/lib/policy.h and
pkg/policy; tests/bpf/test_policy.py pins the lookup packet by packet, test_policy_agent.py the maps):

- bpf_lxc.c ``handle_ipv4_from_lxc`` (egress) and ``ipv4_policy`` (ingress): ``case CT_NEW: case
  CT_ESTABLISHED:`` look the peer up in the endpoint's policy map, ``case CT_RELATED: case CT_REPLY:`` skip it
  ("Skip policy enforcement for return traffic"); a denied packet returns DROP_POLICY before ``ct_create4``, so
  the denying hook makes no CT row, while the sender's node already made its OUT row (and, through a Service,
  its SERVICE row: the LB runs before handle_ipv4_from_lxc). The verdict is sent when ``verdict != CTX_ACT_OK ||
  ct_status != CT_ESTABLISHED``.
- The egress peer is cilium_ipcache's identity of the destination *after* DNAT (handle_ipv4_from_lxc looks up
  ``tuple->daddr`` once lb4_local has rewritten it), WORLD when unknown; the ingress peer is the ipcache
  identity of the source address as it arrives.
- bpf/lib/nodeport.h ``nodeport_lb4``: for a local backend it creates the CT_EGRESS entry and, flipped, the
  CT_INGRESS entry (``ct_flip_tuple_dir4``; node_port set) before the pod's ``ipv4_policy`` runs, which therefore
  sees CT_ESTABLISHED on the very first SYN and still checks it. For a remote backend in SNAT mode the packet
  reaches the backend's node from the LB node's address, whose ipcache identity is remote-node (6), so the
  backend's policy sees remote-node, not world (with DSR it would see ext's address, world).
- pkg/policy (repository.go ``computePolicyEnforcementAndRules``, mapstate.go): a policy with an ``ingress``
  section makes the endpoint default-deny at ingress (plus allow-localhost, identity 1); a direction no rule
  names stays allow-all (key identity 0, ANY); deny entries win over allows (mapstate ``denyPreferredInsert``).
  Entity ``all`` is the wildcard identity 0, ``world`` is 2 (IPv4-only cluster), toCIDR a local CIDR identity
  (1<<24 | n) put in every node's ipcache.
"""
from __future__ import annotations

import itertools
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from labkit.constants import DropReason, Hook, PolicyMatch
from labkit.maps.ct import CtFlags

from labtag import tagged

from .util import wait_for

A1, A2, B1 = 256, 257, 258  #: identities of the default lab's pods, from MinimalNumericIdentity in order
HOST, WORLD, REMOTE_NODE = 1, 2, 6  #: pkg/identity/numericidentity.go reserved identities
CIDR_ID = (1 << 24) | 1  #: the first local-scope CIDR identity (MinLocalIdentity)
NODE_PORT = 30080
L3_ONLY, L3_L4, L4_ONLY, ALL, NONE = (PolicyMatch.L3_ONLY, PolicyMatch.L3_L4, PolicyMatch.L4_ONLY, PolicyMatch.ALL,
                                      PolicyMatch.NONE)
_ids = itertools.count(1_000_000)


def cnp(name: str, body: str, pod: str = "a1") -> str:
    return ("apiVersion: cilium.io/v2\nkind: CiliumNetworkPolicy\n"
            f"metadata: {{name: {name}}}\nspec:\n  endpointSelector: {{matchLabels: {{app: {pod}}}}}\n" + body)


FROM_B1 = cnp("from-b1", "  ingress: [{fromEndpoints: [{matchLabels: {app: b1}}]}]\n")
PORT_ONLY = cnp("port-only", "  ingress: [{toPorts: [{ports: [{port: '8080', protocol: TCP}]}]}]\n")
DENY_B1 = cnp("deny-b1", "  ingress: [{fromEntities: [all]}]\n"
                         "  ingressDeny: [{fromEndpoints: [{matchLabels: {app: b1}}]}]\n")
TO_CIDR = cnp("to-ext", "  egress: [{toCIDR: [198.51.100.100/32]}]\n")
TO_WORLD = cnp("to-world", "  egress: [{toEntities: [world]}]\n")
DEFAULT_DENY = cnp("default-deny", "  ingress: [{}]\n")
DENY_ALL = cnp("deny-all", "  ingress: [{}]\n  egress: [{}]\n")


@pytest.fixture(scope="module")
def mlab(_require_datapath):
    """One native-routing, SNAT-mode lab with policy compiled in: NodePort 'web-a' (a1), ClusterIP 'web-b' (b1),
    and a route in ext back to node-a's pods (so a pod's allowed SYN to ext is answered, by a RST)."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    lab = Lab.up(tagged("pmx"), config=DatapathConfig(routing="native", lb_mode="snat", policy="default",
                                                      gc_timer=False))
    try:
        lab.services.add("web-a", 80, ["a1:8080"], type="NodePort", node_port=NODE_PORT)
        lab.services.add("web-b", 80, ["b1:8080"])
        # ext answers a1 directly: a lab with policy compiled in gives ext a route back to every node's pod CIDR
        # (labkit/fqdn/zone.py, for toFQDNs' web servers).
        yield lab
    finally:
        lab.down()


@pytest.fixture
def pm(mlab):
    """The module's lab with no policy and empty CT maps."""
    mlab.policy.flush()
    mlab.flush_ct()
    return mlab


@dataclass
class Attempt:
    """One real connect and what it left: the client's answer, its port, the trace, the CT rows of its flow."""

    result: dict
    sport: int
    flows: list
    ct: dict
    log: object = None

    @property
    def reached(self) -> bool:
        """The SYN reached the peer and an answer came back (connected, or refused by a closed port)."""
        return self.result["ok"] or self.result.get("error") == "ECONNREFUSED"

    def verdicts(self, node: str, hook: Hook, expect: bool = True) -> list:
        """The records of this flow at ``node``/``hook`` that carry a verdict; when one is ``expect``ed, the
        trace is read on until it arrives (records reach the log a moment after the packet)."""
        def found():
            self.flows += [f for f in self.log.read() if _of_flow(self.sport)(f)]
            return [f for f in self.flows if f.node == node and f.hook == hook and f.policy is not None]
        return wait_for(found, timeout=3, what=f"a verdict at {node} {hook.label}") if expect else found()

    def drop(self):
        """This flow's first drop record, waited for."""
        def found():
            self.flows += [f for f in self.log.read() if _of_flow(self.sport)(f)]
            return next((f for f in self.flows if f.dropped), None)
        return wait_for(found, timeout=3, what=f"the drop of port {self.sport}'s flow")

    def rows(self, node: str) -> list:
        return self.ct[node]


def _of_flow(sport: int):
    def match(f) -> bool:
        return sport in {socket.ntohs(t.sport) for t in (f.event.before, f.event.after)} | \
            {socket.ntohs(t.dport) for t in (f.event.before, f.event.after)}
    return match


def attempt(lab, client: str, host: str, port: int, timeout: float = 1.0, settle: float = 0.15) -> Attempt:
    """connect() from ``client`` to host:port; the CT rows are read before the socket is reset."""
    lab.flush_ct()
    log = lab.events()
    log.seek_end()
    cid = next(_ids)
    res = lab.podclient(client).call({"op": "tcp_open", "id": cid, "host": host, "port": port, "timeout": timeout})
    sport = res["sport"]
    time.sleep(settle)
    ct = {n.name: [r for r in lab.ct(n.name) if not r.related and sport in (r.sport, r.dport)]
          for n in lab.topology.nodes}
    flows = [f for f in log.read() if _of_flow(sport)(f)]
    if res["ok"]:
        lab.podclient(client).call({"op": "tcp_reset", "id": cid})
    return Attempt(res, sport, flows, ct, log)


def dirs(rows) -> list[str]:
    return sorted(r.dir for r in rows)


# -- the paths -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Path:
    """A connection to try: ``client`` connects to ``target`` (a pod, Service, node or ext by name) on ``port``."""

    name: str
    client: str
    target: str
    port: int

    def __call__(self, lab) -> Attempt:
        return attempt(lab, self.client, lab.address_of(self.target), self.port)


# Ingress at a1 (a1 the server): the deciding hook is node-a's to-container.
same_node = Path("same_node", "a2", "a1", 8080)
across = Path("across", "b1", "a1", 8080)
cluster_ip = Path("cluster_ip", "b1", "web-a", 80)
#: ext → node-a:30080, whose backend a1 is local: no SNAT, ext's own address reaches a1.
node_port = Path("node_port", "ext", "node-a", NODE_PORT)
#: ext → node-b:30080: the backend is remote, SNAT mode rewrites the source to node-b's address.
node_port_snat = Path("node_port_snat", "ext", "node-b", NODE_PORT)
# Egress of a1 (a1 the client): the deciding hook is node-a's from-container.
e_same_node = Path("e_same_node", "a1", "a2", 8080)
e_across = Path("e_across", "a1", "b1", 8080)
e_cluster_ip = Path("e_cluster_ip", "a1", "web-b", 80)
e_ext = Path("e_ext", "a1", "ext", 8080)

PEER_NODE = {same_node: "node-a", across: "node-b", cluster_ip: "node-b", node_port: "node-a",
             node_port_snat: "node-b"}


def check_ingress(lab, path, allowed: bool, match: PolicyMatch, remote: int, reason=DropReason.POLICY):
    """One cell of a1's ingress column: outcome, verdict at node-a's to-container, CT rows on both nodes."""
    at = path(lab)
    what = f"{path.name}: expected {'allowed' if allowed else 'denied'} ({match}, remote {remote})"
    assert at.reached == allowed, what + f"; the client got {at.result}"
    if allowed:
        # The allowed SYN's IN row at a1 carries the peer's identity (ipv4_policy: ct_state_new.src_sec_id).
        ins = [r for r in at.rows("node-a") if r.dir == "IN"]
        assert [r.src_sec_id for r in ins] == [remote], what + f"; node-a's IN rows: {ins}"
        verdicts = at.verdicts("node-a", Hook.TO_CONTAINER, expect=path is not node_port)
        if path is node_port:
            # nodeport_lb4 made the IN entry for the local backend: the SYN is CT_ESTABLISHED at a1 and an
            # allowed established packet sends no verdict (verdict != CTX_ACT_OK || ct_status != ESTABLISHED).
            assert verdicts == [], what
        else:
            v = verdicts[0]
            assert v.policy.text() == f"policy-verdict:{match} INGRESS ALLOWED", what
            assert v.event.remote_id == remote and v.ct_result.name == "NEW", what
        return at
    drop = at.drop()
    assert (drop.node, drop.hook) == ("node-a", Hook.TO_CONTAINER), what + f"; dropped at {drop}"
    assert drop.event.drop_reason == reason, what + f"; {DropReason.text(drop.event.drop_reason)}"
    assert drop.policy.text() == f"policy-verdict:{match} INGRESS DENIED", what + f"; {drop.policy.text()}"
    assert drop.event.remote_id == remote, what + f"; remote {drop.event.remote_id}"
    # The denying hook made no row; what exists was made before it (the sender's egress, the LB).
    if path is node_port:
        assert drop.ct_result.name == "ESTABLISHED", what + "; nodeport_lb4's IN entry is found first"
        assert dirs(at.rows("node-a")) == ["IN", "OUT", "SVC"], what
        assert all(r.flags & CtFlags.NODE_PORT for r in at.rows("node-a") if r.dir != "SVC"), \
            what + "; every row is nodeport_lb4's"
    else:
        assert drop.ct_result.name == "NEW", what
        assert not [r for r in at.rows("node-a") if r.dir == "IN"], what + "; the denied SYN left an IN row"
        peer = PEER_NODE[path]
        want = {same_node: ["OUT"], across: ["OUT"], cluster_ip: ["OUT", "SVC"], node_port_snat: ["OUT", "SVC"]}[path]
        assert dirs(r for r in at.rows(peer) if r.dir != "IN") == want, what + f"; {peer}: {at.rows(peer)}"
    return at


def check_egress(lab, path, allowed: bool, match: PolicyMatch, remote: int):
    at = path(lab)
    what = f"{path.name}: expected {'allowed' if allowed else 'denied'} ({match}, remote {remote})"
    assert at.reached == allowed, what + f"; the client got {at.result}"
    first = at.verdicts("node-a", Hook.FROM_CONTAINER)
    assert first, what + "; no egress verdict at from-container"
    v = first[0]
    assert v.policy.text() == f"policy-verdict:{match} EGRESS {'ALLOWED' if allowed else 'DENIED'}", \
        what + f"; {v.policy.text()}"
    assert v.event.remote_id == remote and v.ct_result.name == "NEW", what + f"; remote {v.event.remote_id}"
    outs = [r for r in at.rows("node-a") if r.dir == "OUT"]
    if allowed:
        assert [r.src_sec_id for r in outs] == [A1], what + f"; OUT rows {outs}"
    else:
        assert v.dropped and v.event.drop_reason == DropReason.POLICY, what
        assert outs == [], what + "; a denied SYN made an OUT row"
        # The Service's row is the LB's, made before the policy; nothing reached another node.
        assert dirs(at.rows("node-a")) == (["SVC"] if path is e_cluster_ip else []), what
        assert all(not at.rows(n) for n in ("node-b",)), what
    return at


# -- 1. the matrix ------------------------------------------------------------------------------------
DENY = DropReason.POLICY_DENY
#: Policy → what each path into a1 must meet: (path, allowed, match, remote identity[, drop reason]),
#: written from the policy's meaning (pkg/policy), not from a run.
INGRESS_MATRIX = {
    # fromEndpoints app=b1: b1 in, directly and through the ClusterIP (after DNAT the packet at a1 is from b1,
    # L3-Only); a2, ext (world) and SNATed ext (remote-node) match nothing.
    "allow-from-label": (FROM_B1, [(same_node, False, NONE, A2), (across, True, L3_ONLY, B1),
                                   (cluster_ip, True, L3_ONLY, B1), (node_port, False, NONE, WORLD),
                                   (node_port_snat, False, NONE, REMOTE_NODE)]),
    # toPorts 8080/TCP without peers: identity 0 on 8080 (L4-Only) lets every path in (the NodePort's DNAT
    # leaves 8080 at a1).
    "allow-port-only": (PORT_ONLY, [(same_node, True, L4_ONLY, A2), (across, True, L4_ONLY, B1),
                                    (cluster_ip, True, L4_ONLY, B1), (node_port, True, L4_ONLY, WORLD),
                                    (node_port_snat, True, L4_ONLY, REMOTE_NODE)]),
    # fromEntities all (identity 0, ANY: match "all") and ingressDeny app=b1: b1's deny key (L3-Only) is found
    # before the wildcard, so b1 is refused by the denylist on both its paths; everyone else gets in.
    "deny-overrides-allow": (DENY_B1, [(same_node, True, ALL, A2), (across, False, L3_ONLY, B1, DENY),
                                       (cluster_ip, False, L3_ONLY, B1, DENY), (node_port, True, ALL, WORLD),
                                       (node_port_snat, True, ALL, REMOTE_NODE)]),
    # ingress: [{}]: a1 is selected at ingress and nothing but the host (1) is allowed.
    "default-deny-once-selected": (DEFAULT_DENY, [(same_node, False, NONE, A2), (across, False, NONE, B1),
                                                  (cluster_ip, False, NONE, B1), (node_port, False, NONE, WORLD),
                                                  (node_port_snat, False, NONE, REMOTE_NODE)]),
}


@pytest.mark.parametrize("name", list(INGRESS_MATRIX))
def test_ingress_matrix(pm, name):
    """Each path into a1 is allowed or denied as the policy says, with its verdict, reason and CT rows."""
    policy, cells = INGRESS_MATRIX[name]
    pm.policy.apply(policy)
    for cell in cells:
        check_ingress(pm, *cell)


def test_port_only_denies_other_ports(pm):
    """Under the port-only allow, a2's SYN to a1:9999 is denied at a1 (no key for 9999: match none)."""
    pm.policy.apply(PORT_ONLY)
    at = attempt(pm, "a2", pm.pod("a1").ip, 9999)
    assert not at.reached
    drop = at.drop()
    assert drop.policy.text() == "policy-verdict:none INGRESS DENIED" and drop.event.drop_reason == DropReason.POLICY


@pytest.mark.parametrize("policy, ext_id", [(TO_CIDR, CIDR_ID), (TO_WORLD, WORLD)], ids=["toCIDR", "toEntities-world"])
def test_egress_to_ext_only(pm, policy, ext_id):
    """toCIDR ext/32 (a CIDR identity) or toEntities world (2): a1's SYN to ext leaves (L3-Only, OUT row), its
    SYNs to a2, b1 and b1 behind a ClusterIP are denied on the pods' identities (after DNAT), and ext still
    reaches a1 through the NodePort: a1's replies are CT_REPLY, never checked."""
    pm.policy.apply(policy)
    check_egress(pm, e_ext, True, L3_ONLY, ext_id)
    check_egress(pm, e_same_node, False, NONE, A2)
    check_egress(pm, e_across, False, NONE, B1)
    check_egress(pm, e_cluster_ip, False, NONE, B1)
    at = node_port(pm)
    assert at.reached, f"ext through the NodePort: {at.result}"
    assert at.verdicts("node-a", Hook.FROM_CONTAINER, expect=False) == [], "a1's SYN-ACK is a reply: no egress verdict"


# -- 2. an allow deleted under an open connection ---------------------------------------------------------
#: One end of a TCP connection on port 9000 (argv[1]: "listen", or the address to connect to), driven by lines on
#: stdin: "send WORD" writes WORD, "read" prints what arrives within 1 s (or the timeout's name).
_PEER = r"""
import socket, sys
if sys.argv[1] == "listen":
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 9000)); srv.listen(1); print("listening", flush=True)
    s, _ = srv.accept(); print("accepted", flush=True)
else:
    s = socket.create_connection((sys.argv[1], 9000), timeout=3); print("connected", flush=True)
s.settimeout(1.0)
for line in sys.stdin:
    cmd, _, word = line.strip().partition(" ")
    if cmd == "send":
        s.sendall(word.encode()); print("sent", flush=True)
    elif cmd == "read":
        try:
            print("read", s.recv(100).decode() or "EOF", flush=True)
        except OSError as exc:
            print("read", type(exc).__name__, flush=True)
"""


class _Proc:
    def __init__(self, lab, pod: str, code: str, *args: str):
        self.p = lab.popen(pod, [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)

    def line(self) -> str:
        return self.p.stdout.readline().strip()

    def say(self, cmd: str) -> str:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.line()

    def stop(self) -> None:
        self.p.kill()
        self.p.wait(5)


def test_allow_deleted_mid_connection(pm):
    """b1→a1:9000 open under from-b1 (+ deny-all both ways keeping a1 selected); `policy delete from-b1`: b1's next
    data is dropped at a1's to-container as ESTABLISHED (ipv4_policy checks CT_ESTABLISHED), while a1's own data,
    though a1's egress allows nothing, still reaches b1 (handle_ipv4_from_lxc skips CT_REPLY) with no verdict."""
    pm.policy.apply(DENY_ALL)
    pm.policy.apply(FROM_B1)
    server = _Proc(pm, "a1", _PEER, "listen")
    client = None
    try:
        assert server.line() == "listening"
        client = _Proc(pm, "b1", _PEER, pm.pod("a1").ip)
        assert client.line() == "connected" and server.line() == "accepted"
        assert client.say("send ping") == "sent" and server.say("read") == "read ping", "allowed: data flows"
        log = pm.events()
        log.seek_end()
        pm.policy.delete("from-b1")
        # b1 → a1: an ESTABLISHED packet, checked against a1's map, which no longer allows b1.
        assert client.say("send ping") == "sent"
        assert server.say("read") == "read TimeoutError", "b1's data must not reach a1 any more"
        drop = wait_for(lambda: next((f for f in log.read() if f.dropped), None), timeout=3, what="the drop")
        assert (drop.node, drop.hook, drop.ct_result.name) == ("node-a", Hook.TO_CONTAINER, "ESTABLISHED")
        assert drop.event.drop_reason == DropReason.POLICY and drop.event.remote_id == B1
        assert drop.policy.text() == "policy-verdict:none INGRESS DENIED"
        # a1 → b1: a reply of the connection b1 opened; from-container does not consult policy.
        log.seek_end()
        assert server.say("send push") == "sent"
        assert client.say("read") == "read push", "a1's reply-direction data still reaches b1"
        seen: list = []
        out = wait_for(lambda: [f for f in seen.extend(log.read()) or seen
                                if f.node == "node-a" and f.hook == Hook.FROM_CONTAINER], timeout=3,
                       what="a1's push at from-container")
        assert out and all(f.ct_result.name == "REPLY" and f.policy is None and not f.dropped for f in out), \
            [str(f) for f in out]
    finally:
        server.stop()
        if client:
            client.stop()


# -- 3. hairpin under deny-all ----------------------------------------------------------------------------
def test_hairpin_under_deny_all(pm):
    """With a1 denied everything both ways, a1 still reaches itself through its own Service: from-container
    skips policy for the loopback flow, to-container recognises it as hairpin (source IPV4_LOOPBACK with an
    LBLoopback OUT entry, then the IN entry's LBLoopback flag): no verdict anywhere, rows flagged LBLoopback;
    the same a1 cannot reach b1."""
    pm.policy.apply(DENY_ALL)
    at = attempt(pm, "a1", pm.address_of("web-a"), 80)
    assert at.result["ok"], at.result
    def both_hooks():
        at.flows += [f for f in at.log.read() if _of_flow(at.sport)(f)]
        seen = [f for f in at.flows if f.node == "node-a" and f.hook in (Hook.FROM_CONTAINER, Hook.TO_CONTAINER)]
        return seen if {f.hook for f in seen} == {Hook.FROM_CONTAINER, Hook.TO_CONTAINER} else None
    hooks = wait_for(both_hooks, timeout=3, what="the hairpin flow at from- and to-container")
    assert not any(f.dropped for f in hooks)
    assert [f for f in hooks if f.policy is not None] == [], "the hairpin flow is never looked up"
    rows = {r.dir: r for r in at.rows("node-a")}
    # The facts sheet's three hairpin rows (§7): SVC without LBLoopback, OUT and IN with it.
    assert sorted(rows) == ["IN", "OUT", "SVC"] and not rows["SVC"].flags & CtFlags.LB_LOOPBACK
    assert rows["OUT"].flags & CtFlags.LB_LOOPBACK and rows["IN"].flags & CtFlags.LB_LOOPBACK
    assert rows["IN"].src_sec_id == A1, "the hairpin IN row carries a1's own identity"
    check_egress(pm, e_across, False, NONE, B1)
