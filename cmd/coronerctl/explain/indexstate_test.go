package explain

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// The conditions the Job controller (or coroner-shim, in its words) writes, with upstream's
// reasons and messages.
var (
	failJobMessage = "Container main for pod team/js-0-x7k2p failed with exit code 42 matching FailJob rule at index 0"
	backoffMessage = "Job has reached the specified backoff limit"
	maxFailedMsg   = "Job has exceeded the specified maximal number of failed indexes"
	deadlineMsg    = "Job was active longer than specified deadline"
)

func jobCondition(t batchv1.JobConditionType, reason, message string) batchv1.JobCondition {
	at := metav1.NewTime(t0.Add(10 * time.Minute))
	return batchv1.JobCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastProbeTime: at, LastTransitionTime: at}
}

// failedWith is the pair of conditions a failed Job holds since Kubernetes 1.31:
// FailureTarget when the decision is taken, Failed once its pods are gone.
func failedWith(reason, message string) []batchv1.JobCondition {
	return []batchv1.JobCondition{
		jobCondition(batchv1.JobFailureTarget, reason, message),
		jobCondition(batchv1.JobFailed, reason, message),
	}
}

// finishedJob is a Job as the API server holds it: the defaults filled in, the UID and
// selector set, started at t0.
func finishedJob(name string, w *wrappers.JobWrapper, st batchv1.JobStatus) *batchv1.Job {
	job := w.Obj()
	job.Name, job.Namespace, job.UID = name, "team", types.UID(name+"-uid")
	job.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.ControllerUidLabel: string(job.UID)}}
	if job.Spec.Completions == nil {
		job.Spec.Completions, job.Spec.Parallelism = ptr.To[int32](1), ptr.To[int32](1)
	}
	if job.Spec.BackoffLimit == nil {
		job.Spec.BackoffLimit = ptr.To[int32](6)
		if job.Spec.BackoffLimitPerIndex != nil {
			job.Spec.BackoffLimit = ptr.To[int32](2147483647)
		}
	}
	if job.Spec.CompletionMode == nil {
		job.Spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	}
	job.Spec.Suspend = ptr.To(ptrValue(job.Spec.Suspend))
	job.Spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
	if job.Spec.PodFailurePolicy != nil {
		job.Spec.PodReplacementPolicy = ptr.To(batchv1.Failed)
	}
	st.Ready, st.Terminating = ptr.To(ptrValue(st.Ready)), ptr.To(ptrValue(st.Terminating))
	st.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{}
	if st.StartTime == nil && !ptrValue(job.Spec.Suspend) {
		st.StartTime = &metav1.Time{Time: t0}
	}
	job.Status = st
	return job
}

// TestIndexStates: every index of an Indexed Job gets a state that is true of the Job as
// it is; "pending" only while the Job runs.
func TestIndexStates(t *testing.T) {
	failJobRule := wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42).InContainer("main")
	cases := []struct {
		name string
		job  *batchv1.Job
		// pods are built for the Job: index, phase, exit code of main (Failed and
		// Succeeded), deleting (a pod being deleted, still Running).
		pods        []testPod
		wantStatus  string
		wantIndexes []string
	}{
		{
			name: "complete: every index completed",
			job: finishedJob("done", wrappers.MakeJob("", "").Indexed().Completions(3).Parallelism(3), batchv1.JobStatus{
				Succeeded: 3, CompletedIndexes: "0-2", CompletionTime: &metav1.Time{Time: t0.Add(10 * time.Minute)},
				Conditions: []batchv1.JobCondition{
					jobCondition(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods"),
					jobCondition(batchv1.JobComplete, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods"),
				}}),
			pods:        []testPod{{0, corev1.PodSucceeded, 0, false}, {1, corev1.PodSucceeded, 0, false}, {2, corev1.PodSucceeded, 0, false}},
			wantStatus:  "Complete (CompletionsReached: Reached expected number of succeeded pods)",
			wantIndexes: []string{"completed", "completed", "completed"},
		},
		{
			name: "complete by a successPolicy: the other indexes were not needed",
			job: finishedJob("leader", wrappers.MakeJob("", "").Indexed().Completions(3).Parallelism(3).SuccessPolicy(wrappers.SucceededIndexes("0")), batchv1.JobStatus{
				Succeeded: 1, CompletedIndexes: "0", CompletionTime: &metav1.Time{Time: t0.Add(10 * time.Minute)},
				Conditions: []batchv1.JobCondition{
					jobCondition(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonSuccessPolicy, "Matched rules at index 0"),
					jobCondition(batchv1.JobComplete, batchv1.JobReasonSuccessPolicy, "Matched rules at index 0"),
				}}),
			pods:       []testPod{{0, corev1.PodSucceeded, 0, false}},
			wantStatus: "Complete (SuccessPolicy: Matched rules at index 0)",
			wantIndexes: []string{"completed",
				"not needed: the Job succeeded (SuccessPolicy)", "not needed: the Job succeeded (SuccessPolicy)"},
		},
		{
			// A JobSet child Job, as a new user saw it: INDEX 0 pending.
			name: "failed by a FailJob rule",
			job: finishedJob("js", wrappers.MakeJob("", "").ManagedBy(conditions.ManagedBy).Indexed().Completions(2).Parallelism(2).BackoffLimit(0).
				PodFailurePolicy(failJobRule), batchv1.JobStatus{
				Failed: 1, Succeeded: 1, CompletedIndexes: "1", Conditions: failedWith(batchv1.JobReasonPodFailurePolicy, failJobMessage)}),
			pods:        []testPod{{0, corev1.PodFailed, 42, false}, {1, corev1.PodSucceeded, 0, false}},
			wantStatus:  "Failed (PodFailurePolicy: " + failJobMessage + ")",
			wantIndexes: []string{"unfinished: the Job failed (PodFailurePolicy)", "completed"},
		},
		{
			name: "failed over backoffLimit: the indexes that never ran are unfinished too",
			job: finishedJob("flaky", wrappers.MakeJob("", "").Indexed().Completions(3).Parallelism(1).BackoffLimit(1), batchv1.JobStatus{
				Failed: 2, Conditions: failedWith(batchv1.JobReasonBackoffLimitExceeded, backoffMessage)}),
			pods:       []testPod{{0, corev1.PodFailed, 1, false}, {0, corev1.PodFailed, 1, false}},
			wantStatus: "Failed (BackoffLimitExceeded: " + backoffMessage + ")",
			wantIndexes: []string{"unfinished: the Job failed (BackoffLimitExceeded)",
				"unfinished: the Job failed (BackoffLimitExceeded)", "unfinished: the Job failed (BackoffLimitExceeded)"},
		},
		{
			name: "failed over maxFailedIndexes",
			job: finishedJob("perindex", wrappers.MakeJob("", "").ManagedBy(conditions.ManagedBy).Indexed().Completions(4).Parallelism(2).
				BackoffLimitPerIndex(0).MaxFailedIndexes(1), batchv1.JobStatus{
				Failed: 2, Succeeded: 1, CompletedIndexes: "2", FailedIndexes: ptr.To("0,1"),
				Conditions: failedWith(batchv1.JobReasonMaxFailedIndexesExceeded, maxFailedMsg)}),
			pods:        []testPod{{0, corev1.PodFailed, 1, false}, {1, corev1.PodFailed, 1, false}, {2, corev1.PodSucceeded, 0, false}},
			wantStatus:  "Failed (MaxFailedIndexesExceeded: " + maxFailedMsg + ")",
			wantIndexes: []string{"failed", "failed", "completed", "unfinished: the Job failed (MaxFailedIndexesExceeded)"},
		},
		{
			name: "failed indexes, every index finished",
			job: finishedJob("someok", wrappers.MakeJob("", "").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(0), batchv1.JobStatus{
				Failed: 1, Succeeded: 1, CompletedIndexes: "0", FailedIndexes: ptr.To("1"),
				Conditions: failedWith(batchv1.JobReasonFailedIndexes, "Job has failed indexes")}),
			pods:        []testPod{{0, corev1.PodSucceeded, 0, false}, {1, corev1.PodFailed, 1, false}},
			wantStatus:  "Failed (FailedIndexes: Job has failed indexes)",
			wantIndexes: []string{"completed", "failed"},
		},
		{
			name: "past activeDeadlineSeconds: the running index's pod was deleted",
			job: finishedJob("slow", wrappers.MakeJob("", "").Indexed().Completions(2).Parallelism(2).ActiveDeadlineSeconds(600), batchv1.JobStatus{
				Failed: 1, Succeeded: 1, CompletedIndexes: "0", Conditions: failedWith(batchv1.JobReasonDeadlineExceeded, deadlineMsg)}),
			pods:        []testPod{{0, corev1.PodSucceeded, 0, false}},
			wantStatus:  "Failed (DeadlineExceeded: " + deadlineMsg + ")",
			wantIndexes: []string{"completed", "unfinished: the Job failed (DeadlineExceeded)"},
		},
		{
			name: "failing: FailureTarget while a pod is being deleted",
			job: finishedJob("failing", wrappers.MakeJob("", "").Indexed().Completions(3).Parallelism(2).BackoffLimit(0), batchv1.JobStatus{
				Failed: 1, Terminating: ptr.To[int32](1),
				Conditions: []batchv1.JobCondition{jobCondition(batchv1.JobFailureTarget, batchv1.JobReasonBackoffLimitExceeded, backoffMessage)}}),
			pods:       []testPod{{0, corev1.PodFailed, 1, false}, {1, corev1.PodRunning, 0, true}},
			wantStatus: "FailureTarget (BackoffLimitExceeded: " + backoffMessage + ")",
			wantIndexes: []string{"unfinished: the Job failed (BackoffLimitExceeded)", "terminating",
				"unfinished: the Job failed (BackoffLimitExceeded)"},
		},
		{
			name: "suspended after index 0 completed",
			job: finishedJob("paused", wrappers.MakeJob("", "").Indexed().Completions(2).Parallelism(1).Suspend(true), batchv1.JobStatus{
				Succeeded: 1, CompletedIndexes: "0", StartTime: nil,
				Conditions: []batchv1.JobCondition{jobCondition(batchv1.JobSuspended, "JobSuspended", "Job suspended")}}),
			pods:        []testPod{{0, corev1.PodSucceeded, 0, false}},
			wantStatus:  "Suspended (JobSuspended: Job suspended)",
			wantIndexes: []string{"completed", "suspended"},
		},
		{
			name: "running: an index without a pod is pending",
			job: finishedJob("busy", wrappers.MakeJob("", "").Indexed().Completions(3).Parallelism(1), batchv1.JobStatus{
				Active: 1, Succeeded: 1, CompletedIndexes: "0"}),
			pods:        []testPod{{0, corev1.PodSucceeded, 0, false}, {1, corev1.PodRunning, 0, false}},
			wantStatus:  "running",
			wantIndexes: []string{"completed", "active", "pending"},
		},
		{
			name: "NonIndexed, failed by a FailJob rule: no index table",
			job: finishedJob("ci", wrappers.MakeJob("", "").Completions(3).Parallelism(1).BackoffLimit(2).PodFailurePolicy(failJobRule), batchv1.JobStatus{
				Failed: 1, Succeeded: 1, Conditions: failedWith(batchv1.JobReasonPodFailurePolicy, failJobMessage)}),
			pods:       []testPod{{noIndex, corev1.PodSucceeded, 0, false}, {noIndex, corev1.PodFailed, 42, false}},
			wantStatus: "Failed (PodFailurePolicy: " + failJobMessage + ")",
		},
		{
			name: "NonIndexed, complete: no index table",
			job: finishedJob("batch", wrappers.MakeJob("", "").Completions(2).Parallelism(2), batchv1.JobStatus{
				Succeeded: 2, CompletionTime: &metav1.Time{Time: t0.Add(10 * time.Minute)},
				Conditions: []batchv1.JobCondition{
					jobCondition(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods"),
					jobCondition(batchv1.JobComplete, batchv1.JobReasonCompletionsReached, "Reached expected number of succeeded pods"),
				}}),
			pods:       []testPod{{noIndex, corev1.PodSucceeded, 0, false}, {noIndex, corev1.PodSucceeded, 0, false}},
			wantStatus: "Complete (CompletionsReached: Reached expected number of succeeded pods)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var pods []*corev1.Pod
			for i, tp := range tc.pods {
				pods = append(pods, tp.build(tc.job, i))
			}
			r := Build(tc.job, pods, nil)
			if r.Job.State != tc.wantStatus {
				t.Errorf("status = %q, want %q", r.Job.State, tc.wantStatus)
			}
			var got []string
			for i, ix := range r.Indexes {
				if ix.Index != i {
					t.Fatalf("index row %d is index %d", i, ix.Index)
				}
				got = append(got, ix.State)
			}
			if diff := cmp.Diff(tc.wantIndexes, got); diff != "" {
				t.Errorf("index states (-want +got):\n%s", diff)
			}
			var out strings.Builder
			if err := r.Write(&out); err != nil {
				t.Fatal(err)
			}
			finished := slices.ContainsFunc(tc.job.Status.Conditions, func(c batchv1.JobCondition) bool {
				return c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed || c.Type == batchv1.JobFailureTarget
			})
			if finished && strings.Contains(out.String(), "pending") {
				t.Errorf("the report of a finished Job says pending:\n%s", out.String())
			}
		})
	}
}

// testPod is a pod of a TestIndexStates Job.
type testPod struct {
	index    int
	phase    corev1.PodPhase
	exit     int32
	deleting bool
}

func (tp testPod) build(job *batchv1.Job, n int) *corev1.Pod {
	name := job.Name + "-" + string(rune('a'+n))
	w := ownedPod(job, name, time.Duration(n)*time.Minute).Phase(tp.phase)
	if tp.index != noIndex {
		w.Index(tp.index)
	}
	switch tp.phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		w.ExitedContainer("main", tp.exit).FinishedAt(t0.Add(time.Duration(n+1) * time.Minute))
	default:
		w.RunningContainer("main")
	}
	p := w.Obj()
	if tp.deleting {
		p.DeletionTimestamp = &metav1.Time{Time: t0.Add(9 * time.Minute)}
	}
	return p
}
