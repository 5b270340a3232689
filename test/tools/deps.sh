#!/usr/bin/env bash
# Installs the Debian packages that the build, the tests and the lab need (and with a group
# argument, the kind lab's or the VM node's), when they are
# missing and we are root (apt-get); says what it installs. Without root it names what is
# missing and fails. Called by `make tools` (and so by `make test` and `make lab`) and CI.
#   git, make           the build
#   gcc, libseccomp-dev runc 1.5 built from its module (cgo, seccomp)
#   containerd, runc    Debian's containerd 1.6 and runc 1.1: the relist-mode runtime
#   busybox-static      the root file system of the test images
#   containernetworking-plugins  CNI bridge, host-local, loopback for the lab's nodes
#   iproute2, util-linux         ip and nsenter, for looking into the lab's nodes
set -euo pipefail

pkgs=(git make gcc libc6-dev libseccomp-dev containerd runc busybox-static containernetworking-plugins iproute2 util-linux)
# Optional groups, named as arguments: `deps.sh kind` (the kind lab: Debian's Docker engine,
# debootstrap for the node image), `deps.sh vm` (the lab's VM node).
for group in "$@"; do
  case "$group" in
    kind) pkgs+=(docker.io debootstrap) ;;
    vm) pkgs+=(qemu-system-x86 qemu-utils debootstrap) ;;
    *) echo "deps: unknown group '$group' (kind, vm)" >&2; exit 2 ;;
  esac
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "deps: missing Debian packages: ${missing[*]}" >&2
  echo "deps: as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "deps: installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: installed ${missing[*]}"
