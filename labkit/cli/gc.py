"""``labkit gc``: run the CT garbage collector now, see its state, switch its timer."""
from __future__ import annotations

from labkit.agent.gc import SCAN_MODES
from labkit.cli import common
from labkit.cli.common import ON_OFF, output_options, print_json

__all__ = ["add_commands", "cmd_gc_run", "cmd_gc_status", "cmd_gc_timer"]


def add_commands(add) -> None:
    """Add the gc commands to the parser (``add`` makes a subcommand)."""
    gc = add("gc", "the CT garbage collector: delete expired entries now, or see its timer").add_subparsers(
        dest="gc_command", metavar="COMMAND", required=True)
    p = gc.add_parser("run", help="collect every node's CT maps now, as the agent's GC does",
                      description="Delete every CT entry whose lifetime is below the lab clock's now (and the NAT "
                                  "entries of a deleted OUT entry: its SNAT pair, or a DSRInternal entry's NAT "
                                  "entry), on every node; print what each map read and deleted, the time taken and "
                                  "the next interval.")
    p.add_argument("--mode", choices=SCAN_MODES, default=None,
                   help="per-entry: one lookup per entry and one delete per expired entry (v1.16); batch: "
                        "BPF_MAP_LOOKUP_BATCH and DELETE_BATCH (1.18+); default: the lab's release's")
    output_options(p, "the run as JSON")
    p.set_defaults(func=cmd_gc_run)
    p = gc.add_parser("status", help="the interval, the last run and the timer",
                      description="The GC's current interval, when it last ran (lab clock), whether its timer is on, "
                                  "and its last runs.")
    output_options(p, "the state and history as JSON")
    p.set_defaults(func=cmd_gc_status)
    p = gc.add_parser("timer", help="switch the GC timer on or off",
                      description="Switch the lab's GC timer on or off (off: only `gc run` collects).")
    p.add_argument("state", choices=ON_OFF)
    p.set_defaults(func=cmd_gc_timer)


def cmd_gc_run(args) -> int:
    lab = common.attach(args)
    run = lab.gc.run(args.mode)
    if args.json:
        print_json(run.to_json())
    else:
        print("\n".join(run.lines()))
    return 0


def cmd_gc_status(args) -> int:
    lab = common.attach(args)
    st = lab.gc.state()
    if args.json:
        print_json(st)
        return 0
    last = "never" if st["last_run"] is None else f"at lab clock {st['last_run']}"
    print(f"GC of lab {lab.name}: timer {'on' if st['timer'] else 'off'}, interval {st['interval']} s, "
          f"last run {last}; lab clock now {lab.clock.now()}")
    for run in st["runs"][-10:]:
        print(f"  {run['now']:>8}  {run['mode']:9} read {run['scanned']:>8} deleted {run['deleted']:>8} "
              f"ratio {run['ratio']:.4f}  {run['interval']} s -> {run['next_interval']} s")
    return 0


def cmd_gc_timer(args) -> int:
    lab = common.attach(args)
    lab.gc.set_timer(args.state == "on")
    print(f"GC timer of lab {lab.name} is {args.state}")
    return 0
