package shim_test

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestPodReplacementPolicy (S7, KEP-3939): with podReplacementPolicy Failed a deleted pod
// is replaced only once it reached phase Failed, and status.terminating counts it
// meanwhile; with TerminatingOrFailed it is replaced at once and counts as failed while
// it still terminates.
func TestPodReplacementPolicy(t *testing.T) {
	t.Parallel()

	t.Run("Failed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, controller.Config{})
		job := f.createJob(wrappers.MakeJob("failed", f.ns).BackoffLimit(3).PodReplacementPolicy(batchv1.Failed))
		first := f.waitActive(job, 1, settle)[0]
		f.bindPod(first, "node-a") // deleted gracefully: terminating until its kubelet finishes it
		f.runPod(first, true)
		f.waitCounters(job, counters{Active: 1, Ready: 1}, settle)

		f.deletePod(first) // a drain
		f.waitCounters(job, counters{Terminating: 1}, settle)
		f.consistently(job, 2*time.Second, "no replacement while the deleted pod terminates", func(j *batchv1.Job, pods []*corev1.Pod) bool {
			return len(pods) == 1 && countersOf(j.Status).eq(counters{Terminating: 1})
		})
		if !hasTrackingFinalizer(f.mirror.record(first.UID).last) {
			t.Errorf("the terminating pod %s lost its tracking finalizer before it failed", first.Name)
		}

		// Its kubelet reports the containers stopped: now it is a failure, replaced.
		f.failPod(first, 143)
		second := f.waitNewActive(job, -1, f.replacementWait(1), first)
		if r1, r2 := f.mirror.record(first.UID), f.mirror.record(second.UID); r2.createdRV < r1.terminalRV {
			t.Errorf("replacement %s created at resourceVersion %d, before %s reached phase Failed at %d", second.Name, r2.createdRV, first.Name, r1.terminalRV)
		}
		f.waitCounters(job, counters{Active: 1, Failed: 1}, settle)
		f.finishDeletion(first)

		f.runPod(second, true)
		f.succeedPod(second)
		f.waitFinished(job, batchv1.JobComplete, settle)
		f.wantCounters(job, counters{Succeeded: 1, Failed: 1})
		f.wantConditions(job, condSuccessCriteriaMet+batchv1.JobReasonCompletionsReached, condComplete+batchv1.JobReasonCompletionsReached)
	})

	t.Run("TerminatingOrFailed", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, controller.Config{})
		job := f.createJob(wrappers.MakeJob("terminating", f.ns).BackoffLimit(3).PodReplacementPolicy(batchv1.TerminatingOrFailed))
		first := f.waitActive(job, 1, settle)[0]
		f.bindPod(first, "node-a")
		f.runPod(first, true)
		f.waitCounters(job, counters{Active: 1, Ready: 1}, settle)

		f.deletePod(first)
		second := f.waitNewActive(job, -1, f.replacementWait(1), first)
		if r := f.mirror.record(first.UID); r.gone || !isTerminating(r.last) {
			t.Errorf("want the replacement %s created while %s still terminates; the deleted pod is %s", second.Name, first.Name, r.last.Status.Phase)
		}
		f.waitCounters(job, counters{Active: 1, Terminating: 1, Failed: 1}, settle)
		f.waitJob(job, settle, "the terminating pod's finalizer removed", func(*batchv1.Job, []*corev1.Pod) bool {
			return f.mirror.record(first.UID).finalizerGoneRV != 0
		})

		f.failPod(first, 143)
		f.finishDeletion(first)
		f.waitCounters(job, counters{Active: 1, Failed: 1}, settle)

		f.runPod(second, true)
		f.succeedPod(second)
		f.waitFinished(job, batchv1.JobComplete, settle)
		f.wantCounters(job, counters{Succeeded: 1, Failed: 1})
		f.wantConditions(job, condSuccessCriteriaMet+batchv1.JobReasonCompletionsReached, condComplete+batchv1.JobReasonCompletionsReached)
	})
}
