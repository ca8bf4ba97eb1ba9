"""Lab 01 as a student meets it: JupyterLab in headless Chromium, Run All Cells,
widgets on screen. The screenshot is kept at test-artifacts/lab01.png. Every
browser test runs in the one JupyterLab and Chromium of tests/labs/conftest.py
(server, chromedriver and browser-console logs in test-artifacts/browser-logs/).

And the live CT table: scrolled down, it stays where it was while the
kernel refreshes it (live-table-scroll.png); next to the open sidebar in a
1,400 px window every column is in reach, and the column chooser hides one
(live-table-sidebar.png); after a kernel restart it says to re-run the cell
(live-table-restarted.png), and the saved notebook opened again (twice, saved
in between) shows the last table, not "Error displaying widget"
(live-table-reopened.png, live-table-reopened-twice.png); one restarted before it
was ever saved is saved as its text/html, which a reopened notebook shows
(live-table-static.png).

Needs Debian's chromium and chromium-driver and selenium (the [test] extra);
without them the test is skipped, or fails when CI=true.
"""
from __future__ import annotations

import contextlib
import re
import time
import warnings
from pathlib import Path

import pytest

try:
    from .browser import WINDOW, click_menu, navigate, page_problems, \
        run_all_cells, run_cell, save_screenshot, step_view_facts, type_and_run, widget_count
except ImportError:  # tests/labs is not a package: pytest put this directory on sys.path
    from browser import WINDOW, click_menu, navigate, page_problems, \
        run_all_cells, run_cell, save_screenshot, step_view_facts, type_and_run, widget_count

pytestmark = pytest.mark.labs

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
NOTEBOOK = "01-tour.ipynb"
RUN_TIMEOUT = 180


def test_lab01_runs_in_jupyterlab_with_widgets(jupyter):
    """Lab 01 runs to the end in JupyterLab in Chromium and its widgets render without errors."""
    if not (REPO / "labs" / NOTEBOOK).is_file():
        pytest.fail(f"labs/{NOTEBOOK} not found")
    shot = ARTIFACTS / "lab01.png"
    shot.unlink(missing_ok=True)
    driver = jupyter.driver
    try:
        run_all_cells(driver, jupyter.url, jupyter.token, NOTEBOOK, timeout=RUN_TIMEOUT)
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


# -- the live CT table in JupyterLab ---------------------------------------------------------
# One lab, one JupyterLab and one Chromium for the tests of TestLiveTable (a browser start costs
# ~20 s): its notebook fills node-a's CT map, shows the table and starts its timer; the tests
# then scroll it, fit it next to the open sidebar, and last stop its kernel.
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
# A table of a stand-in lab (rows made up in the kernel, no maps): its kernel is restarted before any save.
STATIC_NOTEBOOK = "live-table-static.ipynb"
STATIC_ROWS = 40
STATIC_CELL = (
    "from types import SimpleNamespace\n"
    "from labkit.maps.ct import CtEntry, CtKey4, CtRow\n"
    "from labkit.notebook.widgets import CtTable\n"
    f"rows = [CtRow.of(CtKey4.make('198.18.1.11', '198.18.2.11', 20000 + i, 8080, 6, 0), CtEntry(lifetime=1600))\n"
    f"        for i in range({STATIC_ROWS})]\n"
    "lab = SimpleNamespace(ct=lambda node: rows, clock=SimpleNamespace(now=lambda: 1000),\n"
    "                      ct_command=lambda node: [f'bpftool map dump pinned /sys/fs/bpf/labkit/x/{node}/cilium_ct4_global'],\n"
    "                      topology=SimpleNamespace(node=lambda name: SimpleNamespace(ip='198.51.100.11')))\n"
    "table = CtTable(lab, 'node-a')\n"
    "table.refresh()\n"
    "table"
)
HIDDEN_COLUMN = "backend"  # the column the chooser test unticks (the last one: the first cut off)


@pytest.fixture(scope="class")
def live_table(browser_session):
    """The notebook of SCROLL_CELLS run in the shared JupyterLab and Chromium: (driver, url, token, api, labs).
    Afterwards the session is left as a fresh one and the lab is down, whatever happened."""
    import nbformat

    session = browser_session
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"display_name": "Python 3", "language": "python",
                                                            "name": "python3"}})
    nb.cells = [nbformat.v4.new_code_cell(src) for src in SCROLL_CELLS]
    nbformat.write(nb, session.labs / SCROLL_NOTEBOOK)
    try:
        try:
            run_all_cells(session.driver, session.url, session.token, SCROLL_NOTEBOOK, timeout=RUN_TIMEOUT)
        except BaseException:
            with contextlib.suppress(Exception):
                save_screenshot(session.driver, ARTIFACTS / "live-table-setup.png")
            raise
        yield session
    finally:
        problems = session.finish()
        if problems:
            pytest.fail("\n".join(problems))


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

# Where the live table sits against its cell's output area and JupyterLab's left sidebar, and for
# each column header whether it is in view now and once the table is scrolled sideways to it (the
# header's rect inside the scrolling element's visible client rect). Left scrolled back to 0.
_JS_COLUMNS_REACHABLE = r"""
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
const el = panel && [...panel.querySelectorAll('.jp-OutputArea-output .widget-html')]
  .find(e => e.querySelector('.lk-ct table'));
if (!el) return {error: 'no live CT table on the page'};
const rect = e => { const b = e.getBoundingClientRect();
                    return {left: Math.round(b.left), right: Math.round(b.right), width: Math.round(b.width)}; };
const output = el.closest('.jp-OutputArea-output'), box = el.closest('.widget-vbox');
const side = document.querySelector('#jp-left-stack');
const view = () => { const b = el.getBoundingClientRect();
                     return {left: b.left + el.clientLeft, right: b.left + el.clientLeft + el.clientWidth}; };
const inView = th => { const b = th.getBoundingClientRect(), v = view();
                       return b.left >= v.left - 1 && b.right <= v.right + 1; };
el.scrollIntoView({block: 'center'});
el.scrollLeft = 0;
const columns = [];
for (const th of el.querySelectorAll('thead th')) {
  const atStart = inView(th);
  el.scrollLeft = th.getBoundingClientRect().left - view().left + el.scrollLeft;  // the browser clamps it
  columns.push({name: th.textContent.trim(), atStart: atStart, reachable: inView(th), scrollLeft: el.scrollLeft});
  el.scrollLeft = 0;
}
return {
  window: [window.innerWidth, window.innerHeight],
  sidebar: side ? {rect: rect(side), hidden: side.classList.contains('lm-mod-hidden')} : null,
  output: rect(output), box: rect(box), table: rect(el),
  outputScroll: [output.scrollWidth, output.clientWidth], tableScroll: [el.scrollWidth, el.clientWidth],
  rows: el.querySelectorAll('tbody tr').length, columns: columns,
};
"""

# The chooser of the live table: its header (to unfold it) and the checkbox of one column.
_JS_CHOOSER = r"""
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
const table = [...panel.querySelectorAll('.jp-OutputArea-output .widget-html')].find(e => e.querySelector('.lk-ct table'));
const box = table && table.closest('.widget-vbox');
if (!box) return null;
const header = box.querySelector('.jupyter-widget-Accordion .jupyter-widget-Collapse-header');
const input = [...box.querySelectorAll('.jupyter-widget-Accordion .widget-checkbox label')]
  .filter(l => l.textContent.trim() === arguments[0]).map(l => l.querySelector('input'))[0] || null;
return [header, input];
"""

# The live table as the page shows it: header names, rows, status line, whether the stopped-kernel
# notice is shown (and its text), whether it is a widget view or the static text/html fallback.
_JS_TABLE_NOW = r"""
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) return null;
const shown = e => e && getComputedStyle(e).display !== 'none' && e.getClientRects().length > 0;
const table = panel.querySelector('.jp-OutputArea-output .lk-ct table');
if (!table) return {table: false, loading: [...panel.querySelectorAll('.jp-OutputArea-output')]
                    .some(e => /Loading widget/.test(e.textContent))};
const out = table.closest('.jp-OutputArea-output');
const notices = [...out.querySelectorAll('.lk-ct-stopped, .lk-ct-stopped-static')].filter(shown);
const box = table.closest('.widget-vbox');
const htmls = box ? [...box.querySelectorAll(':scope > .widget-html')] : [];
return {
  table: true, widget: !!box, static: !!out.querySelector('.lk-ct-static'),
  headers: [...table.querySelectorAll('thead th')].map(th => th.textContent.trim()),
  rows: table.querySelectorAll('tbody tr').length,
  status: htmls.length ? htmls[htmls.length - 1].innerText.trim() : null,
  notice: notices.map(n => n.innerText.trim()).join(' | '),
  disconnected: !!(box && box.classList.contains('jupyter-widgets-disconnected')),
  controls: box ? box.querySelectorAll('input, select').length : 0,
  inert: !!box && [...box.querySelectorAll('input, select')].every(e => getComputedStyle(e).pointerEvents === 'none'),
  loading: [...panel.querySelectorAll('.jp-OutputArea-output')].some(e => /Loading widget/.test(e.textContent)),
};
"""


def _wait_for(what: str, timeout: float, probe, interval: float = 0.25):
    """``probe()`` until it returns something true; AssertionError naming ``what`` and its last value after ``timeout``."""
    deadline, value = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last seen: {value!r}")


def _open_left_sidebar(driver) -> None:
    """Show JupyterLab's left sidebar (the file browser) when it is collapsed."""
    from selenium.webdriver.common.by import By

    hidden = "const s = document.querySelector('#jp-left-stack'); return !s || s.classList.contains('lm-mod-hidden');"
    if driver.execute_script(hidden):
        driver.find_element(By.CSS_SELECTOR, ".jp-SideBar.jp-mod-left .lm-TabBar-tab[data-id='filebrowser']").click()
        _wait_for("the left sidebar to open", 10, lambda: not driver.execute_script(hidden))


def _saved_widget_state(api, path: str) -> dict:
    """The widget state saved in the notebook file: model id -> state (empty when none was saved)."""
    status, model = api("GET", f"/api/contents/{path}?content=1&type=notebook")
    assert status == 200, f"GET {path}: HTTP {status}"
    saved = (model["content"].get("metadata") or {}).get("widgets") or {}
    return (saved.get("application/vnd.jupyter.widget-state+json") or {}).get("state") or {}


class TestLiveTable:
    """The live CT table in JupyterLab in Chromium, one lab, server and browser for all (tests run in order)."""

    def test_keeps_scroll_position_across_refreshes(self, live_table):
        """The live CT table, scrolled down in the browser, stays where it was while the kernel refreshes it."""
        driver = live_table.driver
        shot = ARTIFACTS / "live-table-scroll.png"
        shot.unlink(missing_ok=True)
        try:
            assert page_problems(driver) == [], "\n".join(page_problems(driver))
            found = driver.execute_script(_JS_FIND_SCROLLER)
            assert "error" not in found, f"the live table's scrolling element: {found}"
            # in view, as a student would have it, then scrolled down inside
            driver.execute_script("window.__lkScroller.scrollIntoView({block: 'center'});")
            # set and read back in one go: no refresh can come in between
            before = driver.execute_script(f"window.__lkScroller.scrollTop = {SCROLL_TO};\n" + _JS_SCROLL_STATE)
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
            with contextlib.suppress(Exception):
                driver.execute_script("if (window.__lkScroller) window.__lkScroller.scrollTop = 0;")
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

    def test_fits_next_to_the_sidebar_and_hides_a_column(self, live_table):
        """In a 1,400 px window with the left sidebar open, the table stays inside its output area and every
        column header is in view or reached by scrolling the table sideways; unticking a column in the chooser
        takes it out of the table (rows unchanged), and refreshes keep it out."""
        from labkit.notebook.widgets import COLUMNS

        driver = live_table.driver
        shot = ARTIFACTS / "live-table-sidebar.png"
        shot.unlink(missing_ok=True)
        try:
            driver.set_window_size(*WINDOW)
            _open_left_sidebar(driver)
            time.sleep(0.5)  # relayout
            fit = driver.execute_script(_JS_COLUMNS_REACHABLE)
            assert "error" not in fit, fit
            header, checkbox = driver.execute_script(_JS_CHOOSER, HIDDEN_COLUMN) or (None, None)
            assert header is not None and checkbox is not None, "the table has no column chooser"
            header.click()  # unfold it
            _wait_for("the column chooser to unfold", 10, checkbox.is_displayed)
            checkbox.click()
            hidden = _wait_for(f"the {HIDDEN_COLUMN!r} column to go", 15, lambda: (
                lambda now: now if now and now.get("table") and HIDDEN_COLUMN not in now["headers"] else None)(
                driver.execute_script(_JS_TABLE_NOW)))
            # a later refresh (a new status line) keeps the choice
            refreshed = _wait_for("a refresh after the chooser changed", 15, lambda: (
                lambda now: now if now and now.get("status") != hidden["status"] else None)(
                driver.execute_script(_JS_TABLE_NOW)))
            narrowed = driver.execute_script(_JS_COLUMNS_REACHABLE)
        finally:
            try:
                save_screenshot(driver, shot)
            except Exception as exc:
                warnings.warn(f"no screenshot of the live table next to the sidebar: {exc!r}")
        detail = f"measured {fit} (screenshot: {shot})"
        assert fit["window"][0] == WINDOW[0], f"window {fit['window']}, not {WINDOW[0]} px wide: {detail}"
        assert fit["sidebar"] and not fit["sidebar"]["hidden"] and fit["sidebar"]["rect"]["width"] >= 150, \
            f"the left sidebar is not open: {detail}"
        assert [c["name"] for c in fit["columns"]] == list(COLUMNS), f"the table's header is not every column: {detail}"
        unreachable = [c["name"] for c in fit["columns"] if not c["reachable"]]
        assert unreachable == [], f"columns out of reach: {unreachable}: {detail}"
        for part in ("box", "table"):
            assert fit["output"]["left"] - 1 <= fit[part]["left"] and fit[part]["right"] <= fit["output"]["right"] + 1, \
                f"the live table's {part} pushes past its output area: {detail}"
        assert fit["outputScroll"][0] <= fit["outputScroll"][1] + 1, f"the output area itself overflows: {detail}"
        assert fit["rows"] >= SCROLL_ROWS, f"the table shows {fit['rows']} rows, not {SCROLL_ROWS}: {detail}"
        assert hidden["headers"] == [c for c in COLUMNS if c != HIDDEN_COLUMN], f"after unticking: {hidden}"
        assert not hidden["inert"] and not hidden["notice"], f"a live table looks stopped: {hidden}"
        assert hidden["rows"] == fit["rows"], f"hiding a column changed the rows: {hidden['rows']} vs {fit['rows']}"
        assert HIDDEN_COLUMN not in refreshed["headers"], f"a refresh brought the column back: {refreshed}"
        assert [c for c in narrowed["columns"] if not c["reachable"]] == [], f"after hiding one: {narrowed}"
        assert shot.is_file(), f"no screenshot at {shot}"

    def test_says_rerun_after_restart_and_shows_the_last_table_reopened(self, live_table):
        """Saved, the notebook holds the table's widget state; after a kernel restart the table says its
        kernel has stopped and to re-run the cell; saved again then (JupyterLab keeps no state of a widget
        without a kernel, labkit's save hook keeps it) and opened in a fresh page after its kernel was shut
        down, it shows the last table with that sentence; saved and opened once more, the same: never
        "Error displaying widget"."""
        driver, api = live_table.driver, live_table.api
        shots = {name: ARTIFACTS / f"live-table-{name}.png" for name in ("restarted", "reopened", "reopened-twice")}
        for s in shots.values():
            s.unlink(missing_ok=True)

        # save, as a learner does (File → Save Notebook): the widget state goes into the file
        click_menu(driver, "File", "Save Notebook")
        state = _wait_for("the widget state in the saved notebook", 30, lambda: (
            lambda st: st if any("<table>" in str(m.get("state", {}).get("value", "")) for m in st.values()) else None)(
            _saved_widget_state(api, SCROLL_NOTEBOOK)))
        saved_html = [m["state"]["value"] for m in state.values() if "<table>" in str(m["state"].get("value", ""))]
        assert f">{HIDDEN_COLUMN}</th>" not in saved_html[0], \
            "the saved table is not the one on the page (its hidden column is back)"

        # restart the kernel (Kernel → Restart Kernel…, then the dialog's Restart)
        from selenium.webdriver.common.by import By

        try:
            click_menu(driver, "Kernel", re.compile(r"Restart Kernel…?"))
            _wait_for("the restart dialog", 10,
                      lambda: driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog .jp-mod-accept"))[0].click()
            restarted = _wait_for("the stopped-kernel notice after the restart", 60, lambda: (
                lambda now: now if now and now.get("notice") else None)(driver.execute_script(_JS_TABLE_NOW)))
            restarted_problems = page_problems(driver)
        finally:
            with contextlib.suppress(Exception):
                save_screenshot(driver, shots["restarted"])
        assert restarted_problems == [], f"after the restart (screenshot {shots['restarted']}): {restarted_problems}"
        assert "re-run this cell" in restarted["notice"] and "kernel that has stopped" in restarted["notice"], \
            f"after the restart: {restarted} (screenshot {shots['restarted']})"
        assert restarted["rows"] >= SCROLL_ROWS, f"the last table is gone after the restart: {restarted}"
        assert restarted["controls"] >= 15 and restarted["inert"], f"dead controls still take clicks: {restarted}"

        # saved after the restart (as autosave would): JupyterLab sends no state for the dead widgets
        click_menu(driver, "File", "Save Notebook")
        time.sleep(2)
        assert set(_saved_widget_state(api, SCROLL_NOTEBOOK)) >= set(state), \
            "the save after the restart dropped the table's widget state"

        # each time: the kernel shut down (its session deleted), the notebook opened in a fresh page
        for visit in ("reopened", "reopened-twice"):
            shot = shots[visit]
            status, sessions = api("GET", "/api/sessions")
            for s in sessions or []:
                if s.get("path") == SCROLL_NOTEBOOK:
                    api("DELETE", f"/api/sessions/{s['id']}")
            try:
                navigate(driver, "about:blank")
                navigate(driver, f"{live_table.url}/lab/tree/{SCROLL_NOTEBOOK}?token={live_table.token}")
                _wait_for(f"the {visit} notebook's table", 90, lambda: (
                    lambda now: now if now and now.get("table") and not now.get("loading") else None)(
                    driver.execute_script(_JS_TABLE_NOW)))
                time.sleep(1.0)  # any late widget error would be on the page by now
                reopened = driver.execute_script(_JS_TABLE_NOW)
                problems = page_problems(driver)
                error_text = driver.execute_script("return /Error displaying widget/.test(document.body.innerText)")
            finally:
                with contextlib.suppress(Exception):
                    save_screenshot(driver, shot)
            assert problems == [] and not error_text, \
                f"{visit} (screenshot {shot}): {problems}, 'Error displaying widget' on the page: {error_text}"
            assert reopened["widget"], f"{visit}: the table is not drawn from its saved widget state: {reopened}"
            assert reopened["rows"] >= SCROLL_ROWS, f"{visit}: the last table is not shown: {reopened}"
            assert HIDDEN_COLUMN not in reopened["headers"] and len(reopened["headers"]) == 12, reopened
            assert "re-run this cell" in reopened["notice"], f"{visit} without the re-run sentence: {reopened}"
            assert reopened["inert"], f"{visit}: its controls take clicks no kernel answers: {reopened}"
            assert shot.is_file(), f"no screenshot at {shot}"
            # JupyterLab marks a reopened notebook changed; saving it (as its autosave would) keeps the state
            click_menu(driver, "File", "Save Notebook")
            time.sleep(2)
            assert set(_saved_widget_state(api, SCROLL_NOTEBOOK)) >= set(state), \
                f"saving the {visit} notebook dropped the table's widget state"


    def test_shows_its_html_when_no_widget_state_was_ever_saved(self, live_table):
        """A table whose kernel restarted before the notebook was ever saved: saved then, the notebook keeps the
        table's text/html in place of the widget, so opened again it shows that sentence over the last table."""
        import nbformat

        driver, api = live_table.driver, live_table.api
        shot = ARTIFACTS / "live-table-static.png"
        shot.unlink(missing_ok=True)
        nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"display_name": "Python 3", "language": "python",
                                                                "name": "python3"}})
        nb.cells = [nbformat.v4.new_code_cell(STATIC_CELL)]
        nbformat.write(nb, live_table.labs / STATIC_NOTEBOOK)
        from selenium.webdriver.common.by import By

        try:
            run_all_cells(driver, live_table.url, live_table.token, STATIC_NOTEBOOK, timeout=RUN_TIMEOUT)
            click_menu(driver, "Kernel", re.compile(r"Restart Kernel…?"))
            _wait_for("the restart dialog", 10,
                      lambda: driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog .jp-mod-accept"))[0].click()
            _wait_for("the stopped-kernel notice after the restart", 60, lambda: (
                lambda now: now if now and now.get("notice") else None)(driver.execute_script(_JS_TABLE_NOW)))
            click_menu(driver, "File", "Save Notebook")
            saved = _wait_for("the saved notebook's table output", 90, lambda: (
                lambda m: m if m[0] == 200 and m[1]["content"]["cells"][0]["outputs"] else None)(
                api("GET", f"/api/contents/{STATIC_NOTEBOOK}?content=1&type=notebook")))
            status, sessions = api("GET", "/api/sessions")
            for s in sessions or []:
                if s.get("path") == STATIC_NOTEBOOK:
                    api("DELETE", f"/api/sessions/{s['id']}")
            navigate(driver, "about:blank")
            navigate(driver, f"{live_table.url}/lab/tree/{STATIC_NOTEBOOK}?token={live_table.token}")
            shown = _wait_for("the reopened notebook's table", 90, lambda: (
                lambda now: now if now and now.get("table") and not now.get("loading") else None)(
                driver.execute_script(_JS_TABLE_NOW)))
            time.sleep(1.0)
            problems = page_problems(driver)
            error_text = driver.execute_script("return /Error displaying widget/.test(document.body.innerText)")
        finally:
            with contextlib.suppress(Exception):
                save_screenshot(driver, shot)
        outputs = saved[1]["content"]["cells"][0]["outputs"]
        assert [sorted(o.get("data", {})) for o in outputs] == [["text/html", "text/plain"]], \
            f"the saved output still holds a widget view without state: {[sorted(o.get('data', {})) for o in outputs]}"
        assert problems == [] and not error_text, f"reopened (screenshot {shot}): {problems}, error text {error_text}"
        assert shown["static"] and not shown["widget"], f"not the table's text/html: {shown}"
        assert "re-run this cell" in shown["notice"] and "kernel that has stopped" in shown["notice"], shown
        assert shown["rows"] == STATIC_ROWS and len(shown["headers"]) == 13, shown
        assert shot.is_file(), f"no screenshot at {shot}"


# -- lab 02 as a learner answers it: Run All first, then the answers ---------------------------
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


def test_lab02_answered_after_run_all(jupyter):
    """Run All on lab 02 in JupyterLab: the close step's CT diff in the row grammar, its node cells unwrapped;
    then for each exercise a wrong answer typed into its answer cell and checked (try 1 shows no expected
    value), then the reference answer typed and checked: every check passes."""
    import json as _json

    import nbformat

    key = _json.loads((REPO / "instructor" / "answers" / "02.json").read_text())
    nb = nbformat.read(jupyter.labs / ANSWER_NOTEBOOK, as_version=4)
    answer_cell = {c.metadata["labkit"]["answer"]: i for i, c in enumerate(nb.cells)
                   if c.get("metadata", {}).get("labkit", {}).get("answer")}
    check_cell = {c.metadata["labkit"]["check"]: i for i, c in enumerate(nb.cells)
                  if c.get("metadata", {}).get("labkit", {}).get("check")}
    shot = ARTIFACTS / "lab02-answers.png"
    problems = {}
    driver = jupyter.driver
    try:
        run_all_cells(driver, jupyter.url, jupyter.token, ANSWER_NOTEBOOK, timeout=RUN_TIMEOUT)
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
    assert problems == {}, f"lab 02 answered in JupyterLab (screenshot {shot}): {problems}"
