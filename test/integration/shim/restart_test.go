package shim_test

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestShimRestart: the controller is stopped while pods fail and succeed, and restarted
// against the same API server, also at arbitrary points of its work: no failure or
// success is lost or counted twice, and no index ever has two active pods (the watch
// checks that on every pod event).
func TestShimRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("restart", f.ns).Indexed().Completions(6).Parallelism(3).BackoffLimitPerIndex(1))
	pods := f.waitActive(job, 3, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}
	f.waitCounters(job, counters{Active: 3, Ready: 3, FailedIndexes: strp("")}, settle)

	// Down while index 0 fails and index 1 succeeds.
	f.stopController()
	before := countersOf(f.mirror.job(job.UID).Status)
	f.failPod(pods[0], 1)
	f.succeedPod(pods[1])
	if !f.builtin { // the shared built-in controller may still run for other tests
		f.consistently(job, time.Second, "no change while no controller runs", func(j *batchv1.Job, ps []*corev1.Pod) bool {
			return len(ps) == 3 && countersOf(j.Status).eq(before)
		})
	}
	f.startController()
	a0 := f.waitNewActive(job, 0, f.replacementWait(1), pods[0])
	f.wantAnnotation(a0, batchv1.JobIndexFailureCountAnnotation, "1")
	a3 := f.waitNewActive(job, 3, settle)
	f.waitCounters(job, counters{Active: 3, Ready: 1, Succeeded: 1, Failed: 1, CompletedIndexes: "1", FailedIndexes: strp("")}, settle)

	// Down again: index 0 fails for the second time (its limit), index 2 succeeds.
	f.stopController()
	f.failPod(a0, 1)
	f.succeedPod(pods[2])
	f.runPod(a3, true)
	f.startController()
	a4 := f.waitNewActive(job, 4, settle)
	a5 := f.waitNewActive(job, 5, settle)
	f.waitCounters(job, counters{Active: 3, Ready: 1, Succeeded: 2, Failed: 2, CompletedIndexes: "1,2", FailedIndexes: strp("0")}, settle)

	// Restarts right after the kubelet's writes, while the controller works on them.
	restart := func(after time.Duration) {
		time.Sleep(after) // deliberately: stop the controller in the middle of its work
		f.stopController()
		f.startController()
	}
	f.succeedPod(a3)
	f.failPod(a4, 1)
	restart(30 * time.Millisecond)
	a4b := f.waitNewActive(job, 4, f.replacementWait(1), a4)
	f.wantAnnotation(a4b, batchv1.JobIndexFailureCountAnnotation, "1")
	f.succeedPod(a5)
	restart(0)
	f.runPod(a4b, true)
	f.succeedPod(a4b)
	restart(batchPeriod + 20*time.Millisecond)

	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonFailedIndexes, condFailed+batchv1.JobReasonFailedIndexes)
	f.wantCounters(job, counters{Succeeded: 5, Failed: 3, CompletedIndexes: "1-5", FailedIndexes: strp("0")})
	f.wantPodsPerIndex(job, map[int]int{0: 2, 1: 1, 2: 1, 3: 1, 4: 2, 5: 1})
	for _, s := range f.mirror.statuses(job.UID) {
		if s.status.Failed > 3 || s.status.Succeeded > 5 {
			t.Errorf("status at resourceVersion %d counted %d failed and %d succeeded: more failures or successes than happened (3, 5)", s.rv, s.status.Failed, s.status.Succeeded)
		}
	}
}
