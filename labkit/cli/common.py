"""What every command group shares: the default lab, argument types, attaching to the lab through labkitd,
printing JSON and tables, and the --json / --show-command options.

Every lab command is a client of labkitd (:mod:`labkit.client`): :func:`attach` is one request, and so is
each thing a command then asks of the lab. Nothing here needs root.

    >>> lab_name("demo"), lab_name("demo_u1000")
    ('demo', 'demo_u1000')
"""
from __future__ import annotations

from dataclasses import fields
import argparse
import json

from labkit.errors import LabkitError
from labkit.net.topology import LAB_KEY, LAB_NAME

__all__ = ["ON_OFF", "DEFAULT_LAB", "LAB_NAME", "LAB_KEY", "TIMEOUT_NAMES", "POLL", "CliError", "attach",
           "agent_services", "print_json", "table", "lab_name", "ct_timeout", "count", "port", "output_options"]

#: The values of a switch on the command line.
ON_OFF = ("on", "off")

DEFAULT_LAB = "demo"
POLL = 0.05


def __getattr__(name: str):
    if name == "TIMEOUT_NAMES":  # the CT lifetimes' names; computed on use (the config module is not small)
        from labkit.config import CtTimeouts

        return tuple(f.name for f in fields(CtTimeouts))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- argument types ------------------------------------------------------------
def lab_name(value: str) -> str:
    """A lab as ``--lab`` names it: your lab's name (``demo``), or a lab's key (``demo_u1000``: user 1000's lab
    ``demo``), which labkitd lets instructors use for anyone's lab and refuses otherwise."""
    if not LAB_KEY.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"lab name {value!r}: expected 1-24 characters of a-z, 0-9 and '-', starting with a letter or digit "
            f"(or a lab key NAME_u<UID>)"
        )
    return value


def ct_timeout(value: str) -> tuple[str, int]:
    """``NAME=SECONDS`` → ``(NAME, SECONDS)``."""
    name, sep, seconds = value.partition("=")
    name = name.strip().replace("-", "_")
    names = __getattr__("TIMEOUT_NAMES")
    if not sep or name not in names:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected NAME=SECONDS with NAME one of {', '.join(names)}"
        )
    try:
        secs = int(seconds.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: SECONDS must be a whole number, got {seconds!r}") from None
    if not 1 <= secs <= 2**31:
        raise argparse.ArgumentTypeError(f"{value!r}: SECONDS must be from 1 to 2^31, got {secs}")
    return name, secs


def count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {n}")
    return n


def port(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {n}")
    return n


# -- helpers -------------------------------------------------------------------
class CliError(LabkitError):
    """An error the command line itself found."""


def attach(args):
    """Lab ``args.lab`` as labkitd holds it (:class:`labkit.client.Lab`): NotFoundError when it is not up,
    AccessError when it is not yours, DoorDownError when no labkitd answers."""
    from labkit.client import Lab

    try:
        return Lab.attach(args.lab)
    except LabkitError:
        raise
    except (ValueError, KeyError, TypeError) as exc:  # an answer this client cannot read (labkitd of another version)
        raise CliError(
            f"lab '{args.lab}': labkitd's description of it is unreadable ({type(exc).__name__}: {exc}); "
            f"`labkit --lab {args.lab} cleanup` removes what it created"
        ) from None


def agent_services(args):
    """``lab.services`` of lab ``args.lab``: the agent's own client, its requests carried by labkitd."""
    return attach(args).services


def print_json(data) -> None:
    print(json.dumps(data, indent=2))


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]



def output_options(p: argparse.ArgumentParser, json_help: str, show_command: str | None = None) -> None:
    """The options every listing shares: ``--json`` (what it prints as JSON) and, where the data has a real
    command behind it, ``--show-command`` (print those commands first, as '# ' lines)."""
    p.add_argument("--json", action="store_true", help=json_help)
    if show_command is not None:
        p.add_argument("--show-command", action="store_true", help=show_command)
