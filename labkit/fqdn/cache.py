"""The DNS cache the proxy fills: per endpoint, what each allowed name answered and until when
(Cilium v1.16 pkg/fqdn/cache.go ``DNSCache``, one per endpoint, and the agent's global one).

An entry is one answer: the endpoint, the name, the A records' addresses, the TTL and the
lookup time. It expires at lookup time + max(TTL, min TTL) — cache.go ``Update`` raises a
TTL below ``--tofqdns-min-ttl`` to it; v1.16's default min TTL is 0 (pkg/defaults
``ToFQDNsMinTTL = 0``), so the DNS server's TTL rules. A newer answer for the same endpoint
and name replaces the older one's addresses (cache.go keeps, per name and IP, the entry that
expires last).

Times are on the **lab clock** (:mod:`labkit.clock`, the clock CT lifetimes run on), not the
wall clock Cilium uses: ``labkit clock advance 31`` makes a 30 s answer expire at once, and the
agent then takes the address out of the policy maps (Cilium's DNS garbage collector runs every
minute, pkg/fqdn/namemanager/gc.go ``DNSGCJobInterval``; connections still open keep their IPs alive as
"zombies" there — labkit does not model zombies).

``labkit fqdn cache list`` prints :func:`cache_list_lines`, the grammar of ``cilium-dbg fqdn cache
list`` (cilium-dbg/cmd/fqdn.go listFQDNCache: a tabwriter, columns Endpoint, Source, FQDN, TTL,
ExpirationTime, IPs, each row ended by a tab).

    >>> c = DnsCache(min_ttl=0)
    >>> c.update(1, "web.lab.example", ["198.51.100.101"], ttl=30, now=1000)
    True
    >>> c.names_to_ips(now=1029), c.names_to_ips(now=1030)
    ({'web.lab.example.': ['198.51.100.101']}, {})
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Iterable

from labkit._tabwriter import tabwrite
from labkit.policy.matchpattern import fqdn

__all__ = ["CacheEntry", "DnsCache", "cache_list_lines", "DEFAULT_MIN_TTL", "SOURCE_LOOKUP"]

#: pkg/defaults ToFQDNsMinTTL (v1.16).
DEFAULT_MIN_TTL = 0
#: models.DNSLookup Source of an entry the proxy learnt (daemon/cmd/fqdn.go DNSSourceLookup).
SOURCE_LOOKUP = "lookup"


@dataclass
class CacheEntry:
    endpoint: int  #: the endpoint id that asked
    name: str  #: with its final dot
    ips: list[str]
    ttl: int  #: the TTL the answer carried
    lookup_time: int  #: lab-clock seconds
    expires: int  #: lab-clock seconds: lookup_time + max(ttl, min_ttl)

    def to_json(self) -> dict:
        return dict(self.__dict__)


class DnsCache:
    """Every endpoint's answers; expired ones leave with :meth:`expire`."""

    def __init__(self, min_ttl: int = DEFAULT_MIN_TTL, entries: Iterable[dict] = ()):
        self.min_ttl = min_ttl
        self.entries: list[CacheEntry] = [CacheEntry(**e) for e in entries]

    def update(self, endpoint: int, name: str, ips: Iterable[str], ttl: int, now: int) -> bool:
        """Record one answer; True when it changed which names map to which IPs for the endpoint."""
        name, ips = fqdn(name), sorted(set(ips))
        if not ips:
            return False
        before = self.names_to_ips(now, endpoint)
        kept = []
        for e in self.entries:
            if e.endpoint == endpoint and e.name == name:
                e.ips = [ip for ip in e.ips if ip not in ips]
                if not e.ips:
                    continue
            kept.append(e)
        kept.append(CacheEntry(endpoint, name, ips, ttl, now, now + max(ttl, self.min_ttl)))
        self.entries = kept
        return self.names_to_ips(now, endpoint) != before

    def expire(self, now: int) -> list[CacheEntry]:
        """Drop and return the entries whose time has come (expires <= now)."""
        gone = [e for e in self.entries if e.expires <= now]
        self.entries = [e for e in self.entries if e.expires > now]
        return gone

    def names_to_ips(self, now: int, endpoint: int | None = None) -> dict[str, list[str]]:
        """``{name: [ip…]}`` of the live entries (of one endpoint, or of all: the global cache)."""
        out: dict[str, set[str]] = {}
        for e in self.entries:
            if e.expires > now and (endpoint is None or e.endpoint == endpoint):
                out.setdefault(e.name, set()).update(e.ips)
        return {n: sorted(ips) for n, ips in sorted(out.items())}

    def to_json(self) -> list[dict]:
        return [e.to_json() for e in self.entries]


def _strfmt(ts: float) -> str:
    """go-openapi strfmt.DateTime's String(): RFC 3339 with milliseconds, UTC as ``Z``."""
    t = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def cache_list_lines(entries: Iterable[dict | CacheEntry], now: int, wall_now: float) -> list[str]:
    """``cilium-dbg fqdn cache list``: a header and one row per live answer, the expiration shown
    as a wall-clock time (``wall_now`` is the wall clock at lab-clock ``now``).

    >>> e = CacheEntry(1234, "web.lab.example.", ["198.51.100.101", "198.51.100.102"], 30, 100, 130)
    >>> print("\\n".join(cache_list_lines([e], now=110, wall_now=1.7e9)))  # doctest: +NORMALIZE_WHITESPACE
    Endpoint   Source   FQDN               TTL   ExpirationTime             IPs
    1234       lookup   web.lab.example.   30    2023-11-14T22:13:40.000Z   198.51.100.101,198.51.100.102
    """
    text = "Endpoint\tSource\tFQDN\tTTL\tExpirationTime\tIPs\t\n"
    for e in entries:
        e = e if isinstance(e, CacheEntry) else CacheEntry(**e)
        if e.expires <= now:
            continue
        text += (f"{e.endpoint}\t{SOURCE_LOOKUP}\t{e.name}\t{e.ttl}\t{_strfmt(wall_now + (e.expires - now))}\t"
                 f"{','.join(e.ips)}\t\n")
    return tabwrite(text).splitlines()  # tabwriter.NewWriter(os.Stdout, 5, 0, 3, ' ', 0)
