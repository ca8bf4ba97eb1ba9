"""The browser tests' shared JupyterLab and Chromium (tests/labs/browser.py ``BrowserSession``).

``browser_session`` starts both once per test session, over one copy of labs/, with every kernel
starting the lab ``tagged("browser")``; ``jupyter`` hands it to one test and, after it, leaves it as
a fresh one (kernels stopped, workspaces deleted, the lab down). Both stop right after the last test that
uses them, not at the end of the whole run. Logs: test-artifacts/browser-logs/.
"""
from __future__ import annotations

import shutil
import warnings
from contextlib import ExitStack

import pytest

from labtag import tagged

try:
    from .browser import REPO, BrowserSession, JupyterServer, chromium_driver, kernel_env, require_browser
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from browser import REPO, BrowserSession, JupyterServer, chromium_driver, kernel_env, require_browser

BROWSER_LAB = tagged("browser")
BROWSER_LOGS = REPO / "test-artifacts" / "browser-logs"


_BROWSER = {"stack": None, "last": None}  # the open session's ExitStack; the last test that needs it


def _close_browser() -> None:
    stack, _BROWSER["stack"] = _BROWSER["stack"], None
    if stack is not None:
        stack.close()


def pytest_collection_modifyitems(items):
    """Note the last collected test that uses the browser session: its teardown closes the session."""
    users = [item.nodeid for item in items if "browser_session" in getattr(item, "fixturenames", ())]
    _BROWSER["last"] = users[-1] if users else None


@pytest.hookimpl(trylast=True)  # after pytest's own teardown has run that test's fixtures' finalizers
def pytest_runtest_teardown(item, nextitem):
    if item.nodeid == _BROWSER["last"]:
        _close_browser()


@pytest.fixture(scope="session")
def browser_session(door_ready, tmp_path_factory):
    """One JupyterLab and one Chromium for every browser test of the run."""
    require_browser()
    labs = tmp_path_factory.mktemp("browser") / "labs"  # a copy: the runs never touch the repository's notebooks
    shutil.copytree(REPO / "labs", labs, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    BROWSER_LOGS.mkdir(parents=True, exist_ok=True)
    stack = _BROWSER["stack"] = ExitStack()
    url, token = stack.enter_context(JupyterServer(labs, env=kernel_env(BROWSER_LAB),
                                                   log_path=BROWSER_LOGS / "jupyter.log"))
    driver = stack.enter_context(chromium_driver(BROWSER_LOGS))
    session = BrowserSession(driver, url, token, labs, BROWSER_LAB)

    def finish() -> None:
        for problem in session.finish():
            warnings.warn(problem)

    stack.callback(finish)
    try:
        yield session
    finally:
        _close_browser()


@pytest.fixture
def jupyter(browser_session):
    """The shared session for one test; afterwards its kernels are stopped and its lab is down (a failed
    ``down`` fails the test)."""
    yield browser_session
    problems = browser_session.finish()
    if problems:
        pytest.fail("\n".join(problems))
