"""Can this machine run a lab? Each check says what it found and, when it
fails, the command that fixes it.

    $ labkit doctor
    ok    kernel        6.1.0-18-amd64 (>= 5.10)
    ok    btf           /sys/kernel/btf/vmlinux
    FAIL  bpffs         /sys/fs/bpf is not a bpf mount
          fix: mount -t bpf bpf /sys/fs/bpf
    ...

:func:`require_datapath` runs the quick checks before ``Lab.up`` and raises
:class:`~labkit.errors.PrivilegeError` with the same message.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from labkit.errors import PrivilegeError

__all__ = ["Check", "run_checks", "require_datapath", "format_checks", "cause", "PROVISION_STATUS", "LAB_NEED_MIB"]

_CAP_SYS_ADMIN, _CAP_NET_ADMIN, _CAP_BPF = 21, 12, 39
_PROVISION = "sudo bash vagrant/provision.sh"

#: Where vagrant/provision.sh leaves the one line that ended its last run when the cause was known (no
#: network, no kernel headers, a full disk); removed by a run that finishes.
PROVISION_STATUS = "/var/lib/labkit/provision-failed"
#: Free space a lab wants on / (the BPF image cache, events.bin, the agent's journal).
LAB_NEED_MIB = 256
_RERUN = "provision again (vagrant provision; without a VM: sudo make provision)"


def cause(kind: str, *args) -> str:
    """The sentence for a known cause of a failed provisioning: what is wrong, then what to do. The same
    words as ``cause`` in vagrant/provision-lib.sh (a unit test runs both), so doctor names the cause
    provisioning stopped on.

        >>> cause("disk", 120, "/", 1536, "provisioning")
        'disk full: 120 MiB free on /, provisioning needs 1536 MiB; free space (sudo apt-get clean, remove files) or give the VM a bigger disk, then provision again (vagrant provision; without a VM: sudo make provision)'
    """
    if kind == "network":
        tool, detail = args
        return (f"no network: {tool} could not reach its package source ({detail}); check this computer's "
                f"internet connection and proxy, then {_RERUN}")
    if kind == "headers":
        krel, flavour = args
        return (f"no kernel headers for the running kernel {krel}: apt has no linux-headers-{krel} and no generic "
                f"headers package could be installed; install the distribution's kernel and its headers "
                f"(sudo apt-get install linux-image-{flavour} linux-headers-{flavour}), boot it (vagrant reload), "
                f"then {_RERUN}")
    if kind == "disk":
        free, path, need, what = args
        return (f"disk full: {free} MiB free on {path}, {what} needs {need} MiB; free space (sudo apt-get clean, "
                f"remove files) or give the VM a bigger disk, then {_RERUN}")
    raise ValueError(f"cause {kind!r}: expected network, headers or disk")


@dataclass
class Check:
    """One finding: name, whether it passed, what was seen, and the fix."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    data: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix or None}


def _caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def _mounts() -> list[tuple[str, str]]:
    return [(p[1], p[2]) for p in (line.split() for line in Path("/proc/mounts").read_text().splitlines()) if len(p) > 2]


def check_root() -> Check:
    caps = _caps()
    has_bpf = bool(caps & (1 << _CAP_BPF)) or bool(caps & (1 << _CAP_SYS_ADMIN))
    has_net = bool(caps & (1 << _CAP_NET_ADMIN))
    ok = has_bpf and has_net
    return Check(
        "privileges",
        ok,
        f"euid {os.geteuid()}, CAP_BPF/CAP_SYS_ADMIN {'yes' if has_bpf else 'no'}, CAP_NET_ADMIN {'yes' if has_net else 'no'}",
        "" if ok else "run as root: sudo labkit …  (or sudo make lab)",
    )


def check_kernel() -> Check:
    release = platform.release()
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    ok = (major, minor) >= (5, 10)
    return Check("kernel", ok, f"{release} (need >= 5.10 for ring buffers and batch map ops)",
                 "" if ok else "boot a kernel >= 5.10 (Debian 12 and Ubuntu 22.04 ship one)")


def check_btf() -> Check:
    ok = Path("/sys/kernel/btf/vmlinux").exists()
    return Check("btf", ok, "/sys/kernel/btf/vmlinux" + ("" if ok else " missing"),
                 "" if ok else "use a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def check_bpffs() -> Check:
    ok = ("/sys/fs/bpf", "bpf") in _mounts()
    return Check("bpffs", ok, "/sys/fs/bpf is " + ("a bpf mount" if ok else "not a bpf mount"),
                 "" if ok else "mount -t bpf bpf /sys/fs/bpf")


def check_cgroup2() -> Check:
    roots = [m for m, t in _mounts() if t == "cgroup2"]
    ok = bool(roots)
    return Check("cgroup2", ok, f"cgroup v2 at {roots[0]}" if ok else "no cgroup2 mount",
                 "" if ok else "mount -t cgroup2 none /sys/fs/cgroup/unified", {"root": roots[0] if roots else None})


def check_bcc() -> Check:
    spec = importlib.util.find_spec("bcc")
    if spec is None or spec.origin is None:
        return Check("bcc", False, f"python {sys.executable} cannot import bcc",
                     "apt-get install python3-bpfcc, and use a venv made with --system-site-packages "
                     f"from /usr/bin/python3 ({_PROVISION} does both); PyPI's 'bcc' is another package")
    origin = spec.origin
    distro = "/dist-packages/" in origin or origin.startswith("/usr/lib/python3/")
    return Check("bcc", True, f"{origin} ({'distribution package python3-bpfcc' if distro else 'not from the distribution'})")


def _apt_has(package: str) -> bool | None:
    """Whether apt has an installation candidate for ``package`` (None: no apt here)."""
    if shutil.which("apt-cache") is None:
        return None
    out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True, timeout=30).stdout
    cand = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Candidate:")),
                "")
    return bool(cand) and cand != "(none)"


def _headers_flavour() -> str:
    """The generic headers package's suffix: ``generic`` on Ubuntu, the architecture (amd64, arm64) on Debian."""
    try:
        osr = Path("/etc/os-release").read_text()
    except OSError:
        osr = ""
    if "ID=ubuntu" in osr or "ubuntu" in next((l for l in osr.splitlines() if l.startswith("ID_LIKE=")), ""):
        return "generic"
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


def check_headers() -> Check:
    build = Path(f"/lib/modules/{platform.release()}/build")
    if not (build / "include").exists():
        fix = f"{_PROVISION}  (installs headers, or wires the distribution's generic ones)"
        flavour = _headers_flavour()
        if _apt_has(f"linux-headers-{platform.release()}") is False and _apt_has(f"linux-headers-{flavour}") is False:
            fix = cause("headers", platform.release(), flavour)
        return Check("headers", False, f"{build} missing: BCC cannot compile", fix)
    target = os.path.realpath(build)
    generic = platform.release() not in target
    note = f" → {target}" + (" (generic headers for another version: fine, tc programs use UAPI only)" if generic else "")
    return Check("headers", True, f"{build}{note}")


#: Where root finds the tools (labkitd runs them; an ordinary user's PATH on Debian has no sbin).
_ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def check_tools() -> Check:
    # dnsmasq: the lab zone's DNS server, started in ext when policy is compiled in (labkit.fqdn.zone)
    path = os.pathsep.join(p for p in (os.environ.get("PATH", ""), _ROOT_PATH) if p)
    missing = [t for t in ("bpftool", "tc", "ip", "ping", "dnsmasq") if shutil.which(t, path=path) is None]
    return Check("tools", not missing, "bpftool, tc, ip, ping, dnsmasq found" if not missing
                 else f"missing: {', '.join(missing)}",
                 "" if not missing else _PROVISION)


#: What the notebooks' numpy (matplotlib's, networkx's) is built for on x86_64: numpy 2 from PyPI needs x86-64-v2.
_X86_64_V2 = ("sse4_2", "popcnt", "ssse3", "sse4_1", "cx16")


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


_CPU_FIX = {
    "x86_64": "give the VM a CPU model with x86-64-v2 (SSE4.2, POPCNT): libvirt under emulation "
              "lv.cpu_mode = \"custom\", lv.cpu_model = \"Nehalem\" (or newer); KVM and VirtualBox pass the host's CPU",
    "aarch64": "give the VM the host's CPU: qemu -cpu host under HVF or KVM (the Vagrantfile's qemu provider does), "
               "-cpu max under emulation",
}


def check_cpu(code: str = "import numpy") -> Check:
    """The notebook stack runs on this CPU: ``code`` (importing numpy) in a new interpreter. numpy is built
    for a baseline (x86-64-v2 on x86_64) that an emulated CPU model such as qemu's ``qemu64`` lacks; there
    the import dies of SIGILL, and with it every notebook's kernel at its first cell."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        return Check("cpu", True, f"{platform.machine()}: numpy imports")
    if proc.returncode == -signal.SIGILL:
        lacking = [f for f in _X86_64_V2 if f not in _cpu_flags()] if platform.machine() == "x86_64" else []
        return Check("cpu", False, f"{platform.machine()}: importing numpy died of SIGILL (an instruction this CPU "
                                   f"lacks{': ' + ', '.join(lacking) if lacking else ''}): every notebook kernel "
                                   f"would die at its first cell",
                     _CPU_FIX.get(platform.machine(), _CPU_FIX["x86_64"]))
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return Check("cpu", False, f"importing numpy failed: {last}", _PROVISION)


def check_disk(path: str = "/", need_mib: int = LAB_NEED_MIB) -> Check:
    """Free space on ``path``: a lab writes its BPF image cache, trace file and journal."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize // (1024 * 1024)
    ok = free >= need_mib
    return Check("disk", ok, f"{free} MiB free on {path}" + ("" if ok else f" (a lab needs {need_mib} MiB)"),
                 "" if ok else cause("disk", free, path, need_mib, "a lab"))


def check_provisioning(status: str | None = None) -> Check | None:
    """The line vagrant/provision.sh ended its last run with, when it stopped on a known cause; None when it
    did not (or never ran here)."""
    path = Path(status or os.environ.get("LABKIT_PROVISION_STATUS") or PROVISION_STATUS)
    try:
        line = path.read_text().strip()
    except OSError:
        return None
    return Check("provisioning", False, f"the last provisioning run stopped ({path})", line or "provision again")


def check_compile_and_attach() -> Check:
    """Compile a tiny tc program with BCC and attach it on clsact in a scratch namespace."""
    probe = f"lk-doctor-{os.getpid()}"
    code = f"""
import sys
from bcc import BPF
from pyroute2 import IPRoute, netns
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from labkit.net import netns as _netns
b = BPF(text="int cls(struct __sk_buff *skb) {{ return 0; }}")
fn = b.load_func("cls", BPF.SCHED_CLS)
netns.create({probe!r})
try:
    with _netns.entered({probe!r}):
        ipr = IPRoute()
    ipr.link("add", ifname="probe0", kind="veth", peer={{"ifname": "probe1"}})
    idx = ipr.link_lookup(ifname="probe0")[0]
    ipr.tc("add", "clsact", idx)
    ipr.tc("add-filter", "bpf", idx, ":1", fd=fn.fd, name="probe", parent="ffff:fff2", classid=1, direct_action=True)
    ipr.close()
finally:
    netns.remove({probe!r})
"""
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    secs = time.monotonic() - t
    if proc.returncode == 0:
        return Check("compile+attach", True, f"BCC compiled a tc program and attached it on clsact ({secs:.2f} s)")
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return Check("compile+attach", False, f"probe failed: {last}", _PROVISION)


def run_checks(full: bool = True) -> list[Check]:
    """Every check; ``full`` adds the compile-and-attach probe (needs the others)."""
    prov = check_provisioning()
    checks = [*([prov] if prov else []), check_root(), check_kernel(), check_btf(), check_bpffs(), check_cgroup2(),
              check_bcc(), check_headers(), check_tools(), check_disk(), check_cpu()]
    if full and all(c.ok for c in checks if c.name in ("privileges", "bpffs", "bcc", "headers")):
        checks.append(check_compile_and_attach())
    return checks


def format_checks(checks: list[Check]) -> str:
    """The human-readable report."""
    lines = []
    for c in checks:
        lines.append(f"{'ok' if c.ok else 'FAIL':5} {c.name:15} {c.detail}")
        if c.fix:
            lines.append(f"{'':5} {'':15} fix: {c.fix}")
    return "\n".join(lines)


def require_datapath() -> None:
    """The quick checks ``Lab.up`` needs; PrivilegeError with doctor's message otherwise."""
    failed = [c for c in (check_root(), check_bpffs(), check_bcc(), check_headers()) if not c.ok]
    if failed:
        raise PrivilegeError(
            "this machine cannot run the lab datapath yet:\n" + format_checks(failed) + "\n(run `labkit doctor` for all checks)"
        )
