package main

import (
	"context"
	"fmt"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/test/lab"
)

const (
	// optInPolicy is coroner's namespace opt-in (deploy/components/job-opt-in, in the lab's
	// overlay): a MutatingAdmissionPolicy that sets spec.managedBy: coroner.dev/shim on the
	// CREATE of a Job without managedBy, in the namespaces its bindings select.
	optInPolicy = "coroner-job-opt-in"
	// e2eBinding binds optInPolicy to the e2e framework's namespaces for the coroner pass.
	e2eBinding = "coroner-job-opt-in-e2e"
	shimName   = "coroner.dev/shim"
	// The e2e framework labels each namespace it makes with e2e-framework: <base name>
	// (NewDefaultFramework("job") in test/e2e/apps/job.go) and e2e-run: <uuid>.
	e2eNamespaceLabel = "e2e-framework"
	e2eNamespaceBase  = "job"
	// probeNamespace carries the e2e label so that a server-side dry-run Job created in it
	// shows whether the API server applies the binding yet.
	probeNamespace = "coroner-e2e-upstream-probe"
)

// optIn hands the e2e framework's Jobs to coroner, and takes them back.
type optIn struct {
	cs kubernetes.Interface
}

// check fails unless the lab serves the opt-in policy.
func (o optIn) check(ctx context.Context) error {
	_, err := o.cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, optInPolicy, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("the lab has no MutatingAdmissionPolicy %s (deploy/components/job-opt-in, included in deploy/overlays/lab): make lab-redeploy", optInPolicy)
	}
	return err
}

// bind creates the binding that selects the e2e namespaces, and waits until the API server
// applies it.
func (o optIn) bind(ctx context.Context) error {
	b := &admissionv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{
			Name:   e2eBinding,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "coroner-e2e-upstream"},
		},
		Spec: admissionv1.MutatingAdmissionPolicyBindingSpec{
			PolicyName: optInPolicy,
			MatchResources: &admissionv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{e2eNamespaceLabel: e2eNamespaceBase}},
			},
		},
	}
	_, err := o.cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Create(ctx, b, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Left by an interrupted run: the same object, by construction.
		err = nil
	}
	if err != nil {
		return fmt.Errorf("create MutatingAdmissionPolicyBinding %s: %w", e2eBinding, err)
	}
	return o.waitApplied(ctx, true)
}

// unbind deletes the binding and waits until the API server no longer applies it.
func (o optIn) unbind(ctx context.Context) error {
	err := o.cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Delete(ctx, e2eBinding, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete MutatingAdmissionPolicyBinding %s: %w", e2eBinding, err)
	}
	return o.waitApplied(ctx, false)
}

// waitApplied waits until a Job created (server-side dry run) in a namespace labelled as
// the e2e framework labels its own gets managedBy coroner.dev/shim (want) or not (!want):
// the admission plugin learns of bindings from an informer.
func (o optIn) waitApplied(ctx context.Context, want bool) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   probeNamespace,
		Labels: map[string]string{e2eNamespaceLabel: e2eNamespaceBase},
	}}
	if _, err := o.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("the probe namespace %s: %w", probeNamespace, err)
	}
	if _, err := lab.WaitOptIn(ctx, o.cs, probeNamespace, want, time.Minute); err != nil {
		return fmt.Errorf("binding %s: %w", e2eBinding, err)
	}
	return nil
}

// removeProbe deletes the probe namespace.
func (o optIn) removeProbe(ctx context.Context) error {
	err := o.cs.CoreV1().Namespaces().Delete(ctx, probeNamespace, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
