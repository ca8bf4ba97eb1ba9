"""The VM's files: line endings on any checkout, the Vagrantfile's Ruby, provision.sh's failure lines, its services
(labkitd as root, JupyterLab as the learner) and answer keys, and the Makefile's labkitd for make test/lab/bench."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VAGRANTFILE = ROOT / "vagrant" / "Vagrantfile"
#: Loads the Vagrantfile with a stand-in for Vagrant: what it configures, or its trigger run on a fake machine.
TRIGGER_HARNESS = ROOT / "tests" / "unit" / "data" / "vagrantfile_trigger.rb"


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


def _configured(tmp_path: Path, *argv: str, no_rsync: bool = False) -> list[dict]:
    """What the Vagrantfile configures (each call: name, args, keywords), loaded as ``vagrant ARGV`` would from
    a copy of the repo's layout in tmp_path."""
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("ruby is not installed (apt-get install vagrant brings it)")
    import json
    import os

    repo = tmp_path / "repo"
    (repo / "vagrant").mkdir(parents=True)
    shutil.copy(VAGRANTFILE, repo / "vagrant" / "Vagrantfile")
    (repo / "vagrant" / "provision.sh").write_text("#!/bin/bash\n")
    (repo / "labs").mkdir()
    (repo / "labs" / "01-tour.ipynb").write_text("{}")
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text("[core]\n")
    (repo / "labkit" / "__pycache__").mkdir(parents=True)
    (repo / "labkit" / "__pycache__" / "x.pyc").write_bytes(b"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    if no_rsync:
        env["NO_RSYNC"] = "1"
    out = subprocess.run([ruby, str(TRIGGER_HARNESS), "--config", str(repo / "vagrant" / "Vagrantfile"), *argv],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_vagrantfile_shares_with_rsync_when_it_is_on_path(tmp_path):
    """With rsync on PATH the repo root is an rsync share at /home/vagrant/labkit, .git and caches excluded,
    and no tarball is uploaded."""
    calls = _configured(tmp_path, "up")
    shares = [c for c in calls if c["call"] == "synced_folder" and c["args"][0] == ".."]
    assert len(shares) == 1 and shares[0]["args"][1] == "/home/vagrant/labkit"
    assert shares[0]["kw"]["type"] == "rsync" and ".git/" in shares[0]["kw"]["rsync__exclude"]
    assert "/instructor" in shares[0]["kw"]["rsync__exclude"]  # the answer keys: a share of their own
    assert not any(c["call"] == "provision" and c["args"][0] == "labkit-source" for c in calls)
    assert not (tmp_path / "repo" / "vagrant" / ".vagrant").exists()


def test_vagrantfile_keeps_the_answer_keys_from_vagrant(tmp_path):
    """instructor/ is an rsync share of its own, out of the repo share's chown to vagrant (Vagrant's chown skips
    excluded paths), synced root's with directories 0750 and files 0640 and not chowned afterwards, so a
    `vagrant reload` or `vagrant rsync` does not hand the answer keys back to vagrant."""
    calls = _configured(tmp_path, "up")
    [keys] = [c for c in calls if c["call"] == "synced_folder" and c["args"][0] == "../instructor"]
    assert keys["args"][1] == "/home/vagrant/labkit/instructor"
    assert keys["kw"]["type"] == "rsync" and keys["kw"]["rsync__chown"] is False
    args = keys["kw"]["rsync__args"]
    assert "--chmod=D0750,F0640" in args and "--delete" in args and "--archive" in args
    no_rsync = _configured(tmp_path / "upload", "up", no_rsync=True)
    assert not [c for c in no_rsync if c["call"] == "synced_folder" and c["args"][0] == "../instructor"]


def test_vagrantfile_uploads_a_tarball_without_rsync(tmp_path):
    """Without rsync (Windows without rsync.exe) `vagrant up` needs none: no rsync share; the repo is packed
    (without .git and caches) and uploaded by a file provisioner, which the labkit provisioner unpacks."""
    import tarfile

    calls = _configured(tmp_path, "up", no_rsync=True)
    assert not any(c["call"] == "synced_folder" and c["args"][0] == ".." for c in calls)
    [upload] = [c for c in calls if c["call"] == "provision" and c["args"][0] == "labkit-source"]
    src = Path(upload["kw"]["source"])
    assert upload["kw"]["type"] == "file" and src == tmp_path / "repo" / "vagrant" / ".vagrant" / "labkit-src.tar.gz"
    with tarfile.open(src) as tar:
        names = sorted(tar.getnames())
    assert "labs/01-tour.ipynb" in names and "vagrant/provision.sh" in names
    assert not [n for n in names if ".git" in n.split("/") or "__pycache__" in n or ".vagrant" in n]
    provs = [c for c in calls if c["call"] == "provision" and c["args"][0] == "labkit"]  # + VirtualBox's override
    assert provs and all("tar -xzf /tmp/labkit-src.tar.gz" in c["kw"]["inline"] for c in provs)


def _provider_at(calls: list[dict], name: str) -> int:
    """Index of the ``config.vm.provider NAME`` call; the provider's own settings are the calls after it."""
    [i] = [i for i, c in enumerate(calls) if c["call"] == "provider" and c["args"] == [name]]
    return i


def test_vagrantfile_jupyter_forward(tmp_path):
    """JupyterLab's forward is on the host's loopback with auto_correct; under libvirt it ends at the guest's
    loopback and JupyterLab binds 127.0.0.1, under VirtualBox (NAT only) 0.0.0.0; a trigger after
    up/reload/resume reports the URL."""
    calls = _configured(tmp_path, "up")
    vbox, libvirt, qemu = (_provider_at(calls, p) for p in ("virtualbox", "libvirt", "qemu"))
    assert vbox < libvirt < qemu

    def forwards(part):
        return [c["kw"] for c in part if c["call"] == "network" and c["args"] == ["forwarded_port"]]

    def jupyter_ip(part):
        return [c["kw"]["env"]["LABKIT_JUPYTER_IP"] for c in part if c["call"] == "provision" and c["args"] == ["labkit"]]

    [base] = forwards(calls[:vbox])
    assert base == {"id": "jupyter", "guest": 8888, "host": 8888, "host_ip": "127.0.0.1", "auto_correct": True}
    [lv] = forwards(calls[libvirt:qemu])
    assert lv == {**base, "guest_ip": "127.0.0.1"}
    assert jupyter_ip(calls[:vbox]) == ["127.0.0.1"] and jupyter_ip(calls[vbox:libvirt]) == ["0.0.0.0"]
    assert {"call": "after", "args": [["up", "reload", "resume"]], "kw": {}} in calls


def test_vagrantfile_qemu_provider_for_apple_silicon(tmp_path):
    """The qemu provider (vagrant-qemu, Apple Silicon) runs an aarch64 `virt` machine under HVF with the host's
    CPU, 2 vCPUs and 4G, virtio-net on the MMIO bus, edk2 from Homebrew's QEMU unless LABKIT_QEMU_DIR says
    otherwise, and JupyterLab bound to 0.0.0.0 (the forward ends on QEMU's user-mode NAT address)."""
    calls = _configured(tmp_path, "up")
    qemu = _provider_at(calls, "qemu")
    end = next(i for i, c in enumerate(calls) if i > qemu and c["call"] == "trigger")
    mine = calls[qemu + 1:end]
    settings = {c["call"].removesuffix("="): c["args"][0] for c in mine if c["call"].endswith("=")}
    assert settings == {"arch": "aarch64", "machine": "virt,accel=hvf,highmem=on", "cpu": "host", "smp": 2,
                        "memory": "4G", "net_device": "virtio-net-device", "qemu_dir": "/opt/homebrew/share/qemu",
                        "ssh_auto_correct": True}
    [ip] = [c["kw"]["env"]["LABKIT_JUPYTER_IP"] for c in mine if c["call"] == "provision" and c["args"] == ["labkit"]]
    assert ip == "0.0.0.0"
    assert not [c for c in mine if c["call"] == "network"], "the base forward (host 127.0.0.1, no guest_ip) applies"


def test_build_box_refuses_an_unknown_arch(tmp_path):
    """build-box.sh builds amd64 (libvirt) or arm64 (vagrant-qemu) boxes; any other ARCH ends with one line
    naming what it got and what it takes, before it makes a disk."""
    import os

    if os.geteuid() != 0:
        pytest.skip("build-box.sh checks for root first")
    out = subprocess.run(["bash", str(ROOT / "vagrant" / "build-box.sh"), str(tmp_path / "x.box")],
                         env={**os.environ, "ARCH": "mips"}, capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == "labkit-build-box: error: ARCH=mips: expected amd64 or arm64"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", ["build-box.sh", "arm64-test.sh", "arm64-rootfs.sh", "arm64-init.sh", "chroot-lib.sh", "vm-test.sh",
                                    "provision.sh", "provision-lib.sh"])
def test_vm_scripts_parse(script):
    """The box and VM scripts are valid bash (`bash -n`)."""
    out = subprocess.run(["bash", "-n", str(ROOT / "vagrant" / script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


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


def test_apt_step_failing_without_network_names_the_network(tmp_path):
    """An apt step that cannot go on (no bpftool candidate, an install failing) after apt-get update could not
    reach the mirror ends with the network sentence; with the mirror reached, with its own message."""
    from labkit.datapath.doctor import cause

    proc = _lib(tmp_path, "APT_NET_ERROR='Temporary failure resolving m'; die_apt 'no installable bpftool package'",
                _fake_bin(tmp_path))
    assert _last_error(proc) == cause("network", "apt-get", "Temporary failure resolving m")
    (tmp_path / "status" / "provision-failed").unlink()
    proc = _lib(tmp_path, "die_apt 'no installable bpftool package'", _fake_bin(tmp_path))
    assert _last_error(proc) == "no installable bpftool package"
    assert not (tmp_path / "status" / "provision-failed").exists()


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


# -- the Vagrantfile's trigger after up: the URL, or why the forward failed -----------------
GOOD = "0123456789abcdef0123456789abcdef"


class _Jupyter:
    """A stand-in for a Jupyter server on 127.0.0.1: /api/status answers 200 with JSON for ``token``, else 403."""

    def __init__(self, token: str):
        import http.server
        import threading

        want = token

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                ok = self.path == f"/api/status?token={want}"
                body = b'{"started": "now"}' if ok else b'{"message": "Forbidden"}'
                self.send_response(200 if ok else 403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _trigger(port: int, token: str, data_dir: Path) -> str:
    ruby = shutil.which("ruby")
    if ruby is None:
        pytest.skip("ruby is not installed (apt-get install vagrant brings it)")
    out = subprocess.run([ruby, str(TRIGGER_HARNESS), str(VAGRANTFILE), str(port), token, str(data_dir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_trigger_prints_the_url_when_this_vms_jupyter_answers(tmp_path):
    """When the forwarded port answers 200 to this VM's token, the trigger prints the URL with that port."""
    srv = _Jupyter(GOOD)
    try:
        out = _trigger(srv.port, GOOD, tmp_path)
    finally:
        srv.close()
    assert f"SUCCESS labkit: JupyterLab: http://127.0.0.1:{srv.port}/lab?token={GOOD}" in out.splitlines()
    assert "ERROR" not in out


def test_trigger_says_another_server_holds_the_port(tmp_path):
    """When another server holds the port (it refuses this VM's token), the trigger says the forward FAILED,
    quotes the forward's log and says how to pick another port; it prints no URL."""
    srv = _Jupyter("f" * 32)
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / f"ssh-forwarding-127.0.0.1_{srv.port}-127.0.0.1_8888.log"
    log.write_text(f"bind [127.0.0.1]:{srv.port}: Address already in use\n")
    try:
        out = _trigger(srv.port, GOOD, tmp_path)
    finally:
        srv.close()
    [line] = [l for l in out.splitlines() if l.startswith("ERROR")]
    assert f"the JupyterLab forward FAILED: 127.0.0.1:{srv.port} answers HTTP 403" in line
    assert str(log) in line and "Address already in use" in line
    assert f"LABKIT_JUPYTER_PORT={srv.port + 1} vagrant reload" in line
    assert "SUCCESS" not in out


def test_trigger_says_nothing_answers(tmp_path):
    """When nothing listens on the forwarded port, the trigger says it does not answer."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _trigger(port, GOOD, tmp_path)
    assert f"ERROR labkit: the JupyterLab forward FAILED: 127.0.0.1:{port} does not answer" in out


def test_trigger_without_token_says_provisioning_did_not_finish(tmp_path):
    """A VM without a JupyterLab token (provisioning stopped) gets that said, not a URL."""
    out = _trigger(8888, "", tmp_path)
    assert "provisioning did not finish" in out and "SUCCESS" not in out


# -- JupyterLab's settings: widget state saved with notebooks ----------------------------
LAB_SETTINGS = ROOT / "vagrant" / "lab-settings.py"
LAB_DEFAULTS = ROOT / "vagrant" / "jupyterlab-overrides.json"


def _lab_settings(target: Path, defaults: Path = LAB_DEFAULTS) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-I", str(LAB_SETTINGS), str(defaults), str(target)],
                          capture_output=True, text=True, timeout=30)


def test_lab_defaults_save_widget_state():
    """labkit's JupyterLab defaults turn on @jupyter-widgets/jupyterlab-manager's saveState (off by default)."""
    import json

    assert json.loads(LAB_DEFAULTS.read_text()) == {"@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True}}


def test_lab_settings_writes_then_leaves_alone(tmp_path):
    """lab-settings.py makes overrides.json (and its folder) with the defaults, and a second run changes nothing."""
    import json

    target = tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    first = _lab_settings(target)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("done (") and "saveState=true" in first.stdout
    assert json.loads(target.read_text()) == json.loads(LAB_DEFAULTS.read_text())
    mtime = target.stat().st_mtime_ns
    second = _lab_settings(target)
    assert second.returncode == 0 and second.stdout.startswith("ok (")
    assert target.stat().st_mtime_ns == mtime and oct(target.stat().st_mode & 0o777) == "0o644"


def test_lab_settings_keeps_other_settings(tmp_path):
    """Settings already in overrides.json (other plugins, other keys of the same plugin) are kept; a wrong
    saveState is corrected."""
    import json

    target = tmp_path / "overrides.json"
    target.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
                                  "@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": False, "x": 1}}))
    out = _lab_settings(target)
    assert out.returncode == 0 and out.stdout.startswith("done (")
    assert json.loads(target.read_text()) == {
        "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
        "@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": True, "x": 1}}


def test_lab_settings_refuses_a_broken_file(tmp_path):
    """A target that is not JSON is reported by path and left as it was."""
    target = tmp_path / "overrides.json"
    target.write_text("{not json")
    out = _lab_settings(target)
    assert out.returncode == 1 and f"{target}: expected JSON" in out.stderr
    assert target.read_text() == "{not json"


def test_server_defaults_set_the_widget_state_hook():
    """labkit's Jupyter server settings run labkit's widget-state hook before every save, by an importable name."""
    import importlib
    import json

    config = json.loads((ROOT / "vagrant" / "jupyter-server-labkit.json").read_text())
    assert config == {"ContentsManager": {"pre_save_hook": "labkit.notebook.widgetstate.keep_widget_state"}}
    module, name = config["ContentsManager"]["pre_save_hook"].rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module), name))


def test_provision_sets_the_lab_defaults_in_the_venv():
    """provision.sh merges the repo's JupyterLab defaults into the venv's overrides.json and its server settings into
    the venv's jupyter_server_config.json, after installing labkit and JupyterLab."""
    text = (ROOT / "vagrant" / "provision.sh").read_text()
    assert 'LAB_OVERRIDES="$VENV/share/jupyter/lab/settings/overrides.json"' in text
    assert 'SERVER_CONFIG="$VENV/etc/jupyter/jupyter_server_config.json"' in text
    script = '"$VENV/bin/python" -I "$REPO/vagrant/lab-settings.py"'
    for defaults, target in (("jupyterlab-overrides.json", "$LAB_OVERRIDES"), ("jupyter-server-labkit.json", "$SERVER_CONFIG")):
        call = f'{script} "$REPO/vagrant/{defaults}" "{target}"'
        assert call in text and text.index("\nstep_pip\n") < text.index(call)


# -- services: labkitd as root, JupyterLab as the learner ------------------------------------
LABKITD_UNIT = ROOT / "vagrant" / "labkitd.service"
PROVISION = ROOT / "vagrant" / "provision.sh"


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit's settings: section → key → every value given (Environment= may repeat)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        section.setdefault(key, []).append(value)
    return out


def _rendered_labkitd(tmp_path: Path, venv: str) -> str:
    proc = _lib(tmp_path, f'labkitd_unit "{LABKITD_UNIT}" "{venv}"', _fake_bin(tmp_path))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_labkitd_unit_runs_labkitd_as_root_and_spares_the_labs(tmp_path):
    """labkitd's unit, rendered for a venv: root runs `python -m labkit labkitd run` (per-request lines kept for
    journald), restarted on failure; /run/labkitd is made 0755 and kept when it stops (the evidence lives there);
    stopping it stops labkitd alone (KillMode=process: the labs' agents and pod processes go on); after the
    network, wanted by multi-user.target."""
    import sys

    from labkit.__main__ import PROGRAMS

    text = _rendered_labkitd(tmp_path, "/opt/labkit/venv")
    assert "@VENV@" not in text
    unit = _unit(text)
    svc = unit["Service"]
    assert svc["User"] == ["root"] and svc["Type"] == ["simple"]
    assert svc["ExecStart"] == ["/opt/labkit/venv/bin/python -m labkit labkitd run"]
    argv = svc["ExecStart"][0].split()
    assert argv[1:3] == ["-m", "labkit"] and PROGRAMS[argv[3]] == "labkit.door.daemon:main" and argv[4:] == ["run"]
    assert svc["KillMode"] == ["process"] and svc["Restart"] == ["on-failure"]
    assert svc["RuntimeDirectory"] == ["labkitd"] and svc["RuntimeDirectoryMode"] == ["0755"]
    assert svc["RuntimeDirectoryPreserve"] == ["yes"]
    assert svc["WorkingDirectory"] == ["/"]
    assert "network.target" in unit["Unit"]["After"][0].split()
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    analyze = shutil.which("systemd-analyze")
    if analyze:  # systemd's own reading of it (works without systemd running)
        f = tmp_path / "unit" / "labkitd.service"
        f.parent.mkdir()
        f.write_text(_rendered_labkitd(tmp_path, sys.prefix))
        out = subprocess.run([analyze, "verify", str(f)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr  # (newer systemd warns of KillMode=process: that is chosen)


def test_labkitd_unit_drops_a_windows_checkouts_crs(tmp_path):
    """A template checked out with CRLF renders with LF alone (systemd would keep the CR in each value)."""
    crlf = tmp_path / "labkitd.service"
    crlf.write_bytes(LABKITD_UNIT.read_bytes().replace(b"\n", b"\r\n"))
    proc = _lib(tmp_path, f'labkitd_unit "{crlf}" /v', _fake_bin(tmp_path))
    assert "\r" not in proc.stdout and "ExecStart=/v/bin/python -m labkit labkitd run\n" in proc.stdout


def _jupyter_unit(tmp_path: Path, user: str, group: str, home: str) -> dict:
    script = ('REPO=/home/vagrant/labkit VENV=/opt/labkit/venv JUPYTER_PORT=8888 JUPYTER_ENV_FILE=/etc/labkit/jupyter.env; '
              f'jupyter_unit {user} {group} {home} 127.0.0.1 /home/vagrant/work')
    proc = _lib(tmp_path, script, _fake_bin(tmp_path))
    assert proc.returncode == 0, proc.stderr
    return _unit(proc.stdout)


def test_jupyter_unit_runs_as_the_learner(tmp_path):
    """JupyterLab's unit for the VM's learner: User=vagrant, Group= their group, HOME theirs, no --allow-root; it
    starts after labkitd and pulls it in; the token comes from the environment file, not the command line."""
    unit = _jupyter_unit(tmp_path, "vagrant", "vagrant", "/home/vagrant")
    svc = unit["Service"]
    assert svc["User"] == ["vagrant"] and svc["Group"] == ["vagrant"]
    assert '"HOME=/home/vagrant"' in svc["Environment"]
    assert svc["EnvironmentFile"] == ["/etc/labkit/jupyter.env"]
    [start] = svc["ExecStart"]
    assert start.startswith('"/opt/labkit/venv/bin/jupyter" lab --ip=127.0.0.1 --port=8888 --no-browser ')
    assert "--allow-root" not in start and "token" not in start.lower()
    assert "labkitd.service" in unit["Unit"]["After"][0].split()
    assert "labkitd.service" in unit["Unit"]["Wants"][0].split()


def test_jupyter_unit_allows_root_only_for_root(tmp_path):
    """A bare host's service (no learner named) runs as root, and only then with --allow-root."""
    svc = _jupyter_unit(tmp_path, "root", "root", "/root")["Service"]
    assert svc["User"] == ["root"] and " --allow-root " in svc["ExecStart"][0]


def test_provision_runs_jupyter_as_the_work_user_and_keeps_the_token_theirs():
    """provision.sh renders JupyterLab's unit for LABKIT_WORK_USER (root when unset) with that user's group and
    home, gives them the token file (0600) and keeps the environment file systemd reads root's (0600)."""
    text = PROVISION.read_text()
    assert 'local user="${WORK_USER:-root}" group home' in text
    assert 'group="$(id -gn "$user")"' in text and 'getent passwd "$user" | cut -d: -f6' in text
    assert 'write_if_changed "$UNIT_FILE" "$(jupyter_unit "$user" "$group" "$home" "$ip" "$root")"' in text
    assert 'chown "$user:$group" "$TOKEN_FILE"' in text and 'chown root:root "$JUPYTER_ENV_FILE"' in text
    assert 'chmod 600 "$TOKEN_FILE" "$JUPYTER_ENV_FILE"' in text
    assert "--allow-root" not in text  # only jupyter_unit (provision-lib.sh) decides it


def test_provision_step_order():
    """The instructors' group is made before the answer keys are given to it, labkitd is installed after labkit
    itself and before the work folder and JupyterLab, which wants it."""
    text = PROVISION.read_text()
    order = ["\nstep_pip\n", "step check ", 'out="$(ensure_group "$INSTRUCTORS_GROUP")"', "\nstep_answer_keys\n",
             "\nstep_labkitd\n", "\nstep_work\n", "    step_jupyter_service\n", "provision_ok\nstep finished"]
    at = [text.index(s) for s in order]
    assert at == sorted(at)
    assert "start labkitd with: sudo labkit daemon start" in text  # the step line without systemd


def _systemctl(tmp_path: Path, *, enabled: bool, active: bool) -> Path:
    log = tmp_path / "systemctl.log"
    return _fake_bin(tmp_path, systemctl=f'echo "$*" >> "{log}"\n'
                                         f'case "$1" in is-enabled) exit {0 if enabled else 1};; '
                                         f'is-active) exit {0 if active else 1};; esac\nexit 0')


@pytest.mark.parametrize("changed, enabled, active, want, calls", [
    (1, True, True, "done", ["daemon-reload", "enable -q labkitd", "restart labkitd"]),
    (0, True, True, "ok", ["is-enabled -q labkitd", "is-active -q labkitd"]),
    (0, True, False, "done", ["is-enabled -q labkitd", "is-active -q labkitd", "enable -q --now labkitd"]),
    (0, False, False, "done", ["is-enabled -q labkitd", "enable -q --now labkitd"]),
])
def test_service_up_restarts_only_on_change(tmp_path, changed, enabled, active, want, calls):
    """service_up restarts a service only when its unit or code changed; a service running as it should is left
    alone ("ok"); one not enabled or not running is enabled and started."""
    fake = _systemctl(tmp_path, enabled=enabled, active=active)
    proc = _lib(tmp_path, f"service_up labkitd {changed}", fake)
    assert proc.returncode == 0 and proc.stdout.strip() == want, proc.stderr
    assert (tmp_path / "systemctl.log").read_text().splitlines() == calls


def test_service_up_fails_when_systemd_does(tmp_path):
    """A failed restart is service_up's failure, though it runs in a command substitution (no set -e there)."""
    fake = _fake_bin(tmp_path, systemctl='[ "$1" = restart ] && exit 1; exit 0')
    proc = _lib(tmp_path, 'state="$(service_up labkitd 1)" || echo "failed: $state"', fake)
    assert proc.stdout.strip() == "failed:"


def test_source_digest_follows_the_code(tmp_path):
    """The digest labkitd's restart follows changes when a module changes and not when nothing did."""
    pkg = tmp_path / "labkit"
    (pkg / "door").mkdir(parents=True)
    (pkg / "door" / "daemon.py").write_text("x = 1\n")

    def digest() -> str:
        proc = _lib(tmp_path, f'source_digest "{pkg}"', _fake_bin(tmp_path))
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    first = digest()
    assert len(first) == 16 and digest() == first
    (pkg / "door" / "daemon.py").write_text("x = 2\n")
    assert digest() != first


# -- the instructors' group and the answer keys ----------------------------------------------
def test_instructors_group_made_once(tmp_path):
    """ensure_group makes labkit-instructors as a system group when getent does not know it, and does nothing
    when it exists; no one is added to it."""
    log = tmp_path / "groupadd.log"
    fake = _fake_bin(tmp_path, getent="exit 2", groupadd=f'echo "$*" >> "{log}"')
    proc = _lib(tmp_path, "ensure_group", fake)
    assert proc.stdout.strip() == "done" and log.read_text().splitlines() == ["--system labkit-instructors"]
    log.unlink()
    fake = _fake_bin(tmp_path, getent='echo "labkit-instructors:x:998:"', groupadd=f'echo "$*" >> "{log}"')
    proc = _lib(tmp_path, "ensure_group", fake)
    assert proc.stdout.strip() == "ok" and not log.exists()


def test_answer_keys_locked_from_the_learner(tmp_path):
    """lock_answer_keys makes instructor/ root:GROUP, directories 0750 and files 0640 ("done"), and a second run
    finds nothing to do ("ok")."""
    import grp
    import os
    import stat

    if os.geteuid() != 0:
        pytest.skip("chown to root needs root")
    group = grp.getgrgid(os.getgid()).gr_name if os.getgid() != 0 else "nogroup"
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        pytest.skip(f"no group {group} here")
    keys = tmp_path / "instructor"
    (keys / "answers").mkdir(parents=True)
    (keys / "GRADING.md").write_text("x")
    (keys / "answers" / "01.json").write_text("{}")
    for p in (keys, keys / "answers"):
        p.chmod(0o755)
    proc = _lib(tmp_path, f'lock_answer_keys "{keys}" {group}', _fake_bin(tmp_path))
    assert proc.returncode == 0 and proc.stdout.strip() == "done", proc.stderr
    for p in (keys, keys / "answers", keys / "GRADING.md", keys / "answers" / "01.json"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (0, gid)
        assert stat.S_IMODE(st.st_mode) == (0o750 if p.is_dir() else 0o640), p
    proc = _lib(tmp_path, f'lock_answer_keys "{keys}" {group}', _fake_bin(tmp_path))
    assert proc.stdout.strip() == "ok"


def test_provision_locks_the_keys_only_for_a_learner():
    """provision.sh locks instructor/ only where a learner is named (the VM); a developer's checkout is left as it
    is."""
    text = PROVISION.read_text()
    body = text[text.index("step_answer_keys() {"):text.index("\nstep_answer_keys\n")]
    assert 'if [ -z "$WORK_USER" ]; then' in body and 'lock_answer_keys "$dir" "$INSTRUCTORS_GROUP"' in body


# -- the Makefile: make test, lab and bench with a labkitd --------------------------------------
MAKEFILE = ROOT / "Makefile"
TEST_LINE = "$(PY) -m pytest tests -ra -n auto --dist loadfile"


def _fake_venv(tmp_path: Path) -> Path:
    """A venv whose python logs each call and plays labkitd (status answers while 'running' exists; start makes
    it, or fails when 'start-fails' exists; stop removes it), and whose other commands (pytest, bench, jupyter)
    log whether labkitd answered while they ran and exit $FAKE_RC."""
    bin_ = tmp_path / "venv" / "bin"
    bin_.mkdir(parents=True)
    state = tmp_path / "state"
    state.mkdir()
    body = f"""#!/bin/sh
echo "$(basename "$0") $*" >> "{state}/calls"
case "$*" in
    "-m labkit labkitd status") [ -e "{state}/running" ]; exit $? ;;
    "-m labkit labkitd start") [ -e "{state}/start-fails" ] && exit 1; touch "{state}/running"; exit 0 ;;
    "-m labkit labkitd stop") rm -f "{state}/running"; exit 0 ;;
esac
[ -e "{state}/running" ] && echo "  (labkitd answering)" >> "{state}/calls"
exit "${{FAKE_RC:-0}}"
"""
    for name in ("python", "jupyter"):
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    return state


def _make(tmp_path: Path, target: str, rc: int = 0) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``make TARGET`` of the repo's Makefile with the fake venv, its provisioning taken as done."""
    import os

    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["FAKE_RC"] = str(rc)
    proc = subprocess.run([make, "-s", "-C", str(ROOT), "-o", "provision", "-o", "provision-dev",
                           f"VENV={tmp_path / 'venv'}", target], env=env, capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "state" / "calls").read_text().splitlines()
    return proc, calls


def test_make_test_keeps_its_pytest_line():
    """make test still runs THE pytest command line, wrapped, after provision-dev."""
    text = MAKEFILE.read_text()
    assert f"test: provision-dev\n\t$(call with_labkitd,{TEST_LINE})\n" in text


def test_make_test_starts_labkitd_and_stops_it_after(tmp_path):
    """With no labkitd answering, make test starts one, runs pytest with it answering, and stops it afterwards,
    also when pytest fails (make then fails)."""
    state = _fake_venv(tmp_path)
    proc, calls = _make(tmp_path, "test", rc=3)
    assert proc.returncode != 0
    assert calls == ["python -m labkit labkitd status", "python -m labkit labkitd start",
                     "python -m pytest tests -ra -n auto --dist loadfile", "  (labkitd answering)",
                     "python -m labkit labkitd stop"]
    assert not (state / "running").exists()


def test_make_test_leaves_a_running_labkitd_running(tmp_path):
    """With a labkitd answering already (systemd's, or `labkit daemon start`), make test uses it and neither
    starts nor stops one."""
    state = _fake_venv(tmp_path)
    (state / "running").touch()
    proc, calls = _make(tmp_path, "test")
    assert proc.returncode == 0, proc.stderr
    assert calls == ["python -m labkit labkitd status", "python -m pytest tests -ra -n auto --dist loadfile",
                     "  (labkitd answering)"]
    assert (state / "running").exists()


def test_make_test_stops_when_labkitd_will_not_start(tmp_path):
    """When labkitd cannot be started, make test fails without running pytest (and stops nothing)."""
    state = _fake_venv(tmp_path)
    (state / "start-fails").touch()
    proc, calls = _make(tmp_path, "test")
    assert proc.returncode != 0
    assert calls == ["python -m labkit labkitd status", "python -m labkit labkitd start"]


@pytest.mark.parametrize("target, command", [
    ("lab", "jupyter lab --ip=127.0.0.1 --port=8888 --no-browser --allow-root --ServerApp.root_dir="),
    ("bench", "python -m labkit bench --readme README.md"),
])
def test_make_lab_and_bench_run_with_labkitd(tmp_path, target, command):
    """make lab (JupyterLab in the foreground, as root) and make bench start labkitd when none answers, run with
    it, and stop it afterwards."""
    _fake_venv(tmp_path)
    proc, calls = _make(tmp_path, target)
    assert proc.returncode == 0, proc.stderr
    assert calls[:2] == ["python -m labkit labkitd status", "python -m labkit labkitd start"]
    assert calls[2].startswith(command) and calls[3:] == ["  (labkitd answering)", "python -m labkit labkitd stop"]
