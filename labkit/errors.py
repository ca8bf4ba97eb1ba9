"""One error family for everything labkit raises.

Every error is a :class:`LabkitError` *and* the builtin it resembles, so callers
may catch either. Messages name the object, then say what was expected and what
was found::

    >>> try:
    ...     raise NotFoundError("pod 'a9' not found in lab 'demo' (pods: a1, a2, b1, b2)")
    ... except LookupError as exc:
    ...     print(exc)
    pod 'a9' not found in lab 'demo' (pods: a1, a2, b1, b2)
"""
from __future__ import annotations

__all__ = [
    "LabkitError",
    "TopologyError",
    "ConfigError",
    "NotFoundError",
    "LabBusyError",
    "LabStateError",
    "NetnsError",
    "DatapathError",
    "PrivilegeError",
    "CleanupError",
    "LabTimeoutError",
    "PolicyError",
    "AccessError",
    "RequestError",
    "LimitError",
    "DoorDownError",
]


class LabkitError(Exception):
    """Base of every labkit error."""


class TopologyError(LabkitError, ValueError):
    """A topology description is inconsistent (names, addresses, CIDRs)."""


class ConfigError(LabkitError, ValueError):
    """A datapath or lab option has a value outside what it accepts."""


class NotFoundError(LabkitError, LookupError):
    """A named pod, node, lab, map or program does not exist."""


class LabBusyError(LabkitError, BlockingIOError):
    """Another live process holds the lab's lock."""


class LabStateError(LabkitError, RuntimeError):
    """The lab is not in the state the operation needs (not up, broken, ...)."""


class NetnsError(LabkitError, OSError):
    """A namespace, link, address or route operation failed; keeps the errno."""


class DatapathError(LabkitError, RuntimeError):
    """Compiling, loading, attaching or pinning the BPF datapath failed."""


class PrivilegeError(LabkitError, PermissionError):
    """The process lacks root, CAP_BPF, bpffs or BCC: the message says how to fix it."""


class CleanupError(LabkitError, RuntimeError):
    """Something the lab created is still present after teardown."""


class LabTimeoutError(LabkitError, TimeoutError):
    """Waiting for the datapath or a pod server took longer than allowed."""


class PolicyError(LabkitError, ValueError):
    """A network policy (CiliumNetworkPolicy YAML/JSON) is malformed; the message names the field path."""


class AccessError(LabkitError, PermissionError):
    """labkitd refused a request: the caller may not do that verb on that lab (it names both, nothing more)."""


class RequestError(LabkitError, ValueError):
    """A request to labkitd is malformed: not JSON, too large, an unknown verb, an argument of the wrong kind."""


class LimitError(LabkitError, OSError):
    """A request would pass one of labkitd's limits (labs per user, pods per lab, services, concurrency)."""


class DoorDownError(LabkitError, ConnectionError):
    """No labkitd answers on its socket; the message says how to start it."""
