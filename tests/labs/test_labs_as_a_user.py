"""Labs 01 and 02 run headless to the end by an ordinary user created for the test, through labkitd: every
reference answer passes, no cell raises, the notebook's kernel holds no capability, and the labs it made are the
user's own (keyed with their uid)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

from doorusers import learner

try:
    from .mutate import _with_answers, load_key
    from .notebooks import load
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from mutate import _with_answers, load_key
    from notebooks import load

pytestmark = [pytest.mark.labs, pytest.mark.timeout(1200)]

#: The last cell the test adds: what the kernel itself is (uid, capabilities), for the test to read.
PROBE = ("import json, os\n"
         "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines() if ':' in l)\n"
         "print('PROBE ' + json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'CapEff': status['CapEff'].strip(),"
         " 'CapPrm': status['CapPrm'].strip(), 'lab': lab.key}))")

DRIVER = """
import json, sys, nbformat
from labkit.grading.headless import run_notebook, error_outputs
nb = nbformat.read(sys.argv[1], as_version=4)
run_notebook(nb, lab=sys.argv[2], grade_log=sys.argv[3], cwd=sys.argv[4], cell_timeout=150)
nbformat.write(nb, sys.argv[1])
print(json.dumps([f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, o in error_outputs(nb)]))
"""


@pytest.fixture(scope="module")
def student(door_ready):
    """A learner with a home, and nothing of theirs left afterwards."""
    with learner("lkdoor-student") as who:
        yield who


@pytest.mark.parametrize("lab_id", ["01", "02"])
def test_an_ordinary_user_runs_the_lab_to_the_end(student, lab_id):
    """The notebook with its reference answers, run by the user through nbclient: no cell error, every exercise's
    last check passed, the kernel's CapEff 0 and uid the user's, the lab keyed <name>_u<uid>."""
    nb = _with_answers(load(lab_id), load_key(lab_id))
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    work = student.home / f"lab{lab_id}"
    work.mkdir(exist_ok=True)
    path, log = work / "lab.ipynb", work / "grade.jsonl"
    nbformat.write(nb, path)
    for p in (work, path):
        os.chown(p, student.uid, student.gid)
    venv_bin = str(Path(sys.executable).parent)
    name = f"door{lab_id}"
    try:
        r = student.run([sys.executable, "-c", DRIVER, str(path), name, str(log), str(work)], timeout=1100,
                        PATH=f"{venv_bin}:/usr/local/bin:/usr/bin:/bin")
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout.strip().splitlines()[-1]) == []
        ran = nbformat.read(path, as_version=4)
        probe = next(o["text"] for o in ran.cells[-1].outputs if o.get("name") == "stdout")
        seen = json.loads(probe.split("PROBE ", 1)[1])
        assert (seen["uid"], seen["euid"]) == (student.uid, student.uid)
        assert int(seen["CapEff"], 16) == 0 and int(seen["CapPrm"], 16) == 0
        assert seen["lab"] == f"{name}_u{student.uid}"
        last = {}
        for line in log.read_text().splitlines():
            rec = json.loads(line)
            last[rec["exercise"]] = rec
        key = load_key(lab_id)
        assert set(last) == set(key), (set(key) - set(last))
        failed = {ex: rec["message"] for ex, rec in last.items() if not rec["passed"]}
        assert failed == {}
        mine = [p.name for p in Path("/run/labkit").iterdir() if p.is_dir() and p.name.startswith(name)]
        assert mine == [f"{name}_u{student.uid}"], mine
    finally:
        student.python(f"from labkit.client import Lab\ntry:\n    Lab.cleanup({name!r})\nexcept Exception:\n    pass")
