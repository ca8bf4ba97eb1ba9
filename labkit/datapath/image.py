"""A node's compiled datapath as an image, so the same build loads again without compiling.

BCC compiles a node's translation unit in about 7 CPU-seconds; a lab of two
nodes pays it twice, and a class graded notebook by notebook pays it for every
notebook, although the text, the macros and the kernel are the same each time.
An :class:`Image` is what BCC produced: every program's instructions, every
map's definition (type, sizes, flags, the BTF types of key and value) and the
BTF blob itself. :func:`load` creates the maps afresh, writes their fds into
the instructions where BCC had written its own, and loads the programs: the
kernel then holds exactly what BCC would have loaded, with new, empty maps.

Images are cached by a key over everything that shapes the code (text, cflags,
BCC's version, the running kernel), in ``/var/cache/labkit/bpf`` (or
``$LABKIT_BPF_CACHE``; ``LABKIT_BPF_CACHE=off`` compiles every time)::

    node, how = load_build(build)   # how: "cached" or "compiled"
    node.maps["cilium_ct4_global"], node.progs["cil_from_container"]   # fds

The same files on the command line: ``bpftool prog show`` lists the programs,
``bpftool map show`` the maps, with the BTF ids the image carried.
"""
from __future__ import annotations

import base64
import ctypes
import hashlib
import json
import os
import struct
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from labkit.datapath import bpf as _bpf
from labkit.datapath.source import CGROUP_ATTACH, NodeBuild, Program
from labkit.net.ledger import file_lock
from labkit.errors import DatapathError

__all__ = ["MapSpec", "ProgSpec", "Image", "LoadedImage", "capture", "load", "load_build", "compile_build",
           "image_key", "INNER_TEMPLATES",
           "cache_dir", "cache_get", "cache_put", "cache_drop", "cache_lock"]

BPF_PROG_LOAD, BPF_BTF_LOAD, BPF_BTF_GET_FD_BY_ID = 5, 18, 19
BPF_MAP_TYPE_HASH_OF_MAPS = 13
BPF_PSEUDO_MAP_FD = 1
_LD_IMM64 = 0x18
_LOG_SIZE = 1 << 20
_PROG_INFO_SIZE = 232  # struct bpf_prog_info up to attach_btf_id
_FUNC_INFO_AT = 132  # its func_info_rec_size, func_info, nr_func_info
FORMAT = 1  # bump when the image layout changes: older images are then never read


@dataclass(frozen=True)
class MapSpec:
    """One map as BCC created it. ``fd`` is the number BCC's instructions refer to it by."""

    name: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    fd: int
    btf_key_type_id: int = 0
    btf_value_type_id: int = 0
    inner: str = ""  # a map of maps: the map whose definition its inner maps share


@dataclass(frozen=True)
class ProgSpec:
    """One program: its type (and attach type for socket hooks) and BCC's instructions."""

    name: str
    prog_type: int
    attach_type: int
    insns: bytes
    func_info: tuple = ()  # ((insn_off, BTF type id), ...): names the program after its C function (bpftool)


@dataclass
class Image:
    """Everything BCC made of one build, enough to load it again (see the module docstring)."""

    key: str
    license: str
    maps: list[MapSpec]
    progs: list[ProgSpec]
    btf: bytes = b""

    def to_bytes(self) -> bytes:
        data = {"format": FORMAT, "key": self.key, "license": self.license, "btf": base64.b64encode(self.btf).decode(),
                "maps": [asdict(m) for m in self.maps],
                "progs": [{**asdict(p), "insns": base64.b64encode(p.insns).decode(), "func_info": list(p.func_info)}
                          for p in self.progs]}
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Image":
        data = json.loads(raw)
        if data.get("format") != FORMAT:
            raise ValueError(f"image format {data.get('format')}, expected {FORMAT}")
        return cls(key=data["key"], license=data["license"], btf=base64.b64decode(data["btf"]),
                   maps=[MapSpec(**m) for m in data["maps"]],
                   progs=[ProgSpec(**{**p, "insns": base64.b64decode(p["insns"]),
                                            "func_info": tuple(tuple(r) for r in p["func_info"])})
                          for p in data["progs"]])


@dataclass
class LoadedImage:
    """The maps and programs :func:`load` made: fds by name. Close them once pinned or attached."""

    maps: dict[str, int] = field(default_factory=dict)
    progs: dict[str, int] = field(default_factory=dict)
    btf_fd: int = -1

    def close(self) -> None:
        for fd in [*self.progs.values(), *self.maps.values(), self.btf_fd]:
            if fd >= 0:
                os.close(fd)
        self.maps.clear()
        self.progs.clear()
        self.btf_fd = -1


# -- from BCC -------------------------------------------------------------------
def capture(bpf, functions: dict[str, tuple[int, int]], key: str = "") -> Image:
    """The image of BCC module ``bpf``: its maps and the programs ``functions`` names.

    ``functions`` maps each program's name to ``(prog_type, attach_type)`` (-1: none).
    """
    from bcc.libbcc import lib

    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.bpf_table_fd_id.restype = ctypes.c_int
    lib.bpf_table_fd_id.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    maps: list[MapSpec] = []
    by_id: dict[int, str] = {}
    btf_id = 0
    for i in range(lib.bpf_num_tables(bpf.module)):
        name = lib.bpf_table_name(bpf.module, i).decode()
        fd = lib.bpf_table_fd_id(bpf.module, i)
        info = _bpf.map_info(fd)
        by_id[info.id] = name
        btf_id = btf_id or info.btf_id
        if info.btf_id and info.btf_id != btf_id:
            raise DatapathError(f"map {name}: BTF id {info.btf_id}, expected the module's one BTF ({btf_id})")
        maps.append(MapSpec(name=name, type=info.type, key_size=info.key_size, value_size=info.value_size,
                            max_entries=info.max_entries, flags=info.map_flags, fd=fd,
                            btf_key_type_id=info.btf_key_type_id, btf_value_type_id=info.btf_value_type_id))
    maps = [_with_inner(m, maps) for m in maps]
    progs = []
    for name, (prog_type, attach_type) in functions.items():
        loaded = bpf.load_func(name.encode(), prog_type, attach_type=attach_type)  # BCC adds its BTF func info
        progs.append(ProgSpec(name=name, prog_type=prog_type, attach_type=attach_type,
                              insns=bytes(bpf.dump_func(name.encode())), func_info=_func_info(loaded.fd)))
    btf = _btf_blob(btf_id) if btf_id else b""
    return Image(key=key, license=lib.bpf_module_license(bpf.module).decode(), maps=maps, progs=progs, btf=btf)


#: Each map of maps, by name, and the map its inner maps are made like. BCC declares the template by name
#: (``BPF_HASH_OF_MAPS(outer, key, "inner", n)``); the kernel keeps no such name, so it is recorded here.
INNER_TEMPLATES = {
    "cilium_lb4_maglev": "labkit_maglev_inner",  # bpf/lib/maps_lb.h
    "labkit_policy": "labkit_policy_inner",  # bpf/lib/maps_policy.h
}


def _with_inner(spec: MapSpec, maps: list[MapSpec]) -> MapSpec:
    """A map of maps names the map its inner maps are made like (:data:`INNER_TEMPLATES`).

    A map of maps not in the table, or whose template the module lacks, is an error, not a guess.
    """
    if spec.type != BPF_MAP_TYPE_HASH_OF_MAPS:
        return spec
    inner = INNER_TEMPLATES.get(spec.name)
    names = [m.name for m in maps]
    if inner is None or inner not in names:
        raise DatapathError(f"map of maps {spec.name}: expected its template map "
                            f"{inner or '(none listed in INNER_TEMPLATES)'} among the module's maps, found {names}")
    return MapSpec(**{**asdict(spec), "inner": inner})


def _btf_blob(btf_id: int) -> bytes:
    """The raw BTF the kernel holds as object ``btf_id`` (BPF_OBJ_GET_INFO_BY_FD on its fd)."""
    fd = _bpf._sys(BPF_BTF_GET_FD_BY_ID, _bpf._attr("=I", btf_id), f"open BTF id {btf_id}")
    try:
        size = struct.unpack_from("=QII", _info(fd, bytes(32)), 0)[1]
        buf = ctypes.create_string_buffer(size)
        info = struct.pack("=QIIQII", ctypes.addressof(buf), size, 0, 0, 0, 0)
        _info(fd, info)
        return buf.raw
    finally:
        os.close(fd)


def _func_info(prog_fd: int) -> tuple:
    """The BTF func info the kernel holds for a loaded program: ``((insn_off, type_id), ...)``."""
    head = _info(prog_fd, bytes(_PROG_INFO_SIZE))
    rec_size, _, count = struct.unpack_from("=IQI", head, _FUNC_INFO_AT)
    if not count:
        return ()
    buf = ctypes.create_string_buffer(rec_size * count)
    ask = bytearray(_PROG_INFO_SIZE)
    struct.pack_into("=IQI", ask, _FUNC_INFO_AT, rec_size, ctypes.addressof(buf), count)
    _info(prog_fd, bytes(ask))
    return tuple(struct.unpack_from("=II", buf.raw, i * rec_size) for i in range(count))


def _info(fd: int, info: bytes) -> bytes:
    buf = ctypes.create_string_buffer(info, len(info))
    _bpf._sys(_bpf.BPF_OBJ_GET_INFO_BY_FD, _bpf._attr("=IIQ", fd, len(info), ctypes.addressof(buf)), "object info")
    return buf.raw


# -- into the kernel ----------------------------------------------------------------
def load(image: Image) -> LoadedImage:
    """Create the image's maps, point its programs at them and load the programs. All or nothing."""
    out = LoadedImage()
    try:
        if image.btf:
            out.btf_fd = _btf_load(image.btf)
        specs = {m.name: m for m in image.maps}
        templates = {m.inner for m in image.maps if m.inner}
        for spec in sorted(image.maps, key=lambda m: bool(m.inner)):  # templates before their maps of maps
            inner_fd = out.maps[spec.inner] if spec.inner else 0
            # A template without BTF, like the inner maps the agent creates: Linux 6.1 (Debian 12) compares
            # timer_off, which a map with BTF gets as -ENOENT and one without keeps at -EINVAL, and refuses
            # every inner map with EINVAL when they differ.
            out.maps[spec.name] = _map_create(spec, -1 if spec.name in templates else out.btf_fd, inner_fd)
        fds = {specs[name].fd: fd for name, fd in out.maps.items()}
        for prog in image.progs:
            out.progs[prog.name] = _prog_load(prog, _relocate(prog, fds), image.license, out.btf_fd)
    except BaseException:
        out.close()
        raise
    return out


def _btf_load(blob: bytes) -> int:
    buf = ctypes.create_string_buffer(blob, len(blob))
    attr = _bpf._attr("=QQIII", ctypes.addressof(buf), 0, len(blob), 0, 0)
    try:
        return _bpf._sys(BPF_BTF_LOAD, attr, "load BTF")
    except OSError as exc:
        raise DatapathError(f"the image's BTF ({len(blob)} bytes) did not load: {exc.strerror}") from None


def _map_create(spec: MapSpec, btf_fd: int, inner_fd: int) -> int:
    has_btf = btf_fd >= 0 and spec.btf_value_type_id
    attr = _bpf._attr("=IIIIIII16sIIIII", spec.type, spec.key_size, spec.value_size, spec.max_entries, spec.flags,
                      inner_fd, 0, spec.name.encode()[:15], 0, btf_fd if has_btf else 0,
                      spec.btf_key_type_id if has_btf else 0, spec.btf_value_type_id if has_btf else 0, 0)
    return _bpf._sys(_bpf.BPF_MAP_CREATE, attr, f"create map {spec.name}")


def _relocate(prog: ProgSpec, fds: dict[int, int]) -> bytes:
    """``prog``'s instructions with every map reference moved from BCC's fd to the new map's."""
    insns = bytearray(prog.insns)
    i = 0
    while i < len(insns):
        code, regs = insns[i], insns[i + 1]
        if code == _LD_IMM64:
            if regs >> 4 == BPF_PSEUDO_MAP_FD:
                old = struct.unpack_from("<i", insns, i + 4)[0]
                if old not in fds:
                    raise DatapathError(f"program {prog.name}: instruction {i // 8} names map fd {old}, "
                                        f"which is none of the image's maps")
                struct.pack_into("<i", insns, i + 4, fds[old])
            i += 16
        else:
            i += 8
    return bytes(insns)


def _prog_load(prog: ProgSpec, insns: bytes, license: str, btf_fd: int) -> int:
    code = ctypes.create_string_buffer(insns, len(insns))
    func_info = None
    if prog.func_info and btf_fd >= 0:
        raw = b"".join(struct.pack("=II", off, type_id) for off, type_id in prog.func_info)
        func_info = ctypes.create_string_buffer(raw, len(raw))
    lic = ctypes.create_string_buffer(license.encode())
    log = ctypes.create_string_buffer(_LOG_SIZE)

    def attempt(level: int, log_size: int) -> int:
        attr = _bpf._attr("=IIQQIIQII16sIIIIQI", prog.prog_type, len(insns) // 8, ctypes.addressof(code),
                          ctypes.addressof(lic), level, log_size, ctypes.addressof(log) if level else 0, 0, 0,
                          prog.name.encode()[:15], 0, max(prog.attach_type, 0),
                          btf_fd if func_info is not None else 0, 8 if func_info is not None else 0,
                          ctypes.addressof(func_info) if func_info is not None else 0,
                          len(prog.func_info) if func_info is not None else 0)
        return _bpf._sys(BPF_PROG_LOAD, attr, f"load program {prog.name}")

    try:
        return attempt(0, 0)
    except OSError as exc:
        try:
            attempt(1, _LOG_SIZE)
        except OSError:
            pass
        tail = log.value.decode(errors="replace").strip().splitlines()[-5:]
        raise DatapathError(f"program {prog.name} of the cached image did not load ({exc.strerror}): "
                            + " | ".join(tail)) from None


# -- a node's build ---------------------------------------------------------------------
def load_build(build: NodeBuild) -> tuple[LoadedImage, str]:
    """Load ``build``: from the cached image of the same text and flags, or compiled now with BCC.

    Returns the loaded maps and programs and how: ``"cached"`` or ``"compiled"``. The programs
    are always loaded from an image, so a node built from the cache holds exactly what a
    compiled node holds (the image is what BCC produced for this text).
    """
    text, cflags = build.text(), build.cflags()
    key = image_key(text, cflags)
    cached = cache_get(key)  # an image is written whole and renamed: read without the lock, so that
    if cached is not None:   # loaders of labs side by side load their images at once
        try:
            return load(cached), "cached"
        except DatapathError:
            pass  # checked again under the lock, then dropped
    with cache_lock(key):  # held to compile: two loaders of one build compile once
        cached = cache_get(key)
        if cached is not None:
            try:
                return load(cached), "cached"
            except DatapathError:
                cache_drop(key)  # made by another kernel or BCC after all: compile afresh
        fresh = compile_build(build, key)
        cache_put(fresh)
    return load(fresh), "compiled"


def compile_build(build: NodeBuild, key: str = "") -> Image:
    """BCC's image of ``build`` (its text and cflags, every program it names). Needs root and BCC."""
    from bcc import BPF

    try:
        bpf = BPF(text=build.text().encode(), cflags=build.cflags())
    except Exception as exc:  # BCC raises bare Exception with the compiler's message on stderr
        raise DatapathError(f"node '{build.node}': BCC could not compile the datapath: {exc}") from None
    try:
        functions = {p.function: _prog_type(BPF, p) for p in build.programs}
        return capture(bpf, functions, key)
    finally:
        bpf.cleanup()


def _prog_type(BPF, prog: Program) -> tuple[int, int]:
    """``(prog_type, expected attach type)`` of one program; -1: the kernel wants none at load time."""
    if prog.device == "cgroup":
        return BPF.CGROUP_SOCK_ADDR, CGROUP_ATTACH[prog.direction]
    if prog.device == "pods":
        return BPF.SOCK_OPS, -1
    if prog.device == "sockmap":
        return BPF.SK_MSG, -1
    if prog.device.startswith("xdp"):
        return BPF.XDP, -1
    return BPF.SCHED_CLS, -1


# -- the cache ----------------------------------------------------------------------
def cache_dir() -> Path | None:
    """Where images are kept; None when ``LABKIT_BPF_CACHE=off``."""
    where = os.environ.get("LABKIT_BPF_CACHE", "/var/cache/labkit/bpf")
    return None if where.lower() in ("off", "0", "no", "") else Path(where)


def image_key(text: str, cflags: list[str]) -> str:
    """A key over everything that shapes the compiled code: the text, the flags, BCC and the kernel."""
    try:
        from importlib.metadata import version

        bcc_version = version("bcc")
    except Exception:  # Debian's python3-bpfcc carries no distribution metadata
        bcc_version = _bcc_library_version()
    h = hashlib.sha256()
    for part in (f"format {FORMAT}", text, "\0".join(cflags), bcc_version, *os.uname()[2:4]):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:32]


def _bcc_library_version() -> str:
    """The libbcc the bcc module loads, by its resolved file name (e.g. ``libbcc.so.0.26.0``)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libbcc.so" in line:
                    return os.path.realpath(line.split()[-1])
    except OSError:
        pass
    return "bcc (version unknown)"


def cache_get(key: str) -> Image | None:
    """The cached image for ``key``, or None (no cache, no entry, or an unreadable one)."""
    where = cache_dir()
    path = where / f"{key}.json" if where else None
    if path is None or not path.exists():
        return None
    try:
        image = Image.from_bytes(path.read_bytes())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return image if image.key == key else None


def cache_drop(key: str) -> None:
    """Forget the image ``key`` (one that no longer loads)."""
    where = cache_dir()
    if where is not None:
        (where / f"{key}.json").unlink(missing_ok=True)


def cache_put(image: Image) -> None:
    """Keep ``image`` (written whole, then renamed, so a reader never sees half of one)."""
    where = cache_dir()
    if where is None:
        return
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".{image.key}.{os.getpid()}.tmp"
    tmp.write_bytes(image.to_bytes())
    os.replace(tmp, where / f"{image.key}.json")


@contextmanager
def cache_lock(key: str) -> Iterator[None]:
    """Hold the cache entry ``key`` while compiling it, so two loaders of one build compile once."""
    where = cache_dir()
    if where is None:
        yield
        return
    where.mkdir(parents=True, exist_ok=True)
    with file_lock(where / f".{key}.lock"):
        yield
