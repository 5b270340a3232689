package jobsync

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/shim/record"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// leaving is an entry of Plan.Leaving in short.
func leaving(p Plan) []string {
	var out []string
	for _, e := range p.Leaving {
		s := fmt.Sprintf("%s %s", e.Name, e.Outcome)
		if e.Rule != nil {
			s += fmt.Sprintf(" rule %d %s", *e.Rule, e.Action)
		}
		if e.Consequence != "" {
			s += ": " + e.Consequence
		}
		if e.Why != "" {
			s += " (" + e.Why + ")"
		}
		if e.Cause != nil {
			s += " [" + string(e.Cause.Class) + "]"
		}
		out = append(out, s)
	}
	return out
}

// TestLeaving: every pod a plan deletes or lets go of (its finalizer removed), but for
// successes, has a record entry saying what its end did to the Job, with the rule, the
// consequence the Event says and why the shim deleted it.
func TestLeaving(t *testing.T) {
	disrupted := func(name string, ix int) *corev1.Pod {
		p := tracked(failed(name, 137).Index(ix).Condition(corev1.DisruptionTarget, corev1.ConditionTrue))
		p.Status.Conditions[0].Reason = "PreemptionByScheduler"
		return p
	}
	cases := []struct {
		name string
		job  *batchv1.Job
		pods []*corev1.Pod
		want []string
	}{
		{
			name: "a counted failure and a success leave with their finalizers: the success is not recorded",
			job:  job(wrappers.MakeJob("j", "ns").Completions(3).Parallelism(2)),
			pods: []*corev1.Pod{tracked(failed("j-a", 1)), tracked(succeeded("j-b"))},
			want: []string{"j-a Failed: counts towards the backoff limit [Exit]"},
		},
		{
			name: "an ignored disruption, rule 0, once its replacement exists",
			job: job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).BackoffLimitPerIndex(1).PodFailurePolicy(
				wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget))),
			pods: []*corev1.Pod{disrupted("j-0-a", 0), tracked(running("j-0-b").Index(0))},
			want: []string{"j-0-a Ignored rule 0 Ignore: not counted, the pod will be replaced [Disruption]"},
		},
		{
			name: "FailIndex: the index fails",
			job: job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(3).PodFailurePolicy(
				wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42))),
			pods: []*corev1.Pod{tracked(failed("j-1-a", 42).Index(1)), tracked(running("j-0-a").Index(0))},
			want: []string{"j-1-a Failed rule 0 FailIndex: index 1 failed [Exit]"},
		},
		{
			name: "suspended: the running pods are deleted, not counted",
			job:  job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(2).Suspend(true)),
			pods: []*corev1.Pod{tracked(running("j-a")), tracked(running("j-b"))},
			want: []string{"j-a Deleted (job suspended) [Deleted]", "j-b Deleted (job suspended) [Deleted]"},
		},
		{
			name: "a FailJob failure: the other pod is deleted with the Job's reason",
			job: job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(2).PodFailurePolicy(
				wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 2))),
			pods: []*corev1.Pod{tracked(failed("j-a", 2)), tracked(running("j-b"))},
			want: []string{
				"j-b Failed: counted as failed: the Job failed (PodFailurePolicy) while it ran (job failed: PodFailurePolicy) [Deleted]",
				"j-a Failed rule 0 FailJob: the Job fails (reason PodFailurePolicy) [Exit]",
			},
		},
		{
			name: "nothing leaves: nothing recorded",
			job:  job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(2)),
			pods: []*corev1.Pod{tracked(running("j-a")), tracked(running("j-b"))},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := sync(tc.job, tc.pods...)
			if diff := cmp.Diff(tc.want, leaving(plan)); diff != "" {
				t.Errorf("leaving (-want +got):\n%s", diff)
			}
			recorded := map[string]bool{}
			for _, e := range plan.Leaving {
				recorded[e.Name] = true
				if !e.Recorded.Time.Equal(now) {
					t.Errorf("%s recorded at %v, want the sync's time %v", e.Name, e.Recorded, now)
				}
			}
			for _, d := range plan.Delete {
				if !recorded[d.Pod.Name] {
					t.Errorf("%s is deleted without a record entry", d.Pod.Name)
				}
			}
			for _, p := range plan.RemoveFinalizer {
				if !recorded[p.Name] && p.Status.Phase != corev1.PodSucceeded {
					t.Errorf("%s loses its finalizer without a record entry", p.Name)
				}
			}
		})
	}
}

// TestLeavingWhenTheJobFailsWhileAPodRuns: a pod deleted as its Job fails is recorded as
// deleted, then, when it is counted as failed, again; the record keeps why it was deleted.
func TestLeavingWhenTheJobFailsWhileAPodRuns(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(2).BackoffLimit(0))
	bad, other := tracked(failed("j-a", 1)), tracked(running("j-b"))
	plan := sync(j, bad, other)
	var rec v1alpha1.Record
	rec.Add(0, plan.Leaving...)

	// The next sync: the shim's deletion of j-b shows; both are counted and let go.
	j.Status = plan.Status
	other.DeletionTimestamp = &metav1.Time{Time: now}
	plan = Sync(Input{Job: j, Pods: []*corev1.Pod{bad, other}, Now: now.Add(time.Second), ExpectationsSatisfied: true})
	rec.Add(0, plan.Leaving...)
	got, ok := rec.Find("j-b")
	if !ok || got.Outcome != v1alpha1.OutcomeFailed {
		t.Fatalf("j-b's entry = %+v, %v", got, ok)
	}

	// Had the sync that deleted j-b not let it go (the Job's end planned again later), the
	// sync that counts it sees it terminating, still Running: the same words.
	rec = v1alpha1.Record{}
	rec.Add(0, record.Of(other, record.Decision{Outcome: v1alpha1.OutcomeDeleted, Why: "job failed: BackoffLimitExceeded"}, metav1.NewTime(now)))
	plan = sync(job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(2).BackoffLimit(0)), bad, other)
	rec.Add(0, plan.Leaving...)
	got, ok = rec.Find("j-b")
	if !ok || got.Outcome != v1alpha1.OutcomeFailed || got.Why != "job failed: BackoffLimitExceeded" ||
		got.Consequence != "counted as failed: the Job failed (BackoffLimitExceeded) while it ran" {
		t.Errorf("j-b's entry = %+v, want Failed, counted as the Job failed, deleted by the shim for it", got)
	}
}

// TestUncountedRecordedAgain: a failed pod an earlier sync counted (its UID in
// uncountedTerminatedPods.failed) but whose finalizer is still there, because that sync's
// record write failed after its status write, is recorded again as it loses its
// finalizer now, and not counted twice.
func TestUncountedRecordedAgain(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(2))
	p := tracked(failed("j-a", 1))
	j.Status.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{Failed: []types.UID{p.UID}}
	plan := sync(j, p, tracked(running("j-b")))
	if got := names(plan.RemoveFinalizer); !slices.Equal(got, []string{"j-a"}) {
		t.Errorf("finalizers removed of %q, want j-a", got)
	}
	if len(plan.Leaving) != 1 || plan.Leaving[0].Name != "j-a" || plan.Leaving[0].Outcome != v1alpha1.OutcomeFailed {
		t.Errorf("leaving %+v, want j-a Failed", plan.Leaving)
	}
	if plan.Status.Failed != 0 || len(plan.Status.UncountedTerminatedPods.Failed) != 1 {
		t.Errorf("failed %d, uncounted %v: want it counted once, by the next sync", plan.Status.Failed, plan.Status.UncountedTerminatedPods.Failed)
	}
}
