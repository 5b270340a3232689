package explain

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/record"
	"github.com/coroner-dev/coroner/test/wrappers"
)

var t0 = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

// ownedPod is a pod of job created at t0+created, with the Job's labels and controller
// reference.
func ownedPod(job *batchv1.Job, name string, created time.Duration) *wrappers.PodWrapper {
	w := wrappers.MakePod(name, job.Namespace).
		Label(batchv1.ControllerUidLabel, string(job.UID)).Label(batchv1.JobNameLabel, job.Name)
	w.CreationTimestamp = metav1.NewTime(t0.Add(created))
	w.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}
	w.Spec.NodeName = "node-a"
	return w
}

func withCondition(w *wrappers.PodWrapper, t corev1.PodConditionType, reason, message string) *wrappers.PodWrapper {
	w.Condition(t, corev1.ConditionTrue)
	for i := range w.Status.Conditions {
		if w.Status.Conditions[i].Type == t {
			w.Status.Conditions[i].Reason, w.Status.Conditions[i].Message = reason, message
		}
	}
	return w
}

func withReason(w *wrappers.PodWrapper, container, reason string) *wrappers.PodWrapper {
	for i := range w.Status.ContainerStatuses {
		if cs := &w.Status.ContainerStatuses[i]; cs.Name == container && cs.State.Terminated != nil {
			cs.State.Terminated.Reason = reason
		}
	}
	return w
}

// indexedJob is the README's Job after index 1 was preempted and replaced, index 2 exited
// 42 (FailIndex) and index 3 failed twice (once OOM-killed over its limit, once with exit
// 1), and a first pod of index 2 is gone.
func indexedJob() (*batchv1.Job, []runtime.Object) {
	job := wrappers.MakeJob("train", "default").ManagedBy(conditions.ManagedBy).Indexed().
		Completions(4).Parallelism(4).BackoffLimitPerIndex(1).MaxFailedIndexes(2).
		PodFailurePolicy(
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42).InContainer("main"),
			wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
		).Obj()
	job.UID = "job-uid"
	job.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.ControllerUidLabel: "job-uid"}}
	job.Status = batchv1.JobStatus{
		Failed: 4, Succeeded: 2, Ready: ptr.To[int32](0), Terminating: ptr.To[int32](0),
		CompletedIndexes: "0,1", FailedIndexes: ptr.To("2,3"), StartTime: &metav1.Time{Time: t0},
		Conditions: []batchv1.JobCondition{
			{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonFailedIndexes, Message: "Job has failed indexes"},
			{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonFailedIndexes, Message: "Job has failed indexes"},
		},
	}
	pods := []*corev1.Pod{
		ownedPod(job, "train-0-a", 0).Index(0).Phase(corev1.PodSucceeded).ExitedContainer("main", 0).Obj(),
		withCondition(ownedPod(job, "train-1-a", 0).Index(1).Phase(corev1.PodFailed).ExitedContainer("main", 137).FinishedAt(t0.Add(time.Minute)),
			corev1.DisruptionTarget, conditions.ReasonPreemptionByScheduler, "Preempted in order to admit critical pod").Obj(),
		ownedPod(job, "train-1-b", 2*time.Minute).Index(1).Annotation(batchv1.JobIndexIgnoredFailureCountAnnotation, "1").
			Phase(corev1.PodSucceeded).ExitedContainer("main", 0).Obj(),
		ownedPod(job, "train-2-b", time.Minute).Index(2).Phase(corev1.PodFailed).ExitedContainer("main", 42).FinishedAt(t0.Add(3 * time.Minute)).Obj(),
		withCondition(withReason(ownedPod(job, "train-3-a", 0).Index(3).Phase(corev1.PodFailed).ExitedContainer("main", 137).FinishedAt(t0.Add(2*time.Minute)), "main", "OOMKilled"),
			conditions.OOMKilled, conditions.ReasonMemoryLimitExceeded, "oom_memcg=/kubepods/burstable/podabc").Obj(),
		ownedPod(job, "train-3-b", 3*time.Minute).Index(3).Annotation(batchv1.JobIndexFailureCountAnnotation, "1").
			Phase(corev1.PodFailed).ExitedContainer("main", 1).FinishedAt(t0.Add(4 * time.Minute)).Obj(),
	}
	// A failed pod with the same labels but another controller is not the Job's.
	stranger := wrappers.MakePod("stranger", "default").Label(batchv1.ControllerUidLabel, "job-uid").Phase(corev1.PodFailed).ExitedContainer("main", 9).Obj()
	stranger.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ReplicaSet", Name: "rs", UID: "other", Controller: ptr.To(true)}}

	// The record the shim kept: the first pod of index 2, gone, and those that left.
	rec := v1alpha1.New("default", "train", "job-uid")
	var r v1alpha1.Record
	gone := ownedPod(job, "train-2-a", 0).Index(2).Phase(corev1.PodFailed).ExitedContainer("main", 1).FinishedAt(t0.Add(20 * time.Second)).Obj()
	r.Add(0,
		record.Of(gone, record.Decision{Outcome: v1alpha1.OutcomeFailed, Consequence: "index 2 failure 1 of 2 allowed"}, metav1.NewTime(t0.Add(30*time.Second))),
		record.Of(pods[3], record.Decision{Outcome: v1alpha1.OutcomeFailed, Rule: 0, Action: batchv1.PodFailurePolicyActionFailIndex, Consequence: "index 2 failed"}, metav1.NewTime(t0.Add(3*time.Minute))),
	)
	rec.Set(r, 3000)
	objs := []runtime.Object{job, stranger, rec}
	for _, p := range pods {
		objs = append(objs, p)
	}
	return job, objs
}

func TestJobIndexed(t *testing.T) {
	_, objs := indexedJob()
	got := explainJob(t, "default", "train", objs...)
	wantLines := []string{
		"Job default/train",
		"  managedBy:   coroner.dev/shim",
		"  mode:        Indexed, completions 4, parallelism 4",
		"  limits:      backoffLimitPerIndex 1, maxFailedIndexes 2",
		"  status:      Failed (FailedIndexes: Job has failed indexes)",
		"  pods:        0 active (0 ready), 2 succeeded, 4 failed, 0 terminating",
		"  indexes:     completed 0,1; failed 2,3",
		"  rule 0: FailIndex on exit codes In [42] of container main",
		"  rule 1: Ignore on pod conditions DisruptionTarget=True",
		"Failed pods (4):",
		// Oldest finish first.
		"  train-1-a  index 1  node node-a  finished 2026-01-02T03:01:00Z",
		"    exit:       container main exited 137 (Error) at 2026-01-02T03:01:00Z",
		"    disruption: DisruptionTarget=True (PreemptionByScheduler): Preempted in order to admit critical pod",
		"    rule:       rule 1 (Ignore): pod condition DisruptionTarget",
		"    action:     not counted; the pod is replaced",
		"  train-3-a  index 3  node node-a  finished 2026-01-02T03:02:00Z",
		"    exit:       container main exited 137 (OOMKilled) at 2026-01-02T03:02:00Z",
		"    oom:        over the pod's own memory limit: coroner.dev/OOMKilled=True (MemoryLimitExceeded): oom_memcg=/kubepods/burstable/podabc",
		"    rule:       no rule matched",
		"    action:     counted: failure 1 of index 3, within backoffLimitPerIndex 1: the index is retried",
		"  train-2-b  index 2  node node-a  finished 2026-01-02T03:03:00Z",
		"    rule:       rule 0 (FailIndex): container main exit code 42",
		"    action:     index 2 fails, without retries",
		"    recorded:   failed, counted (last phase Failed) at 2026-01-02T03:03:00Z; rule 0 (FailIndex): index 2 failed",
		"  train-3-b  index 3  node node-a  finished 2026-01-02T03:04:00Z",
		"    action:     counted: failure 2 of index 3, over backoffLimitPerIndex 1: index 3 fails",
		"Pods that are gone (1, from coroner-shim's record):",
		"  train-2-a  index 2  node node-a",
		"    cause:      container main exited 1",
		"    recorded:   failed, counted (last phase Failed) at 2026-01-02T03:00:30Z",
		"    rule:       no rule matched",
		"    action:     index 2 failure 1 of 2 allowed",
		"Other pods (2):",
		"  2 succeeded without restarts or warnings",
		"Indexes:",
		"  INDEX  STATE      FAILURES  IGNORED  PODS",
		"  0      completed  0         0        train-0-a (Succeeded)",
		"  1      completed  0         1        train-1-a (Failed), train-1-b (Succeeded)",
		"  2      failed     1         0        train-2-b (Failed)",
		"  3      failed     2         0        train-3-a (Failed), train-3-b (Failed)",
	}
	assertLinesInOrder(t, got, wantLines)
	for _, absent := range []string{"stranger", "Note:"} {
		if strings.Contains(got, absent) {
			t.Errorf("output mentions %q, which it must leave out", absent)
		}
	}
	if strings.Contains(got, "not coroner-shim") {
		t.Error("output says the Job is not coroner's")
	}
}

// TestJobNonIndexed covers the OOM classes, an exit history and a Job the built-in
// controller runs.
func TestJobNonIndexed(t *testing.T) {
	job := wrappers.MakeJob("ci", "team").BackoffLimit(3).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
		wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 2),
	).Obj()
	job.UID = types.UID("ci-uid")
	job.Status = batchv1.JobStatus{Active: 1, Failed: 3, StartTime: &metav1.Time{Time: t0}}
	nodeOOM := withCondition(withReason(ownedPod(job, "ci-node-oom", 0).Phase(corev1.PodFailed).ExitedContainer("main", 137).FinishedAt(t0.Add(time.Minute)), "main", "OOMKilled"),
		corev1.DisruptionTarget, conditions.ReasonNodeOOMKill, "node memory pressure").Obj()
	unclassified := withReason(ownedPod(job, "ci-oom", time.Minute).Phase(corev1.PodFailed).ExitedContainer("main", 137).FinishedAt(t0.Add(2*time.Minute)), "main", "OOMKilled").
		Annotation(conditions.AnnotationExitHistory, `[{"container":"main","exitCode":1,"reason":"Error","finishedAt":"2026-01-02T03:01:30Z","restartCount":0}]`).Obj()
	failJob := ownedPod(job, "ci-bug", 2*time.Minute).Phase(corev1.PodFailed).InitContainerExited("setup", 0).ExitedContainer("main", 2).FinishedAt(t0.Add(3 * time.Minute)).Obj()
	failJob.Status.Reason, failJob.Status.Message = "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
	running := ownedPod(job, "ci-run", 3*time.Minute).Phase(corev1.PodRunning).RunningContainer("main").Obj()

	got := explainJob(t, "team", "ci", job, nodeOOM, unclassified, failJob, running)
	assertLinesInOrder(t, got, []string{
		"Job team/ci",
		"  managedBy:   (unset: the built-in Job controller)",
		"  mode:        NonIndexed, completions -, parallelism -",
		"  limits:      backoffLimit 3",
		"  status:      running",
		"  pods:        1 active (- ready), 0 succeeded, 3 failed, - terminating",
		"  rule 0: Ignore on pod conditions DisruptionTarget=True",
		"  rule 1: FailJob on exit codes In [2]",
		"Failed pods (3):",
		"  ci-node-oom  node node-a  finished 2026-01-02T03:01:00Z",
		"    oom:        killed by the node's OOM killer (node memory pressure, not the pod's limit): DisruptionTarget=True (NodeOOMKill): node memory pressure",
		"    rule:       rule 0 (Ignore): pod condition DisruptionTarget",
		"    action:     not counted; the pod is replaced",
		"  ci-oom  node node-a  finished 2026-01-02T03:02:00Z",
		"    oom:        the runtime reports OOMKilled but coroner-agent did not classify it",
		"    history:    in-place restarts, oldest first: main exited 1 (Error) at 2026-01-02T03:01:30Z",
		"    rule:       no rule matched",
		"    action:     counted towards backoffLimit 3 (status.failed 3)",
		"  ci-bug  node node-a  finished 2026-01-02T03:03:00Z",
		"    exit:       container main exited 2 (Error) at 2026-01-02T03:03:00Z",
		"    pod:        DeadlineExceeded: Pod was active on the node longer than the specified deadline",
		"    rule:       rule 1 (FailJob): container main exit code 2",
		"    action:     the Job fails (reason PodFailurePolicy)",
		"Note: this Job is run by the built-in Job controller, not coroner-shim",
	})
	if strings.Contains(got, "Indexes:") || strings.Contains(got, "ci-run") {
		t.Errorf("a NonIndexed Job has no index table and running pods are not failed pods:\n%s", got)
	}
	if strings.Contains(got, "disruption:") {
		t.Error("a node OOM kill is reported as oom, not again as a disruption")
	}
}

func TestJobNotFound(t *testing.T) {
	err := Job(context.Background(), fakeClient(t), "default", "missing", &bytes.Buffer{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("Job(missing) = %v, want NotFound", err)
	}
}

// fakeClient is a Client of client-go's fakes: JobRecords in the dynamic one, the rest in
// the clientset.
// explainJob is `coronerctl explain job` of ns/name on a fake client holding objs, logged.
func explainJob(t *testing.T, ns, name string, objs ...runtime.Object) string {
	t.Helper()
	var out bytes.Buffer
	if err := Job(context.Background(), fakeClient(t, objs...), ns, name, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	return out.String()
}

func fakeClient(t *testing.T, objs ...runtime.Object) Client {
	t.Helper()
	var kube, dyn []runtime.Object
	for _, o := range objs {
		rec, ok := o.(*v1alpha1.JobRecord)
		if !ok {
			kube = append(kube, o)
			continue
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(rec)
		if err != nil {
			t.Fatal(err)
		}
		dyn = append(dyn, &unstructured.Unstructured{Object: m})
	}
	return Client{
		Interface: fake.NewClientset(kube...),
		Dynamic: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{v1alpha1.GroupVersionResource: v1alpha1.Kind + "List"}, dyn...),
	}
}

// assertLinesInOrder checks that every want line is a line of got (whole line, trailing
// spaces ignored, or a prefix of one when it ends the want) and that they come in order.
func assertLinesInOrder(t *testing.T, got string, want []string) {
	t.Helper()
	lines := strings.Split(got, "\n")
	at := 0
	for _, w := range want {
		found := false
		for i := at; i < len(lines); i++ {
			if l := strings.TrimRight(lines[i], " "); l == w || strings.HasPrefix(l, w) {
				at, found = i+1, true
				break
			}
		}
		if !found {
			t.Errorf("line %q not found (in order) in the output", w)
		}
	}
}
