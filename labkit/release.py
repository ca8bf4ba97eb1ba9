"""Cilium release profiles: which release's behaviour a lab reproduces.

The seed articles were measured on two releases, 1.16.12 (the conntrack deep
dive) and 1.20.1 (hairpin). Where the two print or behave differently, the
difference is one row of :data:`BEHAVIOURS`, named after what changed, with
the release and the Cilium change that introduced it. A lab picks its profile
at ``labkit up --cilium 1.16|1.20`` (1.16 by default); the datapath gets one
``-D`` macro per behaviour the profile has, the Python side asks the profile.

    >>> p = profile("1.16")
    >>> p.has("svc_close_both"), profile("1.20").has("svc_close_both")
    (False, True)
    >>> profile("1.20").macros()["CILIUM_SVC_CLOSE_BOTH"]
    1
    >>> [b.name for b in profile("1.20").behaviours()][:2]
    ['svc_close_both', 'hairpin_in_no_revnat']
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError

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


#: Every behaviour that differs between the profiles, oldest first. Keep the
#: datapath's ``#ifdef CILIUM_*`` blocks and the Python checks in step with it.
BEHAVIOURS = (
    Behaviour(
        "svc_close_both", "1.17", "cilium/cilium#33907 (bpf: ct: close both directions of a service entry)",
        "a FIN or RST on a SVC entry sets RxClosing and TxClosing, so the SVC row gets the close timeout; "
        "before, only TxClosing was set and the SVC row kept being refreshed with the service lifetime"),
    Behaviour(
        "hairpin_in_no_revnat", "1.17", "cilium/cilium#32697 (removal of the v1.16 'remove in v1.17' "
        "ct_has_loopback_egress_entry4 RevNAT copy)",
        "the IN row of a hairpin flow carries RevNAT=0; v1.16 copies the OUT row's RevNAT into it"),
    Behaviour(
        "lb_proto_keys", "1.17", "cilium/cilium#33434 (per-protocol service keys)",
        "service keys and backends carry the L4 protocol and `cilium service list` prints `/TCP` after "
        "every address; v1.16 writes protocol 0 (ANY) and prints none"),
    Behaviour(
        "gc_batch", "1.18", "cilium/cilium#37109 (ctmap GC with BPF_MAP_LOOKUP_BATCH)",
        "the CT garbage collector reads the maps in batches; v1.16 reads one entry per syscall"),
    Behaviour(
        "ct_list_no_ifindex", "1.18", "cilium/cilium#36434 (ct_entry.ifindex became reserved)",
        "`bpf ct list` no longer prints `IfIndex=`"),
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
        for b in BEHAVIOURS:
            if b.name == name:
                return b.in_release(self.release)
        raise ConfigError(f"release behaviour: expected one of {', '.join(b.name for b in BEHAVIOURS)}, "
                          f"got {name!r}")

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


def profile(release: str = DEFAULT_RELEASE) -> Profile:
    """The profile of ``release`` (ConfigError names the releases there are)."""
    return Profile(str(release))
