package shim_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestSuspendResume (S2): suspending deletes the active pods without counting them as
// failed and sets Suspended=True; resuming creates pods again, sets Suspended=False and
// resets startTime; the Job then completes.
func TestSuspendResume(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("suspend", f.ns).Parallelism(2).Completions(4))
	pods := f.waitActive(job, 2, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}
	j := f.waitJob(job, settle, "2 ready pods and a startTime", func(j *batchv1.Job, _ []*corev1.Pod) bool {
		return countersOf(j.Status).eq(counters{Active: 2, Ready: 2}) && j.Status.StartTime != nil
	})
	started := j.Status.StartTime.Time
	// startTime has a resolution of a second: let one pass so a reset shows.
	waitFor(t, 5*time.Second, "a second after startTime", func() (bool, error) {
		return time.Now().After(started.Add(1100 * time.Millisecond)), nil
	}, nil)

	f.setSuspend(job, true)
	j = f.waitJob(job, settle, "Suspended=True and no pods", func(j *batchv1.Job, pods []*corev1.Pod) bool {
		return hasCondition(j.Status.Conditions, batchv1.JobSuspended) && len(pods) == 0
	})
	f.waitCounters(job, counters{}, settle) // the deleted pods are no failures
	f.wantConditions(job, "Suspended/True/"+conditions.JobReasonSuspended)
	f.wantConditionMessage(job, batchv1.JobSuspended, conditions.JobMessageSuspended)
	if j.Status.StartTime != nil {
		// Kubernetes 1.36 (MutableSchedulingDirectivesForSuspendedJobs, beta, on) clears it.
		t.Errorf("suspended Job has startTime %v, want none, as the built-in controller of 1.36", j.Status.StartTime)
	}
	f.consistently(job, time.Second, "no pods while suspended", func(_ *batchv1.Job, pods []*corev1.Pod) bool { return len(pods) == 0 })
	f.waitEvent(job, corev1.EventTypeNormal, conditions.EventReasonSuspended, conditions.JobMessageSuspended)

	resumed := time.Now().Truncate(time.Second)
	f.setSuspend(job, false)
	again := f.waitActive(job, 2, settle)
	j = f.waitJob(job, settle, "Suspended=False and a new startTime", func(j *batchv1.Job, _ []*corev1.Pod) bool {
		c := j.Status.Conditions
		return len(c) == 1 && c[0].Status == corev1.ConditionFalse && j.Status.StartTime != nil
	})
	f.wantConditions(job, "Suspended/False/"+conditions.JobReasonResumed)
	f.wantConditionMessage(job, batchv1.JobSuspended, conditions.JobMessageResumed)
	if st := j.Status.StartTime.Time; st.Before(resumed) || !st.After(started) {
		t.Errorf("startTime after resume = %v, want the resume time %v (was %v before the suspension)", st, resumed, started)
	}
	f.waitEvent(job, corev1.EventTypeNormal, conditions.EventReasonResumed, conditions.JobMessageResumed)

	f.succeedAll(job, 4, again...)
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantConditions(job, "Suspended/False/"+conditions.JobReasonResumed,
		condSuccessCriteriaMet+batchv1.JobReasonCompletionsReached, condComplete+batchv1.JobReasonCompletionsReached)
	f.wantCounters(job, counters{Succeeded: 4})
	if n := len(f.mirror.records(job)); n != 6 {
		t.Errorf("Job had %d pods, want 6: 2 deleted by the suspension, 4 that succeeded\n%s", n, f.describe(job))
	}
}

// setSuspend sets spec.suspend.
func (f *fixture) setSuspend(job *batchv1.Job, suspend bool) {
	f.t.Helper()
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"suspend": suspend}})
	if _, err := f.client.BatchV1().Jobs(f.ns).Patch(context.Background(), job.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		f.t.Fatalf("setting suspend=%v on Job %s: %v", suspend, job.Name, err)
	}
}

// succeedAll runs and succeeds the Job's pods as they come until n did, starting with
// first.
func (f *fixture) succeedAll(job *batchv1.Job, n int, first ...*corev1.Pod) {
	f.t.Helper()
	var done []*corev1.Pod
	next := first
	for len(done) < n {
		var p *corev1.Pod
		if len(next) > 0 {
			p, next = next[0], next[1:]
		} else {
			p = f.waitNewActive(job, -1, settle, done...)
		}
		f.runPod(p, true)
		f.succeedPod(p)
		done = append(done, p)
	}
}

// TestActiveDeadline (S2): a Job active longer than activeDeadlineSeconds fails with
// DeadlineExceeded, its running pods deleted.
func TestActiveDeadline(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("deadline", f.ns).Parallelism(2).Completions(2).ActiveDeadlineSeconds(2))
	for _, p := range f.waitActive(job, 2, settle) {
		f.runPod(p, true)
	}
	j := f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonDeadlineExceeded, condFailed+batchv1.JobReasonDeadlineExceeded)
	f.wantConditionMessage(job, batchv1.JobFailed, conditions.JobMessageDeadlineExceeded)
	// The running pods were deleted and, as upstream counts them, failed.
	f.wantCounters(job, counters{Failed: 2})
	if left := f.mirror.podsOf(job); len(left) != 0 {
		t.Errorf("pods left after the deadline: %s", podNames(left))
	}
	target := findCondition(j.Status.Conditions, batchv1.JobFailureTarget).LastTransitionTime.Time
	if after := target.Sub(j.Status.StartTime.Time); after < 2*time.Second || after > 10*time.Second {
		t.Errorf("FailureTarget %v after startTime, want the deadline of 2s (within 10s)", after)
	}
	f.waitEvent(job, corev1.EventTypeWarning, batchv1.JobReasonDeadlineExceeded, conditions.JobMessageDeadlineExceeded)
}

// TestSuccessPolicy (S2): once a successPolicy rule is met (here the second: any two
// indexes) the Job gets SuccessCriteriaMet with reason SuccessPolicy, its remaining pods
// are deleted without counting as failed, and it completes.
func TestSuccessPolicy(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("success", f.ns).Indexed().Completions(5).Parallelism(5).
		SuccessPolicy(wrappers.SucceededIndexes("3-4"), wrappers.SucceededCount(2)))
	pods := f.waitActive(job, 5, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}
	f.succeedPod(pods[0])
	f.waitCounters(job, counters{Active: 4, Ready: 4, Succeeded: 1, CompletedIndexes: "0"}, settle)
	f.wantConditions(job)

	f.succeedPod(pods[1])
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantConditions(job, condSuccessCriteriaMet+batchv1.JobReasonSuccessPolicy, condComplete+batchv1.JobReasonSuccessPolicy)
	f.wantConditionMessage(job, batchv1.JobComplete, conditions.JobMessageSuccessPolicyRulesMatched+" 1")
	f.wantCounters(job, counters{Succeeded: 2, CompletedIndexes: "0,1"})
	if left := f.mirror.podsOf(job); len(left) != 2 || left[0].UID != pods[0].UID || left[1].UID != pods[1].UID {
		t.Errorf("pods left = [%s], want only the succeeded %s and %s\n%s", podNames(left), pods[0].Name, pods[1].Name, f.describe(job))
	}
}

// TestNonIndexedCompletions (S2): a NonIndexed Job with completions 5 and parallelism 2
// never has more than 2 active pods (checked on every pod event), creates exactly 5 pods
// when all succeed, and completes with completionTime.
func TestNonIndexedCompletions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("completions", f.ns).Completions(5).Parallelism(2))
	pods := f.waitActive(job, 2, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}
	f.waitCounters(job, counters{Active: 2, Ready: 2}, settle)
	f.succeedAll(job, 5, pods...)
	j := f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantConditions(job, condSuccessCriteriaMet+batchv1.JobReasonCompletionsReached, condComplete+batchv1.JobReasonCompletionsReached)
	f.wantConditionMessage(job, batchv1.JobComplete, conditions.JobMessageCompletionsReached)
	f.wantCounters(job, counters{Succeeded: 5})
	if j.Status.CompletionTime == nil {
		t.Errorf("Complete Job without completionTime")
	}
	if n := len(f.mirror.records(job)); n != 5 {
		t.Errorf("Job had %d pods, want exactly 5\n%s", n, f.describe(job))
	}
	f.waitEvent(job, corev1.EventTypeNormal, conditions.EventReasonCompleted, "Job completed")
}
