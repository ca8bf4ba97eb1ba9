"""`labkit doctor`: the report format and the BCC check."""
from __future__ import annotations

import importlib.util

from labkit.datapath import doctor
from labkit.datapath.doctor import Check, format_checks


def test_format_checks_layout():
    """Each check is one line: ok/FAIL, name, detail; a failing check adds an indented 'fix:' line."""
    checks = [
        Check("kernel", True, "6.1.0 (>= 5.10)"),
        Check("bpffs", False, "/sys/fs/bpf is not a bpf mount", "mount -t bpf bpf /sys/fs/bpf"),
        Check("compile+attach", True, "fine"),
    ]
    lines = format_checks(checks).split("\n")
    assert len(lines) == 4
    assert lines[0].split() == ["ok", "kernel", "6.1.0", "(>=", "5.10)"]
    assert lines[1].split()[:2] == ["FAIL", "bpffs"] and lines[1].endswith("/sys/fs/bpf is not a bpf mount")
    assert lines[2].lstrip() == "fix: mount -t bpf bpf /sys/fs/bpf" and lines[2][0] == " "
    assert lines[3].split()[:2] == ["ok", "compile+attach"]
    # details start in one column, and the fix sits under them
    col = lines[0].index("6.1.0")
    assert lines[1].index("/sys") == col == lines[3].index("fine") == lines[2].index("fix:")
    assert lines[0].index("kernel") == lines[1].index("bpffs") == lines[3].index("compile+attach")


def test_format_checks_empty():
    """No checks format to an empty report."""
    assert format_checks([]) == ""


def test_check_to_json():
    """to_json gives name/ok/detail and fix (None when empty)."""
    assert Check("btf", True, "d").to_json() == {"name": "btf", "ok": True, "detail": "d", "fix": None}
    assert Check("btf", False, "d", "f").to_json()["fix"] == "f"


def test_check_bcc_missing(monkeypatch):
    """Without an importable bcc the check fails and the fix names python3-bpfcc."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    c = doctor.check_bcc()
    assert c.name == "bcc" and c.ok is False
    assert "python3-bpfcc" in c.fix
    assert "bcc" in c.detail


def test_check_bcc_present(monkeypatch):
    """A bcc from the distribution's dist-packages passes and says so."""
    class Spec:
        origin = "/usr/lib/python3/dist-packages/bcc/__init__.py"

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: Spec())
    c = doctor.check_bcc()
    assert c.ok and c.fix == "" and "python3-bpfcc" in c.detail
