package lab

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// FreshNamespace creates ns for a test suite's case and waits for its default
// ServiceAccount (pods are refused until the controller-manager has made it). A namespace
// of that name left by an earlier run (kept for a look after a failure) is deleted first,
// so that a second run on a lab kept up does not fail on it.
//
// Pods go first when a namespace is deleted, and a Job's failed pod whose replacement
// cannot be created any more (the namespace is terminating) keeps its job-tracking
// finalizer: seen with the built-in Job controller and coroner-shim alike, the namespace
// then never goes. FreshNamespace takes those finalizers off, as an operator would.
func FreshNamespace(ctx context.Context, cs kubernetes.Interface, ns *corev1.Namespace, timeout time.Duration) error {
	name := ns.Name
	err := Poll(ctx, timeout, "namespace "+name+" of an earlier run to go", func() (bool, error) {
		_, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			return true, err
		}
		if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
		pods, err := cs.CoreV1().Pods(name).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil && len(p.Finalizers) > 0 {
				_, _ = cs.CoreV1().Pods(name).Patch(ctx, p.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
			}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	return Poll(ctx, time.Minute, "the default ServiceAccount of "+name, func() (bool, error) {
		_, err := cs.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}
