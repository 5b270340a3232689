package shim_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestBackoffLimitPerIndex (S5): two indexes of ten fail twice with backoffLimitPerIndex
// 1; their replacements carry job-index-failure-count 1, a failed pod keeps its finalizer
// until its replacement exists or its index is recorded as failed, the Job keeps running
// the other indexes to success and then fails with FailedIndexes "3,7".
func TestBackoffLimitPerIndex(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("perindex", f.ns).Indexed().Completions(10).Parallelism(10).BackoffLimitPerIndex(1))
	pods := f.waitActive(job, 10, settle)
	for i, p := range pods {
		if podIndex(p) != i {
			t.Fatalf("active pods are not one per index 0-9: %s", podNames(pods))
		}
		f.wantAnnotation(p, batchv1.JobIndexFailureCountAnnotation, "0")
		f.runPod(p, true)
	}

	f.failPod(pods[3], 1)
	f.failPod(pods[7], 1)
	again := map[int]*corev1.Pod{}
	for _, ix := range []int{3, 7} {
		again[ix] = f.waitNewActive(job, ix, f.replacementWait(1), pods[ix])
		f.wantAnnotation(again[ix], batchv1.JobIndexFailureCountAnnotation, "1")
	}
	f.waitCounters(job, counters{Active: 10, Ready: 8, Failed: 2, FailedIndexes: strp("")}, settle)
	for _, ix := range []int{3, 7} {
		first, second := f.mirror.record(pods[ix].UID), f.mirror.record(again[ix].UID)
		if first.finalizerGoneRV == 0 || first.finalizerGoneRV < second.createdRV {
			t.Errorf("index %d: failed pod %s lost its finalizer at resourceVersion %d, before its replacement %s was created at %d (S5)",
				ix, first.first.Name, first.finalizerGoneRV, second.first.Name, second.createdRV)
		}
	}

	for _, ix := range []int{0, 1, 2, 4, 5} {
		f.succeedPod(pods[ix])
	}
	f.failPod(again[3], 1)
	f.failPod(again[7], 1)
	f.waitCounters(job, counters{Active: 3, Ready: 3, Succeeded: 5, Failed: 4, CompletedIndexes: "0-2,4,5", FailedIndexes: strp("3,7")}, settle)
	f.wantConditions(job) // indexes 6, 8 and 9 still run
	for _, ix := range []int{3, 7} {
		f.waitJob(job, settle, fmt.Sprintf("the finalizer of the last pod of index %d removed", ix), func(*batchv1.Job, []*corev1.Pod) bool {
			return f.mirror.record(again[ix].UID).finalizerGoneRV != 0
		})
		failedRV := f.firstStatusRV(job, func(s batchv1.JobStatus) bool {
			return s.FailedIndexes != nil && strings.Contains(*s.FailedIndexes, fmt.Sprint(ix))
		})
		if gone := f.mirror.record(again[ix].UID).finalizerGoneRV; failedRV == 0 || gone < failedRV {
			t.Errorf("index %d: the finalizer of %s was removed at resourceVersion %d, before failedIndexes had the index (%d)", ix, again[ix].Name, gone, failedRV)
		}
	}
	f.wantPodsPerIndex(job, map[int]int{0: 1, 1: 1, 2: 1, 3: 2, 4: 1, 5: 1, 6: 1, 7: 2, 8: 1, 9: 1})

	for _, ix := range []int{6, 8, 9} {
		f.succeedPod(pods[ix])
	}
	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonFailedIndexes, condFailed+batchv1.JobReasonFailedIndexes)
	f.wantConditionMessage(job, batchv1.JobFailed, conditions.JobMessageFailedIndexes)
	f.wantCounters(job, counters{Succeeded: 8, Failed: 4, CompletedIndexes: "0-2,4-6,8,9", FailedIndexes: strp("3,7")})
	f.wantPodsPerIndex(job, map[int]int{0: 1, 1: 1, 2: 1, 3: 2, 4: 1, 5: 1, 6: 1, 7: 2, 8: 1, 9: 1})
}

// firstStatusRV returns the resourceVersion of the first watched status of job for which
// match holds, 0 if none.
func (f *fixture) firstStatusRV(job *batchv1.Job, match func(batchv1.JobStatus) bool) uint64 {
	for _, s := range f.mirror.statuses(job.UID) {
		if match(s.status) {
			return s.rv
		}
	}
	return 0
}

// TestMaxFailedIndexesExceeded (S5): with maxFailedIndexes 1, the second failed index
// fails the Job with MaxFailedIndexesExceeded at once; the indexes still running are
// deleted.
func TestMaxFailedIndexesExceeded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("maxfailed", f.ns).Indexed().Completions(6).Parallelism(6).BackoffLimitPerIndex(0).MaxFailedIndexes(1))
	pods := f.waitActive(job, 6, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}
	f.failPod(pods[1], 1)
	f.waitCounters(job, counters{Active: 5, Ready: 5, Failed: 1, FailedIndexes: strp("1")}, settle)
	f.wantConditions(job)

	f.failPod(pods[4], 1)
	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonMaxFailedIndexesExceeded, condFailed+batchv1.JobReasonMaxFailedIndexesExceeded)
	f.wantConditionMessage(job, batchv1.JobFailed, conditions.JobMessageMaxFailedIndexesExceeded)
	// The four pods still running when the Job failed were deleted and, as upstream
	// counts them, failed.
	f.wantCounters(job, counters{Failed: 6, FailedIndexes: strp("1,4")})
	left := f.mirror.podsOf(job)
	if len(left) != 2 || left[0].UID != pods[1].UID || left[1].UID != pods[4].UID {
		t.Errorf("pods left = [%s], want only the failed %s and %s\n%s", podNames(left), pods[1].Name, pods[4].Name, f.describe(job))
	}
	f.wantPodsPerIndex(job, map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1})
}

// TestPerIndexBackoff (S6): the delay before an index's replacement is the backoff after
// that index's failures, measured from the failed pod's finish time: the second
// replacement waits about twice as long as the first, and a pod that finished long ago
// (by its containers' finishedAt, or without them by its Ready=False transition) is
// replaced at once.
func TestPerIndexBackoff(t *testing.T) {
	t.Parallel()
	base := 3 * time.Second
	f := newFixture(t, controller.Config{Backoff: backoff.Policy{Base: base, Max: 10 * time.Minute}})
	base = f.backoff.Base // the built-in controller's 10s under CORONER_SHIM_TARGET=builtin
	job := f.createJob(wrappers.MakeJob("backoff", f.ns).Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(3))
	pods := f.waitActive(job, 2, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}

	// Index 1: failures that finished long ago need no wait.
	longAgo := time.Now().Add(-10 * base).Truncate(time.Second)
	wrote := time.Now()
	f.failPod(pods[1], 1, finishedAt(longAgo))
	q1 := f.waitNewActive(job, 1, f.replacementWait(1), pods[1])
	if took := f.mirror.record(q1.UID).firstSeen.Sub(wrote); took > base/2 {
		t.Errorf("a pod whose containers finished %v ago was replaced after %v, want well under the backoff of %v: the finish time must be the containers' finishedAt, not now (S6)",
			time.Since(longAgo).Round(time.Second), took.Round(time.Millisecond), base)
	}
	f.wantAnnotation(q1, batchv1.JobIndexFailureCountAnnotation, "1")
	f.runPod(q1, true)
	wrote = time.Now()
	f.failPod(q1, 1, finishedAt(longAgo), withoutFinishTime())
	q2 := f.waitNewActive(job, 1, f.replacementWait(2), pods[1], q1)
	if took := f.mirror.record(q2.UID).firstSeen.Sub(wrote); took > base/2 {
		t.Errorf("a pod without container finish times that turned Ready=False %v ago was replaced after %v, want well under the backoff of %v: the finish time must be the Ready=False transition (S6)",
			time.Since(longAgo).Round(time.Second), took.Round(time.Millisecond), 2*base)
	}
	f.wantAnnotation(q2, batchv1.JobIndexFailureCountAnnotation, "2")

	// Index 0: failures that finish now wait base, then twice as long.
	delay := func(prev *corev1.Pod, exclude ...*corev1.Pod) (*corev1.Pod, time.Duration) {
		t.Helper()
		fin := time.Now().Truncate(time.Second) // what the API server stores
		f.failPod(prev, 1, finishedAt(fin))
		next := f.waitNewActive(job, 0, f.replacementWait(len(exclude)), exclude...)
		return next, next.CreationTimestamp.Sub(fin)
	}
	r1, d1 := delay(pods[0], pods[0])
	f.wantAnnotation(r1, batchv1.JobIndexFailureCountAnnotation, "1")
	f.runPod(r1, true)
	r2, d2 := delay(r1, pods[0], r1)
	f.wantAnnotation(r2, batchv1.JobIndexFailureCountAnnotation, "2")
	t.Logf("index 0: replaced %v after the first failure, %v after the second (base %v)", d1, d2, base)
	if d1 < base {
		t.Errorf("first replacement of index 0 created %v after the failed pod finished, want at least the base backoff %v", d1, base)
	}
	if d2 < 2*base {
		t.Errorf("second replacement of index 0 created %v after the failed pod finished, want at least twice the base backoff, %v", d2, 2*base)
	}
	if ratio := float64(d2) / float64(d1); ratio < 1.5 || ratio > 3 {
		t.Errorf("second replacement delay / first = %v / %v = %.2f, want about 2 (between 1.5 and 3)", d2, d1, ratio)
	}

	f.succeedPod(r2)
	f.succeedPod(q2)
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantCounters(job, counters{Succeeded: 2, Failed: 4, CompletedIndexes: "0,1", FailedIndexes: strp("")})
	f.wantPodsPerIndex(job, map[int]int{0: 3, 1: 3})
}
