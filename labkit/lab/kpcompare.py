"""kube-proxy's iptables mode against labkit's eBPF agent, measured side by side on one machine.

At each size n two labs are up at once (native routing, tracing off unless asked, the CT GC timer off):
an iptables-mode lab whose node-a nat table holds n services as a kube-proxy full sync writes them, and
an eBPF lab whose agent holds the same n services in its own state (added by ``lab.services.apply``, so
its maps are what the agent wrote, never rows written behind it). The services are ``s00000``… on
ClusterIPs from 198.19.1.1, port 80, one endpoint b1:8080 (pod b1 on node-b); kube-proxy orders
KUBE-SERVICES by service port name, so ``s<n-1>`` is the last service rule (rule n of n + 1: the NodePorts
jump comes after it).

What is measured, each figure the median of ``rounds`` (>= 5) samples:

* **add one endpoint** (b2:8080 to the last service): iptables full sync (a flushing ``iptables-restore``
  of the whole nat table, rendered beforehand: :func:`labkit.agent.kubeproxy.nat_table`), iptables partial
  sync (``iptables-restore --noflush --counters`` of what kube-proxy >= 1.27 writes:
  :func:`labkit.agent.kubeproxy.partial_table`; above 1,000 endpoints both are rendered as kube-proxy's
  large cluster mode writes them, without comments in the service chains), and one
  ``lab.services.add_backend`` with all n services
  in the agent. Each sample is one add; the state is put back, untimed, before the next. At each size the
  partial restore is checked on the kernel: ``iptables-save -t nat`` after it equals ``iptables-save -t nat``
  after the full restore (counters stripped, chain by chain). Also timed: ``iptables-save -t nat`` itself,
  which kube-proxy runs on each sync to find stale chains (below 1,000 endpoints; above, at most once per
  sync period).
* **first packet**: connect() (SYN out, SYN-ACK back) from a1's network namespace to the last service
  (worst case: the whole KUBE-SERVICES chain is walked) and to one at a random position (typical; the
  position is in the result), one client process taking turns between the four targets so all see the
  same machine; a sample is the median of ``connects`` connects per target.
* **the stall**: a client in a1's namespace opening connections back to back (connect, close with RST) to
  the typical service while (a) the iptables full restore with one endpoint changed runs, (b) the partial
  restore of the same change runs, (c) the eBPF agent adds the same endpoint; and while nothing changes,
  in each lab, for as long as the median full restore took, at most 0.5 s (the baseline). Connects whose
  [start, end] overlaps the change's window are counted; p50, p99 and max are over all of them across the
  rounds. (The connect in progress when a window opens is length-biased, more likely a slow one; in a window
  of a few ms, as the agent call's, it is a large share of the few connects.)

``compare_service_modes`` (and ``ServiceModes.result``) returns a dict (sizes are int keys; ``json`` makes
them strings)::

    sizes                 the sizes measured, ascending
    conditions            routing, tracing, rounds, connects per first-packet sample, client, endpoint,
                          kernel, cpus, how the eBPF side was loaded
    iptables[n]           rules (nat rules of the full table), full_lines / partial_lines (restore input
                          lines), add_endpoint_s (full), add_endpoint_partial_s, save_nat_s,
                          partial_equals_full (bool), partial_diff (first differences, empty when equal),
                          first_packet_s (worst), first_packet_typical_s, samples {same keys: lists}
    ebpf[n]               services_in_agent, load_s (the apply call that added this size's new services),
                          add_endpoint_s,
                          first_packet_s (worst), first_packet_typical_s, samples
    positions[n]          {"worst": rule number of the last service, "typical": rule number of the
                          random one} in KUBE-SERVICES (1-based), and the two services' names
    stall[n]              (at the sizes of ``stall_sizes``) {iptables_full, iptables_partial, ebpf, baseline_iptables, baseline_ebpf}: each
                          window_s (median), connects (total in the windows), connects_per_window (median),
                          p50_s, p99_s, max_s, rounds
    growth_sizes, ebpf_growth, iptables_growth
                          worst-case first packet at the largest size <= 10,000 over the smallest
"""
from __future__ import annotations

import ipaddress
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace

from labkit.agent.kubeproxy import chains_in, diff_tables, nat_table, partial_table, restore, restore_noflush
from labkit.agent.kubeproxy.sync import NetnsIptables
from labkit.agent.services import Backend, Service
from labkit.config import DatapathConfig
from labkit.errors import DatapathError
from labkit.lab import Lab

__all__ = ["compare_service_modes", "ServiceModes", "service_specs", "synthetic_services", "ROUNDS", "CONNECTS", "ENDPOINT"]

#: Samples behind every figure.
ROUNDS = 5
#: connect() calls per target in one first-packet sample.
CONNECTS = 200
#: The endpoint every "add one endpoint" adds (pod b2 on node-b).
ENDPOINT = "b2:8080"
_BASE_VIP = int(ipaddress.IPv4Address("198.19.1.1"))
_NAME_WIDTH = 5  # s00000 ... s99999: name order is index order, as KUBE-SERVICES sorts by name
_STEPS_PER_SIZE = 4
#: the longest window of the stall's baseline (nothing changing): the median full restore's, up to this
BASELINE_MAX_S = 0.5


def service_specs(n: int, start: int = 0) -> list[dict]:
    """Services ``start`` .. ``n - 1`` as specs for ``lab.services.apply`` (``add``'s keywords): one endpoint
    b1:8080 each, ClusterIPs from 198.19.1.1.

    >>> service_specs(2)
    [{'name': 's00000', 'port': 80, 'vip': '198.19.1.1', 'backends': ['b1:8080']}, \
{'name': 's00001', 'port': 80, 'vip': '198.19.1.2', 'backends': ['b1:8080']}]
    """
    return [{"name": f"s{i:0{_NAME_WIDTH}d}", "port": 80, "vip": str(ipaddress.IPv4Address(_BASE_VIP + i)),
             "backends": ["b1:8080"]} for i in range(start, n)]


def synthetic_services(n: int) -> list[Service]:
    """The same ``n`` services as :func:`service_specs`, as Service objects (ids 1..n) for rendering.

    >>> [(s.name, s.vip, s.id) for s in synthetic_services(2)]
    [('s00000', '198.19.1.1', 1), ('s00001', '198.19.1.2', 2)]
    """
    return [Service(s["name"], s["vip"], s["port"], "TCP", (Backend("b1", 8080),), id=i + 1)
            for i, s in enumerate(service_specs(n))]


def _apply(services, specs: list[dict]) -> None:
    """Add ``specs`` to the agent's own state in one agent call (``lab.services.apply``), and check it added
    every one (none was there before)."""
    added = services.apply(specs)["added"]
    if len(added) != len(specs):
        raise DatapathError(f"lab '{services.lab}': expected apply to add {len(specs)} services, it added "
                            f"{len(added)}")


def _grown(services: list, name: str) -> list:
    """``services`` with ENDPOINT added to service ``name``."""
    extra = Backend.parse(ENDPOINT, name)
    return [replace(s, backends=s.backends + (extra,)) if s.name == name else s for s in services]


def _rule_number(table: str, vip: str) -> int:
    """1-based position of the KUBE-SERVICES rule for ``vip`` in a nat table text."""
    rules = [line for line in table.splitlines() if line.startswith("-A KUBE-SERVICES ")]
    for i, line in enumerate(rules, start=1):
        if f" -d {vip} " in line:
            return i
    raise DatapathError(f"KUBE-SERVICES: expected a rule for {vip}, got none in {len(rules)} rules")


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered), math.ceil(q / 100 * len(ordered))) - 1)]


def _iptables_version() -> str:
    """``iptables --version`` (``v1.8.9 (nf_tables)``: which backend restores the tables)."""
    out = subprocess.run(["iptables", "--version"], capture_output=True, text=True).stdout.strip()
    return out.removeprefix("iptables ") or "unknown"


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# -- clients (each a python process that enters a pod's network namespace itself) -----------------------
_SETNS = r"""
import ctypes, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
def enter(name):
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "setns " + name)
    os.close(fd)
RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST, no TIME_WAIT piles up
def connect_once(vip):
    s = socket.socket()  # a socket belongs to the namespace it was made in
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RST)
    t = time.perf_counter()
    s.connect((vip, 80))
    d = time.perf_counter() - t
    s.close()
    return t, d
"""

_TURNS = "import json, statistics, sys, time\n" + _SETNS + r"""
n, args = int(sys.argv[1]), sys.argv[2:]
targets = [(args[i], args[i + 1]) for i in range(0, len(args), 2)]
times = [[] for _ in targets]
for i in range(n + 5):  # the first 5 turns warm up (neighbour entries, caches) and are not kept
    for k in [(i + j) % len(targets) for j in range(len(targets))]:
        enter(targets[k][0])
        _, d = connect_once(targets[k][1])
        if i >= 5:
            times[k].append(d)
print(json.dumps([statistics.median(t) for t in times]))
"""

_STALL = "import json, signal, sys, time\n" + _SETNS + r"""
enter(sys.argv[1])
vip, limit = sys.argv[2], int(sys.argv[3])
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
for _ in range(20):
    connect_once(vip)
print("ready", flush=True)
out = []
while not stop and len(out) < limit:
    out.append(connect_once(vip))
json.dump(out, sys.stdout)
"""
#: most connects one stall client keeps (at ~10,000 a second, a window of many seconds)
_STALL_LIMIT = 200_000


def _first_packets(targets: list[tuple[str, str]], connects: int) -> list[float]:
    """One sample per target: the median connect() time, one client taking turns between ``targets``
    (``(netns, vip)`` pairs)."""
    argv = [sys.executable, "-c", _TURNS, str(connects)] + [x for t in targets for x in t]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise DatapathError(f"first-packet client failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def _stall_window(netns: str, vip: str, change) -> tuple[float, list[float]]:
    """Run ``change()`` while a client in ``netns`` connects to ``vip``:80 back to back; the window's length and
    the connect() times of the connects that overlap it."""
    proc = subprocess.Popen([sys.executable, "-c", _STALL, netns, vip, str(_STALL_LIMIT)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline().strip()
        if ready != "ready":
            proc.kill()
            raise DatapathError(f"stall client in {netns} to {vip}:80: expected 'ready', got {ready!r} "
                                f"({proc.stderr.read().strip()[-300:]})")
        time.sleep(0.05)
        t0 = time.perf_counter()
        change()
        t1 = time.perf_counter()
        time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode:
        raise DatapathError(f"stall client in {netns} to {vip}:80 failed ({proc.returncode}): {err.strip()[-300:]}")
    return t1 - t0, [d for start, d in json.loads(out) if start <= t1 and start + d >= t0]


def _stall_summary(windows: list[float], inside: list[list[float]]) -> dict:
    """p50/p99/max over every connect in the windows, how many there were, and the windows' median length."""
    pooled = [d for w in inside for d in w]
    out = {"rounds": len(windows), "window_s": round(statistics.median(windows), 6), "connects": len(pooled),
           "connects_per_window": statistics.median(len(w) for w in inside)}
    for key, q in (("p50_s", 50), ("p99_s", 99), ("max_s", 100)):
        out[key] = round(_percentile(pooled, q), 7) if pooled else None
    return out


def _median(samples: list[float], digits: int = 7) -> float:
    return round(statistics.median(samples), digits)


# -- the comparison -------------------------------------------------------------------------------------
class ServiceModes:
    """The two labs of the comparison, kept up between calls, so a notebook can spread the measurement over
    cells (each well inside a cell's time limit): :meth:`up`, then :meth:`measure` at each size ascending and
    :meth:`stall` where wanted, then :meth:`result`; :meth:`down` (or leaving the ``with`` block) removes the
    labs. ``sizes`` and ``stall_sizes`` are what will be measured, for the progress count;
    ``progress(done, total, text)`` is called after each step. The labs are ``<prefix>-bipt`` and
    ``<prefix>-bebpf`` (lab 09 passes its own lab's name, so two notebooks measuring at once never share a
    lab; ``start()`` takes them down with the lab's other variants, :data:`labkit.lab.inventory.VARIANTS`).

    >>> with ServiceModes((10,), rounds=5, connects=20) as run:  # doctest: +SKIP
    ...     run.measure(10)["ebpf"]["services_in_agent"]
    10
    """

    def __init__(self, sizes: tuple[int, ...], progress=None, prefix: str = "bench", rounds: int = ROUNDS,
                 connects: int = CONNECTS, tracing: bool = False, stall_sizes=None, owner: int = 0,
                 names: dict[str, str] | None = None):
        sizes = tuple(sorted(sizes))
        if rounds < 1 or not sizes or sizes[0] < 2:
            raise ValueError(f"service mode comparison: expected sizes >= 2 and rounds >= 1, got {sizes}, {rounds}")
        self.sizes, self.rounds, self.connects, self.progress = sizes, rounds, connects, progress
        self.stall_sizes = tuple(sorted(set(sizes if stall_sizes is None else stall_sizes)))
        #: the two labs (labkitd passes the names a user's variants get: ``demo-bipt_u1000``), owned by ``owner``
        self.names = names or {"iptables": f"{prefix}-bipt", "ebpf": f"{prefix}-bebpf"}
        self.owner = owner
        self.labs: dict = {}
        self.done, self.total = 0, 2 + _STEPS_PER_SIZE * len(sizes) - len(set(sizes) - set(self.stall_sizes))
        self.loaded = 0
        self.changes: dict[int, _Change] = {}
        self.out = {"sizes": [], "iptables": {}, "ebpf": {}, "positions": {}, "stall": {},
                    "conditions": {"routing": "native", "tracing": "on" if tracing else "off", "rounds": rounds,
                                   "connects_per_first_packet_sample": connects,
                                   "client": "python in a1's network namespace (node-a), connect() to VIP:80",
                                   "endpoints": "b1:8080 (node-b); the endpoint added: " + ENDPOINT,
                                   "kernel": platform.release(), "cpus": os.cpu_count() or 0,
                                   "iptables": _iptables_version(),
                                   "ebpf_loaded_by": "lab.services.apply (one agent call per size)"}}

    def tick(self, text: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, text)

    def __enter__(self) -> "ServiceModes":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "ServiceModes":
        """Bring both labs up (native routing, GC timer off, tracing as asked), removing leftovers first."""
        tracing = self.out["conditions"]["tracing"] == "on"
        for mode, name in self.names.items():
            Lab.cleanup(name)
            self.labs[mode] = Lab.up(name, config=DatapathConfig(routing="native", gc_timer=False, service_mode=mode,
                                                                 lb_map_size=131072), owner=self.owner)
            self.labs[mode].trace_mode("all" if tracing else "none")
            self.tick(f"{mode} lab up")
        return self

    def down(self) -> None:
        """Remove both labs (also what they left from an interrupted run)."""
        for name in self.names.values():
            Lab.cleanup(name)
        self.labs = {}

    def measure(self, n: int) -> dict:
        """Grow both labs to ``n`` services and measure the first packet and adding one endpoint there;
        returns ``{"iptables": ..., "ebpf": ..., "positions": ...}`` at ``n`` (also kept for :meth:`result`)."""
        if not self.labs:
            raise DatapathError(f"service mode comparison: labs {', '.join(self.names.values())} are not up; "
                                "expected up() first")
        if n <= self.loaded:
            raise ValueError(f"service mode comparison: expected a size above {self.loaded:,}, got {n:,}")
        t = time.perf_counter()
        _apply(self.labs["ebpf"].services, service_specs(n, self.loaded))
        load_s = time.perf_counter() - t
        self.loaded = n
        self.out["sizes"].append(n)
        self.tick(f"{n:,} services in both labs")
        self.changes[n] = _measure_size(self.labs, n, self.rounds, self.connects, self.out, load_s, self.tick)
        return {k: self.out[k][n] for k in ("iptables", "ebpf", "positions")}

    def stall(self) -> dict:
        """The stall at the size measured last (see the module docstring); also kept for :meth:`result`."""
        if not self.changes or not self.labs:
            raise DatapathError("service mode comparison: expected up() and measure(n) before stall()")
        n = self.loaded
        self.out["stall"][n] = _measure_stall(self.labs, n, self.rounds, self.changes[n], self.tick)
        return self.out["stall"][n]

    def result(self) -> dict:
        """Everything measured so far, with the first-packet growth (the module docstring lists the keys)."""
        out = dict(self.out, sizes=list(self.out["sizes"]))
        sizes = out["sizes"]
        if sizes:
            small, big = min(sizes), max((s for s in sizes if s <= 10000), default=max(sizes))
            out["growth_sizes"] = [small, big]
            for mode in ("ebpf", "iptables"):
                out[f"{mode}_growth"] = round(out[mode][big]["first_packet_s"] / out[mode][small]["first_packet_s"], 3)
        return out


def compare_service_modes(sizes: tuple[int, ...], progress=None, prefix: str = "bench", rounds: int = ROUNDS,
                          connects: int = CONNECTS, tracing: bool = False, stall_sizes=None) -> dict:
    """Measure both modes at each of ``sizes`` in one call (:class:`ServiceModes` up, measure each size, the
    stall at ``stall_sizes`` (default: every size), down); the module docstring says what and how, and lists
    the keys of the dict returned.

    >>> compare_service_modes((10,), rounds=5, connects=20)["ebpf"][10]["services_in_agent"]  # doctest: +SKIP
    10
    """
    with ServiceModes(sizes, progress, prefix, rounds, connects, tracing, stall_sizes) as run:
        for n in run.sizes:
            run.measure(n)
            if n in run.stall_sizes:
                run.stall()
        return run.result()


@dataclass(frozen=True)
class _Change:
    """One size's change: the service that gets ENDPOINT, the one clients connect to, and the restore inputs."""

    worst: Service  #: the last service of KUBE-SERVICES; it gets the endpoint
    typical: Service  #: at a random position; the stall's client connects to it
    base: str  #: the full nat table before (for a flushing restore)
    grown: str  #: the full nat table with the endpoint added
    partial: str  #: the partial sync adding it (--noflush onto ``base``)
    back: str  #: the partial sync taking it out again (--noflush onto ``grown``)


def _measure_size(labs: dict, n: int, rounds: int, connects: int, out: dict, load_s: float, tick) -> _Change:
    """First packet and adding one endpoint at size ``n`` (the eBPF agent holds n services; node-a's nat table
    gets them now); returns the change, for the stall."""
    ipt, ebpf = labs["iptables"], labs["ebpf"]
    agent = ebpf.services
    services = agent.list()
    if len(services) != n:
        raise DatapathError(f"lab '{ebpf.name}': expected {n} services in the agent, got {len(services)}")
    netns = ipt.topology.netns("node-a")
    worst = max(services, key=lambda s: s.name)
    typical = services[random.Random(n).randrange(n - 1)]
    base, grown = nat_table(services, ipt.topology), nat_table(_grown(services, worst.name), ipt.topology)
    partial = partial_table(_grown(services, worst.name), ipt.topology, {worst.name}, chains_in(base))
    back = partial_table(services, ipt.topology, {worst.name}, chains_in(grown))  # the partial sync undoing it
    restore(netns, base)
    out["positions"][n] = {"worst": _rule_number(base, worst.vip), "typical": _rule_number(base, typical.vip),
                           "worst_service": worst.name, "typical_service": typical.name}

    fp = {"ipt_worst": [], "ipt_typical": [], "ebpf_worst": [], "ebpf_typical": []}
    a1 = {"ipt": ipt.topology.netns("a1"), "ebpf": ebpf.topology.netns("a1")}
    for _ in range(rounds):
        got = _first_packets([(a1["ipt"], worst.vip), (a1["ebpf"], worst.vip), (a1["ipt"], typical.vip),
                              (a1["ebpf"], typical.vip)], connects)
        for key, value in zip(("ipt_worst", "ebpf_worst", "ipt_typical", "ebpf_typical"), got):
            fp[key].append(value)
    tick(f"{n:,} services: first packet")

    full_s, partial_s, save_s, ebpf_s = [], [], [], []
    saved = {}
    for r in range(rounds):
        full_s.append(_timed(lambda: restore(netns, grown)))
        if r == 0:
            saved["full"] = NetnsIptables(netns).save("nat")
        restore_noflush(netns, back)
        partial_s.append(_timed(lambda: restore_noflush(netns, partial)))
        if r == 0:
            saved["partial"] = NetnsIptables(netns).save("nat")
        restore_noflush(netns, back)
        save_s.append(_timed(lambda: NetnsIptables(netns).save("nat")))
        ebpf_s.append(_timed(lambda: agent.add_backend(worst.name, ENDPOINT)))
        agent.remove_backend(worst.name, ENDPOINT)
    differences = diff_tables(saved["partial"], saved["full"])
    tick(f"{n:,} services: add one endpoint")

    out["iptables"][n] = {
        "rules": base.count("\n-A "), "full_lines": base.count("\n"), "partial_lines": partial.count("\n"),
        "add_endpoint_s": _median(full_s, 5), "add_endpoint_partial_s": _median(partial_s, 5),
        "save_nat_s": _median(save_s, 5), "partial_equals_full": not differences, "partial_diff": differences[:5],
        "first_packet_s": _median(fp["ipt_worst"]), "first_packet_typical_s": _median(fp["ipt_typical"]),
        "samples": {"add_endpoint_s": full_s, "add_endpoint_partial_s": partial_s, "save_nat_s": save_s,
                    "first_packet_s": fp["ipt_worst"], "first_packet_typical_s": fp["ipt_typical"]}}
    out["ebpf"][n] = {
        "services_in_agent": len(agent.list()), "load_s": round(load_s, 3), "add_endpoint_s": _median(ebpf_s),
        "first_packet_s": _median(fp["ebpf_worst"]), "first_packet_typical_s": _median(fp["ebpf_typical"]),
        "samples": {"add_endpoint_s": ebpf_s, "first_packet_s": fp["ebpf_worst"],
                    "first_packet_typical_s": fp["ebpf_typical"]}}
    return _Change(worst, typical, base, grown, partial, back)


def _measure_stall(labs: dict, n: int, rounds: int, change: _Change, tick) -> dict:
    """The stall at one size: connects to the typical service while each change lands, and while nothing
    changes (for as long as the median full restore took, at most BASELINE_MAX_S)."""
    ipt, ebpf = labs["iptables"], labs["ebpf"]
    netns, agent, c = ipt.topology.netns("node-a"), ebpf.services, change
    a1 = {"ipt": ipt.topology.netns("a1"), "ebpf": ebpf.topology.netns("a1")}
    stall = {k: ([], []) for k in ("iptables_full", "iptables_partial", "ebpf")}
    changes = {"iptables_full": (a1["ipt"], lambda: restore(netns, c.grown), lambda: restore_noflush(netns, c.back)),
               "iptables_partial": (a1["ipt"], lambda: restore_noflush(netns, c.partial),
                                    lambda: restore_noflush(netns, c.back)),
               "ebpf": (a1["ebpf"], lambda: agent.add_backend(c.worst.name, ENDPOINT),
                        lambda: agent.remove_backend(c.worst.name, ENDPOINT))}
    for _ in range(rounds):
        for key, (ns, change_fn, undo) in changes.items():
            window, inside = _stall_window(ns, c.typical.vip, change_fn)
            undo()
            stall[key][0].append(window)
            stall[key][1].append(inside)
    quiet = min(statistics.median(stall["iptables_full"][0]), BASELINE_MAX_S)
    for key, ns in (("baseline_iptables", a1["ipt"]), ("baseline_ebpf", a1["ebpf"])):
        stall[key] = ([], [])
        for _ in range(rounds):
            window, inside = _stall_window(ns, c.typical.vip, lambda: time.sleep(quiet))
            stall[key][0].append(window)
            stall[key][1].append(inside)
    tick(f"{n:,} services: the stall")
    return {k: _stall_summary(*v) for k, v in stall.items()}


def report_lines(kp: dict) -> list[str]:
    """The comparison as markdown lines (``bench.report()`` prints them; lab 09 prints the same figures)."""
    c = kp["conditions"]
    lines = [f"kube-proxy (iptables) vs eBPF agent, sizes {', '.join(f'{n:,}' for n in kp['sizes'])} services, both "
             f"labs up at once: {c['routing']} routing, tracing {c['tracing']}, medians of {c['rounds']} samples, "
             f"{c['cpus']} CPUs, kernel {c['kernel']}, iptables {c.get('iptables', '?')}; the eBPF services are in the agent's own state, loaded by "
             f"{c['ebpf_loaded_by']}; client {c['client']}; {c['endpoints']}", "",
             "| services | add endpoint: iptables full restore | iptables partial (--noflush) | eBPF agent call "
             "| iptables-save -t nat | partial == full |", "|---|---|---|---|---|---|"]
    for n in kp["sizes"]:
        i, e = kp["iptables"][n], kp["ebpf"][n]
        lines.append(f"| {n:,} | {i['add_endpoint_s'] * 1e3:.1f} ms ({i['rules']:,} nat rules) | "
                     f"{i['add_endpoint_partial_s'] * 1e3:.1f} ms ({i['partial_lines']:,} lines) | "
                     f"{e['add_endpoint_s'] * 1e3:.2f} ms ({e['services_in_agent']:,} services in the agent) | "
                     f"{i['save_nat_s'] * 1e3:.1f} ms | {'yes' if i['partial_equals_full'] else 'NO'} |")
    lines += ["", "| services | first packet, worst (last of KUBE-SERVICES): iptables | eBPF | typical: iptables | "
                  "eBPF | typical position |", "|---|---|---|---|---|---|"]
    for n in kp["sizes"]:
        i, e, p = kp["iptables"][n], kp["ebpf"][n], kp["positions"][n]
        lines.append(f"| {n:,} | {i['first_packet_s'] * 1e6:.0f} µs (rule {p['worst']:,}) | "
                     f"{e['first_packet_s'] * 1e6:.0f} µs | {i['first_packet_typical_s'] * 1e6:.0f} µs | "
                     f"{e['first_packet_typical_s'] * 1e6:.0f} µs | rule {p['typical']:,} of {n + 1:,} |")
    lines += ["", "| services | stall while | window | connects in it | connect p50 | p99 | max |",
              "|---|---|---|---|---|---|---|"]
    for n in sorted(kp["stall"]):
        for key, what in (("iptables_full", "iptables full restore"), ("iptables_partial", "iptables partial restore"),
                          ("ebpf", "eBPF agent call"), ("baseline_iptables", "nothing (iptables lab)"),
                          ("baseline_ebpf", "nothing (eBPF lab)")):
            s = kp["stall"][n][key]
            us = ["-" if s[k] is None else f"{s[k] * 1e6:.0f} µs" for k in ("p50_s", "p99_s", "max_s")]
            lines.append(f"| {n:,} | {what} | {s['window_s'] * 1e3:.2f} ms | {s['connects']} in {s['rounds']} "
                         f"windows | {us[0]} | {us[1]} | {us[2]} |")
    lines.append("stall: a client in a1 connects back to back (connect, close with RST) to the typical service; a "
                 "connect counts when its [start, end] meets the change's window; p50/p99/max over every connect in "
                 "the rounds' windows (with fewer than 100 connects, p99 is their maximum; the connect in progress when "
                 "a window opens is more likely a slow one, which weighs most in short windows such as the agent "
                 "call's); the baselines change "
                 f"nothing for as long as the median full restore took, at most {BASELINE_MAX_S} s")
    return lines
