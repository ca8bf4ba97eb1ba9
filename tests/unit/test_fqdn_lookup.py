"""labkit.fqdn.lookup: what a recorded lookup says about itself (the datapath tests take real lookups)."""
from __future__ import annotations

from labkit.fqdn.lookup import RCODE_NAMES, Lookup

_T0 = 1_000_000_000


def _web(**kw) -> Lookup:
    events = ({"t_ns": _T0, "query": 7, "event": "query"},
              {"t_ns": _T0 + 500_000, "query": 7, "event": "answer", "records": [["198.51.100.101", 30]]},
              {"t_ns": _T0 + 12_000_000, "query": 7, "event": "maps-written", "changed": True},
              {"t_ns": _T0 + 12_250_000, "query": 7, "event": "released", "held_ms": 11.75})
    args = dict(pod="a1", name="web.lab.example.", sport=40000, rcode=0, records=(("198.51.100.101", 30),),
                events=events, identities={"198.51.100.101": 16777218}, egress={16777218: ["8080/TCP"]},
                labels={16777218: ["fqdn:web.lab.example", "reserved:world"]})
    return Lookup(**{**args, **kw})


def test_rcode_names_are_dig_s():
    """Response codes 0, 3 and 5 print as dig prints them (RFC 1035 4.1.1)."""
    assert (RCODE_NAMES[0], RCODE_NAMES[3], RCODE_NAMES[5]) == ("NOERROR", "NXDOMAIN", "REFUSED")


def test_first_address_and_its_identity():
    """ip is the first A record; identity what the ipcache gave it, None when it had no entry (world)."""
    look = _web()
    assert (look.ip, look.identity, look.event_names) == (
        "198.51.100.101", 16777218, ["query", "answer", "maps-written", "released"])
    assert _web(identities={}).identity is None
    assert _web(records=(), rcode=5).ip is None and _web(rcode=None).rcode_name == "no answer"


def test_lines_show_event_times_from_the_query():
    """Each event line carries its time in ms since the proxy got the query: 12 ms for maps-written here."""
    lines = _web().lines()
    assert lines[0] == "a1 asked web.lab.example. -> NOERROR 198.51.100.101 (TTL 30)"
    assert "+   0.000 ms  query" in lines[1] and "+  12.000 ms  maps-written" in lines[3]
    assert lines[-1] == ("  198.51.100.101: ipcache identity 16777218 ['fqdn:web.lab.example', 'reserved:world']; "
                         "a1's egress keys for it: 8080/TCP")


def test_lookup_past_the_proxy_says_so():
    """A lookup with no proxy event (no DNS rule redirected it) says it went to the resolver directly."""
    assert "went to the resolver directly" in str(_web(events=()))


def test_attrs_carry_the_faults():
    """attrs names the faults that were on, as a step's do (the checks' unhealthy() reads them)."""
    assert _web(faults=("dns-release-early",)).attrs["faults"] == ("dns-release-early",)
