"""labkit.datapath.testrun: BPF_PROG_TEST_RUN through ctypes, and the loaded
build's programs and maps."""
from __future__ import annotations

import ctypes
import errno

import pytest

from labkit.datapath.testrun import TC_ACT_OK, SkBuff, prog_test_run
from labkit.maps.base import PinnedMap
from labkit.errors import DatapathError
from labkit.maps.ct import CtEntry, CtKey4

from .packets import SYN, eth, tcp


def test_skbuff_mirrors_uapi_layout():
    """SkBuff has struct __sk_buff's offsets: mark at 8, ifindex at 40, cb at 48, tstamp at 152, hwtstamp at 184."""
    offsets = {name: getattr(SkBuff, name).offset for name in ("mark", "ifindex", "cb", "tstamp", "hwtstamp")}
    assert offsets == {"mark": 8, "ifindex": 40, "cb": 48, "tstamp": 152, "hwtstamp": 184}
    assert ctypes.sizeof(SkBuff) == 192


def test_run_returns_verdict_packet_and_duration(native):
    """A run gives the program's return value, the packet it left (here unchanged) and a duration; it unpacks as a triple."""
    frame = eth(bytes(28), ethertype=0x0806)
    retval, data, duration = prog_test_run(native.build.prog_fd("cil_from_container"), frame, repeat=3)
    assert (retval, data) == (TC_ACT_OK, frame)
    assert duration >= 0


def test_context_goes_in_and_comes_back(native):
    """The __sk_buff passed in reaches the program and comes back as the program left it (mark cleared by to-container)."""
    r = native.build.run("cil_to_container", tcp("198.18.2.11", "198.18.1.11", 1, 2, SYN), ctx=SkBuff(mark=0x40000001))
    assert r.ctx.mark == 0x00000001


def test_refused_context_raises_oserror(native):
    """A context field the kernel does not accept for a test run (len) is EINVAL, raised as OSError."""
    with pytest.raises(OSError) as info:
        prog_test_run(native.build.prog_fd("cil_from_container"), eth(bytes(28), ethertype=0x0806), ctx=SkBuff(len=5))
    assert info.value.errno == errno.EINVAL


def test_map_from_fd_checks_sizes(native):
    """PinnedMap.from_fd reads a loaded program's map and refuses key/value types whose sizes differ from it."""
    with native.map("cilium_ct4_global", CtKey4, CtEntry) as m:
        assert m.items() == []
        assert m.command() == "bpftool map dump name cilium_ct4_glob"  # the kernel keeps 15 bytes of a name
    with pytest.raises(DatapathError):
        PinnedMap.from_fd(native.build.map_fd("cilium_ct4_global"), CtEntry, CtKey4, "cilium_ct4_global")
