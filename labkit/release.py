"""Cilium release profiles: which release's behaviour a lab reproduces.

The seed articles were measured on two releases, 1.16.12 (the conntrack deep
dive) and 1.20.1 (hairpin). Where the two print or behave differently, the
difference is one row of :data:`BEHAVIOURS`, named after what changed, with
the release and the Cilium change that introduced it. A lab picks its profile
at ``labkit up --cilium 1.16|1.20`` (1.16 by default); the datapath gets one
``-D`` macro per behaviour the profile has, the Python side asks the profile.

    >>> p = profile("1.16")
    >>> p.has("hairpin_in_no_revnat"), profile("1.20").has("hairpin_in_no_revnat")
    (False, True)
    >>> profile("1.20").macros()["CILIUM_LB_PROTO_KEYS"]
    1
    >>> [b.name for b in profile("1.16").behaviours()]
    ['svc_close_both']
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from labkit.errors import ConfigError

__all__ = ["RELEASES", "DEFAULT_RELEASE", "Behaviour", "BEHAVIOURS", "Profile", "profile"]

#: Releases a lab can reproduce (the seeds' releases).
RELEASES = ("1.16", "1.20")
#: The release most labs teach (the conntrack deep dive's).
DEFAULT_RELEASE = "1.16"


def _minor(release: str) -> tuple[int, int]:
    major, minor = release.split(".")[:2]
    return int(major), int(minor)


@dataclass(frozen=True)
class Behaviour:
    """One behaviour that changed between the releases labkit reproduces."""

    name: str  #: also the datapath macro ``CILIUM_<NAME>``
    since: str  #: the first release that has it
    change: str  #: the Cilium change that introduced it
    what: str  #: what a learner sees differently

    @property
    def macro(self) -> str:
        return f"CILIUM_{self.name.upper()}"

    def in_release(self, release: str) -> bool:
        return _minor(release) >= _minor(self.since)


#: Every behaviour that changed between the releases labkit reproduces, oldest first, with the Cilium
#: change that introduced it. Keep the datapath's ``#ifdef CILIUM_*`` blocks and the Python checks in
#: step with it. A row whose ``since`` is 1.16 is in both profiles: it is listed because it is often
#: taken for a later change (its backport made v1.16.0).
BEHAVIOURS = (
    Behaviour(
        "svc_close_both", "1.16", "cilium/cilium#33907, backported to v1.16.0 by #33941",
        "a FIN or RST on a SVC entry sets RxClosing and TxClosing, so the SVC row gets the close timeout "
        "(before v1.16.0 only TxClosing was set and the SVC row kept being refreshed)"),
    Behaviour(
        "hairpin_in_no_revnat", "1.17", "cilium/cilium commit dc9b047d0940 (issue #33154)",
        "the IN row of a hairpin flow carries RevNAT=0; v1.16 copies the OUT row's RevNAT into it "
        "(kept after #32480 only so that a downgrade still works)"),
    Behaviour(
        "lb_proto_keys", "1.17", "cilium/cilium#33434 (--bpf-lb-proto-diff)",
        "service keys and backends carry the L4 protocol, `service list` and `bpf lb list` print `/TCP` "
        "after addresses, and Maglev hashes a backend as `[ip:port/TCP,State:active]` (1.18); v1.16 writes "
        "protocol 0, prints none and hashes `ip:port`"),
    Behaviour(
        "hubble_lost_events_printed", "1.17", "cilium/cilium#35208 (hubble: add printer for lost events, Oct 2024)",
        "`hubble observe` prints lost events (`EVENTS LOST: <source> CPU(<n>) <count>` in compact output, a "
        "`lost_events` response in JSON); v1.16's CLI prints neither (hubble/pkg/printer/printer.go "
        "WriteGetFlowsResponse passes flows and node status only), though the server sends them"),
    Behaviour(
        "ct_accounting_flag", "1.17", "cilium/cilium#34921 and #35142 (--bpf-conntrack-accounting)",
        "CT packet and byte counters are switched on by the agent flag --bpf-conntrack-accounting; v1.16 "
        "has no flag, only the endpoint option ConntrackAccounting, which the agent sets off at start"),
    Behaviour(
        "gc_batch", "1.18", "cilium/cilium#36288 (batched iterator for the CT GC; release from its merge date)",
        "the CT garbage collector reads the maps with BPF_MAP_LOOKUP_BATCH; v1.16 reads one entry per "
        "syscall"),
    Behaviour(
        "snat_retries_32", "1.18", "cilium/cilium#37389 (release from its merge date)",
        "SNAT tries 32 ports before giving up (signal after 16), and clamps random ports into the closed "
        "range [min, max] (#33271); v1.16 tries 128 (signal after 64) and clamps into [min, max-1]"),
    Behaviour(
        "ct_list_no_ifindex", "1.18", "cilium/cilium commit 105cd80bf473 (datapath: require HAVE_FIB_IFINDEX)",
        "`bpf ct list` no longer prints `IfIndex=` (the field became reserved)"),
    Behaviour(
        "ct_list_nat_port", "1.19", "cilium/cilium#43017",
        "`bpf ct list` ends with `NatPort=` (the port field that replaced ifindex)"),
)


@dataclass(frozen=True)
class Profile:
    """The behaviours of one Cilium release."""

    release: str

    def __post_init__(self) -> None:
        if self.release not in RELEASES:
            raise ConfigError(f"Cilium release: expected one of {', '.join(RELEASES)}, got {self.release!r}")

    def has(self, name: str) -> bool:
        """Whether this release has behaviour ``name`` (a :data:`BEHAVIOURS` name)."""
        return _has(self.release, name)

    def behaviours(self) -> list[Behaviour]:
        """The behaviours this release has (those of newer releases are off)."""
        return [b for b in BEHAVIOURS if b.in_release(self.release)]

    def macros(self) -> dict[str, int]:
        """``{CILIUM_<NAME>: 1}`` for each behaviour this release has, for the datapath build."""
        return {b.macro: 1 for b in self.behaviours()}

    def lines(self) -> list[str]:
        """One line per behaviour that differs between the profiles, as ``labkit status`` shows them."""
        return [f"{'on ' if b.in_release(self.release) else 'off'} {b.name} (since {b.since}, {b.change}): {b.what}"
                for b in BEHAVIOURS]


@functools.lru_cache(maxsize=None)
def _has(release: str, name: str) -> bool:
    """:meth:`Profile.has`, remembered (the agent asks it for every row it writes)."""
    for b in BEHAVIOURS:
        if b.name == name:
            return b.in_release(release)
    raise ConfigError(f"release behaviour: expected one of {', '.join(b.name for b in BEHAVIOURS)}, "
                      f"got {name!r}")


@functools.lru_cache(maxsize=None)
def profile(release: str = DEFAULT_RELEASE) -> Profile:
    """The profile of ``release`` (ConfigError names the releases there are)."""
    return Profile(str(release))
