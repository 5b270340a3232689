package e2e

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// A container that exits 3 is a bug: FailJob on exit code 3 fails the Job at the first
// failure instead of retrying it six times; the built-in controller does the same. On
// every node configuration but the VM node (CORONER_E2E_VM_ALL=1 adds it: the exit's node
// part there is ExitToStamp's).
func TestFailJobOnExitCode(t *testing.T) {
	t.Parallel()
	onEachNodeButVM(t, failJobOnExitCode)
}

func failJobOnExitCode(t *testing.T, node string) {
	ctx, ns := setup(t, budget(node, 3*time.Minute))
	j := onNode(job("exit3", ns).
		BackoffLimit(6).
		PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 3)).
		Command("sh", "-c", "sleep 1; exit 3").Obj(), node)

	got := runBoth(ctx, t, j, budget(node, 2*time.Minute))
	wantOutcome(t, got, outcome{Condition: "Failed", Reason: conditions.JobReasonPodFailurePolicy, Failed: 1})
	pods := jobPods(ctx, t, ns, j.Name)
	if len(pods) != 1 {
		t.Errorf("%d pods, want 1: FailJob must not retry", len(pods))
	}
	wantEvent(ctx, t, ns, j.Name, conditions.EventReasonPodFailurePolicy, "failed with exit code 3", "matching FailJob rule at index 0")
}

// backoffLimitPerIndex with FailIndex: index 1 exits 42 (a corrupt shard, failed at once),
// index 2 exits 1 once (retried within its limit), index 0 succeeds: the Job fails with
// FailedIndexes "1" once every index has finished; the built-in controller agrees.
func TestFailIndexWithBackoffLimitPerIndex(t *testing.T) {
	t.Parallel()
	ctx, ns := setup(t, 3*time.Minute)
	const script = `i=$JOB_COMPLETION_INDEX
sleep 1
if [ "$i" = 1 ]; then exit 42; fi
if [ "$i" = 2 ] && [ "${FAILURES:-0}" = 0 ]; then exit 1; fi
exit 0`
	j := onNode(withFailureCount(job("per-index", ns).
		Indexed().Completions(3).Parallelism(3).BackoffLimitPerIndex(1).
		PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)).
		Command("sh", "-c", script).Obj()), quietNode)

	got := runBoth(ctx, t, j, 2*time.Minute)
	wantOutcome(t, got, outcome{Condition: "Failed", Reason: conditions.JobReasonFailedIndexes,
		Succeeded: 2, Failed: 2, CompletedIndexes: "0,2", FailedIndexes: "1"})
	byIndex := map[string]int{}
	for _, p := range jobPods(ctx, t, ns, j.Name) {
		byIndex[p.Labels[batchv1.JobCompletionIndexAnnotation]]++
	}
	if byIndex["0"] != 1 || byIndex["1"] != 1 || byIndex["2"] != 2 {
		t.Errorf("pods per index %v, want 0:1 1:1 (FailIndex: no retry) 2:2 (one retry)\n%s", byIndex, describe(ns, j.Name))
	}
	wantEvent(ctx, t, ns, j.Name, conditions.EventReasonPodFailurePolicy, "exited 42", "rule 0 (FailIndex)")
}
