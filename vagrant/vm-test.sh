#!/usr/bin/env bash
# make vm-test: the labkit VM, proven end to end on this machine with the
# libvirt provider (KVM where the CPU has vmx/svm, qemu emulation otherwise).
# Not part of `make test`: about 25 minutes under emulation on 2 cores.
#
#   sudo bash vagrant/vm-test.sh            # or: sudo make vm-test
#   sudo bash vagrant/vm-test.sh --no-boot  # everything up to `vagrant validate`; no VM
#   sudo bash vagrant/vm-test.sh --offline-box
#       make box's box (build-box.sh --provisioned), added as labkit/debian12 and used
#       through LABKIT_BOX, on a management network without a route out (libvirt's
#       isolated mode): provisioning must need no network; then doctor, lab, jupyter
#
# Steps (each prints its time):
#   host-packages  vagrant, vagrant-libvirt, libvirt, qemu, mmdebstrap, ... (apt, when missing)
#   box            a Debian 12 box built from Debian packages (vagrant/build-box.sh),
#                  added as debian/bookworm64 (the project Vagrantfile's box) under
#                  a VAGRANT_HOME of its own; reused while it is there
#   libvirt        virtlogd, virtlockd, libvirtd started if they are not running
#                  (stopped at the end: only those it started)
#   up             `vagrant up --provider libvirt` of vagrant/Vagrantfile, unchanged:
#                  machine-local settings (qemu driver, serial log, a management
#                  network of its own on 100.64.121.0/24) live in $VAGRANT_HOME/Vagrantfile
#   provisioned    provisioning finished, the JupyterLab URL line printed
#   doctor, lab    `sudo labkit doctor` (every check) and, as the vagrant user, `labkit doctor`
#                  with nothing failed; as vagrant: `labkit up` (the lab is vagrant's
#                  own, demo_u<uid>, made through labkitd, not root's through sudo), the hint
#                  it prints run as printed (pod ping), a CT row in Cilium's grammar
#   jupyter        the host's forwarded port: 200 with the token, 403 without; the
#                  VM's own address does not answer on 8888
#   privileges     labkitd's unit is active; JupyterLab's server runs as vagrant, and a
#                  kernel it starts runs as vagrant with no capabilities (CapEff 0); the
#                  answer keys are root's and labkit-instructors', not vagrant's to read
#   labs           lab 01 (LABKIT_VMTEST_LABS: others too, by number, e.g. "01 07 10"
#                  for Maglev and policy) run headless in the VM with its reference
#                  answers filled in (read as root: the keys are not vagrant's), then
#                  `labkit grade --jobs 1` as vagrant passes every exercise
#   work           a notebook saved through JupyterLab's API and an edited lab
#                  survive `vagrant reload` and `vagrant provision`; `labkit export`
#                  brings them to the host
#   destroy        `vagrant destroy`, then nothing left: no domain, volume, network,
#                  pool or process of its own; libvirt's host firewall chains and
#                  ip_forward as they were
#
# Environment: LABKIT_VMTEST_DIR (default /var/tmp/labkit-vm-test: box, VAGRANT_HOME,
# logs), LABKIT_VMTEST_REBUILD_BOX=1 (build the box again), LABKIT_VMTEST_KEEP=1
# (leave the VM up for a look; `vagrant destroy` it yourself), LABKIT_VMTEST_LABS
# (the labs the labs step grades, default "01"), LABKIT_VMTEST_CELL_TIMEOUT (seconds, 600).
set -euo pipefail

PROG=vm-test
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
STATE="${LABKIT_VMTEST_DIR:-/var/tmp/labkit-vm-test}"
LABS="${LABKIT_VMTEST_LABS:-01}"
# One notebook at a time, and cells given longer than in a classroom: in a 2-vCPU VM under emulation,
# two notebooks side by side took over 120 s (labkit grade's limit) to start their labs.
CELL_TIMEOUT="${LABKIT_VMTEST_CELL_TIMEOUT:-600}"
NO_BOOT=0
OFFLINE=0
case "${1:-}" in
    --no-boot) NO_BOOT=1 ;;
    --offline-box) OFFLINE=1 ;;
    "") ;;
    *) echo "usage: $0 [--no-boot | --offline-box]" >&2; exit 2 ;;
esac
if [ "$OFFLINE" = 1 ]; then
    BOX_NAME=labkit/debian12
    BOX_FILE="$STATE/box/labkit-debian12-libvirt.box"
    LOGS="$STATE/logs-offline"
    export VAGRANT_HOME="$STATE/vagrant-offline.d"
    export LABKIT_BOX=$BOX_NAME
else
    BOX_NAME=debian/bookworm64
    BOX_FILE="$STATE/box/debian12-libvirt.box"
    LOGS="$STATE/logs"
    export VAGRANT_HOME="$STATE/vagrant.d"
fi
NET_NAME=labkit-vm-test
NET_CIDR=100.64.121.0/24
URI=qemu:///system
export VAGRANT_DOTFILE_PATH="$STATE/dot"
export VAGRANT_DEFAULT_PROVIDER=libvirt
export VAGRANT_CHECKPOINT_DISABLE=1
export LIBVIRT_DEFAULT_URI=$URI

T_ALL=$SECONDS
FAILED=""
declare -a STARTED_PIDS=() STARTED_NAMES=() TIMES=()

say() { printf '%s: %s\n' "$PROG" "$*"; }
fail() { printf '%s: FAIL: %s\n' "$PROG" "$*" >&2; FAILED="${FAILED:+$FAILED; }$*"; return 1; }

# step NAME FUNCTION: run it, print and keep its time.
step() {
    local name="$1" t=$SECONDS rc=0
    shift
    say "--- $name ..."
    "$@" || rc=$?
    TIMES+=("$(printf '%-14s %5d s  %s' "$name" $((SECONDS - t)) "$([ $rc = 0 ] && echo ok || echo FAILED)")")
    say "$name: $([ $rc = 0 ] && echo ok || echo FAILED) ($((SECONDS - t)) s)"
    return $rc
}

[ "$(id -u)" = 0 ] || { echo "$PROG: run as root (libvirt, loop devices): sudo bash $0" >&2; exit 1; }
mkdir -p "$STATE" "$LOGS" "$VAGRANT_HOME"
chmod 755 "$STATE"

# ------------------------------------------------------------------ host packages
HOST_PKGS=(vagrant vagrant-libvirt libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils dnsmasq-base
    mmdebstrap extlinux syslinux-common fdisk e2fsprogs rsync curl iptables)
host_packages() {
    local -a missing=()
    local p
    for p in "${HOST_PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" = 0 ]; then
        say "host packages present"
        return 0
    fi
    say "installing: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -q update >"$LOGS/apt.log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get -q install -y --no-install-recommends "${missing[@]}" >>"$LOGS/apt.log" 2>&1 ||
        fail "apt-get install ${missing[*]} (see $LOGS/apt.log)"
}

# ------------------------------------------------------------------ box
box() {
    if [ "${LABKIT_VMTEST_REBUILD_BOX:-0}" = 1 ] || [ ! -s "$BOX_FILE" ]; then
        local -a how=()
        [ "$OFFLINE" = 1 ] && how=(--provisioned)
        bash "$REPO/vagrant/build-box.sh" "${how[@]}" "$BOX_FILE" >"$LOGS/build-box.log" 2>&1 || { tail -n 20 "$LOGS/build-box.log" >&2; fail "box build (see $LOGS/build-box.log)"; return 1; }
        tail -n 1 "$LOGS/build-box.log"
        vagrant box remove -f --provider libvirt "$BOX_NAME" >/dev/null 2>&1 || true
    fi
    if ! vagrant box list 2>/dev/null | grep -q "^$BOX_NAME *(libvirt"; then
        vagrant box add --name "$BOX_NAME" --provider libvirt "$BOX_FILE" >"$LOGS/box-add.log" 2>&1 || fail "vagrant box add (see $LOGS/box-add.log)"
    fi
    say "box $BOX_NAME (libvirt) from $BOX_FILE"
}

# ------------------------------------------------------------------ libvirt
declare -A PIDFILE=([virtlogd]=/run/virtlogd.pid [virtlockd]=/run/virtlockd.pid [libvirtd]=/run/libvirtd.pid)
daemon_running() {
    local f="${PIDFILE[$1]}"
    [ -s "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}
libvirt_up() {
    local d
    for d in virtlogd virtlockd libvirtd; do
        if daemon_running "$d"; then
            say "$d already running (pid $(cat "${PIDFILE[$d]}")): left alone"
            continue
        fi
        "$d" -d || { fail "$d -d"; return 1; }
        local i
        for i in $(seq 1 50); do daemon_running "$d" && break; sleep 0.2; done
        daemon_running "$d" || { fail "$d did not start"; return 1; }
        STARTED_PIDS+=("$(cat "${PIDFILE[$d]}")")
        STARTED_NAMES+=("$d")
        say "started $d (pid $(cat "${PIDFILE[$d]}"))"
    done
    for i in $(seq 1 50); do virsh -q version >/dev/null 2>&1 && break; sleep 0.2; done
    virsh -q version >/dev/null 2>&1 || fail "libvirtd does not answer on $URI"
}
libvirt_down() {
    local i
    for ((i = ${#STARTED_PIDS[@]} - 1; i >= 0; i--)); do
        kill "${STARTED_PIDS[$i]}" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "${STARTED_PIDS[$i]}" 2>/dev/null || break; sleep 0.2; done
        say "stopped ${STARTED_NAMES[$i]} (pid ${STARTED_PIDS[$i]})"
    done
    STARTED_PIDS=()
}

# What exists before, to prove afterwards that nothing of ours is left.
snapshot_host() {
    {
        echo "# domains"; virsh list --all --name 2>/dev/null | sed '/^$/d' | sort
        echo "# volumes"; for p in $(virsh pool-list --all --name 2>/dev/null); do virsh vol-list "$p" 2>/dev/null | awk -v p="$p" 'NR > 2 && NF {print p "/" $1}'; done | sort
        echo "# networks"; virsh net-list --all --name 2>/dev/null | sed '/^$/d' | sort
        echo "# pools"; virsh pool-list --all --name 2>/dev/null | sed '/^$/d' | sort
    } >"$1"
}
# Firewall chains as TABLE/CHAIN lines.
chains() { { iptables-save 2>/dev/null || true; } | awk '/^\*/ {t = substr($1, 2)} /^:/ {print t "/" substr($1, 2)}' | sort -u; }

# ------------------------------------------------------------------ machine-local Vagrantfile
machine_vagrantfile() {
    local driver=qemu cpu='lv.cpu_mode = "custom"; lv.cpu_model = "Nehalem"   # x86-64-v2: numpy 2 dies of SIGILL on qemu64'
    if grep -qE '\b(vmx|svm)\b' /proc/cpuinfo && [ -c /dev/kvm ]; then driver=kvm cpu=""; fi
    cat >"$VAGRANT_HOME/Vagrantfile" <<EOF
# Written by labkit's vagrant/vm-test.sh: this machine's settings, not the project's.

# vagrant-libvirt 0.11.2 fails to merge a provider block that sets serial ports with a later one that
# does not ("no implicit conversion of Symbol into Array"): treat the later one's as empty.
begin
  require "vagrant-libvirt/config"
rescue LoadError
end
if defined?(VagrantPlugins::ProviderLibvirt::Config) && !VagrantPlugins::ProviderLibvirt::Config.method_defined?(:labkit_merge_fix)
  VagrantPlugins::ProviderLibvirt::Config.prepend(Module.new do
    def labkit_merge_fix; end

    def merge(other)
      unset = Vagrant::Plugin::V2::Config::UNSET_VALUE
      other.serials = [] if serials != unset && other.serials == unset
      super
    end
  end)
end

Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |lv|
    lv.driver = "$driver"   # no vmx/svm here: qemu's emulation (TCG)
    $cpu
    lv.management_network_name = "$NET_NAME"
    lv.management_network_address = "$NET_CIDR"
    $([ "$OFFLINE" = 1 ] && echo 'lv.management_network_mode = "none"   # isolated: the VM has no route out')
    lv.serial :type => "file", :source => { :path => "$LOGS/console.log" }
  end
end
EOF
    say "libvirt driver $driver; management network $NET_NAME $NET_CIDR; console log $LOGS/console.log"
}

V() { (cd "$REPO/vagrant" && vagrant "$@"); }
# Run a command in the VM as the vagrant user; its output on stdout.
in_vm() { V ssh -c "$1" -- -T -o LogLevel=ERROR 2>>"$LOGS/ssh.log"; }

# ------------------------------------------------------------------ up
up() {
    local rc=0
    V up --provider libvirt 2>&1 | tee "$LOGS/up.log" || rc=$?
    if [ $rc != 0 ]; then
        virsh list --all --name | grep -q . && virsh screenshot "$(virsh list --name | head -n 1)" "$LOGS/screen.ppm" >/dev/null 2>&1 || true
        fail "vagrant up exited $rc (see $LOGS/up.log, $LOGS/console.log)"
        return 1
    fi
}

provisioned() {
    grep -q "labkit-provision: finished: ok" "$LOGS/up.log" || { fail "provisioning did not finish (see $LOGS/up.log)"; return 1; }
    grep -E "labkit-provision: (instructors|answer-keys|labkitd|work|jupyter-service|finished)" "$LOGS/up.log" | sed 's/^ *default: //'
    URL_LINE="$(grep -Eo 'labkit: JupyterLab: http://127\.0\.0\.1:[0-9]+/lab\?token=[0-9a-f]{32}' "$LOGS/up.log" | tail -n 1)"
    [ -n "$URL_LINE" ] || { fail "no 'labkit: JupyterLab: http://127.0.0.1:PORT/lab?token=…' line after vagrant up"; return 1; }
    PORT="$(sed -E 's/.*:([0-9]+)\/lab.*/\1/' <<<"$URL_LINE")"
    TOKEN="$(sed -E 's/.*token=//' <<<"$URL_LINE")"
    say "JupyterLab forwarded to host port $PORT"
}

# --offline-box: the VM had no way out, and provisioning found everything in the box.
offline() {
    local route out
    route="$(in_vm 'ip -4 route show default' || true)"
    out="$(in_vm 'curl -sS -m 10 -o /dev/null http://deb.debian.org/ 2>&1; echo "curl exit $?"' || true)"
    say "in the VM: default route '${route:-none}'; deb.debian.org: $(tail -n 1 <<<"$out")"
    grep -q "curl exit 0" <<<"$out" && { fail "the VM reaches deb.debian.org: the offline proof proves nothing"; return 1; }
    local s
    for s in "apt: ok (all packages present" "kernel-headers: ok" "venv: ok" "pip: ok"; do
        grep -q "labkit-provision: $s" "$LOGS/up.log" || { fail "provisioning did not find '$s' in the box (see $LOGS/up.log)"; return 1; }
    done
    say "provisioning installed nothing: apt, kernel headers, venv and pip were all in the box"
}

doctor() {
    # Root's doctor runs every check (the compile-and-attach probe among them); vagrant's runs what a user can
    # see, labkitd answering first, and must find nothing failed either.
    in_vm 'sudo labkit doctor' | tee "$LOGS/doctor.log"
    grep -q "^ok    compile+attach" "$LOGS/doctor.log" || { fail "sudo labkit doctor in the VM (see $LOGS/doctor.log)"; return 1; }
    grep -q "^FAIL" "$LOGS/doctor.log" && { fail "sudo labkit doctor reports a failed check"; return 1; }
    in_vm 'labkit doctor' >"$LOGS/doctor-vagrant.log" 2>&1 || true
    grep -q "^FAIL" "$LOGS/doctor-vagrant.log" && { fail "labkit doctor as vagrant reports a failed check (see $LOGS/doctor-vagrant.log)"; return 1; }
    return 0
}

lab() {
    in_vm 'labkit up' | tee "$LOGS/labkit-up.log"
    grep -q "^lab demo is up" "$LOGS/labkit-up.log" || { fail "labkit up as the vagrant user"; return 1; }
    # labkitd names a user's lab by its key, demo_u<uid>; a lab made by root (through sudo) would be plain demo.
    in_vm 'test -d "/run/labkit/demo_u$(id -u)"' ||
        { fail "labkit up as vagrant did not make vagrant's own lab (/run/labkit/demo_u<uid>) through labkitd"; return 1; }
    local hint ct
    hint="$(grep -m1 -E '^  labkit --lab demo exec [a-z0-9]+ -- ping -c1 ' "$LOGS/labkit-up.log" | sed 's/^  //')"
    [ -n "$hint" ] || { fail "labkit up printed no ping hint"; return 1; }
    say "the hint, as printed, as the vagrant user: $hint"
    in_vm "$hint" | tee "$LOGS/ping.log"
    grep -q " 0% packet loss" "$LOGS/ping.log" || { fail "pod ping: $hint"; return 1; }
    ct="$(grep -m1 -E '^  labkit --lab demo ct list ' "$LOGS/labkit-up.log" | sed 's/^  //')"
    in_vm "$ct" | tee "$LOGS/ct.log"
    grep -qE '^ICMP OUT 198\.18\.[0-9]+\.[0-9]+:[0-9]+ -> 198\.18\.[0-9]+\.[0-9]+:0 expires=[0-9]+ Packets=[0-9]+ Bytes=[0-9]+ RxFlagsSeen=0x[0-9a-f]+ LastRxReport=[0-9]+ TxFlagsSeen=0x[0-9a-f]+ LastTxReport=[0-9]+ Flags=0x[0-9a-f]+ \[[^]]*\] RevNAT=[0-9]+ SourceSecurityID=[0-9]+' "$LOGS/ct.log" ||
        { fail "no ICMP OUT row in Cilium's grammar in '$ct'"; return 1; }
    in_vm 'labkit down' | tail -n 1
}

http_code() { curl -s -o /dev/null -m 10 -w '%{http_code}' "$1" || true; }
jupyter() {
    local with without vmip far
    with="$(http_code "http://127.0.0.1:$PORT/api/status?token=$TOKEN")"
    without="$(http_code "http://127.0.0.1:$PORT/api/status")"
    say "127.0.0.1:$PORT/api/status: with the token $with, without $without"
    [ "$with" = 200 ] && [ "$without" = 403 ] || { fail "JupyterLab on 127.0.0.1:$PORT: with token $with (want 200), without $without (want 403)"; return 1; }
    vmip="$(V ssh-config 2>/dev/null | awk '$1 == "HostName" {print $2; exit}')"
    far="$(curl -s -o /dev/null -m 5 -w '%{http_code}' "http://$vmip:8888/api" 2>/dev/null || true)"
    say "the VM's own address $vmip:8888: ${far:-000} (000: nothing answers)"
    [ "${far:-000}" = 000 ] || { fail "JupyterLab answers on the VM's address $vmip:8888"; return 1; }
}

# Who runs what: labkitd as root under systemd, JupyterLab and its kernels as vagrant with no capabilities,
# the answer keys out of vagrant's reach.
privileges() {
    local active user kid probe out
    active="$(in_vm 'sudo systemctl is-active labkitd' | tr -d ' \r' || true)"  # as root: the box has no D-Bus for a user's systemctl
    say "labkitd.service: ${active:-?}"
    [ "$active" = active ] || { fail "systemctl is-active labkitd: ${active:-no answer} (want active)"; return 1; }
    user="$(in_vm 'ps -o user= -p "$(sudo systemctl show -p MainPID --value labkit-jupyter)"' | tr -d ' \r' || true)"
    say "JupyterLab's server runs as: ${user:-?}"
    [ "$user" = vagrant ] || { fail "JupyterLab's server runs as '${user:-?}' (want vagrant)"; return 1; }
    # A kernel as a notebook gets one: started by the server through its API, found by its connection file.
    kid="$(curl -sf -m 120 -X POST "http://127.0.0.1:$PORT/api/kernels?token=$TOKEN" -H 'Content-Type: application/json' \
        --data '{"name": "python3"}' | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])' || true)"
    [ -n "$kid" ] || { fail "JupyterLab did not start a kernel (POST /api/kernels)"; return 1; }
    probe='pid=""; for i in $(seq 1 90); do pid="$(pgrep -f "kernel-KID[.]json" | head -n 1)"; [ -n "$pid" ] && break; sleep 1; done
        [ -n "$pid" ] || { echo "no kernel process"; exit 1; }
        echo "user $(ps -o user= -p "$pid" | tr -d " ")"; grep "^CapEff:" "/proc/$pid/status"'
    out="$(in_vm "${probe//KID/$kid}" || true)"
    curl -s -o /dev/null -m 30 -X DELETE "http://127.0.0.1:$PORT/api/kernels/$kid?token=$TOKEN" || true
    printf '%s\n' "$out" | while read -r line; do say "the kernel: $line"; done
    grep -qx "user vagrant" <<<"$out" && grep -qE '^CapEff:[[:space:]]+0{16}$' <<<"$out" ||
        { fail "a notebook kernel is not vagrant's without capabilities: $(tr '\n' ' ' <<<"$out")"; return 1; }
    out="$(in_vm 'k=/home/vagrant/labkit/instructor/answers/01.json
        sudo test -r "$k" && echo "root reads the key"
        cat "$k" >/dev/null 2>&1 || ls /home/vagrant/labkit/instructor >/dev/null 2>&1 || echo "vagrant cannot read the keys"
        stat -c "%U:%G %a" /home/vagrant/labkit/instructor
        id -nG | grep -qw labkit-instructors || echo "vagrant is not an instructor"' || true)"
    printf '%s\n' "$out" | while read -r line; do say "answer keys: $line"; done
    [ "$(printf '%s\n' "$out" | grep -c -e "^root reads the key$" -e "^vagrant cannot read the keys$" \
        -e "^root:labkit-instructors 750$" -e "^vagrant is not an instructor$")" = 4 ] ||
        { fail "the answer keys are not kept from vagrant: $(tr '\n' ' ' <<<"$out")"; return 1; }
}

labs() {
    local out
    # The learner's notebooks with the reference answers in their answer cells (filled in as root: the keys are not
    # vagrant's to read), graded by vagrant: their kernels, their labs, through labkitd.
    in_vm 'set -e; rm -rf /tmp/vmtest-handin && mkdir -p /tmp/vmtest-handin/ref &&
        sudo /opt/labkit/venv/bin/python - '"$LABS"' <<EOF
import glob, json, os, sys
import nbformat
from labkit.grading.grade import answer_cells
for lab in sys.argv[1:]:
    path = glob.glob(f"/home/vagrant/labkit/labs/{lab}-*.ipynb")[0]
    nb = nbformat.read(path, as_version=4)
    key = json.load(open(f"/home/vagrant/labkit/instructor/answers/{lab}.json"))
    cells = answer_cells(nb)
    for ex, entry in key.items():
        nb.cells[cells[ex]].source = entry["answer"]
    nbformat.write(nb, "/tmp/vmtest-handin/ref/" + os.path.basename(path))
EOF
        sudo chown -R vagrant: /tmp/vmtest-handin
        labkit grade /tmp/vmtest-handin --jobs 1 --cell-timeout '"$CELL_TIMEOUT"' --json --quiet \
            --keep-executed /tmp/vmtest-handin/executed > /tmp/vmtest-handin/grade.json
        cat /tmp/vmtest-handin/grade.json' >"$LOGS/labs.json" || true
    # For a post-mortem on the host: what the kernel printed, the kernel log's end, the VM's memory.
    in_vm 'cat /tmp/vmtest-handin/executed/*.output.log; echo "--- dmesg"; sudo dmesg | tail -40; echo "--- free -m"; free -m' \
        >"$LOGS/labs-output.log" 2>&1 || true
    out="$(python3 - "$LOGS/labs.json" "$(wc -w <<<"$LABS")" <<'EOF'
import json, sys
text = open(sys.argv[1]).read()
books = json.loads(text[text.index("{"):])["notebooks"]
ok = len(books) == int(sys.argv[2])
for n in books:
    score, total, secs, err = n["score"], n["total"], n["seconds"], n["error"]
    print(f"{n['notebook']}: {score}/{total} exercises passed, {secs:.0f} s, error: {err}")
    ok = ok and bool(total) and score == total and not err
sys.exit(0 if ok else 1)
EOF
)" || { fail "labs $LABS with the reference answers: ${out:-no result} (see $LOGS/labs.json)"; return 1; }
    printf '%s\n' "$out" | while read -r line; do say "reference answers: $line"; done
}

# JupyterLab's contents API: what the browser does when the learner saves.
put_notebook() {
    curl -sf -m 30 -X PUT -H 'Content-Type: application/json' \
        "http://127.0.0.1:$PORT/api/contents/$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$1")?token=$TOKEN" \
        --data "$(python3 -c '
import json, sys
nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": [sys.argv[1]]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
print(json.dumps({"type": "notebook", "format": "json", "content": nb}))' "$2")" >/dev/null
}
work_sums() { in_vm 'cd /home/vagrant/work && sha256sum student-notes.ipynb 01-tour.ipynb'; }
work() {
    put_notebook student-notes.ipynb "my notes, saved in JupyterLab" || { fail "saving a notebook through JupyterLab's API"; return 1; }
    put_notebook 01-tour.ipynb "01 with my answers" || { fail "saving 01-tour.ipynb through JupyterLab's API"; return 1; }
    local before after t
    before="$(work_sums)"
    printf '%s\n' "$before"
    t=$SECONDS
    V reload 2>&1 | tee "$LOGS/reload.log" >/dev/null || { fail "vagrant reload"; return 1; }
    TIMES+=("$(printf '%-14s %5d s' "  reload" $((SECONDS - t)))")
    after="$(work_sums)"
    [ "$before" = "$after" ] || { fail "the work folder changed across vagrant reload: $after"; return 1; }
    say "vagrant reload ($((SECONDS - t)) s): both notebooks unchanged"
    local url
    url="$(grep -Eo 'labkit: JupyterLab: http://127\.0\.0\.1:[0-9]+/lab\?token=[0-9a-f]{32}' "$LOGS/reload.log" | tail -n 1)"
    [ -n "$url" ] || { fail "no JupyterLab URL line after vagrant reload"; return 1; }
    t=$SECONDS
    V provision 2>&1 | tee "$LOGS/provision.log" >/dev/null || { fail "vagrant provision"; return 1; }
    TIMES+=("$(printf '%-14s %5d s' "  provision" $((SECONDS - t)))")
    grep -q "labkit-provision: finished: ok" "$LOGS/provision.log" || { fail "vagrant provision did not finish"; return 1; }
    after="$(work_sums)"
    [ "$before" = "$after" ] || { fail "the work folder changed across vagrant provision: $after"; return 1; }
    say "vagrant provision ($((SECONDS - t)) s): both notebooks unchanged"
    in_vm 'labkit export --name vagrant --to -' >"$STATE/work.tar.gz" || { fail "labkit export --to -"; return 1; }
    tar -tzf "$STATE/work.tar.gz" | tee "$LOGS/export.txt"
    grep -qx 'vagrant/student-notes.ipynb' "$LOGS/export.txt" && grep -qx 'vagrant/01-tour.ipynb' "$LOGS/export.txt" ||
        { fail "the exported archive lacks the saved notebooks"; return 1; }
    tar -xzOf "$STATE/work.tar.gz" vagrant/student-notes.ipynb | grep -q "my notes, saved in JupyterLab" ||
        { fail "the exported notes are not what was saved"; return 1; }
}

# ------------------------------------------------------------------ destroy
destroy() {
    V destroy -f >"$LOGS/destroy.log" 2>&1 || fail "vagrant destroy (see $LOGS/destroy.log)"
    # The box's image in the storage pool is vagrant-libvirt's copy of our box: ours too.
    local v
    local image="${BOX_NAME//\//-VAGRANTSLASH-}_vagrant_box_image"
    for v in $(virsh vol-list default 2>/dev/null | awk -v i="$image" 'NR > 2 && index($1, i) == 1 {print $1}'); do
        grep -qx "default/$v" "$STATE/before.txt" && continue
        virsh vol-delete --pool default "$v" >/dev/null && say "removed volume default/$v (the box's image)"
    done
    if virsh net-info "$NET_NAME" >/dev/null 2>&1; then
        virsh net-destroy "$NET_NAME" >/dev/null 2>&1 || true
        virsh net-undefine "$NET_NAME" >/dev/null && say "removed network $NET_NAME"
    fi
    if ! grep -qx default <(sed -n '/^# pools/,$p' "$STATE/before.txt"); then
        if virsh pool-info default >/dev/null 2>&1; then
            virsh pool-destroy default >/dev/null 2>&1 || true
            virsh pool-undefine default >/dev/null && say "removed storage pool default (vagrant-libvirt made it)"
        fi
    fi
    snapshot_host "$STATE/after.txt"
    if ! diff -u "$STATE/before.txt" "$STATE/after.txt"; then
        fail "libvirt objects left (diff above: before vs after)"
        return 1
    fi
    say "libvirt: the same domains, volumes, networks and pools as before"
}

host_left_as_it_was() {
    local tc table c rule leftover=""
    # libvirt's firewall chains (made with its first network) that were not there before: unhooked and removed
    # when empty; any other new chain is reported.
    # Two passes: libvirt's chains first (their jump rules sit in the built-in chains), then whatever is new.
    for tc in $(comm -13 "$STATE/chains-before.txt" <(chains)); do
        table="${tc%%/*}" c="${tc#*/}"
        [[ "$c" == LIBVIRT_* ]] || continue
        while read -r rule; do
            # shellcheck disable=SC2086
            iptables -t "$table" ${rule/-A/-D} 2>/dev/null || true
        done < <(iptables-save -t "$table" | grep -E -- "-j $c\$")
        if iptables -t "$table" -F "$c" 2>/dev/null && iptables -t "$table" -X "$c" 2>/dev/null; then
            say "removed firewall chain $table/$c (libvirt's)"
        else
            leftover="$leftover $tc"
        fi
    done
    for tc in $(comm -13 "$STATE/chains-before.txt" <(chains)); do
        table="${tc%%/*}" c="${tc#*/}"
        if [[ "$c" =~ ^(INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING)$ ]] &&
            ! iptables-save -t "$table" | grep -q '^-A '; then
            : # a built-in chain of a table libvirt loaded, empty: nothing of ours
        else
            leftover="$leftover $tc"
        fi
    done
    [ "$(cat /proc/sys/net/ipv4/ip_forward)" = "$(cat "$STATE/ip_forward-before")" ] || {
        cat "$STATE/ip_forward-before" >/proc/sys/net/ipv4/ip_forward
        say "ip_forward back to $(cat "$STATE/ip_forward-before")"
    }
    libvirt_down
    local procs
    procs="$(ps -eo pid,args | grep -E 'qemu-system|dnsmasq.*'"$NET_NAME"'|ssh .*-L 127\.0\.0\.1:[0-9]+:127\.0\.0\.1:8888' | grep -v grep || true)"
    [ -z "$procs" ] || { fail "processes left: $procs"; return 1; }
    [ -z "$leftover" ] || { fail "firewall chains left: $leftover"; return 1; }
    say "no qemu, dnsmasq or ssh forward of ours running; firewall chains and ip_forward as before"
}

VM_MADE=0
DESTROYED=0
finish() {
    local rc=$?
    trap - EXIT
    if [ "${LABKIT_VMTEST_KEEP:-0}" = 1 ]; then
        [ "$VM_MADE" = 1 ] && say "LABKIT_VMTEST_KEEP=1: the VM stays up (cd vagrant && VAGRANT_HOME=$VAGRANT_HOME VAGRANT_DOTFILE_PATH=$VAGRANT_DOTFILE_PATH vagrant ssh); daemons started: ${STARTED_PIDS[*]:-none}"
    elif [ "$VM_MADE" = 1 ] && [ "$DESTROYED" = 0 ]; then
        DESTROYED=1
        step destroy destroy || true
        step host host_left_as_it_was || true
    else
        libvirt_down
    fi
    echo
    say "step times (total $((SECONDS - T_ALL)) s):"
    printf '  %s\n' "${TIMES[@]}"
    if [ -n "$FAILED" ] || [ $rc != 0 ]; then
        say "FAILED: ${FAILED:-exit $rc}   (logs: $LOGS)"
        exit 1
    fi
    say "passed   (logs: $LOGS)"
}
trap finish EXIT

step host-packages host_packages
step box box
step libvirt libvirt_up
snapshot_host "$STATE/before.txt"
chains >"$STATE/chains-before.txt"
cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward-before"
machine_vagrantfile
step validate V validate
if [ "$NO_BOOT" = 1 ]; then
    say "--no-boot: stopping before vagrant up"
    exit 0
fi
rm -f "$LOGS/console.log"
VM_MADE=1
step up up
step provisioned provisioned
if [ "$OFFLINE" = 1 ]; then
    step offline offline || true
    step doctor doctor || true
    step lab lab || true
    step jupyter jupyter || true
    step privileges privileges || true
    exit 0
fi
step doctor doctor || true
step lab lab || true
step jupyter jupyter || true
step privileges privileges || true
step labs labs || true
step work work || true
