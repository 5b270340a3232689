package agent

// The pod cache's events in: a pod that may need a pod-level decision (being deleted, or
// ended by its kubelet) queues one (work.go); a device-holding pod's device health goes to
// the ledger (devices.go); a deleted pod is forgotten.

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// podChanged queues the pod-level decision (A3, A4) of pods that may need one: pods
// being deleted and pods the kubelet ended (a status.reason).
func (a *Agent) podChanged(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != a.cfg.NodeName {
		return
	}
	if pod.Status.Reason != "" {
		a.seeReason(pod.UID, a.clock.Now())
	}
	a.observeDevices(pod)
	if pod.DeletionTimestamp != nil || pod.Status.Reason != "" {
		a.queue.Add(podItem(pod.UID))
	}
}

// podDeleted forgets a deleted pod: its events are dropped from now on, and the ledger
// and the stamper forget it.
func (a *Agent) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	uids := []types.UID{pod.UID, runtimeUID(pod)}
	a.markDeleted(pod.UID, uids, a.clock.Now())
	a.ledger.Forget(uids...)
	a.stamper.Forget(pod.UID)
}
