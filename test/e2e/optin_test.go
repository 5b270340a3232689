package e2e

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/lab"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestNamespaceOptIn: in a namespace labelled coroner.dev/jobs=managed, the namespace
// opt-in of the cluster's deployment (deploy/components/job-opt-in, in the lab and kind
// overlays) hands a Job created without managedBy to coroner, which runs it (its
// PodFailurePolicy Event is coroner's own), while a Job of the same namespace that names
// the built-in controller keeps it; both end the same way.
func TestNamespaceOptIn(t *testing.T) {
	t.Parallel()
	ctx, ns := setup(t, 4*time.Minute)
	optIn(ctx, t, ns)

	exit3 := func(name string) *batchv1.Job {
		return wrappers.MakeJob(name, ns).TerminationGracePeriodSeconds(1).BackoffLimit(6).
			PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 3)).
			Command("sh", "-c", "sleep 1; exit 3").Obj()
	}
	handed := createJob(ctx, t, exit3("handed"))
	if got := ptr.Deref(handed.Spec.ManagedBy, ""); got != lab.ManagedBy {
		t.Fatalf("a Job created without managedBy in an opted-in namespace has managedBy %q, want %q", got, lab.ManagedBy)
	}
	named := exit3("builtin")
	named.Spec.ManagedBy = ptr.To(conditions.BuiltInJobControllerName)
	named = createJob(ctx, t, named)
	if got := ptr.Deref(named.Spec.ManagedBy, ""); got != conditions.BuiltInJobControllerName {
		t.Fatalf("a Job that names the built-in controller has managedBy %q after creation", got)
	}

	got := waitFinished(ctx, t, ns, handed.Name, 3*time.Minute)
	ref := waitFinished(ctx, t, ns, named.Name, 3*time.Minute)
	want := outcome{Condition: "Failed", Reason: conditions.JobReasonPodFailurePolicy, Failed: 1}
	wantOutcome(t, got, want)
	wantOutcome(t, ref, want)
	// Only coroner explains each decision with an Event of its own.
	wantEvent(ctx, t, ns, handed.Name, conditions.EventReasonPodFailurePolicy, "failed with exit code 3", "matching FailJob rule at index 0")
}

// optIn labels the namespace coroner.dev/jobs=managed and waits until the opt-in hands
// its new Jobs to coroner: the label takes effect once the API server's admission has
// seen it (README, "Hand every Job of a namespace to coroner").
func optIn(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	n, err := suite.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels["coroner.dev/jobs"] = "managed"
	if _, err := suite.cs.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("labelling namespace %s: %v", ns, err)
	}
	took, err := lab.WaitOptIn(ctx, suite.cs, ns, true, 30*time.Second)
	if err != nil {
		t.Fatalf("the label coroner.dev/jobs=managed on namespace %s: %v", ns, err)
	}
	t.Logf("the opt-in applied %v after the label", took.Round(time.Millisecond))
}
