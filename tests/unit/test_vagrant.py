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


# -- provision-lib.sh: one clear line per known cause ------------------------------
LIB = ROOT / "vagrant" / "provision-lib.sh"


def _fake_bin(tmp_path: Path, **scripts: str) -> Path:
    """A directory of fake commands (name → shell body) to put first on PATH."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    for name, body in scripts.items():
        f = d / name.replace("_", "-")
        f.write_text("#!/bin/sh\n" + body + "\n")
        f.chmod(0o755)
    return d


def _lib(tmp_path: Path, script: str, fake: Path) -> subprocess.CompletedProcess:
    """Run ``script`` in bash after sourcing provision-lib.sh, with ``fake`` first on PATH and the status file in
    tmp_path."""
    env = {"PATH": f"{fake}:/usr/bin:/bin", "LABKIT_PROVISION_STATUS": str(tmp_path / "status" / "provision-failed"),
           "LOG": str(tmp_path / "provision.log")}
    return subprocess.run(["bash", "-c", f'set -euo pipefail; . "{LIB}"; {script}'], env=env, capture_output=True,
                          text=True, timeout=30)


def _last_error(proc: subprocess.CompletedProcess) -> str:
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("labkit-provision: error: "), proc.stderr
    return last.removeprefix("labkit-provision: error: ")


def test_full_disk_ends_with_the_disk_line(tmp_path):
    """check_disk with df reporting 100 MiB free stops with exit 1 and, last, doctor's disk sentence; the same
    line is left in the status file doctor reads."""
    from labkit.datapath.doctor import cause

    fake = _fake_bin(tmp_path, df='printf "Filesystem 1048576-blocks Used Available Capacity Mounted on\\n'
                                  '/dev/vda1 20000 19900 100 100%% /\\n"')
    proc = _lib(tmp_path, 'check_disk / 1536; echo "not reached"', fake)
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    want = cause("disk", 100, "/", 1536, "provisioning")
    assert _last_error(proc) == want
    assert (tmp_path / "status" / "provision-failed").read_text().strip() == want


def test_enough_disk_goes_on(tmp_path):
    """check_disk with enough room returns and writes no status."""
    fake = _fake_bin(tmp_path, df='printf "Filesystem 1048576-blocks Used Available Capacity Mounted on\\n'
                                  '/dev/vda1 20000 100 19900 1%% /\\n"')
    proc = _lib(tmp_path, 'check_disk / 1536; echo "went on"', fake)
    assert proc.returncode == 0 and proc.stdout.strip() == "went on"
    assert not (tmp_path / "status").exists()


def test_no_network_ends_with_the_network_line(tmp_path):
    """apt-get update that cannot resolve the mirror (exit 0, as apt does) and an install that then fails end with
    doctor's network sentence quoting apt's own words."""
    from labkit.datapath.doctor import cause

    fake = _fake_bin(tmp_path, apt_get='case " $* " in\n'
                     '  *" update "*) echo "Err:1 http://mirror.invalid bookworm InRelease"; '
                     'echo "  Temporary failure resolving \'mirror.invalid\'"; exit 0;;\n'
                     '  *) echo "E: Unable to locate package bpftool" >&2; exit 100;;\nesac')
    proc = _lib(tmp_path, "apt_update; apt_install bpftool; echo not reached", fake)
    assert proc.returncode == 1 and "not reached" not in proc.stdout
    assert _last_error(proc) == cause("network", "apt-get", "Temporary failure resolving 'mirror.invalid'")


def test_install_failure_with_network_is_not_the_network_line(tmp_path):
    """An install failure after a good apt-get update is not blamed on the network: apt_install returns 1."""
    fake = _fake_bin(tmp_path, apt_get='case " $* " in *" update "*) echo "Hit:1 http://m bookworm InRelease";;'
                                       ' *) exit 100;; esac')
    proc = _lib(tmp_path, "apt_update; apt_install nosuch || echo returned $?", fake)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("returned 1")


def test_no_headers_package_ends_with_the_headers_line(tmp_path):
    """With the mirror reachable but no headers package, die_headers gives doctor's headers sentence."""
    from labkit.datapath.doctor import cause

    proc = _lib(tmp_path, "die_headers 6.1.0-99-amd64 amd64", _fake_bin(tmp_path))
    assert proc.returncode == 1
    assert _last_error(proc) == cause("headers", "6.1.0-99-amd64", "amd64")


def test_no_headers_because_no_network_names_the_network(tmp_path):
    """When apt-get update could not reach the mirror, missing headers are reported as the network problem."""
    from labkit.datapath.doctor import cause

    proc = _lib(tmp_path, "APT_NET_ERROR='Could not resolve host: x'; die_headers 6.1.0-99-amd64 amd64",
                _fake_bin(tmp_path))
    assert _last_error(proc) == cause("network", "apt-get", "Could not resolve host: x")


def test_apt_candidate_reads_policy(tmp_path):
    """apt_candidate is true for a package with a Candidate version, false for '(none)' or no output."""
    fake = _fake_bin(tmp_path, apt_cache='case "$2" in\n  good) printf "good:\\n  Installed: (none)\\n  Candidate: 1.0\\n";;\n'
                                         '  none) printf "none:\\n  Installed: (none)\\n  Candidate: (none)\\n";;\nesac')
    proc = _lib(tmp_path, "for p in good none empty; do apt_candidate $p && echo $p:yes || echo $p:no; done", fake)
    assert proc.stdout.split() == ["good:yes", "none:no", "empty:no"]


def test_provision_sources_the_lib_and_clears_the_status():
    """provision.sh takes its failure functions from provision-lib.sh and clears the status line when it finishes."""
    text = (ROOT / "vagrant" / "provision.sh").read_text()
    assert '. "$REPO/vagrant/provision-lib.sh"' in text
    assert "provision_ok\nstep finished" in text
    for fn in ("apt_update()", "apt_install()", "die()"):
        assert fn not in text, f"{fn} is defined in provision-lib.sh only"
