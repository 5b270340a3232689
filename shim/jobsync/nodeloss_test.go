package jobsync

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestNodeLossDoesNotDelay: a pod lost with its node (recovered by coroner-shim, or
// deleted by the taint manager) is replaced at once, under the global and the per-index
// backoff, and leaves the Job's backoff record as it was; a failure that is not a node
// loss (an eviction, an exit) still waits, as under the built-in controller. The lost
// pod still counts towards backoffLimit when no rule Ignores it.
func TestNodeLossDoesNotDelay(t *testing.T) {
	lost := func(name string, ix int, conds ...corev1.PodCondition) *corev1.Pod {
		p := tracked(wrappers.MakePod(name, "ns").Index(ix).Phase(corev1.PodFailed).ExitedContainer("main", 137).
			FinishedAt(now.Add(-2 * time.Second)))
		p.Status.Conditions = append(p.Status.Conditions, conds...)
		return p
	}
	cond := func(typ corev1.PodConditionType, reason string) corev1.PodCondition {
		return corev1.PodCondition{Type: typ, Status: corev1.ConditionTrue, Reason: reason}
	}
	fenced := []corev1.PodCondition{cond(conditions.ForcefullyTerminated, conditions.ReasonNodeFenced), cond(corev1.DisruptionTarget, conditions.ReasonNodeFenced)}
	tainted := []corev1.PodCondition{cond(corev1.DisruptionTarget, conditions.ReasonDeletionByTaintManager)}
	evicted := []corev1.PodCondition{cond(corev1.DisruptionTarget, conditions.ReasonEvictionByEvictionAPI)}
	ignoreDisruption := wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)

	for _, tc := range []struct {
		name      string
		job       *wrappers.JobWrapper
		conds     []corev1.PodCondition
		replaced  bool // created at once
		failures  int  // in the new backoff record
		uncounted int  // failed pods counted (towards backoffLimit)
	}{
		{"fenced node, Ignore rule", wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).PodFailurePolicy(ignoreDisruption),
			fenced, true, 0, 0},
		{"fenced node, no policy: counted, not delayed", wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2),
			fenced, true, 0, 1},
		{"taint eviction, Ignore rule", wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).PodFailurePolicy(ignoreDisruption),
			tainted, true, 0, 0},
		{"eviction by the API, Ignore rule: delayed, as upstream", wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).PodFailurePolicy(ignoreDisruption),
			evicted, false, 1, 0},
		{"an exit: delayed", wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2),
			nil, false, 1, 1},
		{"per index, fenced node", wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(2),
			fenced, true, 0, 0},
		{"per index, an exit: delayed", wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(2),
			nil, false, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := sync(job(tc.job), lost("j-0-a", 0, tc.conds...), tracked(running("j-1-a").Index(1)))
			if got := len(plan.Create) == 1; got != tc.replaced {
				t.Errorf("replaced at once = %v (%d created, requeue after %v), want %v", got, len(plan.Create), plan.RequeueAfter, tc.replaced)
			}
			if !tc.replaced && plan.RequeueAfter < 7*time.Second {
				t.Errorf("requeue after %v, want the 10 s delay less the 2 s since the failure", plan.RequeueAfter)
			}
			if plan.Retries.Failures != tc.failures {
				t.Errorf("backoff record %+v, want %d failures", plan.Retries, tc.failures)
			}
			if got := len(plan.Status.UncountedTerminatedPods.Failed); got != tc.uncounted {
				t.Errorf("%d failed pods counted, want %d", got, tc.uncounted)
			}
		})
	}
}
