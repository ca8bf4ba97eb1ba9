"""One DNS lookup from a pod, kept as evidence: what the pod got back, and what the agent's DNS proxy did.

A pod asks the lab's resolver (dnsmasq in ext, :func:`labkit.fqdn.zone.resolver`) for a name's A records, as
``dig`` would. When a policy sends the pod's DNS to the proxy (an egress ``toPorts`` item with ``rules.dns``),
the proxy logs each of its steps for the query (``GET /v1/fqdn/events``: query, refused | answer, maps-written,
max-delay, released). :func:`resolve` picks this query's events out of that log by the pod's address and
source port, reads the addresses' identities in the pod's node's ipcache and the pod's egress policy keys once
the proxy is done, and records all of it (:class:`Lookup`) in the notebook's evidence journal, so a check
grades the lookup the learner made, not the lab as it is later.

    >>> web = resolve(lab, "a1", "web.lab.example")    # doctest: +SKIP
    >>> web.rcode_name, web.ips, web.event_names       # doctest: +SKIP
    ('NOERROR', ['198.51.100.101'], ['query', 'answer', 'maps-written', 'released'])
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from labkit.errors import LabTimeoutError
from labkit.fqdn import dns
from labkit.fqdn.zone import DNS_PORT, resolver
from labkit.maps.policy import Direction
from labkit.observe.evidence import JOURNAL
from labkit.policy.matchpattern import fqdn

__all__ = ["Lookup", "resolve", "cache_list", "wait_expired", "RCODE_NAMES"]

#: RFC 1035 / 2136 response codes by number, as dig prints them.
RCODE_NAMES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
_DONE = ("released", "refused", "error")
_ids = iter(range(0x1100, 0x10000))


@dataclass(frozen=True)
class Lookup:
    """What one lookup showed: the pod's answer, the proxy's events for it, and the maps just after."""

    pod: str
    name: str  #: the name asked for, with its final dot
    sport: int | None  #: the pod's source port
    rcode: int | None  #: None: no answer came back
    records: tuple = ()  #: (address, TTL) of each A record the pod got
    events: tuple = ()  #: the proxy's events for this query, in order (dicts as the agent logs them)
    identities: dict = field(default_factory=dict)  #: address -> identity in the pod's node's ipcache after
    egress: dict = field(default_factory=dict)  #: identity -> the pod's egress keys for it ('8080/TCP') after
    labels: dict = field(default_factory=dict)  #: identity -> its labels, for the answer's addresses
    now: int = 0  #: the lab clock when the lookup ended
    faults: tuple = ()  #: the faults that were on

    @property
    def attrs(self) -> dict:
        """What a check names when the lookup is not the world it asks about (as a step's ``attrs``)."""
        return {"op": "dns", "actor": self.pod, "name": self.name, "faults": self.faults}

    @property
    def rcode_name(self) -> str:
        return "no answer" if self.rcode is None else RCODE_NAMES.get(self.rcode, str(self.rcode))

    @property
    def ips(self) -> list[str]:
        return [ip for ip, _ in self.records]

    @property
    def ip(self) -> str | None:
        """The first address of the answer (None when there was none)."""
        return self.records[0][0] if self.records else None

    @property
    def identity(self) -> int | None:
        """The identity the ipcache gave the first address after the lookup (None: no entry, i.e. world)."""
        return self.identities.get(self.ip) if self.ip else None

    @property
    def event_names(self) -> list[str]:
        return [e["event"] for e in self.events]

    def lines(self) -> list[str]:
        """The lookup as text: the answer, then the proxy's events with their times from the query on."""
        t0 = self.events[0]["t_ns"] if self.events else 0
        out = [f"{self.pod} asked {self.name} -> {self.rcode_name} "
               f"{' '.join(f'{ip} (TTL {ttl})' for ip, ttl in self.records)}".rstrip()]
        for e in self.events:
            extra = {k: v for k, v in e.items() if k in ("held_ms", "waited_ms", "records", "changed")}
            out.append(f"  +{(e['t_ns'] - t0) / 1e6:8.3f} ms  {e['event']:<13}{extra or ''}")
        if not self.events:
            out.append("  (the DNS proxy logged nothing for this query: it went to the resolver directly)")
        for ip in self.ips:
            ident = self.identities.get(ip)
            keys = ", ".join(self.egress.get(ident, [])) if ident is not None else ""
            named = f" {self.labels.get(ident, [])}" if ident is not None else ""
            out.append(f"  {ip}: ipcache identity {ident if ident is not None else '- (world)'}{named}"
                       f"; {self.pod}'s egress keys for it: {keys or 'none'}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _events(lab, src: str, name: str, timeout: float) -> list[dict]:
    """The proxy's events for the query from ``src`` (``ip:port``) for ``name``, once it is done with it (and,
    for an answer, once the maps were written or the wait gave up); [] when the proxy never saw the query."""
    client = _agent(lab)
    deadline = time.monotonic() + timeout
    while True:
        log = client.get("/v1/fqdn/events")["events"]
        qid = max((e["query"] for e in log if e["event"] == "query" and e.get("src") == src
                   and e.get("name") == name), default=None)
        mine = [e for e in log if e["query"] == qid] if qid is not None else []
        kinds = {e["event"] for e in mine}
        done = bool(kinds & set(_DONE)) and ("answer" not in kinds or "maps-written" in kinds
                                             or not any(e.get("records") for e in mine))
        if done or (qid is None and time.monotonic() > deadline - timeout / 2):
            return mine
        if time.monotonic() > deadline:
            raise LabTimeoutError(f"lookup of {name} from {src}: the DNS proxy logged {sorted(kinds)} after "
                                  f"{timeout} s; expected it to release or refuse the answer")
        time.sleep(0.02)


def _agent(lab):
    from labkit.agent.client import AgentClient

    return AgentClient(lab.name, timeout=10)


def cache_list(lab) -> list[str]:
    """The agent's DNS cache now, in ``cilium-dbg fqdn cache list`` grammar (``labkit fqdn cache list``)."""
    return _agent(lab).get("/v1/fqdn/cache")["lines"]


def wait_expired(lab, timeout: float = 10.0) -> list[str]:
    """Wait until the agent's DNS cache is empty (the answers' TTLs ran out on the lab clock and the agent took
    their addresses out of the maps); returns the cache list then."""
    deadline = time.monotonic() + timeout
    while True:
        got = _agent(lab).get("/v1/fqdn/cache")
        if not got["entries"]:
            return got["lines"]
        if time.monotonic() > deadline:
            raise LabTimeoutError(f"lab '{lab.name}': the DNS cache still holds {len(got['entries'])} answers after "
                                  f"{timeout} s at lab clock {got['now']}; expected every TTL to have run out")
        time.sleep(0.05)


def resolve(lab, pod: str, name: str, timeout: float = 5.0) -> Lookup:
    """Ask the lab's resolver for ``name``'s A records from ``pod``; the :class:`Lookup`, recorded as evidence
    (kind ``snapshot``, ``op="dns"``, ``actor=pod``, ``name``).

        >>> resolve(lab, "a1", "db.lab.example").ips    # doctest: +SKIP
        ['198.51.100.103']
    """
    name = fqdn(name)
    qid = next(_ids)
    res = lab.podclient(pod).call({"op": "udp", "host": resolver(lab.topology), "port": DNS_PORT,
                                   "data": dns.build_query(qid, name).hex(), "timeout": 3})
    rcode, records = None, ()
    if res.get("ok") and res.get("reply"):
        msg = dns.parse(bytes.fromhex(res["reply"]))
        rcode, records = msg.rcode, tuple((ip, ttl) for ip, ttl in msg.a_records())
    src = f"{lab.pod(pod).ip}:{res.get('sport')}"
    events = tuple(_events(lab, src, name, timeout))
    node = lab.topology.pod(pod).node
    ipc = lab_ipcache(lab, node)
    egress: dict[int, list[str]] = {}
    try:
        rows = lab.policy.get(pod).rows
    except Exception:  # a pod no policy selects has no map to read
        rows = []
    for r in rows:
        if r.key.direction == Direction.EGRESS:
            egress.setdefault(r.key.sec_label, []).append(r.key.port_proto())
    idents = {ip: ipc[ip] for ip, _ in records if ip in ipc}
    labels = {int(k): v for k, v in _agent(lab).get("/v1/identity")["identities"].items()
              if int(k) in idents.values()}
    look = Lookup(pod, name, res.get("sport"), rcode, records, events, idents, egress, labels, lab.clock.now(),
                  tuple(lab.faults()))
    JOURNAL.record(lab.name, "snapshot", f"dns {pod} {name}", look, op="dns", actor=pod, name=name,
                   faults=look.faults)
    return look


def lab_ipcache(lab, node: str) -> dict[str, int]:
    """``node``'s ipcache host entries: address -> identity."""
    from labkit.maps.base import PinnedMap
    from labkit.maps.eps import IpcacheKey, RemoteEndpointInfo

    with PinnedMap(f"{lab.pin_dir(node)}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as m:
        return {str(k).split("/")[0]: v.sec_identity for k, v in m.items() if str(k).endswith("/32")}
