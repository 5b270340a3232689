package fence

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/conditions"
)

// Disown is what an agent started without --fencing does with the Lease an earlier agent
// of its node (with --fencing) left: it takes conditions.AnnotationFenceAfter and
// conditions.AnnotationFenceOnNodeLease off
// (FencingOffLease), once, at start. Left as it was, the Lease would go unrenewed and the
// shim would take the node for fenced fence-after later, and force the recovery of pods
// whose containers nobody stopped: two copies. It returns the Lease as written, nil when
// there was nothing to change (no Lease, or one without fence-after). A conflict (the
// Lease changed between the read and the write) is retried once.
func Disown(ctx context.Context, client kubernetes.Interface, namespace, node string) (*coordinationv1.Lease, error) {
	leases := client.CoordinationV1().Leases(namespace)
	name := conditions.AgentLeaseName(node)
	var err error
	for range 2 {
		var cur *coordinationv1.Lease
		cur, err = leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading Lease %s/%s: %w", namespace, name, err)
		}
		off := FencingOffLease(cur)
		if off == nil {
			return nil, nil
		}
		var updated *coordinationv1.Lease
		updated, err = leases.Update(ctx, off, metav1.UpdateOptions{})
		if err == nil {
			return updated, nil
		}
		if !apierrors.IsConflict(err) {
			break
		}
	}
	return nil, fmt.Errorf("taking the fence-after off Lease %s/%s: %w", namespace, name, err)
}
