package backoff

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// Delays reports whether the failed pod p lengthens its Job's backoff: the global
// record's (Record.Fold is given only the failed pods that do) and, when it is its
// index's latest failure, the index's (IndexRemaining). A pod lost with its node
// (conditions.LostWithNode: recovered by coroner-shim from an unreachable, fenced or
// deleted node, or deleted by the taint manager or pod GC) does not.
//
// This is a deliberate difference from the built-in controller (v1.36), which delays
// the replacement of every failed pod, a pod failure policy's Ignore-d ones too. The
// backoff is there so that a workload that fails at once is not re-created in a hot
// loop; a node loss says nothing about the workload and does not come again because
// the pod is replaced, while a zone outage fails a tenth of a Job at once, and each
// failure doubled the delay of all the Job's replacements (bench-scale's outage:
// 15 of 177 lost pods replaced within 4 min, docs/performance.md). The lost pod still
// counts towards backoffLimit (or backoffLimitPerIndex) unless a rule Ignores it, as
// upstream's does; only the delay is spared. Preemption, eviction, the kubelet's
// termination and node OOM kills still delay: they can be the workload's own doing,
// or come again at once.
func Delays(p *corev1.Pod) bool {
	return conditions.LostWithNode(p) == ""
}

// Delaying returns the pods of failed that lengthen the backoff (Delays), in order.
func Delaying(failed []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range failed {
		if p != nil && Delays(p) {
			out = append(out, p)
		}
	}
	return out
}
