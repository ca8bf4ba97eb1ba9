"""``labkit clock``: the lab clock that CT lifetimes are measured on."""
from __future__ import annotations

from labkit.cli import common
from labkit.cli.common import CliError, output_options, print_json
from labkit import clock as lab_clock

__all__ = ["add_commands", "cmd_clock_advance", "cmd_clock_show"]


def add_commands(add) -> None:
    """Add the clock commands to the parser (``add`` makes a subcommand)."""
    clock = add("clock", "the lab clock that CT lifetimes are measured on").add_subparsers(
        dest="clock_command", metavar="COMMAND", required=True)
    p = clock.add_parser("advance", help="move the lab clock forward by SECONDS (so CT entries expire)",
                         description="Move the lab clock forward by SECONDS on every node.")
    p.add_argument("seconds", type=int, metavar="SECONDS", help="whole seconds >= 0")
    p.set_defaults(func=cmd_clock_advance)
    p = clock.add_parser("show", help="the lab clock now and its offset from CLOCK_MONOTONIC",
                         description="The lab clock now and its offset from CLOCK_MONOTONIC.")
    output_options(p, "print now, offset and mono as JSON")
    p.set_defaults(func=cmd_clock_show)


def cmd_clock_advance(args) -> int:
    if args.seconds < 0:
        raise CliError(f"clock advance: expected whole seconds >= 0, got {args.seconds} (the lab clock only goes "
                       f"forward)")
    lab = common.attach(args)
    now = lab.clock.advance(args.seconds)
    print(f"lab clock now {now} (offset {lab.clock.offset} s)")
    return 0


def cmd_clock_show(args) -> int:
    lab = common.attach(args)
    offset = lab.clock.offset
    mono = lab_clock.mono_seconds()
    if args.json:
        print_json({"now": mono + offset, "offset": offset, "mono": mono})
    else:
        print(f"lab clock now {mono + offset} (offset {offset} s)")
    return 0
