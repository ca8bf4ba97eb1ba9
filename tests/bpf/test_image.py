"""A build loaded from its image is the build BCC loads: same maps, same programs (kernel tags), same BTF names."""
from __future__ import annotations

import struct

import pytest

from labkit.config import DatapathConfig
from labkit.datapath import bpf as _bpf
from labkit.datapath import image
from labkit.datapath.source import CGROUP_ATTACH, node_build

from .harness import NODE, TOPO

_SKIP_INFO = ("id", "btf_id", "pad")


def _build():
    """node-a in tunnel routing with every option at labkit's default: socket LB on, so all ten programs."""
    return node_build(TOPO, DatapathConfig(routing="tunnel"), NODE, vxlan_ifindex=7)


@pytest.fixture(scope="module")
def bcc_and_image(_require_bpf):
    """node-a's full build compiled by BCC (programs loaded by BCC) and loaded again from its image."""
    from bcc import BPF

    build = _build()
    bpf = BPF(text=build.text().encode(), cflags=build.cflags())
    functions = {p.function: (BPF.CGROUP_SOCK_ADDR, CGROUP_ATTACH[p.direction]) if p.device == "cgroup"
                 else (BPF.SCHED_CLS, -1) for p in build.programs}
    img = image.Image.from_bytes(image.capture(bpf, functions, "test").to_bytes())
    loaded = image.load(img)
    yield bpf, img, loaded
    loaded.close()
    bpf.cleanup()


def _prog_info(fd: int) -> bytes:
    return image._info(fd, bytes(image._PROG_INFO_SIZE))


def test_maps_are_made_as_bcc_made_them(bcc_and_image):
    """Every map of the image has BCC's type, sizes, flags, name and BTF key/value types; a map-in-map's
    template alone has no BTF, like the inner maps the agent creates (Linux 6.1 refuses an inner map whose
    BTF-derived offsets differ from its template's)."""
    bpf, img, loaded = bcc_and_image
    assert sorted(loaded.maps) == sorted(m.name for m in img.maps)
    templates = {m.inner for m in img.maps if m.inner}
    assert templates == {"labkit_maglev_inner", "labkit_policy_inner"} & {m.name for m in img.maps} != set()
    for spec in img.maps:
        theirs, ours = _bpf.map_info(spec.fd), _bpf.map_info(loaded.maps[spec.name])
        btf = ("btf_key_type_id", "btf_value_type_id")
        for name, _ in _bpf.MapInfo._fields_:
            if name not in _SKIP_INFO and not (spec.name in templates and name in btf):
                assert getattr(ours, name) == getattr(theirs, name), (spec.name, name)
        if spec.name in templates:
            assert (ours.btf_id, ours.btf_key_type_id, ours.btf_value_type_id) == (0, 0, 0), spec.name
            assert theirs.btf_value_type_id, spec.name  # BCC gave it BTF; the image leaves it out
        else:
            assert bool(ours.btf_id) == bool(theirs.btf_id), spec.name


def test_programs_are_the_programs_bcc_loaded(bcc_and_image):
    """Each program's kernel tag (a hash of its instructions, map references aside) equals BCC's, and bpftool
    names it after its C function (BTF func info), as when BCC loads it."""
    bpf, img, loaded = bcc_and_image
    assert sorted(p.name for p in img.progs) == sorted(p.function for p in _build().programs)
    assert len(img.progs) == 10
    for prog in img.progs:
        theirs = _prog_info(bpf.load_func(prog.name.encode(), prog.prog_type, attach_type=prog.attach_type).fd)
        ours = _prog_info(loaded.progs[prog.name])
        assert ours[8:16] == theirs[8:16], f"{prog.name}: tag differs"
        assert struct.unpack_from("=I", ours, 0) == struct.unpack_from("=I", theirs, 0), prog.name  # prog type
        assert ours[64:80] == theirs[64:80], prog.name  # the kernel's 15-byte name
        assert prog.func_info and image._func_info(loaded.progs[prog.name]) == prog.func_info


def test_a_cached_image_loads_without_bcc(bcc_and_image, tmp_path, monkeypatch):
    """load_build takes the cached image when text and flags match: 'cached', nothing compiled."""
    bpf, img, _ = bcc_and_image
    monkeypatch.setenv("LABKIT_BPF_CACHE", str(tmp_path))
    build = _build()
    key = image.image_key(build.text(), build.cflags())
    image.cache_put(image.Image(**{**img.__dict__, "key": key}))
    monkeypatch.setattr(image, "compile_build", lambda *a, **k: pytest.fail("compiled although the image was cached"))
    loaded, how = image.load_build(build)
    try:
        assert how == "cached"
        assert sorted(loaded.progs) == sorted(p.function for p in build.programs)
    finally:
        loaded.close()


def test_an_image_that_does_not_load_is_compiled_again(bcc_and_image, tmp_path, monkeypatch):
    """A cached image the kernel refuses is dropped and the build compiled afresh (and cached anew)."""
    bpf, img, _ = bcc_and_image
    monkeypatch.setenv("LABKIT_BPF_CACHE", str(tmp_path))
    build = _build()
    key = image.image_key(build.text(), build.cflags())
    broken = [image.ProgSpec(p.name, p.prog_type, p.attach_type, p.insns[:8], p.func_info) for p in img.progs]
    image.cache_put(image.Image(**{**img.__dict__, "key": key, "progs": broken}))
    monkeypatch.setattr(image, "compile_build", lambda b, k: image.Image(**{**img.__dict__, "key": k}))
    loaded, how = image.load_build(build)
    try:
        assert how == "compiled"
        assert image.cache_get(key).progs == img.progs
    finally:
        loaded.close()
