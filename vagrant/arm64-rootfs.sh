#!/usr/bin/env bash
# The test machine of `make arm64-test`: an arm64 Debian 12 root file system,
# provisioned by this checkout's vagrant/provision.sh --dev, packed into an
# ext4 disk image that qemu-system-aarch64 boots with Debian's arm64 kernel
# directly (-kernel/-initrd, no firmware, no boot loader).  Run as root on an
# x86_64 host with qemu-user-static and binfmt, or natively on arm64.
#
#   sudo bash vagrant/arm64-rootfs.sh OUTDIR
#
# OUTDIR receives disk.img (ext4, the root), vmlinuz, initrd.img (made here:
# busybox-static and the few modules the root needs) and kernel-release; it
# keeps the root's tree (OUTDIR/root) so that a second run only copies this
# checkout in again and re-runs provision.sh (which then has nothing to install).
#
# Why not the Vagrant box (vagrant/build-box.sh ARCH=arm64)?  Its maintainer
# scripts run through qemu-user, where Debian's initramfs build alone took over
# 15 minutes.  Here update-initramfs is diverted while packages install (the
# initrd above replaces it), the root needs no systemd, ssh or network (the
# guest runs its tests as its init, then powers off), and the disk is written
# by mkfs.ext4 -d without loop devices.  provision.sh runs in the chroot exactly
# as it would in a VM (`--image --dev`: apt, kernel headers of the kernel it
# boots, bpftool, the venv with labkit's notebook and test extras).
set -euo pipefail

PROG=labkit-arm64-rootfs
OUT="${1:?usage: $0 OUTDIR}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
GUEST_REPO=/home/vagrant/labkit
SUITE=bookworm
DISK_GB="${LABKIT_ARM64_DISK_GB:-12}"
# The root's own packages; provision.sh installs the rest (the same list as on any VM). ruby: the unit
# tests that read the Vagrantfile run it (on a laptop it comes with Vagrant).
PKGS=linux-image-arm64,busybox-static,kmod,udev,iproute2,procps,python3,ca-certificates,git,sudo,less,ruby
# Modules the root needs before it is mounted, with what they depend on (modules.dep).
ROOT_MODULES="virtio_pci virtio_blk ext4 crc32c_generic"
say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (chroot, mounts): sudo bash $0 $*"
if [ "$(dpkg --print-architecture)" != arm64 ]; then
    arch-test arm64 >/dev/null 2>&1 ||
        die "this host cannot run arm64 programs: apt-get install qemu-user-static binfmt-support arch-test, then update-binfmts --enable qemu-aarch64"
fi
for tool in mmdebstrap mkfs.ext4 cpio gzip; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install mmdebstrap e2fsprogs cpio gzip)"
done
SOURCES=""
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    if [ -s "$f" ] && grep -qE "^(deb |Suites:.*$SUITE|URIs:)" "$f"; then SOURCES="$f"; break; fi
done
[ -n "$SOURCES" ] || die "no Debian apt sources on this host (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list)"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd -P)"
ROOT="$OUT/root"
WORK="$(mktemp -d /var/tmp/labkit-arm64-rootfs.XXXXXX)"
# shellcheck source=chroot-lib.sh
. "$REPO/vagrant/chroot-lib.sh"
trap 'set +e; chroot_umount "$ROOT"; rm -rf "$WORK"' EXIT

t0=$SECONDS
if [ -f "$OUT/.debian-done" ]; then
    say "reusing the Debian root in $ROOT"
else
rm -rf "$ROOT"
CA_DIR=/usr/local/share/ca-certificates
say "mmdebstrap $SUITE arm64 (update-initramfs diverted) ..."
mmdebstrap --arch=arm64 --variant=minbase --include="$PKGS" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --essential-hook='chroot "$1" dpkg-divert --quiet --local --rename --add /usr/sbin/update-initramfs' \
    --essential-hook='ln -s /bin/true "$1/usr/sbin/update-initramfs"' \
    --customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"' \
    --customize-hook="if [ -d $CA_DIR ] && [ -n \"\$(ls -A $CA_DIR)\" ]; then cp -a $CA_DIR/. \"\$1/usr/local/share/ca-certificates/\"; chroot \"\$1\" update-ca-certificates >/dev/null; fi" \
    "$SUITE" "$ROOT" "$SOURCES"
chroot "$ROOT" useradd -m -s /bin/bash -G sudo vagrant
touch "$OUT/.debian-done"
fi
KVER="$(basename "$(ls -1 "$ROOT"/boot/vmlinuz-* | sort -V | tail -n 1)")"
KVER="${KVER#vmlinuz-}"
say "debian installed, kernel $KVER ($((SECONDS - t0)) s)"

# --- provisioning, as in a VM --------------------------------------------------
t1=$SECONDS
rm -rf "${ROOT:?}$GUEST_REPO"
mkdir -p "$ROOT$GUEST_REPO"
# This checkout as Vagrant's share would copy it (tracked and new files, nothing ignored), as one
# commit: the unit tests read .gitattributes through git.
copy_checkout "$REPO" "$ROOT$GUEST_REPO"
git -C "$ROOT$GUEST_REPO" init -q
git -C "$ROOT$GUEST_REPO" add -A
git -C "$ROOT$GUEST_REPO" -c user.name=labkit -c user.email=labkit@localhost commit -q \
    -m "arm64-test copy of $(git -C "$REPO" rev-parse --short HEAD)"
chroot "$ROOT" chown -R vagrant:vagrant "$GUEST_REPO"
# The tests run as root in the vagrant user's checkout (as `sudo make test` in a VM, without sudo's SUDO_UID).
chroot "$ROOT" git config --system safe.directory "$GUEST_REPO"
chroot_mount "$ROOT"
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$ROOT/etc/pip.conf"
# A root kept from an earlier run gets the packages added to PKGS since.
missing=()
for p in ${PKGS//,/ }; do
    chroot "$ROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q ' ok installed$' || missing+=("$p")
done
if [ "${#missing[@]}" != 0 ]; then
    say "adding ${missing[*]} to the root ..."
    chroot "$ROOT" apt-get update -qq
    chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${PKGS//,/ } >/dev/null
fi
say "provision.sh --image --dev in the chroot ..."
chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LABKIT_KREL="$KVER" LABKIT_DEV_OPTIONAL=0 \
    bash "$GUEST_REPO/vagrant/provision.sh" --image --dev || die "provisioning in the arm64 chroot failed"
chroot "$ROOT" apt-get clean
chroot_umount "$ROOT"
say "provisioned ($((SECONDS - t1)) s)"

# --- initrd: busybox and the root's modules -------------------------------------
INITRD="$WORK/initrd"
mkdir -p "$INITRD"/{bin,dev,proc,sys,newroot,lib/modules}
cp "$ROOT/bin/busybox" "$INITRD/bin/busybox"
# Each module the root needs, after those it depends on (modules.dep), uncompressed (busybox's
# insmod reads plain .ko files); a built-in one needs nothing.
python3 - "$ROOT/lib/modules/$KVER" "$INITRD/lib/modules" $ROOT_MODULES <<'PY'
import lzma, pathlib, sys

moddir, out, wanted = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
def name(path):
    return pathlib.Path(path).name.split(".ko")[0].replace("-", "_")
deps = {}
for line in (moddir / "modules.dep").read_text().splitlines():
    path, _, rest = line.partition(":")
    deps[name(path)] = (path, rest.split())
builtin = {name(p) for p in (moddir / "modules.builtin").read_text().split()}
order = []
def want(mod):
    if mod in builtin or mod in order:
        return
    if mod not in deps:
        sys.exit(f"module {mod}: neither built in nor in modules.dep of {moddir}")
    path, needs = deps[mod]
    for dep in needs:
        want(name(dep))
    data = (moddir / path).read_bytes()
    if path.endswith(".xz"):
        data = lzma.decompress(data)
    elif not path.endswith(".ko"):
        sys.exit(f"module {mod}: {path} is compressed in a way this script does not read")
    (out / f"{mod}.ko").write_bytes(data)
    order.append(mod)
for mod in wanted:
    want(mod)
(out / "order").write_text("".join(f"{m}.ko\n" for m in order))
print("initrd modules:", " ".join(order) or "(all built in)")
PY
cat >"$INITRD/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sys /sys
/bin/busybox mount -t devtmpfs dev /dev
while read -r m; do /bin/busybox insmod "/lib/modules/$m" 2>/dev/null || true; done </lib/modules/order
root="$(/bin/busybox sed -n 's/.*root=\([^ ]*\).*/\1/p' /proc/cmdline)"
init="$(/bin/busybox sed -n 's/.*init=\([^ ]*\).*/\1/p' /proc/cmdline)"
i=0
until [ -b "$root" ] || [ $i -ge 30 ]; do /bin/busybox sleep 1; i=$((i + 1)); done
/bin/busybox mount -t ext4 "$root" /newroot || { echo "initrd: cannot mount $root"; /bin/busybox sh; }
/bin/busybox umount /proc /sys
/bin/busybox mount --move /dev /newroot/dev
exec /bin/busybox switch_root /newroot "${init:-/sbin/init}"
EOF
chmod 755 "$INITRD/init"
(cd "$INITRD" && find . | cpio -o -H newc --quiet | gzip -1) >"$OUT/initrd.img"

# --- disk ---------------------------------------------------------------------
install -m 755 "$REPO/vagrant/arm64-init.sh" "$ROOT/usr/local/sbin/labkit-arm64-init"
cp "$ROOT/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
echo "$KVER" >"$OUT/kernel-release"
rm -f "$OUT/disk.img"
mkfs.ext4 -q -L labkit-root -d "$ROOT" "$OUT/disk.img" "${DISK_GB}G"
say "root $OUT/disk.img ($(du -h "$OUT/disk.img" | cut -f1) used of ${DISK_GB}G), kernel $KVER ($((SECONDS - t0)) s)"
