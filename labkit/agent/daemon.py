"""The lab's agent: one long-running process per lab, as cilium-agent is one per node.

``labkit up`` starts it (``python -m labkit agent --lab NAME``) once the datapath is
loaded; ``labkit down`` stops it with the rest of the ledger. It owns:

- the **Services** (:class:`labkit.agent.services.Services`, its state in memory with
  indexes, the maps kept open): every change a client asks for is checked, written to
  the maps of every node and journalled here, one at a time;
- the **monitor** (:class:`labkit.observe.monitor.Monitor`), on a thread: every node's
  trace ring buffer drained to ``events.bin``;
- the **CT garbage collector**'s timer (:class:`labkit.agent.gc.LabGc`), on a thread: a
  run whenever the lab clock says one is due;
- the **network policies** (:class:`labkit.agent.policies.Policies`): the policy repository, kept in
  ``policies.json``, resolved into every endpoint's pinned policy map on each change;
- the **DNS proxy** (:class:`labkit.fqdn.proxy.DnsProxies`), when policy is compiled in: a thread per
  node answering the pods' DNS that a ``rules.dns`` policy redirects to it, learning names → IPs
  for ``toFQDNs`` (the cache expires on the lab clock, checked by the GC timer's thread);
- the **API** (:mod:`labkit.agent.api`) on ``/run/labkit/<lab>/agent.sock`` (mode 0600),
  which ``lab.services``, ``labkit service …`` and ``labkit agent status`` talk to.

The datapath does not need it: the programs read pinned maps, so while the agent is
down established connections carry on and new ones to existing Services are still
load-balanced. A new agent (``labkit agent restart``) restores the Services and their
ids from the journal and the pinned maps, and rewrites only the map entries that are
wrong (:mod:`labkit.agent.services.restore`, when present).

    python -m labkit agent --lab demo       # what `labkit up` runs; it prints "agent ready"
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import signal
import socketserver
import sys
import threading
import time
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler

from labkit.agent.api import PREFIX, log_path, socket_path, status_of
from labkit.agent.gc import LabGc
from labkit.agent.policies import Policies
from labkit.agent.services import Services
from labkit.agent.services.ids import AgentState
from labkit.clock import LabClock
from labkit.config import DatapathConfig
from labkit.errors import ConfigError, LabkitError, NotFoundError
from labkit.maps.base import PinnedMap
from labkit.maps.config import ConfigMaps
from labkit.maps.eps import EndpointInfo, EndpointKey
from labkit.net.ledger import LabState, lab_dir
from labkit.net.topology import Topology
from labkit.observe.monitor import Monitor

__all__ = ["Agent", "AgentView", "main"]


class AgentView:
    """What the agent's parts need of the lab, read from ``lab.json`` and the pinned config map
    (the agent sits below :class:`labkit.lab.Lab` and never imports it)."""

    def __init__(self, name: str):
        self.name = name
        self.reload()
        self.clock = LabClock(self._offset, self._set_offset)

    def reload(self) -> None:
        """Read ``lab.json`` again (a pod deleted since changes the topology)."""
        self.state = LabState.read(self.name)
        self.topology = Topology.from_dict(self.state.topology)
        self.config = DatapathConfig.from_dict(self.state.config)
        self._stamp = _mtime(lab_dir(self.name) / "lab.json")

    def stale(self) -> bool:
        return _mtime(lab_dir(self.name) / "lab.json") != self._stamp

    def pin_dir(self, node: str) -> str:
        return self.state.pin_dirs[node]

    @property
    def pin_dirs(self) -> dict[str, str]:
        return dict(self.state.pin_dirs)

    def _config_maps(self) -> ConfigMaps:
        return ConfigMaps(self.pin_dir(n.name) for n in self.topology.nodes)

    def _offset(self) -> int:
        return self._config_maps().read().clock_offset

    def _set_offset(self, offset: int) -> None:
        self._config_maps().update(clock_offset=offset)

    def agent_faults(self) -> list[str]:
        try:
            return sorted(json.loads((lab_dir(self.name) / "faults.json").read_text()))
        except (FileNotFoundError, ValueError):
            return []

    def note_change(self, step=None) -> None:
        """Live tables belong to notebooks; they refresh on their own."""


def _mtime(path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _quiet_heap():
    """No cyclic garbage collection inside: the agent's state is tens of thousands of small objects that
    live as long as it does, and a collection pass over them at every allocation threshold costs more
    than the work (a restore at 50,000 services took three times as long). Afterwards what is alive is
    frozen out of the collector's sight (:func:`gc.freeze`) once the young objects were collected: the
    objects of a call are freed by their reference counts, the cycles it left by that one young pass."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.collect(0)  # the young objects only: cycles the call left (an exception's traceback) go now
        gc.freeze()
        if was:
            gc.enable()


class Agent:
    """The agent's state and what each API call does with it (one call at a time)."""

    def __init__(self, lab: str):
        self.view = AgentView(lab)
        self.lock = threading.Lock()
        self.started = time.time()
        self.services = Services.for_lab(self.view, keep_open=True)
        with _quiet_heap():
            self.restored = self._restore()
        self.policies = Policies(self.view)
        self.policy_restored = self._restore_policies()
        self.gc = LabGc(self.view)
        self.gc_error: str | None = None
        self.monitor: Monitor | None = None
        self.dns_proxies = None  #: :class:`labkit.fqdn.proxy.DnsProxies` once started (policy compiled in)

    def _restore(self) -> dict:
        """Services and ids as the journal and the pinned maps say; map entries that are wrong rewritten.

        As cilium-agent: first the quick check — the journal reads whole and every node's maps hold byte
        for byte what its services call for (:func:`restore.matches`): then nothing is written. Otherwise
        the journal and the maps are reconciled service by service (:func:`restore.recover`), a damaged
        journal is rebuilt from what the maps hold, and only the rows that are wrong are written
        (:func:`restore.sync`)."""
        from labkit.agent.services import restore

        t0 = time.perf_counter()
        svc = self.services
        report: dict = {"source": "journal", "damaged": False, "problems": []}
        scan = svc.store.scan()
        if not scan.damaged and not scan.torn:
            svc._table, svc._mark = AgentState.from_json(scan.snapshot, scan.records), scan.mark  # read once
            state = svc._state()
            if svc.mode != "ebpf" or restore.matches(state, svc.maps, svc.topology, svc.cilium, svc.maglev_m):
                report.update(services=len(state.services), checked="maps match the journal: nothing written",
                              seconds=round(time.perf_counter() - t0, 3))
                return report
        rec = restore.recover(svc.store, svc.maps, svc.topology, svc.cilium, svc.maglev_m)
        if rec.damaged or rec.source != "journal":
            restore.rebuild_store(svc.store, rec.state)
        svc._table = svc._mark = None  # read afresh: the store now says what the agent serves
        state = svc._state()
        sync = restore.sync(state, svc.maps, svc.topology, svc.cilium, svc.maglev_m)
        report.update(services=len(state.services), source=rec.source, damaged=rec.damaged,
                      problems=list(rec.problems), sync=str(sync), seconds=round(time.perf_counter() - t0, 3))
        return report

    def _restore_policies(self) -> dict:
        """The policy repository as ``policies.json`` says, every endpoint's map rewritten where it differs
        (a pod deleted meanwhile loses its map). A failure is reported, not fatal: the maps stay as they are."""
        t0 = time.perf_counter()
        try:
            report = self.policies.sync()
        except LabkitError as exc:
            return {"policies": len(self.policies.objects), "error": str(exc)}
        return {"policies": len(self.policies.objects), "endpoints": len(report["endpoints"]),
                "removed": report["removed"], "seconds": round(time.perf_counter() - t0, 3)}

    def fresh(self) -> Services:
        """The Services engine, rebuilt if the lab's topology changed under it (the policy maps then follow
        the new topology too)."""
        if self.view.stale():
            self.view.reload()
            self.services.maps.release()
            self.services = Services.for_lab(self.view, keep_open=True)
            self.policies = Policies(self.view)
            self.policy_restored = self._restore_policies()
        return self.services

    def health(self) -> dict:
        return {"status": "ok", "lab": self.view.name, "pid": os.getpid(), "started": self.started,
                "uptime_s": round(time.time() - self.started, 3), "services": len(self.fresh()._state().services),
                "mode": self.services.mode, "cilium": self.services.cilium, "restored": self.restored,
                "policies": len(self.policies.objects), "policy_restored": self.policy_restored,
                "policy_mode": self.policies.mode, "policy_audit": self.policies.audit,
                "monitor": {"running": self.monitor is not None, "records": getattr(self.monitor, "records", 0)},
                "gc": {"timer": bool(self.gc.state()["timer"]), "error": self.gc_error}}

    def endpoints(self) -> list[dict]:
        out = []
        for node in self.view.topology.nodes:
            with PinnedMap(f"{self.view.pin_dir(node.name)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
                for key, info in lxc.items():
                    pod = self.view.topology.owner_of(key.ip)
                    out.append({"node": node.name, "ip": key.ip, "pod": pod, "id": info.lxc_id,
                                "ifindex": info.ifindex, "identity": info.sec_id, "line": str(info)})
        return out

    def gc_loop(self, stopping: threading.Event, poll: float = 1.0) -> None:
        """Run the GC whenever the lab clock says it is due (its timer on)."""
        while not stopping.wait(poll):
            try:
                if self.gc.due():
                    self.gc.run()
                if self.dns_proxies is not None:
                    with self.lock:
                        self.policies.expire_dns()  # TTLs run out on the lab clock
                self.gc_error = None
            except Exception as exc:  # a lab being torn down: `down` stops this process next
                self.gc_error = f"{type(exc).__name__}: {exc}"
                print(f"labkit agent: gc: {self.gc_error}", file=sys.stderr, flush=True)


def _plain(obj):
    """A report object as JSON-able data."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_plain(v) for v in obj]
    if hasattr(obj, "__dataclass_fields__"):
        return {k: _plain(getattr(obj, k)) for k in obj.__dataclass_fields__}
    return str(obj)


# -- HTTP ---------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client's calls share one connection
    server_version = "labkit-agent"
    agent: Agent  # set on the subclass the server makes

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass  # changes are logged by _answer; reads are not worth a line each

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if not n:
            return None
        try:
            return json.loads(self.rfile.read(n))
        except ValueError as exc:
            raise ConfigError(f"{self.command} {self.path}: the body is not JSON ({exc})") from None

    def _dispatch(self, method: str) -> None:
        t0 = time.perf_counter()
        try:
            body = self._body()
            parts = [urllib.parse.unquote(p) for p in urllib.parse.urlsplit(self.path).path.split("/") if p]
            if parts[:1] != [PREFIX.strip("/")]:
                raise NotFoundError(f"{method} {self.path}: no such resource; expected a path under {PREFIX}/")
            with self.agent.lock, _quiet_heap():
                status, answer = route(self.agent, method, parts[1:], body)
        except LabkitError as exc:
            status, answer = status_of(exc), {"error": str(exc), "type": type(exc).__name__}
        except Exception as exc:  # the agent's own bug: answered, logged, and the agent lives on
            traceback.print_exc(file=sys.stderr)
            status, answer = 500, {"error": f"the agent failed: {type(exc).__name__}: {exc}", "type": "LabStateError"}
        raw = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)
        if method != "GET":
            print(f"{time.strftime('%H:%M:%S')} {method} {self.path} {status} "
                  f"{(time.perf_counter() - t0) * 1000:.2f} ms", file=sys.stderr, flush=True)


def route(agent: Agent, method: str, parts: list[str], body) -> tuple[int, object]:
    """One API call (``parts``: the path after ``/v1``) → (status, answer)."""
    topo = agent.view.topology
    if parts == ["healthz"] and method == "GET":
        return 200, agent.health()
    if parts == ["endpoint"] and method == "GET":
        return 200, agent.endpoints()
    svcs = agent.fresh()
    t0 = time.perf_counter()

    def changed(svc, status: int = 200):
        return status, {"service": svc.to_json(topo) if svc is not None else None,
                        "agent_seconds": round(time.perf_counter() - t0, 6)}

    if parts == ["service"]:
        if method == "GET":
            return 200, [s.to_json(topo) for s in svcs.list()]
        if method == "POST":
            spec = _mapping(body, "POST /v1/service")
            return changed(svcs.add(**_spec_args(spec)), 201)
        if method == "DELETE":
            svcs.flush()
            return changed(None)
    if parts[:1] in (["policy"], ["identity"]):
        return _policy_route(agent, method, parts, body, t0)
    if parts == ["fqdn", "cache"] and method == "GET":
        from labkit.fqdn.cache import cache_list_lines

        now, wall = agent.policies._now(), time.time()
        entries = agent.policies.dns.to_json()
        return 200, {"now": now, "wall": wall, "entries": entries, "min_ttl": agent.policies.dns.min_ttl,
                     "lines": cache_list_lines(entries, now, wall)}
    if parts == ["fqdn", "events"] and method == "GET":
        px = agent.dns_proxies
        return 200, {"running": px is not None, "errors": dict(px.errors) if px else {},
                     "max_delay": px.max_delay if px else None, "events": list(px.events) if px else []}
    if parts == ["apply"] and method == "POST":
        result = svcs.apply(body if body is not None else [])
        return 200, {"result": result, "agent_seconds": round(time.perf_counter() - t0, 6)}
    if len(parts) == 2 and parts[0] == "service":
        name = parts[1]
        if method == "GET":
            return 200, svcs.get(name).to_json(topo)
        if method == "DELETE":
            svcs.remove(name)
            return changed(None)
        if method == "PUT":
            spec = {**_mapping(body, f"PUT /v1/service/{name}"), "name": name}
            svcs.apply([spec])
            return changed(svcs.get(name))
    if len(parts) == 3 and parts[0] == "service" and parts[2] == "backend" and method == "POST":
        b = _mapping(body, f"POST /v1/service/{parts[1]}/backend")
        if "backend" not in b:
            raise ConfigError(f"service '{parts[1]}': no backend given; expected {{\"backend\": \"POD:PORT\"}}")
        return changed(svcs.add_backend(parts[1], b["backend"], b.get("state", "active")), 201)
    if len(parts) == 4 and parts[0] == "service" and parts[2] == "backend":
        name, ref = parts[1], parts[3]
        if method == "DELETE":
            return changed(svcs.remove_backend(name, ref))
        if method == "PATCH":
            b = _mapping(body, f"PATCH /v1/service/{name}/backend/{ref}")
            if "state" not in b:
                raise ConfigError(f"service '{name}': backend '{ref}': no state given; expected {{\"state\": ...}}")
            return changed(svcs.set_backend_state(name, ref, b["state"]))
    raise NotFoundError(f"{method} {PREFIX}/{'/'.join(parts)}: no such resource or method "
                        f"(see labkit.agent.api for the API)")


def _policy_route(agent: Agent, method: str, parts: list[str], body, t0: float) -> tuple[int, object]:
    """``/v1/policy…`` and ``/v1/identity``: the policy repository and the identities."""
    pols = agent.policies

    def done(report: dict, status: int = 200):
        return status, {**report, "agent_seconds": round(time.perf_counter() - t0, 6)}

    if parts == ["identity"] and method == "GET":
        from labkit.policy.identity import identity_list_lines

        alloc = pols.identities.load()
        return 200, {"identities": {str(k): v for k, v in alloc.snapshot().items()},
                     "lines": identity_list_lines(alloc)}
    if parts == ["policy"]:
        if method == "GET":
            return 200, pols.list()
        if method == "DELETE":
            return done(pols.flush())
        if method == "POST":
            b = _mapping(body, "POST /v1/policy")
            if "text" in b:
                return done(pols.apply(str(b["text"]), str(b.get("source") or "")), 201)
            if "policies" in b:
                return done(pols.apply(b["policies"], str(b.get("source") or "")), 201)
            raise ConfigError("POST /v1/policy: expected {\"text\": YAML} or {\"policies\": [objects]}, got "
                              f"{', '.join(sorted(b)) or 'an empty object'}")
    if parts == ["policy", "sync"] and method == "POST":
        return done(pols.sync())
    if len(parts) == 3 and parts[0] == "policy" and parts[1] == "endpoint" and method == "GET":
        return 200, pols.endpoint_policy(parts[2])
    if len(parts) == 3 and parts[0] == "policy" and method == "DELETE":
        return done(pols.delete(parts[2], parts[1]))
    raise NotFoundError(f"{method} {PREFIX}/{'/'.join(parts)}: no such resource or method "
                        f"(see labkit.agent.api for the API)")


def _mapping(body, where: str) -> dict:
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {type(body).__name__}")
    return body


def _spec_args(spec: dict) -> dict:
    """A spec as keyword arguments of ``Services.add`` (unknown fields refused by name)."""
    known = ("name", "port", "backends", "vip", "protocol", "affinity", "type", "node_port", "lb_vip", "etp",
             "algorithm")
    extra = sorted(set(spec) - set(known))
    if extra:
        raise ConfigError(f"service {spec.get('name', '?')!r}: unknown field(s) {', '.join(extra)}; "
                          f"expected {', '.join(known)}")
    if "name" not in spec or "port" not in spec:
        raise ConfigError(f"service: expected at least name and port, got {', '.join(spec) or 'nothing'}")
    return {k: v for k, v in spec.items() if v is not None or k in ("name", "port")}


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve(agent: Agent, path) -> _Server:
    """Listen on ``path`` (mode 0600: root only), a thread per client connection."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    handler = type("Handler", (_Handler,), {"agent": agent})
    old = os.umask(0o177)
    try:
        server = _Server(str(path), handler)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return server


def main(argv: list[str] | None = None) -> int:
    """Run lab ``--lab``'s agent until SIGTERM; print ``agent ready`` once it serves."""
    ap = argparse.ArgumentParser(prog="labkit.agent", description="a lab's agent: services, monitor, GC, API")
    ap.add_argument("--lab", required=True, help="the lab; '-': the first line of stdin names it (an agent started "
                                                  "ahead of its lab's build, labkit.lab.standby)")
    ap.add_argument("--gc-poll", type=float, default=1.0, help="how often the GC timer looks at the lab clock (s)")
    ap.add_argument("--tofqdns-proxy-response-max-delay", type=float, default=None, metavar="SECONDS",
                    help="longest the DNS proxy holds an answer while the maps are written (Cilium: 100ms; "
                         "default $LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY, else 0.1)")
    args = ap.parse_args(argv)
    if args.lab == "-":
        line = sys.stdin.readline()
        if not line.strip():  # started ahead and never used
            return 0
        args.lab = line.strip()
        with open(log_path(args.lab), "ab") as log:
            os.dup2(log.fileno(), 2)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    agent = Agent(args.lab)
    agent.monitor = Monitor(args.lab)
    server = serve(agent, socket_path(args.lab))
    threads = [threading.Thread(target=agent.monitor.loop, args=(stopping,), name="monitor", daemon=True),
               threading.Thread(target=agent.gc_loop, args=(stopping, args.gc_poll), name="gc", daemon=True),
               threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="api", daemon=True)]
    for t in threads:
        t.start()
    if agent.view.config.policy != "never" and agent.view.topology.externals:
        from labkit.fqdn.proxy import MAX_DELAY, DnsProxies

        delay = args.tofqdns_proxy_response_max_delay
        if delay is None and os.environ.get("LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"):
            delay = float(os.environ["LABKIT_TOFQDNS_PROXY_RESPONSE_MAX_DELAY"])  # inherited from `labkit up`
        agent.dns_proxies = DnsProxies(agent, max_delay=MAX_DELAY if delay is None else delay)
        agent.dns_proxies.start(stopping)
        for ev in agent.dns_proxies.ready.values():
            ev.wait(5)
    print(f"labkit agent: lab {args.lab}, pid {os.getpid()}, {agent.restored['services']} services restored "
          f"from {agent.restored['source']} in {agent.restored['seconds']} s; API on {socket_path(args.lab)}",
          file=sys.stderr, flush=True)
    print("agent ready", flush=True)
    while not stopping.wait(0.5):
        if not all(t.is_alive() for t in threads):
            dead = [t.name for t in threads if not t.is_alive()]
            print(f"labkit agent: thread(s) {', '.join(dead)} ended; stopping", file=sys.stderr, flush=True)
            break
    server.shutdown()
    server.server_close()
    stopping.set()
    agent.services.maps.release()
    return 0
