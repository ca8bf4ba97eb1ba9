"""``lab.services`` and ``lab.policy`` through labkitd: the agent's own clients (:mod:`labkit.agent.client`), whose
requests labkitd carries to the lab's agent, and whose views of the maps labkitd reads.

    >>> web = lab.services.add("web", 80, ["b1:8080", "b2:8080"])   # doctest: +SKIP
    >>> print(lab.services.lb("node-a").lines()[1])                 # doctest: +SKIP
    >>> print(lab.policy.get("b1"))                                 # doctest: +SKIP
"""
from __future__ import annotations

from labkit.agent.client import PolicyMapView, RemotePolicies, RemoteServices

__all__ = ["DoorAgentClient", "DoorServices", "DoorPolicies"]


class DoorAgentClient:
    """What :class:`~labkit.agent.client.AgentClient` offers (``request``, ``get``, ``healthz``), each request
    carried by labkitd to the lab's agent (verb ``agent``)."""

    def __init__(self, lab):
        self.lab_obj = lab
        self.lab = lab.name

    def request(self, method: str, path: str, body=None):
        return self.lab_obj._call("agent", method=method, path=path, body=body)

    def get(self, path: str):
        return self.request("GET", path)

    def healthz(self) -> dict:
        return self.get("/v1/healthz")

    def close(self) -> None:
        pass


class DoorServices(RemoteServices):
    """``lab.services``: changes and lists answered by the lab's agent; the map views read by labkitd."""

    def __init__(self, lab):
        super().__init__(lab, DoorAgentClient(lab))

    @property
    def cilium(self) -> str:
        return self._lab.config.cilium

    @property
    def mode(self) -> str:
        return self._lab.config.service_mode

    @property
    def maglev_m(self) -> int:
        return self._lab.config.maglev_table_size

    def lb(self, node: str):
        """``node``'s Service maps (:class:`labkit.maps.lb.LbSnapshot`: ``lines()``, ``raw_lines()``, ``rows()``)."""
        return self._lab._call("lb", node=node)

    def lb_command(self, node: str) -> list[str]:
        from labkit.maps.lb import BACKENDS_MAP, REVNAT_MAP, SERVICES_MAP

        return [f"bpftool map dump pinned {self._lab.pin_dir(node)}/{m}" for m in (SERVICES_MAP, BACKENDS_MAP, REVNAT_MAP)]

    def maglev(self, name: str, node: str):
        """The Maglev tables of Service ``name`` on ``node``: ``{service id: (BPF table, labkit's own)}``."""
        return {int(k): tuple(v) for k, v in self._lab._call("maglev", service=name, node=node).items()}

    def iptables(self, node: str, table: str = "nat") -> str:
        """``iptables-save -t TABLE`` of ``node`` (kube-proxy's rules in iptables mode)."""
        return self._lab._call("iptables", node=node, table=table)


class DoorPolicies(RemotePolicies):
    """``lab.policy``: applied, deleted and listed by the lab's agent; a pod's map read by labkitd."""

    def __init__(self, lab):
        super().__init__(lab, DoorAgentClient(lab))

    def get(self, pod: str) -> PolicyMapView:
        """Pod ``pod``'s policy map as the datapath holds it (``cilium-dbg bpf policy get`` grammar)."""
        got = self._lab._call("policy.get", pod=pod)
        return PolicyMapView(got["pod"], got["path"], got["rows"], got["lines"], got["expected"], got["info"])
