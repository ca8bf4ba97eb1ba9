"""Run a compiled datapath program on one crafted packet, without a network.

``BPF_PROG_TEST_RUN`` (bpf(2) command 10) hands a program a packet the kernel
builds from bytes, runs it once (or ``repeat`` times) and gives back its
return value, the packet as the program left it and the time it took. No
device, namespace or route is involved: Cilium's ``bpf/tests`` run its
programs the same way, and labkit's ``tests/bpf`` tier does too.

    >>> from labkit.datapath.testrun import SkBuff
    >>> import ctypes; ctypes.sizeof(SkBuff)
    192

Programs come from :class:`TestBuild`: the node's translation unit loaded
exactly as ``labkit.datapath.loader`` loads it (same text, same ``-D`` macros,
the same image), but never attached, with every map's fd reachable by name
(wrap it in ``labkit.maps.base.PinnedMap.from_fd`` to read and write it with
labkit's map types)::

    build = TestBuild.load(node_build(topo, DatapathConfig(routing="native"), "node-a"))
    run = build.run("cil_from_container", packet)       # -> TestRun(retval, data, duration)
    PinnedMap.from_fd(build.map_fd("cilium_ct4_global"), CtKey4, CtEntry).items()

The shell's nearest equivalent is ``bpftool prog run pinned PROG data_in FILE data_out FILE``.
"""
from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass, field

from . import bpf as _bpf
from . import image
from ..errors import NotFoundError
from .source import NodeBuild

__all__ = [
    "BPF_PROG_TEST_RUN",
    "TC_ACT_OK",
    "TC_ACT_SHOT",
    "TC_ACT_REDIRECT",
    "SkBuff",
    "TestRun",
    "prog_test_run",
    "TestBuild",
    "sock_addr_test_run_supported",
]

BPF_PROG_TEST_RUN = 10
BPF_PROG_LOAD = 5
BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18
BPF_CGROUP_INET4_CONNECT = 10

#: tc verdicts (linux/pkt_cls.h).
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7


class SkBuff(ctypes.Structure):
    """``struct __sk_buff`` (uapi/linux/bpf.h, 192 bytes on 6.x), the context of a tc program.

    For a test run the kernel accepts only ``mark``, ``priority``,
    ``ingress_ifindex``, ``ifindex``, ``cb``, ``tstamp``, ``wire_len``,
    ``gso_segs``, ``gso_size`` and ``hwtstamp`` (everything else must be 0);
    an ``ifindex`` above 1 must name a device of the caller's namespace.
    """

    _fields_ = [
        ("len", ctypes.c_uint32),
        ("pkt_type", ctypes.c_uint32),
        ("mark", ctypes.c_uint32),
        ("queue_mapping", ctypes.c_uint32),
        ("protocol", ctypes.c_uint32),
        ("vlan_present", ctypes.c_uint32),
        ("vlan_tci", ctypes.c_uint32),
        ("vlan_proto", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
        ("ingress_ifindex", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("tc_index", ctypes.c_uint32),
        ("cb", ctypes.c_uint32 * 5),
        ("hash", ctypes.c_uint32),
        ("tc_classid", ctypes.c_uint32),
        ("data", ctypes.c_uint32),
        ("data_end", ctypes.c_uint32),
        ("napi_id", ctypes.c_uint32),
        ("family", ctypes.c_uint32),
        ("remote_ip4", ctypes.c_uint32),
        ("local_ip4", ctypes.c_uint32),
        ("remote_ip6", ctypes.c_uint32 * 4),
        ("local_ip6", ctypes.c_uint32 * 4),
        ("remote_port", ctypes.c_uint32),
        ("local_port", ctypes.c_uint32),
        ("data_meta", ctypes.c_uint32),
        ("flow_keys", ctypes.c_uint64),
        ("tstamp", ctypes.c_uint64),
        ("wire_len", ctypes.c_uint32),
        ("gso_segs", ctypes.c_uint32),
        ("sk", ctypes.c_uint64),
        ("gso_size", ctypes.c_uint32),
        ("tstamp_type", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
        ("hwtstamp", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class TestRun:
    """What one test run gave back. Unpacks as ``retval, data, duration``."""

    __test__ = False  # not a pytest class

    retval: int  #: the program's return value (TC_ACT_* for tc programs)
    data: bytes  #: the packet as the program left it
    duration: int  #: average nanoseconds per run
    ctx: SkBuff | None = field(default=None, repr=False)  #: the context after the run, when one was passed

    def __iter__(self):
        return iter((self.retval, self.data, self.duration))


def prog_test_run(prog_fd: int, data_in: bytes, repeat: int = 1, ctx: ctypes.Structure | None = None,
                  data_out_size: int | None = None) -> TestRun:
    """``BPF_PROG_TEST_RUN``: run program ``prog_fd`` on ``data_in``; ``ctx`` sets the context (an
    :class:`SkBuff` for a tc program, an ``xdp_md`` for XDP), read back into the same type after the run.

    ``data_out_size`` bounds the packet read back (default: the input plus 256 bytes, room for what a
    program adds). OSError carries the kernel's errno (EINVAL: the program type cannot be test-run, or
    a context field the kernel does not accept is set).
    """
    data = ctypes.create_string_buffer(bytes(data_in), len(data_in))
    out_size = data_out_size if data_out_size is not None else len(data_in) + 256
    out = ctypes.create_string_buffer(out_size)
    ctx_in = ctx_out = None
    if ctx is not None:
        ctx_in = ctypes.create_string_buffer(bytes(ctx), ctypes.sizeof(ctx))
        ctx_out = ctypes.create_string_buffer(ctypes.sizeof(ctx))
    attr = _bpf._attr(
        "=IIIIQQIIIIQQ",
        prog_fd, 0, len(data_in), out_size, ctypes.addressof(data), ctypes.addressof(out), max(1, repeat), 0,
        ctypes.sizeof(ctx) if ctx is not None else 0, ctypes.sizeof(ctx) if ctx is not None else 0,
        _bpf._addr(ctx_in), _bpf._addr(ctx_out),
    )
    _bpf._sys(BPF_PROG_TEST_RUN, attr, "prog test run")
    _, retval, _, size_out = struct.unpack_from("=IIII", attr, 0)
    duration = struct.unpack_from("=I", attr, 36)[0]
    ctx_after = type(ctx).from_buffer_copy(ctx_out.raw) if ctx_out is not None else None
    return TestRun(ctypes.c_int32(retval).value, out.raw[:size_out], duration, ctx_after)


class TestBuild:
    """One node's datapath loaded as a lab loads it (:func:`labkit.datapath.image.load_build`), not attached:
    programs to test-run, maps to fill."""

    __test__ = False

    def __init__(self, build: NodeBuild, loaded: image.LoadedImage, how: str):
        self.build = build
        self.loaded = loaded
        self.how = how  # "cached" or "compiled"

    @classmethod
    def load(cls, build: NodeBuild) -> "TestBuild":
        """Load ``build`` as the loader does (same text and cflags; the cached image or BCC). Needs root."""
        return cls(build, *image.load_build(build))

    def prog_fd(self, function: str) -> int:
        """The fd of program ``function``."""
        try:
            return self.loaded.progs[function]
        except KeyError:
            raise NotFoundError(f"build of node '{self.build.node}': no program {function!r}, expected one of "
                                f"{sorted(self.loaded.progs)}") from None

    def run(self, function: str, packet: bytes, ctx: SkBuff | None = None, repeat: int = 1) -> TestRun:
        """Test-run tc program ``function`` on ``packet``."""
        return prog_test_run(self.prog_fd(function), packet, repeat=repeat, ctx=ctx)

    def map_fd(self, name: str) -> int:
        """The fd of map ``name``."""
        return self.loaded.maps[name]

    def clear_maps(self, names) -> None:
        """Empty the hash maps ``names`` (an array map cannot be emptied: write its entries instead)."""
        for name in names:
            fd = self.map_fd(name)
            info = _bpf.map_info(fd)
            for key in _bpf.all_keys(fd, info.key_size):
                _bpf.delete(fd, ctypes.create_string_buffer(key, info.key_size))

    def close(self) -> None:
        """Unload the programs and free the maps."""
        self.loaded.close()


# A cgroup/connect4 program that returns 1 ("allow"): r0 = 1; exit.
_ALLOW_INSNS = struct.pack("<BBhi", 0xB7, 0x00, 0, 1) + struct.pack("<BBhi", 0x95, 0, 0, 0)


def sock_addr_test_run_supported() -> tuple[bool, str]:
    """Can this kernel test-run a cgroup/sock_addr program (bpf_sock.c's hooks)? ``(yes, why)``.

    Loads a two-instruction connect4 program and asks for a test run: kernels without
    ``test_run`` for that program type answer ENOTSUPP (524) or EINVAL.
    """
    insns = ctypes.create_string_buffer(_ALLOW_INSNS, len(_ALLOW_INSNS))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = _bpf._attr("=IIQQIIQII16sIII", BPF_PROG_TYPE_CGROUP_SOCK_ADDR, len(_ALLOW_INSNS) // 8,
                      ctypes.addressof(insns), ctypes.addressof(lic), 0, 0, 0, 0, 0, b"lk_probe", 0,
                      BPF_CGROUP_INET4_CONNECT, 0)
    try:
        fd = _bpf._sys(BPF_PROG_LOAD, attr, "load a cgroup/connect4 probe")
    except OSError as exc:
        return False, f"the kernel would not load a cgroup/connect4 program ({exc.strerror})"
    try:
        prog_test_run(fd, bytes(64))
    except OSError as exc:
        name = "ENOTSUPP" if exc.errno == 524 else errno.errorcode.get(exc.errno, str(exc.errno))
        return False, f"BPF_PROG_TEST_RUN of a cgroup/sock_addr program fails with {name} on {os.uname().release}"
    finally:
        os.close(fd)
    return True, "supported"
