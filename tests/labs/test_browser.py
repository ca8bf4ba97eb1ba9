"""Lab 01 as a student meets it: JupyterLab in headless Chromium, Run All Cells,
widgets on screen. The screenshot is kept at test-artifacts/lab01.png (with the
server, chromedriver and browser-console logs in test-artifacts/lab01-logs/).

Needs Debian's chromium and chromium-driver and selenium (the [test] extra);
without them the test is skipped, or fails when CI=true.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

try:
    from .browser import JupyterServer, chromium_driver, missing_tools, page_problems, run_all_cells, \
        save_screenshot, widget_count
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from browser import JupyterServer, chromium_driver, missing_tools, page_problems, run_all_cells, \
        save_screenshot, widget_count

pytestmark = pytest.mark.labs

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LAB = "brtest"
NOTEBOOK = "01-tour.ipynb"
RUN_TIMEOUT = 180


def _require_browser() -> None:
    missing = missing_tools()
    if missing:
        reason = "browser test needs: " + "; ".join(missing)
        if CI:
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)


def _kernel_env() -> dict:
    env = {"LABKIT_LAB": LAB}  # the notebooks name their lab after it
    spec = importlib.util.find_spec("labkit")
    if spec is None or not str(spec.origin).startswith(str(REPO / "labkit")):  # kernel: import this checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def _lab_down(name: str) -> subprocess.CompletedProcess:
    # exits 0 when the lab was never up ("nothing was recorded to remove")
    return subprocess.run([sys.executable, "-m", "labkit.cli", "--lab", name, "down"],
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
