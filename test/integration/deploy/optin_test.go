package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/lab"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const (
	// optInName is the MutatingAdmissionPolicy (and binding) of deploy/components/job-opt-in.
	optInName = "coroner-job-opt-in"
	// optInLabel and optInValue are the namespace label its binding selects.
	optInLabel = "coroner.dev/jobs"
	optInValue = "managed"
	// builtinController is the built-in Job controller's own managedBy value.
	builtinController = "kubernetes.io/job-controller"
)

// optInObjects returns the opt-in's MutatingAdmissionPolicy and binding as
// `kubectl kustomize deploy/<dir>` renders them.
func optInObjects(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, u := range documents(t, render(t, dir)) {
		if u.GetAPIVersion() == "admissionregistration.k8s.io/v1" &&
			(u.GetKind() == "MutatingAdmissionPolicy" || u.GetKind() == "MutatingAdmissionPolicyBinding") {
			out = append(out, u)
		}
	}
	if len(out) != 2 {
		t.Fatalf("deploy/%s renders %d MutatingAdmissionPolicies and bindings, want the opt-in's policy and binding", dir, len(out))
	}
	return out
}

// labelNamespace sets (value != "") or removes (value == "") the opt-in label of ns.
func labelNamespace(t *testing.T, admin kubernetes.Interface, ns, value string) {
	t.Helper()
	v := "null"
	if value != "" {
		v = fmt.Sprintf("%q", value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, optInLabel, v)
	if _, err := admin.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitOptIn waits until a Job created (dry run) in ns without managedBy comes back with
// coroner.dev/shim (want true) or without managedBy (want false): lab.WaitOptIn.
func waitOptIn(t *testing.T, admin kubernetes.Interface, ns string, want bool) {
	t.Helper()
	if _, err := lab.WaitOptIn(context.Background(), admin, ns, want, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// createJob creates a Job and reads it back from the API server.
func createJob(t *testing.T, admin kubernetes.Interface, job *batchv1.Job) *batchv1.Job {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return getJob(t, admin, job.Namespace, job.Name)
}

func getJob(t *testing.T, admin kubernetes.Interface, ns, name string) *batchv1.Job {
	t.Helper()
	got, err := admin.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// wantManagedBy checks a stored Job's spec.managedBy; want "" means unset.
func wantManagedBy(t *testing.T, job *batchv1.Job, want string) {
	t.Helper()
	if job.Spec.ManagedBy == nil && want == "" {
		return
	}
	if job.Spec.ManagedBy == nil || *job.Spec.ManagedBy != want {
		t.Errorf("Job %s/%s has managedBy %q (set: %v), want %q", job.Namespace, job.Name,
			ptr.Deref(job.Spec.ManagedBy, ""), job.Spec.ManagedBy != nil, want)
	}
}

// TestJobOptIn applies the namespace opt-in (the MutatingAdmissionPolicy and binding of
// deploy/components/job-opt-in, as the lab overlay renders them) to the real API server,
// with no feature gate or runtime-config (admissionregistration.k8s.io/v1 is GA and served
// by default in v1.36), and creates Jobs: one without managedBy in a labelled namespace
// gets coroner.dev/shim, in an unlabelled one nothing, and one that names a controller
// keeps it; a namespace labelled after its Jobs exist leaves them as they were; Jobs made
// by kubectl and from a CronJob's jobTemplate are handed over too; without the binding the
// policy does nothing.
func TestJobOptIn(t *testing.T) {
	env := harness.Shared(t)
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(env.Config)

	objs := optInObjects(t, "overlays/lab")
	a := newApplier(t, env)
	if errs := a.apply(ctx, objs, false); len(errs) > 0 {
		t.Fatalf("applying the opt-in: %v", errors.Join(errs...))
	}
	if len(a.warnings) > 0 {
		t.Errorf("the API server warned about the opt-in: %q", a.warnings)
	}
	t.Cleanup(func() {
		_ = admin.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Delete(ctx, optInName, metav1.DeleteOptions{})
		_ = admin.AdmissionregistrationV1().MutatingAdmissionPolicies().Delete(ctx, optInName, metav1.DeleteOptions{})
	})

	managed := env.Namespace(t)
	labelNamespace(t, admin, managed, optInValue)
	plain := env.Namespace(t)
	waitOptIn(t, admin, managed, true)

	for _, tc := range []struct {
		name          string
		job           string
		ns            string
		managedBy     string // "": unset
		wantManagedBy string // "": unset
	}{
		{name: "no managedBy in a labelled namespace", job: "bare", ns: managed, wantManagedBy: conditions.ManagedBy},
		{name: "no managedBy in an unlabelled namespace", job: "bare", ns: plain},
		{name: "the built-in controller named", job: "builtin", ns: managed, managedBy: builtinController, wantManagedBy: builtinController},
		{name: "another controller named", job: "other", ns: managed, managedBy: "example.com/other", wantManagedBy: "example.com/other"},
		{name: "coroner named", job: "coroner", ns: managed, managedBy: conditions.ManagedBy, wantManagedBy: conditions.ManagedBy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := wrappers.MakeJob(tc.job, tc.ns)
			if tc.managedBy != "" {
				job.ManagedBy(tc.managedBy)
			}
			wantManagedBy(t, createJob(t, admin, job.Obj()), tc.wantManagedBy)
		})
	}

	t.Run("namespace labelled after a Job exists", func(t *testing.T) {
		ns := env.Namespace(t)
		before := createJob(t, admin, wrappers.MakeJob("before", ns).Obj())
		wantManagedBy(t, before, "")

		labelNamespace(t, admin, ns, optInValue)
		waitOptIn(t, admin, ns, true)
		wantManagedBy(t, getJob(t, admin, ns, "before"), "")
		after := createJob(t, admin, wrappers.MakeJob("after", ns).Obj())
		wantManagedBy(t, after, conditions.ManagedBy)

		// managedBy is immutable: the Job that existed stays with the built-in controller.
		patch := fmt.Sprintf(`{"spec":{"managedBy":%q}}`, conditions.ManagedBy)
		_, err := admin.BatchV1().Jobs(ns).Patch(ctx, "before", types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if !apierrors.IsInvalid(err) {
			t.Errorf("setting managedBy on an existing Job: %v, want Invalid (immutable)", err)
		}

		// Taking the label off stops the mutation for new Jobs; the handed-over Job stays.
		labelNamespace(t, admin, ns, "")
		waitOptIn(t, admin, ns, false)
		wantManagedBy(t, getJob(t, admin, ns, "after"), conditions.ManagedBy)
		wantManagedBy(t, createJob(t, admin, wrappers.MakeJob("unlabelled-again", ns).Obj()), "")
	})

	t.Run("kubectl create job", func(t *testing.T) {
		kubectl(t, env, "-n", managed, "create", "job", "kubectl-job", "--image=busybox:local", "--", "true")
		wantManagedBy(t, getJob(t, admin, managed, "kubectl-job"), conditions.ManagedBy)
	})

	t.Run("a CronJob's Job", func(t *testing.T) {
		template := wrappers.MakeJob("", managed).Obj()
		cron := &batchv1.CronJob{
			ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: managed},
			Spec: batchv1.CronJobSpec{
				Schedule:    "0 3 * * *",
				JobTemplate: batchv1.JobTemplateSpec{Spec: template.Spec},
			},
		}
		if _, err := admin.BatchV1().CronJobs(managed).Create(ctx, cron, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		stored, err := admin.BatchV1().CronJobs(managed).Get(ctx, "nightly", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if stored.Spec.JobTemplate.Spec.ManagedBy != nil {
			t.Errorf("the CronJob's jobTemplate was given managedBy %q; only Jobs should be", *stored.Spec.JobTemplate.Spec.ManagedBy)
		}
		// The Job the CronJob controller would make from the jobTemplate.
		kubectl(t, env, "-n", managed, "create", "job", "nightly-manual", "--from=cronjob/nightly")
		job := getJob(t, admin, managed, "nightly-manual")
		wantManagedBy(t, job, conditions.ManagedBy)
		if len(job.OwnerReferences) != 1 || job.OwnerReferences[0].Kind != "CronJob" {
			t.Errorf("the Job is not the CronJob's: owner references %+v", job.OwnerReferences)
		}
	})

	// The mutation is the binding's doing: without it, the policy does nothing.
	t.Run("without the binding", func(t *testing.T) {
		if err := admin.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Delete(ctx, optInName, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitOptIn(t, admin, managed, false)
		wantManagedBy(t, createJob(t, admin, wrappers.MakeJob("unbound", managed).Obj()), "")
	})
}

// kubectl runs the kubectl `make tools` builds against the harness's API server.
func kubectl(t *testing.T, env *harness.Env, args ...string) {
	t.Helper()
	cmd := exec.Command(kubectlPath(t), append([]string{"--kubeconfig", env.Kubeconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %q: %v\n%s", args, err, out.String())
	}
}
