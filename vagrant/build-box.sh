#!/usr/bin/env bash
# Build a Debian 12 (bookworm, amd64) Vagrant box for the libvirt provider from
# Debian packages alone -- no box registry needed.  Used by vagrant/vm-test.sh;
# run as root (loop devices, mounts).  About 100 s on a 2-core machine.
#
#   sudo bash vagrant/build-box.sh OUT.box
#   sudo bash vagrant/build-box.sh --provisioned OUT.box   # make box: ready for a room without network
#
# The box: one 20 GB disk (MBR, one ext4 partition), linux-image-amd64 booted
# by extlinux (console on ttyS0 too), DHCP on eth0, openssh-server, sudo, rsync,
# and the user vagrant (NOPASSWD sudo) with Vagrant's insecure public key, which
# ships in the vagrant Debian package; Vagrant replaces it at the first `up`.
# apt in the box uses the host's Debian sources; the host's extra CA
# certificates (/usr/local/share/ca-certificates) are trusted in the box too, by
# apt and pip, so a network whose TLS goes through a local CA works inside.
#
# --provisioned also puts this checkout at /home/vagrant/labkit and runs
# `vagrant/provision.sh --image` in the box's root: every package, the kernel
# headers of the box's own kernel, the venv with labkit and JupyterLab.  A
# `vagrant up` from that box provisions without any network (about 2 GB more).
set -euo pipefail

PROG=labkit-build-box
PROVISIONED=0
if [ "${1:-}" = --provisioned ]; then PROVISIONED=1; shift; fi
OUT="${1:?usage: $0 [--provisioned] OUT.box}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
GUEST_REPO=/home/vagrant/labkit
SIZE_GB=20
SUITE=bookworm
PKGS=linux-image-amd64,systemd-sysv,udev,openssh-server,sudo,ifupdown,isc-dhcp-client,ca-certificates,rsync,iproute2,procps,netbase,less,kmod,initramfs-tools,python3
say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it uses loop devices and mounts): sudo bash $0 $*"
for tool in mmdebstrap extlinux sfdisk mkfs.ext4 losetup qemu-img blkid; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install mmdebstrap extlinux syslinux-common fdisk e2fsprogs mount qemu-utils)"
done
MBR=/usr/lib/syslinux/mbr/mbr.bin
[ -f "$MBR" ] || die "$MBR not found (apt-get install syslinux-common)"
PUBKEY="$(dpkg -L vagrant 2>/dev/null | grep -m1 '/keys/vagrant\.pub$' || true)"
[ -n "$PUBKEY" ] && [ -f "$PUBKEY" ] || die "Vagrant's insecure public key (keys/vagrant.pub) not found: apt-get install vagrant"
SOURCES=""
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    if [ -s "$f" ] && grep -qE "^(deb |Suites:.*$SUITE|URIs:)" "$f"; then SOURCES="$f"; break; fi
done
[ -n "$SOURCES" ] || die "no Debian apt sources on this host (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list)"

WORK="$(mktemp -d /var/tmp/labkit-box.XXXXXX)"
MNT="$WORK/root"
LOOP=""
cleanup() {
    set +e
    for m in dev/pts dev sys proc; do mountpoint -q "$MNT/$m" && umount -l "$MNT/$m"; done
    mountpoint -q "$MNT" && umount -R "$MNT"
    [ -n "$LOOP" ] && losetup -d "$LOOP"
    rm -rf "$WORK"
}
trap cleanup EXIT

t0=$SECONDS
DISK="$WORK/disk.raw"
truncate -s "${SIZE_GB}G" "$DISK"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$DISK"
# The partition through a loop device at its offset (no partition scanning: containers have no udev).
LOOP="$(losetup -f --show -o $((2048 * 512)) "$DISK")"
# extlinux reads ext4 without the 64bit feature only.
mkfs.ext4 -q -O ^64bit -L labkit-root "$LOOP"
UUID="$(blkid -s UUID -o value "$LOOP")"
mkdir -p "$MNT"
mount "$LOOP" "$MNT"
rmdir "$MNT/lost+found"

CA_DIR=/usr/local/share/ca-certificates
say "mmdebstrap $SUITE into the disk (sources: $SOURCES) ..."
mmdebstrap --variant=minbase --include="$PKGS" \
    --customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"' \
    --customize-hook="if [ -d $CA_DIR ] && [ -n \"\$(ls -A $CA_DIR)\" ]; then cp -a $CA_DIR/. \"\$1/usr/local/share/ca-certificates/\"; chroot \"\$1\" update-ca-certificates >/dev/null; fi" \
    "$SUITE" "$MNT" "$SOURCES"
say "debian installed ($((SECONDS - t0)) s)"

# --- configuration ------------------------------------------------------------
echo labkit >"$MNT/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 labkit\n' >"$MNT/etc/hosts"
printf 'UUID=%s / ext4 errors=remount-ro 0 1\n' "$UUID" >"$MNT/etc/fstab"
cat >"$MNT/etc/network/interfaces" <<'EOF'
auto lo
iface lo inet loopback

auto eth0
iface eth0 inet dhcp
EOF
# pip trusts what the system trusts (the host's extra CAs included).
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$MNT/etc/pip.conf"

chroot "$MNT" useradd -m -s /bin/bash -G sudo vagrant
echo 'vagrant:vagrant' | chroot "$MNT" chpasswd
printf 'vagrant ALL=(ALL) NOPASSWD: ALL\nDefaults:vagrant !requiretty\n' >"$MNT/etc/sudoers.d/vagrant"
chmod 440 "$MNT/etc/sudoers.d/vagrant"
install -d -m 700 "$MNT/home/vagrant/.ssh"
install -m 600 "$PUBKEY" "$MNT/home/vagrant/.ssh/authorized_keys"
chroot "$MNT" chown -R vagrant:vagrant /home/vagrant/.ssh
printf 'UseDNS no\n' >"$MNT/etc/ssh/sshd_config.d/vagrant.conf"
chroot "$MNT" passwd -l root >/dev/null
chroot "$MNT" apt-get clean

KVER="$(basename "$(ls -1 "$MNT"/boot/vmlinuz-* | sort -V | tail -n 1)")"
KVER="${KVER#vmlinuz-}"

# --- provisioned: labkit and everything it needs, installed as the VM would --
if [ "$PROVISIONED" = 1 ]; then
    t1=$SECONDS
    chroot "$MNT" install -d -o vagrant -g vagrant "$GUEST_REPO"
    # This checkout as Vagrant's share would copy it: tracked and new files, nothing ignored.
    git -C "$REPO" ls-files -z -c -o --exclude-standard | (cd "$REPO" && tar --null -T - -cf -) | tar -C "$MNT$GUEST_REPO" -xf -
    chroot "$MNT" chown -R vagrant:vagrant "$GUEST_REPO"
    for m in proc sys dev dev/pts; do mkdir -p "$MNT/$m"; done
    mount -t proc proc "$MNT/proc"
    mount -t sysfs sys "$MNT/sys"
    mount --bind /dev "$MNT/dev"
    mount -t devpts devpts "$MNT/dev/pts"
    rm -f "$MNT/etc/resolv.conf" && cp -L /etc/resolv.conf "$MNT/etc/resolv.conf"
    say "provisioning inside the box (kernel $KVER) ..."
    chroot "$MNT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LABKIT_KREL="$KVER" \
        bash "$GUEST_REPO/vagrant/provision.sh" --image --quiet || die "provisioning inside the box failed"
    chroot "$MNT" apt-get clean
    for m in dev/pts dev sys proc; do umount "$MNT/$m"; done
    : >"$MNT/etc/resolv.conf" # the VM's DHCP client writes its own
    say "provisioned ($((SECONDS - t1)) s)"
fi

# --- boot ---------------------------------------------------------------------
[ -f "$MNT/boot/initrd.img-$KVER" ] || die "no initrd for kernel $KVER in the box"
mkdir -p "$MNT/boot/extlinux"
cat >"$MNT/boot/extlinux/extlinux.conf" <<EOF
DEFAULT debian
TIMEOUT 10
PROMPT 0
LABEL debian
  LINUX /boot/vmlinuz-$KVER
  INITRD /boot/initrd.img-$KVER
  APPEND root=UUID=$UUID ro net.ifnames=0 biosdevname=0 console=tty0 console=ttyS0,115200n8
EOF
extlinux --install "$MNT/boot/extlinux" >/dev/null 2>&1 || die "extlinux --install failed"
umount "$MNT"
losetup -d "$LOOP"
LOOP=""
dd if="$MBR" of="$DISK" bs=440 count=1 conv=notrunc status=none

# --- package ------------------------------------------------------------------
qemu-img convert -O qcow2 "$DISK" "$WORK/box.img"
rm -f "$DISK"
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %d}\n' "$SIZE_GB" >"$WORK/metadata.json"
# No provider settings in the box: KVM or emulation is the machine's choice (vm-test.sh puts it in a
# Vagrantfile under VAGRANT_HOME).
printf 'Vagrant.configure("2") do |config|\nend\n' >"$WORK/Vagrantfile"
mkdir -p "$(dirname "$OUT")"
tar -C "$WORK" -cf "$OUT.tmp" metadata.json Vagrantfile box.img
mv -f "$OUT.tmp" "$OUT"
say "box $OUT: Debian $SUITE, kernel $KVER, $(du -h "$OUT" | cut -f1) ($((SECONDS - t0)) s)"
