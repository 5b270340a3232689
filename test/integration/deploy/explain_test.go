package deploy_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/cmd/coronerctl/explain"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/record"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestExplainAgainstTheAPIServer runs `coronerctl explain` against the real API server
// (the unit tests use client-go's fakes, which ignore selectors and schemas): the Job's
// generated selector finds its pods, and the JobRecord, created through the CRD's schema
// with strict field validation, tells the pod that is gone.
func TestExplainAgainstTheAPIServer(t *testing.T) {
	env := harness.Shared(t)
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(env.Config)
	ns := env.Namespace(t)

	// No Job controller runs in the harness; the test writes what the shim would.
	job, err := client.BatchV1().Jobs(ns).Create(ctx, wrappers.MakeJob("train", ns).ManagedBy(conditions.ManagedBy).
		Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(0).
		PodFailurePolicy(
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42).InContainer("main"),
			wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
		).Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := wrappers.MakePod("train-1-abcde", ns).Index(1).
		Label(batchv1.ControllerUidLabel, string(job.UID)).Label(batchv1.JobNameLabel, job.Name).Obj()
	pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))}
	pod, err = client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	finished := metav1.NewTime(time.Now().Truncate(time.Second))
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
		Name: "main", Image: "busybox:local",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 42, Reason: "Error", StartedAt: finished, FinishedAt: finished}},
	}}}
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The shim's record: a pod of index 0 that is gone, and one of another Job of the
	// same name that an earlier JobRecord could have held.
	gone := wrappers.MakePod("train-0-gone", ns).Index(0).Phase(corev1.PodFailed).ExitedContainer("main", 42).Obj()
	gone.Spec.NodeName = "node-a"
	var r v1alpha1.Record
	r.Add(0, record.Of(gone, record.Decision{Outcome: v1alpha1.OutcomeFailed, Rule: 0, Action: batchv1.PodFailurePolicyActionFailIndex, Consequence: "index 0 failed"}, finished))
	rec := v1alpha1.New(ns, job.Name, job.UID)
	rec.Set(r, 3000)
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(rec)
	if err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(env.Config)
	// Server-side validation: the CRD's schema accepts what the shim writes, strictly.
	if _, err := dyn.Resource(v1alpha1.GroupVersionResource).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := explain.Job(ctx, explain.Client{Interface: client, Dynamic: dyn}, ns, "train", &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Logf("coronerctl explain job train:\n%s", got)
	for _, want := range []string{
		"Job " + ns + "/train\n",
		"  mode:        Indexed, completions 2, parallelism 2\n",
		// The API server's defaults are shown as stored.
		"podReplacementPolicy Failed\n",
		"Failed pods (1):\n  train-1-abcde  index 1",
		"    exit:       container main exited 42 (Error)",
		"    rule:       rule 0 (FailIndex): container main exit code 42\n",
		"    action:     index 1 fails, without retries\n",
		// The pod the shim's record names, gone from the API server.
		"Pods that are gone (1, from coroner-shim's record):\n  train-0-gone  index 0  node node-a\n    cause:      container main exited 42\n",
		"    rule:       rule 0 (FailIndex)\n    action:     index 0 failed\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
}
