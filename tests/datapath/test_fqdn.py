"""toFQDNs through the agent's DNS proxy on the real kernel: dnsmasq in ext answers the lab zone,
a1's policy sends its DNS to the proxy (``toPorts`` with ``rules.dns``), and only the addresses
of names its ``toFQDNs`` selects, learnt from an answer, open a1's egress.

Facts the tests follow (Cilium v1.16):
- pkg/fqdn/dnsproxy/proxy.go ServeDNS: a query the endpoint's DNS rules do not allow is answered by
  the proxy itself with --tofqdns-dns-reject-response-code (default ``refused``), never forwarded;
- daemon/cmd/fqdn.go notifyOnDNSMsg: the answer's IPs go to the name manager, which allocates
  identities for the selectors that pick the name and updates the ipcache and the endpoints'
  policy maps; the proxy holds the answer until that is done or --tofqdns-proxy-response-max-delay
  (default 100ms) passes;
- pkg/policy api/fqdn.go: toFQDNs selects only IPs a DNS answer gave for a selected name; an IP of
  an allowed name that nobody resolved has no FQDN identity and is world, which the rule does not allow;
- pkg/fqdn/cache.go: an answer's IPs live max(TTL, --tofqdns-min-ttl = 0) seconds.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.fqdn import dns
from labkit.fqdn.zone import DEFAULT_TTL, EXT_WEB_PORT, RECORDS
from labkit.maps.base import PinnedMap
from labkit.maps.eps import IpcacheKey, RemoteEndpointInfo
from labkit.maps.policy import Direction, PolicyKey
from labkit.policy.resolve import DNS_PROXY_PORT
from labtag import tagged

from .util import wait_for

RESOLVER = "198.51.100.100"
WEB, API, DB = RECORDS["web.lab.example"], RECORDS["api.lab.example"], RECORDS["db.lab.example"]
FIRST_LOCAL_IDENTITY = 1 << 24 | 1  # pkg/identity numericidentity.go: local (CIDR/FQDN) identities from 2^24 + 1

POLICY = """
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: a1-fqdn}
spec:
  endpointSelector: {matchLabels: {app: a1}}
  egress:
  - toCIDR: [198.51.100.100/32]
    toPorts: [{ports: [{port: "53", protocol: UDP}], rules: {dns: [{matchPattern: "*.lab.example"}]}}]
  - toFQDNs: [{matchName: web.lab.example}, {matchName: api.lab.example}]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
"""

#: In the pod: ask the resolver for argv[1]; with argv[2] = "connect", connect to the first address the
#: answer gave at once, with a timeout shorter than TCP's first SYN retransmission (1 s): only the first
#: SYN counts, so the map must hold the address when the answer arrives.
_RESOLVE = r"""
import json, socket, sys, time
sys.path.insert(0, sys.argv[3])
from labkit.fqdn import dns
out = {}
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(dns.build_query(4242, sys.argv[1]), ("198.51.100.100", 53))
try:
    m = dns.parse(s.recv(4096))
    out.update(rcode=m.rcode, records=m.a_records(), id=m.id)
except OSError as exc:
    out.update(error=type(exc).__name__)
if sys.argv[2] == "connect" and out.get("records"):
    try:
        socket.create_connection((out["records"][0][0], 8080), timeout=0.8).close()
        out["connect"] = "ok"
    except OSError as exc:
        out["connect"] = type(exc).__name__
print(json.dumps(out))
"""

_CONNECT = r"""
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except OSError as exc:
    print("failed", type(exc).__name__)
"""

_ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def flab(_require_datapath):
    """A native-routing lab with policy compiled in: dnsmasq in ext, a DNS proxy in the agent. The max
    delay is raised to 5 s here so a loaded machine cannot release an answer early (the order is what
    these tests pin; the default, 100 ms, is the agent's own)."""
    from labkit import Lab
    from labkit.config import DatapathConfig

    os.environ["LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"] = "5"
    try:
        lab = Lab.up(tagged("dpfqdn"), config=DatapathConfig(routing="native", policy="default", gc_timer=False))
    finally:
        del os.environ["LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"]
    yield lab
    lab.down()


@pytest.fixture
def fl(flab):
    flab.reset()
    flab.policy.apply(POLICY)
    return flab


def resolve(lab, name: str, connect: bool = False) -> dict:
    p = lab.popen("a1", [sys.executable, "-c", _RESOLVE, name, "connect" if connect else "-", _ROOT],
                  stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=30)
    return json.loads(out)


def connect(lab, ip: str, port: int = EXT_WEB_PORT, timeout: float = 1.5) -> str:
    p = lab.popen("a1", [sys.executable, "-c", _CONNECT, ip, str(port), str(timeout)], stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=30)
    return out.strip()


def egress_keys(lab, pod: str = "a1") -> dict[int, list[str]]:
    """a1's policy map: identity → its egress keys as text."""
    view = lab.policy.get(pod)
    out: dict[int, list[str]] = {}
    for r in view.rows:
        if r.key.direction == Direction.EGRESS:
            out.setdefault(r.key.sec_label, []).append(r.key.port_proto())
    return out


def ipcache(lab, node: str = "node-a") -> dict[str, int]:
    with PinnedMap(f"{lab.pin_dir(node)}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as m:
        return {str(k): v.sec_identity for k, v in m.items()}


def events(lab, name: str) -> list[str]:
    from labkit.agent.client import AgentClient

    evs = AgentClient(lab.name, timeout=10).get("/v1/fqdn/events")["events"]
    last = max((e["query"] for e in evs if e.get("name") == name + "."), default=None)
    return [e["event"] for e in evs if e["query"] == last]  # the last query for the name, in order


def test_dns_rule_gives_the_port_key_the_proxy_port(fl):
    """The resolver's 53/UDP egress key carries the DNS proxy's port (an L7 DNS rule makes it a redirect)."""
    rows = [r for r in fl.policy.get("a1").rows if r.key.direction == Direction.EGRESS and r.key.port_proto() == "53/UDP"]
    assert [r.entry.proxy_port for r in rows] == [DNS_PROXY_PORT]


def test_allowed_name_connects_after_resolving(fl):
    """web.lab.example resolves through the proxy and a1's first SYN to its address passes."""
    assert connect(fl, WEB).startswith("failed"), "before any answer the address is world: denied"
    got = resolve(fl, "web.lab.example", connect=True)
    assert got["rcode"] == dns.RCODE_NOERROR and got["records"] == [[WEB, DEFAULT_TTL]]
    assert got["connect"] == "ok"


def test_resolved_but_unallowed_name_is_denied(fl):
    """db.lab.example passes the DNS rule (*.lab.example) but no toFQDNs selects it: its address stays denied."""
    got = resolve(fl, "db.lab.example")
    assert got["records"] == [[DB, DEFAULT_TTL]]
    assert connect(fl, DB) == "failed TimeoutError"
    assert f"{DB}/32" not in ipcache(fl)


def test_unresolved_address_of_allowed_name_is_denied(fl):
    """api.lab.example is allowed by toFQDNs, but nobody resolved it: its address has no FQDN identity."""
    resolve(fl, "web.lab.example")
    assert connect(fl, WEB) == "connected"
    assert connect(fl, API) == "failed TimeoutError"


def test_map_holds_identity_only_after_the_answer(fl):
    """Before the answer a1's map has no key for an FQDN identity; after it, the identity of web's selector
    holds 8080/TCP and the ipcache maps web's address to it on every node."""
    before = egress_keys(fl)
    assert not [i for i in before if i >= FIRST_LOCAL_IDENTITY and i != _cidr_id(fl)]
    assert f"{WEB}/32" not in ipcache(fl)
    resolve(fl, "web.lab.example")
    after = egress_keys(fl)
    learnt = [i for i in after if i not in before]
    assert len(learnt) == 1 and after[learnt[0]] == ["8080/TCP"]
    # v1.16 gives the address an identity labelled by the selectors that pick its name (web's only)
    assert sorted(_identities(fl)[str(learnt[0])]) == ["fqdn:web.lab.example", "reserved:world"]
    for node in ("node-a", "node-b"):
        assert ipcache(fl, node)[f"{WEB}/32"] == learnt[0]


def _identities(lab) -> dict[str, list[str]]:
    from labkit.agent.client import AgentClient

    return AgentClient(lab.name, timeout=10).get("/v1/identity")["identities"]


def _cidr_id(lab) -> int:
    """The CIDR identity of the resolver's /32 (the toCIDR rule's)."""
    return ipcache(lab)["198.51.100.100/32"]


def test_answer_is_held_until_the_maps_are_written(fl):
    """The proxy's events for one query run query → answer → maps-written → released, with no max-delay."""
    resolve(fl, "web.lab.example", connect=True)
    assert events(fl, "web.lab.example") == ["query", "answer", "maps-written", "released"]


def test_denied_name_is_refused_by_the_proxy(fl):
    """A name outside the DNS rule gets REFUSED from the proxy, and dnsmasq never sees the query."""
    log = Path(f"/run/labkit/{fl.name}/dnsmasq.log")
    size = log.stat().st_size
    got = resolve(fl, "www.example.org")
    assert got["rcode"] == dns.RCODE_REFUSED and got["records"] == []
    assert "www.example.org" not in log.read_text()[size:]
    assert events(fl, "www.example.org") == ["query", "refused"]


def test_ttl_expiry_on_the_lab_clock(fl):
    """An answer with TTL 30 leaves the cache, the ipcache and the map once the lab clock moves 30 s on."""
    resolve(fl, "web.lab.example")
    ident = ipcache(fl)[f"{WEB}/32"]
    assert ident in egress_keys(fl)
    fl.clock.advance(DEFAULT_TTL)
    wait_for(lambda: f"{WEB}/32" not in ipcache(fl), timeout=5, what="the expired address to leave the ipcache")
    assert ident not in egress_keys(fl)
    assert connect(fl, WEB) == "failed TimeoutError"


def test_fqdn_cache_list_cli(fl):
    """`labkit fqdn cache list` prints cilium-dbg's header and one row per answer (endpoint, lookup, name, TTL)."""
    resolve(fl, "web.lab.example")
    out = subprocess.run(["labkit", "--lab", fl.name, "fqdn", "cache", "list"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": _ROOT}).stdout.splitlines()
    assert out[0] == "# cilium-dbg fqdn cache list"
    assert out[1].split() == ["Endpoint", "Source", "FQDN", "TTL", "ExpirationTime", "IPs"]
    ep = fl.policy.get("a1").info["endpoint_id"]
    cells = out[2].split()
    assert cells[:4] == [str(ep), "lookup", "web.lab.example.", str(DEFAULT_TTL)] and cells[5] == WEB


def test_dnsmasq_is_in_the_ledger(flab):
    """dnsmasq and ext's web server are ledger processes in ext's namespace (`down` stops them)."""
    from labkit.net.ledger import Ledger

    procs = {e["name"]: e for e in Ledger(flab.name).entries("process")}
    assert procs["dnsmasq"]["netns"] == flab.topology.netns("ext")
    assert "podserver-ext" in procs


def test_allowed_query_reaches_dnsmasq_from_the_node(fl):
    """The proxy forwards an allowed query from the node's address (labkit's choice; Cilium's transparent mode
    keeps the pod's): dnsmasq logs node-a's 198.51.100.11, not a1's address."""
    log = Path(f"/run/labkit/{fl.name}/dnsmasq.log")
    size = log.stat().st_size
    resolve(fl, "api.lab.example")
    seen = [line for line in log.read_text()[size:].splitlines() if "query[A] api.lab.example" in line]
    assert seen and all(line.endswith("from 198.51.100.11") for line in seen)


def test_pod_without_dns_rule_asks_dnsmasq_itself(fl):
    """a2 has no policy: its 53/UDP key is not a redirect, so its query reaches dnsmasq from its own address
    and the proxy learns nothing from it."""
    log = Path(f"/run/labkit/{fl.name}/dnsmasq.log")
    size = log.stat().st_size

    p = fl.popen("a2", [sys.executable, "-c", _RESOLVE, "web.lab.example", "-", _ROOT], stdout=subprocess.PIPE, text=True)
    got = json.loads(p.communicate(timeout=30)[0])
    assert got["records"] == [[WEB, DEFAULT_TTL]]
    a2 = fl.topology.pod("a2").ip
    assert any(line.endswith(f"from {a2}") for line in log.read_text()[size:].splitlines())
    assert f"{WEB}/32" not in ipcache(fl)


def test_max_delay_releases_before_the_maps(flab):
    """With --tofqdns-proxy-response-max-delay 0 the proxy stops waiting at once: the answer is released
    (after a max-delay event) before the maps are written, as Cilium returns the response on timeout."""
    os.environ["LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"] = "0"
    try:
        flab.restart_agent()
    finally:
        del os.environ["LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"]
    try:
        flab.reset()
        flab.policy.apply(POLICY)
        resolve(flab, "web.lab.example")
        wait_for(lambda: "maps-written" in events(flab, "web.lab.example"), timeout=10, what="the maps to be written")
        assert events(flab, "web.lab.example") == ["query", "answer", "max-delay", "released", "maps-written"]
    finally:
        os.environ["LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"] = "5"
        try:
            flab.restart_agent()
        finally:
            del os.environ["LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"]


@pytest.fixture
def faulted(fl):
    """``fl`` with the agent faults a test switches on taken off again afterwards."""
    on: list[str] = []

    def switch(name: str) -> None:
        fl.fault(name)
        on.append(name)

    yield switch
    for name in on:
        fl.fault(name, on=False)


def test_resolve_records_the_query_it_made(fl):
    """labkit.fqdn.lookup.resolve: a1's answer, the proxy's events of that query only, the ipcache identity
    (labelled by web's selector) and a1's 8080/TCP key for it, kept in the evidence journal."""
    from labkit.lab.dnslookup import resolve as lookup
    from labkit.observe.evidence import JOURNAL

    resolve(fl, "db.lab.example")  # another query in the log before ours
    look = lookup(fl, "a1", "web.lab.example")
    assert look.records == ((WEB, DEFAULT_TTL),) and look.rcode == dns.RCODE_NOERROR
    assert look.event_names == ["query", "answer", "maps-written", "released"]
    assert look.identity == ipcache(fl)[f"{WEB}/32"] and look.egress[look.identity] == ["8080/TCP"]
    assert "fqdn:web.lab.example" in look.labels[look.identity]
    rec = JOURNAL.latest(fl.name, "snapshot", op="dns", actor="a1", name="web.lab.example.")
    assert rec is not None and rec.data is look


def test_release_early_fault_answers_before_the_maps(fl, faulted):
    """dns-release-early: the proxy releases the answer first and writes the maps after it (the order Cilium's
    notifyOnDNSMsg never takes short of the max delay), with no max-delay event."""
    from labkit.lab.dnslookup import resolve as lookup

    faulted("dns-release-early")
    look = lookup(fl, "a1", "web.lab.example")
    assert look.event_names == ["query", "answer", "released", "maps-written"]


def test_no_policy_key_fault_keeps_the_identity_out_of_the_map(fl, faulted):
    """fqdn-no-policy-key: web's address gets its FQDN identity in the ipcache, a1's map no key for it, and the
    first SYN is denied naming that identity."""
    from labkit.lab.dnslookup import resolve as lookup

    faulted("fqdn-no-policy-key")
    fl.policy.apply(POLICY)
    look = lookup(fl, "a1", "web.lab.example")
    assert look.identity is not None and look.identity >= FIRST_LOCAL_IDENTITY
    assert look.identity not in egress_keys(fl)
    assert connect(fl, WEB) == "failed TimeoutError"


def test_star_crosses_dots_fault_forwards_deeper_names(fl, faulted):
    """dns-star-crosses-dots: *.lab.example lets deep.web.lab.example through the proxy (v1.16 refuses it) and
    still refuses lab.example."""
    assert resolve(fl, "deep.web.lab.example")["rcode"] == dns.RCODE_REFUSED
    faulted("dns-star-crosses-dots")
    assert resolve(fl, "deep.web.lab.example")["records"] == [[RECORDS["deep.web.lab.example"], DEFAULT_TTL]]
    assert resolve(fl, "lab.example")["rcode"] == dns.RCODE_REFUSED


def test_query_is_traced_to_the_proxy_with_a_redirecting_verdict(fl):
    """a1's DNS query, allowed by a DNS rule: its from-container record is to-proxy (bpf_lxc.c:1073@82999990,
    TRACE_TO_PROXY before ctx_redirect_to_proxy4), not to-stack, and its policy verdict carries the proxy port,
    the value Cilium's verdict notification takes (bpf/lib/policy_log.h:78-79@82999990) and Hubble decodes as
    REDIRECTED (pkg/hubble/parser/threefour/parser.go:293-295@82999990)."""
    from labkit.observe.monitor import flushed_past

    assert resolve(fl, "web.lab.example")["rcode"] == 0
    flushed_past(fl.name, fl.pin_dirs)
    queries = [f for f in fl.events().read() if f.hook.label == "from-container" and f.device == "lxc-a1"
               and f.event.before.proto == socket.IPPROTO_UDP and socket.ntohs(f.event.before.dport) == 53]
    assert queries, "no record of a1's query"
    ev = queries[-1].event
    assert ev.obs_point == 1, f"observation point {ev.obs_point}: to-proxy is 1 (flow.proto TraceObservationPoint)"
    assert queries[-1].policy is not None and queries[-1].policy.text().endswith("EGRESS ALLOWED")
    assert ev.proxy_port == DNS_PROXY_PORT
    from labkit.observe.hubble import FlowFilter, last_flows

    sport = socket.ntohs(ev.before.sport)
    flows = [r["flow"] for r in last_flows(fl, FlowFilter(from_pods=["a1"], ports=[sport]))
             if r["flow"].get("l4", {}).get("UDP", {}).get("destination_port") == 53]
    assert [f["verdict"] for f in flows if f["event_type"]["type"] == 5] == ["REDIRECTED"]
    assert [f.get("trace_observation_point") for f in flows if f["event_type"]["type"] == 4] == ["TO_PROXY"]
