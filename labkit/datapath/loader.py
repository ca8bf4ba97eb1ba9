"""Build one node's datapath: compile with BCC (or take the cached image), pin the maps, attach the programs.

Runs in a child process per node, so two nodes compile at once and the lab process never holds BCC's
state. :func:`start` starts one ``python -m labkit loader`` for all of a lab's nodes: it imports this
module and pyroute2 once, then forks the child of each node, which enters the node's namespace (a lab
of two nodes pays one Python start-up and one set of imports, not two). A build whose text and flags
were compiled before loads from the image BCC made then (:mod:`labkit.datapath.image`). The children are
forked at once, before their nodes are known (:class:`PendingLoader`): each may load the image of the last
build meanwhile (its maps made, its programs through the verifier), and uses it when its node's build is that
image. Each node's child talks JSON lines on its own pipes:

- stdin, first line: ``{"topology": ..., "config": ..., "node": ..., "pin_dir": ...}``
- stdout: ``{"created": {...}}`` for every pin and tc filter, *as it is made*,
  so the parent's ledger never misses one; ``{"pinned": true}`` once the maps
  exist (the parent then programs them); after the parent answers ``attach``
  on stdin, ``{"done": {...}}``, or ``{"error": "..."}`` at any point.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

from labkit.config import DatapathConfig
from labkit.datapath import bpf as _bpf
from labkit.datapath import image, tc, xdp
from labkit.datapath.source import CGROUP_ATTACH, SOCKMAP_ATTACH, node_build
from labkit.errors import DatapathError
from labkit.net import netns as _netns
from labkit.net.topology import Topology

__all__ = ["main", "start", "NodeLoader", "PendingLoader"]


def _say(**msg) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def preload(key: str | None):
    """``(key, LoadedImage)`` of the cached image ``key`` loaded now — maps made, programs verified — before the
    node it is for is known; None when there is no such image (or it does not load: the node loads afresh)."""
    if not key:
        return None
    cached = image.cache_get(key)
    if cached is None:
        return None
    try:
        return key, image.load(cached)
    except DatapathError:
        return None


def run(spec: dict, preloaded=None) -> None:
    """Build one node: ``preloaded`` (:func:`preload`) is used when its image is this node's build."""
    topo = Topology.from_dict(spec["topology"])
    config = DatapathConfig.from_dict(spec["config"])
    node = spec["node"]
    netns = topo.netns(node)
    _netns.enter_process(netns)  # this process is single-threaded: all of it moves

    from pyroute2 import IPRoute

    t0 = time.monotonic()
    with IPRoute() as ipr:
        vxlan = ipr.link_lookup(ifname="cilium_vxlan")
        build = node_build(topo, config, node, vxlan_ifindex=vxlan[0] if vxlan else 0,
                           netdev_ifindex=ipr.link_lookup(ifname="eth0")[0])
        key = image.image_key(build.text(), build.cflags())
        if preloaded is not None and preloaded[0] == key:
            loaded, how = preloaded[1], "preloaded"
        else:
            if preloaded is not None:
                preloaded[1].close()  # another build: its maps and programs go
            try:
                loaded, how = image.load_build(build)
            except DatapathError as exc:
                _say(error=f"node '{node}': {exc}")
                return
        compiled = time.monotonic()
        try:
            for name in build.map_names:
                path = os.path.join(spec["pin_dir"], name)
                _bpf.obj_pin(loaded.maps[name], path)
                _say(created={"kind": "pin", "path": path, "node": node})
            _say(pinned=True, compile_seconds=round(compiled - t0, 3), image=how)
            if sys.stdin.readline().strip() != "attach":
                _say(error=f"node '{node}': parent did not ask to attach")
                return

            devices = {
                "lxc": [topo.host_veth(p.name) for p in topo.pods_on(node)],
                "netdev": ["eth0"],
                "overlay": ["cilium_vxlan"] if vxlan else [],
            }
            for prog in build.programs:
                if prog.device == "cgroup":
                    _attach_cgroup(loaded.progs[prog.function], prog, spec, node)
                    continue
                if prog.device == "pods":
                    _attach_cgroup(loaded.progs[prog.function], prog, spec, node, spec.get("pod_cgroups", []),
                                   SOCKMAP_ATTACH[prog.direction])
                    continue
                if prog.device == "sockmap":
                    _attach_sockmap(loaded, prog, spec, node)
                    continue
                if prog.device == "xdp":
                    index = ipr.link_lookup(ifname="eth0")[0]
                    where = xdp.attach(ipr, index, loaded.progs[prog.function])
                    _say(created={"kind": "xdp", "netns": netns, "ifname": "eth0", "name": prog.function, **where})
                    continue
                if prog.device == "xdp-peer":  # XDP_TX needs a program on the peer too (labkit/datapath/xdp.py)
                    fabric, port = topo.netns("fabric"), topo.fabric_port(node)
                    with _netns.entered(fabric):
                        peer = IPRoute()
                    try:
                        where = xdp.attach(peer, peer.link_lookup(ifname=port)[0], loaded.progs[prog.function])
                    finally:
                        peer.close()
                    _say(created={"kind": "xdp", "netns": fabric, "ifname": port, "name": prog.function, **where})
                    continue
                for ifname in devices[prog.device]:
                    index = ipr.link_lookup(ifname=ifname)[0]
                    if tc.ensure_clsact(ipr, index):
                        _say(created={"kind": "qdisc", "netns": netns, "ifname": ifname, "qdisc": "clsact"})
                    where = tc.add_bpf_filter(ipr, index, prog.direction, loaded.progs[prog.function],
                                              prog.filter_name)
                    _say(created={"kind": "tc-filter", "netns": netns, "ifname": ifname, "name": prog.filter_name,
                                  **where})
        finally:
            loaded.close()  # the pins, filters and cgroup links hold what the lab keeps
    _say(done={"node": node, "compile_seconds": round(compiled - t0, 3), "image": how, "key": key,
               "seconds": round(time.monotonic() - t0, 3)})


_BPF_F_ALLOW_MULTI = 2


def _attach_cgroup(prog_fd: int, prog, spec: dict, node: str, cgroups: list[str] | None = None,
                   attach_type: int | None = None) -> None:
    """Pin a loaded socket program (so teardown can detach it) and attach it to ``cgroups`` (the spec's
    socket-LB cgroups unless given), as ``attach_type`` (its CGROUP_ATTACH type unless given)."""
    attach_type = CGROUP_ATTACH[prog.direction] if attach_type is None else attach_type
    pin = os.path.join(spec["pin_dir"], prog.function)
    _bpf.obj_pin(prog_fd, pin)
    _say(created={"kind": "pin", "path": pin, "node": node})
    for cgroup in spec.get("cgroups", []) if cgroups is None else cgroups:
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf.prog_attach(fd, prog_fd, attach_type, _BPF_F_ALLOW_MULTI)
        finally:
            os.close(fd)
        _say(created={"kind": "cgroup-prog", "cgroup": cgroup, "pin": pin, "attach_type": attach_type,
                      "name": prog.filter_name})


def _attach_sockmap(loaded, prog, spec: dict, node: str) -> None:
    """Pin the sk_msg program and attach it to the node's sockhash (``bpftool prog attach ... msg_verdict``).

    The map holds the program from then on; nothing needs detaching at teardown: once the map's last pin
    and fd are gone the kernel releases its programs (sock_map_release_progs) and its sockets."""
    pin = os.path.join(spec["pin_dir"], prog.function)
    _bpf.obj_pin(loaded.progs[prog.function], pin)
    _say(created={"kind": "pin", "path": pin, "node": node})
    _bpf.prog_attach(loaded.maps["cilium_sock_ops"], loaded.progs[prog.function], SOCKMAP_ATTACH[prog.direction])


class NodeLoader:
    """One node's loader as the lab process sees it: ``stdin`` (the lab's answers) and ``stdout`` (the JSON
    lines) of the child building that node, ``errfile`` (its stderr), and ``poll``/``kill``/``wait`` of the
    process the lab started, which every node's child ends with (killing it kills them)."""

    def __init__(self, process: subprocess.Popen, stdin, stdout, errfile):
        self.process, self.stdin, self.stdout, self.errfile = process, stdin, stdout, errfile

    def poll(self) -> int | None:
        return self.process.poll()

    def kill(self) -> None:
        self.process.kill()  # the nodes' children have PR_SET_PDEATHSIG: they go with it

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)


class PendingLoader:
    """A loader process started ahead, for ``n`` nodes: it has imported what it needs, forked one child per node
    and waits for their specs (:meth:`go`). With ``preload`` (an image key per node, those of the last build),
    each child has loaded its image meanwhile — maps made, programs through the verifier — and uses it when the
    node's build is that image. ``labkit up`` starts it before it builds the network, so the imports cost nothing
    on the way; labkitd keeps one ready between labs (:mod:`labkit.lab.standby`)."""

    def __init__(self, n: int, preload: list[str | None] | None = None):
        self.n = n
        self.preload = list(preload or [])[:n]
        slots, passed, self._ends = [], [], []
        for i in range(n):
            child_in, lab_in = os.pipe()
            lab_out, child_out = os.pipe()
            # stderr to a file, not a pipe: a verifier log can be far larger than a pipe holds,
            # and a loader blocked writing it would never report its error.
            errfile = tempfile.TemporaryFile("w+")
            slots.append({"stdin": child_in, "stdout": child_out, "stderr": errfile.fileno(),
                          "preload": self.preload[i] if i < len(self.preload) else None})
            passed += [child_in, child_out, errfile.fileno()]
            self._ends.append((lab_in, lab_out, errfile))
        try:
            self.process = subprocess.Popen([sys.executable, "-m", "labkit", "loader"], stdin=subprocess.PIPE,
                                            stdout=subprocess.DEVNULL, stderr=self._ends[0][2], pass_fds=passed,
                                            text=True)
        finally:
            for slot in slots:  # the children's ends: only theirs, so that a child's exit is the lab's end of file
                os.close(slot["stdin"])
                os.close(slot["stdout"])
        self.process.stdin.write(json.dumps({"slots": slots}) + "\n")
        self.process.stdin.close()

    def alive(self) -> bool:
        return self.process.poll() is None

    def go(self, specs: dict[str, dict]) -> dict[str, "NodeLoader"]:
        """Hand each node's child its spec (node -> the first line of the protocol); node -> its
        :class:`NodeLoader`."""
        if len(specs) != self.n:
            raise DatapathError(f"loader started for {self.n} nodes, given {len(specs)}")
        out = {}
        for (node, spec), (lab_in, lab_out, errfile) in zip(specs.items(), self._ends):
            stdin = os.fdopen(lab_in, "w")
            stdin.write(json.dumps(spec) + "\n")
            stdin.flush()
            out[node] = NodeLoader(self.process, stdin, os.fdopen(lab_out, "r"), errfile)
        return out

    def discard(self) -> None:
        """End a loader that will not be used (its children exit at the end of their stdin)."""
        for lab_in, lab_out, errfile in self._ends:
            for fd in (lab_in, lab_out):
                try:
                    os.close(fd)
                except OSError:
                    pass
            errfile.close()
        self.process.kill()
        self.process.wait()


def start(specs: dict[str, dict]) -> dict[str, NodeLoader]:
    """Start the loader of every node of ``specs`` (node -> its spec, the first line of the protocol) in one
    process; node -> its :class:`NodeLoader`, already given its spec.

        loaders = start({"node-a": spec_a, "node-b": spec_b})
        json.loads(loaders["node-a"].stdout.readline())   # {"created": ...}, ..., {"pinned": true}
    """
    return PendingLoader(len(specs)).go(specs)


def _die_with_parent() -> None:
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the process that started this one


def _run_reporting(spec: dict, preloaded=None) -> None:
    try:
        run(spec, preloaded)
    except Exception as exc:
        _say(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())


def _fork_slots(slots: list[dict]) -> None:
    """One child per node slot, each on its own pipes (``stdin``, ``stdout``, ``stderr`` fds): it preloads its
    image (``preload``), then reads its node's spec from its stdin and builds it; return once all ended."""
    from pyroute2 import IPRoute  # noqa: F401  imported once, here, for every node's child

    fds = [slot[k] for slot in slots for k in ("stdin", "stdout", "stderr")]
    children = []
    for slot in slots:
        pid = os.fork()
        if pid == 0:
            try:
                _die_with_parent()
                for target, k in enumerate(("stdin", "stdout", "stderr")):
                    os.dup2(slot[k], target)
                for fd in fds:
                    os.close(fd)
                sys.stdin, sys.stdout, sys.stderr = (open(0, "r", closefd=False), open(1, "w", closefd=False),
                                                     open(2, "w", closefd=False))
                preloaded = preload(slot.get("preload"))
                line = sys.stdin.readline()
                if line:  # no spec: a loader started ahead and never used
                    _run_reporting(json.loads(line), preloaded)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(0)
        children.append(pid)
    for fd in fds:
        os.close(fd)
    for pid in children:
        os.waitpid(pid, 0)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the loader process: ``{"slots": [...]}`` from :class:`PendingLoader`."""
    _die_with_parent()
    if os.getppid() == 1:
        return
    try:
        line = sys.stdin.readline()
        if not line:
            return
        first = json.loads(line)
        _fork_slots(first["slots"])
    except Exception as exc:
        _say(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
