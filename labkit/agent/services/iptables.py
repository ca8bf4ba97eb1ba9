"""kube-proxy's way to write Services: every node's iptables (the lab's ``service_mode`` 'iptables').

One sync per node and change, as kube-proxy's syncProxyRules does it
(:func:`labkit.agent.kubeproxy.sync`); no LB map entry is written.
"""
from __future__ import annotations

from typing import Callable

from labkit.agent.kubeproxy import MemoryTables, check_service, cleanup, sync
from labkit.agent.services.ids import Change
from labkit.errors import DatapathError, LabkitError
from labkit.net.topology import Topology

__all__ = ["IptablesWriter"]


class IptablesWriter:
    """Writes a change of the agent's state into every node's iptables."""

    mode = "iptables"

    def __init__(self, tables, topology: Topology, lab: str, faults: Callable[[], list[str]]):
        #: ``tables(node)`` is that node's iptables (:class:`labkit.agent.kubeproxy.Iptables`)
        self.tables = tables if tables is not None else MemoryTables()
        self.topology = topology
        self.lab = lab
        self.faults = faults

    def commit(self, change: Change, what: str, save: Callable[[], None]) -> None:
        """kube-proxy's way: one sync per node (partial: the changed service's chains; full the first time
        after ``up`` or ``reset``), then ``save``. Nothing is written if the service cannot be
        rendered; on a failure every node touched gets a full sync of the services as they were.
        kube-proxy renders every service at each sync, so this one does too (O(services))."""
        new = change.new_services()
        changed = {change.name} if change.before != change.after else set()
        if change.after is not None and changed:
            check_service(change.after)
        touched: list[str] = []
        try:
            for node in (n.name for n in self.topology.nodes):
                touched.append(node)
                sync(self.tables(node), new.values(), self.topology, node, changed, self.faults())
            save()
        except BaseException as exc:
            problems = self.resync(change.old_services(), touched)
            left = f"; could not undo: {'; '.join(problems)}" if problems else "; the tables are as they were"
            if isinstance(exc, LabkitError) and not isinstance(exc, DatapathError) and not problems:
                raise
            raise DatapathError(f"{what}: {exc}{left}") from exc

    def reset(self) -> bool:
        """CleanupLeftovers on every node: kube-proxy's chains, jumps and canaries go (True: the agent's
        state starts empty)."""
        for node in self.topology.nodes:
            try:
                cleanup(self.tables(node.name))
            except (OSError, LabkitError) as exc:
                raise DatapathError(f"lab '{self.lab}': cleaning kube-proxy's iptables on node '{node.name}' "
                                    f"failed ({exc})") from exc
        return True

    def resync(self, services: dict, nodes: list[str]) -> list[str]:
        """A full sync of ``services`` on ``nodes`` (kube-proxy's answer to a failed sync); returns what failed."""
        problems = []
        for node in nodes:
            try:
                sync(self.tables(node), services.values(), self.topology, node, None, self.faults())
            except (OSError, LabkitError) as exc:
                problems.append(f"{node}: {exc}")
        return problems
