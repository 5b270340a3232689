package informers

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// The transforms of the informers. An informer's transform owns the object it is given,
// and must be idempotent.
//
// Why a node's pods are stripped (NodePods). The annotation that opts a pod in to
// node-failure recovery cannot be selected on, so recovering the opted-in pods of other
// controllers means watching every pod of the nodes tainted unreachable. The transform
// keeps only what is read of them: for a pod that is not opted in, its name, namespace,
// UID and resourceVersion (and the managed label, which says the pod is the Job
// controller's, in Pods already); for an opted-in pod also the opt-in annotations,
// deletionTimestamp and grace period, nodeName, phase and conditions. So the pods of
// Deployments, DaemonSets and the like cost a stub each rather than the whole object:
// 1.4 KB against 9.6 KB for a typical Deployment pod, 2.2 KB when opted in
// (TestStripForRecoveryMemory; the empty corev1.Pod struct is most of the stub).

// Why Pods is stripped too. The Jobs' pods are what the shim caches most of: one per
// pod of every Job, the finished ones included until their Job goes (the built-in Job
// controller caches every pod of the cluster whole, but for managedFields). Of a pod's
// spec the shim reads only nodeName, restartPolicy, the containers' and init containers'
// names, the init containers' restartPolicy (sidecars) and, of a failed pod, the
// containers' and the pod-level memory limits (the memory retry), and the devices it holds
// (extended resources, the names of its resource claims: the device verdict's wait,
// conditions.HoldsDevices); of its status the phase, reason, message, conditions, start
// time and the containers' states, and of a failed pod the devices' health the kubelet
// reports (allocatedResourcesStatus). Volumes, environment, commands, probes, images, tolerations,
// affinity, IPs and the like are never read: StripJobPod drops them, and the metadata's
// managedFields (TestStripJobPodMemory measures what a batch pod keeps).

// stripManagedFields is the transform of Jobs: it drops metadata.managedFields from the
// object before it is cached.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// StripForRecovery is the transform of a node's pods (NodePods): it keeps what
// recovery.Decide, recovery.Relevant and the pod status writer read of an opted-in pod,
// the managed label (conditions.ManagedPodLabel) of a managed Job's pod, and only the
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
	if v, ok := p.Labels[conditions.ManagedPodLabel]; ok {
		out.Labels = map[string]string{conditions.ManagedPodLabel: v}
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

// StripJobPod is the transform of Pods (the Jobs' pods): it keeps the metadata but its
// managedFields, and of spec and status what the Job sync, its Events and JobRecord
// entries, the memory retry, the claim of orphans and node-failure recovery read (see
// "Why Pods is stripped too"). A reader of another field must add it here first: the
// test lists the fields kept.
func StripJobPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return stripManagedFields(obj)
	}
	p.ManagedFields = nil
	// Memory limits and devices are read of failed pods only (the memory retry's growth and
	// ladder, the device verdict's wait): the version of a pod that reaches the cache once
	// it failed keeps them.
	failed := p.Status.Phase == corev1.PodFailed
	spec := corev1.PodSpec{
		NodeName:       p.Spec.NodeName,
		RestartPolicy:  p.Spec.RestartPolicy,
		Containers:     slimContainers(p.Spec.Containers, failed),
		InitContainers: slimContainers(p.Spec.InitContainers, failed),
	}
	if failed && p.Spec.Resources != nil {
		spec.Resources = &corev1.ResourceRequirements{Limits: memoryLimit(p.Spec.Resources.Limits)}
	}
	if failed {
		for _, c := range p.Spec.ResourceClaims {
			spec.ResourceClaims = append(spec.ResourceClaims, corev1.PodResourceClaim{Name: c.Name})
		}
	}
	p.Spec = spec
	p.Status = corev1.PodStatus{
		Phase:                 p.Status.Phase,
		Reason:                p.Status.Reason,
		Message:               p.Status.Message,
		Conditions:            p.Status.Conditions,
		StartTime:             p.Status.StartTime,
		ContainerStatuses:     slimStatuses(p.Status.ContainerStatuses, failed),
		InitContainerStatuses: slimStatuses(p.Status.InitContainerStatuses, failed),
	}
	return p, nil
}

// slimContainers keeps a container's name and restartPolicy, and its memory limit and
// device resources (limits and requests) when withResources.
func slimContainers(cs []corev1.Container, withResources bool) []corev1.Container {
	if len(cs) == 0 {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, RestartPolicy: c.RestartPolicy}
		if withResources {
			out[i].Resources = corev1.ResourceRequirements{
				Limits:   withDevices(memoryLimit(c.Resources.Limits), c.Resources.Limits),
				Requests: withDevices(nil, c.Resources.Requests),
			}
		}
	}
	return out
}

// slimStatuses keeps a container status's name, states, readiness and restart count, and
// the devices' health when withDevices.
func slimStatuses(ss []corev1.ContainerStatus, withDevices bool) []corev1.ContainerStatus {
	if len(ss) == 0 {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(ss))
	for i, s := range ss {
		out[i] = corev1.ContainerStatus{Name: s.Name, State: s.State, LastTerminationState: s.LastTerminationState,
			Ready: s.Ready, Started: s.Started, RestartCount: s.RestartCount}
		if withDevices {
			out[i].AllocatedResourcesStatus = s.AllocatedResourcesStatus
		}
	}
	return out
}

// withDevices is kept with the device resources of l added (conditions.IsDeviceResource).
func withDevices(kept, l corev1.ResourceList) corev1.ResourceList {
	for name, q := range l {
		if conditions.IsDeviceResource(name) {
			if kept == nil {
				kept = corev1.ResourceList{}
			}
			kept[name] = q
		}
	}
	return kept
}

// memoryLimit is l's memory entry alone, nil without one.
func memoryLimit(l corev1.ResourceList) corev1.ResourceList {
	q, ok := l[corev1.ResourceMemory]
	if !ok {
		return nil
	}
	return corev1.ResourceList{corev1.ResourceMemory: q}
}
