// Package jobapi checks, against a real kube-apiserver v1.36.3, the parts of the batch/v1
// Job API coroner relies on: the API server accepts and defaults a Job handed to coroner
// with spec.managedBy and a pod failure policy, refuses invalid policies with errors that
// name the field, and validates the status coroner will write for managed Jobs.
package jobapi

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

func setup(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	env := harness.Shared(t)
	t.Logf("talking to kube-apiserver %s at %s", env.ServerVersion, env.Config.Host)
	if env.ServerVersion != harness.KubeVersion {
		t.Fatalf("kube-apiserver reports %s, want %s", env.ServerVersion, harness.KubeVersion)
	}
	return kubernetes.NewForConfigOrDie(env.Config), env.Namespace(t)
}

// TestManagedJobWithPolicyIsAcceptedAndDefaulted creates the kind of Job a user hands to
// coroner and checks what the API server stored.
func TestManagedJobWithPolicyIsAcceptedAndDefaulted(t *testing.T) {
	client, ns := setup(t)
	ctx := context.Background()
	job := wrappers.MakeJob("train", ns).
		ManagedBy(conditions.ManagedBy).
		Indexed().Completions(4).Parallelism(2).
		BackoffLimitPerIndex(1).MaxFailedIndexes(2).
		PodFailurePolicy(
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42).InContainer("main"),
			wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 3),
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionCount, batchv1.PodFailurePolicyOnExitCodesOpNotIn, 1, 2),
		).Obj()

	created, err := client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a managed Job with a pod failure policy: %v", err)
	}
	if got := ptr.Deref(created.Spec.ManagedBy, ""); got != conditions.ManagedBy {
		t.Errorf("spec.managedBy = %q, want %q", got, conditions.ManagedBy)
	}
	rules := created.Spec.PodFailurePolicy.Rules
	if len(rules) != 4 {
		t.Fatalf("stored %d rules, want 4", len(rules))
	}
	if got := rules[1].OnPodConditions[0].Status; got != corev1.ConditionTrue {
		t.Errorf("onPodConditions status defaulted to %q, want True", got)
	}
	if got := ptr.Deref(created.Spec.BackoffLimit, -1); got != math.MaxInt32 {
		t.Errorf("backoffLimit with backoffLimitPerIndex defaulted to %d, want MaxInt32", got)
	}
	if got := ptr.Deref(created.Spec.PodReplacementPolicy, ""); got != batchv1.Failed {
		t.Errorf("podReplacementPolicy with a pod failure policy defaulted to %q, want Failed", got)
	}
	if created.Status.StartTime != nil || len(created.Status.Conditions) != 0 {
		t.Errorf("a fresh Job has status %+v, want empty", created.Status)
	}

	// managedBy is immutable: a Job cannot be moved between controllers mid-flight.
	created.Spec.ManagedBy = ptr.To("kubernetes.io/job-controller")
	_, err = client.BatchV1().Jobs(ns).Update(ctx, created, metav1.UpdateOptions{})
	wantInvalid(t, err, "spec.managedBy")
}

// TestInvalidPoliciesAreRejected checks that the API server refuses policies coroner must
// never see, each with an error that names the offending field.
func TestInvalidPoliciesAreRejected(t *testing.T) {
	client, ns := setup(t)
	failIndex := wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 3)
	cases := []struct {
		name      string
		job       *batchv1.Job
		wantField string
	}{
		{
			name:      "FailIndex without backoffLimitPerIndex",
			job:       wrappers.MakeJob("fail-index", ns).ManagedBy(conditions.ManagedBy).Indexed().Completions(2).PodFailurePolicy(failIndex).Obj(),
			wantField: "spec.podFailurePolicy.rules[0].action",
		},
		{
			name: "exit code 0 in an In rule",
			job: wrappers.MakeJob("exit-zero", ns).ManagedBy(conditions.ManagedBy).PodFailurePolicy(
				wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 0)).Obj(),
			wantField: "spec.podFailurePolicy.rules[0].onExitCodes.values[0]",
		},
		{
			name: "pod failure policy with restartPolicy OnFailure",
			job: wrappers.MakeJob("on-failure", ns).ManagedBy(conditions.ManagedBy).RestartPolicy(corev1.RestartPolicyOnFailure).PodFailurePolicy(
				wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)).Obj(),
			wantField: "spec.template.spec.restartPolicy",
		},
		{
			name: "TerminatingOrFailed with a pod failure policy",
			job: func() *batchv1.Job {
				j := wrappers.MakeJob("replacement", ns).ManagedBy(conditions.ManagedBy).PodFailurePolicy(
					wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj()
				j.Spec.PodReplacementPolicy = ptr.To(batchv1.TerminatingOrFailed)
				return j
			}(),
			wantField: "spec.podReplacementPolicy",
		},
		{
			name:      "maxFailedIndexes above completions",
			job:       wrappers.MakeJob("max-failed", ns).ManagedBy(conditions.ManagedBy).Indexed().Completions(2).BackoffLimitPerIndex(1).MaxFailedIndexes(3).Obj(),
			wantField: "spec.maxFailedIndexes",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.BatchV1().Jobs(ns).Create(context.Background(), tc.job, metav1.CreateOptions{})
			wantInvalid(t, err, tc.wantField)
		})
	}
}

// TestManagedJobStatusIsValidated shows that the API server checks the status a Job
// controller other than the built-in one writes: a malformed failedIndexes is refused,
// a consistent status is stored.
func TestManagedJobStatusIsValidated(t *testing.T) {
	client, ns := setup(t)
	ctx := context.Background()
	job, err := client.BatchV1().Jobs(ns).Create(ctx, wrappers.MakeJob("status", ns).
		ManagedBy(conditions.ManagedBy).Indexed().Completions(8).BackoffLimitPerIndex(1).Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Job: %v", err)
	}
	now := metav1.Now()

	bad := job.DeepCopy()
	bad.Status.StartTime = &now
	bad.Status.FailedIndexes = ptr.To("5-3")
	_, err = client.BatchV1().Jobs(ns).UpdateStatus(ctx, bad, metav1.UpdateOptions{})
	wantInvalid(t, err, "status.failedIndexes")

	good := job.DeepCopy()
	good.Status.StartTime = &now
	good.Status.Active = 2
	good.Status.Failed = 2
	good.Status.Succeeded = 3
	good.Status.CompletedIndexes = "0-2"
	good.Status.FailedIndexes = ptr.To("3,5")
	good.Status.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{}
	stored, err := client.BatchV1().Jobs(ns).UpdateStatus(ctx, good, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("a consistent status of a managed Job was refused: %v", err)
	}
	if got := ptr.Deref(stored.Status.FailedIndexes, ""); got != "3,5" {
		t.Errorf("stored failedIndexes = %q, want %q", got, "3,5")
	}
}

func wantInvalid(t *testing.T, err error, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the API server accepted it; want an Invalid error on %s", field)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error = %v (reason %s), want reason Invalid", err, apierrors.ReasonForError(err))
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("error %q does not name the field %s", err, field)
	}
	t.Logf("rejected as expected: %v", err)
}
