package conditions

import corev1 "k8s.io/api/core/v1"

// LostWithNode reports whether p failed because its node was lost, not because of
// anything it did, and names the condition that says so ("ForcefullyTerminated
// NodeFenced", "DisruptionTarget DeletionByTaintManager", ...); "" when it was not:
//
//   - coroner.dev/ForcefullyTerminated=True, any reason: coroner-shim recovered the pod
//     from a node that was unreachable (NodeUnreachable), fenced (NodeFenced) or gone
//     (NodeDeleted);
//   - DisruptionTarget=True with reason DeletionByTaintManager (a NoExecute taint, the
//     node controller's unreachable or not-ready taint first of all) or DeletionByPodGC
//     (its node no longer exists).
//
// Other disruptions are not node losses and are not reported: a preemption, an
// eviction, the kubelet's termination (node pressure) and a node OOM kill can each be
// the workload's own doing, or come again at once if it is replaced at once.
//
// coroner-shim's backoff reads it (shim/backoff.Delays): a pod lost with its node does
// not lengthen its Job's backoff.
func LostWithNode(p *corev1.Pod) string {
	if c := FindTrue(p, ForcefullyTerminated); c != nil {
		return string(c.Type) + " " + c.Reason
	}
	if c := FindTrue(p, DisruptionTarget); c != nil && (c.Reason == ReasonDeletionByTaintManager || c.Reason == ReasonDeletionByPodGC) {
		return string(c.Type) + " " + c.Reason
	}
	return ""
}
