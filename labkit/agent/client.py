"""The agent's clients: :class:`AgentClient` speaks its API (:mod:`labkit.agent.api`), and
:class:`RemoteServices` is ``lab.services`` — the same calls as :class:`labkit.agent.services.Services`,
answered by the lab's agent process, as ``cilium-dbg service …`` is answered by cilium-agent.

    >>> client = AgentClient("demo")                  # doctest: +SKIP
    >>> client.get("/v1/healthz")["status"]           # doctest: +SKIP
    'ok'

The connection is kept open between calls (HTTP/1.1 keep-alive), so a call costs one
round trip on the socket. This module imports nothing heavy: ``labkit service …`` starts fast.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.parse
from typing import Iterator, Sequence

from labkit.agent.api import PREFIX, error_of, socket_path
from labkit.errors import LabStateError

__all__ = ["AgentClient", "AgentDownError", "RemoteServices", "RemotePolicies", "PolicyMapView"]


class AgentDownError(LabStateError):
    """The lab's agent is not answering on its socket."""


class _Disconnected(Exception):
    """The agent closed a kept connection (it restarted, or it stopped)."""


class _Connection:
    """HTTP/1.1 on a unix socket, kept open between requests: what the agent's server speaks (every answer
    has a Content-Length). Written here rather than taken from ``http.client``, which would load the
    ``ssl`` and ``email`` packages into every ``labkit service …`` process."""

    def __init__(self, path: str, timeout: float):
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = b""

    def request(self, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
        if self.sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                raise
            self.sock, self.buf = sock, b""
        body = body or b""
        head = (f"{method} {target} HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        try:
            self.sock.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _Disconnected(str(exc)) from None
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        header, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(fields.get("content-length", "0"))
        while len(self.buf) < length:
            self._fill()
        data, self.buf = self.buf[:length], self.buf[length:]
        if fields.get("connection", "").lower() == "close":
            self.close()
        return status, data

    def _fill(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError as exc:
            raise _Disconnected(str(exc)) from None
        if not chunk:
            raise _Disconnected("the agent closed the connection")
        self.buf += chunk

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class AgentClient:
    """Requests to lab ``lab``'s agent. ``timeout`` bounds one call (a big apply waits its turn)."""

    def __init__(self, lab: str, timeout: float = 600.0):
        self.lab = lab
        self.path = str(socket_path(lab))
        self.timeout = timeout
        self._conn: _Connection | None = None

    def __repr__(self) -> str:
        return f"AgentClient({self.lab!r}, {self.path!r})"

    def request(self, method: str, path: str, body=None):
        """One call; the answer's JSON, or the agent's error raised as the class it raised."""
        data = None if body is None else json.dumps(body).encode()
        for attempt in (0, 1):
            fresh = self._conn is None
            if fresh:
                self._conn = _Connection(self.path, self.timeout)
            try:
                status, raw = self._conn.request(method, path, data)
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                self.close()
                raise AgentDownError(
                    f"lab '{self.lab}': its agent is not running (no one answers on {self.path}: "
                    f"{exc.strerror or exc}); `labkit --lab {self.lab} agent restart` starts it") from None
            except _Disconnected as exc:
                self.close()  # a kept connection the agent closed (it restarted): once more on a new one
                if fresh or attempt:
                    raise AgentDownError(f"lab '{self.lab}': its agent closed the connection ({exc}); "
                                         f"`labkit --lab {self.lab} agent status` says why") from None
            except TimeoutError:
                self.close()
                raise AgentDownError(f"lab '{self.lab}': its agent did not answer {method} {path} within "
                                     f"{self.timeout} s; `labkit --lab {self.lab} agent logs`") from None
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            raise LabStateError(f"lab '{self.lab}': the agent answered {method} {path} with something that is "
                                f"not JSON (status {status}): {raw[:200]!r}") from None
        if status >= 400:
            raise error_of(answer if isinstance(answer, dict) else {}, status)
        return answer

    def get(self, path: str):
        return self.request("GET", path)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def healthz(self) -> dict:
        return self.get(f"{PREFIX}/healthz")


def _q(part: str) -> str:
    return urllib.parse.quote(str(part), safe=":")


class RemoteServices:
    """``lab.services`` of a running lab: changes and the service list go to its agent; views of the
    maps (``lb``, ``maglev``, ``iptables``) are read here, from the pinned maps, as ``bpftool`` reads them.

    ``last_agent_seconds`` is how long the agent spent on the last change it answered.
    """

    def __init__(self, lab, client: AgentClient | None = None):
        self._lab = lab
        self.lab = lab.name
        self.topology = lab.topology
        self.client = client or AgentClient(lab.name)
        self.last_agent_seconds: float | None = None
        self._local = None

    def __repr__(self) -> str:
        return f"RemoteServices(lab={self.lab!r}, services={[s.name for s in self.list()]})"

    # -- what the agent answers -------------------------------------------------------
    def _service(self, data: dict):
        from labkit.agent.services.model import Service

        return Service.from_json(data)

    def _change(self, method: str, path: str, body=None):
        answer = self.client.request(method, path, body)
        self.last_agent_seconds = answer.get("agent_seconds") if isinstance(answer, dict) else None
        return answer

    def list(self) -> list:
        """Every service, in the order they were added."""
        return [self._service(d) for d in self.client.get(f"{PREFIX}/service")]

    def get(self, name: str):
        """The service ``name``; NotFoundError lists the services."""
        return self._service(self.client.get(f"{PREFIX}/service/{_q(name)}"))

    def __iter__(self) -> Iterator:
        return iter(self.list())

    def __len__(self) -> int:
        return int(self.client.healthz()["services"])

    def __contains__(self, name: object) -> bool:
        return any(s.name == name for s in self.list())

    def add(self, name: str, port: int, backends: Sequence = (), vip: str | None = None, protocol: str = "TCP",
            affinity: int = 0, type: str = "ClusterIP", node_port: int | None = None, lb_vip: str | None = None,
            etp: str = "Cluster", algorithm: str = "random"):
        """As :meth:`labkit.agent.services.Services.add`, done by the agent."""
        spec = {"name": name, "port": port, "backends": _refs(backends), "vip": vip, "protocol": protocol,
                "affinity": affinity, "type": type, "node_port": node_port, "lb_vip": lb_vip, "etp": etp,
                "algorithm": algorithm}
        return self._service(self._change("POST", f"{PREFIX}/service", spec)["service"])

    def apply(self, specs: Sequence[dict]) -> dict[str, list[str]]:
        """As :meth:`labkit.agent.services.Services.apply`: every spec in one call to the agent."""
        specs = [{**s, "backends": _refs(s["backends"])} if isinstance(s, dict) and "backends" in s else s
                 for s in specs]
        return self._change("POST", f"{PREFIX}/apply", specs)["result"]

    def remove(self, name: str) -> None:
        self._change("DELETE", f"{PREFIX}/service/{_q(name)}")

    def add_backend(self, name: str, backend, state: str = "active"):
        body = {"backend": _refs([backend])[0], "state": state}
        return self._service(self._change("POST", f"{PREFIX}/service/{_q(name)}/backend", body)["service"])

    def remove_backend(self, name: str, backend):
        ref = _refs([backend])[0]
        return self._service(self._change("DELETE", f"{PREFIX}/service/{_q(name)}/backend/{_q(ref)}")["service"])

    def set_backend_state(self, name: str, backend, state: str):
        ref = _refs([backend])[0]
        path = f"{PREFIX}/service/{_q(name)}/backend/{_q(ref)}"
        return self._service(self._change("PATCH", path, {"state": state})["service"])

    def flush(self) -> None:
        """Every service removed and the LB maps emptied, ids from 1 again (``lab.reset()``)."""
        self._change("DELETE", f"{PREFIX}/service")

    # -- what the maps hold, read here ----------------------------------------------------
    @property
    def local(self):
        """A read-only view of the same maps in this process (``lb``, ``maglev``, ``iptables``)."""
        from labkit.agent.services import Services

        if self._local is None:
            self._local = Services.for_lab(self._lab)
        return self._local

    @property
    def cilium(self) -> str:
        return self.local.cilium

    @property
    def mode(self) -> str:
        return self.local.mode

    @property
    def maglev_m(self) -> int:
        return self.local.maglev_m

    def lb(self, node: str):
        return self.local.lb(node)

    def lb_command(self, node: str) -> list[str]:
        return self.local.lb_command(node)

    def maglev(self, name: str, node: str):
        return self.local.maglev(name, node)

    def iptables(self, node: str, table: str = "nat") -> str:
        return self.local.iptables(node, table)


class PolicyMapView:
    """One pod's policy map as the datapath holds it: ``lines`` in ``cilium-dbg bpf policy get`` grammar,
    read from the pinned map (``path``; empty when the pod has none: no policy enforces on it, allow-all;
    ``pinned`` says which),
    ``rows`` the typed map rows, ``expected`` the lines the agent resolved, and ``command`` the real
    command that dumps the same map."""

    def __init__(self, pod: str, path: str, rows: list, lines: list[str], expected: list[str], info: dict):
        self.pod, self.path, self.rows, self.lines, self.expected, self.info = pod, path, rows, lines, expected, info

    @property
    def command(self) -> list[str]:
        return ["bpftool", "map", "dump", "pinned", self.path]

    @property
    def pinned(self) -> bool:
        """Whether the pod has a policy map at all."""
        return bool(self.info.get("pinned", self.rows))

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def _repr_html_(self) -> str:
        import html

        return f"<pre># {html.escape(' '.join(self.command))}\n{html.escape(str(self))}</pre>"


class RemotePolicies:
    """``lab.policy`` of a running lab: the agent applies, deletes and lists CiliumNetworkPolicies; a pod's
    map (:meth:`get`) is read here, from its pinned map.

        >>> lab.policy.apply(open("web.yaml").read())      # doctest: +SKIP
        >>> print(lab.policy.get("a1"))                    # doctest: +SKIP
    """

    def __init__(self, lab, client: AgentClient | None = None):
        self.lab = lab.name
        self._lab = lab
        self.client = client or AgentClient(lab.name)
        self.last_report: dict | None = None

    def __repr__(self) -> str:
        return f"RemotePolicies(lab={self.lab!r}, policies={[p['name'] for p in self.list()]})"

    def apply(self, policy, source: str = "") -> dict:
        """Apply a policy: YAML or JSON text (several documents allowed), a mapping, or a list of mappings.
        Returns what the agent wrote (per endpoint: created, added, changed, deleted keys)."""
        body = {"text": policy} if isinstance(policy, str) else {
            "policies": [policy] if isinstance(policy, dict) else list(policy)}
        self.last_report = self.client.request("POST", f"{PREFIX}/policy", {**body, "source": source})
        return self.last_report

    def delete(self, name: str, namespace: str = "default") -> dict:
        """Remove policy ``namespace/name``."""
        self.last_report = self.client.request("DELETE", f"{PREFIX}/policy/{_q(namespace)}/{_q(name)}")
        return self.last_report

    def sync(self) -> dict:
        """Have the agent rewrite every endpoint's map where it differs from the policies (a pod deleted)."""
        self.last_report = self.client.request("POST", f"{PREFIX}/policy/sync")
        return self.last_report

    def flush(self) -> dict:
        """Remove every policy (``lab.reset()``)."""
        self.last_report = self.client.request("DELETE", f"{PREFIX}/policy")
        return self.last_report

    def list(self) -> list[dict]:
        """Every policy: name, namespace, rules, the pods it selects, the object as applied."""
        return self.client.get(f"{PREFIX}/policy")

    def resolved(self, pod: str) -> dict:
        """What the agent resolved for ``pod``: enforcement per direction, selecting rules, lines, map path."""
        return self.client.get(f"{PREFIX}/policy/endpoint/{_q(pod)}")

    def identities(self) -> list[str]:
        """``cilium-dbg identity list`` lines."""
        return self.client.get(f"{PREFIX}/identity")["lines"]

    def get(self, pod: str) -> PolicyMapView:
        """Pod ``pod``'s policy map, read from the pinned map (``bpf policy get`` grammar)."""
        import os

        from labkit.agent.policies import read_policy_map
        from labkit.maps.policy import policy_get_lines
        from labkit.policy.identity import RESERVED_NAMES, reserved_labels

        info = self.resolved(pod)
        alloc = {int(k): v for k, v in self.client.get(f"{PREFIX}/identity")["identities"].items()}

        def labels(ident: int) -> list[str]:
            if ident == 0:
                return ["reserved:unknown"]
            if ident in RESERVED_NAMES:
                return reserved_labels(ident).printable()
            return alloc.get(ident, [])

        pinned = os.path.lexists(info["path"])
        rows = read_policy_map(info["path"]) if pinned else []
        lines = policy_get_lines(rows, labels) if pinned else []
        return PolicyMapView(pod, info["path"], rows, lines, info["lines"], {**info, "pinned": pinned})


def _refs(backends) -> list:
    """Backends as the API carries them: ``'pod:port'``, or ``{pod, port, state}`` for a non-default state."""
    if isinstance(backends, str) or hasattr(backends, "pod"):
        backends = [backends]
    out = []
    for b in backends:
        if hasattr(b, "pod"):
            out.append(b.ref if b.state == "active" else {"pod": b.pod, "port": b.port, "state": b.state})
        else:
            out.append(b)
    return out


def wait_ready(client: AgentClient, timeout: float = 20.0) -> dict:
    """Poll ``/v1/healthz`` until the agent answers ``ok``; its answer."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.healthz()
        except AgentDownError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
