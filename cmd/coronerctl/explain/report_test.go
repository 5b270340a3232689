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
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/coroner-dev/coroner/conditions"
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
// the Job failed with BackoffLimitExceeded and coroner-shim deleted it; only its Events
// are left.
func onFailureJob() (*batchv1.Job, []runtime.Object) {
	job := wrappers.MakeJob("crashy", "default").ManagedBy(conditions.ManagedBy).BackoffLimit(2).RestartPolicy(corev1.RestartPolicyOnFailure).Obj()
	job.UID = "crashy-uid"
	job.Status = batchv1.JobStatus{Failed: 1, StartTime: &metav1.Time{Time: t0}, Conditions: []batchv1.JobCondition{
		{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded, Message: conditions.JobMessageBackoffLimitExceeded},
		{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded, Message: conditions.JobMessageBackoffLimitExceeded},
	}}
	// The pod as the shim saw it when it deleted it.
	gone := waiting(ownedPod(job, "crashy-7xk2p", 0).Phase(corev1.PodRunning), "main", "CrashLoopBackOff", "back-off", 3,
		&corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error", FinishedAt: metav1.NewTime(t0.Add(time.Minute))}).Obj()
	ev := func(name, reason, msg string) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Job", Namespace: "default", Name: "crashy", UID: "crashy-uid"},
			Reason:         reason, Message: msg, LastTimestamp: metav1.NewTime(t0.Add(2 * time.Minute)),
		}
	}
	return job, []runtime.Object{job,
		ev("c1", conditions.EventReasonSuccessfulCreate, "Created pod: crashy-7xk2p"),
		ev("c2", conditions.EventReasonSuccessfulDelete, conditions.DeletedPodMessage(gone, "job failed: BackoffLimitExceeded")),
		ev("c3", batchv1.JobReasonBackoffLimitExceeded, conditions.JobMessageBackoffLimitExceeded),
	}
}

func TestDeletedPodFromShimEvent(t *testing.T) {
	_, objs := onFailureJob()
	client := fake.NewClientset(objs...)
	var out bytes.Buffer
	if err := Job(context.Background(), client, "default", "crashy", &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	assertLinesInOrder(t, out.String(), []string{
		"  status:      Failed (BackoffLimitExceeded: Job has reached the specified backoff limit)",
		"Failed pods (0):",
		"Pods that are gone (1, from coroner-shim's Events):",
		"  crashy-7xk2p",
		"    cause:      container main last exited 3 (Error) at 2026-01-02T03:01:00Z, 3 restarts, then waiting (CrashLoopBackOff); deleted by coroner-shim (job failed: BackoffLimitExceeded)",
		"    last state: phase Running",
		"    last state: container main waiting (CrashLoopBackOff), last exited 3 (Error) at 2026-01-02T03:01:00Z, 3 restarts",
	})

	// Also one pod by name, though it is gone.
	pr, err := Pod(context.Background(), client, "default", "crashy-7xk2p")
	if err != nil {
		t.Fatal(err)
	}
	if pr.State != StateDeleted || pr.Job != "crashy" || pr.Restarts != 3 || !strings.Contains(pr.Cause, "last exited 3") {
		t.Errorf("pod report = %+v", pr)
	}
	if _, err := Pod(context.Background(), client, "default", "never-was"); !apierrors.IsNotFound(err) {
		t.Errorf("Pod(never-was) = %v, want NotFound", err)
	}
}

// TestGoneListsNoLivePod: the decision of a FailJob rule, in upstream's words, and an
// aggregated Event are about pods that exist: not gone.
func TestGoneListsNoLivePod(t *testing.T) {
	job := wrappers.MakeJob("fj", "default").ManagedBy(conditions.ManagedBy).PodFailurePolicy(
		wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)).Obj()
	job.UID = "fj-uid"
	bad := ownedPod(job, "fj-bad", 0).Phase(corev1.PodFailed).ExitedContainer("main", 42).Obj()
	other := ownedPod(job, "fj-other", 0).Phase(corev1.PodFailed).ExitedContainer("main", 1).Obj()
	ev := func(msg string) corev1.Event {
		return corev1.Event{InvolvedObject: corev1.ObjectReference{Kind: "Job", Name: "fj", UID: "fj-uid"}, Reason: conditions.EventReasonPodFailurePolicy, Message: msg}
	}
	r := Build(job, []*corev1.Pod{bad, other}, []corev1.Event{
		ev("Container main for pod default/fj-bad failed with exit code 42 matching FailJob rule at index 0"),
		ev(conditions.AggregatedEventPrefix + "pod default/fj-other: container main exited 1, no rule matched: counts towards the backoff limit"),
		ev("pod default/fj-gone: container main exited 1, no rule matched: counts towards the backoff limit"),
	})
	if diff := cmp.Diff([]string{"pod default/fj-gone: container main exited 1, no rule matched: counts towards the backoff limit"}, r.GoneDecisions); diff != "" {
		t.Errorf("gone decisions (-want +got):\n%s", diff)
	}
	if got := r.Pods[0].Decisions; len(got) != 1 || !strings.HasPrefix(got[0], "Container main for pod default/fj-bad") {
		t.Errorf("decisions of fj-bad = %q", got)
	}
}

// TestJSONNamesEveryPodsCause: -o json is valid JSON of the documented report, every pod
// with a state and a cause; -o yaml says the same; several reports make a List.
func TestJSONNamesEveryPodsCause(t *testing.T) {
	_, objs := indexedJob()
	_, more := onFailureJob()
	client := fake.NewClientset(append(objs, more...)...)
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
	client := fake.NewClientset(append(objs, plain, history)...)
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
