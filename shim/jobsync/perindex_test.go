package jobsync

// Tests of backoffLimitPerIndex, maxFailedIndexes and FailIndex (KEP-3850).

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestBackoffLimitPerIndex(t *testing.T) {
	w := wrappers.MakeJob("j", "ns").Indexed().Completions(3).Parallelism(3).BackoffLimitPerIndex(1)
	j := job(w)
	first := tracked(failed("j-0-a", 1).Index(0).Annotation(batchv1.JobIndexFailureCountAnnotation, "0"))
	first.Status.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.Time{Time: now.Add(-11 * time.Second)}
	pods := []*corev1.Pod{first, tracked(running("j-1-a").Index(1)), tracked(running("j-2-a").Index(2))}

	plan := sync(j, pods...)
	if len(plan.Create) != 1 || plan.Create[0].Pod.Annotations[batchv1.JobIndexFailureCountAnnotation] != "1" {
		t.Fatalf("create = %+v, want index 0 again with failure count 1", plan.Create)
	}
	if len(plan.RemoveFinalizer) != 0 {
		t.Errorf("finalizer of %v removed before the replacement exists", names(plan.RemoveFinalizer))
	}
	if ptr.Deref(plan.Status.FailedIndexes, "x") != "" {
		t.Errorf("failedIndexes = %v, want empty", plan.Status.FailedIndexes)
	}

	// The replacement fails too: the index fails, the Job goes on with the others.
	j.Status = plan.Status
	second := tracked(failed("j-0-b", 1).Index(0).Annotation(batchv1.JobIndexFailureCountAnnotation, "1"))
	plan = sync(j, append(pods, second)...)
	if got := ptr.Deref(plan.Status.FailedIndexes, ""); got != "0" {
		t.Errorf("failedIndexes = %q, want \"0\"", got)
	}
	if len(plan.Create) != 0 || len(plan.Status.Conditions) != 0 {
		t.Errorf("create %d, conditions %v: want nothing while indexes 1 and 2 run", len(plan.Create), conditionSummary(plan.Status.Conditions))
	}
	if plan.Observations.FinishedIndexes["failed"] != 1 {
		t.Errorf("finished indexes %+v", plan.Observations.FinishedIndexes)
	}
	var ev []string
	for _, e := range plan.Events {
		ev = append(ev, e.Message)
	}
	if !slices.ContainsFunc(ev, func(s string) bool {
		return strings.Contains(s, "pod ns/j-0-b: container main exited 1") && strings.Contains(s, "index 0 failed")
	}) {
		t.Errorf("events %q do not explain that index 0 failed", ev)
	}

	// Indexes 1 and 2 succeed: FailureTarget FailedIndexes; Failed follows in the next
	// write (succeeded indexes are recorded in completedIndexes, nothing is uncounted).
	j.Status = plan.Status
	plan = sync(j, tracked(succeeded("j-1-a").Index(1)), tracked(succeeded("j-2-a").Index(2)))
	if diff := cmp.Diff([]string{"FailureTarget=True/FailedIndexes"}, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	if plan.Status.CompletedIndexes != "1,2" || plan.Status.Succeeded != 2 {
		t.Errorf("completedIndexes %q succeeded %d, want \"1,2\" and 2", plan.Status.CompletedIndexes, plan.Status.Succeeded)
	}
	j.Status = plan.Status
	plan = sync(j)
	if diff := cmp.Diff([]string{"FailureTarget=True/FailedIndexes", "Failed=True/FailedIndexes"}, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Errorf("next sync: conditions (-want +got):\n%s", diff)
	}
}

func TestPerIndexBackoffDoubles(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).BackoffLimitPerIndex(5))
	for _, tc := range []struct {
		count string
		want  time.Duration
	}{{"0", 10 * time.Second}, {"1", 20 * time.Second}, {"2", 40 * time.Second}} {
		p := tracked(failed("j-0-"+tc.count, 1).Index(0).Annotation(batchv1.JobIndexFailureCountAnnotation, tc.count))
		p.Status.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.Time{Time: now}
		plan := sync(j, p)
		if len(plan.Create) != 0 || plan.RequeueAfter != tc.want {
			t.Errorf("failure count %s: create %d, requeue %v; want none and %v", tc.count, len(plan.Create), plan.RequeueAfter, tc.want)
		}
	}
}

func TestFailIndexAndMaxFailedIndexes(t *testing.T) {
	w := wrappers.MakeJob("j", "ns").Indexed().Completions(4).Parallelism(4).BackoffLimitPerIndex(3).MaxFailedIndexes(1).PodFailurePolicy(
		wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42))
	j := job(w)
	pods := []*corev1.Pod{
		tracked(failed("j-0-a", 42).Index(0).Annotation(batchv1.JobIndexFailureCountAnnotation, "0")),
		tracked(running("j-1-a").Index(1)), tracked(running("j-2-a").Index(2)), tracked(running("j-3-a").Index(3)),
	}
	plan := sync(j, pods...)
	if got := ptr.Deref(plan.Status.FailedIndexes, ""); got != "0" || len(plan.Create) != 0 {
		t.Errorf("failedIndexes %q, create %d; want index 0 failed at once, no retry", got, len(plan.Create))
	}
	j.Status = plan.Status
	pods[1] = tracked(failed("j-1-a", 42).Index(1).Annotation(batchv1.JobIndexFailureCountAnnotation, "0"))
	plan = sync(j, pods...)
	if diff := cmp.Diff([]string{"FailureTarget=True/MaxFailedIndexesExceeded"}, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	if len(plan.Delete) != 2 {
		t.Errorf("deleted %d pods, want the 2 still running", len(plan.Delete))
	}
}

// The sync right after the one that failed the Job (MaxFailedIndexesExceeded) and deleted
// its running pods may still see them terminating with their tracking finalizer, whose
// removal is in flight: they were recorded as failed already and must not turn into
// failed indexes ("0-5" instead of "1,4", seen once in the integration suite).
func TestFinalizersInFlightAddNoFailedIndexes(t *testing.T) {
	w := wrappers.MakeJob("j", "ns").Indexed().Completions(6).Parallelism(6).BackoffLimitPerIndex(0).MaxFailedIndexes(1)
	j := job(w)
	deleted := metav1.NewTime(now.Add(-time.Second))
	var pods []*corev1.Pod
	inFlight := sets.New[types.UID]()
	for ix := range 6 {
		var p *corev1.Pod
		if ix == 1 || ix == 4 {
			p = tracked(failed(fmt.Sprintf("j-%d-a", ix), 1).Index(ix).Annotation(batchv1.JobIndexFailureCountAnnotation, "0"))
		} else {
			p = tracked(running(fmt.Sprintf("j-%d-a", ix)).Index(ix))
		}
		pods = append(pods, p)
	}
	// Sync 1: FailureTarget, the running pods deleted, all six recorded as failed.
	plan := sync(j, pods...)
	if got := ptr.Deref(plan.Status.FailedIndexes, ""); got != "1,4" {
		t.Fatalf("failedIndexes %q after the first sync, want 1,4", got)
	}
	j.Status = plan.Status
	// The next sync sees the deleted pods still with their finalizer, its removal in flight.
	for _, p := range pods {
		inFlight.Insert(p.UID)
		if p.Status.Phase == corev1.PodRunning {
			p.DeletionTimestamp = &deleted
		}
	}
	plan = Sync(Input{Job: j, Pods: pods, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true, FinalizersBeingRemoved: inFlight})
	if got := ptr.Deref(plan.Status.FailedIndexes, ""); got != "1,4" {
		t.Errorf("failedIndexes %q while the finalizer removals are in flight, want 1,4", got)
	}
}

// TestGarbageFailureCountSaidOnce: a failed pod whose index failure count annotation is
// not a number is read as 0, as upstream does, and the replacement's creation says so in a
// Warning Event naming the pod and the value.
func TestGarbageFailureCountSaidOnce(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).BackoffLimitPerIndex(2))
	p := tracked(failed("j-0-a", 1).Index(0).Annotation(batchv1.JobIndexFailureCountAnnotation, "many"))
	p.Status.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.NewTime(now.Add(-time.Hour))
	plan := sync(j, p)
	var said []string
	for _, e := range plan.Events {
		if e.Reason == EventReasonInvalidFailureCount {
			said = append(said, e.Message)
		}
	}
	if len(plan.Create) != 1 {
		t.Fatalf("created %d pods, want the replacement of index 0", len(plan.Create))
	}
	if got := plan.Create[0].Pod.Annotations[batchv1.JobIndexFailureCountAnnotation]; got != "1" {
		t.Errorf("replacement's failure count %q, want 1 (garbage read as 0, plus this failure)", got)
	}
	if len(said) != 1 || !strings.Contains(said[0], `"many"`) || !strings.Contains(said[0], "j-0-a") {
		t.Errorf("InvalidIndexFailureCount Events %q, want one naming the pod and the value", said)
	}
}
