package informers

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// The transforms of the informers. An informer's transform owns the object it is given,
// and must be idempotent.
//
// Why OtherPods is stripped. The annotation that opts a pod in to node-failure recovery
// cannot be selected on, so recovering every opted-in pod means watching every pod. The
// pods of every Job, managed or not, carry the batch.kubernetes.io/controller-uid label and
// are in Pods already, as whole objects (the Job sync needs them). The other pods go to
// OtherPods, whose transform keeps only what is read of them: for a pod that is not opted
// in, its name, namespace, UID and resourceVersion; for an opted-in pod also the opt-in
// annotations, deletionTimestamp and grace period, nodeName, phase and conditions. So no
// pod is cached twice, and the pods of Deployments, DaemonSets and the like cost a stub
// each rather than the whole object: 1.4 KB against 9.6 KB for a typical Deployment pod,
// 2.2 KB when opted in (TestStripForRecoveryMemory; the empty corev1.Pod struct is most of
// the stub). OtherPods exists whatever whose pods recovery covers (recoverer.RecoverScope):
// a pod of a Job whose labels were changed so that it lost controller-uid is there (with
// its labels, owner references and finalizers), for its Job to release it (the Job
// controller's claim.go).

// stripManagedFields is the transform of Jobs and Pods: it drops metadata.managedFields
// from the object before it is cached.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// StripForRecovery is the transform of OtherPods: it keeps what recovery.Decide,
// recovery.Relevant and the pod status writer read of an opted-in pod, what the Job sync
// needs to release a pod of a Job that lost its controller-uid label, and only the
// identity of any other pod (the informer still has to know the pod, to see it opted in
// later or gone).
func StripForRecovery(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
	}}
	if ref := JobControllerRef(p); ref != nil {
		// A Job's pod that lost its controller-uid label: what the Job's sync needs to
		// release it. Rare: the pods of Jobs carry that label.
		out.OwnerReferences = []metav1.OwnerReference{*ref}
		out.Labels = p.Labels
		out.Finalizers = p.Finalizers
		out.DeletionTimestamp = p.DeletionTimestamp
	}
	if !conditions.OptedInToForcefulDeletion(p.Annotations) {
		return out, nil
	}
	out.Annotations = map[string]string{}
	for _, k := range conditions.SafeToForcefullyDeleteAnnotations {
		if v, ok := p.Annotations[k]; ok {
			out.Annotations[k] = v
		}
	}
	out.DeletionTimestamp = p.DeletionTimestamp
	out.DeletionGracePeriodSeconds = p.DeletionGracePeriodSeconds
	out.Spec.NodeName = p.Spec.NodeName
	out.Status.Phase = p.Status.Phase
	out.Status.Conditions = p.Status.Conditions
	return out, nil
}
