"""`labkit list` on the real kernel: lab 07's kernel restarted leaves its `-snat` lab orphaned, the list
names it, and start() in a new kernel takes it down."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from labkit.lab.inventory import inventory
from labkit.net import netns as _netns
from labkit.net.ledger import Ledger

from labtag import tagged

REPO = Path(__file__).resolve().parents[2]
LAB = tagged("inv")

# What lab 07's setup cells run: the main lab, then the snat-mode lab beside it.
LAB07_SETUP = 'from labkit.nb import start\nlab = start()\nsnat = start(variant="snat", lb_mode="snat")\n'


def _kernel(code: str) -> None:
    """Run ``code`` as a notebook kernel would (a process of its own, LABKIT_LAB set), to its end."""
    env = {**os.environ, "LABKIT_LAB": LAB, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300, cwd=REPO)


def _labkit(*argv: str) -> str:
    return subprocess.run([sys.executable, "-m", "labkit", "cli", *argv], capture_output=True, text=True,
                          check=True, timeout=120, cwd=REPO).stdout


def _listed() -> dict[str, dict]:
    return {d["name"]: d for d in json.loads(_labkit("list", "--json")) if d["base"] == LAB}


def test_list_names_the_orphaned_variant_and_start_removes_it():
    """After lab 07's kernel ends, `labkit list` shows its -snat lab orphaned (text and JSON) and status
    names it; start() in the next kernel takes it down and leaves the main lab up."""
    snat = f"{LAB}-snat"
    try:
        _kernel(LAB07_SETUP)  # the kernel ends here: a restart
        labs = _listed()
        assert set(labs) == {LAB, snat}
        assert labs[snat]["orphaned"] is True and labs[snat]["variant"] == "snat" and labs[snat]["status"] == "up"
        assert labs[LAB]["orphaned"] is False and labs[LAB]["variant"] is None
        assert labs[snat]["holds"]["netns"] > 0 and labs[snat]["running"] > 0  # it still holds a live lab

        text = _labkit("list")
        row = next(line for line in text.splitlines() if line.startswith(snat + " "))
        assert row.split()[1:3] == [LAB, "orphaned"]
        assert f"labkit --lab {snat} down" in text
        status = _labkit("--lab", LAB, "status")
        assert next(line for line in status.splitlines() if line.startswith("variant labs")).split(None, 2)[2] \
            .startswith(f"{snat} (orphaned")

        _kernel("from labkit.nb import start\nlab = start()\n")  # the restarted kernel runs the setup cell
        assert set(_listed()) == {LAB}
        assert not Ledger(snat).exists()
        assert not [s.name for s in inventory() if s.name == snat]
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert not [line for line in out.splitlines() if line.startswith(f"lk-{snat}-")]
    finally:
        for name in (snat, LAB):
            subprocess.run([sys.executable, "-m", "labkit", "cli", "--lab", name, "down"], cwd=REPO,
                           capture_output=True, timeout=300)
        assert not _netns.exists(f"lk-{LAB}-node-a")
