"""``make bench``'s labkitd section: the door's three speed targets, each measured side by side in one run.

    from labkit.tools import doorbench
    door = {"up_down": doorbench.up_down_vs_mininet(5), "step": doorbench.step_door_vs_inprocess(5),
            "table": doorbench.table_refresh_door(5)}
    print("\\n".join(doorbench.report_lines(door)))

It runs as root (``make bench`` does), through the labkitd that answers on ``$LABKIT_DOOR`` or
``/run/labkitd/labkitd.sock`` (``make bench`` starts one when none answers). Each figure is a median of its
samples; a ratio is the median of one side over the median of the other, both measured in the same run, rounds
alternating which side goes first, so a busy machine weighs on both alike. What each one measures:

- :func:`up_down_vs_mininet` (target ``door_up_down_over_mininet`` <= 2.0): per round, (a) the wall time of the
  two commands a user types, ``labkit --lab bench-door up`` then ``labkit --lab bench-door down``, each its own
  process (``python -m labkit cli ...``, output discarded), the lab built and taken down by labkitd with default
  options (2 nodes, 4 pods, 1 external client; the BPF image cached: a warm-up round builds it first), and (b)
  ``mn --switch lxbr --controller none --topo single,4 --test none`` (Debian's mininet, Linux bridge, 4 hosts).
  labkit's sample is its up + down, mn's its one command; ``ratio`` is labkit's median over mn's. The
  breakdown of labkit's, per sample: labkitd's own time for each request (its log's ``root(0) up bench-door ok
  583.2 ms`` lines, when it logs to :func:`labkit.door.daemon.log_file`) and the build itself (lab.json's
  ``timings["up_seconds"]``), so the rest is the command's process (start-up, imports, printing); and, after
  each round, the same up and down as calls of :class:`labkit.client.Lab` from this process, with the same
  parts. Between one command and the next the bench waits, untimed, until the standby loader and agent labkitd
  starts after a build have done their imports (:mod:`labkit.lab.standby`), as they have by the time a user
  types the next command. The warm-up round (untimed) also warms mn's imports. Conditions: mn's version,
  labkitd's pid (SO_PEERCRED) and how long it had been running, how many requests it served for other labs
  meanwhile, the lab's topology, the load average before and after.
- :func:`step_door_vs_inprocess` (target ``door_step_over_inprocess`` <= 1.2): two labs with default options up
  at once, ``bench-step-door`` through labkitd (:meth:`labkit.client.Lab.up`) and ``bench-step-root`` built in
  this process as root (:meth:`labkit.lab.Lab.up`); per round, in each, ``lab.reset()`` and one TCP connection
  a1 -> b1 taken step by step, each of open, send and close timed as the notebook call it is (act, collect the
  flows, read the maps, diff: ``bench._step_times``). Medians per step and over all three; the ratio is labkitd's
  over in-process's, over all three.
- :func:`table_refresh_door` (target ``door_table_refresh_1000_s`` <= 0.05 s): a live CT table
  (:class:`labkit.notebook.widgets.CtTable`) of node-a holding 1,000 rows, written as root into the lab's pinned
  ``cilium_ct_any4_global``, its ``refresh()`` timed (read the rows through labkitd, the lab clock, diff,
  render), 10 refreshes per round (``bench._refresh_times``, the in-process figure's own code) in a lab held by
  labkitd and, beside it, in an in-process root lab, rounds alternating.

Mininet on this machine: ``mn`` raises some host sysctls on every run (``fixLimits`` in mininet/util.py:
:data:`MININET_SYSCTLS`); the bench puts back the values it found after each run, untimed, so that the rest of
the bench, and everyone else on the machine, keep the machine's own settings. It never runs ``mn -c`` (which
kills processes by name, ``ping`` among them, and deletes ``/tmp/*.log``): before the first run and after each
one it checks that nothing of Mininet is left in the host's namespace (:func:`mininet_leftovers`) and stops if
something is.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["up_down_vs_mininet", "step_door_vs_inprocess", "table_refresh_door", "report_lines",
           "mininet_links", "mininet_leftovers", "UP_DOWN_LAB", "STEP_LABS", "TABLE_LABS", "MININET",
           "MININET_SYSCTLS", "STEP_KINDS"]

#: The labs (root's labs through labkitd carry the name as given): named after this bench, so no test's lab and
#: no other bench section's shares them.
UP_DOWN_LAB = "bench-door"
STEP_LABS = {"door": "bench-step-door", "inprocess": "bench-step-root"}
TABLE_LABS = {"door": "bench-tbl-door", "inprocess": "bench-tbl-root"}
#: Mininet's bring-up and teardown of one switch (a Linux bridge) and four hosts, no controller, no test.
MININET = ["mn", "--switch", "lxbr", "--controller", "none", "--topo", "single,4", "--test", "none"]
#: What ``mn`` writes on every run (mininet/util.py ``fixLimits``), put back after each run.
MININET_SYSCTLS = ("fs.file-max", "net.core.wmem_max", "net.core.rmem_max", "net.ipv4.tcp_rmem",
                   "net.ipv4.tcp_wmem", "net.core.netdev_max_backlog", "net.ipv4.neigh.default.gc_thresh1",
                   "net.ipv4.neigh.default.gc_thresh2", "net.ipv4.neigh.default.gc_thresh3",
                   "net.ipv4.route.max_size", "kernel.pty.max")
STEP_KINDS = ("open", "send", "close")
#: At most this long (untimed) for labkitd's standby processes to finish their imports after a build.
SETTLE_SECONDS = 5.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- labkitd ---------------------------------------------------------------------------------------------------
def _proc_stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (field 3 is index 0), or None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _labkitd() -> dict:
    """The labkitd answering on the socket: its pid (the kernel's SO_PEERCRED), socket and uptime."""
    from labkit.door import api
    from labkit.door.daemon import status

    path = api.socket_path()
    hello = status(path)
    if hello is None:
        from labkit.errors import DoorDownError

        raise DoorDownError(f"no labkitd answers on {path}: {api.START_HINT}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        pid, _uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                            struct.calcsize("3i")))
    stat = _proc_stat(pid)
    uptime = round(_boottime() - int(stat[19]) / _CLK_TCK, 1) if stat else None
    return {"pid": pid, "socket": str(path), "uptime_s": uptime, "version": hello.get("version")}


def _settle(labkitd: int, since: float, timeout: float = SETTLE_SECONDS) -> float:
    """Wait until the processes labkitd started after ``since`` (CLOCK_BOOTTIME seconds: the standby loader and
    agent of the next build) have stopped using CPU; the seconds waited."""
    t0 = time.monotonic()
    last = None
    while time.monotonic() - t0 < timeout:
        cpu, found = 0, 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            f = _proc_stat(int(entry.name))
            if f and int(f[1]) == labkitd and int(f[19]) / _CLK_TCK >= since - 0.01:
                cpu, found = cpu + int(f[11]) + int(f[12]), found + 1
        quiet = last is not None and cpu - last <= 1  # at most one tick in the last 0.2 s
        if quiet and (found or time.monotonic() - t0 > 1.0):  # none yet: labkitd may be about to start them
            break
        last = cpu
        time.sleep(0.2)
    return round(time.monotonic() - t0, 2)


def _log_offset() -> int | None:
    from labkit.door.daemon import log_file

    try:
        return log_file().stat().st_size
    except OSError:
        return None


#: labkitd's line per request: ``root(0) up bench-door ok 583.2 ms`` (caller, verb, lab or -, outcome, its time).
_LOG_LINE = re.compile(r"^(?P<caller>\S+)\((?P<uid>\d+)\) (?P<verb>\S+) (?P<lab>\S+) (?P<outcome>\S+) "
                       r"(?P<ms>[0-9.]+) ms$", re.MULTILINE)


def _log_lines(offset: int | None) -> list[re.Match] | None:
    """labkitd's request lines written after ``offset``; None when it does not log to its log file."""
    from labkit.door.daemon import log_file

    if offset is None:
        return None
    try:
        with open(log_file(), "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return list(_LOG_LINE.finditer(text))


def _log_seconds(offset: int | None, verb: str, lab: str) -> list[float]:
    """labkitd's own time for each ``verb`` request of ours on ``lab`` logged after ``offset``, in seconds."""
    return [float(m["ms"]) / 1000 for m in _log_lines(offset) or ()
            if m["uid"] == str(os.getuid()) and m["verb"] == verb and m["lab"] == lab and m["outcome"] == "ok"]


def _others(offset: int | None, labs) -> int | None:
    """How many requests naming a lab other than ``labs`` labkitd served since ``offset`` (other users of the
    machine, other test runs); None when it does not log."""
    lines = _log_lines(offset)
    return None if lines is None else sum(1 for m in lines if m["lab"] not in {"-", *labs})


# -- Mininet ---------------------------------------------------------------------------------------------------
def mininet_links(names) -> list[str]:
    """Those of ``names`` (links of the host's namespace) that are Mininet's: a switch ``s<N>``, its ports
    ``s<N>-eth<M>``, a host's end ``h<N>-eth<M>`` before it moves into the host's namespace.

    >>> mininet_links(["lo", "eth0", "s1", "s1-eth2", "h3-eth0", "lxc1", "ifb0"])
    ['s1', 's1-eth2', 'h3-eth0']
    """
    return [n for n in names if re.fullmatch(r"s\d+(-eth\d+)?|h\d+-eth\d+", n)]


def mininet_leftovers() -> list[str]:
    """What of Mininet is left on this machine: its links in the host's namespace (also what ``brctl show``
    lists) and its node shells (``mininet:h1``); empty when ``mn`` cleaned up after itself."""
    left = [f"link {n}" for _, n in socket.if_nameindex() if n in mininet_links([n])]
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "mininet:" in cmdline:
                left.append(f"process {entry.name} ({cmdline.strip()[:60]})")
    return left


def _sysctls() -> dict[str, str]:
    out = {}
    for name in MININET_SYSCTLS:
        try:
            out[name] = (Path("/proc/sys") / name.replace(".", "/")).read_text()
        except OSError:
            pass
    return out


def _put_back(saved: dict[str, str]) -> list[str]:
    """Write back every sysctl of ``saved`` that changed; their names."""
    changed = []
    for name, value in saved.items():
        path = Path("/proc/sys") / name.replace(".", "/")
        if path.read_text() != value:
            path.write_text(value)
            changed.append(name)
    return changed


def _require_mininet() -> str:
    """``mn --version``, or FileNotFoundError saying what to install."""
    missing = [tool for tool in ("mn", "brctl") if shutil.which(tool) is None]
    if missing:
        raise FileNotFoundError(f"the bench's Mininet comparison needs {' and '.join(missing)}: "
                                f"apt-get install mininet bridge-utils (vagrant/provision.sh --dev installs them)")
    done = subprocess.run(["mn", "--version"], check=False, capture_output=True, text=True, timeout=60)
    return (done.stdout or done.stderr).strip()


def _check_no_mininet(when: str) -> None:
    left = mininet_leftovers()
    if left:
        raise RuntimeError(f"{when}: Mininet left {', '.join(left)}; remove them by hand (`mn -c` does, but it "
                           f"also kills every `ping` and `controller` process by name and deletes /tmp/*.log: not on "
                           f"a shared machine)")


def _mn(saved: dict[str, str]) -> tuple[float, list[str]]:
    """One timed ``mn`` run; then (untimed) its sysctls put back and nothing of it left."""
    t = time.perf_counter()
    done = subprocess.run(MININET, check=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=120)
    took = time.perf_counter() - t
    put_back = _put_back(saved)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(MININET)} failed ({done.returncode}): {done.stderr.decode()[-800:]}")
    _check_no_mininet(f"after {' '.join(MININET)}")
    return took, put_back


# -- labkit's side ---------------------------------------------------------------------------------------------
def _cli(verb: str, lab: str) -> float:
    """Wall time of ``labkit --lab LAB VERB`` in a process of its own, output discarded."""
    argv = [sys.executable, "-m", "labkit", "cli", "--lab", lab, verb]
    t = time.perf_counter()
    done = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, timeout=300)
    took = time.perf_counter() - t
    if done.returncode != 0:
        raise RuntimeError(f"`labkit --lab {lab} {verb}` failed ({done.returncode}): {done.stderr.decode()[-800:]}")
    return took


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 6) if values else None


def up_down_vs_mininet(rounds: int) -> dict:
    """``labkit up`` + ``labkit down`` through labkitd (the two commands, each its own process) against Mininet's
    ``mn --switch lxbr --controller none --topo single,4 --test none``: ``rounds`` rounds after a warm-up, order
    alternating; medians, ``ratio`` (labkit over mn), every sample, the breakdown of labkit's up and down and the
    conditions (module docstring)."""
    from labkit.client import Lab as DoorLab
    from labkit.datapath.image import cache_dir
    from labkit.net.ledger import LabState

    version = _require_mininet()
    door = _labkitd()
    lab_name = UP_DOWN_LAB
    load_before = os.getloadavg()
    # labkit: the commands' wall time; of each, labkitd's own time for its request (_door) and the build (_build).
    # api: the same up and down as calls of labkit.client.Lab from this process, with the same parts.
    samples: dict[str, list[float]] = {k: [] for k in (
        "labkit", "mininet", "labkit_up", "labkit_down", "labkit_up_door", "labkit_down_door", "labkit_up_build",
        "api_up", "api_down", "api_up_door", "api_down_door", "api_up_build")}
    orders, settled, put_back, topology = [], [], set(), None

    def up_down(how: str, timed: bool = True) -> None:
        nonlocal topology
        since, offset = _boottime(), _log_offset()
        t = time.perf_counter()
        if how == "labkit":
            _cli("up", lab_name)
        else:
            lab = DoorLab.up(lab_name)
        up = time.perf_counter() - t
        state = LabState.read(lab_name)  # lab.json, as labkitd wrote it: the build's own timing
        door_up = _log_seconds(offset, "up", lab_name)
        if how == "api":
            topology = {"nodes": len(lab.topology.nodes), "pods": len(lab.topology.pods),
                        "externals": len(lab.topology.externals)}
        settled.append(_settle(door["pid"], since))
        offset = _log_offset()
        t = time.perf_counter()
        if how == "labkit":
            _cli("down", lab_name)
        else:
            lab.down()
        down = time.perf_counter() - t
        door_down = _log_seconds(offset, "down", lab_name)
        if not timed:
            return
        if how == "labkit":
            samples["labkit"].append(up + down)
        samples[f"{how}_up"].append(up)
        samples[f"{how}_down"].append(down)
        samples[f"{how}_up_build"].append(state.timings["up_seconds"])
        samples[f"{how}_up_door"] += door_up[-1:]  # none when labkitd does not log to its file
        samples[f"{how}_down_door"] += door_down[-1:]

    DoorLab.cleanup(lab_name)
    start = _log_offset()
    _check_no_mininet(f"before {' '.join(MININET)}")
    saved = _sysctls()
    try:
        up_down("labkit", timed=False)  # warm-up: the first build of these options may compile the BPF image
        put_back.update(_mn(saved)[1])  # warm-up: mn's imports
        for r in range(rounds):
            order = ("labkit", "mininet") if r % 2 == 0 else ("mininet", "labkit")
            orders.append(",".join(order))
            for side in order:
                if side == "labkit":
                    up_down("labkit")
                else:
                    took, changed = _mn(saved)
                    samples["mininet"].append(took)
                    put_back.update(changed)
            up_down("api")  # the breakdown, after the side-by-side pair
    finally:
        put_back.update(_put_back(saved))
        after = _sysctls()
        DoorLab.cleanup(lab_name)
    medians = {k: _median(v) for k, v in samples.items()}
    cache = cache_dir()
    return {
        "rounds": rounds, "lab": lab_name, "orders": orders,
        "commands": {"labkit": [f"labkit --lab {lab_name} up", f"labkit --lab {lab_name} down"],
                     "mininet": " ".join(MININET)},
        "median_s": medians, "samples_s": samples,
        "ratio": round(medians["labkit"] / medians["mininet"], 3),
        "conditions": {
            "mininet": version, "labkitd": door,
            "topology": topology, "options": "default", "bpf_image_cache": str(cache) if cache else None,
            "settle_s": settled, "sysctls_put_back": sorted(put_back),
            "sysctls_before": saved, "sysctls_after": after,
            "labkitd_other_requests": _others(start, [lab_name]),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            "kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version()},
    }


def step_door_vs_inprocess(rounds: int) -> dict:
    """One TCP connection's open, send and close, each timed, in a lab through labkitd and in one built in this
    process, both up at once; ``rounds`` rounds after an untimed one (each pod's client process starts at its
    first step), order alternating; medians per step and overall, ``ratio`` labkitd over in-process."""
    from labkit.client import Lab as DoorLab
    from labkit.lab import Lab
    from labkit.tools.bench import _step_times

    door = _labkitd()
    labs: dict = {}
    samples = {side: {kind: [] for kind in STEP_KINDS} for side in STEP_LABS}
    orders = []
    try:
        DoorLab.cleanup(STEP_LABS["door"])
        Lab.cleanup(STEP_LABS["inprocess"])
        since = _boottime()
        labs["door"] = DoorLab.up(STEP_LABS["door"])
        labs["inprocess"] = Lab.up(STEP_LABS["inprocess"])
        _settle(door["pid"], since)
        start = _log_offset()
        for side in STEP_LABS:
            _step_times(labs[side], 1)  # untimed: the pods' clients start
        for r in range(rounds):
            order = tuple(STEP_LABS) if r % 2 == 0 else tuple(reversed(STEP_LABS))
            orders.append(",".join(order))
            for side in order:
                for kind, took in zip(STEP_KINDS, _step_times(labs[side], 1)):
                    samples[side][kind].append(took)
    finally:
        DoorLab.cleanup(STEP_LABS["door"])
        Lab.cleanup(STEP_LABS["inprocess"])
    for by_kind in samples.values():
        by_kind["all"] = [t for kind in STEP_KINDS for t in by_kind[kind]]
    medians = {side: {kind: _median(v) for kind, v in by_kind.items()} for side, by_kind in samples.items()}
    return {"rounds": rounds, "labs": dict(STEP_LABS), "orders": orders, "median_s": medians, "samples_s": samples,
            "ratio": round(medians["door"]["all"] / medians["inprocess"]["all"], 3),
            "ratio_by_step": {k: round(medians["door"][k] / medians["inprocess"][k], 3) for k in STEP_KINDS},
            "conditions": {"labkitd": door, "options": "default", "connection": "a1 -> b1:8080 (across nodes)",
                           "labkitd_other_requests": _others(start, STEP_LABS.values()),
                           "load": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}}


def table_refresh_door(rounds: int) -> dict:
    """A live CT table's refresh with 1,000 rows in node-a's CT map, in a lab through labkitd and in one built in
    this process, both up at once; per round 10 refreshes in each (``bench._refresh_times``), order alternating;
    medians, every sample, ``ratio`` labkitd over in-process."""
    from labkit.client import Lab as DoorLab
    from labkit.lab import Lab
    from labkit.tools.bench import _refresh_times

    door = _labkitd()
    labs: dict = {}
    samples: dict[str, list[float]] = {side: [] for side in TABLE_LABS}
    orders = []
    try:
        DoorLab.cleanup(TABLE_LABS["door"])
        Lab.cleanup(TABLE_LABS["inprocess"])
        since = _boottime()
        labs["door"] = DoorLab.up(TABLE_LABS["door"])
        labs["inprocess"] = Lab.up(TABLE_LABS["inprocess"])
        _settle(door["pid"], since)
        start = _log_offset()
        for r in range(rounds):
            order = tuple(TABLE_LABS) if r % 2 == 0 else tuple(reversed(TABLE_LABS))
            orders.append(",".join(order))
            for side in order:
                samples[side] += _refresh_times(labs[side])
    finally:
        DoorLab.cleanup(TABLE_LABS["door"])
        Lab.cleanup(TABLE_LABS["inprocess"])
    samples["door_ct_request"] = _log_seconds(start, "ct", TABLE_LABS["door"])  # labkitd's part of each refresh
    medians = {side: _median(v) for side, v in samples.items()}
    return {"rounds": rounds, "rows": 1000, "labs": dict(TABLE_LABS), "orders": orders, "median_s": medians,
            "samples_s": samples, "ratio": round(medians["door"] / medians["inprocess"], 3),
            "conditions": {"labkitd": door, "node": "node-a", "map": "cilium_ct_any4_global",
                           "labkitd_other_requests": _others(start, TABLE_LABS.values()),
                           "load": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}}


# -- the report ------------------------------------------------------------------------------------------------
def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def report_lines(door: dict) -> list[str]:
    """The report's lines for labkitd's section: ``door`` holds the results of the three functions under
    ``up_down``, ``step`` and ``table``."""
    lines = []
    u = door.get("up_down")
    if u:
        m, c = u["median_s"], u["conditions"]
        topo = c["topology"] or {}
        lines.append(
            f"`labkit up` + `labkit down` through labkitd (the two commands, each its own process; default lab: "
            f"{topo.get('nodes')} nodes, {topo.get('pods')} pods, {topo.get('externals')} external, BPF image "
            f"cached) vs Mininet {c['mininet']} `{u['commands']['mininet']}`, medians of {u['rounds']} rounds, "
            f"order alternating, after a warm-up round: labkit {m['labkit']:.2f} s, mn {m['mininet']:.2f} s, "
            f"ratio labkit/mn {u['ratio']}")
        lines.append(
            f"... where labkit's time goes: `labkit up` {_ms(m['labkit_up'])} (labkitd's request "
            f"{_ms(m['labkit_up_door'])}, the build {_ms(m['labkit_up_build'])}), `labkit down` "
            f"{_ms(m['labkit_down'])} (labkitd's request {_ms(m['labkit_down_door'])}); the rest is the command's "
            f"process (start-up, imports, printing). The same as calls from Python (`labkit.client.Lab`): up "
            f"{_ms(m['api_up'])} (labkitd {_ms(m['api_up_door'])}, the build {_ms(m['api_up_build'])}), down "
            f"{_ms(m['api_down'])}. labkitd pid {c['labkitd']['pid']}, up {c['labkitd']['uptime_s'] or 0:.0f} s "
            f"before the first sample, serving {c['labkitd_other_requests']} requests for other labs meanwhile; "
            f"load {c['load_before'][0]:.2f} before, {c['load_after'][0]:.2f} after; {c['cpus']} CPUs, kernel "
            f"{c['kernel']}")
    s = door.get("step")
    if s:
        md, mi = s["median_s"]["door"], s["median_s"]["inprocess"]
        lines.append(
            f"one notebook step through labkitd vs the same step made as root in-process (two labs up at once, "
            f"one TCP connection a1 -> b1 per round, {s['rounds']} rounds alternating): "
            + ", ".join(f"{k} {_ms(md[k])} vs {_ms(mi[k])}" for k in STEP_KINDS)
            + f"; all steps {_ms(md['all'])} vs {_ms(mi['all'])}, ratio {s['ratio']} (labkitd served "
              f"{s['conditions']['labkitd_other_requests']} requests for other labs meanwhile)")
    t = door.get("table")
    if t:
        lines.append(
            f"live CT table, {t['rows']:,} rows, one refresh (read, diff, render) through labkitd "
            f"{_ms(t['median_s']['door'])} (of which labkitd's `ct` request {_ms(t['median_s']['door_ct_request'])})"
            f" vs in-process as root {_ms(t['median_s']['inprocess'])} (medians of {len(t['samples_s']['door'])} "
            f"each, {t['rounds']} rounds of 10 alternating, two labs up at once), ratio {t['ratio']} (labkitd "
            f"served {t['conditions']['labkitd_other_requests']} requests for other labs meanwhile)")
    return lines
