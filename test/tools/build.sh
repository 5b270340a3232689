#!/usr/bin/env bash
# Builds the Kubernetes and etcd binaries that the integration harness and the lab run, from
# the Go modules pinned in this folder's go.mod, into _output/bin/ of the repository.
# A binary is rebuilt only when it is missing or was built from a different go.mod/go.sum
# (its stamp file records their checksum), so repeated runs take a second.
#
# usage: test/tools/build.sh [NAME ...]   (default: every tool)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${CORONER_BIN_DIR:-$root/_output/bin}
mkdir -p "$out"

kube_version=v1.36.3
all=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${all[@]}")

# Version stamping: without it the binaries call themselves v0.0.0-master+$Format:%H$ and
# kubectl version cannot talk about skew.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=36"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

stamp=$(cat "$here/go.mod" "$here/go.sum" "$here/etcd/main.go" | sha256sum | cut -c1-16)

cd "$here"
for name in "${names[@]}"; do
  case "$name" in
    etcd) pkg=./etcd ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl) pkg=k8s.io/kubernetes/cmd/$name ;;
    *) echo "build.sh: unknown tool '$name' (known: ${all[*]})" >&2; exit 2 ;;
  esac
  if [ -x "$out/$name" ] && [ "$(cat "$out/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "tools: $name up to date"
    continue
  fi
  echo "tools: building $name ($pkg)"
  start=$SECONDS
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg"
  mv "$out/$name.tmp" "$out/$name"
  echo "$stamp" > "$out/.$name.stamp"
  echo "tools: built $name in $((SECONDS - start))s"
done
