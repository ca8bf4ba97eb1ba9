"""``labkit_config``: the one-entry array through which a running datapath
is told the lab clock offset, which break-it faults are on, how much to
trace and at which monitor aggregation level records count as reported. Keep in sync with bpf/lib/config_types.h.

    >>> Fault.names(Fault.NO_IN_ENTRY | Fault.WRONG_LIFETIME)
    ['no-in-entry', 'wrong-lifetime']
"""
from __future__ import annotations

import ctypes
import enum
from typing import Callable, Iterable

from labkit.maps.base import PinnedMap

__all__ = ["LabConfig", "Fault", "TraceMode", "MonitorAggregation", "IMPLEMENTED_FAULTS", "AGENT_FAULTS", "CONFIG_MAP", "ConfigMaps"]

CONFIG_MAP = "labkit_config"


class Fault(enum.IntFlag):
    """Break-it faults a lab can switch on (``lab_config.faults``)."""

    NO_IN_ENTRY = 0x01  #: to-container never creates IN entries
    SKIP_REV_NAT = 0x02  #: replies are not reverse-translated
    WRONG_LIFETIME = 0x04  #: established TCP keeps the SYN lifetime
    NO_LOOPBACK_SNAT = 0x08  #: hairpin flows keep the pod's own source
    NO_RELATED = 0x10  #: new entries get no RELATED twin
    NO_DSR_SNAT = 0x20  #: dsr replies leave the backend's node with the backend's own address
    NO_OUT_ENTRY = 0x40  #: from-container never creates OUT entries
    NO_FLAGS_SEEN = 0x80  #: CT entries never record the TCP flags they see
    NO_CLOSE = 0x100  #: FIN and RST never mark a direction closing
    NO_ACCOUNTING = 0x200  #: packets and bytes are never counted, even with CONNTRACK_ACCOUNTING
    NO_TUNNEL = 0x400  #: tunnel routing: no packet finds its tunnel endpoint
    NO_FIB = 0x800  #: to-netdev drops pods' packets leaving for another node, as with no route
    NO_SVC_ENTRY = 0x1000  #: per-packet LB keeps no SVC entry: every packet picks a backend anew
    PICK_TERMINATING = 0x2000  #: new flows may pick a terminating backend
    NO_SNAT = 0x4000  #: snat mode: the request to a remote backend keeps the client's source
    MAGLEV_WRONG_HASH = 0x8000  #: the flow hash uses a wrong seed, so Maglev picks another slot
    SOCK_LB_OFF = 0x10000  #: connect4/sendmsg4 translate nothing
    NO_GETPEERNAME = 0x20000  #: getpeername4/recvmsg4 do not show the VIP again
    SOCK_NO_REJECT = 0x40000  #: socket LB lets a connect() to a service without backends through
    SOCK_NO_REDIRECT = 0x80000  #: sock_ops records no socket in cilium_sock_ops: sk_msg redirects nothing
    XDP_PASS = 0x100000  #: the XDP program passes every frame to tc untouched (as if detached)

    @classmethod
    def names(cls, value: int) -> list[str]:
        """Kebab-case names of the set faults."""
        return [f.name.lower().replace("_", "-") for f in cls if value & f]

    @classmethod
    def parse(cls, name: str) -> "Fault":
        """``'no-in-entry'`` → :attr:`NO_IN_ENTRY`; ValueError lists the names otherwise."""
        try:
            return cls[name.upper().replace("-", "_")]
        except KeyError:
            known = ", ".join(cls.names(sum(cls)))
            raise ValueError(f"fault '{name}': expected one of {known}") from None


#: Faults the current datapath acts on: all of them.
IMPLEMENTED_FAULTS = Fault(sum(Fault))

#: Faults of the agent rather than the datapath (labkit's Python side acts on them; ``lab.fault`` switches
#: both kinds): name -> what it breaks.
AGENT_FAULTS = {
    "gc-noop": "the CT garbage collector scans but deletes nothing",
    "gc-fixed-interval": "the CT garbage collector never adapts its interval",
    "lb-wrong-count": "the agent writes each service head's count one short",
    "kp-no-masq": "kube-proxy mode writes no KUBE-MARK-MASQ rule for traffic from an endpoint to itself",
    "dns-release-early": "the DNS proxy releases an answer at once and writes the maps after it",
    "dns-star-crosses-dots": "the DNS proxy matches a matchPattern's * across dots, as a shell glob does",
    "fqdn-no-policy-key": "the agent writes toFQDNs identities into the ipcache but no policy map key for them",
    "hubble-no-aggregation": "the monitor puts every trace record into the Hubble ring, reported or not",
    "monitor-no-lost": "the monitor never reports the records the nodes' event rings had no room for",
}


class TraceMode(enum.IntEnum):
    """What the hooks report to ``labkit_events``."""

    ALL = 0
    DROPS = 1
    NONE = 2


class MonitorAggregation(enum.IntEnum):
    """``--monitor-aggregation`` levels, with the numbers of Cilium's MonitorAggregationLevel*
    (pkg/option/monitor.go); the hooks compare them with trace.h's TRACE_AGGREGATE_* thresholds.

        >>> MonitorAggregation.parse("maximum"), MonitorAggregation.MEDIUM.label
        (<MonitorAggregation.MAX: 4>, 'medium')
    """

    NONE = 0  #: every record is reported
    LOWEST = 1  #: no from-* observation point
    LOW = 2  #: the same as lowest today (Cilium: "may aggregate additional traffic in future")
    MEDIUM = 3  #: and only when the CT lookup asks for a report (new flow, flag change, interval, close)
    MAX = 4  #: the same as medium in the datapath

    @property
    def label(self) -> str:
        """The name ``labkit up --monitor-aggregation`` takes: ``'none'`` … ``'maximum'``."""
        return "maximum" if self is MonitorAggregation.MAX else self.name.lower()

    @classmethod
    def parse(cls, value: "str | int") -> "MonitorAggregation":
        """A name (Cilium's: none, disabled, lowest, low, medium, max, maximum) or a number 0–4."""
        names = {"none": 0, "disabled": 0, "lowest": 1, "low": 2, "medium": 3, "max": 4, "maximum": 4}
        key = str(value).strip().lower()
        if key in names:
            return cls(names[key])
        if key.isdigit() and int(key) in cls._value2member_map_:
            return cls(int(key))
        raise ValueError(f"monitor aggregation level {value!r}: expected one of none, lowest, low, medium, "
                         f"maximum or 0-4")


class LabConfig(ctypes.LittleEndianStructure):
    """``struct lab_config`` (16 bytes)."""

    _fields_ = [
        ("clock_offset", ctypes.c_uint32),
        ("faults", ctypes.c_uint32),
        ("trace_mode", ctypes.c_uint32),
        ("monitor_aggregation", ctypes.c_uint32),
    ]

    @classmethod
    def initial(cls, monitor_aggregation: int = 3) -> "LabConfig":
        """What a node starts with and returns to on reset: clock offset 0, no fault, trace everything, the
        lab's aggregation level (medium unless told, as on a node)."""
        return cls(clock_offset=0, faults=0, trace_mode=TraceMode.ALL,
                   monitor_aggregation=int(monitor_aggregation))


class _U32(ctypes.c_uint32):
    """Key of one-entry arrays."""


class ConfigMaps:
    """The ``labkit_config`` entry of every node of a lab: read from the first node, written to all.

    The one place its read-modify-write happens: ``update(clock_offset=120)`` sets a field everywhere,
    ``update(faults=lambda f: f | bit)`` changes one from its current value.
    """

    def __init__(self, pin_dirs: Iterable[str]):
        self.pin_dirs = list(pin_dirs)

    def _map(self, pin_dir: str) -> PinnedMap:
        return PinnedMap(f"{pin_dir}/{CONFIG_MAP}", _U32, LabConfig)

    def read(self) -> LabConfig:
        """The first node's entry (every node holds the same)."""
        with self._map(self.pin_dirs[0]) as m:
            return m[_U32(0)]

    def write(self, value: LabConfig) -> None:
        """Put ``value`` into every node's entry."""
        for pin in self.pin_dirs:
            with self._map(pin) as m:
                m[_U32(0)] = value

    def update(self, **changes: "int | Callable[[int], int]") -> None:
        """Set fields on every node; a callable gets the field's current value and returns the new one."""
        for pin in self.pin_dirs:
            with self._map(pin) as m:
                cfg = m[_U32(0)]
                for name, change in changes.items():
                    setattr(cfg, name, change(getattr(cfg, name)) if callable(change) else change)
                m[_U32(0)] = cfg
