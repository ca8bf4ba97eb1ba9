"""The learner's work folder (labkit.workdir): first sync, learner edits kept, updates beside, export."""
from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from labkit import workdir
from labkit.workdir import STATE_FILE, Change, WorkdirError, export, learner_notebooks, sync

ROOT = Path(__file__).resolve().parents[2]


def _nb(text: str) -> str:
    """A small notebook whose one markdown cell says ``text``."""
    return json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": [text]}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture
def tree(tmp_path):
    """A repo-like tree: labs/ with two notebooks and a README, instructor/answers/ beside it, no work folder."""
    labs = tmp_path / "repo" / "labs"
    labs.mkdir(parents=True)
    (labs / "01-tour.ipynb").write_text(_nb("tour v1"))
    (labs / "02-tcp-conntrack.ipynb").write_text(_nb("tcp v1"))
    (labs / "README.md").write_text("# labs\n")
    answers = tmp_path / "repo" / "instructor" / "answers"
    answers.mkdir(parents=True)
    (answers / "01.json").write_text('{"answer": 42}')
    return labs, tmp_path / "work"


def _files(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


def test_first_sync_copies_every_lab(tree):
    """A first sync makes the work folder with a byte-for-byte copy of every lab file and reports each as added."""
    labs, work = tree
    changes = sync(labs, work)
    assert [str(c) for c in changes] == ["added 01-tour.ipynb", "added 02-tcp-conntrack.ipynb", "added README.md"]
    got = _files(work)
    assert got.pop(STATE_FILE)
    assert got == _files(labs)


def test_second_sync_keeps_learner_edits_and_new_notebooks(tree):
    """After the learner edits a lab and creates a notebook, a second sync (labs/ unchanged) changes nothing."""
    labs, work = tree
    sync(labs, work)
    (work / "01-tour.ipynb").write_text(_nb("tour v1 + my answer"))
    (work / "student-notes.ipynb").write_text(_nb("notes"))
    before = _files(work)
    assert sync(labs, work) == []
    assert _files(work) == before


def test_changed_lab_lands_beside_an_edited_copy(tree):
    """A lab changed in labs/ after the learner edited their copy arrives as 'NN-name (updated DAY).ipynb'; the
    learner's copy keeps their bytes; a second change on the same day gets its own name."""
    labs, work = tree
    sync(labs, work)
    mine = _nb("tcp v1 + my answer")
    (work / "02-tcp-conntrack.ipynb").write_text(mine)
    (labs / "02-tcp-conntrack.ipynb").write_text(_nb("tcp v2"))
    changes = sync(labs, work, today="2026-12-01")
    assert changes == [Change("beside", "02-tcp-conntrack (updated 2026-12-01).ipynb",
                              "02-tcp-conntrack.ipynb changed in labs/; your copy is kept")]
    assert (work / "02-tcp-conntrack.ipynb").read_text() == mine
    assert (work / "02-tcp-conntrack (updated 2026-12-01).ipynb").read_text() == _nb("tcp v2")
    assert sync(labs, work, today="2026-12-01") == []  # nothing new: no second copy
    (labs / "02-tcp-conntrack.ipynb").write_text(_nb("tcp v3"))
    assert [c.name for c in sync(labs, work, today="2026-12-01")] == ["02-tcp-conntrack (updated 2026-12-01 2).ipynb"]
    assert (work / "02-tcp-conntrack.ipynb").read_text() == mine


def test_changed_lab_lands_beside_an_untouched_copy(tree):
    """A lab changed in labs/ lands beside the learner's copy even when they never changed it (JupyterLab may
    hold it open): no existing file is written."""
    labs, work = tree
    sync(labs, work)
    (labs / "01-tour.ipynb").write_text(_nb("tour v2"))
    assert [c.kind for c in sync(labs, work, today="2026-12-01")] == ["beside"]
    assert (work / "01-tour.ipynb").read_text() == _nb("tour v1")
    assert (work / "01-tour (updated 2026-12-01).ipynb").read_text() == _nb("tour v2")


def test_new_lab_is_added_and_reported(tree):
    """A lab new in labs/ is copied in and reported; the others are untouched."""
    labs, work = tree
    sync(labs, work)
    (work / "01-tour.ipynb").write_text(_nb("mine"))
    (labs / "03-pod-to-pod.ipynb").write_text(_nb("pods"))
    assert [str(c) for c in sync(labs, work)] == ["added 03-pod-to-pod.ipynb"]
    assert (work / "01-tour.ipynb").read_text() == _nb("mine")


def test_lab_deleted_on_host_stays_in_work(tree):
    """A lab deleted from labs/ (or a labs/ without it) leaves the learner's copy in place."""
    labs, work = tree
    sync(labs, work)
    (work / "02-tcp-conntrack.ipynb").write_text(_nb("mine"))
    (labs / "02-tcp-conntrack.ipynb").unlink()
    assert sync(labs, work) == []
    assert (work / "02-tcp-conntrack.ipynb").read_text() == _nb("mine")


def test_lab_removed_by_learner_is_not_brought_back(tree):
    """A lab the learner deleted is not copied again while labs/ keeps the same version; a changed one is."""
    labs, work = tree
    sync(labs, work)
    (work / "01-tour.ipynb").unlink()
    assert sync(labs, work) == [] and not (work / "01-tour.ipynb").exists()
    (labs / "01-tour.ipynb").write_text(_nb("tour v2"))
    assert [c.kind for c in sync(labs, work)] == ["added"]
    assert (work / "01-tour.ipynb").read_text() == _nb("tour v2")


def test_existing_file_without_record_is_not_overwritten(tree):
    """A work folder whose record is gone (or a file the learner made first) keeps its files; labs/ arrives beside."""
    labs, work = tree
    work.mkdir()
    (work / "01-tour.ipynb").write_text(_nb("mine"))
    changes = sync(labs, work, today="2026-12-01")
    assert "beside 01-tour (updated 2026-12-01).ipynb" in [f"{c.kind} {c.name}" for c in changes]
    assert (work / "01-tour.ipynb").read_text() == _nb("mine")


def test_answers_never_reach_the_work_folder(tree):
    """Nothing of instructor/ lands in the work folder, even through a symlink or a hidden file in labs/."""
    labs, work = tree
    key = labs.parent / "instructor" / "answers" / "01.json"
    (labs / "answers.json").symlink_to(key)
    (labs / "answers").symlink_to(key.parent, target_is_directory=True)
    (labs / ".key.json").write_text(key.read_text())
    sync(labs, work)
    assert sorted(_files(work)) == [STATE_FILE, "01-tour.ipynb", "02-tcp-conntrack.ipynb", "README.md"]
    assert not any('"answer"' in text for text in _files(work).values())


def test_real_labs_give_no_answer_keys():
    """The repo's own labs/ yields notebooks and the README only, never an answer key."""
    names = workdir.lab_files(ROOT / "labs")
    assert names and all(n.endswith((".ipynb", ".md")) for n in names)
    assert not any("answer" in n or "instructor" in n for n in names)


def test_damaged_record_is_an_error_not_a_reset(tree):
    """An unreadable .labkit-work.json stops the sync with a WorkdirError naming the file; nothing is written."""
    labs, work = tree
    sync(labs, work)
    (work / "01-tour.ipynb").write_text(_nb("mine"))
    (work / STATE_FILE).write_text("{not json")
    with pytest.raises(WorkdirError, match=STATE_FILE) as exc:
        sync(labs, work)
    assert isinstance(exc.value, OSError)
    assert (work / "01-tour.ipynb").read_text() == _nb("mine")


def test_work_folder_that_is_a_file(tree):
    """A work folder path that is a file is a WorkdirError naming it, and the file is left alone."""
    labs, work = tree
    work.write_text("not a folder")
    with pytest.raises(WorkdirError, match="expected a directory, found a file"):
        sync(labs, work)
    assert work.read_text() == "not a folder"


def test_missing_labs_is_not_found(tmp_path):
    """A labs folder that does not exist is a NotFoundError that names it."""
    with pytest.raises(LookupError, match="nope"):
        sync(tmp_path / "nope", tmp_path / "work")


def test_learner_notebooks_skip_checkpoints_and_other_files(tree):
    """learner_notebooks lists every .ipynb of the work folder, subfolders too, but no checkpoint or non-notebook."""
    labs, work = tree
    sync(labs, work)
    (work / "mine").mkdir()
    (work / "mine" / "notes.ipynb").write_text(_nb("n"))
    (work / ".ipynb_checkpoints").mkdir()
    (work / ".ipynb_checkpoints" / "01-tour-checkpoint.ipynb").write_text(_nb("old"))
    assert learner_notebooks(work) == ["01-tour.ipynb", "02-tcp-conntrack.ipynb", "mine/notes.ipynb"]


def test_export_contains_exactly_the_learners_notebooks(tree, tmp_path):
    """export writes a .tar.gz with one folder named after the learner holding exactly their notebooks, bytes
    as saved (edited labs, updated copies, their own), and nothing else."""
    labs, work = tree
    sync(labs, work)
    (work / "01-tour.ipynb").write_text(_nb("tour + answer"))
    (labs / "02-tcp-conntrack.ipynb").write_text(_nb("tcp v2"))
    (work / "02-tcp-conntrack.ipynb").write_text(_nb("tcp + answer"))
    sync(labs, work, today="2026-12-01")
    (work / "student-notes.ipynb").write_text(_nb("notes"))
    (work / ".ipynb_checkpoints").mkdir()
    (work / ".ipynb_checkpoints" / "x-checkpoint.ipynb").write_text("{}")
    path, packed = export(work, tmp_path / "handin", name="ada")
    assert path.parent == tmp_path / "handin" and path.name.startswith("ada-labkit-work-")
    with tarfile.open(path) as tar:
        got = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert got == {
        "ada/01-tour.ipynb": _nb("tour + answer"),
        "ada/02-tcp-conntrack.ipynb": _nb("tcp + answer"),
        "ada/02-tcp-conntrack (updated 2026-12-01).ipynb": _nb("tcp v2"),
        "ada/student-notes.ipynb": _nb("notes"),
    }
    assert sorted(packed) == sorted(k.removeprefix("ada/") for k in got)


def test_export_to_a_stream(tree):
    """export to an open stream writes the same archive there and returns no path."""
    labs, work = tree
    sync(labs, work)
    buf = io.BytesIO()
    path, packed = export(work, buf, name="ada")
    assert path is None and packed == ["01-tour.ipynb", "02-tcp-conntrack.ipynb"]
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        assert sorted(tar.getnames()) == ["ada/01-tour.ipynb", "ada/02-tcp-conntrack.ipynb"]


def test_export_without_work_folder(tmp_path):
    """Exporting a work folder that does not exist is a NotFoundError saying how it is made."""
    with pytest.raises(LookupError, match="labkit work sync"):
        export(tmp_path / "work", tmp_path / "out", name="ada")
