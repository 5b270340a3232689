package explain

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/record"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestParseTargets(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		all     bool
		want    []Target
		wantErr string
	}{
		{name: "job/NAME", args: []string{"job/train"}, want: []Target{{KindJob, "train"}}},
		{name: "pod/NAME", args: []string{"pod/train-0-x"}, want: []Target{{KindPod, "train-0-x"}}},
		{name: "jobs.batch/NAME", args: []string{"jobs.batch/train"}, want: []Target{{KindJob, "train"}}},
		{name: "po/NAME and job/NAME", args: []string{"po/a", "job/b"}, want: []Target{{KindPod, "a"}, {KindJob, "b"}}},
		{name: "job NAME", args: []string{"job", "train"}, want: []Target{{KindJob, "train"}}},
		{name: "pod NAME NAME", args: []string{"pod", "a", "b"}, want: []Target{{KindPod, "a"}, {KindPod, "b"}}},
		{name: "plain NAME is a Job (back-compat)", args: []string{"train"}, want: []Target{{KindJob, "train"}}},
		{name: "jobs alone: all coroner-managed Jobs", args: []string{"jobs"}, want: []Target{{Kind: KindJob}}},
		{name: "pods alone: all stamped pods", args: []string{"pods"}, want: []Target{{Kind: KindPod}}},
		{name: "nothing with -A", all: true, want: []Target{{Kind: KindJob}}},
		{name: "nothing", wantErr: "name a Job or a pod"},
		{name: "unknown resource", args: []string{"deploy/x"}, wantErr: `explain knows jobs and pods, not "deploy"`},
		{name: "empty name", args: []string{"job/"}, wantErr: `"job/" names no job`},
		{name: "type then type/name", args: []string{"job", "pod/x"}, wantErr: "resource/name form"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTargets(tc.args, tc.all)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !IsUsage(err) {
					t.Fatalf("err = %v, want a usage error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("targets (-want +got):\n%s", diff)
			}
		})
	}
}

func waiting(w *wrappers.PodWrapper, container, reason, message string, restarts int32, last *corev1.ContainerStateTerminated) *wrappers.PodWrapper {
	w.WaitingContainer(container, reason)
	for i := range w.Status.ContainerStatuses {
		if cs := &w.Status.ContainerStatuses[i]; cs.Name == container {
			cs.State.Waiting.Message = message
			cs.RestartCount = restarts
			if last != nil {
				cs.LastTerminationState.Terminated = last
			}
		}
	}
	return w
}

// TestClassify: every pod gets a state and a cause; a pod that cannot start or
// crash-loops is not "running".
func TestClassify(t *testing.T) {
	pod := func(name string) *wrappers.PodWrapper { return wrappers.MakePod(name, "ns") }
	lastExit := &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: metav1.NewTime(t0)}
	deleting := pod("p").Phase(corev1.PodRunning).RunningContainer("main").Obj()
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	deleting.Spec.NodeName = "node-a"
	unschedulable := pod("p").Phase(corev1.PodPending).Obj()
	unschedulable.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/3 nodes are available"}}
	restarted := pod("p").Phase(corev1.PodRunning).RunningContainer("main").
		Annotation(conditions.AnnotationExitHistory, `[{"container":"main","exitCode":137,"reason":"OOMKilled","finishedAt":"2026-01-02T03:00:00Z","restartCount":0,"oom":"limit"}]`).Obj()
	restarted.Status.ContainerStatuses[0].RestartCount = 1
	succeededOOM := withCondition(pod("p").Phase(corev1.PodSucceeded).ExitedContainer("main", 0), conditions.OOMKilled, conditions.ReasonMemoryLimitExceeded, "child process").Obj()
	cases := []struct {
		name        string
		pod         *corev1.Pod
		wantState   PodState
		wantCause   string
		wantWarning string
	}{
		{name: "running", pod: pod("p").Phase(corev1.PodRunning).RunningContainer("main").Obj(), wantState: StateRunning, wantCause: "running"},
		{name: "ErrImageNeverPull is waiting, not running", pod: waiting(pod("p").Phase(corev1.PodPending), "main", "ErrImageNeverPull", `Container image "x:1" is not present with pull policy of Never`, 0, nil).Obj(),
			wantState: StateWaiting, wantCause: `container main waiting: ErrImageNeverPull: Container image "x:1" is not present with pull policy of Never`},
		{name: "CrashLoopBackOff in phase Running is restarting", pod: waiting(pod("p").Phase(corev1.PodRunning), "main", "CrashLoopBackOff", "back-off 40s", 3, lastExit).Obj(),
			wantState: StateRestarting, wantCause: "container main crash-looping (CrashLoopBackOff): last exited 1 (Error) at 2026-01-02T03:00:00Z, 3 restarts"},
		{name: "restarted in place, from the exit history", pod: restarted, wantState: StateRestarting,
			wantCause: "running, restarted in place 1 times; container main last exited 137 (OOMKilled) (OOM kill, the pod's own limit) at 2026-01-02T03:00:00Z"},
		{name: "creating", pod: waiting(pod("p").Phase(corev1.PodPending), "main", "ContainerCreating", "", 0, nil).Obj(), wantState: StatePending, wantCause: "not scheduled yet"},
		{name: "unschedulable", pod: unschedulable, wantState: StatePending, wantCause: "not scheduled: Unschedulable: 0/3 nodes are available"},
		{name: "terminating", pod: deleting, wantState: StateTerminating, wantCause: "being deleted since 2026-01-02T03:00:00Z, waiting for node node-a to confirm its containers stopped"},
		{name: "succeeded", pod: pod("p").Phase(corev1.PodSucceeded).ExitedContainer("main", 0).Obj(), wantState: StateSucceeded, wantCause: "every container exited 0"},
		{name: "succeeded with an OOM stamp is called out", pod: succeededOOM, wantState: StateSucceeded,
			wantCause:   "succeeded, but a process of the pod was OOM-killed over its memory limit (coroner.dev/OOMKilled=True (MemoryLimitExceeded): child process)",
			wantWarning: "a child process was OOM-killed over the pod's memory limit while the main process exited 0"},
		{name: "failed, exit", pod: pod("p").Phase(corev1.PodFailed).ExitedContainer("main", 42).FinishedAt(t0).Obj(), wantState: StateFailed, wantCause: "container main exited 42"},
		{name: "failed, limit OOM", pod: withCondition(pod("p").Phase(corev1.PodFailed).ExitedContainer("main", 137), conditions.OOMKilled, conditions.ReasonMemoryLimitExceeded, "").Obj(),
			wantState: StateFailed, wantCause: "OOM-killed over its own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded); container main exited 137"},
		{name: "failed, node OOM", pod: withCondition(pod("p").Phase(corev1.PodFailed).ExitedContainer("main", 137), corev1.DisruptionTarget, conditions.ReasonNodeOOMKill, "").Obj(),
			wantState: StateFailed, wantCause: "killed by the node's OOM killer, not over its own limit (DisruptionTarget NodeOOMKill); container main exited 137"},
		{name: "failed, preempted", pod: withCondition(pod("p").Phase(corev1.PodFailed).ExitedContainer("main", 0), corev1.DisruptionTarget, conditions.ReasonPreemptionByScheduler, "Preempted").Obj(),
			wantState: StateFailed, wantCause: "disrupted (DisruptionTarget PreemptionByScheduler)"},
		{name: "failed, no exit", pod: pod("p").Phase(corev1.PodFailed).Obj(), wantState: StateFailed, wantCause: "no container exited with a non-zero code, and nothing on the pod says why"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr := podReport(nil, tc.pod)
			if pr.State != tc.wantState || pr.Cause != tc.wantCause {
				t.Errorf("state, cause = %s, %q\n want %s, %q", pr.State, pr.Cause, tc.wantState, tc.wantCause)
			}
			got := strings.Join(pr.Warnings, "\n")
			if (tc.wantWarning == "") != (got == "") || !strings.Contains(got, tc.wantWarning) {
				t.Errorf("warnings = %q, want %q", got, tc.wantWarning)
			}
		})
	}
}

// onFailureJob is the case: restartPolicy OnFailure, the pod crash-looped until
// the Job failed with BackoffLimitExceeded and coroner-shim deleted it; only its record is
// left.
func onFailureJob() (*batchv1.Job, []runtime.Object) {
	job := wrappers.MakeJob("crashy", "default").ManagedBy(conditions.ManagedBy).BackoffLimit(2).RestartPolicy(corev1.RestartPolicyOnFailure).Obj()
	job.UID = "crashy-uid"
	job.Status = batchv1.JobStatus{Failed: 1, StartTime: &metav1.Time{Time: t0}, Conditions: []batchv1.JobCondition{
		{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded, Message: conditions.JobMessageBackoffLimitExceeded},
		{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded, Message: conditions.JobMessageBackoffLimitExceeded},
	}}
	// The pod as the shim saw it: recorded when it deleted it, and again when it counted
	// it as failed (the Job failed while it ran), keeping the deletion's why.
	gone := waiting(ownedPod(job, "crashy-7xk2p", 0).Phase(corev1.PodRunning), "main", "CrashLoopBackOff", "back-off", 3,
		&corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error", FinishedAt: metav1.NewTime(t0.Add(time.Minute))}).Obj()
	var r v1alpha1.Record
	r.Add(0, record.Of(gone, record.Decision{Outcome: v1alpha1.OutcomeDeleted, Why: "job failed: BackoffLimitExceeded"}, metav1.NewTime(t0.Add(2*time.Minute))))
	gone.DeletionTimestamp = &metav1.Time{Time: t0.Add(2 * time.Minute)}
	r.Add(0, record.Of(gone, record.Decision{Outcome: v1alpha1.OutcomeFailed, Consequence: "counted as failed: the Job failed (BackoffLimitExceeded) while it ran"}, metav1.NewTime(t0.Add(2*time.Minute))))
	rec := v1alpha1.New("default", "crashy", "crashy-uid")
	rec.Set(r, 3000)
	return job, []runtime.Object{job, rec}
}

func TestDeletedPodFromShimRecord(t *testing.T) {
	_, objs := onFailureJob()
	client := fakeClient(t, objs...)
	var out bytes.Buffer
	if err := Job(context.Background(), client, "default", "crashy", &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	assertLinesInOrder(t, out.String(), []string{
		"  status:      Failed (BackoffLimitExceeded: Job has reached the specified backoff limit)",
		"Failed pods (0):",
		"Pods that are gone (1, from coroner-shim's record):",
		"  crashy-7xk2p  node node-a",
		"    cause:      3 restarts, last: container main exited 3; deleted by coroner-shim (job failed: BackoffLimitExceeded)",
		"    recorded:   failed, counted (last phase Running) at 2026-01-02T03:02:00Z",
		"    rule:       no podFailurePolicy",
		"    action:     counted as failed: the Job failed (BackoffLimitExceeded) while it ran",
	})
	if strings.Contains(out.String(), "Note:") {
		t.Error("a Job whose every counted pod is recorded has a note")
	}

	// Also one pod by name, though it is gone.
	pr, err := Pod(context.Background(), client, "default", "crashy-7xk2p")
	if err != nil {
		t.Fatal(err)
	}
	if pr.State != StateDeleted || pr.Job != "crashy" || pr.Restarts != 3 || !strings.Contains(pr.Cause, "last: container main exited 3") {
		t.Errorf("pod report = %+v", pr)
	}
	if _, err := Pod(context.Background(), client, "default", "never-was"); !apierrors.IsNotFound(err) {
		t.Errorf("Pod(never-was) = %v, want NotFound", err)
	}
}

// TestIncompleteStory: explain says plainly what it cannot tell, and why: no record at
// all, or entries dropped past the bound, and counted failures it knows nothing of.
func TestIncompleteStory(t *testing.T) {
	job, objs := onFailureJob()
	t.Run("no record", func(t *testing.T) {
		r := Build(job, nil, nil)
		assertLinesInOrder(t, strings.Join(r.Notes, "\n"), []string{
			"coroner-shim has no record of this Job (JobRecord default/crashy)",
			"status.failed is 1 but 0 counted failed pods are known (existing or recorded): the other 1 were deleted, and there is no record",
		})
	})
	t.Run("an earlier Job's record is not this one's", func(t *testing.T) {
		rec := objs[1].(*v1alpha1.JobRecord).DeepCopy()
		rec.JobUID = "earlier"
		if r := Build(job, nil, rec); r.Record.Found || len(r.Pods) != 0 {
			t.Errorf("report = %+v, want no record and no pods", r)
		}
	})
	t.Run("a pod counted failed while it still terminates is known", func(t *testing.T) {
		// The Job failed while the pod ran: status.failed counts it, the record holds it,
		// and the pod still exists, being deleted (seen on the lab with a FailJob rule).
		terminating := ownedPod(job, "crashy-7xk2p", 0).Phase(corev1.PodRunning).Obj()
		terminating.DeletionTimestamp = &metav1.Time{Time: t0.Add(2 * time.Minute)}
		r := Build(job, []*corev1.Pod{terminating}, objs[1].(*v1alpha1.JobRecord))
		if len(r.Notes) != 0 {
			t.Errorf("notes = %q, want none", r.Notes)
		}
	})
	t.Run("successes that are gone", func(t *testing.T) {
		done := job.DeepCopy()
		done.Status.Succeeded = 3
		live := ownedPod(done, "crashy-ok", 0).Phase(corev1.PodSucceeded).ExitedContainer("main", 0).Obj()
		r := Build(done, []*corev1.Pod{live}, objs[1].(*v1alpha1.JobRecord))
		assertLinesInOrder(t, strings.Join(r.Notes, "\n"), []string{
			"status.succeeded is 3 but 1 succeeded pods exist: 2 are gone, and coroner-shim records failures, ignored failures and deletions, not successes",
		})
	})
	t.Run("dropped past the bound", func(t *testing.T) {
		rec := objs[1].(*v1alpha1.JobRecord).DeepCopy()
		rec.Pods = nil
		rec.MaxPods, rec.Dropped = 2, map[v1alpha1.Outcome]int32{v1alpha1.OutcomeFailed: 1, v1alpha1.OutcomeSucceeded: 4}
		r := Build(job, nil, rec)
		assertLinesInOrder(t, strings.Join(r.Notes, "\n"), []string{
			"the record dropped 5 pods past its bound of 2 (1 failed, 4 succeeded, oldest first)",
			"status.failed is 1 but 0 counted failed pods are known (existing or recorded): the other 1 were dropped from the record, or deleted without one",
		})
		if r.Record.Dropped["Failed"] != 1 {
			t.Errorf("record state = %+v", r.Record)
		}
	})
}

// TestRecordedDecisions: a pod that left the Job but still exists is told as it is, with
// what the shim recorded deciding about it; only the others are gone.
func TestRecordedDecisions(t *testing.T) {
	job := wrappers.MakeJob("fj", "default").ManagedBy(conditions.ManagedBy).PodFailurePolicy(
		wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)).Obj()
	job.UID = "fj-uid"
	job.Status.Failed = 2
	bad := ownedPod(job, "fj-bad", 0).Phase(corev1.PodFailed).ExitedContainer("main", 42).Obj()
	gone := ownedPod(job, "fj-gone", 0).Phase(corev1.PodFailed).ExitedContainer("main", 1).Obj()
	var r v1alpha1.Record
	r.Add(0, record.Of(bad, record.Decision{Outcome: v1alpha1.OutcomeFailed, Rule: 0, Action: batchv1.PodFailurePolicyActionFailJob, Consequence: "the Job fails (reason PodFailurePolicy)"}, metav1.NewTime(t0)),
		record.Of(gone, record.Decision{Outcome: v1alpha1.OutcomeFailed, Consequence: "counts towards the backoff limit"}, metav1.NewTime(t0)))
	rec := v1alpha1.New("default", "fj", "fj-uid")
	rec.Set(r, 10)
	rep := Build(job, []*corev1.Pod{bad}, rec)
	if len(rep.Pods) != 2 || rep.Pods[0].Name != "fj-bad" || rep.Pods[0].State != StateFailed || rep.Pods[1].Name != "fj-gone" || rep.Pods[1].State != StateDeleted {
		t.Fatalf("pods = %+v", rep.Pods)
	}
	if diff := cmp.Diff([]string{"failed, counted (last phase Failed) at 2026-01-02T03:00:00Z; rule 0 (FailJob): the Job fails (reason PodFailurePolicy)"}, rep.Pods[0].Decisions); diff != "" {
		t.Errorf("decisions of fj-bad (-want +got):\n%s", diff)
	}
	if rep.Pods[1].Cause != "container main exited 1" || rep.Pods[1].Rule != "no rule matched" || rep.Pods[1].Action != "counts towards the backoff limit" {
		t.Errorf("fj-gone = %+v", rep.Pods[1])
	}
	if len(rep.Notes) != 0 {
		t.Errorf("notes = %q, want none: both counted failures are known", rep.Notes)
	}
}

// TestJSONNamesEveryPodsCause: -o json is valid JSON of the documented report, every pod
// with a state and a cause; -o yaml says the same; several reports make a List.
func TestJSONNamesEveryPodsCause(t *testing.T) {
	_, objs := indexedJob()
	_, more := onFailureJob()
	client := fakeClient(t, append(objs, more...)...)
	reports, err := Explain(context.Background(), client, "default", []Target{{KindJob, "train"}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Print(reports, OutputJSON, &out); err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	if got.APIVersion != APIVersion || got.Kind != KindJobReport || got.Job.Name != "train" {
		t.Errorf("apiVersion, kind, job = %s, %s, %s", got.APIVersion, got.Kind, got.Job.Name)
	}
	wantStates := map[string]PodState{
		"train-0-a": StateSucceeded, "train-1-a": StateFailed, "train-1-b": StateSucceeded, "train-2-b": StateFailed,
		"train-3-a": StateFailed, "train-3-b": StateFailed, "train-2-a": StateDeleted,
	}
	seen := map[string]PodState{}
	for _, p := range got.Pods {
		seen[p.Name] = p.State
		if p.Cause == "" {
			t.Errorf("pod %s has no cause", p.Name)
		}
	}
	if diff := cmp.Diff(wantStates, seen); diff != "" {
		t.Errorf("pods and states (-want +got):\n%s", diff)
	}

	// YAML, of the same.
	out.Reset()
	if err := Print(reports, OutputYAML, &out); err != nil {
		t.Fatal(err)
	}
	var fromYAML Report
	if err := yaml.Unmarshal(out.Bytes(), &fromYAML); err != nil || len(fromYAML.Pods) != len(got.Pods) {
		t.Errorf("yaml: %v, %d pods, want %d\n%s", err, len(fromYAML.Pods), len(got.Pods), out.String())
	}

	// Every coroner-managed Job of every namespace: a List.
	reports, err = Explain(context.Background(), client, metav1.NamespaceAll, []Target{{Kind: KindJob}})
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Print(reports, OutputJSON, &out); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Kind  string   `json:"kind"`
		Items []Report `json:"items"`
	}
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out.String())
	}
	var names []string
	for _, it := range list.Items {
		names = append(names, it.Job.Name)
	}
	if list.Kind != "List" || !cmp.Equal([]string{"crashy", "train"}, names) {
		t.Errorf("list kind %s of %v, want List of crashy and train", list.Kind, names)
	}
}

// TestStampedPods: "pods -A" is every pod coroner wrote on, with its Job's rule.
func TestStampedPods(t *testing.T) {
	_, objs := indexedJob()
	plain := wrappers.MakePod("plain", "other").Phase(corev1.PodFailed).ExitedContainer("main", 1).Obj()
	history := wrappers.MakePod("restarted", "other").Phase(corev1.PodRunning).RunningContainer("main").
		Annotation(conditions.AnnotationExitHistory, `[{"container":"main","exitCode":2}]`).Obj()
	client := fakeClient(t, append(objs, plain, history)...)
	reports, err := Explain(context.Background(), client, metav1.NamespaceAll, []Target{{Kind: KindPod}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range reports {
		p := o.(*PodReport)
		got = append(got, p.Namespace+"/"+p.Name+" "+string(p.State)+" "+p.Rule)
	}
	want := []string{"default/train-3-a Failed no rule matched", "other/restarted Restarting "}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stamped pods (-want +got):\n%s", diff)
	}
	var out bytes.Buffer
	if err := Print(reports[:1], OutputText, &out); err != nil {
		t.Fatal(err)
	}
	assertLinesInOrder(t, out.String(), []string{
		"Pod default/train-3-a",
		"  job:        train",
		"  index:      3",
		"  state:      Failed",
		"  cause:      OOM-killed over its own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded); container main exited 137 (OOMKilled)",
		"  rule:       no rule matched",
	})
}
