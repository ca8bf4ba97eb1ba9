"""Browser helpers for the lab tests: a throwaway JupyterLab, a headless Chromium
driven by Selenium, and the checks a student's eyes would make on a notebook.

Nothing here downloads anything: Chromium and chromedriver are Debian's
(apt packages chromium, chromium-driver), Selenium is told their paths so its
selenium-manager never runs, and JupyterLab is started with its news feed,
update check and PyPI extension manager turned off.

    with JupyterServer(root, env={"LABKIT_LAB": "x"}) as (url, token), chromium_driver(out) as driver:
        run_all_cells(driver, url, token, "01-tour.ipynb", timeout=180)
        assert page_problems(driver) == []
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

__all__ = [
    "CHROMEDRIVER",
    "CHROMIUM",
    "BrowserSession",
    "JupyterServer",
    "NotebookRunError",
    "chromium_driver",
    "click_menu",
    "jupyter_executable",
    "kernel_env",
    "lab_down",
    "missing_tools",
    "navigate",
    "page_problems",
    "require_browser",
    "rest_api",
    "run_all_cells",
    "save_screenshot",
    "step_view_facts",
    "widget_count",
]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",  # we run as root
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-proxy-server",  # it only ever talks to 127.0.0.1
    "--window-size=1400,1000",
)
WINDOW = (1400, 1000)

# JupyterLab user settings for the test server (a fresh settings dir per run):
# no news/update toasts, and every cell attached to the DOM so that all
# prompts and outputs can be read (the default windowing mode keeps
# off-screen cells out of layout).
_LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
REPO = Path(__file__).resolve().parents[2]
#: labkit's JupyterLab defaults and the script provision.sh merges them into the venv's settings with.
LAB_DEFAULTS = REPO / "vagrant" / "jupyterlab-overrides.json"
SERVER_DEFAULTS = REPO / "vagrant" / "jupyter-server-labkit.json"
LAB_SETTINGS_SCRIPT = REPO / "vagrant" / "lab-settings.py"

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class NotebookRunError(AssertionError):
    """The notebook did not run to the end in the browser."""


# -- tools ---------------------------------------------------------------------
def jupyter_executable() -> Path:
    """``jupyter`` of the venv running the tests (else of $LABKIT_VENV)."""
    here = Path(sys.executable).parent / "jupyter"
    if here.exists():
        return here
    return Path(os.environ.get("LABKIT_VENV", "/opt/labkit/venv")) / "bin" / "jupyter"


def missing_tools() -> list[str]:
    """What the browser test needs and this machine lacks (empty: all there)."""
    missing = []
    for path, what in ((CHROMIUM, "apt package chromium"), (CHROMEDRIVER, "apt package chromium-driver")):
        if not os.access(path, os.X_OK):
            missing.append(f"{path} ({what})")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append(f"selenium for {sys.executable} (pip install 'selenium>=4.15', the [test] extra)")
    if not jupyter_executable().exists():
        missing.append(f"{jupyter_executable()} (the [notebook] extra)")
    return missing


# -- processes -----------------------------------------------------------------
def _proc_table() -> dict[int, list[tuple[int, str]]]:
    """ppid -> [(pid, start time)] for every process now."""
    table: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table.setdefault(int(fields[1]), []).append((int(entry), fields[19]))
    return table


def _descendants(pid: int) -> list[tuple[int, str]]:
    table, out, todo = _proc_table(), [], [pid]
    while todo:
        for child in table.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


def _alive(pid: int, start: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[19] == start and fields[0] != "Z"


def _kill_leftovers(procs: list[tuple[int, str]], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, those of ``procs`` still alive (same pid and start time)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p in procs if _alive(*p)]
        if not left:
            return
        for pid, _ in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(*p) for p in left):
            time.sleep(0.1)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- JupyterLab ----------------------------------------------------------------
class JupyterServer:
    """A JupyterLab serving ``root_dir`` on 127.0.0.1, for one ``with`` block.

    ``with JupyterServer(root, env={...}) as (url, token):`` -- ``env`` is
    added to this process's environment (the kernels inherit it). The token
    reaches Jupyter as JUPYTER_TOKEN, not on the command line (a root server's
    command line is world-readable in /proc). Lab settings, workspaces,
    runtime files, Jupyter config and (unless ``env`` sets it) IPYTHONDIR live
    in a temporary directory removed afterwards; on exit the server, its
    kernels and anything else it started are stopped. Its application settings
    are the venv's ``overrides.json`` with labkit's defaults merged in, and its
    config has labkit's server settings (the widget-state save hook), both by
    the script provision.sh runs (vagrant/lab-settings.py): the settings of a
    provisioned machine, whether or not this one was provisioned.
    """

    def __init__(self, root_dir, *, env: dict | None = None, log_path=None, startup_timeout: float = 90):
        self.root_dir = Path(root_dir).resolve()
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout = startup_timeout
        self.token = secrets.token_hex(24)
        self.port: int | None = None
        self.url: str | None = None
        self.proc: subprocess.Popen | None = None
        self._tmp: Path | None = None
        self._log = None

    # context manager
    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self.url, self.token

    def __exit__(self, *exc) -> None:
        self.stop()

    def command(self) -> list[str]:
        tmp = self._tmp
        return [
            str(jupyter_executable()), "lab",
            "--no-browser", "--allow-root",
            "--ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.disable_check_xsrf=False",
            # no network: no news feed, no update check, no PyPI extension listings
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
            # nothing read from or written to ~/.jupyter/lab
            f"--LabApp.user_settings_dir={tmp / 'user-settings'}",
            f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
            f"--LabApp.app_settings_dir={tmp / 'app-settings'}",  # the venv's + labkit's defaults
            f"--NotebookNotary.data_dir={tmp / 'data'}",  # not ~/.local/share/jupyter
        ]

    def start(self) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix="labkit-jupyter-"))
        for rel, settings in _LAB_SETTINGS.items():
            path = self._tmp / "user-settings" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(settings))
        for sub in ("workspaces", "config", "runtime", "data", "ipython", "app-settings"):
            (self._tmp / sub).mkdir()
        overrides = self._tmp / "app-settings" / "overrides.json"
        venv_overrides = jupyter_executable().parent.parent / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
        if venv_overrides.is_file():
            shutil.copyfile(venv_overrides, overrides)
        server_config = self._tmp / "config" / "jupyter_server_config.json"
        for defaults, target in ((LAB_DEFAULTS, overrides), (SERVER_DEFAULTS, server_config)):
            subprocess.run([sys.executable, "-I", str(LAB_SETTINGS_SCRIPT), str(defaults), str(target)],
                           check=True, capture_output=True, timeout=60)
        if self.log_path is None:
            self.log_path = self._tmp / "jupyter.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, **self.env}
        env.update(
            JUPYTER_TOKEN=self.token,
            JUPYTER_CONFIG_DIR=str(self._tmp / "config"),  # system/venv config still applies
            JUPYTER_RUNTIME_DIR=str(self._tmp / "runtime"),
            PYTHONUNBUFFERED="1",
        )
        env.setdefault("IPYTHONDIR", str(self._tmp / "ipython"))  # kernels: no ~/.ipython startup files or history
        self.proc = subprocess.Popen(
            self.command(), cwd=self.root_dir, env=env, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with status {self.proc.returncode} while starting:\n"
                                   + self.log_tail())
            with contextlib.suppress(OSError, ValueError):
                if self.api("GET", "/api/status", timeout=2)[0] == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer {self.url}/api/status within "
                                   f"{self.startup_timeout:.0f} s:\n" + self.log_tail())
            time.sleep(0.25)

    def api(self, method: str, path: str, *, timeout: float = 10) -> tuple[int, object]:
        """(status, decoded JSON or None) of a REST call with the token."""
        req = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"})
        try:
            with _NO_PROXY.open(req, timeout=timeout) as r:
                body = r.read()
                status = r.status
        except urllib.error.HTTPError as exc:
            return exc.code, None
        try:
            return status, json.loads(body) if body else None
        except ValueError:
            return status, None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, AttributeError):
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            # kernels run in sessions of their own: note them before asking the server to go
            family = [(proc.pid, _start_time(proc.pid))] + _descendants(proc.pid)
            with contextlib.suppress(OSError, ValueError):
                self.api("POST", "/api/shutdown", timeout=5)  # also shuts the kernels down
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, sig)
                    try:
                        proc.wait(timeout=10)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            _kill_leftovers([p for p in family if p[1]])
        elif proc is not None:
            proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            if self.log_path is not None and self.log_path.is_relative_to(self._tmp):
                self.log_path = None
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


# -- Chromium ------------------------------------------------------------------
@contextlib.contextmanager
def chromium_driver(artifacts_dir=None):
    """A Selenium driver for Debian's headless Chromium (never selenium-manager).

    With ``artifacts_dir``, chromedriver's log goes to ``chromedriver.log``
    and the browser console to ``browser-console.log`` there.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    artifacts = Path(artifacts_dir) if artifacts_dir else None
    if artifacts:
        artifacts.mkdir(parents=True, exist_ok=True)
    profile = tempfile.mkdtemp(prefix="labkit-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(
        executable_path=CHROMEDRIVER,
        log_output=str(artifacts / "chromedriver.log") if artifacts else subprocess.DEVNULL,
    )
    driver = None
    family: list[tuple[int, str]] = []
    try:
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(90)
        family = [(service.process.pid, _start_time(service.process.pid))] + _descendants(service.process.pid)
        yield driver
    finally:
        if driver is not None:
            if artifacts:
                with contextlib.suppress(Exception):
                    lines = [f"{e.get('level')} {e.get('message')}" for e in driver.get_log("browser")]
                    (artifacts / "browser-console.log").write_text("\n".join(lines) + "\n")
            if service.process is not None:
                family = (family or [(service.process.pid, _start_time(service.process.pid))]) \
                    + _descendants(service.process.pid)
            with contextlib.suppress(Exception):
                driver.quit()
        with contextlib.suppress(Exception):
            service.stop()
        _kill_leftovers([p for p in family if p[1]])
        shutil.rmtree(profile, ignore_errors=True)


# -- the page ------------------------------------------------------------------
# The input prompts ("[3]:", "[*]:", "[ ]:") of the code cells of the notebook
# panel on show, in order (null while there is no panel).
_JS_CELLS = r"""
const panel = [...document.querySelectorAll('.jp-NotebookPanel')].find(p => !p.classList.contains('lm-mod-hidden'));
if (!panel) return null;
return [...panel.querySelectorAll('.jp-Notebook .jp-Cell.jp-CodeCell')].map(c => {
  const p = c.querySelector('.jp-InputArea-prompt, .jp-InputPrompt');
  return (p ? p.textContent : '?').replace(/\u00a0/g, ' ').trim();
});
"""

_JS_PROBLEMS = r"""
const out = [];
const panel = [...document.querySelectorAll('.jp-NotebookPanel')].find(p => !p.classList.contains('lm-mod-hidden'))
              || document;
const cells = [...panel.querySelectorAll('.jp-Cell.jp-CodeCell')];
const where = el => {
  const c = el.closest('.jp-Cell.jp-CodeCell');
  if (!c) return 'page';
  const p = c.querySelector('.jp-InputArea-prompt, .jp-InputPrompt');
  const prompt = (p ? p.textContent : '').replace(/\u00a0/g, ' ').trim().replace(/:$/, '');
  return `code cell ${cells.indexOf(c) + 1} ${prompt}`.trim();
};
const clip = t => { t = t.replace(/\s+/g, ' ').trim(); return t.length > 400 ? t.slice(0, 400) + '…' : t; };
const seen = new Set();
const add = (el, what) => {
  if (seen.has(el)) return;
  seen.add(el);
  out.push(`${where(el)}: ${what}: ${clip(el.innerText || el.textContent)}`);
};
for (const el of panel.querySelectorAll('.jp-OutputArea-output')) {
  const t = el.textContent;
  if (/Error displaying widget/.test(t)) add(el, 'widget error');
  else if (/model not found/i.test(t)) add(el, 'widget model not found');
  else if (/^\s*Loading widget\.\.\.\s*$/.test(t)) add(el, 'widget never rendered');
}
const ERR = /Traceback|^\s*Cell In\[\d+\]|^\s*\w*(Error|Exception)\b.*:/m;
// JupyterLab renders error outputs (tracebacks) with the stderr MIME type, like warnings
for (const el of panel.querySelectorAll('.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]')) {
  if (ERR.test(el.textContent)) add(el, 'error output');
}
for (const el of document.querySelectorAll('.jp-Dialog')) add(el, 'dialog');
return out;
"""

_JS_WIDGETS = r"""
const views = document.querySelectorAll(
  '.jp-OutputArea-output .lm-Widget.jupyter-widgets, .jp-OutputArea-output .jupyter-widgets, .jp-OutputArea-output .widget-html');
return [...views].filter(el => !/^\s*(Error displaying widget|Loading widget\.\.\.)/.test(el.textContent)
                              || el.children.length > 0).length;
"""


def page_problems(driver) -> list[str]:
    """What a student would see go wrong on the page: widget errors ("Error
    displaying widget", "model not found", a widget stuck at "Loading
    widget..."), tracebacks and error outputs, open dialogs. Empty when clean."""
    return list(driver.execute_script(_JS_PROBLEMS) or [])


def widget_count(driver) -> int:
    """How many rendered ipywidgets views the outputs hold (error placeholders excluded)."""
    return int(driver.execute_script(_JS_WIDGETS) or 0)


def _wait(what: str, timeout: float, probe, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise NotebookRunError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _click_menu(driver, menu: str, item: "str | re.Pattern", timeout: float = 15) -> None:
    """Open the menu-bar menu ``menu`` and click its entry ``item`` (its text, or a pattern the text matches)."""
    from selenium.webdriver.common.by import By

    def find_menu():
        for el in driver.find_elements(By.CSS_SELECTOR, "#jp-MainMenu .lm-MenuBar-item"):
            if el.text.strip() == menu:
                return el
        return None

    _wait(f"the {menu!r} menu", timeout, find_menu).click()

    def find_item():
        for el in driver.find_elements(By.CSS_SELECTOR, ".lm-Menu .lm-Menu-item"):
            label = el.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel")
            text = label[0].text.strip() if label else None
            if text is not None and (item.fullmatch(text) if isinstance(item, re.Pattern) else text == item) \
                    and el.is_displayed():
                return el
        return None

    entry = _wait(f"{menu} → {item!r}", timeout, find_item)
    if "lm-mod-disabled" in (entry.get_attribute("class") or ""):
        raise NotebookRunError(f"{menu} → {item!r} is disabled (is the notebook the current widget?)")
    entry.click()


#: Public name of the menu helper: ``click_menu(driver, "Kernel", re.compile("Restart Kernel.*"))``.
click_menu = _click_menu


_JS_DIALOG = r"""
const d = document.querySelector('.jp-Dialog');
return d ? (d.innerText || d.textContent).replace(/\s+/g, ' ').trim().slice(0, 300) : null;
"""

_JS_KERNEL = r"""
const el = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook-ExecutionIndicator');
return el ? el.getAttribute('data-status') : null;
"""


def _kernel_state(driver, api, notebook_path: str) -> str | None:
    """The kernel status as the notebook's toolbar shows it ("idle", "busy", ...).

    The toolbar indicator follows the kernel's own status messages; the REST
    API's execution_state is used only when the page has no indicator (it can
    say "idle" while a cell runs).
    """
    state = driver.execute_script(_JS_KERNEL)
    if state:
        return state
    kernel = _session_kernel(api, notebook_path)
    return kernel.get("execution_state") if kernel else None


def _session_kernel(api, notebook_path: str) -> dict | None:
    """The kernel model (/api/sessions) of the notebook's session, if it has one."""
    status, sessions = api("GET", "/api/sessions")
    if status != 200 or not isinstance(sessions, list):
        return None
    for s in sessions:
        if s.get("path") == notebook_path and s.get("kernel"):
            return s["kernel"]
    return None


def _api_for(base_url: str, token: str):
    def api(method: str, path: str, timeout: float = 10):
        req = urllib.request.Request(f"{base_url}{path}", method=method,
                                     headers={"Authorization": f"token {token}"})
        try:
            with _NO_PROXY.open(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except (OSError, ValueError):
            return None, None
    return api


#: ``rest_api(url, token)("GET", "/api/sessions")`` -> (status, decoded JSON), (None, None) when unreachable.
rest_api = _api_for

_DONE = re.compile(r"^\[\d+\]:$")


def run_all_cells(driver, base_url: str, token: str, notebook_path: str, timeout: float = 180) -> list[str]:
    """Open ``notebook_path`` (relative to the server's root) in JupyterLab,
    click Run → Run All Cells, and wait until every non-empty code cell shows
    an execution count and the kernel is idle. Returns the final prompts.

    Raises NotebookRunError on timeout (naming the cells still pending) or
    when the run stops early (a cell raised: later cells are never run).
    """
    from selenium.webdriver.common.by import By

    api = _api_for(base_url, token)
    quoted = urllib.parse.quote(notebook_path)
    status, model = api("GET", f"/api/contents/{quoted}?content=1&type=notebook")
    if status != 200 or not model:
        raise NotebookRunError(f"{notebook_path}: the server cannot read it (HTTP {status})")
    code = [c for c in model["content"]["cells"] if c.get("cell_type") == "code"]
    sources = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in code]

    start = time.monotonic()
    left = lambda: max(5.0, timeout - (time.monotonic() - start))  # noqa: E731
    driver.get(f"{base_url}/lab/tree/{quoted}?token={urllib.parse.quote(token)}")
    _wait("the notebook panel", min(60, left()),
          lambda: driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"))
    _wait(f"{len(code)} code cells in the page", min(60, left()),
          lambda: len(driver.execute_script(_JS_CELLS) or []) == len(code))

    def kernel_ready():
        # a dialog now (e.g. "Select Kernel": no kernelspec in the file) is what a student would be stuck at
        dialog = driver.execute_script(_JS_DIALOG)
        if dialog:
            raise NotebookRunError(f"{notebook_path}: a dialog is open instead of a running kernel: {dialog}")
        kernel = _session_kernel(api, notebook_path)  # started, and the page connected to it
        return (kernel is not None and kernel.get("execution_state") == "idle" and kernel.get("connections")
                and driver.execute_script(_JS_KERNEL) == "idle")

    _wait("the kernel to start and be idle", min(90, left()), kernel_ready, 0.5)

    prompts = driver.execute_script(_JS_CELLS)
    if any(_DONE.match(p) for p in prompts):  # outputs saved in the file: clear them so a count means "ran now"
        _click_menu(driver, "Edit", "Clear Outputs of All Cells")
        _wait("the saved outputs to clear", 15,
              lambda: not any(_DONE.match(p) for p in driver.execute_script(_JS_CELLS)))

    driver.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click()
    _click_menu(driver, "Run", "Run All Cells")

    def pending(prompts):
        return [(i, p) for i, p in enumerate(prompts) if sources[i].strip() and not _DONE.match(p)]

    stalled_since = None
    while True:
        prompts = driver.execute_script(_JS_CELLS) or []
        state = _kernel_state(driver, api, notebook_path)
        todo = pending(prompts)
        if not todo and state == "idle":
            break

        def report(why: str) -> str:
            lines = [f"{notebook_path}: {why}; cells still pending:"]
            for i, p in todo:
                first = sources[i].strip().splitlines()[0][:100]
                lines.append(f"  code cell {i + 1} {p.rstrip(':')}  {first}")
            problems = page_problems(driver)
            if problems:
                lines.append("problems on the page:")
                lines += [f"  {p}" for p in problems]
            return "\n".join(lines)

        # Nothing queued, kernel idle, yet cells unrun: the run stopped (a cell
        # raised, so the kernel dropped the rest). Give the UI a moment first.
        if todo and state == "idle" and not any(p == "[*]:" for p in prompts):
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 5:
                raise NotebookRunError(report(f"the run stopped (kernel {state})"))
        else:
            stalled_since = None
        if time.monotonic() - start > timeout:
            raise NotebookRunError(report(f"not done after {timeout:.0f} s (kernel {state})"))
        time.sleep(0.5)

    # Let widget views finish rendering ("Loading widget..." until the model arrives).
    with contextlib.suppress(NotebookRunError):
        _wait("widgets to render", 15, lambda: not driver.execute_script(
            "return [...document.querySelectorAll('.jp-OutputArea-output')]"
            ".some(e => /^\\s*Loading widget\\.\\.\\.\\s*$/.test(e.textContent))"))
    return prompts


def save_screenshot(driver, path, *, max_height: int = 12000) -> Path:
    """Screenshot of the whole notebook, from its top: the window is made tall
    enough (up to ``max_height`` pixels) for every cell, then set back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    resized = False
    try:
        extra = driver.execute_script(r"""
            const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
            if (!nb) return 0;
            const s = nb.querySelector('.jp-WindowedPanel-outer') || nb;
            return Math.max(0, s.scrollHeight - s.clientHeight);""") or 0
        if extra > 0:
            driver.set_window_size(WINDOW[0], min(WINDOW[1] + int(extra) + 40, max_height))
            resized = True
            time.sleep(1.0)  # relayout
            driver.execute_script(r"""
                const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
                const s = nb && (nb.querySelector('.jp-WindowedPanel-outer') || nb);
                if (s) s.scrollTop = 0;""")  # Run All left it scrolled to the last cell
            time.sleep(0.5)
    except Exception:  # a screenshot of the page as it is is better than none
        pass
    try:
        driver.save_screenshot(str(path))
    finally:
        if resized:
            with contextlib.suppress(Exception):
                driver.set_window_size(*WINDOW)
    return path


_JS_CELL_OUTPUT = r"""
const panel = [...document.querySelectorAll('.jp-NotebookPanel')].find(p => !p.classList.contains('lm-mod-hidden'));
const cell = panel && panel.querySelectorAll('.jp-Notebook .jp-Cell')[arguments[0]];
if (!cell) return null;
const prompt = cell.querySelector('.jp-InputArea-prompt, .jp-InputPrompt');
const out = [...cell.querySelectorAll('.jp-OutputArea-output')].map(o => o.innerText).join('\n');
return [(prompt ? prompt.textContent : '').replace(/\u00a0/g, ' ').trim(), out];
"""


def cell_output(driver, index: int) -> tuple[str, str]:
    """(prompt, output text) of cell ``index`` (all cells, markdown included, in file order)."""
    got = driver.execute_script(_JS_CELL_OUTPUT, index)
    if got is None:
        raise NotebookRunError(f"no cell {index} in the page")
    return got[0], got[1]


def type_and_run(driver, index: int, source: str, timeout: float = 60) -> str:
    """Replace code cell ``index``'s text as a learner types it, run it (Shift+Enter), wait until it ran,
    and return its output text."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    cells = driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
    editor = cells[index].find_element(By.CSS_SELECTOR, ".cm-content")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", editor)
    before = cell_output(driver, index)[0]
    editor.click()
    ActionChains(driver).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).perform()
    ActionChains(driver).send_keys(source).perform()
    ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()

    def ran():
        prompt, out = cell_output(driver, index)
        return (prompt, out) if _DONE.match(prompt) and prompt != before else None

    return _wait(f"cell {index} to run", timeout, ran)[1]


def run_cell(driver, index: int, timeout: float = 60) -> str:
    """Run code cell ``index`` as it stands (select it, Shift+Enter); its output text."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    cells = driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", cells[index])
    before = cell_output(driver, index)[0]
    cells[index].find_element(By.CSS_SELECTOR, ".cm-content").click()
    ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()

    def ran():
        prompt, out = cell_output(driver, index)
        return (prompt, out) if _DONE.match(prompt) and prompt != before else None

    return _wait(f"cell {index} to run", timeout, ran)[1]


_JS_STEP_VIEW = r"""
const panel = [...document.querySelectorAll('.jp-NotebookPanel')].find(p => !p.classList.contains('lm-mod-hidden'));
const cell = panel && panel.querySelectorAll('.jp-Notebook .jp-Cell')[arguments[0]];
if (!cell) return null;
const out = cell.querySelector('.jp-Cell-outputWrapper') || cell;
out.scrollIntoView({block: 'start'});
const shown = e => { const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
const lis = [...out.querySelectorAll('ol.labkit-hops > li')];
const loops = [...out.querySelectorAll('svg.labkit-path-svg path.loop')];
const lines = td => { const r = document.createRange(); r.selectNodeContents(td);
                      return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size; };
return {
  element: out,
  items: lis.map(li => li.innerText),
  groups: lis.map(li => { const m = li.innerText.match(/×(\d+)\s*$/); return m ? +m[1] : 1; }),
  badge_counts: [...out.querySelectorAll('svg.labkit-path-svg text')].filter(t => /^×\d+$/.test(t.textContent.trim())).length,
  loops: loops.length,
  loops_visible: loops.filter(p => { const b = p.getBBox(); return (b.width > 0 || b.height > 0) && shown(p); }).length,
  records_visible_text: [...out.querySelectorAll('details.lk-records')].map(d => d.innerText).join('\n'),
  node_cells: [...out.querySelectorAll('table.lk-diff td.lk-node')].map(td => [td.innerText, lines(td)]),
  diff_text: [...out.querySelectorAll('table.lk-diff')].map(t => t.innerText).join('\n'),
};
"""


def step_view_facts(driver, index: int) -> dict:
    """What cell ``index``'s step display shows in the page (scrolled into view): ``items`` (the numbered
    hop list's texts), ``groups`` (each item's ×N, 1 without), ``badge_counts`` (×N badges on the path
    picture), ``loops`` / ``loops_visible`` (loop paths on the picture, and those laid out on screen),
    ``records_visible_text`` (what the raw-records disclosures show: only their summary while folded),
    ``node_cells`` ([text, line boxes] of each CT diff node cell), ``diff_text``, and ``element`` (the
    output area, for a screenshot)."""
    facts = driver.execute_script(_JS_STEP_VIEW, index)
    if facts is None:
        raise NotebookRunError(f"no cell {index} in the page")
    return facts


# -- one JupyterLab and one Chromium for every browser test ------------------------------------
# A server start and a browser start cost ~20 s each: tests/labs/conftest.py starts them once per
# test session (``browser_session``) over one copy of labs/, and every test leaves them as it found
# them (``BrowserSession.finish``): kernels stopped, workspaces forgotten, the window at its size,
# the lab down.
def require_browser() -> None:
    """Skip the test when the browser tools are missing; fail it when CI=true."""
    import pytest

    missing = missing_tools()
    if missing:
        reason = "browser test needs: " + "; ".join(missing)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and {reason}")
        pytest.skip(reason)


def kernel_env(lab: str) -> dict:
    """The environment the server's kernels get: the lab name the notebooks use (``LABKIT_LAB``), and this
    checkout on PYTHONPATH unless ``labkit`` already imports from it."""
    import importlib.util

    env = {"LABKIT_LAB": lab}
    spec = importlib.util.find_spec("labkit")
    if spec is None or not str(spec.origin).startswith(str(REPO / "labkit")):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return env


def lab_down(name: str) -> subprocess.CompletedProcess:
    """``labkit --lab NAME down``; it exits 0 when the lab was never up ("nothing was recorded to remove")."""
    return subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", name, "down"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


class BrowserSession:
    """A running JupyterLab over ``labs`` (a copy of the repository's labs/) and a Chromium driving it.

    ``lab`` is the lab every notebook of the session starts (its kernels get ``LABKIT_LAB``); ``labs_down``
    names it and the variant labs a notebook may start beside it.
    """

    def __init__(self, driver, url: str, token: str, labs: Path, lab: str):
        self.driver, self.url, self.token, self.labs, self.lab = driver, url, token, labs, lab
        self.api = rest_api(url, token)

    @property
    def lab_names(self) -> tuple[str, ...]:
        return (f"{self.lab}-snat", self.lab)  # lab 07 starts a snat-mode variant beside the main lab

    def stop_kernels(self) -> None:
        """End every session and kernel the server runs (the next notebook's start() builds its own lab)."""
        status, sessions = self.api("GET", "/api/sessions")
        for s in sessions if status == 200 and isinstance(sessions, list) else []:
            self.api("DELETE", f"/api/sessions/{s['id']}", timeout=30)
        status, kernels = self.api("GET", "/api/kernels")
        for k in kernels if status == 200 and isinstance(kernels, list) else []:
            self.api("DELETE", f"/api/kernels/{k['id']}", timeout=30)

    def finish(self) -> list[str]:
        """Leave the session as a fresh one: the page closed, kernels stopped, saved workspaces (open tabs,
        sidebar) deleted, the window at WINDOW, and the labs down. Returns what failed (empty when clean)."""
        problems = []
        with contextlib.suppress(Exception):
            navigate(self.driver, "about:blank")
        self.stop_kernels()
        status, spaces = self.api("GET", "/lab/api/workspaces")
        ids = (spaces or {}).get("workspaces", {}).get("ids", []) if status == 200 and isinstance(spaces, dict) else []
        for ws in ids:
            self.api("DELETE", f"/lab/api/workspaces/{urllib.parse.quote(ws)}")
        with contextlib.suppress(Exception):
            self.driver.set_window_size(*WINDOW)
        for name in self.lab_names:
            down = lab_down(name)  # after the kernels that built it are gone
            if down.returncode != 0:
                problems.append(f"labkit --lab {name} down exited {down.returncode}:\n{down.stdout}{down.stderr}")
        return problems


def navigate(driver, url: str) -> None:
    """Load ``url`` in the window, accepting a "leave this page?" prompt on the way."""
    from selenium.common.exceptions import NoAlertPresentException, UnexpectedAlertPresentException

    try:
        driver.get(url)
    except UnexpectedAlertPresentException:
        with contextlib.suppress(NoAlertPresentException):
            driver.switch_to.alert.accept()
        driver.get(url)
    with contextlib.suppress(NoAlertPresentException):
        driver.switch_to.alert.accept()
