// Package record makes the entries of coroner-shim's JobRecords (the type is
// api/v1alpha1.JobRecord; docs/explain.md tells what `coronerctl explain` makes of them):
// Of is the entry of a pod that leaves its Job (the shim leaves successes out, see
// jobsync.Plan.Leaving) with the shim's decision about it, MergePatch the write of the
// entries that changed and Patched the record the API server stores after it.
//
// This package is pure: where the record is stored (a JobRecord object owned by the Job,
// written in the sync's one write step) is the controller's business.
package record

import (
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// Decision is what the shim decided about a pod that leaves the Job, for Of.
type Decision struct {
	Outcome v1alpha1.Outcome
	// Rule is the index of the podFailurePolicy rule that matched, Action its action;
	// Rule is ignored when Action is empty.
	Rule   int
	Action batchv1.PodFailurePolicyAction
	// Consequence is what a failure did to the Job, in the words of the shim's Event.
	Consequence string
	// Grown says what grew when the failure grew its replacement's memory.
	Grown string
	// Why is the shim's reason for deleting the pod, if it did.
	Why string
}

// Of is the entry for p (not modified) as it leaves the Job with decision d, recorded at
// now.
func Of(p *corev1.Pod, d Decision, now metav1.Time) v1alpha1.Entry {
	e := v1alpha1.Entry{Name: p.Name, Node: p.Spec.NodeName, Phase: p.Status.Phase, Outcome: d.Outcome, Grown: d.Grown, Consequence: d.Consequence, Why: d.Why, Recorded: now}
	if ix, ok := completionIndex(p); ok {
		e.Index = &ix
	}
	if d.Outcome != v1alpha1.OutcomeSucceeded {
		c := conditions.CauseOfDeath(p)
		if c.Class == conditions.CauseUnknown && d.Outcome == v1alpha1.OutcomeDeleted {
			// Recorded as the shim deletes it: no deletionTimestamp yet.
			c.Class = conditions.CauseDeleted
		}
		e.Cause = &c
	}
	if d.Action != "" {
		r := int32(d.Rule)
		e.Rule, e.Action = &r, d.Action
	}
	if t := lastFinish(p); !t.IsZero() {
		e.Finished = &t
	}
	var lastAt metav1.Time
	for i, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			e.Restarts += cs.RestartCount
			if t := cs.LastTerminationState.Terminated; t != nil && cs.RestartCount > 0 && (e.LastExit == nil || lastAt.Before(&t.FinishedAt)) {
				e.LastExit = &conditions.CauseExit{Init: i == 0, Container: cs.Name, Code: t.ExitCode, Signal: t.Signal, Reason: t.Reason}
				lastAt = t.FinishedAt
			}
		}
	}
	return e
}

// completionIndex is the pod's completion index from its annotation.
func completionIndex(p *corev1.Pod) (int32, bool) {
	n, err := strconv.ParseInt(p.Annotations[batchv1.JobCompletionIndexAnnotation], 10, 32)
	return int32(n), err == nil && n >= 0
}

// lastFinish is the latest finishedAt of the pod's terminated containers, zero when none.
func lastFinish(p *corev1.Pod) metav1.Time {
	var t metav1.Time
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			if st := cs.State.Terminated; st != nil && t.Before(&st.FinishedAt) {
				t = st.FinishedAt
			}
		}
	}
	return t
}
