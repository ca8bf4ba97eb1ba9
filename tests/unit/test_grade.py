"""Unit tests for labkit.grade's scoring output (execution is tested in tests/labs)."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from labkit.grade import ExerciseScore, NotebookScore, format_csv, format_table, lab_of


def _scores():
    s = NotebookScore("alice/02-tcp.ipynb", "02")
    s.exercises = [ExerciseScore("02.1", "flags", True, 1, "ok"), ExerciseScore("02.2", "lifetime", False, 0, "never checked")]
    return [s]


def test_table_shows_score_and_each_exercise():
    """The table gives score/total per notebook and one line per exercise."""
    text = format_table(_scores())
    assert "score 1/2" in text and "02.1   pass" in text and "02.2   FAIL" in text and "never checked" in text


def test_csv_has_one_row_per_exercise():
    """CSV output has a header and one row per notebook and exercise."""
    lines = format_csv(_scores()).strip().splitlines()
    assert lines[0].startswith("notebook,lab,exercise")
    assert lines[1].split(",")[:5] == ["alice/02-tcp.ipynb", "02", "02.1", "flags", "1"]
    assert len(lines) == 3


def test_json_has_score_and_total():
    """to_json adds score and total."""
    data = _scores()[0].to_json()
    assert (data["score"], data["total"]) == (1, 2)


def test_lab_id_from_metadata_or_name():
    """The lab id comes from notebook metadata, else from the file name's number."""
    nb = nbformat.v4.new_notebook()
    assert lab_of(Path("3-x.ipynb"), nb) == "03"
    nb.metadata["labkit"] = {"lab": "07"}
    assert lab_of(Path("3-x.ipynb"), nb) == "07"
    with pytest.raises(ValueError, match="no labkit.lab"):
        lab_of(Path("x.ipynb"), nbformat.v4.new_notebook())
