"""labkit.policy.matchpattern: toFQDNs matchPattern → regex, with Cilium v1.16's own test table."""
from __future__ import annotations

import re

import pytest

from labkit.errors import PolicyError
from labkit.policy.matchpattern import matches, matchpattern_regex, sanitize, validate

DNS = "[-a-zA-Z0-9_]"  # allowedDNSCharsREGroup, pkg/fqdn/matchpattern/matchpattern.go


@pytest.mark.parametrize("source,target", [
    # pkg/fqdn/matchpattern/matchpattern_test.go TestAnchoredMatchPatternREConversion
    ("cilium.io.", "^cilium[.]io[.]$"),
    ("*.cilium.io.", "^" + DNS + "*[.]cilium[.]io[.]$"),
    ("*", "(^(" + DNS + "+[.])+$)|(^[.]$)"),
    (".", "^[.]$"),
])
def test_regex_conversion(source, target):
    """ToAnchoredRegexp gives the regexes of Cilium's conversion table."""
    assert matchpattern_regex(source) == target


# pkg/fqdn/matchpattern/matchpattern_test.go TestAnchoredMatchPatternMatching (pattern, accept, reject)
TABLE = [
    ("cilium.io.", ["cilium.io."], ["", "anysub.cilium.io.", "anysub.ci.io.", "anysub.ciliumandmore.io."]),
    ("*.cilium.io.", ["anysub.cilium.io."], ["", "cilium.io.", "anysub.ci.io.", "anysub.ciliumandmore.io."]),
    ("*.ci*.io.", ["anysub.cilium.io.", "anysub.ci.io.", "anysub.ciliumandmore.io."], ["", "cilium.io."]),
    ("*", [".", "io.", "cilium.io.", "svc.cluster.local.", "service.namesace.svc.cluster.local.", "_foobar._tcp.cilium.io."],
     ["", ".io.", ".cilium.io.", ".svc.cluster.local.", "cilium.io"]),
    (".", ["."], ["", ".io.", ".cilium.io"]),
    ("_foobar._tcp.cilium.io.", ["_foobar._tcp.cilium.io."], ["", "_tcp.cilium.io.", "cilium.io."]),
    ("*.*.cilium.io.", ["_foobar._tcp.cilium.io."], [""]),
]


@pytest.mark.parametrize("pattern,accept,reject", TABLE, ids=[t[0] for t in TABLE])
def test_cilium_matching_table(pattern, accept, reject):
    """The regex accepts and rejects exactly the names of Cilium's table (Go MatchString = re.search)."""
    rx = re.compile(matchpattern_regex(pattern))
    assert [n for n in accept if not rx.search(n)] == []
    assert [n for n in reject if rx.search(n)] == []


def test_star_never_crosses_a_dot():
    """`*` inside a pattern is one label's characters: *.example.test matches one level only."""
    assert matches("*.example.test", "web.example.test")
    assert not matches("*.example.test", "a.web.example.test")
    assert not matches("*.example.test", "example.test")


def test_double_star_is_not_a_subdomain_wildcard_in_1_16():
    """v1.16 has no `**.`: two stars are two one-label wildcards, so a deeper name does not match."""
    assert matchpattern_regex("**.example.test") == "^" + DNS + "*" + DNS + "*[.]example[.]test$"
    assert not matches("**.example.test", "a.b.example.test")


@pytest.mark.parametrize("source,target", [("*", "*"), ("*.", "*."), ("*.com", "*.com.")])
def test_sanitize(source, target):
    """Sanitize keeps `*` and adds the final dot otherwise (TestMatchPatternSanitize)."""
    assert sanitize(source) == target


@pytest.mark.parametrize("bad", ["a+b.test", "[a].test", "x" * 256])
def test_validate_rejects(bad):
    """prevalidate: only [-a-zA-Z0-9_.*], at most 255 characters."""
    with pytest.raises(PolicyError, match="matchPattern"):
        validate(bad)
