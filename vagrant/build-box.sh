#!/usr/bin/env bash
# Build a Debian 12 (bookworm) Vagrant box from Debian packages alone -- no box
# registry needed.  Used by vagrant/vm-test.sh (amd64) and vagrant/arm64-test.sh (arm64);
# run as root (loop devices, mounts).  About 100 s on a 2-core machine for amd64.
#
#   sudo bash vagrant/build-box.sh OUT.box
#   sudo bash vagrant/build-box.sh --provisioned OUT.box   # make box: ready for a room without network
#   sudo ARCH=arm64 bash vagrant/build-box.sh OUT.box      # Apple Silicon: the qemu provider's box
#
# ARCH=amd64 (the default), for the libvirt provider: one 20 GB disk (MBR, one
# ext4 partition), linux-image-amd64 booted by extlinux (console on ttyS0 too).
# ARCH=arm64, for vagrant-qemu (qemu-system-aarch64 -M virt with UEFI firmware,
# HVF on a Mac): one 20 GB disk (GPT: a FAT EFI system partition, then the ext4
# root), linux-image-arm64 booted by GRUB from the removable-media path
# EFI/BOOT/BOOTAA64.EFI (no NVRAM entry needed; console on ttyAMA0 too).  The
# arm64 userland is installed by mmdebstrap through qemu-user-static and binfmt
# on an x86_64 host (apt-get install qemu-user-static binfmt-support arch-test).
# Both: DHCP on eth0, openssh-server, sudo, rsync,
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
# LABKIT_BOX_DEV=1 adds --dev (the test tools; vagrant/arm64-test.sh uses it:
# apt and pip under qemu-user in the chroot are many times faster than inside
# a TCG-emulated VM).
set -euo pipefail

PROG=labkit-build-box
PROVISIONED=0
if [ "${1:-}" = --provisioned ]; then PROVISIONED=1; shift; fi
OUT="${1:?usage: $0 [--provisioned] OUT.box}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
GUEST_REPO=/home/vagrant/labkit
# shellcheck source=chroot-lib.sh
. "$REPO/vagrant/chroot-lib.sh"
SIZE_GB=20
SUITE=bookworm
ARCH="${ARCH:-amd64}"
ESP_MB=256
PKGS=linux-image-$ARCH,systemd-sysv,udev,openssh-server,sudo,ifupdown,isc-dhcp-client,ca-certificates,rsync,iproute2,procps,netbase,less,kmod,initramfs-tools,python3
say() { printf '%s: %s\n' "$PROG" "$*"; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it uses loop devices and mounts): sudo bash $0 $*"
case "$ARCH" in
amd64)
    PROVIDER=libvirt
    BOOT_TOOLS="extlinux"
    MBR=/usr/lib/syslinux/mbr/mbr.bin
    [ -f "$MBR" ] || die "$MBR not found (apt-get install syslinux-common)"
    ;;
arm64)
    PROVIDER=qemu
    BOOT_TOOLS="mkfs.vfat mmd mcopy"
    # GRUB's EFI image and its modules come from the box's own packages.
    PKGS="$PKGS,grub-efi-arm64-bin,grub2-common,e2fsprogs"  # e2fsprogs: the initramfs checks the root
    if [ "$(dpkg --print-architecture)" != arm64 ]; then
        command -v arch-test >/dev/null || die "arch-test not found (apt-get install arch-test qemu-user-static binfmt-support)"
        arch-test arm64 >/dev/null 2>&1 ||
            die "this host cannot run arm64 programs: apt-get install qemu-user-static binfmt-support, then update-binfmts --enable qemu-aarch64"
    fi
    ;;
*) die "ARCH=$ARCH: expected amd64 or arm64" ;;
esac
for tool in mmdebstrap $BOOT_TOOLS sfdisk mkfs.ext4 losetup qemu-img blkid; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install mmdebstrap extlinux syslinux-common dosfstools mtools fdisk e2fsprogs mount qemu-utils)"
done
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
ESP_LOOP=""
cleanup() {
    set +e
    chroot_umount "$MNT"
    mountpoint -q "$MNT" && umount -R "$MNT"
    [ -n "$LOOP" ] && losetup -d "$LOOP"
    [ -n "$ESP_LOOP" ] && losetup -d "$ESP_LOOP"
    rm -rf "$WORK"
}
trap cleanup EXIT

t0=$SECONDS
DISK="$WORK/disk.raw"
truncate -s "${SIZE_GB}G" "$DISK"
# Partitions through loop devices at their offsets (no partition scanning: containers have no udev).
if [ "$ARCH" = amd64 ]; then
    printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$DISK"
    LOOP="$(losetup -f --show -o $((2048 * 512)) "$DISK")"
    # extlinux reads ext4 without the 64bit feature only.
    mkfs.ext4 -q -O ^64bit -L labkit-root "$LOOP"
else
    ROOT_START=$((2048 + ESP_MB * 2048))
    printf 'label: gpt\nstart=2048, size=%d, type=U, name=esp\nstart=%d, type=L, name=root\n' \
        $((ESP_MB * 2048)) "$ROOT_START" | sfdisk -q "$DISK"
    ESP_LOOP="$(losetup -f --show -o $((2048 * 512)) --sizelimit $((ESP_MB * 1024 * 1024)) "$DISK")"
    mkfs.vfat -F 32 -n LABKIT-ESP "$ESP_LOOP" >/dev/null
    # The root ends where sfdisk ended it, before GPT's backup header: a loop device to the end of the
    # file would give ext4 more blocks than the partition has, and the kernel refuses to mount it.
    ROOT_SECTORS="$(sfdisk --dump "$DISK" | sed -n 's/.*size= *\([0-9]*\),.*name="root".*/\1/p')"
    [ -n "$ROOT_SECTORS" ] || die "no root partition in the table sfdisk wrote"
    LOOP="$(losetup -f --show -o $((ROOT_START * 512)) --sizelimit $((ROOT_SECTORS * 512)) "$DISK")"
    mkfs.ext4 -q -L labkit-root "$LOOP"
fi
UUID="$(blkid -s UUID -o value "$LOOP")"
mkdir -p "$MNT"
mount "$LOOP" "$MNT"
rmdir "$MNT/lost+found"

CA_DIR=/usr/local/share/ca-certificates
say "mmdebstrap $SUITE $ARCH into the disk (sources: $SOURCES) ..."
HOOKS=()
if [ "$ARCH" = arm64 ]; then
    # Under qemu-user, Debian's initramfs with MODULES=most took over 6 minutes (and ran once per package
    # that triggers it); with MODULES=list and the modules of a qemu `virt` machine, about 40 s. The box's
    # initramfs therefore holds those modules only, and is made once, after every package is in.
    HOOKS=(--essential-hook='chroot "$1" dpkg-divert --quiet --local --rename --add /usr/sbin/update-initramfs'
        --essential-hook='ln -s /bin/true "$1/usr/sbin/update-initramfs"'
        --essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" && printf "MODULES=list\n" >"$1/etc/initramfs-tools/conf.d/labkit-virt.conf"'
        --essential-hook='mkdir -p "$1/etc/initramfs-tools" && printf "%s\n" virtio_pci virtio_mmio virtio_blk virtio_scsi sd_mod ext4 >"$1/etc/initramfs-tools/modules"')
fi
mmdebstrap --arch="$ARCH" --variant=minbase --include="$PKGS" "${HOOKS[@]}" \
    --customize-hook='mkdir -p "$1/usr/local/share/ca-certificates"' \
    --customize-hook="if [ -d $CA_DIR ] && [ -n \"\$(ls -A $CA_DIR)\" ]; then cp -a $CA_DIR/. \"\$1/usr/local/share/ca-certificates/\"; chroot \"\$1\" update-ca-certificates >/dev/null; fi" \
    "$SUITE" "$MNT" "$SOURCES"
if [ "$ARCH" = arm64 ]; then
    rm "$MNT/usr/sbin/update-initramfs"
    chroot "$MNT" dpkg-divert --quiet --local --rename --remove /usr/sbin/update-initramfs
    KVER="$(basename "$(ls -1 "$MNT"/boot/vmlinuz-* | sort -V | tail -n 1)")"
    chroot "$MNT" update-initramfs -c -k "${KVER#vmlinuz-}" >/dev/null || die "update-initramfs in the arm64 box failed"
fi
say "debian installed ($((SECONDS - t0)) s)"

# --- configuration ------------------------------------------------------------
echo labkit >"$MNT/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 labkit\n' >"$MNT/etc/hosts"
printf 'UUID=%s / ext4 errors=remount-ro 0 1\n' "$UUID" >"$MNT/etc/fstab"
if [ "$ARCH" = arm64 ]; then
    ESP_UUID="$(blkid -s UUID -o value "$ESP_LOOP")"
    mkdir -p "$MNT/boot/efi"
    printf 'UUID=%s /boot/efi vfat umask=0077,nofail 0 1\n' "$ESP_UUID" >>"$MNT/etc/fstab"
fi
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
    copy_checkout "$REPO" "$MNT$GUEST_REPO"
    chroot "$MNT" chown -R vagrant:vagrant "$GUEST_REPO"
    chroot_mount "$MNT"
    say "provisioning inside the box (kernel $KVER) ..."
    chroot "$MNT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LABKIT_KREL="$KVER" \
        ${LABKIT_DEV_OPTIONAL:+LABKIT_DEV_OPTIONAL="$LABKIT_DEV_OPTIONAL"} \
        bash "$GUEST_REPO/vagrant/provision.sh" --image --quiet ${LABKIT_BOX_DEV:+--dev} || die "provisioning inside the box failed"
    chroot "$MNT" apt-get clean
    chroot_umount "$MNT" # also empties resolv.conf: the VM's DHCP client writes its own
    say "provisioned ($((SECONDS - t1)) s)"
fi

# --- boot ---------------------------------------------------------------------
[ -f "$MNT/boot/initrd.img-$KVER" ] || die "no initrd for kernel $KVER in the box"
if [ "$ARCH" = amd64 ]; then
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
else
    # GRUB made by grub-mkimage, not grub-install (which would probe this host's disks and write
    # NVRAM).  The image's built-in config finds the root by UUID and reads /boot/grub/grub.cfg,
    # which update-grub inside the VM rewrites when the kernel changes (same command line: grub.d).
    CMDLINE="net.ifnames=0 biosdevname=0 console=tty0 console=ttyAMA0,115200n8"
    mkdir -p "$MNT/boot/grub" "$MNT/etc/default/grub.d"
    printf 'GRUB_CMDLINE_LINUX="%s"\nGRUB_TIMEOUT=1\n' "$CMDLINE" >"$MNT/etc/default/grub.d/labkit.cfg"
    printf 'search --no-floppy --fs-uuid --set=root %s\nset prefix=($root)/boot/grub\nconfigfile ($root)/boot/grub/grub.cfg\n' \
        "$UUID" >"$MNT/boot/grub/early.cfg"
    printf 'set timeout=1\nmenuentry "Debian GNU/Linux, %s" {\n  search --no-floppy --fs-uuid --set=root %s\n  linux /boot/vmlinuz-%s root=UUID=%s ro %s\n  initrd /boot/initrd.img-%s\n}\n' \
        "$KVER" "$UUID" "$KVER" "$UUID" "$CMDLINE" "$KVER" >"$MNT/boot/grub/grub.cfg"
    chroot "$MNT" grub-mkimage -O arm64-efi -o /boot/grub/BOOTAA64.EFI -c /boot/grub/early.cfg -p /boot/grub \
        part_gpt fat ext2 search search_fs_uuid normal configfile linux echo test gzio efi_gop ||
        die "grub-mkimage -O arm64-efi failed"
    # mtools writes the FAT file system without mounting it (a container's kernel may have no vfat).
    mmd -i "$ESP_LOOP" ::/EFI ::/EFI/BOOT
    mcopy -i "$ESP_LOOP" "$MNT/boot/grub/BOOTAA64.EFI" ::/EFI/BOOT/BOOTAA64.EFI
    rm -f "$MNT/boot/grub/BOOTAA64.EFI"
    losetup -d "$ESP_LOOP"
    ESP_LOOP=""
fi
umount "$MNT"
losetup -d "$LOOP"
LOOP=""
if [ "$ARCH" = amd64 ]; then dd if="$MBR" of="$DISK" bs=440 count=1 conv=notrunc status=none; fi

# --- package ------------------------------------------------------------------
qemu-img convert -O qcow2 "$DISK" "$WORK/box.img"
rm -f "$DISK"
printf '{"provider": "%s", "format": "qcow2", "virtual_size": %d, "architecture": "%s"}\n' "$PROVIDER" "$SIZE_GB" "$ARCH" >"$WORK/metadata.json"
# No provider settings in the box: KVM or emulation is the machine's choice (vm-test.sh puts it in a
# Vagrantfile under VAGRANT_HOME).
printf 'Vagrant.configure("2") do |config|\nend\n' >"$WORK/Vagrantfile"
mkdir -p "$(dirname "$OUT")"
tar -C "$WORK" -cf "$OUT.tmp" metadata.json Vagrantfile box.img
mv -f "$OUT.tmp" "$OUT"
say "box $OUT: Debian $SUITE, kernel $KVER, $(du -h "$OUT" | cut -f1) ($((SECONDS - t0)) s)"
