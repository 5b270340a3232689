#!/usr/bin/env bash
# Builds the lab's VM node image (issue 10): a Debian bookworm root file system made with
# debootstrap (systemd, udev, dbus, openssh-server, iproute2, kmod, the CNI plugins,
# linux-image-amd64), turned into an ext4 image with `mkfs.ext4 -d` (no loop mount), and
# Debian's kernel and initrd copied out beside it:
#
#   _output/vm/rootfs.ext4   4 GiB sparse raw ext4 (each run boots a qcow2 overlay of it)
#   _output/vm/vmlinuz       kernel
#   _output/vm/initrd.img    initramfs (virtio_blk is a module in Debian's kernel)
#   _output/vm/stamp         the hash of this script the image was built with
#
# The image holds nothing of a particular lab: at boot, coroner-vm-boot.service mounts the
# 9p shares the lab gives QEMU (corbin: _output/bin, read-only; cornode: the node's
# directory) and runs cornode/guest.sh, which the lab writes (test/lab/vm.go). So the
# image is built once and reused while this script is unchanged; a changed script, or
# VM_IMAGE_REBUILD=1, builds it again.
#
# Shell, not Go: it is a sequence of Debian's tools (debootstrap, chroot, mkfs.ext4); the
# lab (Go) runs it when the image is missing, `make vm-image` runs it by hand.
#
# Needs root, debootstrap and e2fsprogs (it installs debootstrap, qemu-system-x86 and
# qemu-utils with apt-get when missing). The mirror is the Debian one of apt's sources
# (override: VM_MIRROR=URL).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${VM_IMAGE_DIR:-$root/_output/vm}
size=${VM_IMAGE_SIZE:-4G}
suite=bookworm
stamp_want=$(sha256sum "$0" | cut -c1-16)

if [[ $(id -u) != 0 ]]; then
	echo "build-image.sh must run as root (debootstrap, chroot)" >&2
	exit 1
fi
if [[ ${VM_IMAGE_REBUILD:-0} != 1 && -f $out/stamp && $(cat "$out/stamp") == "$stamp_want" &&
	-f $out/rootfs.ext4 && -f $out/vmlinuz && -f $out/initrd.img ]]; then
	echo "vm image: $out is up to date (stamp $stamp_want); VM_IMAGE_REBUILD=1 builds it again"
	exit 0
fi

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v qemu-img >/dev/null || missing+=(qemu-utils)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
if ((${#missing[@]})); then
	echo "vm image: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The Debian mirror apt uses (deb822 URIs: lines or one-line `deb URL SUITE` entries),
# not the security one.
mirror=${VM_MIRROR:-}
if [[ -z $mirror ]]; then
	mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
		grep -Eo '(URIs:[[:space:]]*|^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?)https?://[^[:space:]]+/debian/?([[:space:]]|$)' |
		grep -Eo 'https?://[^[:space:]]+' | grep -v -- '-security' | head -n1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}

began=$(date +%s)
work=$out/build.$$
rootfs=$work/rootfs
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$rootfs"

packages=(
	systemd systemd-sysv udev dbus          # PID 1, device events, the systemd cgroup driver's D-Bus
	kmod iproute2 procps util-linux mount  # modules, ip, ps, nsenter
	openssh-server                         # a debug and e2e channel (key from the node share)
	containernetworking-plugins            # /usr/lib/cni: bridge, host-local, loopback
	ca-certificates
	linux-image-amd64 initramfs-tools
)
echo "vm image: debootstrap $suite from $mirror"
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
	"$suite" "$rootfs" "$mirror" >"$work.debootstrap.log" 2>&1 || {
	tail -n 30 "$work.debootstrap.log" >&2
	exit 1
}
rm -f "$work.debootstrap.log"
echo "vm image: debootstrap done in $(($(date +%s) - began)) s"

# --- configuration -------------------------------------------------------------------
echo coroner-vm >"$rootfs/etc/hostname"
printf '127.0.0.1 localhost\n' >"$rootfs/etc/hosts"
printf '/dev/vda / ext4 rw,noatime 0 1\n' >"$rootfs/etc/fstab"
# Root logs in on the serial console without a password (the console is a file the lab
# writes; nobody can type there unless QEMU is started by hand with another -serial).
chroot "$rootfs" passwd -d root >/dev/null
sed -i 's/^#\?PermitRootLogin.*/PermitRootLogin prohibit-password/' "$rootfs/etc/ssh/sshd_config"
# The modules the guest needs early (9p for the shares, overlay for containerd, br_netfilter
# is not needed: no kube-proxy).
printf '9p\n9pnet_virtio\noverlay\nbridge\n' >"$rootfs/etc/modules-load.d/coroner-vm.conf"
# Fewer things running on an emulated CPU.
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
	systemd-timesyncd.service getty@tty1.service; do
	ln -sf /dev/null "$rootfs/etc/systemd/system/$u"
done
# Journal in memory only (the console file and the node share keep what matters).
mkdir -p "$rootfs/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\nRuntimeMaxUse=64M\n' >"$rootfs/etc/systemd/journald.conf.d/coroner-vm.conf"

cat >"$rootfs/usr/local/sbin/coroner-vm-boot" <<'BOOT'
#!/bin/sh
# Mounts the lab's 9p shares and runs the node's guest.sh (written by test/lab/vm.go).
set -eu
mkdir -p /opt/coroner/bin /opt/coroner/node /opt/coroner/images
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 corbin /opt/coroner/bin
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 corimg /opt/coroner/images
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 cornode /opt/coroner/node
exec /bin/sh /opt/coroner/node/guest.sh
BOOT
chmod 755 "$rootfs/usr/local/sbin/coroner-vm-boot"
cat >"$rootfs/etc/systemd/system/coroner-vm-boot.service" <<'UNIT'
[Unit]
Description=coroner lab: mount the lab's shares and start the node (guest.sh)
After=systemd-modules-load.service local-fs.target
Wants=systemd-modules-load.service
Before=ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/coroner-vm-boot
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
UNIT
ln -sf /etc/systemd/system/coroner-vm-boot.service "$rootfs/etc/systemd/system/multi-user.target.wants/coroner-vm-boot.service"

# Kernel and initrd out; apt's caches and docs away.
cp -L "$rootfs/vmlinuz" "$work/vmlinuz"
cp -L "$rootfs/initrd.img" "$work/initrd.img"
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/var/cache/*/*
du_mb=$(du -sm "$rootfs" | cut -f1)

# --- image -----------------------------------------------------------------------------
rm -f "$work/rootfs.ext4"
mkfs.ext4 -q -F -L coroner-vm -d "$rootfs" "$work/rootfs.ext4" "$size"
mkdir -p "$out"
mv -f "$work/rootfs.ext4" "$work/vmlinuz" "$work/initrd.img" "$out/"
echo "$stamp_want" >"$out/stamp"
echo "vm image: $out/rootfs.ext4 ($size, $du_mb MB used), kernel $(ls "$rootfs"/boot/vmlinuz-* | sed 's/.*vmlinuz-//'), built in $(($(date +%s) - began)) s"
