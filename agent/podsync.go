package agent

// The pod-level decision (A3 kubelet terminations, A4 terminal phase of deleted pods):
// the pod and the runtime's word on its containers (the ledger's) into
// classify.StampsForPod, its stamps to the stamper, its recheck to the queue.

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/stamper"
)

// syncPod makes the pod-level decision (A3, A4) and schedules the next one.
func (a *Agent) syncPod(uid types.UID) {
	pod := a.podByUID(uid)
	if pod == nil {
		return
	}
	now := a.clock.Now()
	// The runtime's states are kept by the UID the runtime knows the pod by (a static
	// pod's config hash, when uid is its mirror pod's).
	uids := []types.UID{runtimeUID(pod)}
	if runtimeUID(pod) != pod.UID {
		uids = append(uids, pod.UID)
	}
	observed := a.ledger.Observed(uids...)
	d := classify.StampsForPod(pod, observed, now, a.cfg.PhaseGrace)
	if !d.RecheckAt.IsZero() {
		a.queue.AddAfter(podItem(uid), max(d.RecheckAt.Sub(now), 0))
	}
	logger := a.logger.WithValues("pod", klog.KObj(pod))
	if len(d.Stamps) == 0 {
		logger.V(4).Info("No pod-level stamp due", "why", d.Why, "recheckAt", d.RecheckAt)
		return
	}
	ref := stamper.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	reasonSeen := a.reasonSeenAt(uid)
	var reqs []stamper.Request
	for _, s := range d.Stamps {
		r := stamper.Request{Pod: ref, Stamp: s}
		if s.Phase != "" {
			// The latency counts from when the pod was both deleted and stopped: the
			// grace is part of it.
			r.EventTime = stoppedAt(pod, observed)
		} else {
			r.EventTime = nonZero(reasonSeen, now)
		}
		reqs = append(reqs, r)
	}
	logger.V(2).Info("Pod-level stamp due", "stamps", len(reqs), "kind", d.Stamps[0].Kind, "reason", d.Stamps[0].Reason)
	a.stamper.Add(reqs...)
}

// stoppedAt is when a pod became both stopped (its last container exit) and, when it is
// being deleted, deleted: the reference time of a terminal phase decision.
func stoppedAt(pod *corev1.Pod, observed []classify.ContainerState) time.Time {
	var t time.Time
	for _, s := range append(classify.ContainerStatesFromPod(pod), observed...) {
		if s.FinishedAt.After(t) {
			t = s.FinishedAt
		}
	}
	if dt := pod.DeletionTimestamp; dt != nil {
		ds := dt.Time
		if pod.DeletionGracePeriodSeconds != nil {
			ds = ds.Add(-time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second)
		}
		if ds.After(t) {
			t = ds
		}
	}
	return t
}
