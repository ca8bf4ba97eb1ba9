"""labkitd's traffic verbs: steps (ping, a UDP datagram, a crafted packet), TCP connections advanced one step at
a time, and the processes a user starts in a pod.

A step runs here, on the privileged side (:mod:`labkit.lab.traffic`): labkitd sends the packets from the pod's
client process, waits for the trace, reads the rows before and after and records the step as evidence; the
client gets the :class:`~labkit.notebook.steps.Step` back to show. A TCP connection lives here too, by id
(``conn.new``, then ``conn.open|send|close|reset``). A user's own process in a pod is started by
:mod:`labkit.door.sandbox` as that user with exactly CAP_NET_RAW and CAP_NET_ADMIN, its stdio and exit status
on the caller's own pipes.
"""
from __future__ import annotations

import signal as _signal

from labkit.door.labs import Held
from labkit.door.verbs import Ctx, verb
from labkit.errors import LimitError, NotFoundError, RequestError

__all__ = ["stop_all", "stop_pod", "MAX_CONNS", "MAX_PACKET"]

#: TCP connections labkitd keeps per lab (the oldest closed ones go first).
MAX_CONNS = 2048
#: The largest crafted packet or payload a step sends.
MAX_PACKET = 65535
_SIGNALS = {"SIGTERM": _signal.SIGTERM, "SIGINT": _signal.SIGINT, "SIGKILL": _signal.SIGKILL,
            "SIGHUP": _signal.SIGHUP, "SIGQUIT": _signal.SIGQUIT, "SIGUSR1": _signal.SIGUSR1,
            "SIGUSR2": _signal.SIGUSR2, "SIGCONT": _signal.SIGCONT, "SIGSTOP": _signal.SIGSTOP}


def _member(ctx: Ctx, key: str = "pod", kinds=("pod", "external")) -> str:
    name = ctx.args.str(key, max_len=64)
    kind = ctx.lab.topology.kind_of(name)  # NotFoundError lists every name
    if kind not in kinds:
        raise RequestError(f"`{ctx.verb}`: '{name}' is a {kind}; expected a {' or '.join(kinds)}")
    return name


def _handle(ctx: Ctx, name: str):
    lab = ctx.lab
    return lab.external(name) if lab.topology.kind_of(name) == "external" else lab.pod(name)


# -- steps ---------------------------------------------------------------------------------------
@verb("step.ping", change=True)
def _ping(ctx: Ctx):
    pod = _member(ctx, kinds=("pod",))
    target = ctx.args.str("target", max_len=64)
    count = ctx.args.int("count", 1, 100, 1)
    ctx.args.done()
    return ctx.lab.pod(pod).ping(target, count)


@verb("step.udp", change=True)
def _udp(ctx: Ctx):
    pod = _member(ctx)
    target = ctx.args.str("target", max_len=64)
    port = ctx.args.int("port", 1, 65535, 8080)
    data = ctx.args.hex("data", MAX_PACKET, b"hello")
    sport = ctx.args.int("sport", 1, 65535, None)
    ctx.args.done()
    return _handle(ctx, pod).udp(target, port, data, sport)


@verb("step.raw", change=True)
def _raw(ctx: Ctx):
    pod = _member(ctx)
    packet = ctx.args.hex("packet", MAX_PACKET)
    title = ctx.args.str("title", None, max_len=200)
    ctx.args.done()
    return _handle(ctx, pod).send(packet, title)


# -- TCP connections -----------------------------------------------------------------------------
def _conn_state(conn) -> dict:
    return {"id": conn.id, "pod": conn.pod, "target": conn.target, "port": conn.port, "sport": conn.sport,
            "src": conn.src, "dst": conn.dst, "state": conn.state, "loopback": conn.loopback,
            "redirected": conn.redirected, "outside": conn.outside}


@verb("conn.new", change=True)
def _conn_new(ctx: Ctx):
    """A TCP connection from a pod (or the external client), not yet open: its id and addresses."""
    pod = _member(ctx)
    target = ctx.args.str("target", max_len=64)
    port = ctx.args.int("port", 1, 65535, 8080)
    sport = ctx.args.int("sport", 1, 65535, None)
    ctx.args.done()
    held = ctx.held
    conn = _handle(ctx, pod).tcp(target, port, sport)
    if len(held.conns) >= MAX_CONNS:
        done = [i for i, c in held.conns.items() if c.state != "open"]
        if not done:
            raise LimitError(f"lab '{ctx.name}': {len(held.conns)} TCP connections open; labkitd keeps at most "
                             f"{MAX_CONNS} per lab (close some)")
        for i in done[: len(held.conns) - MAX_CONNS + 1]:
            del held.conns[i]
    held.conns[conn.id] = conn  # its id is unique in labkitd: the pod's client process knows it by it
    return _conn_state(conn)


def _conn(ctx: Ctx):
    cid = ctx.args.int("id", 1, 2**62)
    conn = ctx.held.conns.get(cid)
    if conn is None:
        raise NotFoundError(f"lab '{ctx.name}': no TCP connection {cid} (its lab was reset or taken down, or "
                            f"labkitd restarted); open a new one")
    return conn


@verb("conn.step", change=True)
def _conn_step(ctx: Ctx):
    """``open``, ``send`` (with ``data``), ``close`` or ``reset`` on connection ``id``: the Step and the
    connection's state after it."""
    conn = _conn(ctx)
    op = ctx.args.str("op", max_len=8)
    data = ctx.args.hex("data", MAX_PACKET, b"hello")
    ctx.args.done()
    if op == "open":
        step = conn.open()
    elif op == "send":
        step = conn.send(data)
    elif op == "close":
        step = conn.close()
    elif op == "reset":
        step = conn.reset()
    else:
        raise RequestError(f"`conn.step`: op {op!r}: expected open, send, close or reset")
    return {"step": step, "conn": _conn_state(conn)}


@verb("server_log")
def _server_log(ctx: Ctx):
    pod = _member(ctx, kinds=("pod",))
    ctx.args.done()
    return ctx.lab.pod(pod).server_log()


# -- a user's processes --------------------------------------------------------------------------
@verb("exec", change=False, fds=4)
def _exec(ctx: Ctx):
    """Start ``argv`` in a pod or node as the caller (CAP_NET_RAW and CAP_NET_ADMIN only), its stdin, stdout and
    stderr on the three descriptors the request carried and its exit status written to the fourth."""
    from labkit.door import sandbox

    name = _member(ctx, "name", kinds=("pod", "node", "external"))
    argv = ctx.args.strs("argv", max_items=1024, max_len=65536)
    env = ctx.args.mapping("env", None, max_items=256)
    cwd = ctx.args.str("cwd", None, max_len=4096)
    ctx.args.done()
    if not argv:
        raise RequestError("`exec`: argv is empty; expected a command")
    if len(ctx.fds) != 4:
        raise RequestError(f"`exec`: expected 4 file descriptors (stdin, stdout, stderr, status), got {len(ctx.fds)}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise RequestError("`exec`: env must map strings to strings")
    held = ctx.held
    lab = held.lab
    with ctx.labs.lock(held.key):
        _reap(held)
        if len(held.procs) >= ctx.labs.limits.procs_per_lab and not ctx.caller.instructor:
            raise LimitError(f"lab '{ctx.name}': {len(held.procs)} of your processes run in it; labkitd allows "
                             f"{ctx.labs.limits.procs_per_lab} at once")
        person = sandbox.Person.of_uid(ctx.caller.uid)
        started = sandbox.spawn(lab.topology.netns(name), lab.cgroup(name), person, list(argv), env=env, cwd=cwd,
                                stdin=ctx.fds[0], stdout=ctx.fds[1], stderr=ctx.fds[2], status_fd=ctx.fds[3])
        pid = held.next_id()
        held.procs[pid] = started
    return {"id": pid, "pid": started.pid}


@verb("signal")
def _signal_verb(ctx: Ctx):
    """Send a signal to a process the caller started in this lab (``exec``)."""
    from labkit.door import sandbox

    pid = ctx.args.int("id", 1, 2**62)
    name = ctx.args.str("signal", "SIGTERM", max_len=10)
    ctx.args.done()
    sig = _SIGNALS.get(name)
    if sig is None:
        raise RequestError(f"`signal`: {name!r}: expected one of {', '.join(_SIGNALS)}")
    started = ctx.held.procs.get(pid)
    if started is None:
        raise NotFoundError(f"lab '{ctx.name}': no process {pid} of yours")
    return sandbox.send_signal(started, sig)


def _reap(held: Held) -> None:
    """Forget the processes that have exited."""
    from labkit.net.ledger import process_start_time

    for pid, started in list(held.procs.items()):
        if started.start is None or process_start_time(started.pid) != started.start:
            del held.procs[pid]


def stop_all(held: Held) -> None:
    """Kill every process users started in the lab (it is going down)."""
    from labkit.door import sandbox

    for started in list(held.procs.values()):
        try:
            sandbox.send_signal(started, _signal.SIGKILL)
        except OSError:
            pass
    held.procs.clear()
    held.conns.clear()
    run = held.extra.pop("kp", None)
    if run is not None:
        run.down()


def stop_pod(held: Held, pod: str) -> None:
    """Kill the processes users started in ``pod`` (it is being deleted)."""
    from labkit.door import sandbox

    netns = held.lab.topology.netns(pod)
    for pid, started in list(held.procs.items()):
        if started.netns == netns:
            try:
                sandbox.send_signal(started, _signal.SIGKILL)
            except OSError:
                pass
            del held.procs[pid]
    for cid, conn in list(held.conns.items()):
        if conn.pod == pod:
            del held.conns[cid]
