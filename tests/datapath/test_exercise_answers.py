"""Exercises graded on what the real datapath recorded, in-process (labkit.grading.checks on the shared lab): a wrong
answer's message never shows the expected value before the third try, and a right answer typed from one run of a
notebook's cells still passes when the same cells run again (a regrade re-executes the notebook)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labkit.grading import checks
from labkit.grading.checks import REVEAL_AT, check

LABS = Path(__file__).resolve().parents[2] / "labs"


@pytest.fixture
def graded(lab):
    """The shared tunnel lab, its tries and every fault cleared before and after."""
    lab.reset()
    checks.reset_attempts(lab=lab.name)
    yield lab
    lab.reset()
    checks.reset_attempts(lab=lab.name)


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"(?<![\d.])\d+(?![\d.])", text)]


def _before_reveal(lab, exercise: str, wrong: list, expected: int) -> list[str]:
    """The messages of the tries before the reveal; none may say a number within 2 of ``expected``."""
    results = [check(exercise, answer, lab=lab) for answer in wrong[:REVEAL_AT - 1]]
    assert [r.attempt for r in results] == list(range(1, REVEAL_AT)), [str(r) for r in results]
    for r in results:
        assert not r.passed and r.reveal is None, str(r)
        near = [n for n in _numbers(r.message) if abs(n - expected) <= 2]
        assert not near, f"{exercise} try {r.attempt} shows {near}, the expected {expected}: {r.message}"
    return [r.message for r in results]


def test_02_4_wrong_answers_do_not_show_the_rows_seconds_left(graded):
    """02.4: the first wrong answers say the row is dead, not how many seconds it had left (the close timeout,
    the answer)."""
    graded.pod("a1").tcp("b1", 9999).open()  # section 5's refused connection
    close = graded.config.timeouts.close
    _before_reveal(graded, "02.4", [close + 30, close + 50], close)
    assert check("02.4", close, lab=graded).passed


def test_02_6_wrong_answers_do_not_show_the_kept_lifetime(graded):
    """02.6: with wrong-lifetime on, a wrong lifetime is answered without the seconds the row kept (the SYN
    timeout, the answer)."""
    graded.fault("wrong-lifetime")  # section 7
    conn2 = graded.pod("a1").tcp("b1", 8080)
    conn2.open()
    conn2.send(b"hello again")
    syn = graded.config.timeouts.syn
    _before_reveal(graded, "02.6", [("SeenNonSyn", 8000), ("SeenNonSyn", 3000)], syn)
    assert check("02.6", ("SeenNonSyn", syn), lab=graded).passed
    conn2.close()


def _cell(notebook: str, pattern: str) -> str:
    """The source of the one code cell of ``labs/<notebook>`` that matches ``pattern``."""
    nb = json.loads((LABS / notebook).read_text())
    found = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
             and re.search(pattern, "".join(c["source"]))]
    assert len(found) == 1, found
    return found[0]


def test_09_4_answer_typed_from_one_run_passes_every_rerun(graded):
    """09.4: the notebook's own setup cell of section 4 (reset, recreate web), then the fault and the connection, run
    four times; the SYN|ACK source read off the first run passes the check in every run, as a regrade needs."""
    setup = _cell("09-kube-proxy.ipynb", r"lab\.reset\(\)\nlab\.services\.add\(\"web\"")
    typed = None
    for run in range(4):
        exec(setup, {"lab": graded})
        graded.fault("skip-rev-nat")
        broken = graded.pod("a1").tcp("web", 80).open()
        if typed is None:  # what the learner reads off the first run: the SYN|ACK's source at node-a's to-container
            line = next(x for x in broken.lines() if " node-a to-container " in x and " TCP SYN|ACK " in x)
            typed = re.search(r"lxc-a1 (\S+) -> ", line).group(1)
        result = check("09.4", typed, lab=graded)
        assert result.passed, f"run {run + 1}: {result}"
