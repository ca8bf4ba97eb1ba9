"""The VM's files: line endings on any checkout, the Vagrantfile's Ruby, and provision.sh's failure lines."""
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
    assert not any(c["call"] == "provision" and c["args"][0] == "labkit-source" for c in calls)
    assert not (tmp_path / "repo" / "vagrant" / ".vagrant").exists()


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


@pytest.mark.parametrize("script", ["build-box.sh", "arm64-test.sh", "arm64-rootfs.sh", "arm64-init.sh", "chroot-lib.sh", "vm-test.sh"])
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
