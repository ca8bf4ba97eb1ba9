"""The VM's files: line endings on any checkout, the Vagrantfile's Ruby, and provision.sh's failure lines."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VAGRANTFILE = ROOT / "vagrant" / "Vagrantfile"


def _tracked() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def _eol(paths: list[str]) -> dict[str, str]:
    """``git check-attr eol`` of each path: what a checkout writes, whatever core.autocrlf says."""
    out = subprocess.run(["git", "-C", str(ROOT), "check-attr", "-z", "eol", "--", *paths],
                         capture_output=True, check=True).stdout.decode().split("\0")
    return {out[i]: out[i + 2] for i in range(0, len(out) - 2, 3)}


def _runs_on_linux(path: str) -> bool:
    """Files the VM executes or parses: scripts (by suffix or shebang), the Vagrantfile, Python, notebooks."""
    p = ROOT / path
    if path.endswith((".sh", ".py", ".ipynb")) or p.name in ("Vagrantfile", "Makefile"):
        return True
    try:
        with open(p, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def test_gitattributes_keeps_lf_on_every_script():
    """Every tracked shell script (by suffix or shebang), the Vagrantfile, Makefile, Python file and notebook
    is checked out with LF line endings, so a Windows clone with core.autocrlf=true still runs in the VM."""
    want = [p for p in _tracked() if _runs_on_linux(p)]
    assert "vagrant/provision.sh" in want and "vagrant/Vagrantfile" in want and ".ci/run" in want
    eol = _eol(want)
    not_lf = sorted(p for p in want if eol.get(p) != "lf")
    assert not_lf == [], f"not eol=lf in .gitattributes: {not_lf}"


def test_gitattributes_rules_are_explicit():
    """.gitattributes names the shell scripts and the Vagrantfile itself (not only through a catch-all)."""
    rules = [line.split() for line in (ROOT / ".gitattributes").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    by_pattern = {r[0]: r[1:] for r in rules}
    for pattern in ("*.sh", "Vagrantfile", "*.py", "*.ipynb"):
        assert "eol=lf" in by_pattern.get(pattern, []), pattern


def test_vagrantfile_is_valid_ruby():
    """The Vagrantfile parses (`ruby -c`); skipped only where ruby is not installed (it comes with vagrant)."""
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("ruby is not installed (apt-get install vagrant brings it)")
    out = subprocess.run([ruby, "-c", str(VAGRANTFILE)], capture_output=True, text=True)
    assert out.returncode == 0 and "Syntax OK" in out.stdout, out.stderr


def test_vagrantfile_share_needs_no_rsync_when_absent():
    """The share type is chosen per host: rsync when it is on PATH, otherwise the upload of a tarball over
    Vagrant's ssh (no rsync.exe needed); the comment says so."""
    text = VAGRANTFILE.read_text()
    assert 'Vagrant::Util::Which.which("rsync") ? "rsync" : "upload"' in text
    assert 'type: "file", source: SRC_TARBALL' in text
    assert "Windows without rsync.exe" in text


def test_vagrantfile_jupyter_forward():
    """The JupyterLab forward is on the host's loopback with auto_correct, reaches the guest's loopback under
    libvirt, and a trigger after up reports the URL with the port actually forwarded."""
    text = VAGRANTFILE.read_text()
    assert text.count('host_ip: "127.0.0.1", auto_correct: true') == 1
    assert 'host_ip: "127.0.0.1", guest_ip: "127.0.0.1", auto_correct: true' in text
    assert "config.trigger.after [:up, :reload, :resume]" in text
    assert 'provision.call(config, "127.0.0.1")' in text and 'provision.call(override, "0.0.0.0")' in text
