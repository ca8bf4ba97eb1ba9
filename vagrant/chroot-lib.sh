# shellcheck shell=bash
# What vagrant/build-box.sh and vagrant/arm64-rootfs.sh both do to a Debian root
# before running provision.sh in it (sourced; they run as root).

# copy_checkout REPO DEST: the checkout at REPO into DEST as Vagrant's share would
# copy it -- tracked and new files, nothing ignored.
copy_checkout() {
    git -C "$1" ls-files -z -c -o --exclude-standard | (cd "$1" && tar --null -T - -cf -) | tar -C "$2" -xf -
}

# chroot_mount ROOT: /proc, /sys, /dev and /dev/pts inside ROOT, and the host's
# resolver, so that apt and pip in `chroot ROOT` work.
chroot_mount() {
    local m
    for m in proc sys dev dev/pts; do mkdir -p "$1/$m"; done
    mount -t proc proc "$1/proc"
    mount -t sysfs sys "$1/sys"
    mount --bind /dev "$1/dev"
    mount -t devpts devpts "$1/dev/pts"
    rm -f "$1/etc/resolv.conf" && cp -L /etc/resolv.conf "$1/etc/resolv.conf"
}

# chroot_umount ROOT: what chroot_mount mounted (any part of it; lazily, so that a
# failed run's trap can call it), and an empty resolv.conf for the VM's DHCP client.
chroot_umount() {
    local m
    for m in dev/pts dev sys proc; do mountpoint -q "$1/$m" && umount -l "$1/$m"; done
    [ -d "$1/etc" ] && : >"$1/etc/resolv.conf"
    return 0
}
