#!/usr/bin/env bash
# Builds the binaries that the integration harness and the lab run, from Go modules, into
# _output/bin/ of the repository:
#   - Kubernetes and etcd from the modules pinned in this folder's go.mod;
#   - containerd 2.x (containerd, containerd-shim-runc-v2, ctr) and runc, pinned below, into
#     _output/bin/containerd2/, beside Debian's containerd 1.6 and runc 1.1 in /usr/bin, so
#     that tests and the lab run both runtimes (runc needs cgo and libseccomp-dev);
#   - containerd 1.7 (containerd, ctr, containerd-shim-runc-v2), pinned below, into
#     _output/bin/containerd17/: a third runtime for the tests, run with Debian's runc 1.1.
# A binary is rebuilt only when it is missing or was built from different inputs (its stamp
# file records their checksum), so repeated runs take a second.
#
# Named only (not in the default set): kubeadm, kube-proxy, kind and coredns, for test/kind;
# helm, prometheus and promtool, for test/deploy and test/e2e's Prometheus test;
# e2e-upstream, upstream's e2e test binary (_output/bin/e2e-apps.test), for test/upstream;
# kueue and jobset, the batch platforms test/platforms installs beside coroner (kueue
# also for make bench-scale's zone outage);
# golangci-lint, for make lint; kwok, the simulated nodes of make bench-scale.
#
# usage: test/tools/build.sh [NAME ...]   (default: every tool but those twelve)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${CORONER_BIN_DIR:-$root/_output/bin}
mkdir -p "$out"

kube_version=v1.36.3
containerd_version=v2.4.2
runc_version=v1.5.2
containerd17_version=v1.7.35
all=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd2 runc containerd17)
# Built only when named (test/kind's node image and cluster need them, nothing else does).
kind_version=v0.32.0
coredns_version=v1.14.2
# Built only when named: the Helm chart's test (test/deploy) and the monitoring tests
# (promtool test rules; a real Prometheus scraping the lab in test/e2e).
helm_version=v4.3.1
# Prometheus v3.16.0: its Go module tags a 3.x release as v0.3xx.y.
prometheus_version=v0.316.0
prometheus_release=3.16.0
# Built only when named: the batch platforms coroner runs inside (test/platforms), each
# from its own module as published, with the k8s.io versions its go.mod names (Kueue
# v0.17.0: k8s.io v0.35.3, controller-runtime v0.23.3), never forced onto ours.
kueue_version=v0.17.0
jobset_version=v0.11.1
# Built only when named: golangci-lint, for make lint, from its own module as published.
golangci_lint_version=v2.15.0
# Built only when named: kwok, the simulated nodes of make bench-scale (issue 23), from its
# own module as published (k8s.io v0.36.1).
kwok_version=v0.8.0
extra=(kubeadm kube-proxy kind coredns helm prometheus promtool e2e-upstream kueue jobset golangci-lint kwok)
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

# build_module NAME STAMP DIR LDFLAGS TAGS CGO PKG@VERSION...: go install from the module proxy
# (the module's own go.mod decides its dependencies), skipped when DIR/.NAME.stamp matches.
build_module() {
  local name=$1 stamp=$2 dir=$3 ldflags=$4 tags=$5 cgo=$6
  shift 6
  if [ "$(cat "$dir/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "tools: $name up to date"
    return
  fi
  echo "tools: building $name ($*)"
  local start=$SECONDS tmp
  tmp=$(mktemp -d "$out/.$name.XXXXXX")
  (cd "$tmp" && GOBIN="$tmp" GOFLAGS= CGO_ENABLED=$cgo go install -trimpath -tags "$tags" -ldflags "$ldflags" "$@")
  mkdir -p "$dir"
  for f in "$tmp"/*; do mv -f "$f" "$dir/"; done
  rmdir "$tmp"
  echo "$stamp" > "$dir/.$name.stamp"
  echo "tools: built $name in $((SECONDS - start))s"
}

# build_in_module NAME STAMP DIR LDFLAGS MODULE@VERSION PKG: as build_module, for a module
# whose proxy version list is refused (go install pkg@version asks it for deprecations and
# fails): the exact version is downloaded and PKG built inside it, with its own go.mod.
build_in_module() {
  local name=$1 stamp=$2 dir=$3 ldflags=$4 module=$5 pkg=$6
  if [ -x "$dir/$name" ] && [ "$(cat "$dir/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "tools: $name up to date"
    return
  fi
  echo "tools: building $name ($module, $pkg in the module)"
  local start=$SECONDS src
  src=$(cd /tmp && GOFLAGS= go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$src" ] || { echo "build.sh: go mod download $module gave no directory" >&2; exit 1; }
  mkdir -p "$dir"
  (cd "$src" && GOFLAGS= GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$dir/$name.tmp" "$pkg")
  mv "$dir/$name.tmp" "$dir/$name"
  echo "$stamp" > "$dir/.$name.stamp"
  echo "tools: built $name in $((SECONDS - start))s"
}

# build_deploytools: helm, prometheus and promtool into $out, coredns into $out/coredns,
# from ./deploytools in one go build; skipped when all four exist and the stamp (the
# module's go.mod and go.sum) matches. Named several times in one call, built once.
build_deploytools() {
  local dstamp dir=$here/deploytools start tmp f
  dstamp=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-16)
  if [ -x "$out/helm" ] && [ -x "$out/prometheus" ] && [ -x "$out/promtool" ] && [ -x "$out/coredns/coredns" ] &&
    [ "$(cat "$out/.deploytools.stamp" 2>/dev/null)" = "$dstamp" ]; then
    echo "tools: helm, prometheus, promtool, coredns up to date"
    return
  fi
  # The versions named at the top are the ones go.mod requires (a bump changes both).
  for f in "helm.sh/helm/v4 $helm_version" "github.com/prometheus/prometheus $prometheus_version" "github.com/coredns/coredns $coredns_version"; do
    grep -q "^[[:space:]]*$f\( \|$\)" "$dir/go.mod" ||
      { echo "build.sh: deploytools/go.mod does not require $f (go get -tool ... in test/tools/deploytools)" >&2; exit 1; }
  done
  echo "tools: building helm, prometheus, promtool, coredns (./deploytools, one go build)"
  start=$SECONDS
  tmp=$(mktemp -d "$out/.deploytools.XXXXXX")
  local pv="-X github.com/prometheus/common/version.Version=$prometheus_release -X github.com/prometheus/common/version.Revision=module -X github.com/prometheus/common/version.Branch=module -X github.com/prometheus/common/version.BuildUser=coroner -X github.com/prometheus/common/version.BuildDate=19700101-00:00:00"
  local hv="-X helm.sh/helm/v4/internal/version.version=$helm_version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  (cd "$dir" && GOFLAGS=-mod=readonly GOWORK=off CGO_ENABLED=0 go build -trimpath -tags "remove_all_sd enable_kubernetes_sd" \
    -ldflags "-s -w $pv $hv -X github.com/coredns/coredns/coremain.GitCommit=module" -o "$tmp/" \
    helm.sh/helm/v4/cmd/helm github.com/prometheus/prometheus/cmd/prometheus \
    github.com/prometheus/prometheus/cmd/promtool github.com/coredns/coredns)
  mkdir -p "$out/coredns"
  mv -f "$tmp/coredns" "$out/coredns/coredns"
  for f in helm prometheus promtool; do mv -f "$tmp/$f" "$out/$f"; done
  rmdir "$tmp"
  rm -f "$out/.helm.stamp" "$out/.prometheus.stamp" "$out/.promtool.stamp" "$out/coredns/.coredns.stamp"
  echo "$dstamp" > "$out/.deploytools.stamp"
  echo "tools: built helm, prometheus, promtool, coredns in $((SECONDS - start))s"
}

cd "$here"
for name in "${names[@]}"; do
  case "$name" in
    containerd2)
      # containerd 2.x: CRI GetContainerEvents (the agent's events mode), config version 3.
      # no_btrfs: Debian's btrfs headers are not needed and the snapshotter is disabled.
      v=${containerd_version#v}
      build_module containerd2 "$containerd_version" "$out/containerd2" \
        "-s -w -X github.com/containerd/containerd/v2/version.Version=$v -X github.com/containerd/containerd/v2/version.Revision=module" \
        no_btrfs 0 \
        "github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version" \
        "github.com/containerd/containerd/v2/cmd/ctr@$containerd_version"
      continue ;;
    containerd17)
      # containerd 1.7: CRI GetContainerEvents on one channel shared by every subscriber
      # (the agent relists there), config version 2 as 1.6. No runc: 1.7 runs Debian's runc
      # 1.1, the pairing distributions ship (the built runc 1.5 stays with 2.x). Its go.mod
      # has an exclude directive, which `go install pkg@version` refuses, so the binaries are
      # built in the module's own directory (module cache, read-only: its go.mod and go.sum
      # decide every dependency): containerd and ctr with cgo (libc only; the btrfs headers
      # come with linux-libc-dev), the shim static, as containerd's releases ship it. The
      # stamp holds what decides the binaries: version, tags, cgo.
      c17stamp="$containerd17_version urfave_cli_no_docs cgo+static-shim"
      if [ "$(cat "$out/containerd17/.containerd17.stamp" 2>/dev/null)" = "$c17stamp" ]; then
        echo "tools: containerd17 up to date"
        continue
      fi
      m=github.com/containerd/containerd
      echo "tools: building containerd17 ($m@$containerd17_version: cmd/containerd, cmd/ctr, cmd/containerd-shim-runc-v2)"
      start=$SECONDS
      mdir=$(GOFLAGS= go mod download -json "$m@$containerd17_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
      [ -f "$mdir/go.mod" ] || { echo "build.sh: $m@$containerd17_version: no module directory" >&2; exit 1; }
      vflags="-s -w -X $m/version.Version=${containerd17_version#v} -X $m/version.Revision=module -X $m/version.Package=$m"
      tmp=$(mktemp -d "$out/.containerd17.XXXXXX")
      (cd "$mdir" && GOFLAGS=-mod=readonly GOWORK=off CGO_ENABLED=1 go build -trimpath -tags urfave_cli_no_docs \
        -ldflags "$vflags" -o "$tmp/" ./cmd/containerd ./cmd/ctr)
      (cd "$mdir" && GOFLAGS=-mod=readonly GOWORK=off CGO_ENABLED=0 go build -trimpath -tags urfave_cli_no_docs \
        -ldflags "$vflags -extldflags -static" -o "$tmp/" ./cmd/containerd-shim-runc-v2)
      mkdir -p "$out/containerd17"
      for f in "$tmp"/*; do mv -f "$f" "$out/containerd17/"; done
      rmdir "$tmp"
      echo "$c17stamp" > "$out/containerd17/.containerd17.stamp"
      echo "tools: built containerd17 in $((SECONDS - start))s"
      continue ;;
    runc)
      # runc with seccomp (cgo + libseccomp-dev), as distributions ship it.
      if ! pkg-config --exists libseccomp 2>/dev/null && [ ! -e /usr/include/seccomp.h ]; then
        echo "build.sh: runc needs libseccomp-dev (apt-get install libseccomp-dev)" >&2; exit 1
      fi
      build_module runc "$runc_version" "$out/containerd2" "-X main.version=${runc_version#v}" \
        "seccomp urfave_cli_no_docs" 1 "github.com/opencontainers/runc@$runc_version"
      continue ;;
    kind)
      # kind itself (the CLI that creates clusters of node containers), for test/kind.
      build_module kind "$kind_version" "$out" "-s -w" "" 0 "sigs.k8s.io/kind@$kind_version"
      continue ;;
    helm|prometheus|promtool|coredns)
      # Helm, Prometheus, promtool and CoreDNS: test tools, not peers coroner runs beside,
      # so they share one module of their own (./deploytools: go.mod's tool directives at
      # Helm v4.3.1, Prometheus v0.316.0 (3.16.0), CoreDNS v1.14.2, the version kubeadm
      # v1.36.3 deploys; minimal version selection puts their common dependencies, client-go
      # v0.37.1, gRPC, protobuf, the Prometheus client, at one version) and are built by one
      # `go build` with one set of flags: every shared package is compiled once. Built apart
      # (go install each, as before) they took 170 + 175 + 7 + 188 s cold.
      # Prometheus without the web UI's assets (no builtinassets tag: the HTTP API is what is
      # used) and with only the kubernetes, file and static service discoveries
      # (remove_all_sd: no cloud SDKs); versions stamped so that `helm version`, the chart's
      # kubeVersion checks and Prometheus's build info see real ones.
      build_deploytools
      continue ;;
    kueue)
      # Kueue's manager (cmd/kueue), static, into _output/bin/platforms/kueue; its version
      # stamped as its Makefile does.
      build_module kueue "$kueue_version" "$out/platforms" \
        "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version -X sigs.k8s.io/kueue/pkg/version.GitCommit=module" \
        "" 0 "sigs.k8s.io/kueue/cmd/kueue@$kueue_version"
      continue ;;
    jobset)
      # JobSet's manager (its main package is the module's root), static, into
      # _output/bin/platforms/jobset. Its version list is refused by the proxy; the exact
      # version downloads.
      build_in_module jobset "$jobset_version" "$out/platforms" "-s -w" "sigs.k8s.io/jobset@$jobset_version" .
      continue ;;
    golangci-lint)
      # golangci-lint (make lint: .golangci.yml), static; about 2 min cold on 2 cores.
      build_module golangci-lint "$golangci_lint_version" "$out" \
        "-s -w -X main.version=${golangci_lint_version#v} -X main.commit=module -X main.date=19700101" \
        "" 0 "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$golangci_lint_version"
      continue ;;
    kwok)
      # kwok (make bench-scale: thousands of Nodes and their pods without kubelets), static,
      # into _output/bin/kwok; its stages are given by test/bench/scale from the module's
      # kustomize/stage files (the binary embeds none).
      build_module kwok "$kwok_version" "$out" "-s -w" "" 0 "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
      continue ;;
    kubeadm|kube-proxy)
      # kubeadm and kube-proxy import modules the other Kubernetes tools do not
      # (corefile-migration, system-validators; netlink, netns). So that go.mod and go.sum (and
      # with them every other tool's stamp) stay as they are, they are built with a derived
      # module file under _output/tools/derived: a copy of go.mod/go.sum to which the go
      # command adds those modules at the versions k8s.io/kubernetes v1.36.3 requires (minimal
      # version selection; checksums verified by sum.golang.org).
      kstamp=$(printf '%s %s %s' "$stamp" "$name" "$kube_version" | sha256sum | cut -c1-16)
      if [ -x "$out/$name" ] && [ "$(cat "$out/.$name.stamp" 2>/dev/null)" = "$kstamp" ]; then
        echo "tools: $name up to date"
        continue
      fi
      echo "tools: building $name (k8s.io/kubernetes/cmd/$name, derived module file)"
      start=$SECONDS
      modf=$root/_output/tools/derived
      mkdir -p "$modf"
      cp go.mod "$modf/go.mod"
      cp go.sum "$modf/go.sum"
      CGO_ENABLED=0 go build -mod=mod -modfile="$modf/go.mod" -trimpath -ldflags "$ldflags" \
        -o "$out/$name.tmp" "k8s.io/kubernetes/cmd/$name"
      mv "$out/$name.tmp" "$out/$name"
      echo "$kstamp" > "$out/.$name.stamp"
      echo "tools: built $name in $((SECONDS - start))s"
      continue ;;
    e2e-upstream)
      # Upstream's e2e specs of k8s.io/kubernetes v1.36.3 cut down to the framework and
      # test/e2e/apps (./e2eapps, a test of this module, so it reuses the packages the
      # Kubernetes tools compiled): `go test -c`, for test/upstream (make e2e-upstream). Its
      # stamp adds the package's sources to the module files'.
      estamp=$(cat "$here"/e2eapps/*.go | sha256sum | cut -c1-16)
      estamp=$(printf '%s %s' "$stamp" "$estamp" | sha256sum | cut -c1-16)
      if [ -x "$out/e2e-apps.test" ] && [ "$(cat "$out/.e2e-apps.test.stamp" 2>/dev/null)" = "$estamp" ]; then
        echo "tools: e2e-upstream up to date"
        continue
      fi
      echo "tools: building e2e-upstream (go test -c ./e2eapps: k8s.io/kubernetes/test/e2e/framework and test/e2e/apps)"
      start=$SECONDS
      CGO_ENABLED=0 go test -c -trimpath -ldflags "$ldflags" -o "$out/e2e-apps.test.tmp" ./e2eapps
      mv "$out/e2e-apps.test.tmp" "$out/e2e-apps.test"
      echo "$estamp" > "$out/.e2e-apps.test.stamp"
      echo "tools: built e2e-upstream in $((SECONDS - start))s"
      continue ;;
    etcd) pkg=./etcd ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubelet|kubectl) pkg=k8s.io/kubernetes/cmd/$name ;;
    *) echo "build.sh: unknown tool '$name' (known: ${all[*]} ${extra[*]})" >&2; exit 2 ;;
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
