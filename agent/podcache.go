package agent

// What the agent knows of its node's pods: the informer's cache by UID, the UID the
// runtime knows a pod by (a static pod's config hash), the pods known gone and when a
// pod's status.reason was first seen (Agent.mu).

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/agent/metrics"
)

// uidIndex indexes the pod cache by metadata.uid: containers name their pod by UID.
// mirrorIndex indexes mirror pods by the UID their static pod has on the node: the
// kubelet's config hash, which is the CRI pod UID label (io.kubernetes.pod.uid) and
// the pod<hash> of the pod's cgroup, and which the mirror pod carries in the
// annotation kubernetes.io/config.mirror (its metadata.uid is another, the API
// server's).
const (
	uidIndex    = "uid"
	mirrorIndex = "mirror"
)

// podIndexers are the pod cache's indexes (uidIndex, mirrorIndex).
func podIndexers() cache.Indexers {
	return cache.Indexers{
		uidIndex: func(obj any) ([]string, error) {
			if pod, ok := obj.(*corev1.Pod); ok {
				return []string{string(pod.UID)}, nil
			}
			return nil, nil
		},
		mirrorIndex: func(obj any) ([]string, error) {
			if pod, ok := obj.(*corev1.Pod); ok && pod.Annotations[corev1.MirrorPodAnnotationKey] != "" {
				return []string{pod.Annotations[corev1.MirrorPodAnnotationKey]}, nil
			}
			return nil, nil
		},
	}
}

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

// cachedUIDs returns the UIDs podByUID finds the cached pods of the agent's node by: each
// pod's metadata.uid and, for a mirror pod, its static pod's.
func (a *Agent) cachedUIDs() []types.UID {
	pods := a.nodePods()
	uids := make([]types.UID, 0, len(pods))
	for _, pod := range pods {
		uids = append(uids, pod.UID)
		if r := runtimeUID(pod); r != pod.UID {
			uids = append(uids, r)
		}
	}
	return uids
}

// goneTTL is how long a pod known gone is remembered: long enough for a relist after a
// runtime restart, and a watch far behind.
const goneTTL = 10 * time.Minute

// goneRecord says why events of a pod are dropped.
type goneRecord struct {
	reason string
	at     time.Time
}

// markGone records that the events of the pods with uids are dropped from now on, for
// reason.
func (a *Agent) markGone(reason string, now time.Time, uids ...types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, uid := range uids {
		a.gone[uid] = goneRecord{reason: reason, at: now}
	}
}

// markDeleted records a deleted pod: gone by its UIDs (uids), and when its status.reason
// was seen (by uid) forgotten.
func (a *Agent) markDeleted(uid types.UID, uids []types.UID, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, u := range uids {
		a.gone[u] = goneRecord{reason: metrics.DroppedPodGone, at: now}
	}
	delete(a.reasonSeen, uid)
}

// goneReason returns why the events of a pod known not to be this node's to write are
// dropped.
func (a *Agent) goneReason(uid types.UID) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.gone[uid]
	return g.reason, ok
}

// expireGone forgets the pods known gone for longer than goneTTL.
func (a *Agent) expireGone(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, g := range a.gone {
		if now.Sub(g.at) > goneTTL {
			delete(a.gone, uid)
		}
	}
}

// seeReason records when a pod's status.reason was first seen (now, the first time).
func (a *Agent) seeReason(uid types.UID, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, seen := a.reasonSeen[uid]; !seen {
		a.reasonSeen[uid] = now
	}
}

// reasonSeenAt returns when a pod's status.reason was first seen; zero when not.
func (a *Agent) reasonSeenAt(uid types.UID) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reasonSeen[uid]
}
