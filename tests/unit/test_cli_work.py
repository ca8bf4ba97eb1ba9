"""`labkit export` names the learner (labkit.cli.work): asked once on a terminal and kept in the work folder,
`--name` overriding, never the VM's user; a name that is not one is one error line and no archive."""
from __future__ import annotations

import io
import tarfile

import pytest

from labkit import cli
from labkit.cli.common import CliError
from labkit.cli.work import NAME_FILE, learner_name


@pytest.fixture
def work(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "02-tcp.ipynb").write_text("{}")
    return work


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _folders(archive: bytes) -> set[str]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name.split("/")[0] for m in tar.getmembers()}


def test_first_export_on_a_terminal_asks_the_name_and_keeps_it(work, tmp_path, monkeypatch, capsys):
    """No name kept and a terminal: export asks once, keeps the name in the work folder, and the archive's folder
    is that name; the next export (and `--to -` from the host, no terminal) uses it without asking."""
    monkeypatch.setattr("sys.stdin", _Tty("Ada Lovelace\n"))
    assert cli.main(["export", "--dir", str(work), "--to", str(tmp_path / "out")]) == 0
    assert "Your name, as your instructor knows you" in capsys.readouterr().err
    assert (work / NAME_FILE).read_text() == "Ada Lovelace\n"
    [archive] = (tmp_path / "out").glob("*.tar.gz")
    assert _folders(archive.read_bytes()) == {"Ada Lovelace"}

    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # `vagrant ssh -c '…' -- -T`: no terminal
    out = io.BytesIO()
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(out))
    assert cli.main(["export", "--dir", str(work), "--to", "-"]) == 0
    assert _folders(out.getvalue()) == {"Ada Lovelace"}


def test_no_name_and_no_terminal_is_an_error_never_the_vm_user(work, tmp_path, monkeypatch, capsys):
    """Without a kept name, --name or a terminal, export refuses in one line saying how to give the name,
    and writes no archive (it never files the work under the machine's user)."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["export", "--dir", str(work), "--to", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no learner name yet" in err[0] and "--name" in err[0]
    assert not (tmp_path / "out").exists() and not (work / NAME_FILE).exists()


def test_name_overrides_and_is_kept_only_when_none_is(work, tmp_path):
    """--name wins over the kept name; it is kept when none was, and never replaces one that was."""
    assert learner_name(work, "ada", ask=None) == "ada"
    assert (work / NAME_FILE).read_text() == "ada\n"
    assert learner_name(work, "Ada L.", ask=None) == "Ada L."
    assert learner_name(work, None, ask=None) == "ada"


@pytest.mark.parametrize("bad", ["../../etc/x", "a/b", "..", "a\x00b", "a\nb", "x" * 65, " "])
def test_a_name_that_is_not_a_name_is_one_error_line(work, tmp_path, bad, capsys):
    """--name with a path separator, '..', NUL, a control character, too long or blank: one error line, no archive."""
    with pytest.raises(CliError, match="is not a learner's name"):
        learner_name(work, bad)
    assert cli.main(["export", "--dir", str(work), "--to", str(tmp_path / "out"), "--name", bad]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and not (work / NAME_FILE).exists()


def test_a_kept_name_edited_into_a_path_is_refused(work, tmp_path):
    """The kept name is the learner's file: one edited to '../x' is refused like --name would be."""
    (work / NAME_FILE).write_text("../x\n")
    with pytest.raises(CliError, match="the name kept in .* is not a learner's name"):
        learner_name(work, None, ask=lambda prompt: "never asked")


def test_the_archive_records_the_learner_in_each_notebook(work, tmp_path, capsys):
    """Each notebook's archive copy records metadata.labkit.learner (the work folder's file unchanged); one
    copied from another learner's hand-in keeps that learner's name and the export says so."""
    import json

    (work / "02-tcp.ipynb").write_text(json.dumps({"cells": [], "metadata": {"labkit": {"lab": "02"}},
                                                   "nbformat": 4, "nbformat_minor": 5}))
    (work / "03-pods.ipynb").write_text(json.dumps({"cells": [], "metadata": {"labkit": {"learner": "ann"}},
                                                    "nbformat": 4, "nbformat_minor": 5}))
    (work / "notes.ipynb").write_text("not a notebook")
    before = {p.name: p.read_bytes() for p in work.iterdir()}
    assert cli.main(["export", "--dir", str(work), "--to", str(tmp_path / "out"), "--name", "ben"]) == 0
    assert "03-pods.ipynb records the learner 'ann', not 'ben'" in capsys.readouterr().err
    [archive] = (tmp_path / "out").glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        packed = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert json.loads(packed["ben/02-tcp.ipynb"])["metadata"]["labkit"] == {"lab": "02", "learner": "ben"}
    assert json.loads(packed["ben/03-pods.ipynb"])["metadata"]["labkit"] == {"learner": "ann"}
    assert packed["ben/notes.ipynb"] == b"not a notebook"
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.name != NAME_FILE} == before
