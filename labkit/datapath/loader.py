"""Build one node's datapath: compile with BCC (or take the cached image), pin the maps, attach the programs.

Runs as a child process, one per node (``python -m labkit loader``),
so two nodes compile at once and the lab process never holds BCC's state. A
build whose text and flags were compiled before loads from the image BCC made
then (:mod:`labkit.datapath.image`). It talks JSON lines:

- stdin, first line: ``{"topology": ..., "config": ..., "node": ..., "pin_dir": ...}``
- stdout: ``{"created": {...}}`` for every pin and tc filter, *as it is made*,
  so the parent's ledger never misses one; ``{"pinned": true}`` once the maps
  exist (the parent then programs them); after the parent answers ``attach``
  on stdin, ``{"done": {...}}``, or ``{"error": "..."}`` at any point.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

from labkit.config import DatapathConfig
from labkit.datapath import bpf as _bpf
from labkit.datapath import image, tc
from labkit.datapath.source import CGROUP_ATTACH, MAP_NAMES, node_build
from labkit.errors import DatapathError
from labkit.net import netns as _netns
from labkit.net.topology import Topology

__all__ = ["main"]


def _say(**msg) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def run(spec: dict) -> None:
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
        try:
            loaded, how = image.load_build(build)
        except DatapathError as exc:
            _say(error=f"node '{node}': {exc}")
            return
        compiled = time.monotonic()
        try:
            for name in MAP_NAMES:
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
    _say(done={"node": node, "compile_seconds": round(compiled - t0, 3), "image": how,
               "seconds": round(time.monotonic() - t0, 3)})


_BPF_F_ALLOW_MULTI = 2


def _attach_cgroup(prog_fd: int, prog, spec: dict, node: str) -> None:
    """Pin a loaded socket program (so teardown can detach it) and attach it to the spec's cgroups."""
    attach_type = CGROUP_ATTACH[prog.direction]
    pin = os.path.join(spec["pin_dir"], prog.function)
    _bpf.obj_pin(prog_fd, pin)
    _say(created={"kind": "pin", "path": pin, "node": node})
    for cgroup in spec.get("cgroups", []):
        fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf.prog_attach(fd, prog_fd, attach_type, _BPF_F_ALLOW_MULTI)
        finally:
            os.close(fd)
        _say(created={"kind": "cgroup-prog", "cgroup": cgroup, "pin": pin, "attach_type": attach_type,
                      "name": prog.filter_name})


def main(argv: list[str] | None = None) -> None:
    """Entry point of the child process."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the lab process
    if os.getppid() == 1:
        return
    try:
        run(json.loads(sys.stdin.readline()))
    except Exception as exc:
        _say(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())

