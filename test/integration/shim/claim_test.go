package shim_test

import (
	"context"
	"fmt"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestAdoptAndRelease: a running pod whose owner reference someone took away is adopted
// again (controller reference and tracking finalizer), and one whose labels were taken away
// is released (neither left) and replaced, as upstream's conformance spec "should adopt
// matching orphans and release non-matching pods" asks of the built-in controller. The
// Job completes with the pods it still has; the released pod is not counted.
func TestAdoptAndRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	// Two completions, two at a time: once one pod succeeded, one more is needed, so the
	// replacement made while a pod is orphaned and the adopted pod are never more than
	// parallelism (the watch checks that on every event).
	job := f.createJob(wrappers.MakeJob("adopt", f.ns).Parallelism(2).Completions(2))
	pods := f.waitActive(job, 2, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}
	f.succeedPod(pods[0])
	f.waitCounters(job, counters{Active: 1, Ready: 1, Succeeded: 1}, settle)

	orphan := pods[1]
	// The states waited for are those of versions after the test's own write.
	orphaned := f.updatePod(orphan, "take its owner references away", func(p *corev1.Pod) { p.OwnerReferences = nil })
	f.waitPodRecord(orphan, "adopted again: the Job's controller reference and the tracking finalizer", func(r *podRecord) bool {
		ref := metav1.GetControllerOf(r.last)
		return !r.gone && rvOf(r.last) > rvOf(orphaned) && ref != nil && ref.UID == job.UID && hasTrackingFinalizer(r.last)
	})
	if !f.builtin {
		f.waitEvent(job, corev1.EventTypeNormal, conditions.EventReasonAdopted, fmt.Sprintf(conditions.AdoptedPodMessage, orphan.Name))
	}
	// A replacement may have been made while the pod was an orphan: one of the two goes.
	kept := f.waitActive(job, 1, settle)[0]

	unlabelled := f.updatePod(kept, "take its labels away", func(p *corev1.Pod) { p.Labels = nil })
	f.waitPodRecord(kept, "released: no owner reference, no tracking finalizer", func(r *podRecord) bool {
		return !r.gone && rvOf(r.last) > rvOf(unlabelled) && metav1.GetControllerOf(r.last) == nil && !hasTrackingFinalizer(r.last)
	})
	if !f.builtin {
		f.waitEvent(job, corev1.EventTypeNormal, conditions.EventReasonReleased, fmt.Sprintf(conditions.ReleasedPodMessage, kept.Name))
	}
	replacement := f.waitNewActive(job, -1, settle, kept)
	f.runPod(replacement, true)
	f.succeedPod(replacement)
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantCounters(job, counters{Succeeded: 2})
	// The released pod is nobody's: still running, untouched by the Job's end.
	if r := f.mirror.record(kept.UID); r == nil || r.gone || r.last.Status.Phase != corev1.PodRunning || len(r.last.OwnerReferences) != 0 {
		t.Errorf("the released pod: want it running with no owner, got %+v", r)
	}
}

// updatePod changes the pod through the API (not its status), retrying on conflicts, and
// returns it as written.
func (f *fixture) updatePod(pod *corev1.Pod, what string, mutate func(p *corev1.Pod)) *corev1.Pod {
	f.t.Helper()
	pods := f.client.CoreV1().Pods(pod.Namespace)
	var updated *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := pods.Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(p)
		updated, err = pods.Update(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		f.t.Fatalf("%s of pod %s: %v", what, pod.Name, err)
	}
	return updated
}

// TestManagedLabelLost: a running pod of a managed Job whose coroner.dev/managed label is
// taken away leaves the shim's pod cache, still matching its Job's selector: the shim reads
// it again and labels it again, with no replacement meanwhile. Then the label is taken away
// while no shim runs, as after an upgrade from a shim that did not label its pods: the next
// one labels it before its caches start, again with no replacement. The Job completes with
// its one pod.
func TestManagedLabelLost(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	if f.builtin {
		t.Skip("coroner's own label")
	}
	job := f.createJob(wrappers.MakeJob("label", f.ns).Parallelism(1).Completions(1))
	pod := f.waitActive(job, 1, settle)[0]
	if pod.Labels[conditions.ManagedPodLabel] != "true" {
		t.Fatalf("pod labels %v: no %s=true", pod.Labels, conditions.ManagedPodLabel)
	}
	f.runPod(pod, true)
	unlabel := func(p *corev1.Pod) { delete(p.Labels, conditions.ManagedPodLabel) }
	labelledAgain := func(after *corev1.Pod) {
		f.waitPodRecord(pod, "labelled "+conditions.ManagedPodLabel+" again", func(r *podRecord) bool {
			return !r.gone && rvOf(r.last) > rvOf(after) && r.last.Labels[conditions.ManagedPodLabel] == "true"
		})
	}
	labelledAgain(f.updatePod(pod, "take the label away", unlabel))

	f.stopController()
	after := f.updatePod(pod, "take the label away while no shim runs", unlabel)
	f.startController()
	labelledAgain(after)

	f.succeedPod(pod)
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantCounters(job, counters{Succeeded: 1})
	if n := len(f.mirror.records(job)); n != 1 {
		t.Errorf("the Job had %d pods, want its first one only", n)
	}
}
