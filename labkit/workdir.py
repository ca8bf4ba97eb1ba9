"""The learner's work folder: their own copies of the labs, which labkit never writes over.

In the VM, JupyterLab serves ``/home/vagrant/work``, not the repo's ``labs/``: the repo arrives with rsync
``--delete`` at every ``vagrant up``/``reload`` (or is unpacked anew at ``vagrant provision``), which would
overwrite a saved notebook and delete a new one. :func:`sync` (``labkit work sync``, run by provisioning)
makes the work folder from ``labs/`` and keeps it in step with a project update without touching the
learner's work:

=====================================  =============================================================
in ``labs/``, since the last sync      in the work folder
=====================================  =============================================================
new                                    copied (``added``)
unchanged                              nothing, whatever the learner did to their copy
changed                                the new version is written *beside* the learner's copy as
                                       ``NN-name (updated YYYY-MM-DD).ipynb`` (``beside``), even
                                       a copy they never touched: JupyterLab may hold it open
deleted                                the learner's copy stays
removed by the learner                 not brought back, unless ``labs/`` changed it since
=====================================  =============================================================

What labkit last put there is remembered in ``.labkit-work.json`` in the work folder (a SHA-256 per file).
Only regular files below ``labs/`` are copied: no symlinks, no hidden files, so the answer keys in
``instructor/`` never reach the work folder. :func:`export` packs the learner's notebooks into a
``.tar.gz`` (``labkit export``) whose one folder, named after the learner, is what ``labkit grade`` reads.

    >>> import tempfile; from pathlib import Path
    >>> tmp = Path(tempfile.mkdtemp()); (tmp / "labs").mkdir()
    >>> _ = (tmp / "labs" / "01-tour.ipynb").write_text("v1")
    >>> [str(c) for c in sync(tmp / "labs", tmp / "work")]
    ['added 01-tour.ipynb']
    >>> _ = (tmp / "work" / "01-tour.ipynb").write_text("v1 + my answers")
    >>> _ = (tmp / "labs" / "01-tour.ipynb").write_text("v2")
    >>> [str(c) for c in sync(tmp / "labs", tmp / "work", today="2026-12-01")]
    ['beside 01-tour (updated 2026-12-01).ipynb (01-tour.ipynb changed in labs/; your copy is kept)']
    >>> (tmp / "work" / "01-tour.ipynb").read_text()
    'v1 + my answers'
"""
from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from labkit.errors import LabkitError, NotFoundError

__all__ = ["STATE_FILE", "Change", "WorkdirError", "default_workdir", "default_labs", "lab_files", "sync",
           "learner_notebooks", "export"]

#: What labkit last put in the work folder, per file: ``{"version": 1, "files": {"01-tour.ipynb": sha256}}``.
STATE_FILE = ".labkit-work.json"
_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints"}


class WorkdirError(LabkitError, OSError):
    """The work folder or the labs folder cannot be used as asked."""


@dataclass(frozen=True)
class Change:
    """One thing :func:`sync` did: ``kind`` is ``added`` (at the lab's own name) or ``beside`` (next to the
    learner's copy)."""

    kind: str
    name: str
    note: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.name}" + (f" ({self.note})" if self.note else "")


def default_workdir() -> Path:
    """``$LABKIT_WORKDIR``, else ``~/work`` (in the VM: ``/home/vagrant/work``)."""
    return Path(os.environ.get("LABKIT_WORKDIR") or Path.home() / "work")


def default_labs() -> Path:
    """The ``labs/`` folder of the checkout this labkit runs from."""
    return Path(__file__).resolve().parents[1] / "labs"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _hidden_or_cache(rel: Path) -> bool:
    return any(part.startswith(".") or part in _SKIP_DIRS for part in rel.parts)


def lab_files(labs: Path) -> list[str]:
    """The files below ``labs`` a learner gets, as sorted POSIX paths relative to it: regular files only (a
    symlink could lead to ``instructor/``), no hidden files, no caches.

        >>> import tempfile; from pathlib import Path
        >>> d = Path(tempfile.mkdtemp()); _ = (d / "01.ipynb").write_text("{}"); _ = (d / ".hidden").write_text("")
        >>> (d / "key.json").symlink_to(d / "01.ipynb"); lab_files(d)
        ['01.ipynb']
    """
    if not labs.is_dir():
        raise NotFoundError(f"labs folder {labs}: expected a directory with the lab notebooks, found "
                            f"{'a file' if labs.exists() else 'nothing'}")
    out = []
    for dirpath, dirnames, filenames in os.walk(labs):  # os.walk does not follow symlinked directories
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS]
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(labs)
            if not _hidden_or_cache(rel) and path.is_file() and not path.is_symlink():
                out.append(rel.as_posix())
    return sorted(out)


def _read_state(work: Path) -> dict[str, str]:
    path = work / STATE_FILE
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        files = data["files"]
        if not isinstance(files, dict):
            raise TypeError(f"'files' is a {type(files).__name__}")
    except (ValueError, KeyError, TypeError) as exc:
        raise WorkdirError(f"{path}: expected labkit's record of the lab files it put there, got something "
                           f"unreadable ({exc}); move it away and run `labkit work sync` again (your notebooks "
                           f"are not touched, a changed lab then arrives beside yours)") from None
    return {str(k): str(v) for k, v in files.items()}


def _write_state(work: Path, files: dict[str, str]) -> None:
    path = work / STATE_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": 1, "files": dict(sorted(files.items()))}, indent=1) + "\n")
    os.replace(tmp, path)
    _own_like(path, work)


def _own_like(path: Path, work: Path) -> None:
    """Run as root (provisioning), a new file belongs to the work folder's owner, not to root."""
    if os.geteuid() == 0:
        st = work.stat()
        os.chown(path, st.st_uid, st.st_gid)


def _copy(src: Path, dst: Path, work: Path) -> None:
    """Write ``src``'s bytes to ``dst`` through a temporary file (a crash never leaves half a notebook)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    for parent in reversed(dst.relative_to(work).parents[:-1]):
        _own_like(work / parent, work)
    tmp = dst.with_name(f".{dst.name}.labkit-tmp")
    tmp.write_bytes(src.read_bytes())
    os.chmod(tmp, 0o644)
    os.replace(tmp, dst)
    _own_like(dst, work)


def _beside(work: Path, rel: str, today: str, sha: str) -> Path:
    """A free name beside ``rel`` for the updated version: ``NN-name (updated DAY).ipynb``, then ``… 2)``; a file
    already holding these bytes is reused."""
    p = work / rel
    for n in range(1, 1000):
        tag = f"updated {today}" + (f" {n}" if n > 1 else "")
        cand = p.with_name(f"{p.stem} ({tag}){p.suffix}")
        if not cand.exists() or _sha(cand) == sha:
            return cand
    raise WorkdirError(f"{p}: 999 updated copies of it already exist; remove some")


def sync(labs: Path, work: Path, *, today: str | None = None) -> list[Change]:
    """Bring the work folder ``work`` in step with ``labs`` (see the module's table); returns what changed.
    Creates ``work`` if needed. No file that exists in ``work`` is ever written over."""
    labs, work = Path(labs), Path(work)
    today = today or datetime.date.today().isoformat()
    names = lab_files(labs)
    if work.exists() and not work.is_dir():
        raise WorkdirError(f"work folder {work}: expected a directory, found a file")
    work.mkdir(parents=True, exist_ok=True)
    state = _read_state(work)
    changes: list[Change] = []
    for rel in names:
        src, dst = labs / rel, work / rel
        new = _sha(src)
        old = state.get(rel)
        if old == new:
            continue  # labs/ did not change it: the learner's copy (or its absence) is theirs
        if not dst.exists():
            if old is None:
                _copy(src, dst, work)
                changes.append(Change("added", rel))
            else:  # the learner removed a lab that has changed since: the new version is not over anything
                _copy(src, dst, work)
                changes.append(Change("added", rel, "changed in labs/ since you removed your copy"))
        elif _sha(dst) == new:
            pass  # already these bytes (a first sync over an identical copy)
        else:
            target = _beside(work, rel, today, new)
            if not target.exists():
                _copy(src, target, work)
            changes.append(Change("beside", target.relative_to(work).as_posix(),
                                  f"{rel} changed in labs/; your copy is kept"))
        state[rel] = new
    _write_state(work, state)
    return changes


def learner_notebooks(work: Path) -> list[str]:
    """Every notebook in the work folder (sorted POSIX paths): the labs, updated copies and the learner's own
    notebooks; not Jupyter's checkpoints or hidden files."""
    work = Path(work)
    if not work.is_dir():
        raise NotFoundError(f"work folder {work}: not there (provisioning makes it: `labkit work sync`)")
    out = []
    for dirpath, dirnames, filenames in os.walk(work):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS]
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(work)
            if name.endswith(".ipynb") and not _hidden_or_cache(rel) and (work / rel).is_file():
                out.append(rel.as_posix())
    return sorted(out)


def export(work: Path, out: BinaryIO | Path, *, name: str,
           stamp: Callable[[str, bytes], bytes] | None = None) -> tuple[Path | None, list[str]]:
    """Pack the learner's notebooks into a ``.tar.gz`` whose one folder is ``name``/ (``labkit grade`` reads
    it unpacked: ``handin/NAME/01-tour.ipynb``). ``out`` is a directory (the file is made there, named
    ``NAME-labkit-work-YYYYmmdd-HHMMSS.tar.gz``) or an open binary stream (stdout). ``stamp(rel, data)``,
    if given, returns what goes into the archive for each notebook (the work folder's file is not touched).
    Returns (the file or None, the notebooks packed)."""
    work = Path(work)
    notebooks = learner_notebooks(work)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in notebooks:
            info = tar.gettarinfo(str(work / rel), arcname=f"{name}/{rel}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(work / rel, "rb") as f:
                if stamp is None:
                    tar.addfile(info, f)
                    continue
                data = stamp(rel, f.read())
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if isinstance(out, Path):
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{name}-labkit-work-{time.strftime('%Y%m%d-%H%M%S')}.tar.gz"
        path.write_bytes(buf.getvalue())
        return path, notebooks
    out.write(buf.getvalue())
    out.flush()
    return None, notebooks
