"""Numbers the BPF programs write into trace records, named.

Keep in sync with bpf/lib/trace_types.h (tests/unit/test_constants.py parses
that header and compares).

    >>> Hook(1).label, Verdict(3).name, DropReason.text(-158)
    ('from-container', 'DROPPED', 'Service backend not found')
"""
from __future__ import annotations

import enum

__all__ = ["Hook", "Verdict", "DropReason", "TraceFlags"]


class Hook(enum.IntEnum):
    """Where a program runs (``HOOK_*``)."""

    FROM_CONTAINER = 1
    TO_CONTAINER = 2
    FROM_NETDEV = 3
    TO_NETDEV = 4
    FROM_OVERLAY = 5
    TO_OVERLAY = 6

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

    @classmethod
    def text(cls, code: int) -> str:
        """Hubble's wording for a reason code (the number if unknown)."""
        try:
            return _TEXT[cls(code)]
        except ValueError:
            return f"unknown reason {code}"


_TEXT = {
    DropReason.INVALID_SIP: "Invalid source ip",
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

    @classmethod
    def names(cls, value: int) -> list[str]:
        """The set flags as short labels, lowest bit first."""
        return [f.name.lower().replace("_", "-") for f in cls if value & f]
