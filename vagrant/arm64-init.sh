#!/bin/bash
# The arm64 test machine's init (vagrant/arm64-rootfs.sh installs it as
# /usr/local/sbin/labkit-arm64-init; vagrant/arm64-test.sh boots the kernel with
# init= pointing here).  It sets up what labkit needs from a booted system --
# /proc, /sys, /run, bpffs, cgroup v2, loopback -- then runs, as root with
# CI=true (a test that cannot reach BPF fails):
#   1. vagrant/arm64-smoke.py with the system python3 (bpf(2) on this kernel);
#   2. `labkit doctor`;
#   3. python -m pytest on each path of labkit.tests= on the kernel command line
#      (comma-separated, default tests/bpf,tests/unit), with a JUnit file each.
# Every line goes to the console; the logs are written as a tar stream to the
# disk whose serial is labkit-results for the host; then the machine powers off.
set +e
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 TERM=dumb
REPO=/home/vagrant/labkit
LOGS=/var/log/labkit-arm64
VENV=/opt/labkit/venv

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -o remount,rw /
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
hostname labkit-arm64
ip link set lo up
rm -rf "$LOGS" && mkdir -p "$LOGS"

say() { echo "labkit-arm64: $*" | tee -a "$LOGS/summary.txt" >/dev/console; }
# run NAME COMMAND...: its output to the console and to $LOGS/NAME.log; its exit status and time to the summary.
run() {
    local name="$1" t=$SECONDS rc
    shift
    say "--- $name: $*"
    "$@" 2>&1 | tee "$LOGS/$name.log" >/dev/console
    rc=${PIPESTATUS[0]}
    say "$name: exit $rc ($((SECONDS - t)) s)"
    return $rc
}

say "kernel $(uname -srm), $(nproc) CPUs, $(awk '/MemTotal/ {print int($2 / 1024) " MiB"}' /proc/meminfo)"
tests="$(sed -n 's/.*labkit\.tests=\([^ ]*\).*/\1/p' /proc/cmdline)"
failed=0
cd "$REPO" || failed=1
run smoke /usr/bin/python3 vagrant/arm64-smoke.py labkit/datapath/bpf.py || failed=1
run doctor env CI=true PYTHONPATH="$REPO" "$VENV/bin/labkit" doctor || failed=1
IFS=, read -r -a paths <<<"${tests:-tests/bpf,tests/unit}"
for path in "${paths[@]}"; do
    tag="pytest-$(printf '%s' "$path" | tr '/.' '__')"
    run "$tag" env CI=true PYTHONPATH="$REPO" "$VENV/bin/python" -m pytest "$path" -q -p no:cacheprovider \
        --junitxml="$LOGS/$tag.xml" || failed=1
done
say "DONE failed=$failed"
results=""
for f in /sys/block/vd*/serial; do [ "$(cat "$f" 2>/dev/null)" = labkit-results ] && results="/dev/$(basename "$(dirname "$f")")"; done
if [ -n "$results" ]; then tar -cf "$results" -C "$LOGS" . 2>/dev/console; else say "no disk with serial labkit-results: logs not handed back"; fi
sync
echo 1 >/proc/sys/kernel/sysrq
echo o >/proc/sysrq-trigger
sleep 60
