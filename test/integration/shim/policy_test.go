package shim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/coroner-dev/coroner/cmd/coronerctl/explain"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const (
	failJob   = batchv1.PodFailurePolicyActionFailJob
	ignore    = batchv1.PodFailurePolicyActionIgnore
	count     = batchv1.PodFailurePolicyActionCount
	failIndex = batchv1.PodFailurePolicyActionFailIndex
	opIn      = batchv1.PodFailurePolicyOnExitCodesOpIn

	condFailureTarget      = "FailureTarget/True/"
	condFailed             = "Failed/True/"
	condSuccessCriteriaMet = "SuccessCriteriaMet/True/"
	condComplete           = "Complete/True/"
)

// TestFailJobOnExitCode (S3): an exit code matched by a FailJob rule fails the Job with
// reason PodFailurePolicy and upstream's message: first FailureTarget, then the other
// active pods are deleted, and Failed comes only once none of them is terminating.
func TestFailJobOnExitCode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("failjob", f.ns).Parallelism(3).Completions(3).PodFailurePolicy(
		wrappers.OnExitCodes(failJob, opIn, 42).InContainer("main"),
		wrappers.OnPodCondition(ignore, conditions.DisruptionTarget),
	))
	pods := f.waitActive(job, 3, settle)
	// The third pod runs on a node: once deleted it stays terminating until its kubelet
	// (the test) says it stopped.
	f.bindPod(pods[2], "node-a")
	for _, p := range pods {
		f.runPod(p, true)
	}
	f.waitCounters(job, counters{Active: 3, Ready: 3}, settle)

	f.failPod(pods[0], 42)
	msg := fmt.Sprintf("Container main for pod %s/%s failed with exit code 42 matching FailJob rule at index 0", f.ns, pods[0].Name)

	// FailureTarget, the unscheduled active pod deleted and gone, the bound one terminating
	// without its finalizer; every pod of the failed Job counts as failed, as upstream.
	f.waitJob(job, settle, "FailureTarget, pod 1 gone, pod 2 terminating without finalizer", func(j *batchv1.Job, ps []*corev1.Pod) bool {
		r1, r2 := f.mirror.record(pods[1].UID), f.mirror.record(pods[2].UID)
		return hasCondition(j.Status.Conditions, batchv1.JobFailureTarget) && r1.gone &&
			!r2.gone && isTerminating(r2.last) && !hasTrackingFinalizer(r2.last)
	})
	f.waitCounters(job, counters{Terminating: 1, Failed: 3}, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonPodFailurePolicy)
	f.wantConditionMessage(job, batchv1.JobFailureTarget, msg)
	f.consistently(job, 1500*time.Millisecond, "no Failed condition while a pod is terminating", func(j *batchv1.Job, _ []*corev1.Pod) bool {
		return !hasCondition(j.Status.Conditions, batchv1.JobFailed)
	})

	// The node's kubelet reports the pod stopped and completes its deletion.
	f.failPod(pods[2], 137)
	f.finishDeletion(pods[2])
	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonPodFailurePolicy, condFailed+batchv1.JobReasonPodFailurePolicy)
	f.wantConditionMessage(job, batchv1.JobFailed, msg)
	f.wantCounters(job, counters{Failed: 3})
	f.waitEvent(job, corev1.EventTypeWarning, batchv1.JobReasonPodFailurePolicy, msg)
	// The pods the shim deleted have their last state in their SuccessfulDelete Event.
	f.waitEvent(job, corev1.EventTypeNormal, conditions.EventReasonSuccessfulDelete,
		fmt.Sprintf("Deleted pod: %s (job failed: PodFailurePolicy); phase Running; container main running", pods[2].Name))
	// One Event for the decision: announced when it was taken, not again with Failed.
	f.settle()
	if got := f.jobEvents(job, batchv1.JobReasonPodFailurePolicy); len(got) != 1 {
		t.Errorf("PodFailurePolicy Events on the Job = %q, want the one decision", got)
	}

	// Only the failed pod is left, and no replacement was ever made.
	if left := f.mirror.podsOf(job); len(left) != 1 || left[0].UID != pods[0].UID {
		t.Errorf("pods left = [%s], want only the failed %s\n%s", podNames(left), pods[0].Name, f.describe(job))
	}
	if n := len(f.mirror.records(job)); n != 3 {
		t.Errorf("Job had %d pods, want the 3 first ones only\n%s", n, f.describe(job))
	}
}

// TestIgnoreDisruptionTarget (S3, S5): a failure with DisruptionTarget matched by an
// Ignore rule is replaced and not counted; with backoffLimitPerIndex the replacement
// carries the ignored failure in job-index-ignored-failure-count.
func TestIgnoreDisruptionTarget(t *testing.T) {
	t.Parallel()
	t.Run("NonIndexed with backoffLimit 0", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, controller.Config{})
		// backoffLimit 0: a single counted failure would fail the Job.
		job := f.createJob(wrappers.MakeJob("ignore", f.ns).BackoffLimit(0).PodFailurePolicy(
			wrappers.OnExitCodes(failJob, opIn, 42),
			wrappers.OnPodCondition(ignore, conditions.DisruptionTarget),
		))
		first := f.waitActive(job, 1, settle)[0]
		f.runPod(first, true)
		f.failPod(first, 137, disruption(conditions.ReasonEvictionByEvictionAPI))

		second := f.waitNewActive(job, -1, f.replacementWait(1), first)
		f.waitJob(job, settle, "the ignored pod's finalizer removed", func(*batchv1.Job, []*corev1.Pod) bool {
			return f.mirror.record(first.UID).finalizerGoneRV != 0
		})
		f.waitCounters(job, counters{Active: 1}, settle)
		f.wantConditions(job)

		f.runPod(second, true)
		f.succeedPod(second)
		f.waitFinished(job, batchv1.JobComplete, settle)
		f.wantCounters(job, counters{Succeeded: 1})
		f.wantConditions(job, condSuccessCriteriaMet+batchv1.JobReasonCompletionsReached, condComplete+batchv1.JobReasonCompletionsReached)
	})

	t.Run("Indexed with backoffLimitPerIndex", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, controller.Config{})
		job := f.createJob(wrappers.MakeJob("ignore-ix", f.ns).Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(1).PodFailurePolicy(
			wrappers.OnPodCondition(ignore, conditions.DisruptionTarget),
		))
		pods := f.waitActive(job, 2, settle)
		for _, p := range pods {
			f.wantAnnotation(p, batchv1.JobIndexFailureCountAnnotation, "0")
			f.wantAnnotation(p, batchv1.JobIndexIgnoredFailureCountAnnotation, "")
			f.runPod(p, true)
		}
		// Index 0 is disrupted: ignored, replaced with the ignored count 1.
		f.failPod(pods[0], 137, disruption(conditions.ReasonDeletionByTaintManager))
		second := f.waitNewActive(job, 0, f.replacementWait(1), pods[0])
		f.wantAnnotation(second, batchv1.JobIndexFailureCountAnnotation, "0")
		f.wantAnnotation(second, batchv1.JobIndexIgnoredFailureCountAnnotation, "1")
		f.waitCounters(job, counters{Active: 2, Ready: 1, FailedIndexes: strp("")}, settle)

		// The replacement fails for real (exit 1, no rule): counted, within the limit of
		// one per index, replaced with failure count 1 and the ignored count carried over.
		f.runPod(second, true)
		f.failPod(second, 1)
		third := f.waitNewActive(job, 0, f.replacementWait(2), pods[0], second)
		f.wantAnnotation(third, batchv1.JobIndexFailureCountAnnotation, "1")
		f.wantAnnotation(third, batchv1.JobIndexIgnoredFailureCountAnnotation, "1")
		f.waitCounters(job, counters{Active: 2, Ready: 1, Failed: 1, FailedIndexes: strp("")}, settle)

		f.succeedPod(third)
		f.succeedPod(pods[1])
		f.waitFinished(job, batchv1.JobComplete, settle)
		f.wantCounters(job, counters{Succeeded: 2, Failed: 1, CompletedIndexes: "0,1", FailedIndexes: strp("")})
		f.wantConditions(job, condSuccessCriteriaMet+batchv1.JobReasonCompletionsReached, condComplete+batchv1.JobReasonCompletionsReached)
		f.wantPodsPerIndex(job, map[int]int{0: 3, 1: 1})
	})
}

// TestBackoffLimitExceeded (S3, S4): a failure matched by a Count rule and one matched by
// no rule both count; one more than backoffLimit fails the Job with BackoffLimitExceeded.
func TestBackoffLimitExceeded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("backoff", f.ns).BackoffLimit(1).PodFailurePolicy(
		wrappers.OnExitCodes(failJob, opIn, 42),
		wrappers.OnExitCodes(count, opIn, 1),
		wrappers.OnPodCondition(ignore, conditions.DisruptionTarget),
	))
	first := f.waitActive(job, 1, settle)[0]
	f.runPod(first, false)
	f.failPod(first, 1) // Count rule at index 1
	second := f.waitNewActive(job, -1, f.replacementWait(1), first)
	f.waitCounters(job, counters{Active: 1, Failed: 1}, settle)
	f.wantConditions(job)

	f.runPod(second, true)
	f.failPod(second, 5) // no rule matches: counts too
	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonBackoffLimitExceeded, condFailed+batchv1.JobReasonBackoffLimitExceeded)
	f.wantConditionMessage(job, batchv1.JobFailed, conditions.JobMessageBackoffLimitExceeded)
	f.wantCounters(job, counters{Failed: 2})
	f.waitEvent(job, corev1.EventTypeWarning, batchv1.JobReasonBackoffLimitExceeded, conditions.JobMessageBackoffLimitExceeded)
	if n := len(f.mirror.records(job)); n != 2 {
		t.Errorf("Job had %d pods, want 2: no replacement after the limit\n%s", n, f.describe(job))
	}
}

// TestFailIndexOnExitCode (S3, S5): an exit code matched by a FailIndex rule fails that
// index at once, with no replacement, while a failure matched by no rule is retried; the
// Job fails with FailedIndexes once every index is finished.
func TestFailIndexOnExitCode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("failindex", f.ns).Indexed().Completions(3).Parallelism(3).BackoffLimitPerIndex(2).PodFailurePolicy(
		wrappers.OnExitCodes(failIndex, opIn, 42),
		wrappers.OnPodCondition(ignore, conditions.DisruptionTarget),
	))
	pods := f.waitActive(job, 3, settle)
	for _, p := range pods {
		f.runPod(p, true)
	}
	f.failPod(pods[1], 42)
	f.waitCounters(job, counters{Active: 2, Ready: 2, Failed: 1, FailedIndexes: strp("1")}, settle)
	f.wantConditions(job)

	// Index 0 fails with an exit code no rule matches: retried.
	f.failPod(pods[0], 3)
	again := f.waitNewActive(job, 0, f.replacementWait(1), pods[0])
	f.wantAnnotation(again, batchv1.JobIndexFailureCountAnnotation, "1")
	f.waitCounters(job, counters{Active: 2, Ready: 1, Failed: 2, FailedIndexes: strp("1")}, settle)

	f.succeedPod(again)
	f.succeedPod(pods[2])
	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonFailedIndexes, condFailed+batchv1.JobReasonFailedIndexes)
	f.wantConditionMessage(job, batchv1.JobFailed, conditions.JobMessageFailedIndexes)
	f.wantCounters(job, counters{Succeeded: 2, Failed: 2, CompletedIndexes: "0,2", FailedIndexes: strp("1")})
	f.wantPodsPerIndex(job, map[int]int{0: 2, 1: 1, 2: 1})
}

// jobEvents are "type message" of the Events on the Job with the reason, each counted once.
func (f *fixture) jobEvents(job *batchv1.Job, reason string) []string {
	f.t.Helper()
	list, err := f.client.CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.UID == job.UID && e.Reason == reason {
			out = append(out, e.Type+" "+e.Message)
		}
	}
	return out
}

// TestDeletedPodKeepsLastExit (issue 13): with restartPolicy OnFailure a crash-looping pod
// fails the Job with BackoffLimitExceeded and is deleted by the shim; its SuccessfulDelete
// Event keeps its last exit for people, its JobRecord entry for coronerctl explain.
func TestDeletedPodKeepsLastExit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := f.createJob(wrappers.MakeJob("onfailure", f.ns).BackoffLimit(1).RestartPolicy(corev1.RestartPolicyOnFailure))
	pod := f.waitActive(job, 1, settle)[0]
	f.runPod(pod, true)
	finished := metav1.NewTime(time.Now().Truncate(time.Second))
	f.writeStatus(pod, "crash-loop", func(p *corev1.Pod) {
		cs := &p.Status.ContainerStatuses[0]
		cs.RestartCount, cs.Ready = 2, false
		cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
		cs.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error", FinishedAt: finished}}
	})
	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantConditions(job, condFailureTarget+batchv1.JobReasonBackoffLimitExceeded, condFailed+batchv1.JobReasonBackoffLimitExceeded)
	f.waitEvent(job, corev1.EventTypeNormal, conditions.EventReasonSuccessfulDelete, fmt.Sprintf(
		"Deleted pod: %s (job failed: BackoffLimitExceeded); phase Running; container main waiting (CrashLoopBackOff), last exited 3 (Error) at %s, 2 restarts",
		pod.Name, finished.UTC().Format(time.RFC3339)))

	r, err := explain.JobReport(context.Background(), explain.Client{Interface: f.client, Dynamic: dynamic.NewForConfigOrDie(f.env.Config)}, f.ns, job.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pods) != 1 || r.Pods[0].Name != pod.Name || r.Pods[0].State != explain.StateDeleted ||
		r.Pods[0].Cause != "2 restarts, last: container main exited 3; deleted by coroner-shim (job failed: BackoffLimitExceeded)" {
		t.Errorf("explain's pods = %+v, want %s deleted, with its last exit and why", r.Pods, pod.Name)
	}
	for _, n := range r.Notes {
		if strings.Contains(n, "record") || strings.Contains(n, "status.failed") {
			t.Errorf("explain's note %q: the one counted failure is recorded", n)
		}
	}
}
