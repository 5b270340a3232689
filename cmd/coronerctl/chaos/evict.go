package chaos

import (
	"context"
	"fmt"
	"io"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// evictUndo is Evict's undo hint: an evicted pod cannot be brought back.
const evictUndo = "nothing to undo: the pod's controller replaces it (a bare pod is gone for good)"

// Evict asks the API server to evict the pod (policy/v1 Eviction, as `kubectl drain` does):
// the API server adds the DisruptionTarget condition (reason EvictionByEvictionAPI) and deletes it.
// A 429 (PodDisruptionBudget) is retried every second until ctx ends. Returns the undo hint.
//
// Evict returns once the API server has accepted the eviction; it does not wait for the pod
// to terminate (its grace period).
func Evict(ctx context.Context, cs kubernetes.Interface, w io.Writer, namespace, name string) (undo string, err error) {
	pod, err := lookupPod(ctx, cs, namespace, name)
	if err != nil {
		return "", err
	}
	where := "node " + pod.Spec.NodeName
	if pod.Spec.NodeName == "" {
		where = "not scheduled"
	}
	refused := false
	for {
		err := requestEviction(ctx, cs, namespace, name)
		switch {
		case err == nil:
			fmt.Fprintf(w, "evict: requested eviction of %s/%s (%s)\n", namespace, name, where)
			return evictUndo, nil
		case apierrors.IsNotFound(err):
			return "", fmt.Errorf("pod %s/%s not found", namespace, name)
		case !apierrors.IsTooManyRequests(err):
			return "", fmt.Errorf("evicting pod %s/%s: %w", namespace, name, err)
		}
		if !refused {
			fmt.Fprintf(w, "evict: %s/%s: eviction refused for now (%v); retrying every %s\n", namespace, name, err, evictRetryInterval)
			refused = true
		}
		if werr := sleepOrDone(ctx, evictRetryInterval); werr != nil {
			return "", fmt.Errorf("evicting pod %s/%s: gave up (%w) while the eviction was refused: %v", namespace, name, werr, err)
		}
	}
}

// requestEviction posts one policy/v1 Eviction of the pod.
func requestEviction(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	return cs.PolicyV1().Evictions(namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
	})
}
