"""toFQDNs ``matchPattern``: a DNS pattern with ``*`` turned into an anchored regex,
as pkg/fqdn/matchpattern (Cilium v1.16) does it.

``*`` alone matches every name; inside a pattern ``*`` is zero or more DNS characters
(``[-a-zA-Z0-9_]``), so it never crosses a dot. v1.16 has no ``**.`` subdomain wildcard:
``**`` is two ``*`` and still stays within one label.

    >>> matches("*.example.test", "web.example.test."), matches("*.example.test", "a.b.example.test")
    (True, False)
    >>> matchpattern_regex("*.cilium.io.")
    '^[-a-zA-Z0-9_]*[.]cilium[.]io[.]$'
"""
from __future__ import annotations

import re

from labkit.errors import PolicyError

__all__ = ["matchpattern_regex", "matches", "sanitize", "validate", "fqdn", "MAX_FQDN_LENGTH"]

#: allowedDNSCharsREGroup
_DNS_CHARS = "[-a-zA-Z0-9_]"
#: allowedPatternChars
_ALLOWED = re.compile(r"^[-a-zA-Z0-9_.*]+$")
#: MaxFQDNLength
MAX_FQDN_LENGTH = 255


def fqdn(name: str) -> str:
    """A name with its final dot, lower-cased (pkg/fqdn/dns FQDN).

    >>> fqdn("Web.Example.TEST")
    'web.example.test.'
    """
    name = name.strip().lower()
    return name if name.endswith(".") else name + "."


def sanitize(pattern: str) -> str:
    """Sanitize: ``*`` stays ``*``; anything else becomes a full name with its final dot.

    >>> sanitize("*"), sanitize("*.com")
    ('*', '*.com.')
    """
    return pattern if pattern == "*" else fqdn(pattern)


def validate(pattern: str, field: str = "matchPattern") -> str:
    """The pattern if v1.16's prevalidate accepts it; PolicyError naming ``field`` otherwise."""
    if not isinstance(pattern, str):
        raise PolicyError(f"{field}: expected a DNS pattern string, got {pattern!r}")
    if len(pattern) > MAX_FQDN_LENGTH:
        raise PolicyError(f"{field}: expected at most {MAX_FQDN_LENGTH} characters, got {len(pattern)}")
    if pattern and not _ALLOWED.match(pattern):
        raise PolicyError(f"{field}: expected only 0-9, a-z, A-Z, '.', '-', '_' and '*', got {pattern!r}")
    return pattern


def matchpattern_regex(pattern: str) -> str:
    """ToAnchoredRegexp: ``.`` → ``[.]``, ``*`` → ``[-a-zA-Z0-9_]*``, anchored; ``*`` alone
    → one or more whole labels, or the root ``.``.

    >>> matchpattern_regex("*")
    '(^([-a-zA-Z0-9_]+[.])+$)|(^[.]$)'
    """
    pattern = pattern.strip().lower()
    if pattern == "*":
        return f"(^({_DNS_CHARS}+[.])+$)|(^[.]$)"
    pattern = pattern.replace(".", "[.]").replace("*", _DNS_CHARS + "*")
    return "^" + pattern + "$"


def matches(pattern: str, name: str) -> bool:
    """Whether a DNS name (taken as a full name with its final dot) matches the pattern
    (sanitized first, as the DNS proxy does).

    >>> matches("*", "example.test"), matches("api.example.test", "API.example.test.")
    (True, True)
    """
    return re.search(matchpattern_regex(sanitize(validate(pattern))), fqdn(name)) is not None
