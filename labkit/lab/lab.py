"""A running lab: bring the topology up, attach to it, reset it, take it down.

    >>> from labkit import Lab
    >>> lab = Lab.up("demo")                    # doctest: +SKIP
    >>> lab.pod("a1").exec("ping", "-c1", lab.pod("b1").ip).returncode   # doctest: +SKIP
    0
    >>> for row in lab.ct("node-a"): print(row)  # doctest: +SKIP
    >>> lab.down()                              # doctest: +SKIP

``Lab.up`` is idempotent: a healthy lab of that name with the same topology
and options is attached to; a broken or differently configured one is torn
down (by its ledger) and rebuilt. Every object created goes into the ledger
(:mod:`labkit.net.ledger`) first, so an error at any step leaves nothing behind.
"""
from __future__ import annotations

import ipaddress
import json
import os
import select
import signal
import subprocess
import sys
import time

from dataclasses import replace as _replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from labkit.agent import endpoints as agent
from labkit.agent.gc import LabGc, flush_address
from labkit.agent.kubeproxy import parse_conntrack
from labkit.agent.api import log_path, socket_path
from labkit.agent.client import AgentClient, AgentDownError, RemotePolicies, RemoteServices
from labkit.agent.identities import IdentityStore
from labkit.agent.identities import assign as assign_identities
from labkit.datapath.doctor import require_datapath
from labkit.datapath.source import MAP_NAMES
from labkit.errors import CleanupError
from labkit.lab.inventory import variants_of
from labkit.lab.members import Members, NodeHandle, PodHandle
from labkit.lab.standby import STANDBY
from labkit.lab.teardown import leftovers, remove_part, teardown
from labkit.maps.eps import EndpointInfo, EndpointKey, IpcacheKey, RemoteEndpointInfo
from labkit.net import build as _build
from labkit.net import netns as _netns
from labkit.net import pod_argv
from labkit.net.build import cgroup_root
from labkit.lab.traffic import PodClient, TcpConn, ping_step, raw_step, udp_step
from labkit.clock import LabClock, mono_seconds
from labkit.config import LAB_DIFFERENCES, DatapathConfig
from labkit.release import BEHAVIOURS
from labkit.errors import ConfigError, DatapathError, LabStateError, LabTimeoutError, NotFoundError
from labkit.net.ledger import (RUN_DIR, STATE_VERSION, LabLock, LabState, Ledger, lab_dir, mkdir_shared_parent,
                               process_start_time, wait_gone)
from labkit.maps.base import PinnedMap
from labkit.maps.config import AGENT_FAULTS, IMPLEMENTED_FAULTS, ConfigMaps, Fault, LabConfig, MonitorAggregation, TraceMode
from labkit.maps.ct import CT_MAPS, CtEntry, CtKey4, CtRow
from labkit.maps.nat import NAT_MAP, NatEntry, NatKey4, NatRow
from labkit.net.topology import Topology
from labkit.observe.evidence import JOURNAL, Snapshot
from labkit.observe.trace import EVENT_SIZE, EventLog

if TYPE_CHECKING:
    from labkit.datapath.loader import NodeLoader

__all__ = ["Lab", "PodHandle", "NodeHandle", "BPFFS_ROOT"]

BPFFS_ROOT = Path(os.environ.get("LABKIT_BPFFS_ROOT", "/sys/fs/bpf/labkit"))


class Lab(Members):
    """A lab that is up. Build with :meth:`up`, find with :meth:`attach`."""

    def __init__(self, name: str, topology: Topology, config: DatapathConfig, state: LabState):
        self.name = name
        self.topology = topology
        self.config = config
        self.state = state  #: what lab.json holds (pin directories, devices, cgroups, status, timings)
        self.clock = LabClock(self._read_clock_offset, self._write_clock_offset, self._clock_moved)
        self._clients: dict = {}
        self._watchers: list = []
        self._log: EventLog | None = None
        self._services = None
        self._policy = None

    def __repr__(self) -> str:
        return f"Lab({self.name!r}, routing={self.config.routing}, nodes={[n.name for n in self.topology.nodes]})"

    # -- life cycle -------------------------------------------------------------
    @classmethod
    def up(
        cls,
        name: str = "demo",
        *,
        routing: str | None = None,
        config: DatapathConfig | None = None,
        topology: Topology | None = None,
        owner: int = 0,
        owner_pid: int | None = None,
    ) -> "Lab":
        """Bring up lab ``name`` (the default lab unless ``topology`` is given).

        Options: ``routing`` ('tunnel' or 'native'), or a whole :class:`DatapathConfig`. ``owner`` is the uid
        the lab belongs to (labkitd passes the caller's; its run directory is readable by that user alone),
        ``owner_pid`` the process that asked for it (this one unless given).
        """
        config = config or DatapathConfig()
        if routing is not None:
            config = config.with_options(routing=routing)
        topology = topology or Topology.default(name)
        topology.validate()
        topology, _ = assign_identities(topology)  # the agent's allocator numbers label sets, not pods
        if topology.lab != name:
            raise LabStateError(f"lab '{name}': topology describes lab '{topology.lab}'; expected the same name")
        require_datapath()
        lock = LabLock(name, "labkit up").acquire()
        try:
            ledger = Ledger(name)
            if ledger.exists():
                existing = cls._existing(name, topology, config, owner)
                if existing is not None:
                    return existing
                teardown(ledger)
            lab = cls._build(name, topology, config, ledger, owner, owner_pid or os.getpid())
        finally:
            lock.release(remove=not Ledger(name).exists())
        return lab

    @classmethod
    def _existing(cls, name: str, topology: Topology, config: DatapathConfig, owner: int = 0) -> "Lab | None":
        try:
            state = LabState.read(name)
        except (LabStateError, ValueError, TypeError):
            return None
        if state.version != STATE_VERSION or state.status != "up" or state.owner_uid != owner:
            return None
        if state.topology != topology.to_dict() or state.config != config.to_dict():
            return None
        lab = cls(name, topology, config, state)
        problems = lab.health()
        if problems and all(p.startswith("process agent ") for p in problems):
            lab._restart_agent()  # the datapath is whole: a new agent restores the Services, as cilium-agent
            problems = lab.health()
        return lab if not problems else None

    @classmethod
    def _build(cls, name: str, topology: Topology, config: DatapathConfig, ledger: Ledger, owner: int = 0,
               owner_pid: int | None = None) -> "Lab":
        t0 = time.monotonic()
        ledger.start(owner)
        state = LabState(name, topology.to_dict(), config.to_dict(),
                         pin_dirs={n.name: str(BPFFS_ROOT / name / n.name) for n in topology.nodes},
                         owner_pid=owner_pid or os.getpid(), owner_uid=owner, created=time.time())
        state.write()
        IdentityStore(name).save(assign_identities(topology)[1])  # what the agent allocates from
        try:
            cls._realise(name, topology, config, ledger, state)
        except BaseException as exc:
            try:
                teardown(ledger)  # nothing half-built stays behind
            except Exception as cleanup:  # report both: what failed, and what could not be undone
                raise cleanup from exc
            raise
        state.status = "up"
        state.timings["up_seconds"] = round(time.monotonic() - t0, 3)
        state.write()
        return cls(name, topology, config, state)

    @classmethod
    def _realise(cls, name, topology, config, ledger, state) -> None:
        timings = state.timings
        t = time.monotonic()
        # started first: their imports overlap the network's creation (labkitd has them ready already)
        pending = STANDBY.loader(len(topology.nodes))
        agent_proc = STANDBY.agent()
        try:
            cgroups = cls._make_cgroups(name, topology, ledger)
            state.cgroups = cgroups
            net = _build.build_network(topology, config, ledger)
        except BaseException:
            pending.discard()
            agent_proc.kill()
            raise
        state.devices = {node: {str(k): v for k, v in devs.items()} for node, devs in net["devices"].items()}
        timings["network_seconds"] = round(time.monotonic() - t, 3)
        state.write()

        servers = _build.start_pod_servers(topology, ledger, cgroups)
        t = time.monotonic()
        zone_needed = config.policy != "never" and bool(topology.externals)
        agent_told = False
        try:
            loaders = cls._start_loaders(name, topology, config, ledger, state, pending)
        except BaseException:
            pending.discard()
            agent_proc.kill()
            raise
        try:
            for node, proc in loaders.items():
                cls._loader_until(proc, ledger, node, "pinned")
            for node, proc in loaders.items():
                pin_dir = state.pin_dirs[node]
                agent.program_node(topology, node, config.routing, pin_dir, net["endpoints"][node])
                ConfigMaps([pin_dir]).write(LabConfig.initial(MonitorAggregation.parse(config.monitor_aggregation)))
                proc.stdin.write("attach\n")
                proc.stdin.flush()
            if not zone_needed:  # the maps are pinned and programmed: the agent starts while the programs attach
                cls._start_agent(name, ledger, agent_proc, wait=False)
                agent_told = True
            keys = []
            for node, proc in loaders.items():
                done = cls._loader_until(proc, ledger, node, "done")
                timings[f"datapath_{node}_seconds"] = done.get("seconds")
                timings[f"datapath_{node}_load_seconds"] = done.get("compile_seconds")
                state.images[node] = done.get("image")
                keys.append(done.get("key"))
            STANDBY.learn(keys)  # the next loader started ahead loads these images while it waits
        except BaseException:
            # One node's loader failed: the others may have pinned and attached things the ledger has not read
            # yet. Stop them, then record every object they reported, so that teardown removes it too.
            if not agent_told:
                agent_proc.kill()  # never told its lab, so in no ledger
            for proc in loaders.values():
                if proc.poll() is None:
                    proc.kill()
                cls._record_rest(proc, ledger)
            raise
        finally:
            for proc in loaders.values():
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        timings["datapath_seconds"] = round(time.monotonic() - t, 3)
        state.write()
        if zone_needed:
            from labkit.fqdn import zone  # toFQDNs needs a DNS server and the nodes' proxy routing

            t = time.monotonic()
            try:
                zone.start(topology, ledger)
            except BaseException:
                agent_proc.kill()
                raise
            timings["dns_seconds"] = round(time.monotonic() - t, 3)
            cls._start_agent(name, ledger, agent_proc, wait=False)
        cls._agent_ready(name, agent_proc)
        cls._wait_servers(name, topology, servers)

    @staticmethod
    def _make_cgroups(name: str, topology: Topology, ledger: Ledger) -> dict[str, str]:
        root = cgroup_root()
        if root is None:
            return {}
        lab_cg = root / "labkit" / name
        ledger.record("cgroup", path=str(lab_cg))
        mkdir_shared_parent(lab_cg)
        out = {}
        for member in list(topology.nodes) + list(topology.pods):
            cg = lab_cg / member.name
            ledger.record("cgroup", path=str(cg))
            cg.mkdir()
            out[member.name] = str(cg)
        return out

    @staticmethod
    def _start_loaders(name, topology, config, ledger, state, pending=None) -> dict[str, NodeLoader]:
        lab_pins = BPFFS_ROOT / name
        ledger.record("pindir", path=str(lab_pins))
        mkdir_shared_parent(lab_pins)
        specs = {}
        for n in topology.nodes:
            pin_dir = Path(state.pin_dirs[n.name])
            ledger.record("pindir", path=str(pin_dir))
            pin_dir.mkdir()
            cgroups = state.cgroups
            sock_cgroups = []  # where socket LB applies: the node's own processes, and with "full" its pods
            if config.socket_lb != "off" and n.name in cgroups:
                sock_cgroups.append(cgroups[n.name])
                if config.socket_lb == "full":
                    sock_cgroups += [cgroups[p.name] for p in topology.pods_on(n.name)]
            specs[n.name] = {"topology": topology.to_dict(), "config": config.to_dict(), "node": n.name,
                             "pin_dir": str(pin_dir), "cgroups": sock_cgroups}
            if config.sockmap == "on":  # sock_ops sees a socket through the cgroup of the process that made it
                if not cgroups:
                    raise DatapathError(f"lab '{name}': --sockmap on needs cgroup v2 (the pods' cgroups carry the "
                                        f"sock_ops program), got no cgroup2 mount")
                specs[n.name]["pod_cgroups"] = [cgroups[p.name] for p in topology.pods_on(n.name)]
        if pending is None:
            pending = STANDBY.loader(len(specs))
        return pending.go(specs)  # one process, a child per node: the imports are paid once

    @staticmethod
    def _record_rest(proc: NodeLoader, ledger: Ledger) -> None:
        """Record the objects a stopped loader reported and nobody has read yet."""
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "created" in msg:
                ledger.record(**msg["created"])

    @staticmethod
    def _loader_until(proc: NodeLoader, ledger: Ledger, node: str, until: str) -> dict:
        while True:
            line = proc.stdout.readline()
            if not line:
                proc.wait()
                raise DatapathError(f"node '{node}': datapath loader exited before '{until}'\n{_stderr_tail(proc)}")
            msg = json.loads(line)
            if "created" in msg:
                ledger.record(**msg["created"])
            elif "error" in msg:
                proc.kill()
                proc.wait()
                raise DatapathError(f"{msg['error']}\n{_stderr_tail(proc)}")
            elif until in msg:
                return msg[until] if isinstance(msg[until], dict) else msg

    @staticmethod
    def _start_agent(name: str, ledger: Ledger, proc: subprocess.Popen | None = None, wait: bool = True,
                     timeout: float = 60.0) -> subprocess.Popen:
        """The lab's agent process (:mod:`labkit.agent.daemon`: Services, monitor, GC timer, API): ``proc``, one
        started ahead and waiting for its lab's name (:mod:`labkit.lab.standby`), or a new one. With ``wait``,
        returns once it answers on its socket. Everything it creates is in the ledger before it exists."""
        recorded = {e.get("path") for e in ledger.entries("file")}
        for path in (socket_path(name), log_path(name), lab_dir(name) / "events.bin", lab_dir(name) / "monitor.pos",
                     lab_dir(name) / "hubble.ring"):
            if str(path) not in recorded:
                ledger.record("file", path=str(path))
        if proc is None:
            proc = subprocess.Popen([sys.executable, "-m", "labkit", "agent", "--lab", name],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(log_path(name), "ab"),
                                    start_new_session=True)
            ledger.record_process("agent", proc.pid)
        else:
            ledger.record_process("agent", proc.pid)
            proc.stdin.write(f"{name}\n".encode())
            proc.stdin.close()
        if wait:
            Lab._agent_ready(name, proc, timeout)
        return proc

    @staticmethod
    def _agent_ready(name: str, proc: subprocess.Popen, timeout: float = 60.0) -> int:
        """Wait until the agent says it serves; its pid."""
        ready = select.select([proc.stdout], [], [], timeout)[0] and proc.stdout.readline().strip() == b"agent ready"
        proc.stdout.close()
        if not ready:
            proc.kill()
            proc.wait()
            tail = log_path(name).read_text()[-2000:] if log_path(name).exists() else ""
            raise DatapathError(f"lab '{name}': the agent did not start within {timeout} s "
                                f"(its log, {log_path(name)}):\n{tail}")
        return proc.pid

    @staticmethod
    def _wait_servers(name: str, topology: Topology, servers: dict[str, subprocess.Popen], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        for pod in topology.pods:
            log = lab_dir(name) / "pods" / f"{pod.name}.log"
            while "listening" not in log.read_text():
                if servers[pod.name].poll() is not None:
                    err = (lab_dir(name) / "pods" / f"{pod.name}.err").read_text()
                    raise LabStateError(f"pod '{pod.name}': server exited ({servers[pod.name].returncode}): {err[-2000:]}")
                if time.monotonic() > deadline:
                    raise LabTimeoutError(f"pod '{pod.name}': server not listening after {timeout} s")
                time.sleep(0.01)

    @classmethod
    def attach(cls, name: str = "demo") -> "Lab":
        """The running lab ``name``; LabStateError if it is not up."""
        ledger = Ledger(name)
        if not ledger.exists():
            raise NotFoundError(f"lab '{name}' is not up (no ledger in {lab_dir(name)}); start it with `labkit --lab {name} up`")
        state = LabState.read(name)
        if state.status != "up":
            raise LabStateError(
                f"lab '{name}' is {state.status!r}, expected 'up'; `labkit --lab {name} up` rebuilds it"
            )
        return cls(name, Topology.from_dict(state.topology), DatapathConfig.from_dict(state.config), state)

    def down(self) -> None:
        """Remove everything the ledger recorded, then check nothing of the lab is left."""
        self._close_clients()
        for table in self._watchers:
            table.stop()
        type(self).cleanup(self.name)

    # -- steps ----------------------------------------------------------------
    def address_of(self, target: str, outside: bool = False) -> str:
        """The address of a pod, node, external client or Service by name; an address passes through.

        A Service is its ClusterIP, or with ``outside`` (the client is the external one) its
        LoadBalancer VIP: a ClusterIP is not reachable from outside the cluster."""
        try:
            return str(ipaddress.IPv4Address(target))
        except ValueError:
            pass
        if target not in self.topology.names():
            for svc in self.services.list():
                if svc.name == target and not outside:
                    return svc.vip
                if svc.name == target:
                    if svc.lb_vip:
                        return svc.lb_vip
                    raise ConfigError(f"service '{target}' is a {svc.type} service: from outside it has no "
                                      f"LoadBalancer VIP; expected a node name with its node port {svc.node_port}"
                                      if svc.node_port else
                                      f"service '{target}' is a ClusterIP service, not reachable from outside; "
                                      f"expected a NodePort or LoadBalancer service")
        kind = self.topology.kind_of(target)
        if kind == "pod":
            return self.topology.pod(target).ip
        if kind == "node":
            return self.topology.node(target).ip
        return self.topology.external(target).ip

    def is_direct(self, address: str, port: int, protocol: str = "TCP") -> bool:
        """True if a connection to address:port reaches that address itself: it belongs to a pod,
        node or external client and is not a Service frontend (a NodePort on a node address is one)."""
        if self.topology.owner_of(address) is None:
            return False
        for svc in self.services.list():
            for fe in getattr(svc, "frontends", ()):
                if (fe.address, fe.port) == (address, port) and svc.protocol == protocol:
                    return False
        return True

    def podclient(self, pod: str) -> PodClient:
        """The :mod:`labkit.net.podclient` process of ``pod`` (started on first use)."""
        client = self._clients.get(pod)
        if client is None or client.proc.poll() is not None:
            proc = self.popen(pod, pod_argv("podclient"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
            Ledger(self.name).record_process(f"podclient-{pod}", proc.pid, netns=self.topology.netns(pod))
            client = self._clients[pod] = PodClient(proc)
        return client

    def _close_clients(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def step_events(self) -> EventLog:
        """The lab's trace, read on from where the last step stopped."""
        if self._log is None:
            self._log = self.events()
        return self._log

    def fault(self, name: str, on: bool = True) -> list[str]:
        """Switch a break-it fault on or off (on every node's datapath, or in the agent); returns the faults
        now on. ``labkit fault list`` names them all; ``labkit status`` always lists those on.

            >>> lab.fault("wrong-lifetime")   # doctest: +SKIP
            ['wrong-lifetime']
        """
        if name in AGENT_FAULTS:
            path = lab_dir(self.name) / "faults.json"
            agent = set(self.agent_faults())
            agent = agent | {name} if on else agent - {name}
            if not path.exists():
                Ledger(self.name).record("file", path=str(path))
            path.write_text(json.dumps(sorted(agent)))
            now_on = self.faults()
            JOURNAL.record(self.name, "fault", f"fault {name} {'on' if on else 'off'}", tuple(now_on), fault=name,
                           on=on)
            return now_on
        try:
            bit = Fault.parse(name)
        except ValueError:
            known = ", ".join(Fault.names(sum(Fault)) + sorted(AGENT_FAULTS))
            raise ConfigError(f"fault '{name}': expected one of {known}") from None
        if not bit & IMPLEMENTED_FAULTS:
            raise ConfigError(f"fault '{name}': not acted on by this datapath yet; expected one of "
                              f"{', '.join(Fault.names(IMPLEMENTED_FAULTS))}")
        self._config.update(faults=lambda faults: (faults | bit) if on else (faults & ~bit))
        now_on = self.faults()
        JOURNAL.record(self.name, "fault", f"fault {name} {'on' if on else 'off'}", tuple(now_on), fault=name, on=on)
        return now_on

    @classmethod
    def cleanup(cls, name: str) -> list[str]:
        """Tear down lab ``name`` from its ledger (also when the process that built it died).

        Returns what was removed, by kind; CleanupError if anything remains.
        """
        lock = LabLock(name, "labkit down").acquire()
        removed = []
        try:
            ledger = Ledger(name)
            entries = ledger.entries()
            try:
                topo = Topology.from_dict(LabState.read(name).topology)
                expected = topo.all_netns()
            except (LabStateError, ValueError, KeyError):
                expected = []
            if entries:
                teardown(ledger)
                removed = [e["kind"] for e in entries]
            left = leftovers([], expected)
            if left:
                hint = "; remove by hand with `ip netns del <name>` after checking nothing else uses it"
                raise CleanupError(f"lab '{name}': still present after teardown (not in its ledger): {'; '.join(left)}{hint}")
            _remove_shared_parents()
        finally:
            lock.release(remove=True)
        try:
            if RUN_DIR.exists() and not any(RUN_DIR.iterdir()):
                RUN_DIR.rmdir()
        except OSError:
            pass
        return removed

    def delete_pod(self, name: str) -> dict:
        """Delete pod ``name`` as Kubernetes and Cilium would: its Service endpoints go, the agent removes its
        endpoint and ipcache entries and its policy map, every CT and NAT entry naming its address is deleted on every node
        (Cilium's GC of a removed endpoint), and its server, namespace, veth and cgroup are removed.
        Returns what went. ``labkit up`` (or ``start()`` in a notebook) brings the default lab back whole.

            >>> lab.delete_pod("b2")    # doctest: +SKIP
            {'pod': 'b2', 'ip': '198.18.2.12', 'backends': ['web/b2:8080'], 'ct': {'node-a': 3, 'node-b': 6}, ...}
        """
        pod = self.topology.pod(name)
        backends = []
        for svc in self.services.list():
            for b in svc.backends:
                if b.pod == name:
                    self.services.remove_backend(svc.name, b.ref)
                    backends.append(f"{svc.name}/{b.ref}")
        with PinnedMap(f"{self.pin_dir(pod.node)}/cilium_lxc", EndpointKey, EndpointInfo) as lxc:
            lxc.delete(EndpointKey.for_ip(pod.ip))
        for node in self.topology.nodes:
            with PinnedMap(f"{self.pin_dir(node.name)}/cilium_ipcache", IpcacheKey, RemoteEndpointInfo) as ipc:
                ipc.delete(IpcacheKey.for_ip(pod.ip))
        client = self._clients.pop(name, None)
        if client is not None:
            client.close()
        netns, veth = self.topology.netns(name), self.topology.host_veth(name)
        cgroup = self.state.cgroups.get(name)
        logs = {str(lab_dir(self.name) / "pods" / f"{name}.{ext}") for ext in ("log", "err")}

        def of_pod(e: dict) -> bool:
            return (e.get("netns") == netns and e["kind"] == "process") or e.get("name") == netns \
                or (e["kind"] in ("tc-filter", "qdisc") and e.get("ifname") == veth) \
                or (cgroup is not None and cgroup in (e.get("path"), e.get("cgroup"))) or e.get("path") in logs

        removed = remove_part(Ledger(self.name), of_pod)
        flushed = {"ct": {}, "nat": {}}
        for node in self.topology.nodes:  # after the pod is gone: nothing can recreate its entries
            ct, nat = flush_address(self.pin_dir(node.name), pod.ip)
            flushed["ct"][node.name], flushed["nat"][node.name] = ct, nat
        self.topology = _replace(self.topology, pods=tuple(p for p in self.topology.pods if p.name != name))
        self.state.topology = self.topology.to_dict()
        self.state.cgroups.pop(name, None)
        self.state.write()
        self._services = None  # the agent's next call sees the topology without the pod
        self.policy.sync()  # ... this one: the pod's policy map goes, as Cilium's endpoint deletion removes it
        self.note_change()
        return {"pod": name, "ip": pod.ip, "backends": backends, **flushed, "removed": len(removed)}

    def flush_ct(self, node: str | None = None) -> int:
        """Empty the CT maps of ``node`` (default: every node), as if their entries had all been
        collected; Services and NAT entries stay. Returns how many rows were deleted."""
        deleted = self._clear_ct([node] if node is not None else [n.name for n in self.topology.nodes])
        self.note_change()
        return deleted

    def _clear_ct(self, nodes) -> int:
        deleted = 0
        for name in nodes:
            for map_name in CT_MAPS:
                with PinnedMap(f"{self.pin_dir(name)}/{map_name}", CtKey4, CtEntry) as m:
                    deleted += m.clear()
        return deleted

    def reset(self) -> None:
        """Remove every Service and network policy, flush CT and NAT state, switch faults off, set the lab clock
        back and start the GC's interval afresh; topology kept."""
        self.services.flush()
        self.policy.flush()
        self._clear_ct(n.name for n in self.topology.nodes)
        for node in self.topology.nodes:
            pin = self.pin_dir(node.name)
            with PinnedMap(f"{pin}/{NAT_MAP}", NatKey4, NatEntry) as m:
                m.clear()
        level = self._config.read().monitor_aggregation  # the lab's level stays, as on a node
        self._config.write(LabConfig.initial(level))
        (lab_dir(self.name) / "faults.json").unlink(missing_ok=True)  # the agent's faults off too
        self.gc.restart()  # on the clock as it is now set back
        self._mark_trace_epoch()
        JOURNAL.reset(self.name)  # nothing before a reset is evidence
        self.note_change()  # live tables show the flush

    def snapshot(self, title: str, lb: bool = False, extra=None, conntrack: str | None = None,
                 iptables: str | None = None, service: str | None = None) -> Snapshot:
        """Every node's CT and NAT rows now (with ``lb`` its Service maps; with ``conntrack`` or ``iptables`` that
        node's Linux conntrack rows or nat table; with ``service`` that Service as the agent holds it), recorded as
        evidence under ``title`` for the checks; ``extra`` is the cell's own note, kept and never graded.

            >>> after = lab.snapshot("after the clock moved")   # doctest: +SKIP
            >>> [r.line() for r in after.rows("node-a")]         # doctest: +SKIP
        """
        nodes = [n.name for n in self.topology.nodes]
        snap = Snapshot(title, self.clock.now(), {n: self.ct(n) for n in nodes}, {n: self.nat(n) for n in nodes},
                        {n: self.services.lb(n) for n in nodes} if lb else {}, extra,
                        tuple(self.conntrack(conntrack)) if conntrack else (),
                        self.services.iptables(iptables) if iptables else "",
                        self.services.get(service) if service else None)
        JOURNAL.record(self.name, "snapshot", title, snap)
        return snap

    def _clock_moved(self, seconds: int, now: int) -> None:
        JOURNAL.record(self.name, "clock", f"clock advanced {seconds} s", now, seconds=seconds, now=now)

    def _mark_trace_epoch(self) -> None:
        """Remember where the trace stands now: readers of the lab's trace start here (``events()``)."""
        events = lab_dir(self.name) / "events.bin"
        try:
            size = events.stat().st_size
        except FileNotFoundError:
            size = 0
        path = lab_dir(self.name) / "trace.epoch"
        if not path.exists():
            Ledger(self.name).record("file", path=str(path))
        path.write_text(json.dumps({"offset": size - size % EVENT_SIZE,
                                    "inode": events.stat().st_ino if events.exists() else None}))

    def health(self) -> list[str]:
        """What is wrong with this lab (empty when healthy)."""
        problems = []
        entries = Ledger(self.name).entries()
        for node in self.topology.nodes:  # a lab built by an older labkit may lack a map this one needs
            pin = self.state.pin_dirs[node.name]
            problems += [f"pinned map {pin}/{m} is missing" for m in MAP_NAMES if not os.path.exists(f"{pin}/{m}")]
        for e in entries:
            if e["kind"] == "netns" and not _netns.exists(e["name"]):
                problems.append(f"network namespace {e['name']} is gone")
            elif e["kind"] == "pin" and not os.path.exists(e["path"]):
                problems.append(f"pinned map {e['path']} is gone")
        # Pod clients belong to the notebook or script that started them and end with it.
        # A restarted agent is a new entry of the same name: only the newest of each name counts.
        newest = {e["name"]: e for e in entries if e["kind"] == "process" and not e["name"].startswith("podclient-")}
        lasting = list(newest.values())
        alive = set(leftovers(lasting))
        for e in lasting:
            if f"process {e['name']} (pid {e['pid']})" not in alive:
                problems.append(f"process {e['name']} (pid {e['pid']}) has exited")
        return problems

    # -- the agent ---------------------------------------------------------------
    def agent_status(self) -> dict:
        """The agent's ``/v1/healthz`` answer, or ``{"status": "down", …}`` if it does not answer
        (``labkit agent status``)."""
        entry = ([e for e in Ledger(self.name).entries("process") if e["name"] == "agent"] or [None])[-1]
        try:
            return AgentClient(self.name, timeout=10).healthz()
        except AgentDownError as exc:
            return {"status": "down", "lab": self.name, "pid": entry and entry["pid"], "error": str(exc)}

    def restart_agent(self, timeout: float = 10.0) -> dict:
        """Stop the lab's agent if it runs (SIGTERM, then SIGKILL after ``timeout`` s), start a new one and
        return its status: it restores the Services from the journal and the pinned maps (``labkit agent
        restart``). The datapath keeps working throughout."""
        lock = LabLock(self.name, "labkit agent restart").acquire()
        try:
            self._restart_agent(timeout)
        finally:
            lock.release()
        return self.agent_status()

    def _restart_agent(self, timeout: float = 10.0) -> None:
        """:meth:`restart_agent` for a caller that holds the lab's lock (``up``)."""
        ledger = Ledger(self.name)
        for e in ledger.entries("process"):
            if e["name"] == "agent" and process_start_time(e["pid"]) == e.get("start"):
                os.kill(e["pid"], signal.SIGTERM)
                if not wait_gone(e["pid"], e.get("start"), timeout):
                    os.kill(e["pid"], signal.SIGKILL)
                    wait_gone(e["pid"], e.get("start"), timeout)
        ledger.forget(lambda e: e["kind"] == "process" and e["name"] == "agent"
                      and process_start_time(e["pid"]) != e.get("start"))
        self._start_agent(self.name, ledger)
        for remote in (self._services, self._policy):
            if remote is not None:
                remote.client.close()

    # -- members ---------------------------------------------------------------
    def tcp(self, member: str, target: str, port: int = 8080, sport: int | None = None) -> TcpConn:
        """A TCP connection from pod or external client ``member`` to ``target``, not yet open
        (``lab.pod("a1").tcp("b1", 8080)``)."""
        return TcpConn(self, member, target, port, sport)

    def ping(self, pod: str, target: str, count: int = 1):
        """``pod`` pings ``target``: a Step."""
        return ping_step(self, pod, target, count)

    def udp(self, member: str, target: str, port: int = 8080, data: bytes = b"hello", sport: int | None = None):
        """One UDP datagram from ``member`` to ``target`` and its answer: a Step."""
        return udp_step(self, member, target, port, data, sport)

    def send(self, member: str, packet, title: str | None = None):
        """One crafted IPv4 packet (scapy or bytes) sent from ``member``: a Step."""
        return raw_step(self, member, packet, title)

    def server_log(self, pod: str) -> list[str]:
        """Lines pod ``pod``'s server logged (what it saw of its clients)."""
        self.topology.pod(pod)
        path = lab_dir(self.name) / "pods" / f"{pod}.log"
        return path.read_text().splitlines() if path.exists() else []

    def exec(self, name: str, argv: Sequence[str], timeout: float = 30, check: bool = False, **kw):
        """Run ``argv`` in the namespace (and for pods the cgroup) of ``name``."""
        netns = self.topology.netns(name)
        cgroup = self.state.cgroups.get(name)
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(
            list(argv), preexec_fn=_netns.preexec(netns, cgroup, new_session=False), timeout=timeout, check=check, **kw
        )

    def popen(self, name: str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start ``argv`` in ``name`` without waiting."""
        netns = self.topology.netns(name)
        cgroup = self.state.cgroups.get(name)
        return subprocess.Popen(list(argv), preexec_fn=_netns.preexec(netns, cgroup, new_session=False), **kw)

    # -- maps -------------------------------------------------------------------
    @property
    def gc(self):
        """The lab's CT garbage collector (:class:`labkit.agent.gc.LabGc`): ``run()``, ``state()``, ``history()``."""
        return LabGc(self)

    @property
    def services(self):
        """The lab's Services (:class:`labkit.agent.services.Services`): add, remove, list, ``lb(node)``.

        The lab's agent (:mod:`labkit.agent.daemon`) holds them and writes the maps; this is its client
        (:class:`labkit.agent.client.RemoteServices`), so every process attached to the lab sees the same
        services.
        """
        if self._services is None:
            self._services = RemoteServices(self)
        return self._services

    @property
    def policy(self) -> RemotePolicies:
        """The lab's network policies (:class:`labkit.agent.client.RemotePolicies`), kept by its agent:
        ``apply(yaml_text_or_dict)``, ``delete(name)``, ``list()``, ``get("a1")`` (the pod's pinned policy
        map in ``cilium-dbg bpf policy get`` grammar), ``identities()``."""
        if self._policy is None:
            self._policy = RemotePolicies(self)
        return self._policy

    def ct(self, node: str) -> list[CtRow]:
        """Every row of ``node``'s two CT maps, TCP map first."""
        pin = self.pin_dir(node)
        rows = []
        for map_name in CT_MAPS:
            with PinnedMap(f"{pin}/{map_name}", CtKey4, CtEntry) as m:
                rows += [CtRow.of(k, v, map_name, self.config.cilium) for k, v in m.items()]
        return rows

    def ct_command(self, node: str) -> list[str]:
        """The real commands that show the same rows."""
        return [f"bpftool map dump pinned {self.pin_dir(node)}/{m}" for m in CT_MAPS]

    def nat(self, node: str) -> list[NatRow]:
        """Every row of ``node``'s NAT map, ``cilium_snat_v4_external`` (empty until the datapath uses it)."""
        now = self.clock.now()
        with PinnedMap(f"{self.pin_dir(node)}/{NAT_MAP}", NatKey4, NatEntry) as m:
            return [NatRow.of(k, v, now) for k, v in m.items()]

    def conntrack(self, node: str) -> list:
        """Linux conntrack rows of ``node``'s namespace (``conntrack -L`` there): what kube-proxy's iptables mode
        relies on, beside the BPF CT rows of :meth:`ct`. (:class:`labkit.agent.kubeproxy.ConntrackRow`)"""
        self.topology.node(node)
        return parse_conntrack(self.exec(node, ["conntrack", "-L"], check=True).stdout)

    def conntrack_command(self, node: str) -> list[str]:
        """The real commands behind :meth:`conntrack` and the nat table of iptables mode."""
        ns = self.topology.netns(node)
        return [f"ip netns exec {ns} conntrack -L", f"ip netns exec {ns} iptables-save -t nat"]

    def nat_command(self, node: str) -> list[str]:
        """The real command that shows the same rows."""
        return [f"bpftool map dump pinned {self.pin_dir(node)}/{NAT_MAP}"]

    @property
    def _config(self) -> ConfigMaps:
        """Every node's ``labkit_config`` entry: clock offset, faults, trace mode."""
        return ConfigMaps(self.pin_dir(n.name) for n in self.topology.nodes)

    def _read_clock_offset(self) -> int:
        return self._config.read().clock_offset

    def _write_clock_offset(self, offset: int) -> None:
        self._config.update(clock_offset=offset)

    def trace_mode(self, mode: str | None = None) -> str:
        """Which packets the hooks report: ``'all'`` (the default), ``'drops'`` or ``'none'``
        (measurements without the monitor's cost). Sets it on every node when given; returns it."""
        if mode is not None:
            try:
                value = TraceMode[str(mode).upper()]
            except KeyError:
                raise ConfigError(f"trace mode {mode!r}: expected one of all, drops, none") from None
            self._config.update(trace_mode=value)
        return TraceMode(self._config.read().trace_mode).name.lower()

    def monitor_aggregation(self, level: "str | int | None" = None) -> str:
        """The monitor aggregation level: which trace records count as reported (Cilium's
        ``--monitor-aggregation``: none, lowest, low, medium, maximum). Sets it on every node when given,
        without rebuilding the programs; returns it. Every record still reaches ``labkit trace``.

            >>> lab.monitor_aggregation("none")   # doctest: +SKIP
            'none'
        """
        if level is not None:
            try:
                value = MonitorAggregation.parse(level)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            self._config.update(monitor_aggregation=int(value))
        return MonitorAggregation(self._config.read().monitor_aggregation).label

    def _agent_summary(self) -> str:
        st = self.agent_status()
        if st.get("status") != "ok":
            return f"down (pid {st.get('pid')}); `labkit --lab {self.name} agent restart` starts it"
        return f"pid {st['pid']}, {st['services']} services, up {st['uptime_s']:.0f} s (`labkit agent status`)"

    def _gc_summary(self) -> str:
        st = self.gc.state()
        last = "never run" if st["last_run"] is None else f"last run at lab clock {st['last_run']}"
        return f"timer {'on' if st['timer'] else 'off'}, interval {st['interval']} s, {last}"

    def faults(self) -> list[str]:
        """Names of the break-it faults switched on: the datapath's, then the agent's."""
        return Fault.names(self._config.read().faults) + self.agent_faults()

    def agent_faults(self) -> list[str]:
        """The agent's faults switched on (:data:`labkit.maps.config.AGENT_FAULTS`), read afresh each time: the
        lab's other processes (its GC) switch with it."""
        try:
            return sorted(json.loads((lab_dir(self.name) / "faults.json").read_text()))
        except (FileNotFoundError, ValueError):
            return []

    def events(self) -> EventLog:
        """Reader of this lab's trace records, from the last reset on (its trace epoch): what came before
        belongs to an earlier use of the lab."""
        nodes = {n.node_id: n.name for n in self.topology.nodes}
        devices = {node: {int(k): v for k, v in devs.items()} for node, devs in self.state.devices.items()}
        log = EventLog(lab_dir(self.name) / "events.bin", nodes, devices)
        try:
            epoch = json.loads((lab_dir(self.name) / "trace.epoch").read_text())
        except (FileNotFoundError, ValueError):
            return log
        log.start_at(epoch["offset"], epoch.get("inode"))
        return log

    def status(self) -> dict:
        """Nodes, pods and externals with addresses, datapath options, clock, faults, the variant labs
        beside it (:func:`labkit.lab.inventory.variants_of`)."""
        return {
            "lab": self.name,
            "status": self.state.status,
            "routing": self.config.routing,
            "socket_lb": self.config.socket_lb,
            "datapath": self.config.to_dict(),
            "clock": {"now": self.clock.now(), "offset": self.clock.offset, "mono": mono_seconds()},
            "faults": self.faults(),
            "monitor_aggregation": self.monitor_aggregation(),
            "agent": self._agent_summary(),
            "gc": self._gc_summary(),
            "variants": [v.to_dict() for v in variants_of(self.name)],
            "nodes": [
                {"name": n.name, "ip": n.ip, "pod_cidr": n.pod_cidr, "router_ip": n.router_ip,
                 "netns": self.topology.netns(n.name), "pins": self.pin_dir(n.name)}
                for n in self.topology.nodes
            ],
            "pods": [
                {"name": p.name, "node": p.node, "ip": p.ip, "identity": p.identity, "labels": dict(p.labels),
                 "netns": self.topology.netns(p.name), "host_veth": self.topology.host_veth(p.name)}
                for p in self.topology.pods
            ],
            "externals": [{"name": e.name, "ip": e.ip, "netns": self.topology.netns(e.name)}
                          for e in self.topology.externals],
            "cilium": {"release": self.config.cilium, "behaviours": [
                {"name": b.name, "since": b.since, "change": b.change, "what": b.what,
                 "on": b.in_release(self.config.cilium)} for b in BEHAVIOURS]},
            "lab_differences": list(LAB_DIFFERENCES),
            "health": self.health(),
        }


def _stderr_tail(proc: NodeLoader, size: int = 4000) -> str:
    """The last ``size`` characters a loader wrote to its stderr file."""
    errfile = getattr(proc, "errfile", None)
    if errfile is None:
        return ""
    errfile.seek(0)
    return errfile.read()[-size:]


def _remove_shared_parents() -> None:
    """Remove the parents all labs share (pins, cgroups) once no lab uses them."""
    cg = cgroup_root()
    for parent, in_use in (
        (BPFFS_ROOT, lambda p: any(p.iterdir())),
        (cg / "labkit" if cg else None, lambda p: any(c.is_dir() for c in p.iterdir())),
    ):
        try:
            if parent is not None and parent.exists() and not in_use(parent):
                parent.rmdir()
        except OSError:
            pass
