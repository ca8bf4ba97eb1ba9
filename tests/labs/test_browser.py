"""Lab 01 as a student meets it: JupyterLab in headless Chromium, Run All Cells,
widgets on screen. The screenshot is kept at test-artifacts/lab01.png (with the
server, chromedriver and browser-console logs in test-artifacts/lab01-logs/).

And the live CT table in the same browser: scrolled down, it stays where it was
while the kernel refreshes it (test-artifacts/live-table-scroll.png, logs in
test-artifacts/live-table-scroll-logs/).

Needs Debian's chromium and chromium-driver and selenium (the [test] extra);
without them the test is skipped, or fails when CI=true.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from labtag import tagged

try:
    from .browser import JupyterServer, chromium_driver, missing_tools, page_problems, run_all_cells, \
        run_cell, save_screenshot, step_view_facts, type_and_run, widget_count
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from browser import JupyterServer, chromium_driver, missing_tools, page_problems, run_all_cells, \
        run_cell, save_screenshot, step_view_facts, type_and_run, widget_count

pytestmark = pytest.mark.labs

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LAB = tagged("brtest")
NOTEBOOK = "01-tour.ipynb"
RUN_TIMEOUT = 180


def _require_browser() -> None:
    missing = missing_tools()
    if missing:
        reason = "browser test needs: " + "; ".join(missing)
        if CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)


def _kernel_env(lab: str = LAB) -> dict:
    env = {"LABKIT_LAB": lab}  # the notebooks name their lab after it
    spec = importlib.util.find_spec("labkit")
    if spec is None or not str(spec.origin).startswith(str(REPO / "labkit")):  # kernel: import this checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def _lab_down(name: str) -> subprocess.CompletedProcess:
    # exits 0 when the lab was never up ("nothing was recorded to remove")
    return subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", name, "down"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def test_lab01_runs_in_jupyterlab_with_widgets(tmp_path):
    """Lab 01 runs to the end in JupyterLab in Chromium and its widgets render without errors."""
    if not (REPO / "labs" / NOTEBOOK).is_file():
        pytest.fail(f"labs/{NOTEBOOK} not found")
    _require_browser()
    labs = tmp_path / "labs"  # a copy: the run never touches the repository's notebooks
    shutil.copytree(REPO / "labs", labs, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    logs = ARTIFACTS / "lab01-logs"
    logs.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "lab01.png"
    shot.unlink(missing_ok=True)

    passed = False
    try:
        with JupyterServer(labs, env=_kernel_env(), log_path=logs / "jupyter.log") as (url, token), \
                chromium_driver(logs) as driver:
            try:
                run_all_cells(driver, url, token, NOTEBOOK, timeout=RUN_TIMEOUT)
                problems = page_problems(driver)
                widgets = widget_count(driver)
            finally:
                try:
                    save_screenshot(driver, shot)
                except Exception as exc:  # do not hide why the run failed
                    warnings.warn(f"no screenshot of {NOTEBOOK}: {exc!r}")
        assert problems == [], f"{NOTEBOOK} in JupyterLab (screenshot: {shot}):\n" + "\n".join(problems)
        assert widgets >= 1, f"{NOTEBOOK}: no widget rendered in JupyterLab (screenshot: {shot})"
        assert shot.is_file(), f"no screenshot at {shot}"
        passed = True
    finally:
        down = _lab_down(LAB)  # after the kernel that built the lab is gone
        if down.returncode != 0:
            msg = f"labkit --lab {LAB} down exited {down.returncode}:\n{down.stdout}{down.stderr}"
            if passed:
                pytest.fail(msg)
            warnings.warn(msg)


# -- the live CT table keeps its scroll position --------------------------------------------
SCROLL_LAB = tagged("brscroll")
SCROLL_NOTEBOOK = "live-table-scroll.ipynb"
SCROLL_ROWS = 300  # ~20 px a row: far more than the table's fixed height
SCROLL_TO = 2000  # px
SCROLL_REFRESHES = 2  # refreshes (with new content) to see while scrolled
SCROLL_CELLS = [
    "from labkit.nb import *\nlab = start()",
    # CT rows written straight into node-a's map: no traffic, no step
    "from labkit.maps.base import PinnedMap\n"
    "from labkit.maps.ct import CtKey4, CtEntry\n"
    'm = PinnedMap(lab.pin_dir("node-a") + "/cilium_ct_any4_global", CtKey4, CtEntry)\n'
    f"for i in range({SCROLL_ROWS}):\n"
    '    m[CtKey4.make("198.18.1.11", "198.18.2.11", 10000 + i, 8080, 17, 0)] = '
    "CtEntry(lifetime=lab.clock.now() + 600, packets=1, bytes=64)\n"
    "len(lab.ct(\"node-a\"))",
    'table = lab.watch("node-a")\ntable',
    # refreshes from the kernel side, while the page sits still: the lab clock moves every
    # second, so each new second brings a new "remaining" column and a new status line
    "table.start(0.5);",  # start() returns the table: the ";" keeps a second view of it off the page
]

# The live table's scrolling element: a widget-html inside a cell output, holding the CT
# table (.lk-ct), that scrolls itself (computed overflow-y auto/scroll) and overflows.
# Kept in window.__lkScroller so that a re-created element is noticed.
_JS_FIND_SCROLLER = r"""
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) return {error: 'no notebook panel'};
const all = [...panel.querySelectorAll('.jp-OutputArea-output .widget-html')]
  .filter(el => el.querySelector('.lk-ct'));
const scrolling = all.filter(el => /^(auto|scroll)$/.test(getComputedStyle(el).overflowY));
const found = scrolling.filter(el => el.scrollHeight > el.clientHeight + 50);
const describe = el => ({cls: el.className, overflowY: getComputedStyle(el).overflowY,
                         height: getComputedStyle(el).height, scrollHeight: el.scrollHeight,
                         clientHeight: el.clientHeight});
if (found.length !== 1) return {error: `expected one overflowing CT table, found ${found.length}`,
                                candidates: all.map(describe)};
window.__lkScroller = found[0];
window.__lkContent = found[0].firstElementChild;
window.__lkBox = found[0].closest('.widget-vbox') || found[0].parentElement;
return describe(found[0]);
"""

# The state of that element, and the text of the table's status line (the last widget-html of
# the table's box). ``digest``: a hash of the rows shown, to tell a refresh that changed them.
_JS_SCROLL_STATE = r"""
const el = window.__lkScroller, box = window.__lkBox;
if (!el) return null;
const htmls = box ? [...box.querySelectorAll(':scope > .widget-html')] : [];
const status = htmls.length ? htmls[htmls.length - 1] : null;
let digest = 0;
for (const ch of el.innerHTML) digest = (Math.imul(digest, 31) + ch.charCodeAt(0)) | 0;
return {
  connected: el.isConnected, scrollTop: el.scrollTop, scrollHeight: el.scrollHeight, clientHeight: el.clientHeight,
  sameContentNode: el.firstElementChild === window.__lkContent,
  rows: el.querySelectorAll('tbody tr').length, digest: digest,
  status: status && status !== el ? status.innerText.trim() : null,
};
"""


def test_live_table_keeps_scroll_position_across_refreshes(tmp_path):
    """The live CT table, scrolled down in the browser, stays where it was while the kernel refreshes it."""
    import nbformat

    _require_browser()
    labs = tmp_path / "labs"
    shutil.copytree(REPO / "labs", labs, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"display_name": "Python 3", "language": "python",
                                                            "name": "python3"}})
    nb.cells = [nbformat.v4.new_code_cell(src) for src in SCROLL_CELLS]
    nbformat.write(nb, labs / SCROLL_NOTEBOOK)
    logs = ARTIFACTS / "live-table-scroll-logs"
    logs.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "live-table-scroll.png"
    shot.unlink(missing_ok=True)

    passed = False
    try:
        with JupyterServer(labs, env=_kernel_env(SCROLL_LAB), log_path=logs / "jupyter.log") as (url, token), \
                chromium_driver(logs) as driver:
            try:
                run_all_cells(driver, url, token, SCROLL_NOTEBOOK, timeout=RUN_TIMEOUT)
                assert page_problems(driver) == [], "\n".join(page_problems(driver))
                found = driver.execute_script(_JS_FIND_SCROLLER)
                assert "error" not in found, f"the live table's scrolling element: {found}"
                # in view, as a student would have it, then scrolled down inside
                driver.execute_script("window.__lkScroller.scrollIntoView({block: 'center'});")
                # set and read back in one go: no refresh can come in between
                before = driver.execute_script(
                    f"window.__lkScroller.scrollTop = {SCROLL_TO};\n" + _JS_SCROLL_STATE)
                assert before["rows"] >= SCROLL_ROWS, f"the table shows {before['rows']} rows, not {SCROLL_ROWS}"
                assert abs(before["scrollTop"] - SCROLL_TO) <= 2, f"scrollTop {SCROLL_TO} did not take: {before}"
                assert before["status"], f"no status line next to the table: {found}"

                # wait for refreshes that change what is shown, watching scrollTop all along
                seen, samples = [before["status"]], []
                deadline = time.monotonic() + 30
                while len(seen) <= SCROLL_REFRESHES and time.monotonic() < deadline:
                    time.sleep(0.1)
                    now = driver.execute_script(_JS_SCROLL_STATE)
                    samples.append(now["scrollTop"])
                    if not now["connected"]:
                        break
                    if now["status"] != seen[-1]:
                        seen.append(now["status"])
                time.sleep(0.3)  # one more look, after any layout the last refresh caused
                after = driver.execute_script(_JS_SCROLL_STATE)
                samples.append(after["scrollTop"])
            finally:
                try:
                    save_screenshot(driver, shot)
                except Exception as exc:
                    warnings.warn(f"no screenshot of {SCROLL_NOTEBOOK}: {exc!r}")
        detail = (f"scrolling element {found}; before: scrollTop {before['scrollTop']}, "
                  f"scrollHeight {before['scrollHeight']}; after: scrollTop {after['scrollTop']}, scrollHeight "
                  f"{after['scrollHeight']}, element still in page {after['connected']}, same content node "
                  f"{after['sameContentNode']}; scrollTop samples min {min(samples)} max {max(samples)}; "
                  f"status lines seen {seen} (screenshot: {shot})")
        assert after["connected"], f"the scrolling element was replaced on refresh: {detail}"
        assert all(abs(s - SCROLL_TO) <= 3 for s in samples), f"the table lost its scroll position: {detail}"
        assert len(seen) > SCROLL_REFRESHES, f"the table did not refresh {SCROLL_REFRESHES} times in 30 s: {detail}"
        assert after["digest"] != before["digest"], f"the refreshes did not change the table's rows: {detail}"
        assert shot.is_file(), f"no screenshot at {shot}"
        passed = True
    finally:
        down = _lab_down(SCROLL_LAB)
        if down.returncode != 0:
            msg = f"labkit --lab {SCROLL_LAB} down exited {down.returncode}:\n{down.stdout}{down.stderr}"
            if passed:
                pytest.fail(msg)
            warnings.warn(msg)


# -- lab 02 as a learner answers it: Run All first, then the answers ---------------------------
ANSWER_LAB = tagged("branswer")
ANSWER_NOTEBOOK = "02-tcp-conntrack.ipynb"


def _close_step_problems(driver, nb) -> dict[str, str]:
    """Lab 02's close step as the page shows it: the CT diff names the flags the FIN set in the row grammar
    (``[ +RxClosing +TxClosing ]``) and every node cell is one line (screenshot: views-02-close.png)."""
    [index] = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.startswith("closed = conn.close()")]
    facts = step_view_facts(driver, index)
    with contextlib.suppress(Exception):
        facts["element"].screenshot(str(ARTIFACTS / "views-02-close.png"))
    out = {}
    if "[ +RxClosing +TxClosing ]" not in facts["diff_text"]:
        out["close step diff"] = facts["diff_text"] or "(no CT diff table)"
    wrapped = [text for text, lines in facts["node_cells"] if lines != 1]
    if not facts["node_cells"] or wrapped:
        out["close step node cells"] = f"wrapped: {wrapped}, all: {facts['node_cells']}"
    return out


def test_lab02_answered_after_run_all(tmp_path):
    """Run All on lab 02 in JupyterLab: the close step's CT diff in the row grammar, its node cells unwrapped;
    then for each exercise a wrong answer typed into its answer cell and checked (try 1 shows no expected
    value), then the reference answer typed and checked: every check passes."""
    import json as _json

    import nbformat

    _require_browser()
    labs = tmp_path / "labs"
    shutil.copytree(REPO / "labs", labs, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    key = _json.loads((REPO / "instructor" / "answers" / "02.json").read_text())
    nb = nbformat.read(labs / ANSWER_NOTEBOOK, as_version=4)
    answer_cell = {c.metadata["labkit"]["answer"]: i for i, c in enumerate(nb.cells)
                   if c.get("metadata", {}).get("labkit", {}).get("answer")}
    check_cell = {c.metadata["labkit"]["check"]: i for i, c in enumerate(nb.cells)
                  if c.get("metadata", {}).get("labkit", {}).get("check")}
    logs = ARTIFACTS / "lab02-answers-logs"
    logs.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "lab02-answers.png"
    problems = {}
    try:
        with JupyterServer(labs, env=_kernel_env(ANSWER_LAB), log_path=logs / "jupyter.log") as (url, token), \
                chromium_driver(logs) as driver:
            try:
                run_all_cells(driver, url, token, ANSWER_NOTEBOOK, timeout=RUN_TIMEOUT)
                problems.update(_close_step_problems(driver, nb))
                for ex in sorted(answer_cell):
                    reference = key[ex]["answer"]
                    expected = reference.split("=", 1)[1].strip()
                    type_and_run(driver, answer_cell[ex], key[ex]["wrong"][0]["answer"])
                    first = run_cell(driver, check_cell[ex])
                    if "not yet" not in first or "Expected:" in first or expected in first:
                        problems[f"{ex} try 1"] = first
                    type_and_run(driver, answer_cell[ex], reference)
                    second = run_cell(driver, check_cell[ex])
                    if "correct" not in second:
                        problems[f"{ex} reference"] = second
            finally:
                with contextlib.suppress(Exception):
                    save_screenshot(driver, shot)
    finally:
        _lab_down(ANSWER_LAB)
    assert problems == {}, f"lab 02 answered in JupyterLab (screenshot {shot}): {problems}"
