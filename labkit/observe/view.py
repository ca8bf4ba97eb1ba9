"""What steps, live tables and the garbage collector see of a running lab.

They take a lab through this narrow interface, not through :class:`labkit.lab.Lab`'s
insides: read its maps (``ct``, ``nat``), read its trace (``step_events``), reach its
pods (``podclient``, ``exec``) and note a change (``note_change``) so live tables
refresh. :class:`labkit.lab.Lab` is the one implementation; tests pass fakes.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from labkit.clock import LabClock
from labkit.config import DatapathConfig
from labkit.maps.ct import CtRow
from labkit.maps.nat import NatRow
from labkit.net.topology import Topology
from labkit.observe.trace import EventLog

__all__ = ["LabView"]


class LabView(Protocol):
    """A running lab as its steps, live tables and GC use it."""

    name: str
    topology: Topology
    config: DatapathConfig
    clock: LabClock

    @property
    def pin_dirs(self) -> dict[str, str]:
        """``{node: /sys/fs/bpf/labkit/<lab>/<node>}``"""

    def pin_dir(self, node: str) -> str:
        """Where ``node``'s maps are pinned."""

    def ct(self, node: str) -> list[CtRow]:
        """Every row of ``node``'s CT maps."""

    def nat(self, node: str) -> list[NatRow]:
        """Every row of ``node``'s NAT map."""

    def step_events(self) -> EventLog:
        """The lab's trace, read on from where the last step stopped."""

    def note_change(self, step: Any = None) -> None:
        """Something changed the maps: live tables refresh."""

    def agent_faults(self) -> list[str]:
        """The agent's break-it faults switched on."""

    def podclient(self, pod: str) -> Any:
        """The process in ``pod`` that opens connections and sends datagrams on request."""

    def pod(self, name: str) -> Any:
        """A pod's handle (its ``server_log()``)."""

    def faults(self) -> list[str]:
        """Every break-it fault switched on."""

    def conntrack(self, node: str) -> list:
        """Linux conntrack rows of ``node`` (kube-proxy's iptables mode)."""

    def ct_command(self, node: str) -> list[str]:
        """The real commands that show ``node``'s CT rows."""

    def address_of(self, target: str, outside: bool = False) -> str:
        """The address of a pod, node, external client or Service by name."""

    def is_direct(self, address: str, port: int, protocol: str = "TCP") -> bool:
        """True if a connection to address:port reaches that address itself, not a Service."""

    def exec(self, name: str, argv: Sequence[str], timeout: float = 30, check: bool = False, **kw) -> Any:
        """Run ``argv`` in the namespace of ``name``."""
