"""labkit.door.bpftool's check: which bpftool argument lists labkitd runs for a learner, and which it refuses."""
from __future__ import annotations

import doctest
import os

import pytest

from labkit.door import bpftool
from labkit.door.bpftool import check_args
from labkit.errors import ConfigError

PINS = "/sys/fs/bpf/labkit/demo_u1000"
OTHER = "/sys/fs/bpf/labkit/demo_u1001"
CG = "/sys/fs/cgroup/labkit/demo_u1000"
MAP = f"{PINS}/node-a/cilium_ct4_global"


def ok(args, pin_roots=(PINS,), cgroups=(CG,)):
    return check_args(list(args), list(pin_roots), list(cgroups))


def refused(args, pin_roots=(PINS,), cgroups=(CG,)) -> str:
    with pytest.raises(ConfigError) as exc:
        check_args(list(args), list(pin_roots), list(cgroups))
    return str(exc.value)


def test_doctests():
    """The module's examples run and give what they show."""
    result = doctest.testmod(bpftool, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("args", [
    ["map", "dump", "pinned", MAP],
    ["map", "show", "pinned", MAP],
    ["map", "list", "pinned", MAP],
    ["map", "peek", "pinned", MAP],
    ["prog", "show", "pinned", f"{PINS}/node-a/cil_from_container"],
    ["prog", "list", "pinned", f"{PINS}/node-a/cil_from_container"],
    ["net", "show"],
    ["net", "list"],
    ["net", "show", "dev", "lxc0a1"],
    ["cgroup", "show", CG],
    ["cgroup", "list", f"{CG}/a1"],
    ["cgroup", "show", CG, "effective"],
    ["version"],
    ["map", "help"],
])
def test_reading_commands_pass_unchanged(args):
    """Each read-only command on the caller's own objects is run as given."""
    assert ok(args) == args


@pytest.mark.parametrize("args", [
    ["map", "lookup", "pinned", MAP, "key", "0x0a", "0", "0", "1"],
    ["map", "lookup", "pinned", MAP, "key", "hex", "0a", "00", "ff", "1"],
    ["map", "getnext", "pinned", MAP],
    ["map", "getnext", "pinned", MAP, "key", "10", "255"],
])
def test_lookup_and_getnext_take_key_bytes(args):
    """lookup/getnext accept `key [hex] BYTE...` with bytes as 0x0a, 10, or 0a after hex."""
    assert ok(args) == args


@pytest.mark.parametrize("args,expected", [
    (["map", "dump", "pinned", MAP, "-j"], ["-j", "map", "dump", "pinned", MAP]),
    (["--json", "--pretty", "net", "show"], ["--json", "--pretty", "net", "show"]),
    (["-jp", "map", "show", "pinned", MAP], ["-jp", "map", "show", "pinned", MAP]),
    (["-n", "cgroup", "show", CG], ["-n", "cgroup", "show", CG]),
])
def test_global_options_anywhere_go_first(args, expected):
    """-j/-p/-n (and their long forms, and -jp) pass wherever they stand and are put before the object."""
    assert ok(args) == expected


@pytest.mark.parametrize("option", ["-f", "--bpffs", "-d", "--debug", "-m", "--js", "--bpf", "-jf", "-B", "--"])
def test_other_options_refused(option):
    """Every option but -j/-p/-n is refused, abbreviations of long options too (getopt would expand them)."""
    assert "not one of -j" in refused([option, "map", "show", "pinned", MAP])


@pytest.mark.parametrize("verb", ["update", "delete", "pin", "create", "push", "pop", "enqueue", "dequeue",
                                  "freeze", "event_pipe"])
def test_map_write_verbs_refused(verb):
    """A map verb that writes (or streams events) is refused: only reading is allowed."""
    message = refused(["map", verb, "pinned", MAP, "key", "1", "value", "2"])
    assert f"bpftool map {verb}: refused (only reading is allowed)" in message
    assert "allowed: map dump" in message


@pytest.mark.parametrize("args", [
    ["prog", "load", "/tmp/x.o", f"{PINS}/p"],
    ["prog", "attach", "pinned", f"{PINS}/p", "xdp"],
    ["net", "attach", "xdp", "pinned", f"{PINS}/p", "dev", "eth0"],
    ["net", "detach", "xdp", "dev", "eth0"],
    ["cgroup", "attach", CG, "cgroup_inet_ingress", "pinned", f"{PINS}/p"],
    ["cgroup", "detach", CG, "cgroup_inet_ingress", "pinned", f"{PINS}/p"],
    ["prog", "run", "pinned", f"{PINS}/p", "data_in", "/tmp/x"],
])
def test_load_attach_detach_run_refused(args):
    """Loading, attaching, detaching and running programs are refused."""
    assert "only reading is allowed" in refused(args)


@pytest.mark.parametrize("args", [
    ["map", "show", "id", "12"],
    ["map", "dump", "id", "12"],
    ["prog", "show", "id", "3"],
    ["prog", "show", "tag", "a04f5eef06a7f555"],
    ["map", "dump", "name", "cilium_ct4_glob"],
])
def test_ids_names_and_tags_refused(args):
    """Naming an object by id, name or tag is refused: they are global and would reach other users' labs."""
    assert "are global; name your lab's object with pinned PATH" in refused(args)


@pytest.mark.parametrize("args", [["map", "show"], ["map", "list"], ["prog", "show"], ["prog", "list"]])
def test_listing_everything_refused(args):
    """map/prog show without `pinned PATH` (every lab's objects) is refused."""
    assert "without `pinned PATH`" in refused(args)


@pytest.mark.parametrize("args", [
    ["btf", "dump", "file", "/sys/kernel/btf/vmlinux"],
    ["batch", "file", "/tmp/cmds"],
    ["feature", "probe"],
    ["link", "show"],
    ["gen", "skeleton", "/tmp/x.o"],
    ["struct_ops", "show"],
    ["iter", "pin", "/tmp/x.o", f"{PINS}/it"],
    ["perf", "show"],
])
def test_other_objects_refused(args):
    """Objects other than map, prog, net and cgroup are refused."""
    assert "is not one learners read" in refused(args)


def test_cgroup_tree_and_prog_dump_refused():
    """cgroup tree (every cgroup) and prog dump are not among the allowed commands."""
    assert "cgroup tree shows every lab's cgroups" in refused(["cgroup", "tree"])
    assert "prog dump is not among the commands" in refused(["prog", "dump", "xlated", "pinned", f"{PINS}/p"])


@pytest.mark.parametrize("path", [
    f"{PINS}/../demo_u1001/node-a/cilium_ct4_global",
    f"{PINS}/node-a/../../demo_u1001/node-a/m",
    f"{PINS}/node-a/..",
])
def test_dotdot_refused(path):
    """A path with a `..` component is refused before it is resolved."""
    assert "has a '..' component" in refused(["map", "dump", "pinned", path])


@pytest.mark.parametrize("path", [f"{OTHER}/node-a/cilium_ct4_global", "/sys/fs/bpf/labkit/demo_u10000/x",
                                  "/sys/fs/bpf/other", "/etc/shadow", PINS])
def test_paths_outside_own_pins_refused(path):
    """A pin of another lab, a sibling whose name merely starts alike, anything outside, and the root itself
    are refused."""
    assert "outside your lab's" in refused(["map", "dump", "pinned", path])


def test_relative_path_refused():
    """A relative pinned path is refused (it would resolve against labkitd's directory)."""
    assert "is not an absolute path" in refused(["map", "dump", "pinned", "node-a/cilium_ct4_global"])


def test_symlink_into_another_lab_refused(tmp_path):
    """A symlink (anywhere) that resolves into another lab's pins is refused."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    (mine / "node-a").mkdir(parents=True)
    (theirs / "node-a").mkdir(parents=True)
    (theirs / "node-a" / "m").write_text("")
    os.symlink(theirs / "node-a" / "m", mine / "node-a" / "link")
    os.symlink(theirs / "node-a", tmp_path / "dirlink")
    assert "outside your lab's" in refused(["map", "dump", "pinned", str(mine / "node-a" / "link")], [str(mine)])
    assert "outside your lab's" in refused(["map", "dump", "pinned", str(tmp_path / "dirlink" / "m")], [str(mine)])


def test_symlink_into_own_lab_is_resolved(tmp_path):
    """A symlink that resolves into the caller's pins passes with the resolved path, so a later swap of the
    link is never followed."""
    mine = tmp_path / "mine"
    (mine / "node-a").mkdir(parents=True)
    (mine / "node-a" / "m").write_text("")
    os.symlink(mine / "node-a" / "m", tmp_path / "link")
    assert ok(["map", "dump", "pinned", str(tmp_path / "link")], [str(mine)]) == \
        ["map", "dump", "pinned", str(mine / "node-a" / "m")]


def test_root_pin_root_allows_nothing():
    """A pin root of "/" (a caller's mistake) allows nothing rather than everything."""
    assert "outside your lab's" in refused(["map", "dump", "pinned", "/etc/passwd"], ["/"])


def test_cgroup_outside_own_refused():
    """cgroup show of another lab's cgroup, or of a cgroup of the same prefix, is refused."""
    assert "outside your lab's" in refused(["cgroup", "show", "/sys/fs/cgroup/labkit/demo_u1001"])
    assert "outside your lab's" in refused(["cgroup", "show", "/sys/fs/cgroup/labkit/demo_u10000"])
    assert "outside your lab's" in refused(["cgroup", "show", "/sys/fs/cgroup"])


@pytest.mark.parametrize("args,why", [
    (["map", "lookup", "pinned", MAP, "key", "0x100"], "is not a byte"),
    (["map", "lookup", "pinned", MAP, "key", "hex", "zz"], "is not a byte"),
    (["map", "lookup", "pinned", MAP, "key"], "`key` without bytes"),
    (["map", "lookup", "pinned", MAP, "value", "1"], "expected `key BYTES`"),
    (["map", "dump", "pinned", MAP, "key", "1"], "unexpected 'key 1'"),
    (["map", "dump", "pinned"], "expected `pinned PATH`"),
    (["map"], "no command given"),
    ([], "no object given"),
    (["net", "show", "dev", "-x"], "not one of -j"),
    (["net", "show", "dev", "a" * 16], "expected nothing or `dev IFNAME`"),
    (["cgroup", "show", CG, "tree"], "expected `cgroup show CGROUP [effective]`"),
    (["cgroup", "show"], "expected `cgroup show CGROUP [effective]`"),
])
def test_malformed_arguments_refused(args, why):
    """Malformed keys, missing paths, stray words and bad device names are refused, each with its reason."""
    assert why in refused(args)


def test_untrusted_input_bounded():
    """NUL bytes, more than 64 arguments, an argument over 4096 characters and non-strings are refused."""
    assert "no NUL bytes" in refused(["map", "dump", "pinned", MAP + "\0x"])
    assert "at most 64" in refused(["net", "show"] + ["-j"] * 63)
    assert "at most 4096 characters" in refused(["map", "dump", "pinned", PINS + "/" + "a" * 4100])
    assert "expected a string" in refused(["map", "dump", "pinned", 7])
    with pytest.raises(ConfigError, match="expected a list"):
        check_args("map dump", [PINS], [])


def test_refusal_is_one_line():
    """A refusal is one line naming what was refused and listing what is allowed."""
    message = refused(["map", "update", "pinned", MAP])
    assert "\n" not in message
    assert message.startswith("bpftool map update: refused")
    assert message.endswith(bpftool.ALLOWED)


def test_refused_is_a_value_error():
    """The refusal is a ConfigError, so a ValueError to callers that catch builtins."""
    with pytest.raises(ValueError):
        check_args(["map", "delete", "pinned", MAP], [PINS], [])


def test_bpftool_path_is_fixed():
    """bpftool is found once, in root's fixed PATH, never the caller's."""
    assert bpftool.BPFTOOL is None or bpftool.BPFTOOL.startswith(("/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/"))
