#!/usr/bin/env bash
# make arm64-test: labkit's datapath on arm64 -- the arm64 box booted with
# qemu-system-aarch64 (-M virt, UEFI firmware, TCG emulation on an x86_64 host,
# KVM on an arm64 Linux host), this checkout copied in, provisioned with --dev,
# then the BPF-unit and unit tests run inside as root and their results copied
# out.  No Vagrant, no libvirt: QEMU's user-mode network with an ssh forward.
# Not part of `make test`: on a 2-core x86_64 machine the emulated run takes a
# long time (see README.md, "Where the VM was tested").
#
#   sudo bash vagrant/arm64-test.sh                 # or: sudo make arm64-test
#   sudo bash vagrant/arm64-test.sh --box FILE      # an arm64 box built before
#   sudo LABKIT_ARM64_TESTS="tests/bpf tests/unit/test_layout.py" bash vagrant/arm64-test.sh
#
# Steps (each prints its time):
#   host-packages  qemu-system-arm, qemu-efi-aarch64 (AAVMF), qemu-user-static,
#                  binfmt-support, arch-test, mmdebstrap, dosfstools (apt, when missing)
#   box            ARCH=arm64 LABKIT_BOX_DEV=1 vagrant/build-box.sh --provisioned: the
#                  arm64 userland and provision.sh --image --dev run through qemu-user
#                  in a chroot (much faster than inside the emulated VM); reused while
#                  it is there
#   boot           qemu-system-aarch64 -M virt -cpu max -smp 2 -m 3072 on a copy-on-write
#                  overlay of the box's disk, AAVMF (edk2) -> GRUB on the EFI system
#                  partition -> Debian's arm64 kernel; waits for ssh
#   copy           this checkout (tracked and new files, as git sees them) into
#                  /home/vagrant/labkit, with a fresh one-commit git repository (the
#                  unit tests read .gitattributes through git)
#   smoke          vagrant/arm64-smoke.py with the system python3, before provisioning: labkit's
#                  bpf(2) wrapper (aarch64's syscall number) on maps, and a hand-assembled tc
#                  program through BPF_PROG_TEST_RUN on the arm64 kernel
#   provision      vagrant/provision.sh --dev inside, as root
#   tests          python -m pytest on each of LABKIT_ARM64_TESTS (default: tests/bpf,
#                  then tests/unit) as root with CI=true: a test that cannot reach BPF fails
#   shutdown       poweroff, then the QEMU process it started is gone
#
# Results: $LABKIT_ARM64_DIR/logs (default /var/tmp/labkit-arm64-test/logs):
# console.log (the guest's serial console), provision.log, pytest-*.log and
# pytest-*.xml (JUnit) per test path, times.txt.
# Environment: LABKIT_ARM64_KEEP=1 leaves the VM running (ssh command printed).
set -euo pipefail

PROG=arm64-test
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
STATE="${LABKIT_ARM64_DIR:-/var/tmp/labkit-arm64-test}"
LOGS="$STATE/logs"
BOX_FILE="$STATE/box/labkit-debian12-arm64.box"
TESTS="${LABKIT_ARM64_TESTS:-tests/bpf tests/unit}"
GUEST_REPO=/home/vagrant/labkit
FIRMWARE=/usr/share/AAVMF/AAVMF_CODE.fd
FIRMWARE_VARS=/usr/share/AAVMF/AAVMF_VARS.fd
BOOT_TIMEOUT="${LABKIT_ARM64_BOOT_TIMEOUT:-1800}"
case "${1:-}" in
    --box) BOX_FILE="$(readlink -f "${2:?--box needs a file}")" ;;
    "") ;;
    *) echo "usage: $0 [--box FILE]" >&2; exit 2 ;;
esac

T_ALL=$SECONDS
declare -a TIMES=()
QEMU_PID=""
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

[ "$(id -u)" = 0 ] || die "run as root (loop devices for the box): sudo bash $0"
mkdir -p "$STATE/box" "$LOGS"
VM="$STATE/vm"
KEY="$STATE/vagrant-key"

summary() {
    local rc=$?
    set +e
    if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null && [ "${LABKIT_ARM64_KEEP:-0}" != 1 ]; then
        say "stopping the VM (QEMU pid $QEMU_PID)"
        kill "$QEMU_PID"
    fi
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
    for p in qemu-system-arm qemu-efi-aarch64 qemu-utils qemu-user-static binfmt-support arch-test mmdebstrap \
        dosfstools fdisk e2fsprogs vagrant openssh-client git; do
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
    local pub
    pub="$(dpkg -L vagrant | grep -m1 '/keys/vagrant$')"
    install -m 600 "$pub" "$KEY"
}

# ------------------------------------------------------------------ box
box() {
    if [ -s "$BOX_FILE" ]; then
        say "reusing $BOX_FILE"
        return 0
    fi
    ARCH=arm64 LABKIT_BOX_DEV=1 LABKIT_DEV_OPTIONAL=0 nice -n 19 bash "$REPO/vagrant/build-box.sh" --provisioned "$BOX_FILE" \
        >"$LOGS/build-box.log" 2>&1 || { tail -n 20 "$LOGS/build-box.log"; return 1; }
    tail -n 1 "$LOGS/build-box.log"
}

# ------------------------------------------------------------------ boot
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

SSH_PORT=""
gssh() {
    ssh -q -i "$KEY" -p "$SSH_PORT" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
        -o ConnectTimeout=20 -o ServerAliveInterval=30 -o ServerAliveCountMax=20 -o BatchMode=yes \
        vagrant@127.0.0.1 "$@"
}

boot() {
    rm -rf "$VM" && mkdir -p "$VM"
    tar -C "$VM" -xf "$BOX_FILE" box.img metadata.json
    grep -q '"architecture": "arm64"' "$VM/metadata.json" || { say "$BOX_FILE is not an arm64 box"; return 1; }
    qemu-img create -q -f qcow2 -F qcow2 -b "$VM/box.img" "$VM/disk.qcow2"
    cp "$FIRMWARE_VARS" "$VM/vars.fd"
    SSH_PORT="$(free_port)"
    local accel=tcg cpu=max
    # -cpu max under TCG emulates pointer authentication with QARMA, which costs more than the rest;
    # pauth-impdef=on keeps the feature with a cheap implementation-defined algorithm.
    if [ "$(uname -m)" = aarch64 ] && [ -w /dev/kvm ]; then accel=kvm cpu=host; else cpu=max,pauth-impdef=on; fi
    say "qemu-system-aarch64 -M virt,accel=$accel -cpu $cpu -smp 2 -m 3072, ssh on 127.0.0.1:$SSH_PORT"
    nice -n 19 qemu-system-aarch64 -M "virt,accel=$accel" -cpu "$cpu" -smp 2 -m 3072 \
        -drive "if=pflash,format=raw,readonly=on,file=$FIRMWARE" \
        -drive "if=pflash,format=raw,file=$VM/vars.fd" \
        -drive "if=virtio,format=qcow2,file=$VM/disk.qcow2" \
        -device virtio-net-device,netdev=net0 -netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$SSH_PORT-:22" \
        -device virtio-rng-device \
        -display none -monitor none -serial "file:$LOGS/console.log" \
        -pidfile "$VM/qemu.pid" -daemonize
    QEMU_PID="$(cat "$VM/qemu.pid")"
    local t=$SECONDS
    until gssh true 2>/dev/null; do
        kill -0 "$QEMU_PID" 2>/dev/null || { say "QEMU exited; see $LOGS/console.log"; QEMU_PID=""; return 1; }
        [ $((SECONDS - t)) -lt "$BOOT_TIMEOUT" ] || { say "no ssh after $BOOT_TIMEOUT s; see $LOGS/console.log"; return 1; }
        sleep 10
    done
    gssh 'uname -srm; cat /proc/cpuinfo | grep -m1 -i features' | sed 's/^/  guest: /'
}

# ------------------------------------------------------------------ copy
copy() {
    local src="$VM/src"
    rm -rf "$src" && mkdir -p "$src"
    git -C "$REPO" ls-files -z -c -o --exclude-standard | (cd "$REPO" && tar --null -T - -cf -) | tar -C "$src" -xf -
    git -C "$src" init -q && git -C "$src" add -A &&
        git -C "$src" -c user.name=labkit -c user.email=labkit@localhost commit -q -m "arm64-test copy of $(git -C "$REPO" rev-parse --short HEAD)"
    tar -C "$src" -cf - . | gssh "sudo rm -rf $GUEST_REPO && mkdir -p $GUEST_REPO && tar -C $GUEST_REPO -xf -"
    gssh "git --version >/dev/null 2>&1 || sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git >/dev/null"
}

# ------------------------------------------------------------------ smoke
smoke() {
    gssh "sudo python3 $GUEST_REPO/vagrant/arm64-smoke.py $GUEST_REPO/labkit/datapath/bpf.py" 2>&1 | tee "$LOGS/smoke.log"
    return "${PIPESTATUS[0]}"
}

# ------------------------------------------------------------------ provision
provision() {
    gssh "sudo bash $GUEST_REPO/vagrant/provision.sh --dev" 2>&1 | tee "$LOGS/provision.log"
    return "${PIPESTATUS[0]}"
}

# ------------------------------------------------------------------ tests
tests() {
    local path="$1" tag rc=0
    tag="$(printf '%s' "$path" | tr '/.' '__')"
    gssh "cd $GUEST_REPO && sudo env CI=true PYTHONPATH=$GUEST_REPO /opt/labkit/venv/bin/python -m pytest $path -q \
        -p no:cacheprovider --junitxml=/tmp/pytest-$tag.xml" >"$LOGS/pytest-$tag.log" 2>&1 || rc=$?
    gssh "cat /tmp/pytest-$tag.xml" >"$LOGS/pytest-$tag.xml" 2>/dev/null || true
    tail -n 3 "$LOGS/pytest-$tag.log" | sed 's/^/  /'
    return $rc
}

# ------------------------------------------------------------------ shutdown
shutdown() {
    [ "${LABKIT_ARM64_KEEP:-0}" = 1 ] && { say "left running: ssh -i $KEY -p $SSH_PORT vagrant@127.0.0.1"; return 0; }
    gssh 'sudo systemctl poweroff' || true
    local t=$SECONDS
    while kill -0 "$QEMU_PID" 2>/dev/null && [ $((SECONDS - t)) -lt 180 ]; do sleep 5; done
    if kill -0 "$QEMU_PID" 2>/dev/null; then say "no poweroff after 180 s; killing QEMU"; kill "$QEMU_PID"; fi
    QEMU_PID=""
    rm -rf "$VM"
}

step host-packages host_packages
step box box
step boot boot
step copy copy
step smoke smoke
step provision provision
FAILED_TESTS=0
for t in $TESTS; do
    step "tests $t" tests "$t" || FAILED_TESTS=1
done
step shutdown shutdown
[ "$FAILED_TESTS" = 0 ]
