"""labkit.client.lab: the notebook's Lab, each operation one request to labkitd (no labkitd: a stand-in door that
records the requests and gives canned answers)."""
from __future__ import annotations

import subprocess

import pytest

from labkit.client.lab import Lab, TcpConn
from labkit.config import DatapathConfig
from labkit.errors import NotFoundError
from labkit.net.ledger import LabState
from labkit.net.topology import Topology

PINS = {"node-a": "/sys/fs/bpf/labkit/demo_u1000/node-a", "node-b": "/sys/fs/bpf/labkit/demo_u1000/node-b"}


def _desc(topology: Topology | None = None, config: DatapathConfig | None = None) -> dict:
    topology = topology or Topology.default("demo_u1000")
    return {"name": "demo", "key": "demo_u1000", "owner": 1000, "topology": topology.to_dict(),
            "config": (config or DatapathConfig()).to_dict(),
            "state": LabState("demo_u1000", {}, {}, dict(PINS)).to_dict()}


class FakeDoor:
    """DoorClient's call(): records (verb, lab, fds, context, args) and answers from ``answers`` (a value, or a
    function of the arguments)."""

    def __init__(self, **answers):
        self.calls: list[tuple] = []
        self.answers = {"up": _desc(), "attach": _desc(), **answers}

    def call(self, verb, lab=None, *, fds=None, context=None, **args):
        self.calls.append((verb, lab, fds, context, args))
        got = self.answers.get(verb)
        return got(**args) if callable(got) else got

    def verbs(self) -> list[str]:
        return [c[0] for c in self.calls]


@pytest.fixture
def door():
    return FakeDoor()


@pytest.fixture
def lab(door):
    lab = Lab.up("demo", door=door)
    door.calls.clear()
    return lab


# -- up ------------------------------------------------------------------------------------------
def test_up_with_the_defaults_sends_no_options(door):
    """Lab.up('demo') asks labkitd for lab 'demo' with no options and no labels, and holds what it answered."""
    lab = Lab.up("demo", door=door)
    assert door.calls == [("up", "demo", None, None, {"options": {}, "labels": None})]
    assert (lab.name, lab.key, lab.owner) == ("demo", "demo_u1000", 1000)
    assert lab.topology == Topology.default("demo_u1000") and lab.config == DatapathConfig()


def test_up_sends_routing_and_keyword_options_as_given(door):
    """routing= and keyword options are sent as they are; labels are passed through."""
    labels = {"a2": {"app": "a1"}}
    Lab.up("demo", routing="native", socket_lb="full", labels=labels, door=door)
    assert door.calls[0][4] == {"options": {"socket_lb": "full", "routing": "native"}, "labels": labels}


def test_up_sends_only_how_a_given_config_differs_from_the_default(door):
    """A DatapathConfig is sent as its differences from the default config; keyword options and routing win."""
    config = DatapathConfig(routing="native", ct_tcp_size=4096, policy="always")
    Lab.up("demo", config=config, door=door)
    assert door.calls[-1][4]["options"] == {"routing": "native", "ct_tcp_size": 4096, "policy": "always"}
    Lab.up("demo", config=config, routing="tunnel", ct_tcp_size=8192, door=door)
    assert door.calls[-1][4]["options"] == {"routing": "tunnel", "ct_tcp_size": 8192, "policy": "always"}
    Lab.up("demo", config=DatapathConfig(), door=door)
    assert door.calls[-1][4]["options"] == {}


def test_attach_and_list_are_one_request_each(door):
    """attach() is the `attach` verb on the lab named; list() the `list` verb on no lab."""
    door.answers["list"] = [{"name": "demo"}]
    assert Lab.attach("demo", door=door).key == "demo_u1000"
    assert Lab.list(door=door) == [{"name": "demo"}]
    assert [(c[0], c[1]) for c in door.calls] == [("attach", "demo"), ("list", None)]


# -- members -------------------------------------------------------------------------------------
def test_an_unknown_member_is_refused_here_before_any_request(lab, door):
    """A pod, node or member that is not in the topology is a NotFoundError listing them, and nothing is sent."""
    with pytest.raises(NotFoundError, match=r"pod 'zz' not found in lab 'demo_u1000' \(pods: a1, a2, b1, b2\)"):
        lab.pod("zz")
    with pytest.raises(NotFoundError, match=r"node 'a1' not found .*\(nodes: node-a, node-b\)"):
        lab.node("a1")
    with pytest.raises(NotFoundError, match="'zz' is not a node, pod or external client"):
        lab.exec("zz", ["ip", "route"])
    with pytest.raises(NotFoundError):
        lab.popen("zz", ["true"])
    with pytest.raises(NotFoundError):
        lab.ct_command("node-c")
    assert door.calls == []


def test_member_handles_read_the_topology(lab):
    """A pod's address, node, labels and identity, a node's address and pin, a netns: all from the topology."""
    a1 = lab.pod("a1")
    assert (a1.ip, a1.node, a1.labels, a1.netns) == ("198.18.1.11", "node-a", {"app": "a1"}, "lk-demo_u1000-a1")
    assert lab.node("node-b").ip == "198.51.100.12"
    assert lab.node("node-b").pin("cilium_lxc") == f"{PINS['node-b']}/cilium_lxc"
    assert lab.external().ip == "198.51.100.100"
    assert lab.cgroup("ext") is None


def test_bpftool_goes_to_labkitd_with_the_member_as_node(lab, door):
    """exec of `bpftool ...` (a node's or a pod's) is the `bpftool` verb with the member as node, not a process."""
    door.answers["bpftool"] = lambda node, args: subprocess.CompletedProcess(["bpftool", *args], 0, "ok\n", "")
    done = lab.node("node-a").exec("bpftool", "net", "show")
    assert done.stdout == "ok\n"
    lab.exec("a1", ["bpftool", "cgroup", "show", "x"])
    assert [(c[0], c[4]) for c in door.calls] == [("bpftool", {"node": "node-a", "args": ["net", "show"]}),
                                                  ("bpftool", {"node": "a1", "args": ["cgroup", "show", "x"]})]


def test_bpftool_with_check_raises_on_a_non_zero_return(lab, door):
    """check=True raises CalledProcessError when bpftool returned non-zero; without check the result comes back."""
    door.answers["bpftool"] = lambda node, args: subprocess.CompletedProcess(["bpftool", *args], 255, "",
                                                                             "Error: bpf obj get failed\n")
    with pytest.raises(subprocess.CalledProcessError) as exc:
        lab.exec("node-a", ["bpftool", "map", "show"], check=True)
    assert exc.value.returncode == 255
    assert lab.exec("node-a", ["bpftool", "map", "show"]).returncode == 255


def test_the_commands_that_show_the_rows_name_the_labs_pins(lab):
    """ct_command and nat_command name bpftool dumps of the node's own pinned maps."""
    assert lab.ct_command("node-a") == [
        "bpftool map dump pinned /sys/fs/bpf/labkit/demo_u1000/node-a/cilium_ct4_global",
        "bpftool map dump pinned /sys/fs/bpf/labkit/demo_u1000/node-a/cilium_ct_any4_global"]
    assert lab.nat_command("node-b") == [
        "bpftool map dump pinned /sys/fs/bpf/labkit/demo_u1000/node-b/cilium_snat_v4_external"]
    assert lab.conntrack_command("node-a") == ["ip netns exec lk-demo_u1000-node-a conntrack -L",
                                               "ip netns exec lk-demo_u1000-node-a iptables-save -t nat"]


def test_requests_name_the_lab_as_its_owner_does_and_decode_into_it(lab, door):
    """Every request names the lab by its name (not its key) with the lab itself as the decoding context."""
    door.answers["ct"] = ["row"]
    assert lab.ct("node-a") == ["row"]
    assert door.calls == [("ct", "demo", None, {"lab": lab}, {"node": "node-a"})]


# -- the clock -----------------------------------------------------------------------------------
def test_the_clock_is_read_and_moved_by_labkitd(lab, door):
    """clock.now() is the `clock` verb's now; advance(s) sends whole seconds and returns the new now."""
    state = {"now": 100, "offset": 0}

    def clock(advance=None):
        if advance is not None:
            state["now"] += advance
            state["offset"] += advance
        return dict(state)

    door.answers["clock"] = clock
    assert lab.clock.now() == 100
    assert lab.clock.advance(61.9) == 161
    assert lab.clock.offset == 61 and repr(lab.clock) == "LabClock(now=161, offset=61)"
    assert [c[4] for c in door.calls[:2]] == [{}, {"advance": 61}]


# -- connections ---------------------------------------------------------------------------------
def _conn_state(state, **over):
    return {"id": 7, "pod": "a1", "target": "b1", "port": 8080, "sport": 40000, "src": "198.18.1.11",
            "dst": "198.18.2.11", "state": state, "loopback": False, "redirected": False, "outside": False, **over}


def test_a_connection_follows_labkitds_answers_and_keeps_its_steps(lab, door):
    """A TcpConn is created by `conn.new`; each op is `conn.step` with its id, and its state is what labkitd said."""
    states = {"open": "established", "send": "established", "close": "closed"}
    door.answers["conn.new"] = lambda **a: _conn_state("new")
    door.answers["conn.step"] = lambda id, op, data: {"conn": _conn_state(states[op]), "step": f"step:{op}:{data}"}
    conn = lab.pod("a1").tcp("b1")
    assert isinstance(conn, TcpConn) and (conn.id, conn.state, conn.src, conn.sport) == (7, "new", "198.18.1.11", 40000)
    assert conn.open() == "step:open:None" and conn.state == "established"
    conn.send(b"hi")
    conn.close()
    assert conn.state == "closed"
    assert conn.steps == ["step:open:None", "step:send:6869", "step:close:None"]
    new, *steps = door.calls
    assert new[0] == "conn.new" and new[4] == {"pod": "a1", "target": "b1", "port": 8080, "sport": None}
    assert [(c[0], c[3], c[4]["id"], c[4]["op"]) for c in steps] == [
        ("conn.step", {"lab": lab}, 7, "open"), ("conn.step", {"lab": lab}, 7, "send"),
        ("conn.step", {"lab": lab}, 7, "close")]


# -- live tables ---------------------------------------------------------------------------------
class _Table:
    def __init__(self, fail=False, closed=False):
        self.refreshed, self.fail, self.closed, self.stopped = 0, fail, closed, False

    def refresh(self):
        self.refreshed += 1
        if self.fail:
            raise RuntimeError("widget gone")

    def stop(self):
        self.stopped = True


def test_a_change_refreshes_the_watchers_past_one_that_fails(lab):
    """note_change() refreshes every open live table, a table that raises does not stop the others, a closed one
    is dropped."""
    bad, good, closed = _Table(fail=True), _Table(), _Table(closed=True)
    lab._watchers = [bad, good, closed]
    lab.note_change()
    assert (bad.refreshed, good.refreshed, closed.refreshed) == (1, 1, 0)
    assert lab._watchers == [bad, good]


def test_steps_flush_and_reset_refresh_the_watchers(lab, door):
    """A step, a CT flush and a reset each refresh the live tables."""
    table = _Table()
    lab._watchers = [table]
    door.answers["step.ping"] = "a step"
    door.answers["flush_ct"] = 3
    assert lab.pod("a1").ping("b1") == "a step"
    assert lab.flush_ct() == 3
    lab.reset()
    assert table.refreshed == 3
    assert door.calls[0][4] == {"pod": "a1", "target": "b1", "count": 1}


def test_down_stops_the_live_tables(lab, door):
    """down() stops every live table, then asks labkitd to take the lab down."""
    table = _Table()
    lab._watchers = [table]
    lab.down()
    assert table.stopped and door.verbs() == ["down"]


def test_deleting_a_pod_reloads_the_topology(lab, door):
    """delete_pod() is the `delete_pod` verb, then the topology labkitd describes: the pod is gone here too."""
    door.answers["delete_pod"] = {"pod": "b2"}
    door.answers["attach"] = _desc(Topology.default("demo_u1000").without_pod("b2"))
    table = _Table()
    lab._watchers = [table]
    assert lab.delete_pod("b2") == {"pod": "b2"}
    assert door.verbs() == ["delete_pod", "attach"] and door.calls[0][4] == {"pod": "b2"}
    assert [p.name for p in lab.topology.pods] == ["a1", "a2", "b1"]
    with pytest.raises(NotFoundError):
        lab.pod("b2")
    assert table.refreshed == 1

