"""labkitd's verbs of lab 09's measurement: kube-proxy's iptables mode against the eBPF agent
(:class:`labkit.lab.kpcompare.ServiceModes`), run on the privileged side in two second labs of the caller's
(``<lab>-bipt`` and ``<lab>-bebpf``), one step per request so a notebook spreads it over cells.

Progress lines (``[done/total] text``) come back with each answer, for the client to show.
"""
from __future__ import annotations

from labkit.door.owners import owner_of, variant_key
from labkit.door.verbs import Ctx, verb
from labkit.errors import LabStateError, LimitError, RequestError

__all__ = ["MAX_SIZE"]

#: The most services a learner's measurement may load into each of its labs.
MAX_SIZE = 10_000


def _session(ctx: Ctx):
    run = ctx.held.extra.get("kp")
    if run is None:
        raise LabStateError(f"lab '{ctx.name}': no service-mode measurement is up; expected `kp.up` first")
    return run


def _answer(run, value) -> dict:
    lines = run.ticks[:]
    run.ticks.clear()
    return {"value": value, "progress": lines}


@verb("kp.up", change=True)
def _kp_up(ctx: Ctx):
    """Bring up the measurement's two labs (any left from an earlier run are removed first)."""
    from labkit.lab.kpcompare import ServiceModes

    sizes = ctx.args.any("sizes")
    rounds = ctx.args.int("rounds", 1, 50, 5)
    connects = ctx.args.int("connects", 1, 1000, 50)
    stall_sizes = ctx.args.any("stall_sizes")
    tracing = ctx.args.bool("tracing", False)
    ctx.args.done()
    for what, value in (("sizes", sizes), ("stall_sizes", stall_sizes)):
        if value is not None and (not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value) or len(value) > 10):
            raise RequestError(f"`kp.up`: {what} must be a list of at most 10 whole numbers, got {value!r:.60}")
    if not sizes:
        raise RequestError("`kp.up`: sizes is missing")
    if max(sizes) > MAX_SIZE and not ctx.caller.instructor:
        raise LimitError(f"`kp.up`: {max(sizes)} services; labkitd allows a learner's measurement {MAX_SIZE}")
    held = ctx.held
    old = held.extra.pop("kp", None)
    if old is not None:
        old.down()
    ticks: list[str] = []
    names = {"iptables": variant_key(held.key, "bipt"), "ebpf": variant_key(held.key, "bebpf")}
    run = ServiceModes(tuple(sizes), lambda done, total, text: ticks.append(f"[{done}/{total}] {text}"),
                       rounds=rounds, connects=connects, tracing=tracing, stall_sizes=stall_sizes,
                       owner=owner_of(held.key), names=names)
    run.ticks = ticks
    held.extra["kp"] = run
    try:
        run.up()
    except BaseException:
        held.extra.pop("kp", None)
        run.down()
        raise
    return _answer(run, {"names": names, "total": run.total})


@verb("kp.measure", change=True)
def _kp_measure(ctx: Ctx):
    n = ctx.args.int("n", 2, 100_000)
    ctx.args.done()
    run = _session(ctx)
    return _answer(run, run.measure(n))


@verb("kp.stall", change=True)
def _kp_stall(ctx: Ctx):
    ctx.args.done()
    run = _session(ctx)
    return _answer(run, run.stall())


@verb("kp.result")
def _kp_result(ctx: Ctx):
    ctx.args.done()
    run = _session(ctx)
    return _answer(run, run.result())


@verb("kp.down", change=True)
def _kp_down(ctx: Ctx):
    ctx.args.done()
    run = ctx.held.extra.pop("kp", None)
    if run is not None:
        run.down()
    return {"value": None, "progress": []}
