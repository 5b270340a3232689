package jobsync

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/observe"
	"github.com/coroner-dev/coroner/test/wrappers"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// job returns a started Job with defaults the API server would have applied.
func job(w *wrappers.JobWrapper) *batchv1.Job {
	j := w.Obj()
	j.UID = "job-uid"
	if j.Spec.Parallelism == nil {
		j.Spec.Parallelism = ptr.To[int32](1)
	}
	if j.Spec.BackoffLimit == nil {
		j.Spec.BackoffLimit = ptr.To[int32](6)
		if j.Spec.BackoffLimitPerIndex != nil {
			j.Spec.BackoffLimit = ptr.To[int32](math.MaxInt32)
		}
	}
	if j.Status.StartTime == nil {
		j.Status.StartTime = &metav1.Time{Time: now.Add(-time.Minute)}
	}
	return j
}

// tracked adds the tracking finalizer and a UID to a pod builder's pod.
func tracked(w *wrappers.PodWrapper) *corev1.Pod {
	p := w.Obj()
	p.UID = types.UID("uid-" + p.Name)
	p.Finalizers = append(p.Finalizers, batchv1.JobTrackingFinalizer)
	p.CreationTimestamp = metav1.Time{Time: now.Add(-time.Minute)}
	return p
}

func running(name string) *wrappers.PodWrapper {
	return wrappers.MakePod(name, "ns").Phase(corev1.PodRunning).RunningContainer("main")
}

func failed(name string, code int32) *wrappers.PodWrapper {
	return wrappers.MakePod(name, "ns").Phase(corev1.PodFailed).ExitedContainer("main", code).FinishedAt(now.Add(-30 * time.Second))
}

func succeeded(name string) *wrappers.PodWrapper {
	return wrappers.MakePod(name, "ns").Phase(corev1.PodSucceeded).ExitedContainer("main", 0).FinishedAt(now.Add(-30 * time.Second))
}

func sync(j *batchv1.Job, pods ...*corev1.Pod) Plan {
	return Sync(Input{Job: j, Pods: pods, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true, FinalizersBeingRemoved: sets.New[types.UID]()})
}

func names(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func conditionSummary(cs []batchv1.JobCondition) []string {
	var out []string
	for _, c := range cs {
		out = append(out, string(c.Type)+"="+string(c.Status)+"/"+c.Reason)
	}
	return out
}

func TestNewJobCreatesPods(t *testing.T) {
	cases := []struct {
		name          string
		job           *batchv1.Job
		wantCreate    int
		wantIndexes   []string
		wantGenerates []string
	}{
		{name: "non-indexed parallelism 3", job: job(wrappers.MakeJob("j", "ns").Completions(5).Parallelism(3)), wantCreate: 3, wantGenerates: []string{"j-", "j-", "j-"}},
		{name: "non-indexed without completions", job: job(wrappers.MakeJob("j", "ns").Parallelism(2)), wantCreate: 2, wantGenerates: []string{"j-", "j-"}},
		{name: "indexed creates the lowest indexes", job: job(wrappers.MakeJob("j", "ns").Indexed().Completions(4).Parallelism(2)), wantCreate: 2, wantIndexes: []string{"0", "1"}, wantGenerates: []string{"j-0-", "j-1-"}},
		{name: "parallelism above completions", job: job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(5)), wantCreate: 2, wantGenerates: []string{"j-", "j-"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := sync(tc.job)
			if len(plan.Create) != tc.wantCreate {
				t.Fatalf("created %d pods, want %d", len(plan.Create), tc.wantCreate)
			}
			var gen, idx []string
			for _, c := range plan.Create {
				p := c.Pod
				gen = append(gen, p.GenerateName)
				if v, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]; ok {
					idx = append(idx, v)
					if p.Labels[batchv1.JobCompletionIndexAnnotation] != v || p.Spec.Hostname != "j-"+v {
						t.Errorf("index %s: label %q hostname %q", v, p.Labels[batchv1.JobCompletionIndexAnnotation], p.Spec.Hostname)
					}
					if p.Spec.Containers[0].Env[0].Name != "JOB_COMPLETION_INDEX" {
						t.Errorf("index %s: no JOB_COMPLETION_INDEX variable", v)
					}
				}
				if !slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer) {
					t.Errorf("pod without the tracking finalizer")
				}
				// The shim's pod cache selects on it (informers.JobPodSelector).
				if p.Labels[conditions.ManagedPodLabel] != "true" {
					t.Errorf("labels %v: no %s=true", p.Labels, conditions.ManagedPodLabel)
				}
				if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != "job-uid" || ref.Kind != "Job" {
					t.Errorf("controller reference = %+v", ref)
				}
				if c.Reason != observe.CreateNew {
					t.Errorf("reason = %s, want new", c.Reason)
				}
			}
			if diff := cmp.Diff(tc.wantGenerates, gen); diff != "" {
				t.Errorf("generateName (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantIndexes, idx); diff != "" {
				t.Errorf("indexes (-want +got):\n%s", diff)
			}
			if !plan.WriteStatus || plan.Status.Active != int32(tc.wantCreate) {
				t.Errorf("status write %v, active %d; want a write with active=%d", plan.WriteStatus, plan.Status.Active, tc.wantCreate)
			}
		})
	}
}

func TestExpectationsNotSatisfiedCreatesNothing(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(3).Parallelism(3))
	plan := Sync(Input{Job: j, Now: now, Backoff: backoff.Default})
	if len(plan.Create) != 0 || len(plan.Delete) != 0 {
		t.Errorf("created %d, deleted %d while the informer may lag; want nothing", len(plan.Create), len(plan.Delete))
	}
}

func TestFailJobRule(t *testing.T) {
	w := wrappers.MakeJob("j", "ns").Completions(3).Parallelism(3).PodFailurePolicy(
		wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42))
	j := job(w)
	bad := tracked(failed("j-bad", 42))
	other := tracked(running("j-other"))

	// Sync 1: FailureTarget, the other pod deleted (finalizer kept), both recorded as failed.
	plan := sync(j, bad, other)
	wantConds := []string{"FailureTarget=True/PodFailurePolicy"}
	if diff := cmp.Diff(wantConds, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Fatalf("conditions (-want +got):\n%s", diff)
	}
	if msg := plan.Status.Conditions[0].Message; msg != "Container main for pod ns/j-bad failed with exit code 42 matching FailJob rule at index 0" {
		t.Errorf("message = %q", msg)
	}
	if len(plan.Delete) != 1 || plan.Delete[0].Pod.Name != "j-other" || plan.Delete[0].RemoveFinalizerFirst {
		t.Errorf("delete = %+v, want j-other keeping its finalizer", plan.Delete)
	}
	if got := names(plan.RemoveFinalizer); !cmp.Equal(got, []string{"j-bad", "j-other"}) {
		t.Errorf("finalizers removed from %v", got)
	}
	if got := plan.Status.UncountedTerminatedPods.Failed; len(got) != 2 {
		t.Errorf("uncounted failed = %v, want both pods", got)
	}
	if plan.Status.Terminating == nil || *plan.Status.Terminating != 1 || plan.Status.Active != 0 {
		t.Errorf("terminating %v active %d, want 1 and 0", plan.Status.Terminating, plan.Status.Active)
	}
	// One Event for the decision, in the built-in controller's words (the condition's).
	if diff := cmp.Diff([]Event{{corev1.EventTypeWarning, "PodFailurePolicy", "Container main for pod ns/j-bad failed with exit code 42 matching FailJob rule at index 0"}}, plan.Events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}

	// Sync 2: the finalizers are gone and the pods with them: counted, Job Failed.
	j.Status = plan.Status
	plan = sync(j)
	wantConds = []string{"FailureTarget=True/PodFailurePolicy", "Failed=True/PodFailurePolicy"}
	if diff := cmp.Diff(wantConds, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Fatalf("conditions (-want +got):\n%s", diff)
	}
	if plan.Status.Failed != 2 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 {
		t.Errorf("failed %d uncounted %v, want 2 and none", plan.Status.Failed, plan.Status.UncountedTerminatedPods.Failed)
	}
	if plan.Observations.JobFinished == nil || plan.Observations.JobFinished.Succeeded {
		t.Errorf("JobFinished = %+v", plan.Observations.JobFinished)
	}
	// The Failed condition repeats the decision announced in sync 1: no second Event.
	if len(plan.Events) != 0 {
		t.Errorf("events = %+v, want none: the FailJob decision had its Event", plan.Events)
	}
}

// TestFailJobEventExplains: the one Event of a FailJob decision has the built-in
// controller's words, then what coroner knows beyond them.
func TestFailJobEventExplains(t *testing.T) {
	cases := []struct {
		name string
		rule *wrappers.RuleWrapper
		pod  *corev1.Pod
		want string
	}{
		{
			name: "exit code, nothing to add",
			rule: wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42),
			pod:  failed("j-a", 42).Obj(),
			want: "Container main for pod ns/j-a failed with exit code 42 matching FailJob rule at index 0",
		},
		{
			name: "exit code of an OOM kill over the limit",
			rule: wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 137),
			pod: func() *corev1.Pod {
				p := failed("j-a", 137).Condition(conditions.OOMKilled, corev1.ConditionTrue).Obj()
				p.Status.ContainerStatuses[0].State.Terminated.Reason = "OOMKilled"
				p.Status.Conditions[len(p.Status.Conditions)-1].Reason = conditions.ReasonMemoryLimitExceeded
				return p
			}(),
			want: "Container main for pod ns/j-a failed with exit code 137 matching FailJob rule at index 0: OOM-killed over its own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded); container main exited 137 (OOMKilled)",
		},
		{
			name: "condition with its reason and the exit",
			rule: wrappers.OnPodCondition(batchv1.PodFailurePolicyActionFailJob, conditions.OOMKilled),
			pod: func() *corev1.Pod {
				p := failed("j-a", 137).Condition(conditions.OOMKilled, corev1.ConditionTrue).Obj()
				p.Status.Conditions[len(p.Status.Conditions)-1].Reason = conditions.ReasonMemoryLimitExceeded
				return p
			}(),
			want: "Pod ns/j-a has condition coroner.dev/OOMKilled matching FailJob rule at index 0: OOM-killed over its own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded); container main exited 137",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := job(wrappers.MakeJob("j", "ns").Completions(1).PodFailurePolicy(tc.rule))
			p := tc.pod
			p.Finalizers = []string{batchv1.JobTrackingFinalizer}
			plan := sync(j, p)
			var got []string
			for _, e := range plan.Events {
				if e.Reason == conditions.EventReasonPodFailurePolicy {
					got = append(got, e.Message)
				}
			}
			if diff := cmp.Diff([]string{tc.want}, got); diff != "" {
				t.Errorf("PodFailurePolicy events (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTerminalConditionWaitsForTerminatingPods(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1).BackoffLimit(0))
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}}
	term := running("j-term").Obj()
	term.DeletionTimestamp = &metav1.Time{Time: now}
	plan := sync(j, term)
	if c := findCondition(plan.Status.Conditions, batchv1.JobFailed); c != nil {
		t.Fatalf("Failed added while a pod is terminating")
	}
	if ptr.Deref(plan.Status.Terminating, -1) != 1 {
		t.Errorf("terminating = %v, want 1", plan.Status.Terminating)
	}
	plan = sync(j)
	if c := findCondition(plan.Status.Conditions, batchv1.JobFailed); c == nil || c.Reason != "BackoffLimitExceeded" {
		t.Errorf("conditions %v, want Failed/BackoffLimitExceeded once no pod terminates", conditionSummary(plan.Status.Conditions))
	}
}

func TestIgnoreRuleDoesNotCount(t *testing.T) {
	w := wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(1).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget))
	j := job(w)
	disrupted := tracked(wrappers.MakePod("j-0-a", "ns").Index(0).Phase(corev1.PodFailed).ExitedContainer("main", 137).
		FinishedAt(now.Add(-time.Hour)).Condition(corev1.DisruptionTarget, corev1.ConditionTrue).
		Annotation(batchv1.JobIndexFailureCountAnnotation, "0"))
	disrupted.Status.Conditions[len(disrupted.Status.Conditions)-1].Reason = "NodeOOMKill"
	other := tracked(running("j-1-a").Index(1))

	plan := sync(j, disrupted, other)
	if len(plan.Create) != 1 {
		t.Fatalf("created %d pods, want the replacement of index 0", len(plan.Create))
	}
	events := plan.Events
	repl := plan.Create[0].Pod
	if repl.Annotations[batchv1.JobIndexFailureCountAnnotation] != "0" || repl.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation] != "1" {
		t.Errorf("replacement annotations = %v, want failure count 0, ignored 1", repl.Annotations)
	}
	if len(plan.RemoveFinalizer) != 0 {
		t.Errorf("finalizer removed from %v before the replacement exists", names(plan.RemoveFinalizer))
	}
	// Next sync: the replacement is there; the ignored pod's finalizer goes, failed stays 0.
	j.Status = plan.Status
	replacement := tracked(running("j-0-b").Index(0))
	plan = sync(j, disrupted, other, replacement)
	if got := names(plan.RemoveFinalizer); !cmp.Equal(got, []string{"j-0-a"}) {
		t.Errorf("finalizers removed from %v, want j-0-a", got)
	}
	if plan.Status.Failed != 0 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 {
		t.Errorf("failed %d uncounted %v: an ignored failure was counted", plan.Status.Failed, plan.Status.UncountedTerminatedPods.Failed)
	}
	if plan.Observations.PodFailures["Ignore"] != 1 {
		t.Errorf("observations %+v, want one Ignore", plan.Observations.PodFailures)
	}
	// The Event names the condition's reason: which disruption it was.
	events = append(events, plan.Events...)
	want := "pod ns/j-0-a: killed by the node's OOM killer, not over its own limit (DisruptionTarget NodeOOMKill); container main exited 137, matched rule 0 (Ignore): not counted, the pod will be replaced"
	if !slices.ContainsFunc(events, func(e Event) bool { return e.Message == want }) {
		t.Errorf("events %+v, want %q", events, want)
	}
}

func TestBackoffLimitExceeded(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1).BackoffLimit(1))
	j.Status.Failed = 1
	plan := sync(j, tracked(failed("j-b", 1)))
	if diff := cmp.Diff([]string{"FailureTarget=True/BackoffLimitExceeded"}, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	if len(plan.Create) != 0 {
		t.Errorf("created %d pods for a failing Job", len(plan.Create))
	}
}

func TestGlobalBackoffDelaysReplacement(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1))
	p := tracked(failed("j-a", 1))
	p.Status.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.Time{Time: now.Add(-4 * time.Second)}
	plan := sync(j, p)
	if len(plan.Create) != 0 {
		t.Fatalf("replaced at once; want a 10s backoff")
	}
	if plan.RequeueAfter < 5*time.Second || plan.RequeueAfter > 6*time.Second {
		t.Errorf("requeue after %v, want about 6s (10s from the finish time)", plan.RequeueAfter)
	}
	if plan.Retries.Failures != 1 {
		t.Errorf("record = %+v, want one failure", plan.Retries)
	}
	// Once the delay has passed the replacement is created.
	j.Status = plan.Status
	later := Sync(Input{Job: j, Now: now.Add(7 * time.Second), Backoff: backoff.Default, Retries: plan.Retries, ExpectationsSatisfied: true})
	if len(later.Create) != 1 || later.Create[0].Reason != observe.CreateRecreateTerminatingOrFailed {
		t.Errorf("after the delay: create %+v, want one recreate_terminating_or_failed", later.Create)
	}
}

func TestPodReplacementPolicy(t *testing.T) {
	terminating := func() *corev1.Pod {
		p := tracked(running("j-a"))
		p.DeletionTimestamp = &metav1.Time{Time: now.Add(-time.Second)}
		return p
	}
	t.Run("Failed waits for the terminating pod", func(t *testing.T) {
		j := job(wrappers.MakeJob("j", "ns").Completions(1).PodReplacementPolicy(batchv1.Failed))
		plan := sync(j, terminating())
		if len(plan.Create) != 0 || ptr.Deref(plan.Status.Terminating, 0) != 1 || plan.Status.Failed != 0 {
			t.Errorf("create %d terminating %v failed %d; want no replacement yet, 1 terminating", len(plan.Create), plan.Status.Terminating, plan.Status.Failed)
		}
	})
	t.Run("TerminatingOrFailed counts it as failed", func(t *testing.T) {
		j := job(wrappers.MakeJob("j", "ns").Completions(1).PodReplacementPolicy(batchv1.TerminatingOrFailed))
		plan := sync(j, terminating())
		if got := plan.Status.UncountedTerminatedPods.Failed; len(got) != 1 {
			t.Errorf("uncounted failed = %v, want the terminating pod", got)
		}
		if plan.Retries.Failures != 1 {
			t.Errorf("record %+v: the terminating pod starts the backoff", plan.Retries)
		}
	})
}

func TestSuspendAndResume(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(2).Parallelism(2).Suspend(true))
	plan := sync(j, tracked(running("j-a")), tracked(running("j-b")))
	if len(plan.Delete) != 2 || !plan.Delete[0].RemoveFinalizerFirst {
		t.Errorf("delete %+v, want both pods without counting them", plan.Delete)
	}
	if diff := cmp.Diff([]string{"Suspended=True/JobSuspended"}, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
	if plan.Status.StartTime != nil {
		t.Errorf("startTime %v kept on suspend", plan.Status.StartTime)
	}
	j.Status = plan.Status
	j.Spec.Suspend = ptr.To(false)
	plan = sync(j)
	if len(plan.Create) != 2 || plan.Status.StartTime == nil || !plan.Status.StartTime.Time.Equal(now) {
		t.Errorf("create %d startTime %v; want 2 pods and startTime reset to now", len(plan.Create), plan.Status.StartTime)
	}
	if diff := cmp.Diff([]string{"Suspended=False/JobResumed"}, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
}

func TestActiveDeadline(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1).ActiveDeadlineSeconds(90))
	plan := sync(j, tracked(running("j-a")))
	if plan.RequeueAfter != 30*time.Second {
		t.Errorf("requeue after %v, want 30s (deadline 90s, started 60s ago)", plan.RequeueAfter)
	}
	j.Spec.ActiveDeadlineSeconds = ptr.To[int64](60)
	plan = sync(j, tracked(running("j-a")))
	if diff := cmp.Diff([]string{"FailureTarget=True/DeadlineExceeded"}, conditionSummary(plan.Status.Conditions)); diff != "" {
		t.Errorf("conditions (-want +got):\n%s", diff)
	}
}

func TestSuccess(t *testing.T) {
	t.Run("completions reached", func(t *testing.T) {
		j := job(wrappers.MakeJob("j", "ns").Completions(2))
		j.Status.Succeeded = 1
		plan := sync(j, tracked(succeeded("j-b")))
		if diff := cmp.Diff([]string{"SuccessCriteriaMet=True/CompletionsReached"}, conditionSummary(plan.Status.Conditions)); diff != "" {
			t.Errorf("conditions (-want +got):\n%s", diff)
		}
		j.Status = plan.Status
		plan = sync(j)
		if diff := cmp.Diff([]string{"SuccessCriteriaMet=True/CompletionsReached", "Complete=True/CompletionsReached"}, conditionSummary(plan.Status.Conditions)); diff != "" {
			t.Errorf("conditions (-want +got):\n%s", diff)
		}
		if plan.Status.Succeeded != 2 || plan.Status.CompletionTime == nil {
			t.Errorf("succeeded %d completionTime %v", plan.Status.Succeeded, plan.Status.CompletionTime)
		}
	})
	t.Run("success policy deletes the rest", func(t *testing.T) {
		j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(3).Parallelism(3).SuccessPolicy(wrappers.SucceededIndexes("0")))
		plan := sync(j, tracked(succeeded("j-0-a").Index(0)), tracked(running("j-1-a").Index(1)))
		if diff := cmp.Diff([]string{"SuccessCriteriaMet=True/SuccessPolicy"}, conditionSummary(plan.Status.Conditions)); diff != "" {
			t.Errorf("conditions (-want +got):\n%s", diff)
		}
		if len(plan.Delete) != 1 || plan.Delete[0].Pod.Name != "j-1-a" {
			t.Errorf("delete %+v, want j-1-a", plan.Delete)
		}
		if len(plan.Status.UncountedTerminatedPods.Failed) != 0 {
			t.Errorf("pods deleted after success counted as failed: %v", plan.Status.UncountedTerminatedPods.Failed)
		}
	})
}

func TestFinishedJobOnlyLosesFinalizers(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1))
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	plan := sync(j, tracked(succeeded("j-a")), tracked(running("j-b")))
	if plan.WriteStatus || len(plan.Create)+len(plan.Delete) != 0 {
		t.Errorf("a finished Job was written to or managed: %+v", plan)
	}
	if got := names(plan.RemoveFinalizer); !cmp.Equal(got, []string{"j-a", "j-b"}) {
		t.Errorf("finalizers removed from %v", got)
	}
}

func TestNoWriteWhenNothingChanges(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1))
	plan := sync(j)
	j.Status = plan.Status
	plan = sync(j, tracked(running("j-a")))
	if plan.WriteStatus {
		t.Errorf("status unchanged but WriteStatus set")
	}
}

func TestDuplicateIndexPodsDeleted(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2))
	a := tracked(running("j-0-a").Index(0).Condition(corev1.PodReady, corev1.ConditionTrue))
	b := tracked(wrappers.MakePod("j-0-b", "ns").Index(0).Phase(corev1.PodPending))
	plan := sync(j, a, b, tracked(running("j-1-a").Index(1)))
	if len(plan.Delete) != 1 || plan.Delete[0].Pod.Name != "j-0-b" {
		t.Errorf("delete %+v, want the pending duplicate j-0-b", plan.Delete)
	}
}

func TestAdjustAfterFailedDeletes(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1))
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, Reason: "CompletionsReached"}}
	j.Status.Succeeded = 1
	stuck := tracked(running("j-b"))
	plan := sync(j, stuck)
	old := j.Status
	plan.Adjust(&old, 0, []*corev1.Pod{stuck})
	if findCondition(plan.Status.Conditions, batchv1.JobComplete) != nil || plan.Status.Active != 1 {
		t.Errorf("after a failed delete: conditions %v active %d; want no Complete and the pod active", conditionSummary(plan.Status.Conditions), plan.Status.Active)
	}
}

// TestOOMKillWaitsForTheAgentsVerdict: a pod OOM-killed without coroner's stamp, under a
// policy that reads pod conditions, is neither counted nor replaced while the agent's
// verdict may still come (VerdictWait after the container finished); the sync asks to be
// requeued then. With the stamp (a node OOM: DisruptionTarget), the Ignore rule applies;
// past the wait without it, the failure counts.
func TestOOMKillWaitsForTheAgentsVerdict(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Completions(1).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)))
	oomKilled := func(ago time.Duration) *wrappers.PodWrapper {
		w := failed("p", 137).FinishedAt(now.Add(-ago))
		w.Obj().Status.ContainerStatuses[0].State.Terminated.Reason = "OOMKilled"
		return w
	}
	in := func(p *corev1.Pod) Input {
		return Input{Job: j, Pods: []*corev1.Pod{p}, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true,
			FinalizersBeingRemoved: sets.New[types.UID](), VerdictWait: 30 * time.Second}
	}

	waiting := tracked(oomKilled(10 * time.Second))
	plan := Sync(in(waiting))
	if len(plan.Create) != 0 || len(plan.RemoveFinalizer) != 0 || plan.Status.Failed != 0 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 {
		t.Errorf("awaiting the verdict: create %d, remove finalizers %d, failed %d, uncounted %v; want nothing done",
			len(plan.Create), len(plan.RemoveFinalizer), plan.Status.Failed, plan.Status.UncountedTerminatedPods.Failed)
	}
	if plan.RequeueAfter < 19*time.Second || plan.RequeueAfter > 21*time.Second {
		t.Errorf("RequeueAfter %v, want about 20s (the rest of the wait)", plan.RequeueAfter)
	}
	if waiting.Status.Phase != corev1.PodFailed {
		t.Errorf("the informer's pod was modified: phase %s", waiting.Status.Phase)
	}

	stamped := tracked(oomKilled(10*time.Second).Condition(corev1.DisruptionTarget, corev1.ConditionTrue))
	plan = Sync(in(stamped))
	if len(plan.RemoveFinalizer) != 1 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 {
		t.Errorf("stamped node OOM: remove finalizers %d, uncounted failed %v; want the finalizer off and the failure ignored",
			len(plan.RemoveFinalizer), plan.Status.UncountedTerminatedPods.Failed)
	}

	late := tracked(oomKilled(31 * time.Second))
	plan = Sync(in(late))
	if len(plan.RemoveFinalizer) != 1 || len(plan.Status.UncountedTerminatedPods.Failed) != 1 {
		t.Errorf("past the wait: remove finalizers %d, uncounted failed %v; want the failure counted",
			len(plan.RemoveFinalizer), plan.Status.UncountedTerminatedPods.Failed)
	}
}
