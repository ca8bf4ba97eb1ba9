"""labkit.datapath.image without the kernel: image files, cache keys, map references moved to new fds."""
from __future__ import annotations

import struct

import pytest

from labkit.datapath import image
from labkit.datapath.image import Image, MapSpec, ProgSpec
from labkit.errors import DatapathError


def _ld_map_fd(dst: int, fd: int) -> bytes:
    """``r<dst> = map fd`` as BCC emits it: a 16-byte ld_imm64 with src_reg BPF_PSEUDO_MAP_FD."""
    return struct.pack("<BBhi", 0x18, (1 << 4) | dst, 0, fd) + struct.pack("<BBhi", 0, 0, 0, 0)


def _mov_imm(dst: int, value: int) -> bytes:
    return struct.pack("<BBhi", 0xB7, dst, 0, value)


EXIT = struct.pack("<BBhi", 0x95, 0, 0, 0)


def _image(**over) -> Image:
    maps = [MapSpec("labkit_maglev_inner", 2, 4, 64, 1, 0, fd=7, btf_key_type_id=3, btf_value_type_id=4),
            MapSpec("cilium_lb4_maglev", 13, 2, 4, 64, 0, fd=8, inner="labkit_maglev_inner")]
    progs = [ProgSpec("cil_from_container", 3, -1, _ld_map_fd(1, 8) + _mov_imm(0, 0) + EXIT, ((0, 42),))]
    return Image(**{"key": "k1", "license": "GPL", "maps": maps, "progs": progs, "btf": b"\x9f\xeb\x01\x00", **over})


def test_image_survives_its_file_format():
    """An image written to bytes reads back equal: maps, instructions, func info, BTF."""
    img = _image()
    assert Image.from_bytes(img.to_bytes()) == img


def test_image_of_another_format_is_refused():
    """An image file of another format version is not read (the cache then compiles afresh)."""
    raw = _image().to_bytes().replace(b'"format": 1', b'"format": 99')
    with pytest.raises(ValueError):
        Image.from_bytes(raw)


def test_relocation_moves_map_fds_only():
    """Map references in ld_imm64 move to the new fds; other instructions, and the second half of ld_imm64, stay."""
    prog = _image().progs[0]
    out = image._relocate(prog, {8: 31, 7: 30})
    assert out[:4] == prog.insns[:4]
    assert struct.unpack_from("<i", out, 4)[0] == 31
    assert out[8:] == prog.insns[8:]


def test_relocation_refuses_an_unknown_map_fd():
    """A map fd the image has no map for is an error naming the program and the instruction."""
    prog = ProgSpec("cil_to_netdev", 3, -1, _mov_imm(0, 0) + _ld_map_fd(2, 99) + EXIT)
    with pytest.raises(DatapathError, match=r"cil_to_netdev: instruction 1 names map fd 99"):
        image._relocate(prog, {8: 31})


def test_map_of_maps_names_its_template():
    """The map of maps records the template INNER_TEMPLATES names for it; other maps name none."""
    specs = [MapSpec("labkit_maglev_inner", 2, 4, 64, 1, 0, fd=7), MapSpec("cilium_lb4_maglev", 13, 2, 4, 64, 0, fd=8),
             MapSpec("cilium_lxc", 1, 4, 16, 64, 0, fd=9)]
    assert [image._with_inner(m, specs).inner for m in specs] == ["", "labkit_maglev_inner", ""]


def test_two_maps_of_maps_each_name_their_own_template():
    """With Maglev and policy in one module, each outer map pairs with its own template, not the other's."""
    specs = [MapSpec("labkit_maglev_inner", 2, 4, 64, 1, 0, fd=7), MapSpec("cilium_lb4_maglev", 13, 2, 4, 64, 0, fd=8),
             MapSpec("labkit_policy_inner", 11, 12, 24, 16384, 1, fd=9), MapSpec("labkit_policy", 13, 4, 4, 256, 0, fd=10)]
    assert [image._with_inner(m, specs).inner for m in specs] == ["", "labkit_maglev_inner", "", "labkit_policy_inner"]


def test_map_of_maps_without_a_template_is_an_error():
    """Without its template among the module's maps, the map of maps cannot be rebuilt: an error, not a guess."""
    outer = MapSpec("cilium_lb4_maglev", 13, 2, 4, 64, 0, fd=8)
    with pytest.raises(DatapathError, match="cilium_lb4_maglev.*labkit_maglev_inner"):
        image._with_inner(outer, [outer])


def test_unknown_map_of_maps_is_an_error():
    """A map of maps INNER_TEMPLATES does not list is refused, even when some '*_inner' map exists."""
    specs = [MapSpec("labkit_maglev_inner", 2, 4, 64, 1, 0, fd=7), MapSpec("labkit_other", 13, 4, 4, 8, 0, fd=8)]
    with pytest.raises(DatapathError, match="labkit_other"):
        image._with_inner(specs[1], specs)


def test_key_changes_with_text_and_flags():
    """Two builds share a key only if text and flags are equal."""
    base = image.image_key("int x;", ["-DA=1"])
    assert base == image.image_key("int x;", ["-DA=1"])
    assert base != image.image_key("int y;", ["-DA=1"])
    assert base != image.image_key("int x;", ["-DA=2"])


def test_cache_keeps_gets_and_drops(tmp_path, monkeypatch):
    """put then get gives the image back; drop forgets it; a damaged file reads as no image."""
    monkeypatch.setenv("LABKIT_BPF_CACHE", str(tmp_path))
    img = _image()
    assert image.cache_get("k1") is None
    image.cache_put(img)
    assert image.cache_get("k1") == img
    assert image.cache_get("k2") is None
    (tmp_path / "k1.json").write_text("{not json")
    assert image.cache_get("k1") is None
    image.cache_put(img)
    image.cache_drop("k1")
    assert image.cache_get("k1") is None
    assert not list(tmp_path.glob(".*.tmp"))


def test_cache_can_be_switched_off(tmp_path, monkeypatch):
    """LABKIT_BPF_CACHE=off keeps nothing and finds nothing."""
    monkeypatch.setenv("LABKIT_BPF_CACHE", "off")
    assert image.cache_dir() is None
    image.cache_put(_image())
    assert image.cache_get("k1") is None
    with image.cache_lock("k1"):
        pass
