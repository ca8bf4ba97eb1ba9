"""`labkit doctor`: the report format and the BCC check."""
from __future__ import annotations

import importlib.util

import pytest

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


def test_cause_sentences_say_what_and_what_to_do():
    """Each known cause is one line: what is wrong, with the facts, then what to run."""
    for line in (doctor.cause("network", "apt-get", "Could not resolve 'm'"),
                 doctor.cause("headers", "6.1.0-9-amd64", "amd64"),
                 doctor.cause("disk", 10, "/", 256, "a lab")):
        assert "\n" not in line and line.endswith("then provision again (vagrant provision; without a VM: sudo make provision)")
    assert "linux-headers-6.1.0-9-amd64" in doctor.cause("headers", "6.1.0-9-amd64", "amd64")
    assert doctor.cause("disk", 10, "/", 256, "a lab").startswith("disk full: 10 MiB free on /, a lab needs 256 MiB")


def test_check_provisioning_repeats_the_line(tmp_path):
    """doctor shows the line provisioning stopped on as a failed 'provisioning' check; no file, no check."""
    status = tmp_path / "provision-failed"
    assert doctor.check_provisioning(str(status)) is None
    line = doctor.cause("network", "apt-get", "Temporary failure resolving 'm'")
    status.write_text(line + "\n")
    c = doctor.check_provisioning(str(status))
    assert c.name == "provisioning" and not c.ok and c.fix == line


def test_check_headers_names_missing_package(monkeypatch, tmp_path):
    """Headers missing and apt without linux-headers-$(uname -r) or the generic package: the fix is the headers
    sentence; with a generic package available the fix is to provision (it wires them)."""
    monkeypatch.setattr(doctor.platform, "release", lambda: "9.9.9-lk-test")
    monkeypatch.setattr(doctor, "_headers_flavour", lambda: "amd64")
    monkeypatch.setattr(doctor, "_apt_has", lambda pkg: False)
    c = doctor.check_headers()
    assert not c.ok and c.fix == doctor.cause("headers", "9.9.9-lk-test", "amd64")
    monkeypatch.setattr(doctor, "_apt_has", lambda pkg: pkg == "linux-headers-amd64")
    assert doctor.check_headers().fix.startswith("sudo bash vagrant/provision.sh")


def test_check_disk_below_need(monkeypatch):
    """Less free space than a lab needs fails with the disk sentence; enough passes."""
    class St:
        f_bavail, f_frsize = 100, 1024 * 1024

    monkeypatch.setattr(doctor.os, "statvfs", lambda p: St())
    c = doctor.check_disk("/", 256)
    assert not c.ok and c.fix == doctor.cause("disk", 100, "/", 256, "a lab")
    assert doctor.check_disk("/", 50).ok


def test_check_cpu_passes_where_numpy_imports():
    """On this machine the notebooks' numpy imports: the cpu check passes."""
    assert doctor.check_cpu().ok


@pytest.mark.parametrize("machine, fix", [("x86_64", "Nehalem"), ("aarch64", "-cpu host")])
def test_check_cpu_names_sigill_and_the_cpu_model_fix(monkeypatch, machine, fix):
    """An import that dies of SIGILL (a CPU model without numpy's baseline, as qemu64) fails with the fix for
    the machine's architecture."""
    monkeypatch.setattr(doctor.platform, "machine", lambda: machine)
    c = doctor.check_cpu("import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    assert not c.ok and "died of SIGILL" in c.detail and fix in c.fix
    assert c.detail.startswith(f"{machine}: ")


def test_tools_are_found_where_root_finds_them(monkeypatch, tmp_path):
    """An ordinary user's PATH has no sbin (Debian): the tools check still finds bpftool and tc where labkitd, which
    runs them, finds them; a tool that is nowhere is named."""
    from labkit.datapath import doctor

    monkeypatch.setenv("PATH", str(tmp_path))
    found = {"bpftool": "/usr/sbin", "tc": "/sbin", "ip": "/bin", "ping": "/bin", "dnsmasq": "/usr/sbin"}

    def which(name, path=None):
        where = found.get(name)
        return f"{where}/{name}" if where and where in (path or "").split(":") else None

    monkeypatch.setattr(doctor.shutil, "which", which)
    assert doctor.check_tools().ok
    found.pop("dnsmasq")
    got = doctor.check_tools()
    assert not got.ok and got.detail == "missing: dnsmasq"
