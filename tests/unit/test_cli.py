"""The ``labkit`` command line without a kernel: parsing, exit codes, output shapes.

Nothing here touches a real lab or a real labkitd: every :class:`labkit.client.Lab` entry point a command
uses (``attach``, ``up``, ``cleanup``, ``list``) is replaced with a fake through monkeypatch, and
``LABKIT_DOOR`` points at a socket in the test's own directory where nothing listens.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from labkit import __version__, cli
from labkit.client import Lab
from labkit.client.door import DoorClient
from labkit.config import CtTimeouts, DatapathConfig
from labkit.constants import Hook, Verdict
from labkit.errors import CleanupError, LabStateError, NotFoundError
from labkit.maps.ct import CtEntry, CtFlags, CtKey4, CtResult, CtRow, TupleFlags
from labkit.net.ledger import LabState
from labkit.net.topology import Topology
from labkit.observe.trace import EventLog, TraceEvent, TraceTuple


@pytest.fixture(autouse=True)
def _no_env_lab(monkeypatch, tmp_path):
    """Every test starts without LABKIT_LAB set, and with LABKIT_DOOR at a socket nothing listens on."""
    monkeypatch.delenv("LABKIT_LAB", raising=False)
    monkeypatch.setenv("LABKIT_DOOR", str(tmp_path / "labkitd.sock"))


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


# -- fakes ---------------------------------------------------------------------
class FakeClock:
    def __init__(self, now: int = 1000, offset: int = 0):
        self._now, self.offset = now, offset

    def now(self) -> int:
        return self._now

    def advance(self, seconds: int) -> int:
        self.offset += seconds
        self._now += seconds
        return self._now


def _rows() -> list[CtRow]:
    tcp = CtKey4.make("198.18.1.11", "198.18.2.11", 40000, 8080, 6, TupleFlags.OUT)
    icmp = CtKey4.make("198.18.1.11", "198.18.2.11", 0, 0, 1, TupleFlags.OUT | TupleFlags.RELATED)
    return [
        CtRow.of(tcp, CtEntry(lifetime=1100, flags=CtFlags.SEEN_NON_SYN, packets=3, bytes=222), "cilium_ct4_global"),
        CtRow.of(icmp, CtEntry(lifetime=990, packets=1, bytes=98), "cilium_ct_any4_global"),
    ]


class FakeEventLog:
    """What ``lab.events()`` gives (labkit.client.lab.RemoteEventLog), over a real events file: ``last`` the last
    n flows in time order, ``read`` what came since; ``up`` False once the lab is gone."""

    def __init__(self, path, topology):
        nodes = {n.node_id: n.name for n in topology.nodes}
        self.log = EventLog(path, nodes, {"node-a": {6: "lxc-a1"}, "node-b": {6: "lxc-b1"}})
        self.up = True

    def last(self, n: int, node=None) -> list:
        self.log.offset = 0
        flows = sorted((f for f in self.log.read() if node is None or f.node == node), key=lambda f: f.event.ts_ns)
        return flows[-n:] if n else []

    def read(self, node=None) -> list:
        return [f for f in self.log.read() if node is None or f.node == node]


class FakeProc:
    """What ``lab.popen`` gives: ``wait`` returns the codes (or raises the exceptions) given, in turn."""

    def __init__(self, *waits):
        self.waits = list(waits)
        self.signals: list[int] = []

    def wait(self):
        got = self.waits.pop(0)
        if isinstance(got, BaseException):
            raise got
        return got

    def send_signal(self, sig) -> None:
        self.signals.append(sig)


class FakeLab:
    """Just enough of labkit.client.Lab for the commands; records what was asked of it."""

    def __init__(self, name: str = "demo", events_path=None):
        self.name = self.key = name
        self.owner = 0
        self.topology = Topology.default(name)
        self.config = DatapathConfig()
        self.clock = FakeClock()
        self.state = LabState(name, self.topology.to_dict(), self.config.to_dict(), pin_dirs={}, created=0.0)
        self._events_path = events_path
        self.ct_nodes: list[str] = []
        self.procs: list[FakeProc] = [FakeProc(0)]
        self.started: list[tuple] = []
        self.downed = False

    def ct(self, node: str) -> list[CtRow]:
        self.topology.node(node)
        self.ct_nodes.append(node)
        return _rows()

    def ct_command(self, node: str) -> list[str]:
        return [f"bpftool map dump pinned /sys/fs/bpf/labkit/{self.key}/{node}/{m}"
                for m in ("cilium_ct4_global", "cilium_ct_any4_global")]

    def events(self) -> FakeEventLog:
        if not hasattr(self, "_log"):
            self._log = FakeEventLog(self._events_path, self.topology)
        return self._log

    def popen(self, name, argv, stdin=None, stdout=None, stderr=None):
        self.topology.kind_of(name)
        self.started.append((name, list(argv), stdin, stdout, stderr))
        return self.procs.pop(0)

    def bpftool(self, *args, node=None):
        import subprocess

        self.started.append(("bpftool", list(args), node))
        return subprocess.CompletedProcess(["bpftool", *args], 0, "bpftool says\n", "")

    def down(self) -> None:
        self.downed = True

    def agent_logs(self, tail: int = 0) -> dict:
        lines = [f"line {i}" for i in range(10)]
        return {"lines": lines[-tail:] if tail else lines, "path": f"/run/labkit/{self.key}/agent.log"}

    def status(self) -> dict:
        t = self.topology
        return {
            "lab": self.name, "status": "up", "routing": "tunnel", "datapath": self.config.to_dict(),
            "clock": {"now": 1000, "offset": 0, "mono": 1000}, "faults": [],
            "nodes": [{"name": n.name, "ip": n.ip, "pod_cidr": n.pod_cidr, "router_ip": n.router_ip,
                       "netns": t.netns(n.name), "pins": "/x"} for n in t.nodes],
            "pods": [{"name": p.name, "node": p.node, "ip": p.ip, "identity": p.identity,
                      "netns": t.netns(p.name), "host_veth": t.host_veth(p.name)} for p in t.pods],
            "externals": [{"name": e.name, "ip": e.ip, "netns": t.netns(e.name)} for e in t.externals],
            "lab_differences": ["a difference"], "health": [],
        }


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """labkit.client.Lab.attach returns a FakeLab (and remembers which lab was asked for)."""
    lab = FakeLab(events_path=tmp_path / "events.bin")
    asked = []

    def attach(name="demo", door=None):
        asked.append(name)
        lab.name = name
        return lab

    monkeypatch.setattr(Lab, "attach", staticmethod(attach))
    lab.asked = asked
    return lab


@pytest.fixture
def door_up(monkeypatch):
    """A labkitd that answers ``hello`` (the only request a faked command still makes itself)."""
    def call(self, verb, lab=None, **kw):
        assert verb == "hello", f"unexpected request {verb!r} to the fake labkitd"
        return {"version": 1, "uid": 0, "user": "root", "instructor": True, "limits": {}}

    monkeypatch.setattr(DoorClient, "call", call)


def _event(ts: int, node_id: int, hook: Hook = Hook.FROM_CONTAINER) -> bytes:
    tup = TraceTuple(saddr=0x0B0112C6, daddr=0x0B0212C6, proto=1, icmp_type=8)
    return bytes(TraceEvent(ts_ns=ts, ifindex=6, len=98, node_id=node_id, hook=hook, verdict=Verdict.FORWARDED,
                            ct_result=CtResult.NONE, before=tup, after=tup))


# -- parsing -------------------------------------------------------------------
def test_default_lab_is_demo():
    """Without --lab or LABKIT_LAB the lab is 'demo'."""
    assert parse("status").lab == "demo"


def test_env_sets_default_lab(monkeypatch):
    """LABKIT_LAB replaces the default lab; --lab still wins over it."""
    monkeypatch.setenv("LABKIT_LAB", "envlab")
    assert parse("status").lab == "envlab"
    assert parse("--lab", "other", "status").lab == "other"


def test_bad_lab_name_is_usage_error(capsys):
    """A lab name the topology would reject is refused at parse time with exit 2."""
    assert cli.main(["--lab", "Bad_Name", "status"]) == 2
    assert "lab name" in capsys.readouterr().err


def test_lab_key_is_a_lab_name():
    """--lab takes a lab's key too (demo_u1000, for instructors; labkitd decides), and no other form."""
    assert parse("--lab", "demo_u1000", "status").lab == "demo_u1000"
    for bad in ("demo_u0", "demo_x1000", "demo_u", "_u1000", "demo.u1000"):
        with pytest.raises(SystemExit):
            parse("--lab", bad, "status")


def test_version(capsys):
    """--version prints 'labkit <version>' and exits 0."""
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"labkit {__version__}"


def test_no_command_is_usage_error(capsys):
    """labkit without a command is a usage error (exit 2)."""
    assert cli.main([]) == 2
    assert "usage:" in capsys.readouterr().err


def test_every_command_has_help():
    """Every subcommand (and ct/clock subcommand) carries a help string."""
    import argparse

    parser = cli.build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in actions:
        for choice in action._choices_actions:
            assert choice.help, choice.dest
        for sub in action.choices.values():
            for nested in (a for a in sub._actions if isinstance(a, argparse._SubParsersAction)):
                for choice in nested._choices_actions:
                    assert choice.help, choice.dest


def test_parse_up_options():
    """up takes --routing and repeatable --ct-timeout NAME=SECONDS."""
    args = parse("--lab", "x", "up", "--routing", "native", "--ct-timeout", "syn=5", "--ct-timeout", "any=30")
    assert (args.command, args.lab, args.routing) == ("up", "x", "native")
    assert args.ct_timeout == [("syn", 5), ("any", 30)]
    assert parse("up").routing is None and parse("up").ct_timeout == []


@pytest.mark.parametrize("bad", ["bogus=5", "syn=abc", "syn", "syn=0", "=5"])
def test_bad_ct_timeout_is_usage_error(bad, capsys):
    """A --ct-timeout with an unknown name or a non-positive/non-integer value exits 2, naming the names."""
    assert cli.main(["up", "--ct-timeout", bad]) == 2
    err = capsys.readouterr().err
    assert "--ct-timeout" in err and bad in err


def test_bad_routing_is_usage_error(capsys):
    """--routing accepts only tunnel and native."""
    assert cli.main(["up", "--routing", "bgp"]) == 2
    assert "tunnel" in capsys.readouterr().err


def test_ct_timeout_names_are_the_config_fields():
    """Every CtTimeouts field is accepted by --ct-timeout."""
    from dataclasses import fields

    for f in fields(CtTimeouts):
        assert parse("up", "--ct-timeout", f"{f.name}=7").ct_timeout == [(f.name, 7)]


def test_parse_down_cleanup_status_doctor():
    """down, cleanup, status [--json] and doctor [--json] parse."""
    assert parse("down").command == "down"
    assert parse("cleanup").command == "cleanup"
    assert parse("status").json is False and parse("status", "--json").json is True
    assert parse("doctor", "--json").json is True


def test_parse_exec():
    """exec NAME -- CMD… keeps the command's own options and later '--'."""
    args = parse("exec", "a1", "--", "ping", "-c", "1", "--", "x")
    assert (args.name, args.cmd) == ("a1", ["ping", "-c", "1", "--", "x"])


@pytest.mark.parametrize("argv", [["exec", "a1"], ["exec", "a1", "--"]])
def test_exec_without_command_is_usage_error(argv, capsys):
    """exec without a command after -- exits 2 with a message saying so."""
    assert cli.main(argv) == 2
    assert "a command is needed after '--'" in capsys.readouterr().err


def test_parse_ct_list():
    """ct list NODE takes -d, --json and --show-command."""
    args = parse("ct", "list", "node-a", "-d", "--json", "--show-command")
    assert (args.node, args.remaining, args.json, args.show_command) == ("node-a", True, True, True)
    assert parse("ct", "list", "node-b").remaining is False


def test_ct_without_subcommand_is_usage_error():
    """ct and clock need their subcommand."""
    assert cli.main(["ct"]) == 2
    assert cli.main(["clock"]) == 2


def test_parse_trace():
    """trace takes --follow, --json, --node and --last N (N >= 0)."""
    args = parse("trace", "--follow", "--json", "--node", "node-b", "--last", "7")
    assert (args.follow, args.json, args.node, args.last) == (True, True, "node-b", 7)
    assert parse("trace").last is None
    assert cli.main(["trace", "--last", "-1"]) == 2


def test_parse_clock():
    """clock advance SECONDS takes an int; clock show takes --json; 'abc' is a usage error."""
    assert parse("clock", "advance", "100").seconds == 100
    assert parse("clock", "show", "--json").json is True
    assert cli.main(["clock", "advance", "abc"]) == 2


def test_parse_daemon():
    """daemon run|start|stop|status parse, each with --socket; run takes --quiet, status --json."""
    args = parse("daemon", "run", "--quiet", "--socket", "/tmp/x.sock")
    assert (args.command, args.daemon_command, args.quiet, args.socket) == ("daemon", "run", True, "/tmp/x.sock")
    assert parse("daemon", "start").daemon_command == "start" and parse("daemon", "stop").socket is None
    assert parse("daemon", "status", "--json").json is True
    assert cli.main(["daemon"]) == 2
    assert cli.main(["daemon", "restart"]) == 2


# -- errors --------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["status"], ["ct", "list", "node-a"], ["nat", "list", "node-a"], ["up"], ["down"],
                                  ["cleanup"], ["list"], ["exec", "a1", "--", "true"], ["service", "list"],
                                  ["trace"], ["clock", "show"], ["agent", "logs"]])
def test_no_labkitd_is_one_line(argv, tmp_path, capsys):
    """With no labkitd on $LABKIT_DOOR every lab command prints exactly one line, the DoorDownError saying where it
    knocked and how to start labkitd, and exits 1."""
    sock = tmp_path / "labkitd.sock"
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"labkit: error: no labkitd answers on {sock} (No such file or directory): "
                                   f"start it with ")
    assert "sudo labkit daemon start" in captured.err


def test_labkit_error_prints_and_returns_1(monkeypatch, capsys):
    """A LabkitError inside a command becomes 'labkit: error: …' on stderr and exit 1."""
    def attach(name="demo", door=None):
        raise NotFoundError(f"lab '{name}' is not up; start it with `labkit --lab {name} up`")

    monkeypatch.setattr(Lab, "attach", staticmethod(attach))
    assert cli.main(["--lab", "x", "status"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("labkit: error: lab 'x' is not up")
    assert captured.out == ""


def test_unreadable_answer_is_an_error(monkeypatch, capsys):
    """A description of the lab the client cannot read is reported (exit 1) with the cleanup hint, not a traceback."""
    def attach(name="demo", door=None):
        return json.loads("{broken")

    monkeypatch.setattr(Lab, "attach", staticmethod(attach))
    assert cli.main(["ct", "list", "node-a"]) == 1
    assert "cleanup" in capsys.readouterr().err


def test_negative_clock_advance_is_error(fake, capsys):
    """clock advance -5 is refused (exit 1) before labkitd is asked; the clock stays."""
    assert cli.main(["clock", "advance", "-5"]) == 1
    assert capsys.readouterr().err.startswith("labkit: error: clock advance: expected whole seconds >= 0, got -5")
    assert fake.clock.offset == 0 and fake.asked == []


def test_unknown_node_lists_nodes(fake, capsys):
    """ct list of an unknown node fails with the node names."""
    assert cli.main(["ct", "list", "node-z"]) == 1
    assert "node-a, node-b" in capsys.readouterr().err


# -- commands against a fake lab --------------------------------------------------
def test_up_passes_options(monkeypatch, door_up, capsys):
    """up asks labkitd for the lab with the options given as DatapathConfig field names (only those given) and
    prints nodes, pods and next commands."""
    seen = {}

    def up(name="demo", *, labels=None, door=None, **options):
        seen.update(name=name, labels=labels, options=options)
        return FakeLab(name)

    monkeypatch.setattr(Lab, "up", staticmethod(up))
    assert cli.main(["--lab", "uplab", "up", "--routing", "native", "--ct-timeout", "syn=5",
                     "--ct-accounting", "on"]) == 0
    assert seen == {"name": "uplab", "labels": None,
                    "options": {"routing": "native", "timeouts": {"syn": 5}, "ct_accounting": True}}
    out = capsys.readouterr().out
    assert out.startswith("bringing up lab uplab (native routing) ...")
    assert "node-a" in out and "198.18.1.0/24" in out and "198.18.2.11" in out
    assert "labkit --lab uplab exec a1 -- ping -c1 198.18.2.11" in out
    assert "labkit --lab uplab ct list node-a" in out


def test_up_bad_combination_refused_before_labkitd(monkeypatch, capsys):
    """A combination DatapathConfig refuses (XDP acceleration with tunnel routing) is an error before any request."""
    monkeypatch.setattr(Lab, "up", staticmethod(lambda *a, **kw: pytest.fail("labkitd asked")))
    assert cli.main(["up", "--nodeport-accel", "xdp"]) == 1
    assert "no labkitd" not in capsys.readouterr().err


def test_down_takes_the_lab_down(fake, capsys):
    """down attaches to the lab and asks labkitd to take it down, then says nothing of it is left."""
    assert cli.main(["--lab", "gone", "down"]) == 0
    assert fake.downed and fake.asked == ["gone"]
    assert capsys.readouterr().out == "lab gone: taken down by labkitd; nothing of it is left\n"


def test_down_of_a_lab_not_up(monkeypatch, capsys):
    """down of a lab that is not up says so and exits 0; a lab labkitd cannot open points at cleanup (exit 1)."""
    def attach(name="demo", door=None):
        raise NotFoundError(f"lab '{name}' is not up; start it with `labkit --lab {name} up`")

    monkeypatch.setattr(Lab, "attach", staticmethod(attach))
    assert cli.main(["--lab", "gone", "down"]) == 0
    assert capsys.readouterr().out == "lab gone is not up: nothing to take down\n"

    def broken(name="demo", door=None):
        raise LabStateError(f"lab '{name}': lab.json is unreadable")

    monkeypatch.setattr(Lab, "attach", staticmethod(broken))
    assert cli.main(["--lab", "gone", "down"]) == 1
    assert "`labkit --lab gone cleanup` removes what it recorded" in capsys.readouterr().err


def test_cleanup_reports_what_was_removed(monkeypatch, capsys):
    """cleanup asks labkitd to remove what the lab recorded and prints how many, then 'nothing of lab X is left'."""
    asked = []

    def cleanup(name, door=None):
        asked.append(name)
        return {"removed": 3 if name == "gone" else 0}

    monkeypatch.setattr(Lab, "cleanup", staticmethod(cleanup))
    assert cli.main(["--lab", "gone", "cleanup"]) == 0
    assert capsys.readouterr().out == "lab gone: removed 3 recorded objects\nnothing of lab gone is left\n"
    assert cli.main(["--lab", "other", "cleanup"]) == 0
    assert "nothing was recorded to remove" in capsys.readouterr().out
    assert asked == ["gone", "other"]


def test_cleanup_failure_is_error(monkeypatch, capsys):
    """cleanup reports a CleanupError (something left) with exit 1."""
    def cleanup(name, door=None):
        raise CleanupError(f"lab '{name}': still present after teardown: netns lk-{name}-a1")

    monkeypatch.setattr(Lab, "cleanup", staticmethod(cleanup))
    assert cli.main(["cleanup"]) == 1
    assert "still present" in capsys.readouterr().err


def test_status_human_and_json(fake, capsys):
    """status prints a table of members with addresses and netns; --json prints status() unchanged."""
    assert cli.main(["status"]) == 0
    out = capsys.readouterr().out
    for needle in ("routing", "tunnel", "faults", "none", "lk-demo-a1", "198.18.1.11", "a difference", "health: ok"):
        assert needle in out
    assert cli.main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == fake.status()


def test_status_xdp_row_reads_bpftool_through_labkitd(fake, monkeypatch, capsys):
    """With XDP acceleration the NodePort row names each node's program, read by labkitd's bpftool (no root here)."""
    import subprocess

    st = fake.status()
    st["datapath"]["nodeport_accel"] = "xdp"
    monkeypatch.setattr(fake, "status", lambda: st)
    answers = {"node-a": [{"xdp": [{"devname": "eth0", "ifindex": 2, "mode": "generic", "id": 41}], "tc": []}],
               "node-b": [{"xdp": [], "tc": []}]}
    monkeypatch.setattr(fake, "bpftool", lambda *args, node=None: subprocess.CompletedProcess(
        ["bpftool", *args], 0, json.dumps(answers[node]), ""))
    assert cli.main(["status"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("NodePort accel"))
    assert "node-a eth0 xdpgeneric id 41" in row and "node-b eth0 NOT attached" in row


def test_ct_list_prints_only_rows(fake, capsys):
    """ct list prints what cilium-dbg does: each map's lines (ending in a space), then a blank line after each
    map (fmt.Println of the map's dump); -d adds the remaining time."""
    tcp, icmp = _rows()
    assert cli.main(["ct", "list", "node-a"]) == 0
    assert capsys.readouterr().out == f"{tcp.line()}\n\n{icmp.line()}\n\n"
    assert tcp.line().endswith("BackendID=0 ")
    assert cli.main(["ct", "list", "node-a", "-d"]) == 0
    out = capsys.readouterr().out
    assert out == f"{tcp.line(1000)}\n\n{icmp.line(1000)}\n\n" and "(remaining: 100 sec(s))" in out


def test_ct_list_show_command(fake, capsys):
    """--show-command prints the bpftool commands as '# ' lines before the rows."""
    assert cli.main(["ct", "list", "node-a", "--show-command"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"# {c}" for c in fake.ct_command("node-a")]
    assert [line for line in lines[2:] if line] == [r.line() for r in _rows()]


def test_ct_list_json(fake, capsys):
    """ct list --json is a list of rows with remaining and expired always present."""
    assert cli.main(["ct", "list", "node-b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == [r.to_json(1000) for r in _rows()]
    assert data[0]["remaining"] == 100 and data[1]["expired"] is True
    assert fake.ct_nodes == ["node-b"]


def _labkitd_ok():
    from labkit.datapath.doctor import Check

    return Check("labkitd", True, "answers on /run/labkitd/labkitd.sock")


def test_doctor_exit_status(monkeypatch, capsys):
    """doctor (as root) exits 0 when every check passes and 1 otherwise; --json lists the checks, labkitd's first."""
    from labkit.cli import doctor as cli_doctor
    from labkit.datapath import doctor

    checks = [doctor.Check("kernel", True, "6.1"), doctor.Check("bpffs", False, "missing", "mount it")]
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "run_checks", lambda full=True: checks)
    monkeypatch.setattr(cli_doctor, "labkitd_check", _labkitd_ok)
    monkeypatch.setattr(cli_doctor, "running_lab", lambda name: None)  # no lab up: the machine only
    assert cli.main(["doctor"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert cli.main(["doctor", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == [_labkitd_ok().to_json()] + [c.to_json() for c in checks]
    monkeypatch.setattr(doctor, "run_checks", lambda full=True: checks[:1])
    assert cli.main(["doctor"]) == 0


def test_doctor_says_when_labkitd_is_down(monkeypatch, capsys):
    """doctor's labkitd check fails when nothing answers on $LABKIT_DOOR, with the commands that start it."""
    from labkit.cli import doctor as cli_doctor
    from labkit.datapath import doctor

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "run_checks", lambda full=True: [doctor.Check("kernel", True, "6.1")])
    monkeypatch.setattr(cli_doctor, "running_lab", lambda name: None)
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["FAIL", "labkitd"] and "no labkitd answers on" in out[0]
    assert "sudo labkit daemon start" in out[1]


def test_doctor_as_a_user_checks_what_it_can(monkeypatch, capsys):
    """As a user other than root doctor drops the privileges check and the compile probe (labkitd holds the
    privileges), looks at no lab's state, and says `sudo labkit doctor` checks the rest."""
    from labkit.cli import doctor as cli_doctor
    from labkit.datapath import doctor

    fulls = []

    def run_checks(full=True):
        fulls.append(full)
        return [doctor.Check("privileges", False, "euid 1000", "run as root"), doctor.Check("kernel", True, "6.1")]

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(doctor, "run_checks", run_checks)
    monkeypatch.setattr(cli_doctor, "labkitd_check", _labkitd_ok)
    monkeypatch.setattr(cli_doctor, "running_lab", lambda name: pytest.fail("a user's doctor read a lab's state"))
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "privileges" not in out.split("\n\n")[0] and "kernel" in out and fulls == [False]
    assert out.splitlines()[-1] == ("not checked as uid 1000: privileges, the compile-and-attach probe, the lab's "
                                    "services journal; `sudo labkit doctor` checks the rest")
    assert cli.main(["doctor", "--json"]) == 0
    captured = capsys.readouterr()
    assert [c["name"] for c in json.loads(captured.out)] == ["labkitd", "kernel"]
    assert "`sudo labkit doctor` checks the rest" in captured.err


def test_doctor_checks_a_running_labs_services_journal(monkeypatch, capsys):
    """As root with a lab up, doctor prints its services journal's problems and verdict, and exits 1 if it is
    damaged."""
    from labkit.cli import doctor as cli_doctor
    from labkit.datapath import doctor

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(doctor, "run_checks", lambda full=True: [doctor.Check("kernel", True, "6.1")])
    monkeypatch.setattr(cli_doctor, "labkitd_check", _labkitd_ok)

    class Up:
        name = "demo"

    verdict = {"lines": cli_doctor.journal_lines("demo", ["services.journal line 3: expected a JSON record"], True),
               "ok": False}
    monkeypatch.setattr(cli_doctor, "running_lab", lambda name: Up() if name == "demo" else None)
    monkeypatch.setattr(cli_doctor, "services_journal", lambda lab: (verdict["lines"], verdict["ok"]))
    assert cli.main(["--lab", "demo", "doctor"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == ["lab demo:", "  - services.journal line 3: expected a JSON record",
                        "services journal: damaged: run `labkit --lab demo agent restart` to rebuild it from the maps"]
    assert cli.main(["--lab", "demo", "doctor", "--json"]) == 1
    last = json.loads(capsys.readouterr().out)[-1]
    assert (last["name"], last["ok"], last["problems"]) == ("services journal", False,
                                                            ["services.journal line 3: expected a JSON record"])
    verdict.update(lines=cli_doctor.journal_lines("demo", [], False), ok=True)
    assert cli.main(["--lab", "demo", "doctor"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "services journal: ok"
    assert cli.main(["--lab", "other", "doctor"]) == 0  # no lab 'other' up: no journal section
    assert "services journal" not in capsys.readouterr().out


def test_exec_has_labkitd_start_the_command(fake, capsys):
    """exec asks labkitd to start the command in the member (its stdio this process's own) and passes its exit
    status through."""
    fake.procs = [FakeProc(0), FakeProc(7)]
    assert cli.main(["exec", "a1", "--", "ping", "-c1", "198.18.2.11"]) == 0
    assert fake.started == [("a1", ["ping", "-c1", "198.18.2.11"], None, None, None)]
    assert cli.main(["exec", "node-b", "--", "sh", "-c", "exit 7"]) == 7
    assert fake.started[1][:2] == ("node-b", ["sh", "-c", "exit 7"])


def test_exec_missing_command_is_127(fake, capsys):
    """exec of a command that does not exist returns the sandbox's 127 (it prints the error on our stderr)."""
    fake.procs = [FakeProc(127)]
    assert cli.main(["exec", "a1", "--", "no-such-command"]) == 127


def test_exec_death_by_signal_is_128_plus(fake):
    """A command killed before it could report (returncode -9) exits 137, as a shell says it."""
    fake.procs = [FakeProc(-signal.SIGKILL)]
    assert cli.main(["exec", "a1", "--", "sleep", "9"]) == 137


def test_exec_passes_ctrl_c_on(fake):
    """Ctrl-C while exec waits is sent on to the command (it is not in this terminal's process group); exec then
    waits for it and exits with its status."""
    proc = FakeProc(KeyboardInterrupt(), 130)
    fake.procs = [proc]
    assert cli.main(["exec", "a1", "--", "ping", "198.18.2.11"]) == 130
    assert proc.signals == [signal.SIGINT]


def test_exec_bpftool_goes_to_labkitd(fake, capsys):
    """exec NODE -- bpftool ... is labkitd's read-only bpftool on the lab's own objects (bpf(2) is root's)."""
    assert cli.main(["exec", "node-a", "--", "bpftool", "net", "show"]) == 0
    assert fake.started == [("bpftool", ["net", "show"], "node-a")]
    assert capsys.readouterr().out == "bpftool says\n"


def test_exec_unknown_name_lists_names(fake, capsys):
    """exec of a name that is not in the lab fails with exit 1 and lists the names."""
    assert cli.main(["exec", "zz", "--", "true"]) == 1
    assert "a1, a2, b1, b2" in capsys.readouterr().err
    assert fake.started == []


def test_trace_last_sorted_filtered(fake, capsys):
    """trace prints the last N flows by ts_ns, filtered by --node; --json gives JSON lines."""
    fake._events_path.write_bytes(b"".join(_event(ts, node) for ts, node in [(30, 1), (10, 2), (20, 1), (40, 2)]))
    assert cli.main(["trace", "--last", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert cli.main(["trace", "--json", "--node", "node-a"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["ts_ns"] for r in records] == [20, 30]
    assert all(r["node"] == "node-a" and r["hook"] == "from-container" for r in records)
    assert cli.main(["trace", "--json", "--last", "2"]) == 0
    assert [json.loads(line)["ts_ns"] for line in capsys.readouterr().out.splitlines()] == [30, 40]


def test_trace_unknown_node(fake, capsys):
    """trace --node of an unknown node fails with the node names."""
    assert cli.main(["trace", "--node", "node-z"]) == 1
    assert "node-a, node-b" in capsys.readouterr().err


def test_trace_follow_prints_new_flows_until_ctrl_c(fake, monkeypatch, capsys):
    """trace --follow prints only flows written after it started, polling every common.POLL s, then stops cleanly
    on Ctrl-C."""
    path = fake._events_path
    path.write_bytes(_event(5, 1))
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 1:
            with open(path, "ab") as f:
                f.write(_event(7, 1) + _event(6, 2))
            return
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", sleep)
    assert cli.main(["trace", "--follow", "--json"]) == 0
    assert [json.loads(line)["ts_ns"] for line in capsys.readouterr().out.splitlines()] == [6, 7]
    assert sleeps[0] == pytest.approx(0.05)


def test_trace_follow_stops_when_the_lab_goes_down(fake, monkeypatch, capsys):
    """trace --follow ends with one error line (exit 1) once labkitd says the lab's log is gone."""
    fake._events_path.write_bytes(b"")
    log = fake.events()

    def sleep(seconds):
        log.up = False

    monkeypatch.setattr(time, "sleep", sleep)
    assert cli.main(["trace", "--follow"]) == 1
    assert capsys.readouterr().err == "labkit: error: lab 'demo' went down while following its trace\n"


def _hubble(pod: str, dst: str, verdict: str = "FORWARDED") -> dict:
    return {"flow": {"verdict": verdict, "node_name": "node-a",
                     "source": {"namespace": "default", "pod_name": pod},
                     "destination": {"namespace": "default", "pod_name": dst}}}


def test_observe_filters_here_and_follows_by_seq(fake, monkeypatch, capsys):
    """observe reads the Hubble ring through labkitd (lab.hubble), filters it here, prints the last N; --follow
    asks again from the seq labkitd answered."""
    ring = [_hubble("a1", "b1"), _hubble("b1", "a1"), _hubble("a2", "b1", "DROPPED"), _hubble("a1", "b2")]
    asked = []

    def hubble(seq=None):
        asked.append(seq)
        if seq is None:
            return {"responses": ring, "seq": 4, "capacity": 4095}
        if seq == 4:
            return {"responses": [_hubble("a1", "b1", "DROPPED")], "seq": 5, "capacity": 4095}
        raise KeyboardInterrupt

    fake.hubble = hubble
    assert cli.main(["observe", "-o", "json", "--from-pod", "a1", "--last", "1"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [ring[3]]
    monkeypatch.setattr(time, "sleep", lambda s: None)
    assert cli.main(["observe", "-o", "json", "--verdict", "DROPPED", "--follow"]) == 0
    assert [json.loads(line)["flow"]["source"]["pod_name"] for line in capsys.readouterr().out.splitlines()] == ["a1"]
    assert asked == [None, None, 4, 5]


def test_agent_logs(fake, capsys):
    """agent logs prints the last N lines labkitd read of the agent's log, then the log's path."""
    assert cli.main(["agent", "logs", "--tail", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["line 8", "line 9", "# /run/labkit/demo/agent.log"]


def test_clock_advance_and_show(fake, capsys):
    """clock advance prints the new now and offset; clock show --json has now, offset and mono."""
    assert cli.main(["clock", "advance", "100"]) == 0
    assert capsys.readouterr().out.strip() == "lab clock now 1100 (offset 100 s)"


def test_clock_show_json(fake, monkeypatch, capsys):
    """clock show --json prints now = mono + offset."""
    monkeypatch.setattr("labkit.clock.mono_seconds", lambda: 500)
    fake.clock.offset = 25
    assert cli.main(["clock", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"now": 525, "offset": 25, "mono": 500}
    assert cli.main(["clock", "show"]) == 0
    assert capsys.readouterr().out.strip() == "lab clock now 525 (offset 25 s)"


def test_lab_option_reaches_attach(fake):
    """--lab names the lab every command attaches to, a key as it is."""
    cli.main(["--lab", "mylab", "ct", "list", "node-a"])
    cli.main(["--lab", "demo_u1000", "ct", "list", "node-a"])
    assert fake.asked == ["mylab", "demo_u1000"]


def _listed(name, key, owner_uid, **kw) -> dict:
    return {"name": name, "key": key, "owner_uid": owner_uid, "base": key, "variant": None, "status": "up",
            "created": time.time() - 185, "owner_pid": 42, "owner_alive": True,
            "holds": {"netns": 8, "process": 5, "pin": 34}, "running": 5, "orphaned": False, "age": "3 min", **kw}


def test_list_table_has_an_owner_column(monkeypatch, capsys):
    """list prints every lab labkitd lets you see with its OWNER (the user's name, else the uid); a variant of a
    user's lab is named by its key's name (demo-snat_u1000 is a variant of demo)."""
    import pwd

    monkeypatch.setattr(pwd, "getpwuid", lambda uid: {0: pwd.struct_passwd(("root", "x", 0, 0, "", "/root", "/bin/sh")),
                                                      1000: pwd.struct_passwd(("ada", "x", 1000, 1000, "", "/home/ada",
                                                                               "/bin/sh"))}[uid])
    labs = [_listed("demo", "demo", 0), _listed("demo_u1000", "demo_u1000", 1000),
            _listed("demo-snat_u1000", "demo-snat_u1000", 1000, owner_alive=False),
            _listed("x_u4242", "x_u4242", 4242)]
    monkeypatch.setattr(Lab, "list", staticmethod(lambda door=None: labs))
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["LAB", "VARIANT", "OF", "STATUS", "AGE", "OWNER", "STARTED", "BY", "HOLDS"]
    rows = {line.split()[0]: line.split() for line in lines[1:5]}  # LAB VARIANT-OF STATUS AGE(2 words) OWNER ...
    assert rows["demo"][5] == "root" and rows["demo_u1000"][5] == "ada" and rows["x_u4242"][5] == "4242"
    assert rows["demo-snat_u1000"][1:3] == ["demo_u1000", "orphaned"] and rows["demo-snat_u1000"][5] == "ada"
    assert "labkit --lab demo-snat_u1000 down" in " ".join(lines[5:])
    assert cli.main(["list", "--json"]) == 0
    got = {d["key"]: d for d in json.loads(capsys.readouterr().out)}
    assert got["demo-snat_u1000"]["owner"] == "ada" and got["demo-snat_u1000"]["variant"] == "snat"


def test_list_of_nothing(monkeypatch, capsys):
    """list with no lab to show says how to start one."""
    monkeypatch.setattr(Lab, "list", staticmethod(lambda door=None: []))
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().out == "no labs of yours on this machine (`labkit up` starts one)\n"


# -- daemon ------------------------------------------------------------------------
@pytest.mark.parametrize("action", ["run", "start"])
def test_daemon_run_and_start_need_root(action, monkeypatch, capsys):
    """daemon run and start as another user than root say in one line that they need root (exit 1)."""
    from labkit.door import daemon

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(daemon, action, lambda *a, **kw: pytest.fail(f"daemon.{action} called"))
    assert cli.main(["daemon", action]) == 1
    err = capsys.readouterr().err
    assert err == (f"labkit: error: `labkit daemon {action}` needs root (labkitd builds namespaces and loads BPF): "
                   f"run `sudo labkit daemon {action}`\n")


def test_daemon_status(tmp_path, monkeypatch, capsys):
    """daemon status says where nothing answers (exit 1), or what labkitd answered (exit 0)."""
    from labkit.door import daemon

    assert cli.main(["daemon", "status"]) == 1
    assert capsys.readouterr().out.startswith(f"no labkitd answers on {tmp_path / 'labkitd.sock'}; start it with")
    monkeypatch.setattr(daemon, "status", lambda path: {"version": 1, "uid": 1000, "user": "ada", "instructor": False,
                                                        "limits": {"labs_per_user": 3}})
    assert cli.main(["daemon", "status", "--socket", "/tmp/other.sock"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "labkitd answers on /tmp/other.sock: protocol version 1, you are ada (uid 1000)", "limits: labs per user 3"]


def test_daemon_start_and_stop(monkeypatch, capsys):
    """daemon start (root) starts labkitd or says one runs; stop stops the one start started."""
    from labkit.door import daemon

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(daemon, "start", lambda path: (True, 4242))
    assert cli.main(["daemon", "start"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("labkitd started (pid 4242) on ")
    monkeypatch.setattr(daemon, "stop", lambda path: True)
    assert cli.main(["daemon", "stop"]) == 0
    assert capsys.readouterr().out == "labkitd stopped; the labs keep running\n"

    def refused(path):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(daemon, "stop", refused)
    assert cli.main(["daemon", "stop"]) == 1
    assert "needs root" in capsys.readouterr().err


# -- answers -----------------------------------------------------------------------
def _group(gid: int):
    import grp

    return grp.struct_group(("labkit-instructors", "x", gid, []))


def test_answers_refused_for_a_learner(monkeypatch, capsys):
    """answers as a user neither root nor in labkit-instructors is refused in one line, exit 1."""
    import grp

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    monkeypatch.setattr(os, "getgroups", lambda: [1000, 27])
    monkeypatch.setattr(grp, "getgrnam", lambda name: _group(4242))
    assert cli.main(["answers", "02"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "labkit: error: answers are for instructors (root or the group labkit-instructors)\n"
    assert captured.out == ""


def test_answers_for_an_instructor(monkeypatch, capsys):
    """answers as a member of labkit-instructors (not root) prints the key."""
    import grp

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "getegid", lambda: 1000)
    monkeypatch.setattr(os, "getgroups", lambda: [1000, 4242])
    monkeypatch.setattr(grp, "getgrnam", lambda name: _group(4242))
    assert cli.main(["answers", "02"]) == 0
    assert capsys.readouterr().out.startswith("Lab 02: answer key")


# -- work sync / export ------------------------------------------------------------
def test_work_sync_prints_what_arrived(tmp_path, capsys):
    """`labkit work sync` prints one line per lab it added, then a summary; a second run says nothing is new."""
    labs = tmp_path / "labs"
    labs.mkdir()
    (labs / "01-tour.ipynb").write_text("{}")
    work = tmp_path / "work"
    assert cli.main(["work", "sync", "--dir", str(work), "--labs", str(labs)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["  added 01-tour.ipynb", f"work folder {work}: 1 lab file(s) in {labs}; 1 change(s)"]
    assert cli.main(["work", "sync", "--dir", str(work), "--labs", str(labs)]) == 0
    assert capsys.readouterr().out.strip().endswith("nothing new")


def test_export_to_a_directory_lists_the_notebooks(tmp_path, capsys):
    """`labkit export --to DIR` writes the archive there and lists what it holds, with the host's recipe."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.ipynb").write_text("{}")
    assert cli.main(["export", "--dir", str(work), "--to", str(tmp_path / "out"), "--name", "ada"]) == 0
    out = capsys.readouterr().out.splitlines()
    [archive] = list((tmp_path / "out").glob("ada-labkit-work-*.tar.gz"))
    assert out[0] == f"exported 1 notebook(s) from {work} to {archive}"
    assert out[1] == "  ada/notes.ipynb"
    assert "vagrant ssh -c 'labkit export --to -' -- -T > my-work.tar.gz" in out[2]


def test_export_refuses_binary_to_a_terminal(tmp_path, monkeypatch, capsys):
    """`labkit export --to -` on a terminal is an error saying to redirect stdout, not bytes on the screen."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert cli.main(["export", "--dir", str(work), "--to", "-"]) == 1
    assert "send stdout to a file" in capsys.readouterr().err


# -- policy -------------------------------------------------------------------------------
def _policy_args(mode=None, audit=None):
    import argparse

    return argparse.Namespace(policy_mode=mode, policy_audit=audit)


def test_policy_flags_reach_a_config_that_has_them(monkeypatch):
    """--policy-mode/--policy-audit become the datapath options policy/policy_audit when DatapathConfig has them."""
    import dataclasses

    from labkit import config as config_module
    from labkit.cli.lab import policy_options

    @dataclasses.dataclass(frozen=True)
    class WithPolicy:
        policy: str = "default"
        policy_audit: bool = False

    monkeypatch.setattr(config_module, "DatapathConfig", WithPolicy)
    assert policy_options(_policy_args("always", True)) == {"policy": "always", "policy_audit": True}
    assert policy_options(_policy_args()) == {}


def test_policy_flags_refused_without_the_options(monkeypatch):
    """A DatapathConfig without policy options refuses --policy-mode (no silent no-op), and takes no flag at all."""
    import dataclasses

    from labkit import config as config_module
    from labkit.cli.common import CliError
    from labkit.cli.lab import policy_options

    @dataclasses.dataclass(frozen=True)
    class WithoutPolicy:
        routing: str = "tunnel"

    monkeypatch.setattr(config_module, "DatapathConfig", WithoutPolicy)
    assert policy_options(_policy_args()) == {}
    with pytest.raises(CliError, match="expected a datapath with the options policy, policy_audit"):
        policy_options(_policy_args("never", True))


def test_policy_mode_choices():
    """up --policy-mode takes Cilium's --policy-enforcement values only."""
    assert parse("up", "--policy-mode", "always").policy_mode == "always"
    assert cli.main(["up", "--policy-mode", "sometimes"]) == 2


def test_policy_get_prints_the_bpftool_command_first(fake, capsys):
    """`policy get POD` prints the bpftool command that dumps the pinned map, then the bpf policy get lines."""
    from labkit.agent.client import PolicyMapView

    path = "/sys/fs/bpf/labkit/demo/node-a/cilium_policy_00001"

    class Remote:
        def get(self, pod):
            return PolicyMapView(pod, path, ["row"], ["POLICY   DIRECTION", "Allow    Ingress"], [],
                                 {"endpoint_id": 1, "node": "node-a", "pinned": True})

    fake.policy = Remote()
    assert cli.main(["policy", "get", "a1"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"# bpftool map dump pinned {path}", "POLICY   DIRECTION",
                                                    "Allow    Ingress"]


def test_policy_get_numeric_decodes_labkitds_bpftool_dump(fake, monkeypatch, capsys):
    """`policy get POD -n` and `--json` read the map's rows through labkitd's bpftool and decode its raw bytes."""
    import subprocess

    from labkit.agent.client import PolicyMapView
    from labkit.maps.policy import Direction, PolicyEntry, PolicyKey

    path = "/sys/fs/bpf/labkit/demo/node-a/cilium_policy_00001"
    key = PolicyKey.make(258, Direction.INGRESS)
    dump = [{"key": [f"0x{b:02x}" for b in bytes(key)], "value": [f"0x{b:02x}" for b in bytes(PolicyEntry.allow(key))]}]

    class Remote:
        def get(self, pod):
            return PolicyMapView(pod, path, ["row"], ["labelled lines"], [], {"endpoint_id": 1, "node": "node-a",
                                                                               "pinned": True})

    fake.policy = Remote()
    asked = []

    def bpftool(*args, node=None):
        asked.append(args)
        return subprocess.CompletedProcess(["bpftool", *args], 0, json.dumps(dump), "")

    monkeypatch.setattr(fake, "bpftool", bpftool)
    assert cli.main(["policy", "get", "a1", "-n"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:3] == ["POLICY", "DIRECTION", "IDENTITY"] and out[2].split()[:3] == ["Allow", "Ingress", "258"]
    assert asked == [("-j", "map", "dump", "pinned", path)]
    assert cli.main(["policy", "get", "a1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["key"] == str(key)


def test_policy_get_without_map_says_allow_all(fake, capsys):
    """A pod with no pinned policy map is reported as such: no policy enforces on it, every packet allowed."""
    from labkit.agent.client import PolicyMapView

    class Remote:
        def get(self, pod):
            return PolicyMapView(pod, "/x/cilium_policy_00002", [], [], [], {"endpoint_id": 2, "node": "node-a",
                                                                              "pinned": False})

    fake.policy = Remote()
    assert cli.main(["policy", "get", "a2"]) == 0
    assert "no policy enforces on it" in capsys.readouterr().out


def test_up_labels_reach_labkitd(monkeypatch, door_up, capsys):
    """up --label POD:KEY=VALUE becomes up's labels, per pod (others keep app=<name>); without --label none are
    passed (labkitd's default)."""
    seen = []

    def up(name="demo", *, labels=None, door=None, **options):
        seen.append(labels)
        return FakeLab(name)

    monkeypatch.setattr(Lab, "up", staticmethod(up))
    assert cli.main(["--lab", "lbl", "up", "--label", "a2:app=a1", "--label", "a2:tier=db"]) == 0
    assert cli.main(["--lab", "lbl", "up"]) == 0
    assert seen == [{"a2": {"app": "a1", "tier": "db"}}, None]


def test_up_label_syntax(capsys):
    """A --label without POD: or =VALUE is a usage error (exit 2) showing the expected form."""
    assert cli.main(["up", "--label", "app=web"]) == 2
    assert "expected POD:KEY=VALUE" in capsys.readouterr().err
