"""The lab's agent process on the real kernel: services through its API land in the maps as it
reports them; killed with SIGKILL and restarted, it restores the same ids and leaves the maps
byte-identical while traffic goes on; concurrent clients end with the union of their changes;
bad input is a 4xx that changes nothing; the socket is root's; `down` leaves nothing of it."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from labkit.agent.api import socket_path
from labkit.agent.client import AgentClient, AgentDownError
from labkit.agent.services.ids import AgentState
from labkit.agent.services.model import Service
from labkit.agent.services.plan import entries
from labkit.config import DatapathConfig
from labkit.errors import ConfigError, NotFoundError
from labkit.maps.lb import LB_MAPS, MAGLEV_MAP
from labkit.net.ledger import Ledger, process_start_time

from labtag import tagged

from .util import wait_for

LABKIT = [sys.executable, "-m", "labkit", "cli"]


@pytest.fixture(scope="module")
def agent_lab(_require_datapath):
    """A lab of its own (agents get killed here), LB maps big enough for thousands of services."""
    from labkit import Lab

    lab = Lab.up(tagged("dpagent"), config=DatapathConfig(routing="native", gc_timer=False, lb_map_size=65536))
    yield lab
    lab.down()


@pytest.fixture
def alab(agent_lab):
    agent_lab.reset()
    return agent_lab


def agent_pid(lab) -> int:
    return [e for e in Ledger(lab.name).entries("process") if e["name"] == "agent"][-1]["pid"]


def bpftool_lb(lab) -> dict[str, str]:
    """Every node's LB maps as ``bpftool map dump pinned`` prints them (the kernel's own bytes). The Maglev
    map's values are the ids of its inner maps: a table written again would show a new id."""
    out = {}
    for node in lab.topology.nodes:
        for m in LB_MAPS:
            r = subprocess.run(["bpftool", "map", "dump", "pinned", f"{lab.pin_dir(node.name)}/{m}"],
                               capture_output=True, text=True, check=True)
            out[f"{node.name}/{m}"] = r.stdout
    return out


def maps_as_reported(lab) -> None:
    """Every node's LB maps hold exactly the rows the services the agent reports call for."""
    reported = AgentClient(lab.name).get("/v1/service")
    state = AgentState()
    for data in reported:
        svc = Service.from_json(data)
        state.services[svc.name] = svc
    services = lab.services.local
    for node in lab.topology.nodes:
        want = entries(state, lab.topology, node.name, lab.config.maglev_table_size, lab.config.cilium)
        for map_name, rows in want.items():
            if map_name == MAGLEV_MAP:
                continue
            have = {bytes(k): bytes(v) for k, v in services.maps.items(node.name, map_name)}
            assert have == {k: bytes(v) for k, (_, v) in rows.items()}, f"{node.name} {map_name}"
    services.maps.close()


def test_apply_2000_services_maps_equal_the_agent(alab):
    """2,000 services through `labkit service apply` (one agent call), then one backend added and removed:
    after each, every node's maps hold what the agent reports, entry for entry."""
    specs = [{"name": f"s{i}", "port": 80, "vip": f"198.19.{10 + i // 250}.{1 + i % 250}",
              "backends": ["b1:8080"] if i % 3 else ["b1:8080", "a2:8080"]} for i in range(2000)]
    path = f"/tmp/labkit-{alab.name}-apply.json"
    with open(path, "w") as f:
        json.dump(specs, f)
    try:
        r = subprocess.run(LABKIT + ["--lab", alab.name, "service", "apply", path, "--json"], capture_output=True,
                           text=True, timeout=300)
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["added"]) == 2000
    assert len(alab.services.list()) == 2000
    maps_as_reported(alab)
    alab.services.add_backend("s1999", "b2:8080")
    maps_as_reported(alab)
    alab.services.remove_backend("s1999", "b1:8080")
    maps_as_reported(alab)
    assert [b.ref for b in alab.services.get("s1999").backends] == ["b2:8080"]


def answers(lab) -> bool:
    """True if the lab's agent answers; False once connecting is refused (it is gone)."""
    try:
        AgentClient(lab.name, timeout=2).healthz()
        return True
    except AgentDownError as exc:
        return "agent is not running" not in str(exc)


_TRAFFIC = textwrap.dedent("""
    import json, socket, sys, time
    vip, seconds = sys.argv[1], float(sys.argv[2])
    ok = failed = long_sent = 0
    errors = []
    long = socket.create_connection((vip, 80), timeout=2)
    end = time.monotonic() + seconds
    next_new = next_long = time.monotonic()
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_long:
            long.sendall(b"tick")
            assert long.recv(16) == b"tick"
            long_sent += 1
            next_long += 0.1
        if now >= next_new:
            try:
                s = socket.create_connection((vip, 80), timeout=1)
                s.sendall(b"ping")
                ok += s.recv(16) == b"ping"
                s.close()
            except OSError as exc:
                failed += 1
                errors.append(str(exc))
            next_new += 0.02
        time.sleep(0.002)
    long.close()
    print(json.dumps({"ok": ok, "failed": failed, "long_sent": long_sent, "errors": errors[:5]}))
""")


def test_kill_9_and_restart_keeps_traffic_maps_and_ids(alab):
    """A pod client opening a connection every 20 ms and one long-lived connection sending every 100 ms
    run across SIGKILL of the agent, 5 s without it, and `labkit agent restart`: no connection fails,
    the long one is never broken, the LB maps are byte-identical (bpftool) and every id is the same."""
    web = alab.services.add("web", 80, ["b1:8080", "b2:8080", "a2:8080"])
    alab.services.add("np", 80, ["b1:8080"], type="NodePort", algorithm="maglev")
    for i in range(20):
        alab.services.add(f"s{i}", 81, ["a1:8080"])
    before_maps, before = bpftool_lb(alab), {s.name: s for s in alab.services.list()}
    proc = alab.popen("a1", [sys.executable, "-c", _TRAFFIC, web.vip, "9"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)
        pid = agent_pid(alab)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: process_start_time(pid) is None, what="the agent to die")
        wait_for(lambda: not answers(alab), what="its socket to refuse connections")
        time.sleep(5)
        r = subprocess.run(LABKIT + ["--lab", alab.name, "agent", "restart"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = json.loads(out)
    assert result["failed"] == 0, result["errors"]
    assert result["ok"] > 200 and result["long_sent"] > 60
    assert bpftool_lb(alab) == before_maps
    after = {s.name: s for s in alab.services.list()}
    assert {n: (s.ids, [b.id for b in s.backends]) for n, s in after.items()} == \
        {n: (s.ids, [b.id for b in s.backends]) for n, s in before.items()}
    assert agent_pid(alab) != pid
    status = alab.agent_status()
    assert status["status"] == "ok" and status["restored"]["services"] == 22
    alab.services.add_backend("web", "a1:8080")  # the new agent goes on from the same ids
    assert alab.services.get("web").id == web.id


def test_up_restarts_a_dead_agent(alab):
    """`labkit up` on a lab whose agent died starts a new agent and keeps the lab and its services."""
    from labkit import Lab

    alab.services.add("web", 80, ["b1:8080"])
    pid = agent_pid(alab)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: process_start_time(pid) is None, what="the agent to die")
    again = Lab.up(alab.name, config=alab.config)
    assert again.state.created == alab.state.created
    assert again.health() == []
    assert [s.name for s in again.services.list()] == ["web"] and agent_pid(again) != pid


_CLIENT = textwrap.dedent("""
    import sys
    from labkit.agent.client import RemoteServices
    class Lab: pass
    lab = Lab(); lab.name, lab.topology = sys.argv[1], None
    svcs, k = RemoteServices(lab), int(sys.argv[2])
    for i in range(40):
        svcs.add(f"c{k}-{i}", 80, ["b1:8080"])
    for i in range(0, 40, 2):
        svcs.remove(f"c{k}-{i}")
    svcs.add_backend(f"c{k}-1", "b2:8080")
""")


def test_concurrent_clients_end_with_the_union(alab):
    """Four processes adding and removing distinct services at once end with exactly the union of their results."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", _CLIENT, alab.name, str(k)], env=env, stderr=subprocess.PIPE,
                              text=True) for k in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    names = sorted(s.name for s in alab.services.list())
    assert names == sorted(f"c{k}-{i}" for k in range(4) for i in range(1, 40, 2))
    assert all([b.ref for b in alab.services.get(f"c{k}-1").backends] == ["b1:8080", "b2:8080"] for k in range(4))
    ids = [i for s in alab.services.list() for i in s.ids]
    assert len(ids) == len(set(ids))
    maps_as_reported(alab)


def test_bad_input_is_a_4xx_that_changes_nothing(alab):
    """Through the API a bad spec, an unknown name and a bad path are 400/404 with the Python API's own
    message, and the maps stay as they were; the socket is root's alone (0600)."""
    alab.services.add("web", 80, ["b1:8080"])
    before = bpftool_lb(alab)
    client = AgentClient(alab.name)
    with pytest.raises(ConfigError, match=r"service 'x': port 0 is out of range; expected 1-65535"):
        client.request("POST", "/v1/service", {"name": "x", "port": 0})
    with pytest.raises(ConfigError, match="198.19.0.10:80/TCP is already service 'web'"):
        client.request("POST", "/v1/apply", [{"name": "ok", "port": 80, "backends": ["a1:8080"]},
                                            {"name": "clash", "port": 80, "vip": "198.19.0.10"}])
    with pytest.raises(NotFoundError, match="service 'nope' not found"):
        client.request("DELETE", "/v1/service/nope")
    with pytest.raises(NotFoundError, match="no such resource"):
        client.request("GET", "/v2/whatever")
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket",
                        str(socket_path(alab.name)), "-X", "POST", "-d", "{not json", "http://agent/v1/service"],
                       capture_output=True, text=True)
    if r.returncode != 127:  # curl is there: the raw status
        assert r.stdout == "400"
    assert bpftool_lb(alab) == before and [s.name for s in alab.services.list()] == ["web"]
    mode = os.stat(socket_path(alab.name)).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_down_removes_the_agent_and_its_socket(_require_datapath):
    """`labkit down` stops the agent and removes its socket and log with the rest of the lab."""
    from labkit import Lab

    lab = Lab.up(tagged("dpagentdown"), config=DatapathConfig(routing="native", gc_timer=False))
    pid, path = agent_pid(lab), socket_path(lab.name)
    assert path.exists()
    lab.down()
    assert process_start_time(pid) is None and not path.exists()
