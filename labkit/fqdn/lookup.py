"""One DNS lookup from a pod, as evidence keeps it: what the pod got back, and what the agent's DNS proxy did.

A pod asks the lab's resolver (dnsmasq in ext, :func:`labkit.fqdn.zone.resolver`) for a name's A records, as
``dig`` would. When a policy sends the pod's DNS to the proxy (an egress ``toPorts`` item with ``rules.dns``),
the proxy logs each of its steps for the query (``GET /v1/fqdn/events``: query, refused | answer, maps-written,
max-delay, released). :mod:`labkit.lab.dnslookup` makes the lookup and keeps it as a :class:`Lookup`: the
answer, the proxy's events for it, the addresses' identities in the pod's node's ipcache and the pod's egress
policy keys once the proxy is done, so a check grades the lookup the learner made, not the lab as it is later.

    >>> web = lab.fqdn.resolve("a1", "web.lab.example")  # doctest: +SKIP
    >>> web.rcode_name, web.ips, web.event_names       # doctest: +SKIP
    ('NOERROR', ['198.51.100.101'], ['query', 'answer', 'maps-written', 'released'])
"""
from __future__ import annotations

from dataclasses import dataclass, field


__all__ = ["Lookup", "RCODE_NAMES", "DONE_EVENTS"]

#: RFC 1035 / 2136 response codes by number, as dig prints them.
RCODE_NAMES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
#: The proxy's events that end its work on a query.
DONE_EVENTS = ("released", "refused", "error")


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
