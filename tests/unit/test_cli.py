"""The ``labkit`` command line without a kernel: parsing, exit codes, output shapes.

Nothing here touches a real lab: every ``Lab`` entry point a command uses is
replaced with a fake through monkeypatch.
"""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from labkit import __version__, cli
from labkit.config import CtTimeouts, DatapathConfig
from labkit.constants import Hook, Verdict
from labkit.errors import CleanupError, NotFoundError
from labkit.lab import Lab
from labkit.maps.ct import CtEntry, CtFlags, CtKey4, CtResult, CtRow, TupleFlags
from labkit.net.ledger import LabState
from labkit.net.topology import Topology
from labkit.observe.trace import EventLog, TraceEvent, TraceTuple


@pytest.fixture(autouse=True)
def _no_env_lab(monkeypatch):
    """Every test starts without LABKIT_LAB set."""
    monkeypatch.delenv("LABKIT_LAB", raising=False)


def parse(*argv: str):
    return cli.build_parser().parse_args(list(argv))


# -- fakes ---------------------------------------------------------------------
class FakeClock:
    def __init__(self, now: int = 1000, offset: int = 0):
        self._now, self.offset = now, offset

    def now(self) -> int:
        return self._now

    def advance(self, seconds: int) -> int:
        if not isinstance(seconds, int) or seconds < 0:
            raise ValueError(f"clock advance: expected whole seconds >= 0, got {seconds!r}")
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


class FakeLab:
    """Just enough of Lab for the commands; records what was asked of it."""

    def __init__(self, name: str = "demo", events_path=None):
        self.name = name
        self.topology = Topology.default(name)
        self.config = DatapathConfig()
        self.clock = FakeClock()
        self.state = LabState(name, self.topology.to_dict(), self.config.to_dict(), pin_dirs={}, created=0.0)
        self._events_path = events_path
        self.ct_nodes: list[str] = []

    def ct(self, node: str) -> list[CtRow]:
        self.topology.node(node)
        self.ct_nodes.append(node)
        return _rows()

    def ct_command(self, node: str) -> list[str]:
        return [f"bpftool map dump pinned /sys/fs/bpf/labkit/{self.name}/{node}/{m}"
                for m in ("cilium_ct4_global", "cilium_ct_any4_global")]

    def cgroup(self, pod: str):
        self.topology.pod(pod)
        return f"/sys/fs/cgroup/labkit/{self.name}/{pod}"

    def events(self) -> EventLog:
        nodes = {n.node_id: n.name for n in self.topology.nodes}
        return EventLog(self._events_path, nodes, {"node-a": {6: "lxc-a1"}, "node-b": {6: "lxc-b1"}})

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
    """Lab.attach returns a FakeLab (and remembers which lab was asked for)."""
    lab = FakeLab(events_path=tmp_path / "events.bin")
    asked = []

    def attach(name="demo"):
        asked.append(name)
        lab.name = name
        return lab

    monkeypatch.setattr(Lab, "attach", staticmethod(attach))
    lab.asked = asked
    return lab


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


# -- errors --------------------------------------------------------------------
def test_labkit_error_prints_and_returns_1(monkeypatch, capsys):
    """A LabkitError inside a command becomes 'labkit: error: …' on stderr and exit 1."""
    def attach(name="demo"):
        raise NotFoundError(f"lab '{name}' is not up (no ledger); start it with `labkit --lab {name} up`")

    monkeypatch.setattr(Lab, "attach", staticmethod(attach))
    assert cli.main(["--lab", "x", "status"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("labkit: error: lab 'x' is not up")
    assert captured.out == ""


def test_unreadable_state_is_an_error(monkeypatch, capsys):
    """A lab.json that does not parse is reported (exit 1) with the cleanup hint, not a traceback."""
    def attach(name="demo"):
        return json.loads("{broken")

    monkeypatch.setattr(Lab, "attach", staticmethod(attach))
    assert cli.main(["ct", "list", "node-a"]) == 1
    assert "cleanup" in capsys.readouterr().err


def test_negative_clock_advance_is_error(fake, capsys):
    """clock advance -5 reaches Lab.clock.advance, whose ValueError becomes exit 1."""
    assert cli.main(["clock", "advance", "-5"]) == 1
    assert capsys.readouterr().err.startswith("labkit: error: clock advance")


def test_unknown_node_lists_nodes(fake, capsys):
    """ct list of an unknown node fails with the node names."""
    assert cli.main(["ct", "list", "node-z"]) == 1
    assert "node-a, node-b" in capsys.readouterr().err


# -- commands against a fake lab --------------------------------------------------
def test_up_builds_config(monkeypatch, capsys):
    """up passes routing and CT timeouts as a DatapathConfig and prints nodes, pods and next commands."""
    seen = {}

    def up(name="demo", *, routing=None, config=None, topology=None):
        seen.update(name=name, config=config)
        return FakeLab(name)

    monkeypatch.setattr(Lab, "up", staticmethod(up))
    assert cli.main(["--lab", "uplab", "up", "--routing", "native", "--ct-timeout", "syn=5"]) == 0
    assert seen["name"] == "uplab"
    assert seen["config"] == DatapathConfig().with_options(routing="native", timeouts={"syn": 5})
    out = capsys.readouterr().out
    assert "node-a" in out and "198.18.1.0/24" in out and "198.18.2.11" in out
    assert "labkit --lab uplab exec a1 -- ping -c1 198.18.2.11" in out
    assert "labkit --lab uplab ct list node-a" in out


def test_down_reports_removed_kinds(monkeypatch, capsys):
    """down calls Lab.cleanup and prints counts by kind and 'nothing of lab X is left'."""
    monkeypatch.setattr(Lab, "cleanup", staticmethod(lambda name: ["netns", "netns", "pin"]))
    assert cli.main(["--lab", "gone", "down"]) == 0
    out = capsys.readouterr().out
    assert "2 netns" in out and "1 pin" in out and "nothing of lab gone is left" in out


def test_cleanup_failure_is_error(monkeypatch, capsys):
    """cleanup reports a CleanupError (something left) with exit 1."""
    def cleanup(name):
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


def test_doctor_exit_status(monkeypatch, capsys):
    """doctor exits 0 when every check passes and 1 otherwise; --json lists the checks."""
    from labkit.datapath import doctor

    checks = [doctor.Check("kernel", True, "6.1"), doctor.Check("bpffs", False, "missing", "mount it")]
    monkeypatch.setattr(doctor, "run_checks", lambda full=True: checks)
    monkeypatch.setattr("labkit.cli.doctor.running_lab", lambda name: None)  # no lab up: the machine only
    assert cli.main(["doctor"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert cli.main(["doctor", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == [c.to_json() for c in checks]
    monkeypatch.setattr(doctor, "run_checks", lambda full=True: checks[:1])
    assert cli.main(["doctor"]) == 0


def test_doctor_checks_a_running_labs_services_journal(monkeypatch, capsys):
    """With a lab up, doctor prints its services journal's problems and verdict, and exits 1 if it is damaged."""
    from labkit.cli import doctor as cli_doctor
    from labkit.datapath import doctor

    monkeypatch.setattr(doctor, "run_checks", lambda full=True: [doctor.Check("kernel", True, "6.1")])

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


def test_exec_enters_namespace_and_execs(fake, monkeypatch):
    """exec enters the pod's netns and cgroup (nodes: no cgroup), then execvp's the command."""
    calls = []
    monkeypatch.setattr("labkit.net.netns.enter_process", lambda netns, cgroup=None: calls.append((netns, cgroup)))

    def execvp(file, argv):
        calls.append((file, argv))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execvp", execvp)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    with pytest.raises(SystemExit):
        cli.main(["exec", "a1", "--", "ping", "-c1", "198.18.2.11"])
    assert calls == [("lk-demo-a1", "/sys/fs/cgroup/labkit/demo/a1"), ("ping", ["ping", "-c1", "198.18.2.11"])]
    calls.clear()
    with pytest.raises(SystemExit):
        cli.main(["exec", "node-b", "--", "ip", "route"])
    assert calls[0] == ("lk-demo-node-b", None)


def test_exec_missing_command_is_127(fake, monkeypatch, capsys):
    """exec of a command that does not exist prints an error and returns 127."""
    monkeypatch.setattr("labkit.net.netns.enter_process", lambda netns, cgroup=None: None)
    monkeypatch.setattr(signal, "signal", lambda *a: None)

    def execvp(file, argv):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "execvp", execvp)
    assert cli.main(["exec", "a1", "--", "no-such-command"]) == 127
    assert "no-such-command: command not found" in capsys.readouterr().err


def test_exec_unknown_name_lists_names(fake, capsys):
    """exec of a name that is not in the lab fails with exit 1 and lists the names."""
    assert cli.main(["exec", "zz", "--", "true"]) == 1
    assert "a1, a2, b1, b2" in capsys.readouterr().err


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
    """trace --follow prints only flows written after it started, then stops cleanly on Ctrl-C."""
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
    """--lab names the lab every command attaches to."""
    cli.main(["--lab", "mylab", "ct", "list", "node-a"])
    assert fake.asked == ["mylab"]


# -- root: sudo_argv ------------------------------------------------------------
def test_sudo_argv_not_root_runs_again_with_sudo():
    """As a user other than root, a lab command becomes sudo → env (LABKIT_* and PYTHONPATH kept) → python running
    the labkit script itself (not -m, which would put the working directory first on sys.path) with the same
    arguments."""
    argv = ["--lab", "demo", "exec", "a1", "--", "ping", "-c1", "198.18.2.11"]
    got = cli.sudo_argv("exec", argv, euid=1000, which={"sudo": "/usr/bin/sudo"}.get, python="/venv/bin/python",
                        script="/venv/bin/labkit",
                        environ={"LABKIT_LAB": "x", "PYTHONPATH": "/src", "HOME": "/home/vagrant", "PATH": "/bin"})
    assert got == ["/usr/bin/sudo", "--", "/usr/bin/env", "LABKIT_LAB=x", "PYTHONPATH=/src",
                   "/venv/bin/python", "/venv/bin/labkit", *argv]


def test_sudo_argv_root_or_root_free_commands_go_on():
    """Root goes on as it is; so do work, export and answers for any user, and a line without a command."""
    sudo = {"sudo": "/usr/bin/sudo"}.get
    assert cli.sudo_argv("up", ["up"], euid=0, which=sudo) is None
    for command in ("work", "export", "answers"):
        assert cli.sudo_argv(command, [command], euid=1000, which=sudo) is None
    assert cli.sudo_argv(None, ["--version"], euid=1000, which=sudo) is None


def test_sudo_argv_without_sudo_says_so_in_one_line():
    """Without sudo a command that needs root raises a CliError: one line naming the command and what to do."""
    with pytest.raises(cli.CliError) as exc:
        cli.sudo_argv("up", ["up", "--routing", "native"], euid=1000, which=lambda name: None)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("`labkit up` needs root") and "sudo is not installed" in msg
    assert "su -c 'labkit up --routing native'" in msg


def test_main_with_explicit_argv_never_runs_sudo(monkeypatch):
    """main() given argv (tests, python -m labkit cli) runs the command itself: sudo only for the real command line."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail(f"execv {a}"))
    monkeypatch.setattr(cli.common, "attach", lambda args: (_ for _ in ()).throw(NotFoundError("no lab")))
    assert cli.main(["status"]) == 1


def test_main_from_command_line_runs_sudo(monkeypatch, capsys):
    """From the command line (argv None) as a non-root user, main() replaces itself with the sudo line."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr("sys.argv", ["/usr/local/bin/labkit", "--lab", "demo", "status"])
    seen = []

    def fake_execv(path, args):
        seen.append(args)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", fake_execv)
    monkeypatch.setattr(cli.shutil, "which", lambda name: "/usr/bin/sudo" if name == "sudo" else None)
    with pytest.raises(SystemExit):
        cli.main()
    assert seen and seen[0][0] == "/usr/bin/sudo" and seen[0][-4:] == ["/usr/local/bin/labkit", "--lab", "demo", "status"]


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


def test_policy_get_prints_the_bpftool_command_first(monkeypatch, capsys):
    """`policy get POD` prints the bpftool command that dumps the pinned map, then the bpf policy get lines."""
    from labkit.agent.client import PolicyMapView
    from labkit.cli import policy as policy_cli

    path = "/sys/fs/bpf/labkit/demo/node-a/cilium_policy_00001"

    class Remote:
        def get(self, pod):
            return PolicyMapView(pod, path, ["row"], ["POLICY   DIRECTION", "Allow    Ingress"], [],
                                 {"endpoint_id": 1, "node": "node-a"})

    monkeypatch.setattr(policy_cli, "agent_policies", lambda args: Remote())
    assert cli.main(["policy", "get", "a1"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"# bpftool map dump pinned {path}", "POLICY   DIRECTION",
                                                    "Allow    Ingress"]


def test_policy_get_without_map_says_allow_all(monkeypatch, capsys):
    """A pod with no pinned policy map is reported as such: no policy enforces on it, every packet allowed."""
    from labkit.agent.client import PolicyMapView
    from labkit.cli import policy as policy_cli

    class Remote:
        def get(self, pod):
            return PolicyMapView(pod, "/x/cilium_policy_00002", [], [], [], {"endpoint_id": 2, "node": "node-a"})

    monkeypatch.setattr(policy_cli, "agent_policies", lambda args: Remote())
    assert cli.main(["policy", "get", "a2"]) == 0
    assert "no policy enforces on it" in capsys.readouterr().out


def test_up_labels_reach_the_topology(monkeypatch, capsys):
    """up --label POD:KEY=VALUE builds the default topology with those labels (others keep app=<name>);
    without --label no topology is passed (Lab.up's default)."""
    seen = []

    def up(name="demo", *, routing=None, config=None, topology=None):
        seen.append(topology)
        return FakeLab(name)

    monkeypatch.setattr(Lab, "up", staticmethod(up))
    assert cli.main(["--lab", "lbl", "up", "--label", "a2:app=a1", "--label", "a2:tier=db"]) == 0
    assert cli.main(["--lab", "lbl", "up"]) == 0
    assert {p.name: p.labels for p in seen[0].pods} == {"a1": {"app": "a1"}, "a2": {"app": "a1", "tier": "db"},
                                                        "b1": {"app": "b1"}, "b2": {"app": "b2"}}
    assert seen[1] is None


def test_up_label_syntax(capsys):
    """A --label without POD: or =VALUE is a usage error (exit 2) showing the expected form."""
    assert cli.main(["up", "--label", "app=web"]) == 2
    assert "expected POD:KEY=VALUE" in capsys.readouterr().err
