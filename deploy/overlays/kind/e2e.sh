#!/usr/bin/env bash
# make e2e-kind: coroner on a kind cluster, for users with Docker (CI and the process-based
# lab do not need it). Builds the two images, creates the kind cluster "coroner" (unless it
# exists), loads the images, applies deploy/overlays/kind, waits for the rollout, then runs
# a Job handed to coroner-shim whose index 1 exits 42 under a FailIndex rule and checks
# that the Job fails with FailedIndexes and that `coronerctl explain` names the rule.
#
# Needs docker, kind and go. Environment:
#   KIND_NODE_IMAGE   node image (kindest/node:v1.3x.y); default: kind's own for its version
#   KUBECTL           kubectl to use; default _output/bin/kubectl if built, else kubectl
#   KEEP_CLUSTER=1    leave the cluster running afterwards (delete: kind delete cluster --name coroner)
#   TEST_IMAGE        image of the smoke Job; default busybox:1.36
set -euo pipefail

root=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$root"
cluster=coroner
ctx=kind-$cluster
out=$root/_output/kind

for tool in docker kind go; do
	command -v "$tool" >/dev/null || { echo "e2e-kind: $tool not found; this target is for machines with Docker and kind" >&2; exit 1; }
done
kubectl=${KUBECTL:-}
if [[ -z $kubectl ]]; then
	if [[ -x $root/_output/bin/kubectl ]]; then kubectl=$root/_output/bin/kubectl; else kubectl=kubectl; fi
fi
k() { "$kubectl" --context "$ctx" "$@"; }

echo "--- building binaries and images"
mkdir -p "$out" "$root/_output/bin"
arch=$(docker version --format '{{.Server.Arch}}')
CGO_ENABLED=0 GOOS=linux GOARCH=$arch go build -trimpath -o "$out/" ./cmd/coroner-agent ./cmd/coroner-shim
go build -o "$root/_output/bin/" ./cmd/coronerctl
for bin in coroner-agent coroner-shim; do
	docker build -q -f deploy/Dockerfile --build-arg BINARY=$bin -t docker.io/coroner/$bin:dev "$out"
done

echo "--- kind cluster $cluster"
if ! kind get clusters 2>/dev/null | grep -qx "$cluster"; then
	kind create cluster --config deploy/overlays/kind/cluster.yaml ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 180s
fi
if [[ ${KEEP_CLUSTER:-} != 1 ]]; then
	trap 'kind delete cluster --name "$cluster"' EXIT
fi
kind load docker-image --name "$cluster" docker.io/coroner/coroner-agent:dev docker.io/coroner/coroner-shim:dev

echo "--- deploying coroner"
k apply --server-side -k deploy/overlays/kind
k -n coroner-system rollout status deployment/coroner-shim --timeout=180s
k -n coroner-system rollout status daemonset/coroner-agent --timeout=180s

echo "--- smoke Job"
k delete job coroner-e2e --ignore-not-found --wait=true
k apply -f - <<JOB
apiVersion: batch/v1
kind: Job
metadata:
  name: coroner-e2e
  namespace: default
spec:
  managedBy: coroner.dev/shim
  completionMode: Indexed
  completions: 2
  parallelism: 2
  backoffLimitPerIndex: 1
  podFailurePolicy:
    rules:
    - action: FailIndex
      onExitCodes: {containerName: main, operator: In, values: [42]}
    - action: Ignore
      onPodConditions: [{type: DisruptionTarget}]
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: main
        image: ${TEST_IMAGE:-busybox:1.36}
        command: ["sh", "-c", "if [ \"\$JOB_COMPLETION_INDEX\" = 1 ]; then exit 42; fi"]
JOB
k wait job/coroner-e2e --for=condition=Failed --timeout=180s
reason=$(k get job coroner-e2e -o jsonpath='{.status.conditions[?(@.type=="Failed")].reason}')
failed=$(k get job coroner-e2e -o jsonpath='{.status.failedIndexes}')
[[ $reason == FailedIndexes && $failed == 1 ]] || { echo "e2e-kind: Job failed with reason=$reason failedIndexes=$failed, want FailedIndexes and 1" >&2; exit 1; }
"$root/_output/bin/coronerctl" explain job coroner-e2e -n default --context "$ctx" | tee "$out/explain.txt"
grep -q 'rule 0 (FailIndex)' "$out/explain.txt" || { echo "e2e-kind: coronerctl explain does not name rule 0 (FailIndex)" >&2; exit 1; }
echo "--- e2e-kind passed"
