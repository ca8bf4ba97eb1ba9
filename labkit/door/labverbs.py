"""labkitd's verbs of a lab's life and state: up, down, reset, status; the maps as typed rows; clock, faults,
trace and GC; the agent's API; snapshots and checks. Traffic is :mod:`labkit.door.traffic`'s.

Every verb is the datapath side's own method (:class:`labkit.lab.Lab`, :class:`labkit.agent.gc.LabGc`, the
Services' views), so what the client gets is what root would get in-process: no second implementation.
"""
from __future__ import annotations

from labkit.config import DatapathConfig
from labkit.door import evidence
from labkit.door.labs import Held
from labkit.door.owners import owner_of
from labkit.door.verbs import Ctx, name_in, verb
from labkit.errors import ConfigError, LabkitError, LimitError, NotFoundError, RequestError
from labkit.lab import Lab

__all__ = ["describe"]

#: What a learner (not an instructor) may ask of a lab's maps and rings at ``up``: Cilium's defaults.
_LEARNER_MAX = {"ct_tcp_size": 524288, "ct_any_size": 262144, "lb_map_size": 65536, "events_ring_pages": 1024,
                "hubble_buffer_size": 65535}
_AGENT_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def describe(ctx: Ctx, held: Held) -> dict:
    """What a client needs to hold a lab: its names, topology, options and state (pin dirs, devices, cgroups)."""
    lab = held.lab
    return {"name": name_in(ctx, held.key), "key": held.key, "owner": held.owner,
            "topology": lab.topology.to_dict(), "config": lab.config.to_dict(), "state": lab.state.to_dict()}


# -- life ----------------------------------------------------------------------------------------
@verb("up", change=True)
def _up(ctx: Ctx):
    """Bring the lab up (or attach to it when it runs with the same options); ``options`` are DatapathConfig's."""
    options = ctx.args.mapping("options", {})
    labels = ctx.args.mapping("labels", None)
    ctx.args.done()
    try:
        config = DatapathConfig().with_options(**options)
    except TypeError as exc:
        raise ConfigError(f"`up` options: {exc}") from None
    if not ctx.caller.instructor:
        for name, most in _LEARNER_MAX.items():
            if getattr(config, name) > most:
                raise LimitError(f"`up` of lab '{ctx.name}': {name}={getattr(config, name)}; labkitd allows a "
                                 f"learner at most {most}")
    if labels is not None:
        for pod, pod_labels in labels.items():
            if not isinstance(pod_labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                             for k, v in pod_labels.items()):
                raise RequestError(f"`up`: labels of pod {str(pod)[:40]!r} must map strings to strings")
    held = ctx.labs.up(ctx.caller, ctx.key, config, labels)
    return describe(ctx, held)


@verb("attach")
def _attach(ctx: Ctx):
    """The running lab's description (NotFoundError when it is not up)."""
    ctx.args.done()
    return describe(ctx, ctx.held)


@verb("down", change=True)
def _down(ctx: Ctx):
    """Take the lab down: stop what runs in it for the caller, then remove what its ledger recorded."""
    ctx.args.done()
    if not ctx.labs.exists(ctx.key):
        raise NotFoundError(f"lab '{ctx.name}' is not up; nothing to take down")
    held = ctx.labs.forget(ctx.key)
    if held is not None:
        from labkit.door.traffic import stop_all

        stop_all(held)
        held.lab._close_clients()
    removed = Lab.cleanup(ctx.key)  # its evidence stays until the lab is reset: a later check may read it
    _tries_restart(ctx.key, "down")
    return {"removed": len(removed)}


def _tries_restart(key: str, why: str) -> None:
    """A lab taken down starts its checks' tries again when it comes back (a new kernel on the same lab does not:
    the tries are labkitd's, not the kernel's); the checks file keeps every result, with this mark between."""
    from labkit.grading import checks

    checks.reset_attempts(lab=key)
    if evidence.read_checks(key):
        evidence.append_check(key, {"tries_restart": why})


@verb("cleanup", change=True)
def _cleanup(ctx: Ctx):
    """Remove what a (broken, half-built) lab's ledger recorded."""
    ctx.args.done()
    held = ctx.labs.forget(ctx.key)
    if held is not None:
        from labkit.door.traffic import stop_all

        stop_all(held)
        held.lab._close_clients()
    removed = Lab.cleanup(ctx.key)
    _tries_restart(ctx.key, "cleanup")
    return {"removed": len(removed)}


@verb("list", lab=False)
def _list(ctx: Ctx):
    """Every lab the caller may see, as ``labkit list`` prints them (its own by name, others' by key)."""
    from dataclasses import replace

    from labkit.door.owners import lab_key, name_of
    from labkit.lab.inventory import split_variant, summarize

    ctx.args.done()
    out = []
    for key in ctx.labs.visible(ctx.caller):
        summary = summarize(key)
        base, variant = split_variant(name_of(key))  # a user's variant: demo-snat_u1000 is demo's 'snat'
        summary = replace(summary, base=lab_key(owner_of(key), base), variant=variant)
        s = summary.to_dict()
        s.update(name=name_in(ctx, key), key=key, owner_uid=owner_of(key))
        out.append(s)
    return out


@verb("reset", change=True)
def _reset(ctx: Ctx):
    """Services, policies, CT and NAT state, faults and the clock back to a fresh lab's; topology kept."""
    ctx.args.done()
    ctx.lab.reset()
    return None


@verb("status")
def _status(ctx: Ctx):
    ctx.args.done()
    st = ctx.lab.status()
    st["lab"], st["key"], st["owner_uid"] = ctx.name, ctx.key, owner_of(ctx.key)
    return st


@verb("health")
def _health(ctx: Ctx):
    ctx.args.done()
    return ctx.lab.health()


# -- maps ----------------------------------------------------------------------------------------
def _node(ctx: Ctx, key: str = "node", default=...) -> str | None:
    node = ctx.args.str(key, default, max_len=64)
    if node is not None:
        ctx.lab.topology.node(node)  # NotFoundError lists the nodes
    return node


def _pod(ctx: Ctx, key: str = "pod") -> str:
    pod = ctx.args.str(key, max_len=64)
    ctx.lab.topology.pod(pod)
    return pod


@verb("ct")
def _ct(ctx: Ctx):
    node = _node(ctx)
    ctx.args.done()
    return ctx.lab.ct(node)


@verb("nat")
def _nat(ctx: Ctx):
    node = _node(ctx)
    ctx.args.done()
    return ctx.lab.nat(node)


@verb("conntrack")
def _conntrack(ctx: Ctx):
    node = _node(ctx)
    ctx.args.done()
    return ctx.lab.conntrack(node)


@verb("lb")
def _lb(ctx: Ctx):
    """A node's three Service maps at once (:class:`labkit.maps.lb.LbSnapshot`)."""
    node = _node(ctx)
    ctx.args.done()
    return ctx.lab.services.lb(node)


@verb("maglev")
def _maglev(ctx: Ctx):
    name = ctx.args.str("service", max_len=253)
    node = _node(ctx)
    ctx.args.done()
    return {str(k): v for k, v in ctx.lab.services.maglev(name, node).items()}


@verb("iptables")
def _iptables(ctx: Ctx):
    node = _node(ctx)
    table = ctx.args.str("table", "nat", max_len=16)
    ctx.args.done()
    if table not in ("nat", "filter", "mangle", "raw"):
        raise RequestError(f"`iptables`: table {table!r}: expected nat, filter, mangle or raw")
    return ctx.lab.services.iptables(node, table)


@verb("policy.get")
def _policy_get(ctx: Ctx):
    """A pod's policy map as the datapath holds it (the parts of ``PolicyMapView``)."""
    pod = _pod(ctx)
    ctx.args.done()
    view = ctx.lab.policy.get(pod)
    return {"pod": view.pod, "path": view.path, "rows": [str(r) for r in view.rows], "lines": view.lines,
            "expected": view.expected, "info": view.info}


@verb("sockops")
def _sockops(ctx: Ctx):
    """The keys of a node's ``cilium_sock_ops`` (sockmap on), as bpftool lists them."""
    from labkit.maps.sockmap import SOCKOPS_MAP, sock_keys

    node = _node(ctx)
    ctx.args.done()
    return [str(k) for k in sock_keys(f"{ctx.lab.pin_dir(node)}/{SOCKOPS_MAP}")]


@verb("bpftool")
def _bpftool(ctx: Ctx):
    """bpftool as root, read-only, on this lab's own pins and cgroups (:mod:`labkit.door.bpftool`)."""
    from labkit.door import bpftool
    from labkit.lab import BPFFS_ROOT

    member = ctx.args.str("node", None, max_len=64)
    args = ctx.args.strs("args", max_items=64)
    ctx.args.done()
    lab = ctx.lab
    if member is not None:
        lab.topology.kind_of(member)  # NotFoundError lists every name
    cg = [c for c in lab.state.cgroups.values()]
    netns = lab.topology.netns(member) if member else None
    return bpftool.run(args, netns=netns, pin_roots=[str(BPFFS_ROOT / ctx.key)], cgroups=cg)


# -- clock, faults, trace, GC --------------------------------------------------------------------
@verb("clock", change=True)
def _clock(ctx: Ctx):
    """The lab clock (``advance`` moves it ahead, recorded as evidence)."""
    advance = ctx.args.int("advance", 0, 10**9, None)
    ctx.args.done()
    lab = ctx.lab
    if advance:
        lab.clock.advance(advance)
    return {"now": lab.clock.now(), "offset": lab.clock.offset}


@verb("fault", change=True)
def _fault(ctx: Ctx):
    name = ctx.args.str("name", None, max_len=64)
    on = ctx.args.bool("on", True)
    ctx.args.done()
    if name is None:
        return ctx.lab.faults()
    return ctx.lab.fault(name, on)


@verb("aggregation", change=True)
def _aggregation(ctx: Ctx):
    level = ctx.args.any("level")
    ctx.args.done()
    if level is not None and not isinstance(level, (str, int)) or isinstance(level, bool):
        raise RequestError(f"`aggregation`: level must be a name or 0-4, got {level!r:.40}")
    return ctx.lab.monitor_aggregation(level)


@verb("trace_mode", change=True)
def _trace_mode(ctx: Ctx):
    mode = ctx.args.str("mode", None, max_len=16)
    ctx.args.done()
    return ctx.lab.trace_mode(mode)


@verb("events")
def _events(ctx: Ctx):
    """Trace records (``labkit trace``): from ``offset`` on (None: the last ``last`` of ``node``); the new offset."""
    from labkit.observe.trace import EVENT_SIZE

    offset = ctx.args.int("offset", 0, 2**62, None)
    last = ctx.args.int("last", 0, 100_000, 50)
    node = _node(ctx, default=None)
    ctx.args.done()
    log = ctx.lab.events()
    if offset is None:
        flows = _last_flows(log, last, node, EVENT_SIZE)
    else:
        if offset > log.offset:
            log.offset = offset - offset % EVENT_SIZE
        flows = [f for f in log.read()[:20_000] if node is None or f.node == node]
    return {"flows": flows, "offset": log.offset, "up": log.path.parent.exists()}


def _last_flows(log, n: int, node: str | None, size_of: int) -> list:
    """The last ``n`` flows (of ``node``) in time order, reading only the end of a long log."""
    import os

    if n == 0:
        log.seek_end()
        return []
    try:
        size = os.stat(log.path).st_size
    except FileNotFoundError:
        return []
    size -= size % size_of
    window = max(4 * n, 1024)
    end = size
    while True:
        start = max(log.offset, size - window * size_of)
        log.offset = start
        flows = [f for f in log.read() if node is None or f.node == node]
        if start <= log.offset and (start == 0 or len(flows) >= 2 * n) or window * size_of > end:
            break
        window *= 4
    flows.sort(key=lambda f: f.event.ts_ns)
    return flows[-n:]


@verb("hubble")
def _hubble(ctx: Ctx):
    """The Hubble ring's entries as GetFlowsResponse dicts (``labkit observe``): every entry from ``seq`` on,
    filtered client-side; with ``seq`` None the whole ring. Answers the ring's capacity and written count too."""
    from labkit.net.ledger import lab_dir
    from labkit.observe.hubble import Names, printed, response, ring_lost
    from labkit.observe.ring import HubbleRing

    seq = ctx.args.int("seq", 0, 2**62, None)
    ctx.args.done()
    lab = ctx.lab
    path = lab_dir(ctx.key) / "hubble.ring"
    try:
        ring = HubbleRing.open(path)
    except FileNotFoundError:
        raise NotFoundError(f"lab '{ctx.name}': no Hubble ring (is the lab's agent running? `labkit agent status`)") from None
    try:
        slots, skipped = ring.read(seq or 0)
        written, capacity = ring.written, ring.capacity
    finally:
        ring.close()
    names = Names.for_lab(lab)
    resps = [response(s, names) for s in slots]
    if seq and skipped:
        resps.insert(0, ring_lost(skipped))
    return {"responses": printed(resps, names), "seq": written, "capacity": capacity}


@verb("observe", change=True)
def _observe(ctx: Ctx):
    """A notebook's view of the Hubble ring (``observe(lab, title, ...)``), recorded as evidence."""
    from labkit.notebook.hubbleview import observe

    title = ctx.args.str("title", max_len=200)
    last = ctx.args.int("last", 0, 1_000_000, None)
    filters = {k: ctx.args.str(k, None, max_len=64) for k in ("from_pod", "to_pod", "verdict", "protocol")}
    port = ctx.args.int("port", 0, 65535, None)
    attrs = ctx.args.plain("attrs", {})
    ctx.args.done()
    if not isinstance(attrs, dict):
        raise RequestError("`observe`: attrs must be an object")
    return observe(ctx.lab, title, last=last, port=port, **filters, **attrs)


@verb("gc.run", change=True)
def _gc_run(ctx: Ctx):
    mode = ctx.args.str("mode", None, max_len=16)
    ctx.args.done()
    if mode not in (None, "per-entry", "batch"):
        raise RequestError(f"`gc.run`: mode {mode!r}: expected per-entry or batch")
    return ctx.lab.gc.run(mode)


@verb("gc.state")
def _gc_state(ctx: Ctx):
    ctx.args.done()
    return ctx.lab.gc.state()


@verb("gc.history")
def _gc_history(ctx: Ctx):
    ctx.args.done()
    return ctx.lab.gc.history()


@verb("gc.timer", change=True)
def _gc_timer(ctx: Ctx):
    on = ctx.args.bool("on")
    ctx.args.done()
    ctx.lab.gc.set_timer(on)
    return ctx.lab.gc.state()


@verb("gc.restart", change=True)
def _gc_restart(ctx: Ctx):
    ctx.args.done()
    ctx.lab.gc.restart()
    return ctx.lab.gc.state()


@verb("gc.fill", change=True)
def _gc_fill(ctx: Ctx):
    """Fill a node's TCP CT map with ``n`` synthetic rows, half of them expired (lab 08's batch-vs-per-entry run)."""
    from labkit.agent.gc import fill_synthetic

    node = _node(ctx)
    n = ctx.args.int("n", 1, 1_000_000)
    ctx.args.done()
    if n > ctx.lab.config.ct_tcp_size:
        raise LimitError(f"`gc.fill`: {n} rows do not fit node {node}'s TCP CT map of {ctx.lab.config.ct_tcp_size}")
    fill_synthetic(ctx.lab.pin_dir(node), n, ctx.lab.clock.now())
    ctx.lab.note_change()
    return n


@verb("flush_ct", change=True)
def _flush_ct(ctx: Ctx):
    node = _node(ctx, default=None)
    ctx.args.done()
    return ctx.lab.flush_ct(node)


@verb("delete_pod", change=True)
def _delete_pod(ctx: Ctx):
    pod = _pod(ctx)
    ctx.args.done()
    from labkit.door.traffic import stop_pod

    stop_pod(ctx.held, pod)
    return ctx.lab.delete_pod(pod)


# -- the agent -----------------------------------------------------------------------------------
@verb("agent", change=True)
def _agent(ctx: Ctx):
    """One call of the lab agent's API (Services, policy, endpoints, identities, the DNS cache), as the agent's
    own client makes it; the Services limit is kept here."""
    method = ctx.args.str("method", max_len=8)
    path = ctx.args.str("path", max_len=1024)
    body = ctx.args.any("body")
    ctx.args.done()
    if method not in _AGENT_METHODS:
        raise RequestError(f"`agent`: method {method!r}: expected one of {', '.join(_AGENT_METHODS)}")
    if not path.startswith("/v1/") or ".." in path or any(ord(ch) < 0x21 for ch in path):
        raise RequestError(f"`agent`: path {path[:80]!r}: expected an API path under /v1/")
    limit = ctx.labs.limits.services_per_lab
    if method in ("POST", "PUT") and path.split("?")[0] in ("/v1/service", "/v1/apply") or path.startswith("/v1/service/") and method == "PUT":
        adding = len(body) if path == "/v1/apply" and isinstance(body, list) else 1
        have = int(ctx.lab.services.client.healthz().get("services", 0))
        if have + adding > limit and not ctx.caller.instructor:
            raise LimitError(f"lab '{ctx.name}': {have} services and {adding} more; labkitd allows {limit} per lab")
    return ctx.lab.services.client.request(method, path, body)


@verb("agent.status")
def _agent_status(ctx: Ctx):
    ctx.args.done()
    return ctx.lab.agent_status()


@verb("agent.restart", change=True)
def _agent_restart(ctx: Ctx):
    ctx.args.done()
    return ctx.lab.restart_agent()


@verb("agent.logs")
def _agent_logs(ctx: Ctx):
    from labkit.agent.api import log_path

    tail = ctx.args.int("tail", 0, 100_000, 0)
    ctx.args.done()
    path = log_path(ctx.key)
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return {"lines": lines[-tail:] if tail else lines, "path": str(path)}


@verb("fqdn.resolve", change=True)
def _fqdn_resolve(ctx: Ctx):
    from labkit.lab.dnslookup import resolve

    pod = _pod(ctx)
    name = ctx.args.str("name", max_len=253)
    ctx.args.done()
    return resolve(ctx.lab, pod, name)


@verb("fqdn.cache")
def _fqdn_cache(ctx: Ctx):
    from labkit.lab.dnslookup import cache_list, wait_expired

    wait = ctx.args.bool("wait_expired", False)
    ctx.args.done()
    return wait_expired(ctx.lab) if wait else cache_list(ctx.lab)


# -- evidence and checks -------------------------------------------------------------------------
@verb("snapshot", change=True)
def _snapshot(ctx: Ctx):
    """Every node's CT and NAT rows now (and the Service maps, a node's Linux conntrack and nat table when asked),
    recorded as evidence under ``title``. ``extra`` is the learner's own note: kept, never graded."""
    title = ctx.args.str("title", max_len=200)
    lb = ctx.args.bool("lb", False)
    conntrack = _node(ctx, "conntrack", None)
    iptables = _node(ctx, "iptables", None)
    service = ctx.args.str("service", None, max_len=253)
    extra = ctx.args.plain("extra", None)
    ctx.args.done()
    return ctx.lab.snapshot(title, lb=lb, extra=extra, conntrack=conntrack, iptables=iptables, service=service)


@verb("check")
def _check(ctx: Ctx):
    """Grade an answer on the evidence labkitd recorded in the lab; the result is kept in the lab's checks file.
    With the lab not up the check says which cell to run first."""
    from labkit.grading import checks

    exercise = ctx.args.str("exercise", max_len=16)
    answer = ctx.args.plain("answer")
    reveal = ctx.args.bool("reveal", False)
    ctx.args.done()
    try:
        held = ctx.labs.get(ctx.key)
    except LabkitError:
        return checks.check(exercise, answer, lab=None, reveal=reveal).to_json(full=True)
    with ctx.labs.lock(held.key):
        result = checks.check(exercise, answer, lab=held.lab, reveal=reveal)
        data = result.to_json(full=True)
        evidence.append_check(held.key, {**data, "uid": ctx.caller.uid, "reveal": reveal})
    return data
