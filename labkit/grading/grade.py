"""``labkit grade``: score handed-in notebooks, each re-executed in a fresh lab of its own.

    labkit grade alice/02-tcp.ipynb bob/02-tcp.ipynb [--jobs 2] [--csv | --json] [--html report.html]

Two sources, never mixed up:

- **the handed-in file** gives the learner's own record: per exercise the *answer* (the right-hand side
  of ``answer_02_1 = …`` in the answer cell, ``metadata.labkit.answer``) and the *tries* (the attempt
  number of the last check result saved in the file, the :data:`~labkit.grading.checks.CHECK_MIME` part of the
  check cell's output; 0 if never checked);
- **the re-execution** gives the *score*: the notebook runs headless (a copy; the file is never
  touched) in a lab of its own, ``g<pid>n<k>`` (plus ``--lab-tag``), and every ``check(...)`` appends its
  result to a log (``LABKIT_GRADE_LOG``); an exercise passes when its last logged check passed.

Notebooks run side by side (``--jobs``, default: the number of cores), each in a process of its own,
with a time limit per cell and per notebook: a notebook that raises, hangs or kills its kernel scores
what it reached and never stops the class. After each notebook its lab and the labs it started beside it
(:data:`labkit.lab.inventory.VARIANTS`) are taken down, whatever happened.

The learner's name is, when every file sits in a folder of its own per learner (no folder holds two notebooks
of one lab: ``alice/02-tcp.ipynb``, as ``labkit export`` packs them), the folder's name; else the notebook's
``metadata.labkit.learner``; else the file's name. The lab is ``metadata.labkit.lab`` or the number the file name
starts with. Who handed in what is never guessed:

- a recorded name that is not a name (:func:`learner_problem`: too long, a path separator, ``..``, NUL or
  a control character) makes the notebook a problem: it is not run and its name builds no path;
- a recorded name that differs from the folder of a per-learner layout is flagged (``name_mismatch``): the
  notebook counts for the folder's learner (``labkit export`` records its learner in every notebook it packs
  that has none, so a notebook copied from another's hand-in says whose it was);
- two notebooks of one lab under one name are a *conflict*: both are graded and reported, neither counts.

Every exercise gets a status (:data:`EXERCISE_STATUSES`: passed, failed, unanswered, not run, missing
evidence, grader error with its reason) and every notebook the list of what went wrong with its run
(:attr:`NotebookScore.statuses`: not run, timeout, dead kernel, grader error, cell errors, missing evidence,
conflict, name mismatch; ``ok`` when nothing did). Reports (table, CSV, JSON, HTML) are in
:mod:`labkit.grading.report`.
"""
from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from labkit.grading.jobs import JobResult, run_jobs
from labkit.grading.answers import canonical, rhs
from labkit.grading.checks import CHECK_MIME, exercises_for
from labkit.grading.headless import error_outputs, run_notebook
from labkit.errors import ConfigError, LabBusyError
from labkit.lab import Lab
from labkit.lab.inventory import VARIANTS
from labkit.net.ledger import LabLock, Ledger

__all__ = ["ExerciseScore", "NotebookScore", "Recorded", "HandedIn", "grade", "read_handed_in", "read_record",
           "learner_names", "learner_problem", "LEARNER_MAX", "EXERCISE_STATUSES", "NOTEBOOK_STATUSES", "score",
           "lab_of", "notebook_paths", "grade_lab_name", "default_jobs", "take_down", "CELL_TIMEOUT",
           "NOTEBOOK_TIMEOUT"]

# nbformat loads jsonschema, whose optional "iri" format check imports rfc3987_syntax, and that module builds
# an Earley parser for RFC 3987 when imported: about 2 s of CPU before the first notebook is read. No notebook
# schema uses that format, so a grading process goes without it (jsonschema skips a check whose module is missing).
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

CELL_TIMEOUT = 120  #: seconds a cell may run
NOTEBOOK_TIMEOUT = 600  #: seconds a notebook may run, kernel start included
#: Seconds past the notebook's limit before its process (and kernel) are killed outright; the
#: notebook stops itself at its limit, this is for a run that does not.
KILL_GRACE = 30
_LAB_MAX = 24  #: characters in a lab name (Topology.validate)
LEARNER_MAX = 64  #: characters in a learner's name
#: An exercise's status in a report.
EXERCISE_STATUSES = ("passed", "failed", "unanswered", "not run", "missing evidence", "grader error")
#: What can go wrong with a notebook's run (``ok``: nothing did), in the order reports list them.
NOTEBOOK_STATUSES = ("not run", "timeout", "dead kernel", "grader error", "cell errors", "missing evidence",
                     "conflict", "name mismatch")
#: How a check says its grader raised (keep in sync with labkit.grading.checks.check).
_GRADER_RAISED = ("could not check this answer:", "no exercise '")
_ANSWER_VAR = re.compile(r"^\s*answer_(\d+)_(\d+)\s*=(?!=)", re.M)
_CHECK_CALL = re.compile(r"""check\(\s*["'](\d+\.\d+)["']""")


@dataclass
class ExerciseScore:
    """One exercise of one handed-in notebook."""

    id: str
    title: str
    passed: bool  #: its last check in the re-execution passed
    status: str  #: one of EXERCISE_STATUSES: passed, failed, unanswered, not run, missing evidence, grader error
    message: str
    tries: int = 0  #: the learner's own tries, from the handed-in file
    answer: str | None = None  #: the right-hand side of the answer cell; None when unanswered
    checks: int = 0  #: results the re-execution logged for it


@dataclass
class NotebookScore:
    """One handed-in notebook, scored."""

    notebook: str
    lab: str
    learner: str = ""
    exercises: list[ExerciseScore] = field(default_factory=list)
    cell_errors: list[str] = field(default_factory=list)
    error: str | None = None  #: why the run stopped early (time limit, dead kernel) or did not run
    seconds: float = 0.0
    lab_name: str = ""  #: the lab it ran in (gone by the time this is read)
    teardown: str | None = None  #: what taking its labs down left behind, if anything
    stop: str | None = None  #: what ``error`` is: not run, timeout, dead kernel or grader error
    conflict: str | None = None  #: another notebook of this lab was handed in under this name
    name_mismatch: str | None = None  #: the recorded learner differs from the notebook's folder

    @property
    def score(self) -> int:
        return sum(e.passed for e in self.exercises)

    @property
    def statuses(self) -> list[str]:
        """What went wrong with this notebook, each of :data:`NOTEBOOK_STATUSES` at most once; ``["ok"]`` if nothing.

        >>> NotebookScore("a/02.ipynb", "02", "a", cell_errors=["cell 3: NameError: x"], stop="timeout").statuses
        ['timeout', 'cell errors']
        """
        found = {self.stop or ("grader error" if self.error else None),
                 "cell errors" if self.cell_errors else None,
                 "missing evidence" if any(e.status == "missing evidence" for e in self.exercises) else None,
                 "conflict" if self.conflict else None, "name mismatch" if self.name_mismatch else None}
        return [s for s in NOTEBOOK_STATUSES if s in found] or ["ok"]

    def to_json(self) -> dict:
        return {**asdict(self), "score": self.score, "total": len(self.exercises), "statuses": self.statuses}


@dataclass(frozen=True)
class Recorded:
    """What the handed-in file says of one exercise."""

    tries: int = 0  #: attempt number of the last check result saved in the file
    answer: str | None = None  #: right-hand side of the answer cell; None when unanswered or no cell
    last: dict | None = None  #: that last saved check result


@dataclass
class HandedIn:
    """A handed-in notebook as read, before it runs."""

    path: Path
    nb: object | None  #: the notebook (None when the file could not be read)
    lab: str
    learner: str = ""
    problem: str | None = None  #: why it cannot be graded
    conflict: str | None = None  #: another notebook of this lab under this learner's name
    name_mismatch: str | None = None  #: the recorded learner differs from the folder it sits in


# -- the handed-in file --------------------------------------------------------------------------
def lab_of(path: Path, nb) -> str:
    """The lab id of a notebook: metadata ``labkit.lab`` (a number of one or two digits: it names the answer key
    read), else its file name's leading number."""
    meta = nb.metadata.get("labkit") if nb is not None else None
    lab = meta.get("lab") if isinstance(meta, dict) else None
    if lab:
        if not re.fullmatch(r"\d{1,2}", str(lab)):
            raise ValueError(f"notebook {path}: metadata.labkit.lab {_shown(lab)} is not a lab number such as 02")
        return str(lab).zfill(2)
    m = re.match(r"(\d+)", Path(path).name)
    if not m:
        raise ValueError(f"notebook {path}: no labkit.lab metadata and no leading lab number in its name")
    return m.group(1).zfill(2)


def notebook_paths(args: Iterable[str | Path]) -> list[Path]:
    """Files as given, and every ``*.ipynb`` below a folder given (checkpoints left out), in order."""
    out = []
    for arg in map(Path, args):
        if arg.is_dir():
            out += sorted(p for p in arg.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            out.append(arg)
    return out


def read_handed_in(paths: Iterable[str | Path]) -> list[HandedIn]:
    """Read each notebook, its lab and its learner; one that cannot be read is kept with its problem."""
    import nbformat

    items = []
    for path in map(Path, paths):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception as exc:  # not there, not JSON, not a notebook: reported, never fatal
            items.append(HandedIn(path, None, _lab_or_blank(path), problem=f"cannot read it: {_first_line(exc)}"))
            continue
        try:
            items.append(HandedIn(path, nb, lab_of(path, nb)))
        except ValueError as exc:
            items.append(HandedIn(path, nb, "", problem=str(exc)))
    triples = [(i.path, i.nb, i.lab) for i in items]
    folders = _per_learner_folders(triples)
    for item, name in zip(items, learner_names(triples)):
        item.learner = name
        recorded = _recorded_learner(item.nb)
        if recorded is None:
            continue
        bad = learner_problem(recorded)
        if bad:
            item.problem = item.problem or f"metadata.labkit.learner {_shown(recorded)} is not a learner's name: {bad}"
        elif folders and recorded != item.path.resolve().parent.name:
            item.name_mismatch = (f"recorded learner {recorded!r} differs from its folder "
                                  f"{item.path.resolve().parent.name!r}")
    by_key: dict[tuple[str, str], list[HandedIn]] = {}
    for item in items:
        if item.lab and not item.problem:
            by_key.setdefault((item.learner, item.lab), []).append(item)
    for (name, lab), same in by_key.items():
        if len(same) > 1:
            for item in same:
                item.conflict = (f"{len(same)} notebooks of lab {lab} handed in under {name!r} "
                                 f"({', '.join(str(i.path) for i in same)}): none counts")
    return items


def learner_problem(name: object) -> str | None:
    """Why ``name`` is not a learner's name, or None when it is one: a short printable text (at most
    :data:`LEARNER_MAX` characters) without a path separator, ``..``, NUL or any other control character.

    >>> learner_problem("Ada Lovelace"), learner_problem("../../etc/x"), learner_problem("a\\x00b")
    (None, "a path separator ('/')", 'a control character (NUL)')
    """
    if not isinstance(name, str):
        return f"expected text, got {type(name).__name__}"
    if not name.strip():
        return "it is empty"
    if len(name) > LEARNER_MAX:
        return f"{len(name)} characters, at most {LEARNER_MAX}"
    sep = next((c for c in "/\\" if c in name), None)
    if sep:
        return f"a path separator ({sep!r})"
    bad = next((c for c in name if not c.isprintable() and c != " "), None)
    if bad is not None:
        return f"a control character ({'NUL' if bad == chr(0) else repr(bad)})"
    if ".." in name or name.strip() == ".":
        return "'..' or '.'"
    if name != name.strip():
        return "spaces at its start or end"
    return None


def _shown(value: object) -> str:
    """``value`` as a report may print it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _recorded_learner(nb) -> object | None:
    """``metadata.labkit.learner`` as recorded (any type), None when absent or empty."""
    labkit = nb.metadata.get("labkit", {}) if nb is not None else {}
    name = labkit.get("learner") if isinstance(labkit, dict) else None
    return None if name is None or name == "" else name


def _per_learner_folders(items: list[tuple[Path, object | None, str]]) -> bool:
    """Whether the files are laid out a folder per learner: each in a named folder, no folder holding two
    notebooks of one lab."""
    folders = [(Path(p).resolve().parent, lab) for p, _, lab in items]
    return bool(items) and all(str(Path(p).parent) not in ("", ".") for p, _, _ in items) \
        and len(set(folders)) == len(folders)


def _lab_or_blank(path: Path) -> str:
    try:
        return lab_of(path, None)
    except ValueError:
        return ""


def learner_names(items: list[tuple[Path, object | None, str]]) -> list[str]:
    """The learner of each ``(path, notebook, lab)``: the folder's name when the files are organised per
    learner (every file in a named folder, no folder holding two notebooks of one lab: what ``labkit export``
    packs, the folder is who handed it in; a recorded learner that differs is flagged by
    :func:`read_handed_in`); else ``metadata.labkit.learner`` when it is a name; else the file's name without
    ``.ipynb``.

    >>> learner_names([(Path("alice/02-tcp.ipynb"), None, "02"), (Path("bob/02-tcp.ipynb"), None, "02")])
    ['alice', 'bob']
    >>> learner_names([(Path("in/alice.ipynb"), None, "02"), (Path("in/bob.ipynb"), None, "02")])
    ['alice', 'bob']
    """
    def meta(nb) -> str:  # a recorded name that is not a name is not used (read_handed_in reports it)
        name = _recorded_learner(nb)
        return name if name is not None and learner_problem(name) is None else ""

    if _per_learner_folders(items):
        return [Path(p).resolve().parent.name for p, _, _ in items]
    return [meta(nb) or Path(p).stem for p, nb, _ in items]


def _cells(nb) -> list:
    return list(getattr(nb, "cells", []) or [])


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("labkit", {}) or {}


def answer_cells(nb) -> dict[str, int]:
    """Exercise id → index of its answer cell: ``metadata.labkit.answer``, else the (last) code cell that
    assigns ``answer_NN_M``."""
    out: dict[str, int] = {}
    guessed: dict[str, int] = {}
    for i, cell in enumerate(_cells(nb)):
        if cell.get("cell_type") != "code":
            continue
        ex = _meta(cell).get("answer")
        if ex:
            out[str(ex)] = i
        for a, b in _ANSWER_VAR.findall(cell.get("source", "")):
            guessed[f"{a}.{b}"] = i
    return {**guessed, **out}


def check_cells(nb) -> dict[str, int]:
    """Exercise id → index of its (first) check cell: ``metadata.labkit.check``, else a ``check("NN.M", …)`` call."""
    out: dict[str, int] = {}
    for i, cell in enumerate(_cells(nb)):
        if cell.get("cell_type") != "code":
            continue
        for ex in [_meta(cell).get("check")] + _CHECK_CALL.findall(cell.get("source", "")):
            if ex:
                out.setdefault(str(ex), i)
    return out


def saved_checks(nb) -> list[dict]:
    """Every check result saved in the notebook's outputs (the :data:`CHECK_MIME` part), in file order."""
    out = []
    for cell in _cells(nb):
        for o in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            rec = (o.get("data") or {}).get(CHECK_MIME) if o.get("output_type") in ("display_data",
                                                                                   "execute_result") else None
            if isinstance(rec, str):
                try:
                    rec = json.loads(rec)
                except ValueError:
                    rec = None
            if isinstance(rec, dict) and rec.get("exercise"):
                out.append(dict(rec))
    return out


def read_record(nb, exercise_ids: Iterable[str]) -> dict[str, Recorded]:
    """Exercise id → the learner's own :class:`Recorded` answer and tries, from the handed-in notebook."""
    last = {r["exercise"]: r for r in saved_checks(nb)}
    cells = answer_cells(nb)
    out = {}
    for ex in exercise_ids:
        answer = None
        if ex in cells:
            answer = rhs(_cells(nb)[cells[ex]].get("source", ""), "answer_" + ex.replace(".", "_"))
            if not answer or canonical(answer) == "None":
                answer = None
        saved = last.get(ex)
        tries = saved.get("attempt", 0) if saved else 0
        out[ex] = Recorded(int(tries) if isinstance(tries, (int, float)) else 0, answer, saved)
    return out


# -- scoring -------------------------------------------------------------------------------------
def score(item: HandedIn, logged: list[dict], run: dict | None = None, error: str | None = None,
          stop: str | None = None) -> NotebookScore:
    """Score ``item`` from what its re-execution ``logged`` (check results, in order) and ``run`` reported
    (``cell_errors``: [{cell, ename, evalue}], ``stopped_at``); ``error`` says why the run stopped early and
    ``stop`` what kind of stop it was (timeout, dead kernel, grader error; a problem of the file: not run)."""
    run = run or {}
    errors = run.get("cell_errors", [])
    if item.problem:
        stop = "not run"
    elif error and not stop:
        stop = "grader error"
    out = NotebookScore(str(item.path), item.lab, item.learner, error=error or item.problem,
                        cell_errors=[f"cell {e['cell']}: {e['ename']}: {e['evalue']}" for e in errors],
                        stop=stop, conflict=item.conflict, name_mismatch=item.name_mismatch)
    if not item.lab:
        return out
    exercises = exercises_for(item.lab)
    record = read_record(item.nb, [e.id for e in exercises]) if item.nb is not None else {}
    checks = check_cells(item.nb) if item.nb is not None else {}
    raised = {e["cell"]: f"{e['ename']}: {e['evalue']}" for e in errors}
    for ex in exercises:
        mine = [r for r in logged if r.get("exercise") == ex.id]
        last = mine[-1] if mine else None
        own = record.get(ex.id, Recorded())
        if last is not None and last.get("passed"):
            status, message = "passed", last.get("message", "")
        elif item.nb is None or item.problem:
            status, message = "not run", f"not graded: {out.error}"
        elif own.answer is None:
            status, message = "unanswered", "no answer given"
        elif last is None:
            status, message = "not run", _why_unchecked(checks.get(ex.id), run.get("stopped_at"), out.error,
                                                        raised)
        elif last.get("missing"):
            status, message = "missing evidence", last.get("message", "")
        elif str(last.get("message", "")).startswith(_GRADER_RAISED):
            status, message = "grader error", last.get("message", "")
        else:
            status, message = "failed", last.get("message", "")
        out.exercises.append(ExerciseScore(ex.id, ex.title, status == "passed", status, message, own.tries,
                                           own.answer, len(mine)))
    return out


def _why_unchecked(cell: int | None, stopped_at: int | None, error: str | None, raised: dict) -> str:
    if cell is None:
        return "its check cell is not in the notebook"
    if stopped_at is not None and cell >= stopped_at:
        return f"the run stopped before its check ({error})" if error else "the run stopped before its check"
    if cell in raised:
        return f"its check cell raised {raised[cell]}"
    if error:
        return f"its check never ran ({error})"
    return "its check never ran"


# -- running -------------------------------------------------------------------------------------
def grade_lab_name(k: int, tag: str = "", pid: int | None = None) -> str:
    """The lab notebook ``k`` runs in: ``g<pid>n<k><tag>``, short enough for its variant labs too.

    >>> grade_lab_name(3, "-x", pid=4242)
    'g4242n3-x'
    """
    name = f"g{os.getpid() if pid is None else pid}n{k}{tag}"
    longest = max(len(v) for v in VARIANTS) + 1
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or len(name) + longest > _LAB_MAX:
        raise ConfigError(f"grading lab name {name!r}: expected a-z, 0-9 and '-', at most {_LAB_MAX - longest} "
                          f"characters (its variant labs add up to {longest}); shorten the lab tag {tag!r}")
    return name


def _lab_names(base: str) -> list[str]:
    return [base, *(f"{base}-{v}" for v in VARIANTS)]


def _cleanup_here(name: str) -> None:
    """Tear down lab ``name`` in this process (root, the datapath side), if it left anything."""
    if Ledger(name).exists() or LabLock(name, "").path.exists():
        Lab.cleanup(name)


def take_down(base: str, attempts: int = 20, cleanup: Callable[[str], object] | None = None) -> list[str]:
    """Tear down lab ``base`` and its variant labs with ``cleanup(name)`` — the grader's: labkitd's, which
    the notebooks' kernels made them through (``labkit grade`` passes it) — or in this process as root;
    returns what could not be (one line per lab)."""
    cleanup = cleanup or _cleanup_here
    problems = []
    for name in _lab_names(base):
        for attempt in range(attempts):
            try:
                cleanup(name)
                break
            except LabBusyError as exc:  # a kernel still winding down holds it
                if attempt == attempts - 1:
                    problems.append(f"lab '{name}': {exc}")
                time.sleep(0.5)
            except Exception as exc:
                problems.append(f"lab '{name}': {type(exc).__name__}: {exc}")
                break
    return problems


def _quiet(workdir: str) -> None:
    """Send this process's (and its kernel's) stdout and stderr to a file: the parent's stdout is the report."""
    fd = os.open(os.path.join(workdir, "output.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def execute(job: dict) -> dict:
    """Run one notebook headless in its lab (the child process of a job): what ran, what raised, where it
    stopped. The grade log (``job["log"]``) gets every check result as it happens."""
    _quiet(job["workdir"])
    import nbformat
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(job["notebook"], as_version=4)
    deadline = time.monotonic() + job["notebook_timeout"]
    at: dict[str, int | None] = {"cell": None}

    def limit(cell) -> int:  # a cell's limit, and no later than the notebook's
        return max(1, int(min(job["cell_timeout"], deadline - time.monotonic()) + 0.999))

    def started(pid: int) -> None:  # the kernel's pid, for the parent to kill if all else fails
        Path(job["pidfile"]).write_text(str(pid))

    stopped = stop = None
    try:
        run_notebook(nb, job["lab"], job["log"], job["workdir"], job["cell_timeout"], timeout_func=limit,
                     shutdown_kernel="immediate", on_kernel=started, on_cell=lambda index: at.update(cell=index))
    except CellTimeoutError:
        stop = "timeout"
        if time.monotonic() >= deadline - 1:
            stopped = f"stopped at cell {at['cell']}: the notebook ran over its time limit ({job['notebook_timeout']:g} s)"
        else:
            stopped = f"stopped at cell {at['cell']}: the cell ran over its time limit ({job['cell_timeout']:g} s)"
    except DeadKernelError:
        stopped, stop = f"stopped at cell {at['cell']}: the kernel died", "dead kernel"
    except Exception as exc:  # the kernel would not start, a message it could not read: grade what ran
        stopped, stop = f"stopped at cell {at['cell']}: {_first_line(exc)}", "grader error"
    finally:
        left = take_down(job["lab"], cleanup=job.get("cleanup"))
    if job.get("executed"):
        nbformat.write(nb, job["executed"])
        # What the kernel and its lab printed (a dead kernel leaves nothing else): beside the copy.
        shutil.copyfile(os.path.join(job["workdir"], "output.log"), job["executed"] + ".output.log")
    errors = [{"cell": i, "ename": o.get("ename", ""), "evalue": o.get("evalue", "")} for i, o in error_outputs(nb)]
    return {"cell_errors": errors, "stopped": stopped, "stop": stop, "stopped_at": at["cell"] if stopped else None,
            "teardown": left}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _kill_kernel(job: dict) -> None:
    """Kill the job's kernel (and its process group) if it outlived its job; only a process whose environment
    names the job's lab is touched."""
    try:
        pid = int(Path(job["pidfile"]).read_text())
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError):
        return
    if f"LABKIT_LAB={job['lab']}".encode() not in env.split(b"\0"):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    for _ in range(100):  # reaped by init; wait until it is gone, it may hold the lab's lock
        if not Path(f"/proc/{pid}").exists() or _zombie(pid):
            return
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def finish(job: dict, result: JobResult) -> None:
    """After a job, however it ended: its kernel gone, its labs down (the child does both; this makes sure)."""
    _kill_kernel(job)
    left = take_down(job["lab"], cleanup=job.get("cleanup"))
    if left:
        raise RuntimeError("; ".join(left))


def _read_log(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:  # a line cut short by a killed run
                pass
    return out


def grade(paths: Iterable[str | Path], jobs: int | None = None, cell_timeout: float = CELL_TIMEOUT,
          notebook_timeout: float = NOTEBOOK_TIMEOUT, lab_tag: str = "", executed_dir: str | Path | None = None,
          progress: Callable[[int, int, NotebookScore], None] | None = None,
          executor: Callable[[dict], dict] = execute, kill_grace: float = KILL_GRACE,
          cleanup: Callable[[str], object] | None = None) -> list[NotebookScore]:
    """Re-execute and score every notebook (folders: every ``*.ipynb`` below), ``jobs`` at a time, each in
    a fresh lab that is torn down afterwards; the scores come back in the order given.
    ``executed_dir`` keeps each executed copy; ``progress(done, total, score)`` after each notebook.
    ``executor(job)`` runs one notebook in the job's child process (:func:`execute`; tests pass a fake);
    a run still going ``kill_grace`` seconds past its limit is killed with its kernel. ``cleanup(name)`` takes a
    notebook's labs down afterwards (:func:`take_down`; ``labkit grade`` passes labkitd's).

        >>> scores = grade(["alice/02-tcp.ipynb", "bob/02-tcp.ipynb"], jobs=2)   # doctest: +SKIP
        >>> [(s.learner, s.score) for s in scores]                                 # doctest: +SKIP
        [('alice', 6), ('bob', 5)]
    """
    items = read_handed_in(notebook_paths(paths))
    runnable = [i for i, item in enumerate(items) if item.problem is None]
    if executed_dir is not None:
        Path(executed_dir).mkdir(parents=True, exist_ok=True)
    scores: dict[int, NotebookScore] = {}
    done = 0

    def report(s: NotebookScore) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, len(items), s)

    for i, item in enumerate(items):
        if item.problem:
            scores[i] = score(item, [])
            report(scores[i])
    with tempfile.TemporaryDirectory(prefix="labkit-grade-") as tmp:
        work: list[dict] = []
        kept: set[str] = set()
        for k, i in enumerate(runnable):
            d = Path(tmp) / f"n{k}"
            d.mkdir()
            saved = Path(executed_dir) / _executed_name(items[i], k, kept) if executed_dir else None
            work.append({"index": i, "notebook": str(items[i].path), "lab": grade_lab_name(k, lab_tag),
                         "workdir": str(d), "log": str(d / "checks.jsonl"), "pidfile": str(d / "kernel.pid"),
                         "cell_timeout": cell_timeout, "notebook_timeout": notebook_timeout,
                         "executed": str(saved) if saved else None, "cleanup": cleanup})

        def scored(_done: int, _total: int, result: JobResult) -> None:
            job = work[result.index]
            run = result.value or {}
            stop = run.get("stop") if run.get("stopped") else _stop_kind(result.error)
            s = score(items[job["index"]], _read_log(Path(job["log"])), run, run.get("stopped") or result.error, stop)
            s.seconds, s.lab_name, s.teardown = round(result.seconds, 1), job["lab"], result.finish_error
            scores[job["index"]] = s
            report(s)

        if executor is execute and work:
            _preload()
        # Every object this process holds goes to the collector's permanent generation before the jobs fork:
        # a child's collections then never walk (and copy, page by page) the parent's heap.
        gc.collect()
        gc.freeze()
        try:
            run_jobs(work, executor, workers=jobs or default_jobs(), timeout=notebook_timeout + kill_grace,
                     finish=finish, progress=scored)
        finally:
            gc.unfreeze()
    return [scores[i] for i in range(len(items))]


def _executed_name(item: HandedIn, k: int, taken: set[str]) -> str:
    """The file name of an executed copy: ``<learner>-<file>`` when the learner's name is one (else
    ``notebook<k>-<file>``), ``-<k>`` added when taken; one path component, never outside the folder."""
    who = item.learner if learner_problem(item.learner) is None else f"notebook{k}"
    name = f"{who}-{item.path.name}"
    if name in taken or name.startswith("."):
        name = f"{who}-{k}-{item.path.name}"
    taken.add(name)
    if Path(name).name != name or name in (".", ".."):  # cannot happen with a checked name; never write elsewhere
        raise ValueError(f"executed copy name {name!r} is not one file name")
    return name


def _stop_kind(error: str | None) -> str | None:
    """The kind of stop :func:`run_jobs` reported: over its time limit (timeout), anything else (grader error)."""
    if not error:
        return None
    return "timeout" if "time limit" in error else "grader error"


def _preload() -> None:
    """Import, once and before the jobs' children fork, what each of them needs: the notebook client
    (:func:`execute`) and pyroute2 (:func:`take_down`). A child that imported them itself would pay about
    0.5 CPU-s a notebook for it. Importing starts no thread, loop or socket, so the fork stays safe."""
    import nbclient  # noqa: F401
    import nbformat  # noqa: F401
    from nbclient.exceptions import CellTimeoutError  # noqa: F401
    from pyroute2 import IPRoute  # noqa: F401


def default_jobs() -> int:
    """The number of cores this process may run on: ``--jobs``' default."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
