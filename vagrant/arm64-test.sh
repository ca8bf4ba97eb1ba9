#!/usr/bin/env bash
# make arm64-test: labkit's datapath on arm64.  An arm64 Debian 12 machine
# (vagrant/arm64-rootfs.sh: Debian's arm64 kernel and packages, this checkout
# provisioned by vagrant/provision.sh --dev) is booted with qemu-system-aarch64
# (-M virt; TCG emulation on an x86_64 host, KVM on an arm64 Linux host).  Its
# init (vagrant/arm64-init.sh) runs the smoke check, `labkit doctor`, then the
# BPF-unit and unit tests as root with CI=true, hands the logs back on a second
# disk and powers off.  No Vagrant, no libvirt, no network in the guest.
# Not part of `make test`: on a 2-core x86_64 machine the emulated run takes a
# long time (see README.md, "Which computer, which provider").
#
#   sudo bash vagrant/arm64-test.sh                 # or: sudo make arm64-test
#   sudo LABKIT_ARM64_TESTS=tests/bpf,tests/unit/test_layout.py bash vagrant/arm64-test.sh
#
# Steps (each prints its time):
#   host-packages  qemu-system-arm, qemu-user-static, binfmt-support, arch-test,
#                  mmdebstrap, e2fsprogs, cpio (apt, when missing)
#   machine        vagrant/arm64-rootfs.sh $LABKIT_ARM64_DIR/machine: the Debian root is
#                  built once and kept; each run copies this checkout in again, re-runs
#                  provision.sh --image --dev and writes the disk image
#   run            qemu-system-aarch64 -M virt -cpu max -smp 2 -m 4096 -kernel ... on a
#                  copy-on-write overlay of the disk; waits until the guest powers off
#                  (LABKIT_ARM64_TIMEOUT seconds at most, default 14400)
#   results        the guest's logs from the second disk; passed when its summary says
#                  failed=0 and every test path's JUnit file has no failure or error
#   box            the Vagrant box for Apple Silicon, as its README line builds it
#                  (ARCH=arm64 vagrant/build-box.sh); kept while build-box.sh is unchanged
#   box-boot       that box booted as vagrant-qemu boots it: qemu-system-aarch64 -M virt,
#                  UEFI firmware (AAVMF) -> GRUB at EFI/BOOT/BOOTAA64.EFI -> Debian's kernel,
#                  a virtio disk, user-mode network with an ssh forward; then ssh as vagrant
#                  with Vagrant's insecure key, passwordless sudo, the ESP mounted, power-off
#
# Results: $LABKIT_ARM64_DIR/logs (default /var/tmp/labkit-arm64-test/logs):
# console.log (the guest's serial console), machine.log, summary.txt, smoke.log,
# doctor.log, pytest-*.log and pytest-*.xml (JUnit) per test path, build-box.log,
# box-console.log, box-boot.log, times.txt.  LABKIT_ARM64_BOX=0 leaves out the box,
# LABKIT_ARM64_MACHINE=0 the test machine.
# The Vagrant box for Apple Silicon is vagrant/build-box.sh ARCH=arm64; this
# test shares its packages and provisioning, not its boot loader.
set -euo pipefail

PROG=arm64-test
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
STATE="${LABKIT_ARM64_DIR:-/var/tmp/labkit-arm64-test}"
LOGS="$STATE/logs"
MACHINE="$STATE/machine"
BOX_FILE="$STATE/box/labkit-debian12-arm64.box"
FIRMWARE=/usr/share/AAVMF/AAVMF_CODE.fd
FIRMWARE_VARS=/usr/share/AAVMF/AAVMF_VARS.fd
TESTS="${LABKIT_ARM64_TESTS:-tests/bpf,tests/unit}"
RUN_TIMEOUT="${LABKIT_ARM64_TIMEOUT:-14400}"
[ $# = 0 ] || { echo "usage: $0 (no arguments; see the environment variables in its header)" >&2; exit 2; }

T_ALL=$SECONDS
declare -a TIMES=()
say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

# step NAME COMMAND...: run it, print and keep its time.
step() {
    local name="$1" t=$SECONDS rc=0
    shift
    say "--- $name ..."
    "$@" || rc=$?
    TIMES+=("$(printf '%-28s %6d s  %s' "$name" $((SECONDS - t)) "$([ $rc = 0 ] && echo ok || echo FAILED)")")
    say "$name: $([ $rc = 0 ] && echo ok || echo FAILED) ($((SECONDS - t)) s)"
    return $rc
}

[ "$(id -u)" = 0 ] || die "run as root (chroot and mounts for the machine): sudo bash $0"
mkdir -p "$LOGS"
rm -f "$LOGS"/*.log "$LOGS"/*.xml "$LOGS"/summary.txt

summary() {
    local rc=$?
    set +e
    printf '%s\n' "${TIMES[@]}" "$(printf '%-28s %6d s' total $((SECONDS - T_ALL)))" >"$LOGS/times.txt"
    say "times:"
    sed 's/^/  /' "$LOGS/times.txt"
    say "logs: $LOGS"
    [ $rc = 0 ] && say PASSED || say "FAILED (exit $rc)"
}
trap summary EXIT

# ------------------------------------------------------------------ host packages
host_packages() {
    local need=() p
    for p in qemu-system-arm qemu-efi-aarch64 qemu-utils qemu-user-static binfmt-support arch-test mmdebstrap e2fsprogs \
        cpio git dosfstools mtools fdisk vagrant openssh-client; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q ' ok installed' || need+=("$p")
    done
    if [ "${#need[@]}" != 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
    fi
    if [ "$(uname -m)" != aarch64 ] && ! arch-test arm64 >/dev/null 2>&1; then
        # binfmt_misc may not be mounted in a container; update-binfmts registers qemu-aarch64 once it is.
        mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
        update-binfmts --enable qemu-aarch64
        arch-test arm64 >/dev/null 2>&1 || { say "this host cannot run arm64 programs through binfmt"; return 1; }
    fi
}

# ------------------------------------------------------------------ machine
machine() {
    nice -n 10 bash "$REPO/vagrant/arm64-rootfs.sh" "$MACHINE" >"$LOGS/machine.log" 2>&1 ||
        { tail -n 20 "$LOGS/machine.log"; return 1; }
    grep -E '^labkit-arm64-rootfs: ' "$LOGS/machine.log" | sed 's/^/  /'
}

# ------------------------------------------------------------------ run
run() {
    local vm="$STATE/vm" accel=tcg cpu=max,pauth-impdef=on rc=0
    rm -rf "$vm" && mkdir -p "$vm"
    qemu-img create -q -f qcow2 -F raw -b "$MACHINE/disk.img" "$vm/disk.qcow2"
    truncate -s 256M "$vm/results.img"
    # -cpu max under TCG emulates pointer authentication with QARMA, which costs more than the rest;
    # pauth-impdef=on keeps the feature with a cheap implementation-defined algorithm.
    if [ "$(uname -m)" = aarch64 ] && [ -w /dev/kvm ]; then accel=kvm cpu=host; fi
    say "qemu-system-aarch64 -M virt,accel=$accel -cpu $cpu -smp 2 -m 4096, kernel $(cat "$MACHINE/kernel-release"), tests $TESTS"
    timeout "$RUN_TIMEOUT" qemu-system-aarch64 -M "virt,accel=$accel" -cpu "$cpu" -smp 2 -m 4096 \
        -kernel "$MACHINE/vmlinuz" -initrd "$MACHINE/initrd.img" \
        -append "root=/dev/vda console=ttyAMA0 init=/usr/local/sbin/labkit-arm64-init labkit.tests=$TESTS" \
        -drive "if=none,id=root,format=qcow2,file=$vm/disk.qcow2" -device virtio-blk-pci,drive=root \
        -drive "if=none,id=results,format=raw,file=$vm/results.img" -device virtio-blk-pci,drive=results,serial=labkit-results \
        -device virtio-rng-pci -nic none \
        -display none -monitor none -serial "file:$LOGS/console.log" -no-reboot || rc=$?
    [ $rc = 0 ] || say "qemu-system-aarch64 ended with exit $rc$([ $rc = 124 ] && echo " (no power-off within $RUN_TIMEOUT s)")"
    return $rc
}

# ------------------------------------------------------------------ results
results() {
    local vm="$STATE/vm" f bad=0
    tar -C "$LOGS" -xf "$vm/results.img" || { say "no logs on the results disk; see $LOGS/console.log"; return 1; }
    rm -rf "$vm"
    sed 's/^/  /' "$LOGS/summary.txt"
    grep -q '^labkit-arm64: DONE failed=0$' "$LOGS/summary.txt" || bad=1
    for f in "$LOGS"/pytest-*.xml; do
        [ -f "$f" ] || { say "no JUnit file"; bad=1; continue; }
        python3 - "$f" <<'PY' || bad=1
import sys, xml.etree.ElementTree as ET

suite = ET.parse(sys.argv[1]).getroot()
suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
print(f"  {sys.argv[1].rsplit('/', 1)[-1]}: {n['tests']} tests, {n['failures']} failures, {n['errors']} errors, {n['skipped']} skipped")
sys.exit(1 if n["failures"] or n["errors"] or not n["tests"] else 0)
PY
    done
    return $bad
}

# ------------------------------------------------------------------ box
box() {
    if [ -s "$BOX_FILE" ] && [ "$BOX_FILE" -nt "$REPO/vagrant/build-box.sh" ]; then
        say "reusing $BOX_FILE (newer than build-box.sh)"
        return 0
    fi
    mkdir -p "$(dirname "$BOX_FILE")"
    ARCH=arm64 nice -n 10 bash "$REPO/vagrant/build-box.sh" "$BOX_FILE" >"$LOGS/build-box.log" 2>&1 ||
        { tail -n 20 "$LOGS/build-box.log"; return 1; }
    grep -E '^labkit-build-box: ' "$LOGS/build-box.log" | sed 's/^/  /'
}

# ------------------------------------------------------------------ box-boot
box_boot() {
    local vm="$STATE/box-vm" key="$STATE/vagrant-key" port pid t rc=0
    rm -rf "$vm" && mkdir -p "$vm"
    install -m 600 "$(dpkg -L vagrant | grep -m1 '/keys/vagrant$')" "$key"
    tar -C "$vm" -xf "$BOX_FILE" box.img metadata.json
    grep -q '"architecture": "arm64"' "$vm/metadata.json" || { say "$BOX_FILE is not an arm64 box"; return 1; }
    qemu-img create -q -f qcow2 -F qcow2 -b "$vm/box.img" "$vm/disk.qcow2"
    cp "$FIRMWARE_VARS" "$vm/vars.fd"
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    say "qemu-system-aarch64 -M virt, AAVMF firmware, the box's disk; ssh on 127.0.0.1:$port"
    qemu-system-aarch64 -M virt,accel=tcg -cpu max,pauth-impdef=on -smp 2 -m 2048 \
        -drive "if=pflash,format=raw,readonly=on,file=$FIRMWARE" -drive "if=pflash,format=raw,file=$vm/vars.fd" \
        -drive "if=virtio,format=qcow2,file=$vm/disk.qcow2" \
        -device virtio-net-pci,netdev=net0,romfile= -netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$port-:22" \
        -display none -monitor none -serial "file:$LOGS/box-console.log" -pidfile "$vm/qemu.pid" -daemonize
    pid="$(cat "$vm/qemu.pid")"
    gssh() {
        ssh -q -i "$key" -p "$port" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=20 \
            -o BatchMode=yes vagrant@127.0.0.1 "$@"
    }
    t=$SECONDS
    until gssh true 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null || [ $((SECONDS - t)) -gt 1200 ]; then
            say "no ssh into the box after $((SECONDS - t)) s; see $LOGS/box-console.log"
            kill "$pid" 2>/dev/null
            return 1
        fi
        sleep 10
    done
    say "ssh as vagrant after $((SECONDS - t)) s"
    gssh 'uname -srm; cat /etc/debian_version; sudo -n true && echo "sudo: no password"; findmnt -n -o TARGET,FSTYPE /boot/efi; sudo test -f /boot/efi/EFI/BOOT/BOOTAA64.EFI && echo "GRUB at EFI/BOOT/BOOTAA64.EFI"' \
        2>&1 | tee "$LOGS/box-boot.log" | sed 's/^/  box: /'
    grep -q '^sudo: no password$' "$LOGS/box-boot.log" && grep -q 'aarch64' "$LOGS/box-boot.log" &&
        grep -q '^GRUB at EFI/BOOT/BOOTAA64.EFI$' "$LOGS/box-boot.log" || rc=1
    gssh 'sudo systemctl poweroff' 2>/dev/null || true
    t=$SECONDS
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t)) -lt 180 ]; do sleep 5; done
    if kill -0 "$pid" 2>/dev/null; then say "no power-off after 180 s; stopping QEMU"; kill "$pid"; rc=1; fi
    rm -rf "$vm"
    return $rc
}

step host-packages host_packages
FAILED=0
if [ "${LABKIT_ARM64_MACHINE:-1}" = 1 ]; then
    if step machine machine && step run run; then step results results || FAILED=1; else FAILED=1; fi
fi
if [ "${LABKIT_ARM64_BOX:-1}" = 1 ]; then
    if step box box; then step box-boot box_boot || FAILED=1; else FAILED=1; fi
fi
[ "$FAILED" = 0 ]
