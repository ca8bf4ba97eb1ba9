"""A lab is a default node (`labkit up` with no options: --policy-mode default, Cilium's --enable-policy default,
daemon/cmd/daemon_main.go:370@82999990), so `labkit policy apply` enforces at once: the issue's acceptance,
through the command line and a labkitd of this working tree (on a socket of the test's own, so the machine's
labkitd, which may run older code, is left alone)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labtag import tagged

from .util import wait_for

LABKIT = [sys.executable, "-m", "labkit", "cli"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "only-a2.yaml"
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], 8080), timeout=2).close(); print('connected')"


@pytest.fixture(scope="module")
def door(_require_datapath, tmp_path_factory):
    """A labkitd started here from the working tree, on a socket of this module's; stopped after it."""
    from labkit.door import daemon

    path = tmp_path_factory.mktemp("door") / "labkitd.sock"
    daemon.start(path)
    yield path
    daemon.stop(path)


def test_up_then_apply_enforces(door):
    """`labkit up` (no option) then `labkit policy apply examples/only-a2.yaml`: a1 -> b1 is dropped with
    `policy-verdict:none INGRESS DENIED` at node-b, a2 -> b1 connects; `labkit status` says policy default."""
    name = tagged("dpdefpol")
    env = {**os.environ, "LABKIT_DOOR": str(door)}

    def labkit(*args, timeout=120):
        return subprocess.run(LABKIT + ["--lab", name, *args], capture_output=True, text=True, timeout=timeout,
                              env=env)

    up = labkit("up", timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        st = json.loads(labkit("status", "--json").stdout)
        assert st["datapath"]["policy"] == "default", st["datapath"]
        applied = labkit("policy", "apply", str(EXAMPLE))
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert "no policy is enforced" not in applied.stdout + applied.stderr
        b1 = st_ip(st, "b1")
        a1 = labkit("exec", "a1", "--", sys.executable, "-c", CONNECT, b1)
        assert a1.returncode != 0 and "connected" not in a1.stdout, a1.stdout + a1.stderr
        a2 = labkit("exec", "a2", "--", sys.executable, "-c", CONNECT, b1)
        assert a2.returncode == 0 and a2.stdout.strip() == "connected", a2.stdout + a2.stderr

        def denied():
            out = labkit("observe", "--verdict", "DROPPED", "--from-pod", "a1", "--last", "50").stdout
            return [line for line in out.splitlines() if "policy-verdict:none INGRESS DENIED" in line] or None

        lines = wait_for(denied, timeout=10, what="a1's denied verdict in `labkit observe`")
        assert "default/b1:8080" in lines[-1]
        allowed = labkit("observe", "--from-pod", "a2", "--to-pod", "b1", "--last", "50").stdout
        assert "DROPPED" not in allowed and "b1:8080" in allowed
    finally:
        labkit("down", timeout=180)


def st_ip(status: dict, pod: str) -> str:
    """A pod's address from `labkit status --json`."""
    return next(p["ip"] for p in status["pods"] if p["name"] == pod)
