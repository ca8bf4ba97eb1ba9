"""Numbers the BPF programs write into trace records, named.

Keep in sync with bpf/lib/trace_types.h (tests/unit/test_constants.py parses
that header and compares).

    >>> Hook(1).label, Verdict(3).name, DropReason.text(-158)
    ('from-container', 'DROPPED', 'Service backend not found')
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Hook", "Verdict", "DropReason", "TraceFlags", "PolicyMatch", "PolicyVerdict",
           "POLICY_V_SHIFT"]


class Hook(enum.IntEnum):
    """Where a program runs (``HOOK_*``)."""

    FROM_CONTAINER = 1
    TO_CONTAINER = 2
    FROM_NETDEV = 3
    TO_NETDEV = 4
    FROM_OVERLAY = 5
    TO_OVERLAY = 6
    XDP = 7  #: XDP on eth0 (--nodeport-accel xdp), before an skb exists

    @property
    def label(self) -> str:
        """``from-container`` style, as Cilium names its programs."""
        return self.name.lower().replace("_", "-")


class Verdict(enum.IntEnum):
    """What a hook did with the packet (``VERDICT_*``)."""

    FORWARDED = 1
    REDIRECTED = 2
    DROPPED = 3


class DropReason(enum.IntEnum):
    """Cilium's drop reasons (``DROP_*``), negative as the programs return them."""

    INVALID_SIP = -132
    POLICY = -133
    INVALID = -134
    CT_INVALID_HDR = -135
    CT_UNKNOWN_PROTO = -137
    UNKNOWN_L3 = -139
    WRITE_ERROR = -141
    UNKNOWN_L4 = -142
    NO_TUNNEL_KEY = -147
    CSUM_L3 = -153
    CSUM_L4 = -154
    CT_CREATE_FAILED = -155
    FRAG_NOSUPPORT = -157
    NO_SERVICE = -158
    NO_TUNNEL_ENDPOINT = -160
    NAT_NO_MAPPING = -167
    NO_FIB = -169
    PROXY_LOOKUP_FAILED = -178
    PROXY_SET_FAILED = -179
    PROXY_UNKNOWN_PROTO = -180
    POLICY_DENY = -181
    TTL_EXCEEDED = -196

    @classmethod
    def text(cls, code: int) -> str:
        """Hubble's wording for a reason code (the number if unknown)."""
        try:
            return _TEXT[cls(code)]
        except ValueError:
            return f"unknown reason {code}"


_TEXT = {
    DropReason.INVALID_SIP: "Invalid source ip",
    DropReason.POLICY: "Policy denied",
    DropReason.INVALID: "Invalid packet",
    DropReason.CT_INVALID_HDR: "CT: Truncated or invalid header",
    DropReason.CT_UNKNOWN_PROTO: "CT: Unknown L4 protocol",
    DropReason.UNKNOWN_L3: "Unsupported L3 protocol",
    DropReason.WRITE_ERROR: "Error writing to packet",
    DropReason.UNKNOWN_L4: "Unknown L4 protocol",
    DropReason.NO_TUNNEL_KEY: "Error retrieving tunnel key",
    DropReason.CSUM_L3: "Error while correcting L3 checksum",
    DropReason.CSUM_L4: "Error while correcting L4 checksum",
    DropReason.CT_CREATE_FAILED: "CT: Map insertion failed",
    DropReason.FRAG_NOSUPPORT: "IP fragmentation not supported",
    DropReason.NO_SERVICE: "Service backend not found",
    DropReason.NO_TUNNEL_ENDPOINT: "No tunnel/encapsulation endpoint (datapath BUG!)",
    DropReason.NAT_NO_MAPPING: "No mapping for NAT masquerade",
    DropReason.NO_FIB: "FIB lookup failed",
    DropReason.PROXY_LOOKUP_FAILED: "Socket lookup failed",
    DropReason.PROXY_SET_FAILED: "Socket assign failed",
    DropReason.PROXY_UNKNOWN_PROTO: "Proxy redirection not supported for protocol",
    DropReason.POLICY_DENY: "Policy denied by denylist",
    DropReason.TTL_EXCEEDED: "TTL exceeded",
}


class TraceFlags(enum.IntFlag):
    """What a hook did besides translating addresses (``TRACE_F_*``).

    >>> TraceFlags.names(0x05)
    ['dsr-opt-added', 'snat']
    """

    DSR_OPT_ADDED = 0x01
    DSR_OPT_STRIPPED = 0x02
    SNAT = 0x04
    REV_SNAT = 0x08
    NO_BACKEND_REPLY = 0x10

    @classmethod
    def names(cls, value: int) -> list[str]:
        """The set flags as short labels, lowest bit first."""
        return [f.name.lower().replace("_", "-") for f in cls if value & f]


class PolicyMatch(enum.IntEnum):
    """Which lookup of the policy map decided (``POLICY_MATCH_*`` of bpf/lib/policy_types.h).

    >>> str(PolicyMatch.L3_L4), str(PolicyMatch.NONE), str(PolicyMatch.PROTO_ONLY)
    ('L3-L4', 'none', 'Proto-Only')
    """

    NONE = 0
    L3_ONLY = 1
    L3_L4 = 2
    L4_ONLY = 3
    ALL = 4
    L3_PROTO = 5
    PROTO_ONLY = 6

    def __str__(self) -> str:
        # pkg/monitor/api/types.go PolicyMatchType.String, which Hubble prints
        return _MATCH_TEXT[self]


_MATCH_TEXT = {PolicyMatch.NONE: "none", PolicyMatch.L3_ONLY: "L3-Only", PolicyMatch.L3_L4: "L3-L4",
               PolicyMatch.L4_ONLY: "L4-Only", PolicyMatch.ALL: "all", PolicyMatch.L3_PROTO: "L3-Proto",
               PolicyMatch.PROTO_ONLY: "Proto-Only"}


#: The policy-verdict byte of a trace record: its place in ``trace_event.flags`` and its bits
#: (``POLICY_V_*`` of bpf/lib/trace_types.h; the direction bits are policy_types.h's POLICY_INGRESS/EGRESS).
POLICY_V_SHIFT = 8
POLICY_V_DIR_MASK = 0x03
POLICY_V_MATCH_SHIFT = 3
POLICY_V_MATCH_MASK = 0x38
POLICY_V_AUDITED = 0x40
POLICY_V_DENIED = 0x80
POLICY_INGRESS, POLICY_EGRESS = 1, 2


@dataclass(frozen=True)
class PolicyVerdict:
    """A policy verdict as a trace record carries it: direction, match type, audited, denied.

    >>> v = PolicyVerdict.decode(POLICY_EGRESS | (2 << POLICY_V_MATCH_SHIFT) | POLICY_V_DENIED)
    >>> v.text()
    'policy-verdict:L3-L4 EGRESS DENIED'
    >>> PolicyVerdict.decode(0) is None
    True
    """

    egress: bool
    match: PolicyMatch
    audited: bool
    denied: bool

    @classmethod
    def decode(cls, byte: int) -> "PolicyVerdict | None":
        """The verdict of a POLICY_V_* byte, None for 0 (no verdict reported)."""
        if not byte & POLICY_V_DIR_MASK:
            return None
        return cls(egress=(byte & POLICY_V_DIR_MASK) == POLICY_EGRESS,
                   match=PolicyMatch((byte & POLICY_V_MATCH_MASK) >> POLICY_V_MATCH_SHIFT),
                   audited=bool(byte & POLICY_V_AUDITED), denied=bool(byte & POLICY_V_DENIED))

    @property
    def direction(self) -> str:
        """``INGRESS`` or ``EGRESS`` (flow.TrafficDirection's names)."""
        return "EGRESS" if self.egress else "INGRESS"

    @property
    def outcome(self) -> str:
        """Hubble's verdict column for a policy verdict: ``ALLOWED``, ``DENIED`` or ``AUDITED``."""
        if self.denied:
            return "DENIED"
        return "AUDITED" if self.audited else "ALLOWED"

    def text(self) -> str:
        """``policy-verdict:<match> <DIRECTION> <outcome>``: how ``hubble observe`` prints a verdict's type
        (hubble/pkg/printer GetFlowType) and verdict (getVerdict)."""
        return f"policy-verdict:{self.match} {self.direction} {self.outcome}"
