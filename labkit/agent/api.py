"""The agent's API: JSON over HTTP on a unix socket, in the spirit of cilium-agent's.

One socket per lab, ``/run/labkit/<lab>/agent.sock``, root only (mode 0600). Its resources:

==========  ====================================  ==================================================
method      path                                  what it does
==========  ====================================  ==================================================
GET         /v1/healthz                           the agent's state: pid, uptime, services, restore
GET         /v1/service                           every service (``Service.to_json``)
DELETE      /v1/service                           remove every service (``lab.reset()``)
POST        /v1/service                           add one: ``Services.add``'s keywords as JSON
GET         /v1/service/NAME                      one service
PUT         /v1/service/NAME                      make it so (an apply of one spec)
DELETE      /v1/service/NAME                      remove it
POST        /v1/service/NAME/backend              ``{"backend": "b1:8080", "state": "active"}``
PATCH       /v1/service/NAME/backend/POD:PORT     ``{"state": "terminating"}``
DELETE      /v1/service/NAME/backend/POD:PORT     take it out
POST        /v1/apply                             a list of specs in one call (``labkit service apply``)
GET         /v1/endpoint                          the endpoints in every node's ``cilium_lxc``
GET         /v1/policy                            every policy: name, namespace, rules, pods it selects
POST        /v1/policy                            ``{"text": YAML}`` or ``{"policies": [objects]}``: apply
DELETE      /v1/policy                            remove every policy (``lab.reset()``)
POST        /v1/policy/sync                       rewrite every endpoint's map where it differs
DELETE      /v1/policy/NAMESPACE/NAME             remove one policy
GET         /v1/policy/endpoint/POD               a pod's resolved policy (``bpf policy get`` lines)
GET         /v1/identity                          the identities (``cilium-dbg identity list`` lines)
==========  ====================================  ==================================================

A change answers ``{"service": …, "agent_seconds": s}``: ``agent_seconds`` is the time the
agent spent on it (checks, map writes, journal), without the HTTP around it.
An error answers ``{"error": message, "type": "ConfigError"}`` with a 4xx status for bad
input (400) or an unknown name (404) — the message is the one the Python API raises —
and 5xx when the kernel refused a write (500) or the agent is not ready (503).

This module only names things both sides share; the server is :mod:`labkit.agent.daemon`,
the client :mod:`labkit.agent.client`.

    >>> status_of(NotFoundError("service 'x' not found"))
    404
    >>> error_of({"type": "ConfigError", "error": "bad port"}, 400)
    ConfigError('bad port')
"""
from __future__ import annotations

from pathlib import Path

from labkit import errors
from labkit.errors import ConfigError, LabkitError, NotFoundError
from labkit.net.ledger import lab_dir

__all__ = ["socket_path", "log_path", "status_of", "error_of", "PREFIX"]

PREFIX = "/v1"


def socket_path(lab: str) -> Path:
    """Where lab ``lab``'s agent listens."""
    return lab_dir(lab) / "agent.sock"


def log_path(lab: str) -> Path:
    """What the agent writes about itself (``labkit agent logs``)."""
    return lab_dir(lab) / "agent.log"


def status_of(exc: BaseException) -> int:
    """The HTTP status an error from the agent is answered with."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, (ConfigError, errors.TopologyError, errors.PolicyError)):
        return 400
    if isinstance(exc, errors.LabBusyError):
        return 409
    return 500


def error_of(body: dict, status: int) -> LabkitError:
    """The exception an error answer stands for: the same class and message the agent raised."""
    cls = getattr(errors, str(body.get("type", "")), None)
    if not (isinstance(cls, type) and issubclass(cls, LabkitError)):
        cls = NotFoundError if status == 404 else ConfigError if 400 <= status < 500 else errors.LabStateError
    return cls(str(body.get("error", f"the agent answered status {status}")))
