"""labkit/tools/doorbench.py: labkitd's three bench figures, each run once, small, on the real kernel through the
running labkitd; the shape of what they return, never their timing."""
from __future__ import annotations

import shutil
import statistics

import pytest

from doorcheck import CI
from labkit.net import netns as _netns
from labkit.tools import doorbench
from labtag import tagged

pytestmark = pytest.mark.timeout(900)  # three measurements with their labs, in the module's fixture

@pytest.fixture(scope="module")
def mininet_ready(door_ready):
    """Debian's mininet and bridge-utils (``make test`` provisions them), or skip (fail when CI=true)."""
    missing = [tool for tool in ("mn", "brctl") if shutil.which(tool) is None]
    if missing:
        problem = f"{' and '.join(missing)} not installed: apt-get install mininet bridge-utils"
        if CI:
            pytest.fail(f"CI=true and the door's bench cannot run: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="module")
def door(mininet_ready):
    """The three measurements, each with its labs named for this worker: up/down 1 round, steps 2, table 1."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(doorbench, "UP_DOWN_LAB", tagged("bench-door"))
        mp.setattr(doorbench, "STEP_LABS", {side: tagged(n) for side, n in doorbench.STEP_LABS.items()})
        mp.setattr(doorbench, "TABLE_LABS", {side: tagged(n) for side, n in doorbench.TABLE_LABS.items()})
        yield {"up_down": doorbench.up_down_vs_mininet(1), "step": doorbench.step_door_vs_inprocess(2),
               "table": doorbench.table_refresh_door(1),
               "labs": [doorbench.UP_DOWN_LAB, *doorbench.STEP_LABS.values(), *doorbench.TABLE_LABS.values()]}


def _ratio(a: list[float], b: list[float]) -> float:
    return round(statistics.median(a) / statistics.median(b), 3)


def test_up_down_vs_mininet_shape(door):
    """One round: a positive sample of each command and of every part of labkit's breakdown, the ratio the
    samples' medians give, the conditions named, and nothing of the lab or of Mininet left (its sysctls back)."""
    u = door["up_down"]
    s = u["samples_s"]
    assert u["rounds"] == 1 and u["orders"] == ["labkit,mininet"]
    for key in ("labkit", "mininet", "labkit_up", "labkit_down", "labkit_up_build", "api_up", "api_down",
                "api_up_build"):
        assert len(s[key]) == 1 and s[key][0] > 0, key
    assert s["labkit"][0] == pytest.approx(s["labkit_up"][0] + s["labkit_down"][0])
    assert s["labkit_up_build"][0] < s["labkit_up"][0] and s["api_up_build"][0] < s["api_up"][0]
    parts = ("labkit_up_door", "labkit_down_door", "api_up_door", "api_down_door")  # from labkitd's log, if it logs
    assert all(len(s[k]) <= 1 and all(x > 0 for x in s[k]) for k in parts)
    assert u["ratio"] == _ratio(s["labkit"], s["mininet"])
    c = u["conditions"]
    assert c["mininet"].startswith("2.") and c["labkitd"]["pid"] > 0 and c["labkitd"]["uptime_s"] > 0
    assert c["topology"] == {"nodes": 2, "pods": 4, "externals": 1}
    assert doorbench.mininet_leftovers() == []
    assert c["sysctls_after"] == c["sysctls_before"]  # what mn raised, put back (read by the bench itself: the host
    # is shared with the other tests of the run, so no comparison spans them)
    assert not any(_netns.exists(f"lk-{name}-node-a") for name in door["labs"])


def test_step_door_vs_inprocess_shape(door):
    """Two rounds: two positive samples of each step on each side, medians and the ratio from those samples."""
    st = door["step"]
    assert st["rounds"] == 2 and st["orders"] == ["door,inprocess", "inprocess,door"]
    for side in ("door", "inprocess"):
        by_kind = st["samples_s"][side]
        assert all(len(by_kind[k]) == 2 and min(by_kind[k]) > 0 for k in doorbench.STEP_KINDS)
        assert sorted(by_kind["all"]) == sorted(t for k in doorbench.STEP_KINDS for t in by_kind[k])
        assert st["median_s"][side]["all"] == pytest.approx(statistics.median(by_kind["all"]), abs=1e-6)
    assert st["ratio"] == _ratio(st["samples_s"]["door"]["all"], st["samples_s"]["inprocess"]["all"])


def test_table_refresh_door_shape(door):
    """One round: ten positive refreshes of the 1,000-row table on each side, the ratio from their medians, and the
    report's lines naming all three figures."""
    t = door["table"]
    assert t["rounds"] == 1 and t["rows"] == 1000
    assert all(len(t["samples_s"][side]) == 10 and min(t["samples_s"][side]) > 0 for side in ("door", "inprocess"))
    assert t["median_s"]["door"] == pytest.approx(statistics.median(t["samples_s"]["door"]), abs=1e-6)
    assert t["ratio"] == _ratio(t["samples_s"]["door"], t["samples_s"]["inprocess"])
    assert len(t["samples_s"]["door_ct_request"]) in (0, 10)  # labkitd's part of each refresh, when it logs
    lines = doorbench.report_lines({k: door[k] for k in ("up_down", "step", "table")})
    assert len(lines) == 4 and "ratio labkit/mn" in lines[0] and "where labkit's time goes" in lines[1]
    assert "one notebook step through labkitd" in lines[2] and "live CT table, 1,000 rows" in lines[3]
