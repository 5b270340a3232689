package fence

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

// LeaseLabel marks the agents' Leases: kubectl get leases -l app.kubernetes.io/name=coroner-agent.
const LeaseLabel = "app.kubernetes.io/name"

// DesiredLease is the agent's Lease after a renewal at now (conditions/fencing.go holds the
// contract): cur (nil when there is none yet; not modified) with spec.holderIdentity the
// node, spec.leaseDurationSeconds fenceAfter in whole seconds (rounded up),
// spec.renewTime now, spec.acquireTime now when the Lease is new or was held by another,
// and the annotation conditions.AnnotationFenceAfter (the node-lease mode's annotations
// taken off: OnNodeLease puts them back). When fencedAt is not zero (the
// agent is fenced and this renewal ends it), conditions.AnnotationFencedAt records it;
// once written, it stays until the next fence.
func DesiredLease(cur *coordinationv1.Lease, namespace, node string, fenceAfter time.Duration, now, fencedAt time.Time) *coordinationv1.Lease {
	var l *coordinationv1.Lease
	if cur != nil {
		l = cur.DeepCopy()
	} else {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
			Name: conditions.AgentLeaseName(node), Namespace: namespace,
			Labels: map[string]string{LeaseLabel: "coroner-agent"},
		}}
	}
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[conditions.AnnotationFenceAfter] = fenceAfter.String()
	delete(l.Annotations, conditions.AnnotationFenceOnNodeLease)
	delete(l.Annotations, conditions.AnnotationAgentPod)
	if !fencedAt.IsZero() {
		l.Annotations[conditions.AnnotationFencedAt] = fencedAt.UTC().Format(time.RFC3339)
	}
	renewed := metav1.NewMicroTime(now)
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != node || l.Spec.AcquireTime == nil {
		acquired := renewed
		l.Spec.AcquireTime = &acquired
	}
	holder := node
	l.Spec.HolderIdentity = &holder
	secs := int32((fenceAfter + time.Second - 1) / time.Second)
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.RenewTime = &renewed
	return l
}

// OnNodeLease turns l, a DesiredLease, into the Lease of an agent that fences on its
// kubelet's node Lease (conditions.AnnotationFenceOnNodeLease, --fence-signal=node-lease):
// the fence-after under that key instead of conditions.AnnotationFenceAfter, so that a shim
// that does not know the mode never takes the Lease's old renewTime for a fence, and the
// agent's pod (conditions.AnnotationAgentPod), which the shim must see ready before it
// trusts the fence. It returns l.
func OnNodeLease(l *coordinationv1.Lease, fenceAfter time.Duration, pod types.NamespacedName) *coordinationv1.Lease {
	delete(l.Annotations, conditions.AnnotationFenceAfter)
	l.Annotations[conditions.AnnotationFenceOnNodeLease] = fenceAfter.String()
	l.Annotations[conditions.AnnotationAgentPod] = pod.String()
	return l
}

// FencingOffLease is cur (not modified) as an agent without --fencing leaves it: without
// conditions.AnnotationFenceAfter nor conditions.AnnotationFenceOnNodeLease, so that the shim reads "the node's agent does not fence"
// instead of taking the silence of an agent that no longer renews for a fence
// (conditions.NodeFenced). The fenced-at record and the rest stay. Nil when cur is nil or
// has no fence-after: nothing to change.
func FencingOffLease(cur *coordinationv1.Lease) *coordinationv1.Lease {
	if cur == nil {
		return nil
	}
	_, agentLease := cur.Annotations[conditions.AnnotationFenceAfter]
	_, nodeLease := cur.Annotations[conditions.AnnotationFenceOnNodeLease]
	if !agentLease && !nodeLease {
		return nil
	}
	l := cur.DeepCopy()
	delete(l.Annotations, conditions.AnnotationFenceAfter)
	delete(l.Annotations, conditions.AnnotationFenceOnNodeLease)
	return l
}
