"""The learner's notebooks: ``labkit work sync`` and ``labkit export`` (no root needed; :mod:`labkit.workdir`).

    labkit work sync                      # make ~/work from labs/, or bring a project update in beside your copies
    labkit work sync --dir /home/vagrant/work --labs /home/vagrant/labkit/labs
    labkit export                         # your notebooks as ~/handin/NAME-labkit-work-….tar.gz
    labkit export --to -                  # ... to stdout, for the host:
                                          #   vagrant ssh -c 'labkit export --to -' -- -T > my-work.tar.gz
    labkit export --name "Ada Lovelace"   # under this name (default: the name kept in the work folder)

Who handed in what: the archive's one folder is the learner's name, never the machine's user (every VM's is
``vagrant``). The first ``labkit export`` on a terminal asks for it and keeps it in the work folder
(:data:`NAME_FILE`); later ones, and the host's ``--to -`` (no terminal), use it. ``--name`` overrides it
(and is kept when none is). The archive's copy of each notebook records the name in
``metadata.labkit.learner`` when it records none (the work folder's file is not touched). A name is a short printable text without a path separator, ``..``, NUL or a
control character (:func:`labkit.grading.grade.learner_problem`); anything else is one error line.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from labkit.cli.common import CliError

__all__ = ["add_commands", "cmd_work_sync", "cmd_export", "learner_name", "recorder", "HOST_RECIPE", "NAME_FILE"]

#: The learner's name, kept in the work folder by the first ``labkit export``.
NAME_FILE = ".labkit-learner"

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
    p.add_argument("--name", default=None,
                   help=f"your name, the folder inside the archive (default: the name kept in the work folder's "
                        f"{NAME_FILE}; the first export on a terminal asks for it)")
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
    if args.to == "-" and sys.stdout.isatty():
        raise CliError("--to -: the archive is binary; send stdout to a file (labkit export --to - > work.tar.gz)")
    name = learner_name(work, args.name)
    stamp = recorder(name, lambda note: print(f"labkit: {note}", file=sys.stderr))
    if args.to == "-":
        _, notebooks = export(work, sys.stdout.buffer, name=name, stamp=stamp)
        print(f"labkit: exported {len(notebooks)} notebook(s) from {work}", file=sys.stderr)
        return 0
    dest = Path(args.to) if args.to else Path.home() / "handin"
    path, notebooks = export(work, dest, name=name, stamp=stamp)
    print(f"exported {len(notebooks)} notebook(s) from {work} to {path}")
    for rel in notebooks:
        print(f"  {name}/{rel}")
    print(f"from the host (outside the VM): {HOST_RECIPE}")
    return 0


def recorder(name: str, note=lambda text: None):
    """``stamp(rel, data)`` for :func:`labkit.workdir.export`: the archive's copy of a notebook records
    ``metadata.labkit.learner = name`` when it records none; one that records another learner is packed as it is
    (``labkit grade`` flags it) and ``note(text)`` says so; a file that is not a notebook is packed as it is."""
    def stamp(rel: str, data: bytes) -> bytes:
        try:
            nb = json.loads(data)
        except ValueError:
            return data
        meta = nb.get("metadata") if isinstance(nb, dict) else None
        labkit = meta.setdefault("labkit", {}) if isinstance(meta, dict) else None
        if not isinstance(labkit, dict):
            return data
        if labkit.get("learner"):
            if labkit["learner"] != name:
                note(f"{rel} records the learner {str(labkit['learner'])[:80]!r}, not {name!r}: packed as it is, "
                     f"and your instructor's grading flags it")
            return data
        labkit["learner"] = name
        return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode("utf-8")

    return stamp


def _checked(name: str, where: str) -> str:
    from labkit.grading.grade import LEARNER_MAX, learner_problem

    bad = learner_problem(name)
    if bad:
        raise CliError(f"{where} {name[:LEARNER_MAX + 16]!r} is not a learner's name ({bad}): expected your name, "
                       f"at most {LEARNER_MAX} printable characters, no '/', '\\', '..' or control characters")
    return name


def learner_name(work: Path, given: str | None, ask=None) -> str:
    """The learner's name for an export of ``work``: ``given`` (``--name``), else the one kept in
    ``work/NAME_FILE``, else asked with ``ask(prompt)`` (default: on the terminal; none: an error saying how to
    give it). A name given or asked is kept when none is; a name that is not one is a :class:`CliError`."""
    kept_file = Path(work) / NAME_FILE
    try:
        kept = kept_file.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        kept = None
    if given is not None:
        name = _checked(given, "--name")
    elif kept is not None:
        return _checked(kept, f"the name kept in {kept_file}")
    else:
        ask = ask or _ask_on_terminal()
        if ask is None:
            raise CliError(f"no learner name yet: run `labkit export` once in the VM (it asks for your name and keeps "
                           f"it in {kept_file}), or pass --name \"Your Name\"")
        name = _checked(ask(f"Your name, as your instructor knows you (kept in {kept_file}): ").strip(), "the name")
    if kept is None and Path(work).is_dir():
        kept_file.write_text(name + "\n", encoding="utf-8")
    return name


def _ask_on_terminal():
    """``ask(prompt)`` reading a line from the terminal (the prompt on stderr), or None without a terminal."""
    if not sys.stdin.isatty():
        return None

    def ask(prompt: str) -> str:
        sys.stderr.write(prompt)
        sys.stderr.flush()
        return sys.stdin.readline()

    return ask
