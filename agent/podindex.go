package agent

// The agent's view of its node's pods: the informer's cache by UID, the UID the runtime
// knows a pod by (a static pod's config hash), and the pod events that wake the work.

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/agent/metrics"
)

// podByUID returns the cached pod with uid, nil when there is none. uid is the pod's
// metadata.uid, or for a static pod the UID the node knows it by (its config hash, the
// CRI label's), which finds its mirror pod: the pod in the API that is stamped. A pod of
// another node is never returned, even if the cache had one (the field selector keeps
// them out; this is the second lock on the door: the agent writes only its own node's
// pods). A real pod with uid wins over a mirror pod claiming it.
func (a *Agent) podByUID(uid types.UID) *corev1.Pod {
	for _, index := range []string{uidIndex, mirrorIndex} {
		objs, err := a.informer.GetIndexer().ByIndex(index, string(uid))
		if err != nil {
			continue
		}
		for _, obj := range objs {
			if pod, _ := obj.(*corev1.Pod); pod != nil && pod.Spec.NodeName == a.cfg.NodeName {
				return pod
			}
		}
	}
	return nil
}

// runtimeUID is the UID the node's runtime knows a pod by: the static pod's config hash
// for a mirror pod, else metadata.uid.
func runtimeUID(pod *corev1.Pod) types.UID {
	if h := pod.Annotations[corev1.MirrorPodAnnotationKey]; h != "" {
		return types.UID(h)
	}
	return pod.UID
}

// nodePods returns the cached pods of the agent's node (the fencer's view of them, which
// outlives the connection to the API server). They are the cache's: read only.
func (a *Agent) nodePods() []*corev1.Pod {
	objs := a.informer.GetStore().List()
	pods := make([]*corev1.Pod, 0, len(objs))
	for _, obj := range objs {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName == a.cfg.NodeName {
			pods = append(pods, pod)
		}
	}
	return pods
}

// podChanged queues the pod-level decision (A3, A4) of pods that may need one: pods
// being deleted and pods the kubelet ended (a status.reason).
func (a *Agent) podChanged(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != a.cfg.NodeName {
		return
	}
	if pod.Status.Reason != "" {
		a.mu.Lock()
		if _, seen := a.reasonSeen[pod.UID]; !seen {
			a.reasonSeen[pod.UID] = a.clock.Now()
		}
		a.mu.Unlock()
	}
	if pod.DeletionTimestamp != nil || pod.Status.Reason != "" {
		a.queue.Add(item{kind: itemPod, id: string(pod.UID)})
	}
}

// podDeleted forgets a deleted pod.
func (a *Agent) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	uids := []types.UID{pod.UID, runtimeUID(pod)}
	a.mu.Lock()
	for _, uid := range uids {
		a.gone[uid] = goneRecord{reason: metrics.DroppedPodGone, at: a.clock.Now()}
	}
	delete(a.reasonSeen, pod.UID)
	a.mu.Unlock()
	a.table.forget(uids...)
	a.stamper.Forget(pod.UID)
}
