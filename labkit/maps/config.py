"""``labkit_config``: the one-entry array through which a running datapath
is told the lab clock offset, which break-it faults are on, and how much to
trace. Keep in sync with bpf/lib/config_types.h.

    >>> Fault.names(Fault.NO_IN_ENTRY | Fault.WRONG_LIFETIME)
    ['no-in-entry', 'wrong-lifetime']
"""
from __future__ import annotations

import ctypes
import enum

__all__ = ["LabConfig", "Fault", "TraceMode", "IMPLEMENTED_FAULTS"]


class Fault(enum.IntFlag):
    """Break-it faults a lab can switch on (``lab_config.faults``)."""

    NO_IN_ENTRY = 0x01  #: to-container never creates IN entries
    SKIP_REV_NAT = 0x02  #: replies are not reverse-translated
    WRONG_LIFETIME = 0x04  #: established TCP keeps the SYN lifetime
    NO_LOOPBACK_SNAT = 0x08  #: hairpin flows keep the pod's own source
    NO_RELATED = 0x10  #: new entries get no RELATED twin
    NO_DSR_SNAT = 0x20  #: dsr replies leave the backend's node with the backend's own address

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


#: Faults the current datapath acts on.
IMPLEMENTED_FAULTS = (Fault.NO_IN_ENTRY | Fault.WRONG_LIFETIME | Fault.NO_RELATED | Fault.SKIP_REV_NAT
                      | Fault.NO_LOOPBACK_SNAT | Fault.NO_DSR_SNAT)


class TraceMode(enum.IntEnum):
    """What the hooks report to ``labkit_events``."""

    ALL = 0
    DROPS = 1
    NONE = 2


class LabConfig(ctypes.LittleEndianStructure):
    """``struct lab_config`` (16 bytes)."""

    _fields_ = [
        ("clock_offset", ctypes.c_uint32),
        ("faults", ctypes.c_uint32),
        ("trace_mode", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]
