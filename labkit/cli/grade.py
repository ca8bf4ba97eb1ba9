"""The instructor's commands: ``labkit grade`` and ``labkit answers``.

    labkit grade handin/                                  # every notebook below handin/, a table
    labkit grade */02-tcp.ipynb --jobs 2 --csv > class.csv
    labkit grade */*.ipynb --json --html report.html      # everything as JSON, and the class report
    labkit answers 02                                     # lab 02's answer key, with the misconceptions
    labkit answers 02 --json

``grade`` shows its progress on stderr (``graded 3/6 …``) and writes the report to stdout; warnings
(a notebook that stopped early or did not run, two hand-ins of one lab under one name — a conflict, neither
counts —, a recorded learner that differs from its folder) go to stderr. Every report gives each exercise and
each notebook a status (:mod:`labkit.grading.report`). Exit status 1 when a grading lab
could not be taken down. ``answers`` is for instructors: root, or a member of the group
``labkit-instructors``; anyone else is refused in one line.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, TextIO

from labkit.door.owners import INSTRUCTORS

__all__ = ["add_commands", "cmd_grade", "cmd_answers", "progress_bar", "is_instructor"]


def is_instructor() -> bool:
    """Whether this process is root or in the group ``labkit-instructors`` (its effective or a supplementary group),
    as labkitd tells its instructors."""
    import grp
    import os

    if os.geteuid() == 0:
        return True
    try:
        gid = grp.getgrnam(INSTRUCTORS).gr_gid
    except KeyError:  # no such group on this machine: only root
        return False
    return gid in os.getgroups() or gid == os.getegid()


def _at_least(kind: type, low: float, what: str) -> Callable[[str], float]:
    """An argparse type: ``kind(value)``, at least ``low``."""
    def parse(value: str):
        try:
            n = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"expected {what} of at least {low:g}, got {value}")
        return n

    return parse


def add_commands(add: Callable[..., argparse.ArgumentParser]) -> None:
    """Add ``grade`` and ``answers`` with ``add(name, help, description)`` (the CLI's sub-parser factory)."""
    from labkit.grading.grade import CELL_TIMEOUT, NOTEBOOK_TIMEOUT

    p = add("grade", "re-run handed-in notebooks, each in a fresh lab, and score them",
            "Re-run handed-in notebooks headless, each in a fresh lab of its own (torn down afterwards), and "
            "score every exercise; the learner's answers and tries come from the handed-in files.")
    p.add_argument("notebooks", nargs="+", metavar="NOTEBOOK", help="notebooks (.ipynb), or folders of them")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="everything as JSON")
    out.add_argument("--csv", action="store_true",
                     help="one row per learner: their status; per exercise passed, status, answer and tries; score "
                          "and total (cells escaped against formula injection)")
    p.add_argument("--html", metavar="FILE", help="also write the class report (pass rates, wrong answers, totals)")
    p.add_argument("--jobs", "-j", type=_at_least(int, 1, "a whole number"), default=None, metavar="N",
                   help="notebooks run side by side (default: the number of cores)")
    p.add_argument("--cell-timeout", type=_at_least(float, 1, "seconds"), default=CELL_TIMEOUT, metavar="SECONDS",
                   help=f"time limit per cell (default {CELL_TIMEOUT})")
    p.add_argument("--notebook-timeout", type=_at_least(float, 1, "seconds"), default=NOTEBOOK_TIMEOUT, metavar="SECONDS",
                   help=f"time limit per notebook; it then scores what it reached (default {NOTEBOOK_TIMEOUT})")
    p.add_argument("--lab-tag", default="", metavar="TAG",
                   help="appended to the grading labs' names (g<pid>n<k>TAG), to tell runs on one machine apart")
    p.add_argument("--keep-executed", metavar="DIR",
                   help="save each executed copy in DIR as LEARNER-FILE (a recorded name that is not a name is never "
                        "used), with what its kernel printed (.output.log), for a post-mortem")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_grade)

    p = add("answers", "print a lab's answer key: reference answers, wrong ones and their misconceptions",
            "Print a lab's answer key (instructor/answers/NN.json): each exercise's reference answer, and the "
            "wrong answers its check must fail with the misconception behind each.")
    p.add_argument("lab_id", metavar="LAB", help="the lab number, e.g. 02")
    p.add_argument("--json", action="store_true", help="the key as JSON")
    p.set_defaults(func=cmd_answers)


def progress_bar(stream: TextIO, width: int = 20):
    """``progress(done, total, score)`` writing ``graded 3/6 [######------] alice lab 02 5/6 (14 s)`` to
    ``stream``: one line rewritten in place on a terminal, a line per notebook otherwise."""
    tty = stream.isatty()

    def show(done: int, total: int, s) -> None:
        filled = width * done // max(total, 1)
        line = (f"graded {done}/{total} [{'#' * filled}{'-' * (width - filled)}] {s.learner} lab {s.lab or '?'} "
                f"{s.score}/{len(s.exercises)}" + (f" ({s.seconds:.0f} s)" if s.seconds else "")
                + ("" if s.statuses == ["ok"] else f" - {', '.join(s.statuses)}"))
        stream.write(("\r\033[K" + line + ("\n" if done == total else "")) if tty else line + "\n")
        stream.flush()

    return show


def cmd_grade(args) -> int:
    from labkit.grading.grade import default_jobs, grade, notebook_paths
    from labkit.grading.report import format_csv, format_html, format_json, format_table, plain, warnings

    from labkit.client import Lab
    from labkit.client.door import default_door

    default_door().call("hello")  # every notebook brings a lab up through labkitd: say once if none answers
    jobs = args.jobs or default_jobs()
    progress = None
    if not args.quiet:
        print(f"grading {len(notebook_paths(args.notebooks))} notebooks, {jobs} at a time, each in a fresh lab "
              f"(limits: {args.cell_timeout:g} s a cell, {args.notebook_timeout:g} s a notebook)", file=sys.stderr)
        progress = progress_bar(sys.stderr)
    scores = grade(args.notebooks, jobs=jobs, cell_timeout=args.cell_timeout, notebook_timeout=args.notebook_timeout,
                   lab_tag=args.lab_tag, executed_dir=args.keep_executed, progress=progress,
                   cleanup=Lab.cleanup)  # the notebooks' labs are the grader's, made through labkitd
    if args.json:
        print(json.dumps(format_json(scores), indent=2))
    elif args.csv:
        sys.stdout.write(format_csv(scores))
    else:
        print(format_table(scores))
    if args.html:
        with open(args.html, "w") as f:
            f.write(format_html(scores))
    for note in warnings(scores):
        print(f"labkit grade: {plain(note)}", file=sys.stderr)
    return 1 if any(s.teardown for s in scores) else 0


def cmd_answers(args) -> int:
    from labkit.cli.common import CliError
    from labkit.grading.answers import format_key, key_json, lab_id

    if not is_instructor():
        raise CliError(f"answers are for instructors (root or the group {INSTRUCTORS})")
    lab = lab_id(args.lab_id)  # ConfigError: the CLI says what a lab number looks like
    if args.json:
        print(json.dumps(key_json(lab), indent=2))
    else:
        print(format_key(lab))
    return 0
