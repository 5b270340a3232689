# coroner: see README.md. Every build output goes under _output/ (git-ignored).
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

OUT      := $(CURDIR)/_output
BIN      := $(OUT)/bin
GO       ?= go
GOTEST   ?= $(GO) test -count=1
# Every Go build and test of this Makefile uses the flags test/tools/build.sh builds
# Kubernetes with (static, -trimpath), so that the packages both import (client-go,
# apimachinery, ...), compiled once for the tools, come from the build cache ever after:
# on a cold cache after make tools, 115 of the 991 packages of ./cmd and ./test were left
# to compile, against 565 with the default flags. build.sh sets its own where it needs cgo
# (runc). The tag grpcnotrace keeps golang.org/x/net/trace (and html/template's reflection,
# which makes the linker keep every exported method) out of coroner-agent: its text 15.4 MB
# instead of 23.5 (test/host.ProductBuildFlags).
export CGO_ENABLED := 0
export GOFLAGS := -trimpath -tags=grpcnotrace $(filter-out -trimpath -tags=grpcnotrace,$(GOFLAGS))
PKGS_UNIT := ./api/... ./cmd/... ./internal/... ./conditions/... ./shim/... ./agent/... ./cri/...
PKGS_INTEGRATION := ./test/...
MAINS    := coroner-shim coroner-agent coronerctl
# coroner-lab (the lab, and coronerctl chaos's node-side verbs) links test code, so its
# main lives under test/; make build installs it beside coronerctl, where chaos finds it.
LAB_MAIN := ./test/lab/cmd/coroner-lab

.PHONY: all deps build tools deploy-tools helm-test lint test test-unit test-integration fuzz bench bench-agent bench-agent-storm bench-shim bench-nodeloss bench-on-lab lab lab-down lab-redeploy lab-status test-lab e2e chaos-test e2e-upstream e2e-kind kind-image kind-lab kind-down clean help FORCE

all: build lint test

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

build: ## build coroner-shim, coroner-agent, coronerctl and coroner-lab (the lab, and coronerctl chaos's node actions) into _output/bin
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(MAINS)) $(LAB_MAIN)
	ln -sf coronerctl $(BIN)/kubectl-coroner

deps: ## install the Debian packages the build, tests and lab need, when missing (root; says what it installs)
	test/tools/deps.sh

tools: deps ## build Kubernetes v1.36.3, etcd, containerd 2.4 and 1.7 and runc from their Go modules into _output/bin (skips what is built)
	test/tools/build.sh

lint: lint-imports ## gofmt, go vet, golangci-lint (.golangci.yml: staticcheck, errcheck, unused, ineffassign, misspell; built from its module), and no test/ package in the product binaries' imports
	@bad=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './_output/*')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	cd test/tools && $(GO) vet ./etcd/
	test/tools/build.sh golangci-lint
	$(BIN)/golangci-lint run ./...

# The binaries users install link no test code: no package under cmd/ imports a test/
# package, directly or not (the lab's verbs live in coroner-lab, under test/).
.PHONY: lint-imports
lint-imports: ## (part of lint) nothing under cmd/ links test/; coroner-agent links no reflection-by-name package
	@t=$$($(GO) list -deps ./cmd/... | grep '^github.com/coroner-dev/coroner/test/' || true); \
	  if [ -n "$$t" ]; then echo "cmd/ links test code (move it to test/lab/cmd/coroner-lab or behind an interface; go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/... shows the importer):"; echo "$$t"; exit 1; fi
	@t=$$($(GO) list -deps ./cmd/coroner-agent | grep -E '^(html/template|text/template|golang.org/x/net/trace)$$' || true); \
	  if [ -n "$$t" ]; then echo "cmd/coroner-agent links $$t: its binary keeps every exported method (reflection by name); build with -tags=grpcnotrace, and find the new importer with go list -deps -f"; exit 1; fi

# The integration tests fail (not skip) under make when the API server binaries or
# containerd are missing: CI must never pass by skipping the real parts.
REQUIRE := CORONER_REQUIRE_HARNESS=1 CORONER_REQUIRE_CONTAINERD=1

test: tools ## unit and integration tests (the README's test command; needs root for containerd)
	$(REQUIRE) $(GOTEST) $(PKGS_UNIT) $(PKGS_INTEGRATION)

test-unit: ## unit tests only: pure packages, no API server
	$(GOTEST) $(PKGS_UNIT)

test-integration: tools ## integration tests against a real etcd + kube-apiserver and containerd
	$(REQUIRE) $(GOTEST) -v $(PKGS_INTEGRATION)

deploy-tools: ## Helm, Prometheus, promtool (and CoreDNS for kind) from one module of test tools, test/tools/deploytools, into _output/bin (one go build; seconds when built)
	test/tools/build.sh helm prometheus promtool

helm-test: tools deploy-tools ## the Helm chart vs kustomize, helm install into a real API server, promtool rule tests, dashboard queries
	CORONER_REQUIRE_DEPLOY_TOOLS=1 $(REQUIRE) $(GOTEST) -v ./test/deploy/

# Benchmarks are programs that print ratios measured side by side in one run.
bench: bench-shim bench-agent bench-agent-storm bench-on-lab ## every benchmark: P1 shim vs built-in, the agent (latency, then bounded under a storm), P3 node loss and P2 against the kubelet on one lab (root)

bench-on-lab: deps build $(LAB) ## P3 then P2 on one lab: the lab that is up, or one brought up (no demo) and down again (root)
	$(ROOT_CHECK)
	@if $(LAB) status >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory bench-nodeloss bench-p2; \
	else \
		$(LAB) up --skip-demo || exit 1; \
		rc=0; $(MAKE) --no-print-directory bench-nodeloss bench-p2 || rc=$$?; \
		$(LAB) down; exit $$rc; \
	fi

bench-shim: tools ## P1: coroner-shim vs the built-in Job controller side by side: presets small, failfast, failjob-500, indexed-10k (BENCH_SHIM_PRESET; ~10 min for all)
	$(GO) run ./test/bench/shim -preset $(or $(BENCH_SHIM_PRESET),all) $(BENCH_ARGS)

.PHONY: bench-large
bench-large: tools ## P1 at 100,000 pods: one Indexed Job of 100,000 completions, coroner-shim vs the built-in controller side by side (about 50 min here; not in make bench, nor in CI)
	$(GO) run ./test/bench/shim -preset indexed-100k $(BENCH_ARGS)

.PHONY: bench-scale
bench-scale: tools build ## scale by simulation (issue 23): kwok nodes on a real control plane: a zone outage (100 of 600 nodes and their agents stop: pods replaced by coroner-shim vs the built-in controller vs Kueue v0.17.0's FailureRecoveryPolicy, its manager a host process), then the agents' API writes at rest on 5,000 nodes beside the kubelets' (BENCH_SCALE_ARGS; ~25 min, and about 10 min more the first time, to build kwok and Kueue; not in make bench, nor in CI)
	test/tools/build.sh kwok kueue
	$(GO) run ./test/bench/scale $(BENCH_SCALE_ARGS)

bench-nodeloss: build ## P3: a lab node partitioned: time to a replacement pod Running, coroner vs the built-in controller (root; uses or brings up the lab)
	$(ROOT_CHECK)
	$(GO) run ./test/bench/nodeloss $(BENCH_ARGS)

.PHONY: bench-beside
bench-beside: ## the agent beside the built-in Job controller on the lab that is up (make lab first): per node configuration 200 limit-OOM + 50 node-OOM Jobs without managedBy, decided by their onPodConditions rule vs miscounted; _output/bench/beside.json (root)
	$(ROOT_CHECK)
	$(GO) run ./test/bench/beside $(BENCH_ARGS)

.PHONY: bench-p2
.PHONY: bench-device
bench-device: ## the agent's device verdict beside the built-in Job controller on the lab that is up (make lab first; LAB_VM=1 for the VM node): per node configuration 100 Jobs without managedBy whose pod dies the moment its test GPU fails, decided by their FailJob-on-coroner.dev/DeviceFailed rule vs miscounted, the verdict's latency beside the kubelet's status update; _output/bench/device.json (root; BENCH_ARGS=-kind on the kind cluster)
	$(ROOT_CHECK)
	$(GO) run ./test/bench/device $(BENCH_ARGS)

bench-p2: ## P2 against the kubelet on the lab that is up (make lab first; never brings one up or down): per node configuration 200 exits + 50 limit OOMs (the VM node 20 + 5), finishedAt -> coroner's stamp and -> the kubelet's status, agent/kubelet/containerd RSS and CPU; _output/bench/p2.json (root; measured on two process nodes: ~16 min with the VM node, ~9 without; lab-node-3, now a default, adds a third)
	$(ROOT_CHECK)
	$(GO) run ./test/bench/kubelet $(BENCH_ARGS)

bench-agent: tools ## node agent latency, containerd events vs relist, on a real API server and containerd (root; not a test)
	$(GO) run ./test/bench/agent $(BENCH_ARGS)

bench-agent-storm: tools build ## the agent binary under 1,000 exits/min and 100 OOM kills for 3 min: RSS, goroutines, fds before/during/after, every exit stamped (root, ~6 min)
	$(ROOT_CHECK)
	$(GO) run ./test/bench/agent -storm $(BENCH_ARGS)

fuzz: ## run the fuzz targets for a short while each
	$(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=30s ./shim/indexes/
	$(GO) test -run='^$$' -fuzz=FuzzParseExitHistory -fuzztime=30s ./api/v1alpha1/
	$(GO) test -run='^$$' -fuzz=FuzzAppend -fuzztime=30s ./agent/exithistory/

# The lab needs root (network namespaces, a bridge, cgroups, mounts, containerd, kubelets).
LAB := $(BIN)/coroner-lab
ROOT_CHECK = @if [ "$$(id -u)" != 0 ]; then echo "make $@ must run as root: the lab creates network namespaces, a bridge, cgroups and mounts (try: sudo make $@)" >&2; exit 1; fi

$(LAB): FORCE
	@mkdir -p $(BIN)
	$(GO) build -o $(LAB) $(LAB_MAIN)

lab: deps build $(LAB) ## local 3-node lab (real kubelets, containerd 2.x and 1.6 in netns, no Docker), coroner deployed, a demo Job explained; LAB_PLATFORMS=1 adds Kueue and JobSet (root)
	$(ROOT_CHECK)
	$(LAB) up
	@if [ "$(LAB_PLATFORMS)" = 1 ]; then $(MAKE) --no-print-directory platforms; fi

lab-down: $(LAB) ## stop the lab and remove everything it created (root)
	$(ROOT_CHECK)
	$(LAB) down

lab-redeploy: $(LAB) ## after a code change: rebuild coroner's images, load them on every lab node, restart coroner (root)
	$(ROOT_CHECK)
	$(LAB) redeploy

lab-status: $(LAB) ## the lab's processes, nodes and coroner's pods
	$(LAB) status

test-lab: ## e2e: lab up, 3 nodes Ready with a busybox pod each, lab down leaving nothing behind (root, ~1 min warm)
	$(ROOT_CHECK)
	CORONER_LAB_TEST=1 $(GOTEST) -v -timeout 30m ./test/lab/

# The e2e suite uses the lab that is up, or brings one up and takes it down afterwards.
# Its tests run in parallel (-parallel: more than the 2 cores, they mostly wait).
# The e2e suite's output goes through test/testlog: the usual verbose lines as they come,
# then what each failed test said, again, at the end (where a CI log's tail is read).
TESTLOG := $(GO) run ./test/testlog
# E2E_RUN runs the suite; $(1): more environment (the cluster it runs on).
E2E_RUN = set -o pipefail; CORONER_E2E=1 $(1) $(GOTEST) -json -v -timeout 30m -parallel 8 ./test/e2e/ $(E2E_ARGS) 2>&1 | $(TESTLOG)

e2e: build ## e2e suite on the lab: OOMs, evictions, preemption, drain, partition with real kubelets, a real Prometheus scraping coroner (root, ~4 min)
	$(ROOT_CHECK)
	test/tools/build.sh prometheus
	$(call E2E_RUN)

chaos-test: build ## fault suite on the lab that is up (make lab first; never brings one up or down): shim leader SIGKILLs, API server restarts, etcd paused, agent rollouts, containerd restarts, a partition, bad input, security; prints a table (root, ~13 min)
	$(ROOT_CHECK)
	$(GO) run ./test/chaos $(CHAOS_ARGS)

# Upstream's own Job specs (issue 19): the "[sig-apps] Job" specs of k8s.io/kubernetes v1.36.3,
# from an e2e binary built in test/tools, run on the lab twice with the same seed.
e2e-upstream: ## upstream's "[sig-apps] Job" e2e specs on the lab that is up (make lab first), with the built-in controller then with every Job handed to coroner: a table spec -> built-in / coroner; fails when coroner fails a spec the built-in controller passes (root, ~3 min; E2E_UPSTREAM_ARGS)
	$(ROOT_CHECK)
	test/tools/build.sh e2e-upstream
	$(GO) run ./test/upstream $(E2E_UPSTREAM_ARGS)

# The kind lab (issue 11): an offline node image, a kind cluster of 1 control plane and 2
# workers on our own dockerd, coroner deployed from deploy/overlays/kind.
KIND := $(GO) run ./test/kind/cmd

kind-image: ## offline kind node image (bookworm, containerd 2.4, v1.36.3, kubeadm's images pre-loaded), cached in _output/kind (root; ~2 min cold after make tools)
	$(ROOT_CHECK)
	test/tools/deps.sh kind
	test/tools/build.sh kubeadm kube-proxy kind coredns
	$(KIND) image

kind-lab: kind-image ## kind cluster on our own dockerd with coroner deployed; KUBECONFIG=_output/kind/kubeconfig; LAB_PLATFORMS=1 adds Kueue and JobSet (root)
	$(KIND) up
	@if [ "$(LAB_PLATFORMS)" = 1 ]; then $(MAKE) --no-print-directory platforms PLATFORMS_CLUSTER=kind; fi

kind-down: ## delete the kind cluster, its network and our dockerd, leaving nothing behind (the image stays cached)
	$(KIND) down

e2e-kind: build ## the e2e suite on the kind lab (make kind-lab first): exit codes vs the built-in controller, OOMs, a node OOM, eviction, admission, a partitioned worker fenced (root)
	$(ROOT_CHECK)
	$(KIND) smoke
	$(call E2E_RUN,CORONER_E2E_CLUSTER=kind)

# The batch platforms coroner runs inside (issue 20): Kueue v0.17.0 (FailureRecoveryPolicy
# on) and JobSet v0.11.1, built from their own modules and installed from their own
# manifests (test/platforms) into the lab that is up, or kind (PLATFORMS_CLUSTER=kind).
PLATFORMS_CLUSTER ?= lab
.PHONY: platforms
platforms: ## Kueue and JobSet, built from their modules, installed as their users do into the lab that is up (PLATFORMS_CLUSTER=kind: the kind cluster) (root; ~10 min cold build)
	$(ROOT_CHECK)
	test/tools/build.sh kueue jobset
	$(GO) run ./test/platforms/cmd -cluster $(PLATFORMS_CLUSTER) install

.PHONY: e2e-platforms
e2e-platforms: E2E_ARGS = -run '^TestPlatform'
e2e-platforms: build ## the platform cases, each beside the built-in controller: Kueue (queueing, preemption, waitForPodsReady), JobSet (limit OOM, node OOM; avoid-failed-nodes: a worker's replacement off the node that OOM-killed it), CronJob (Forbid, Replace), on the lab (or kind: PLATFORMS_CLUSTER=kind) after make platforms (root, ~7 min)
	$(ROOT_CHECK)
	$(call E2E_RUN,CORONER_E2E_PLATFORMS=1 $(if $(filter kind,$(PLATFORMS_CLUSTER)),CORONER_E2E_CLUSTER=kind))

FORCE:

clean: ## remove _output
	rm -rf $(OUT)

# The lab's VM node (issue 10, opt-in): `LAB_VM=1 make lab` adds lab-node-4, systemd on
# cgroup v2 under QEMU, to the lab; make lab-down removes it with the rest.
.PHONY: vm-image
vm-image: ## the VM node's Debian bookworm image in _output/vm (debootstrap + mkfs.ext4 -d; root, ~2 min cold, reused while test/vm/build-image.sh is unchanged)
	$(ROOT_CHECK)
	test/vm/build-image.sh
