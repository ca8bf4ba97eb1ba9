"""labkit.fqdn.cache: the DNS proxy's cache (TTL with --tofqdns-min-ttl, lab clock) and its list grammar."""
from __future__ import annotations

from labkit.fqdn.cache import DEFAULT_MIN_TTL, CacheEntry, DnsCache, cache_list_lines


def test_default_min_ttl_is_zero():
    """v1.16's pkg/defaults ToFQDNsMinTTL is 0: the server's TTL rules."""
    assert DEFAULT_MIN_TTL == 0 and DnsCache().min_ttl == 0


def test_entry_expires_at_lookup_plus_ttl():
    """An answer at t=100 with TTL 30 is live through t=129 and gone at t=130 (cache.go: expired when !now.Before)."""
    c = DnsCache()
    c.update(7, "web.lab.example", ["198.51.100.101"], 30, now=100)
    assert c.names_to_ips(129) == {"web.lab.example.": ["198.51.100.101"]}
    assert c.names_to_ips(130) == {}
    assert [e.name for e in c.expire(130)] == ["web.lab.example."] and c.entries == []


def test_min_ttl_raises_short_ttls():
    """With --tofqdns-min-ttl 60 a TTL 5 answer lives 60 s; a TTL 90 answer keeps its 90."""
    c = DnsCache(min_ttl=60)
    c.update(1, "a.lab.example", ["198.51.100.101"], 5, now=0)
    c.update(1, "b.lab.example", ["198.51.100.102"], 90, now=0)
    assert [(e.name, e.ttl, e.expires) for e in c.entries] == [("a.lab.example.", 5, 60), ("b.lab.example.", 90, 90)]


def test_newer_answer_takes_over_its_ips():
    """A newer answer for the same endpoint and name takes its IPs from the older entry; an IP only the older one
    had stays until the older one expires; update says whether the names → IPs view changed."""
    c = DnsCache()
    assert c.update(1, "web.lab.example", ["198.51.100.101", "198.51.100.102"], 10, now=0) is True
    assert c.update(1, "web.lab.example", ["198.51.100.101"], 30, now=5) is False
    assert [(e.ips, e.expires) for e in c.entries] == [(["198.51.100.102"], 10), (["198.51.100.101"], 35)]
    assert c.names_to_ips(20) == {"web.lab.example.": ["198.51.100.101"]}


def test_names_of_one_endpoint_or_all():
    """names_to_ips(endpoint=…) is that endpoint's view; without it, the union (the global cache)."""
    c = DnsCache()
    c.update(1, "web.lab.example", ["198.51.100.101"], 30, now=0)
    c.update(2, "db.lab.example", ["198.51.100.103"], 30, now=0)
    assert c.names_to_ips(1, endpoint=2) == {"db.lab.example.": ["198.51.100.103"]}
    assert list(c.names_to_ips(1)) == ["db.lab.example.", "web.lab.example."]


def test_cache_list_grammar():
    """cilium-dbg fqdn cache list: tabwriter(5, 0, 3, ' '), columns Endpoint Source FQDN TTL ExpirationTime IPs,
    every cell tab-terminated (so padded), expiration as strfmt.DateTime (RFC 3339, milliseconds, Z); expired
    rows left out."""
    live = CacheEntry(12, "web.lab.example.", ["198.51.100.101"], 30, 0, 30)
    dead = CacheEntry(12, "db.lab.example.", ["198.51.100.103"], 30, 0, 10)
    lines = cache_list_lines([live, dead], now=10, wall_now=1_800_000_000.25)
    # widths: max cell + 3, at least 5: Endpoint 11, Source 9, FQDN 19, TTL 6, ExpirationTime 27, IPs 17
    assert lines == [
        "Endpoint   Source   FQDN               TTL   ExpirationTime             IPs              ",
        "12         lookup   web.lab.example.   30    2027-01-15T08:00:20.250Z   198.51.100.101   ",
    ]
