"""The agent's state and its ids: services by name, backend ids by ``address:port/protocol``.

Service ids (1, 2, ...; one per frontend) and backend ids are allocated per lab, the same on every
node; a backend id is shared by every service that uses it and freed when the last one stops.

    >>> allocate(3, {1, 3}, 4, 'id')
    (4, 1)
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from labkit.agent.services.model import Service, MAX_BACKEND_ID, STATE_VERSION
from labkit.errors import ConfigError
from labkit.net.topology import Topology

__all__ = ["AgentState", "allocate", "l4_key"]


@dataclass(frozen=True)
class AgentState:
    """Services by name, backend ids by ``address:port/protocol``, the next ids to hand out."""

    services: dict = field(default_factory=dict)  # name -> Service, in creation order
    backend_ids: dict = field(default_factory=dict)  # "ip:port/PROTO" -> id
    next_service_id: int = 1
    next_backend_id: int = 1

    @classmethod
    def from_json(cls, data: dict) -> "AgentState":
        if not data:
            return cls()
        return cls(
            services={s["name"]: Service.from_json(s) for s in data.get("services", [])},
            backend_ids=dict(data.get("backend_ids", {})),
            next_service_id=int(data.get("next_service_id", 1)),
            next_backend_id=int(data.get("next_backend_id", 1)),
        )

    def to_json(self) -> dict:
        return {"version": STATE_VERSION, "services": [s.to_json() for s in self.services.values()],
                "backend_ids": self.backend_ids, "next_service_id": self.next_service_id,
                "next_backend_id": self.next_backend_id}

    def with_service(self, svc: Service, topo: Topology, drop: str | None = None) -> tuple["AgentState", Service]:
        """This state with ``svc`` in (replacing one of its name), backend ids assigned;
        ``drop`` names a service to take out instead. Unused backend ids are freed."""
        services = dict(self.services)
        ids = dict(self.backend_ids)
        next_bid = self.next_backend_id
        if drop is not None:
            services.pop(drop, None)
        else:
            bes = []
            for b in svc.backends:
                l4 = l4_key(topo.pod(b.pod).ip, b.port, svc.protocol)
                if l4 not in ids:
                    ids[l4], next_bid = allocate(next_bid, set(ids.values()), MAX_BACKEND_ID, "backend id")
                bes.append(replace(b, id=ids[l4]))
            svc = replace(svc, backends=tuple(bes))
            services[svc.name] = svc
        used = {b.id for s in services.values() for b in s.backends}
        ids = {k: v for k, v in ids.items() if v in used}
        return replace(self, services=services, backend_ids=ids, next_backend_id=next_bid), svc


def l4_key(ip: str, port: int, proto: str) -> str:
    return f"{ip}:{port}/{proto}"


def allocate(start: int, used: set[int], limit: int, what: str) -> tuple[int, int]:
    """The first free id from ``start`` on, wrapping to 1; returns (id, the next start)."""
    candidate = start if 1 <= start <= limit else 1
    for _ in range(len(used) + 1):
        if candidate not in used:
            return candidate, candidate % limit + 1
        candidate = candidate % limit + 1
    raise ConfigError(f"no free {what}: all {limit} are in use")
