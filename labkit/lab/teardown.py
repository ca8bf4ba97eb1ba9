"""Remove exactly what a lab's ledger recorded, newest first, then prove it is gone.

Phases run in an order the kernel accepts: processes stop before their
namespaces go, tc filters before their qdisc, pins before their directory.
Nothing is ever deleted by name pattern; names are only *checked* afterwards.
"""
from __future__ import annotations

import errno
import os
import time
import signal
from pathlib import Path

from labkit.net import netns as _netns
from labkit.datapath import bpf as _bpf
from labkit.datapath import tc, xdp
from labkit.errors import CleanupError
from labkit.net.ledger import Ledger, process_start_time, wait_gone

__all__ = ["teardown", "remove_part", "leftovers"]

_PHASES = ("process", "xdp", "tc-filter", "qdisc", "cgroup-prog", "pin", "pindir", "netns", "cgroup", "file", "dir")


def _stop_processes(entries: list[dict]) -> None:
    """SIGTERM every recorded process that still runs (the same process: its start time matches), then wait for
    them together; SIGKILL those still there after a second."""
    running = []
    for e in entries:
        pid, start = e["pid"], e.get("start")
        if process_start_time(pid) is None or process_start_time(pid) != start:
            continue  # gone, or the pid now belongs to someone else
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        running.append((pid, start))
    for timeout, sig in ((1.0, signal.SIGKILL), (2.0, None)):
        deadline = time.monotonic() + timeout
        left = [(pid, start) for pid, start in running if not wait_gone(pid, start, max(0.0, deadline - time.monotonic()))]
        if not left or sig is None:
            break
        for pid, _ in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        running = left
    for pid, _ in running:
        try:  # reap it if it was our child
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _tc_filters(entries: list[dict]) -> None:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    by_ns: dict[str, list[dict]] = {}
    for e in entries:
        by_ns.setdefault(e["netns"], []).append(e)
    for ns, items in by_ns.items():
        if not _netns.exists(ns):
            continue
        with _netns.entered(ns):
            ipr = IPRoute()
        try:
            for e in items:
                found = ipr.link_lookup(ifname=e["ifname"])
                if not found:
                    continue
                try:
                    if e["kind"] == "tc-filter":
                        tc.del_filter(ipr, found[0], e["direction"], e["prio"], e["handle"])
                    elif not (tc.filter_names(ipr, found[0], "ingress") or tc.filter_names(ipr, found[0], "egress")):
                        ipr.tc("del", "clsact", found[0])  # ours, and nobody else's filters on it
                except NetlinkError as exc:
                    if exc.code not in (errno.ENOENT, errno.EINVAL):  # already gone with its qdisc
                        raise
        finally:
            ipr.close()


def _detach_xdp(e: dict) -> None:
    from pyroute2 import IPRoute

    if not _netns.exists(e["netns"]):
        return  # the device went with its namespace, and the program with it
    with _netns.entered(e["netns"]):
        ipr = IPRoute()
    try:
        found = ipr.link_lookup(ifname=e["ifname"])
        if found:
            xdp.detach(ipr, found[0])
    finally:
        ipr.close()


def _detach_cgroup_prog(e: dict) -> None:
    if not (os.path.exists(e["cgroup"]) and os.path.exists(e["pin"])):
        return
    cg = os.open(e["cgroup"], os.O_RDONLY | os.O_DIRECTORY)
    try:
        prog = _bpf.obj_get(e["pin"])
        try:
            _bpf.prog_detach(cg, prog, e["attach_type"])
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
        finally:
            os.close(prog)
    finally:
        os.close(cg)


def _empty_cgroup(path: str, timeout: float = 10.0) -> None:
    """Kill what still runs in the lab's cgroup ``path`` (the processes users started in a pod or node through
    labkitd, which no ledger lists: they belong to the pod) and wait until it is empty, so that it can go."""
    events = os.path.join(path, "cgroup.events")
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    except FileNotFoundError:  # gone, or a kernel before 5.14: kill its processes one by one
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                for pid in f.read().split():
                    try:
                        os.kill(int(pid), 9)
                    except ProcessLookupError:
                        pass
        except FileNotFoundError:
            return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(events) as f:
                if "populated 0" in f.read():
                    return
        except FileNotFoundError:
            return
        time.sleep(0.01)


def _remove_path(path: str, rmdir: bool) -> None:
    try:
        os.rmdir(path) if rmdir else os.unlink(path)
    except FileNotFoundError:
        pass


def _undo(entries: list[dict], ledger: Ledger | None = None) -> list[str]:
    """Undo ``entries`` phase by phase, newest first; with ``ledger`` (a whole teardown) the ledger file
    goes before the directories. Returns the errors, never stops at one."""
    errors: list[str] = []
    for phase in _PHASES:
        items = [e for e in reversed(entries) if e["kind"] == phase]
        if phase == "dir" and ledger is not None:
            _remove_path(str(ledger.path), rmdir=False)
            _remove_path(str(ledger.path.with_suffix(".tmp")), rmdir=False)
        try:
            if phase == "process":
                _stop_processes(items)
            elif phase in ("tc-filter", "qdisc"):
                # a filter or qdisc in a namespace this same undo removes goes with it: the kernel deletes the
                # namespace's devices and everything on them (the leftovers check proves it)
                going = {e["name"] for e in entries if e["kind"] == "netns"}
                items = [e for e in items if e.get("netns") not in going]
                if items:
                    _tc_filters(items)
            elif phase == "xdp":
                for e in items:
                    _detach_xdp(e)
            elif phase == "cgroup-prog":
                for e in items:
                    _detach_cgroup_prog(e)
            elif phase == "netns":
                for e in items:
                    if _netns.exists(e["name"]):
                        _netns.remove(e["name"])
            else:
                for e in items:
                    if phase == "cgroup":
                        _empty_cgroup(e["path"])
                    _remove_path(e["path"], rmdir=phase in ("pindir", "cgroup", "dir"))
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                errors.append(f"{phase}: {exc}")
    return errors


def teardown(ledger: Ledger) -> None:
    """Undo every ledger entry; the ledger file goes last. Errors are collected, not stopped at."""
    entries = ledger.entries()
    errors = _undo(entries, ledger)
    left = leftovers(entries)
    if errors or left:
        raise CleanupError(
            f"lab '{ledger.lab}': teardown left {len(left)} object(s): {'; '.join(left + errors)}"
        )


def remove_part(ledger: Ledger, predicate) -> list[dict]:
    """Undo the ledger entries ``predicate`` accepts (one pod, say), prove they are gone, then drop them from
    the ledger. Returns the entries removed."""
    part = [e for e in ledger.entries() if predicate(e)]
    errors = _undo(part)
    left = leftovers(part)
    if errors or left:
        raise CleanupError(f"lab '{ledger.lab}': removing {len(part)} object(s) left {len(left)}: "
                           f"{'; '.join(left + errors)}")
    ledger.forget(predicate)
    return part


def leftovers(entries: list[dict], expected_netns: list[str] = ()) -> list[str]:
    """Objects from ``entries`` (and namespaces named in ``expected_netns``) that still exist."""
    left = []
    for e in entries:
        kind = e["kind"]
        if kind == "process":
            if process_start_time(e["pid"]) is not None and process_start_time(e["pid"]) == e.get("start"):
                left.append(f"process {e['name']} (pid {e['pid']})")
        elif kind == "netns":
            if _netns.exists(e["name"]):
                left.append(f"network namespace {e['name']}")
        elif kind in ("pin", "pindir", "cgroup", "file", "dir"):
            if os.path.lexists(e["path"]):
                left.append(f"{kind} {e['path']}")
    for name in expected_netns:
        if _netns.exists(name) and f"network namespace {name}" not in left:
            left.append(f"network namespace {name}")
    return left


def existing_paths(paths: list[Path]) -> list[str]:
    """The given paths that exist."""
    return [str(p) for p in paths if os.path.lexists(p)]
