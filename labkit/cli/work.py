"""The learner's notebooks: ``labkit work sync`` and ``labkit export`` (no root needed; :mod:`labkit.workdir`).

    labkit work sync                      # make ~/work from labs/, or bring a project update in beside your copies
    labkit work sync --dir /home/vagrant/work --labs /home/vagrant/labkit/labs
    labkit export                         # your notebooks as ~/handin/USER-labkit-work-….tar.gz
    labkit export --to -                  # ... to stdout, for the host:
                                          #   vagrant ssh -c 'labkit export --to -' -- -T > my-work.tar.gz
"""
from __future__ import annotations

import getpass
import sys
from pathlib import Path

from labkit.cli.common import CliError

__all__ = ["add_commands", "cmd_work_sync", "cmd_export", "HOST_RECIPE"]

#: How the host gets the notebooks out of the VM (rsync copies host → guest only).
HOST_RECIPE = "vagrant ssh -c 'labkit export --to -' -- -T > my-work.tar.gz"


def add_commands(add) -> None:
    """Add ``work`` and ``export`` to the parser (``add`` makes a subcommand)."""
    from labkit.workdir import STATE_FILE

    work = add("work", "your work folder: your own copies of the labs, which no sync or update overwrites"
               ).add_subparsers(dest="work_command", metavar="COMMAND", required=True)
    p = work.add_parser("sync", help="make the work folder from labs/, or bring changed labs in beside your copies",
                        description="Copy the labs that are new in labs/ into the work folder; a lab that changed in "
                                    "labs/ arrives beside your copy as 'NN-name (updated YYYY-MM-DD).ipynb'. No file "
                                    f"of yours is overwritten or deleted. What labkit put there is recorded in "
                                    f"{STATE_FILE}.")
    _dir_option(p)
    p.add_argument("--labs", type=Path, default=None, metavar="DIR",
                   help="the labs to copy from (default: labs/ of the checkout labkit runs from)")
    p.set_defaults(func=cmd_work_sync)

    p = add("export", "pack your notebooks into a .tar.gz to hand in or take home",
            description="Pack every notebook of the work folder (the labs, updated copies and your own) into a "
                        ".tar.gz with one folder named after you, as `labkit grade` reads it unpacked. From the "
                        f"host: {HOST_RECIPE}")
    _dir_option(p)
    p.add_argument("--to", default=None, metavar="DIR|-",
                   help="where the .tar.gz goes: a directory (default ~/handin) or - for stdout")
    p.add_argument("--name", default=None, help="the folder name inside the archive (default: your user name)")
    p.set_defaults(func=cmd_export)


def _dir_option(p) -> None:
    p.add_argument("--dir", type=Path, default=None, metavar="DIR",
                   help="the work folder (default: $LABKIT_WORKDIR, else ~/work)")


def cmd_work_sync(args) -> int:
    from labkit.workdir import default_labs, default_workdir, lab_files, sync

    work = args.dir or default_workdir()
    labs = args.labs or default_labs()
    changes = sync(labs, work)
    for c in changes:
        print(f"  {c}")
    n = len(lab_files(labs))
    beside = sum(c.kind == "beside" for c in changes)
    summary = f"work folder {work}: {n} lab file(s) in {labs}; " + (
        f"{len(changes)} change(s)" if changes else "nothing new")
    if beside:
        summary += f"; {beside} updated lab(s) arrived beside your copies (yours are untouched)"
    print(summary)
    return 0


def cmd_export(args) -> int:
    from labkit.workdir import default_workdir, export

    work = args.dir or default_workdir()
    name = args.name or getpass.getuser()
    if "/" in name or name in ("", ".", ".."):
        raise CliError(f"--name {name!r}: expected a plain folder name")
    if args.to == "-":
        if sys.stdout.isatty():
            raise CliError("--to -: the archive is binary; send stdout to a file (labkit export --to - > work.tar.gz)")
        _, notebooks = export(work, sys.stdout.buffer, name=name)
        print(f"labkit: exported {len(notebooks)} notebook(s) from {work}", file=sys.stderr)
        return 0
    dest = Path(args.to) if args.to else Path.home() / "handin"
    path, notebooks = export(work, dest, name=name)
    print(f"exported {len(notebooks)} notebook(s) from {work} to {path}")
    for rel in notebooks:
        print(f"  {name}/{rel}")
    print(f"from the host (outside the VM): {HOST_RECIPE}")
    return 0
