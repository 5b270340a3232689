// Package record is the structured story of a Job's pods that coroner-shim keeps for
// `coronerctl explain` (issue 21, item 1): for each pod that leaves the Job (its tracking
// finalizer removed once it is counted, or deleted by the shim before it finished; the
// shim leaves successes out, see jobsync.Plan.Leaving), one
// Entry with its last phase, its cause of death (conditions.Cause, the one cause coroner
// tells everywhere), the failure decision (the podFailurePolicy rule and what it did) and
// why the shim deleted it. Events stay for people; explain reads the record instead of
// parsing Event text, which client-go's correlator thins out after 25 Events per Job and
// the API server forgets after an hour.
//
// The record is bounded (Add's max): past it, entries go oldest first in the order
// Succeeded, Deleted, Ignored, Failed (the failures explain a failed Job longest), and
// Dropped counts what went, so that explain can say plainly that the story is incomplete
// and by how much.
//
// This package is pure: where the record is stored (a JobRecord object owned by the Job,
// written in the sync's one write step) is the controller's business.
package record

import (
	"slices"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// Outcome is what a pod's end did to its Job.
type Outcome string

const (
	// OutcomeSucceeded: counted in status.succeeded.
	OutcomeSucceeded Outcome = "Succeeded"
	// OutcomeFailed: counted in status.failed (no rule matched, Count, FailIndex or
	// FailJob; Entry.Action says which rule acted).
	OutcomeFailed Outcome = "Failed"
	// OutcomeIgnored: an Ignore rule matched; not counted, the pod replaced.
	OutcomeIgnored Outcome = "Ignored"
	// OutcomeDeleted: deleted by the shim before it finished (an excess pod, the Job
	// suspended or finished); not counted.
	OutcomeDeleted Outcome = "Deleted"
)

// dropOrder is the order in which outcomes lose their oldest entries past the bound.
var dropOrder = []Outcome{OutcomeSucceeded, OutcomeDeleted, OutcomeIgnored, OutcomeFailed}

// Entry is one pod as the shim last saw it.
type Entry struct {
	Name string `json:"name"`
	// Index is the completion index (Indexed Jobs).
	Index *int32          `json:"index,omitempty"`
	Node  string          `json:"node,omitempty"`
	Phase corev1.PodPhase `json:"phase"`
	// Outcome is what the pod's end did to the Job.
	Outcome Outcome `json:"outcome"`
	// Cause is the pod's cause of death (conditions.CauseOfDeath); nil for a pod that
	// succeeded.
	Cause *conditions.Cause `json:"cause,omitempty"`
	// Rule and Action are the podFailurePolicy rule that matched a failed pod and its
	// action; nil and empty when no rule matched.
	Rule   *int32                         `json:"rule,omitempty"`
	Action batchv1.PodFailurePolicyAction `json:"action,omitempty"`
	// Grown is, for a failure that grew the memory of its replacement
	// (coroner.dev/oom-memory-retry) instead of going to the pod failure policy, what grew:
	// "container main 24Mi -> 48Mi".
	Grown string `json:"grown,omitempty"`
	// Consequence is what the failure did to the Job, as the shim's Event said it ("index
	// 2 failed", "counts towards the backoff limit"); empty for other outcomes.
	Consequence string `json:"consequence,omitempty"`
	// Why is the shim's reason for deleting the pod ("excess pod", "job suspended", ...);
	// empty when the shim did not delete it.
	Why string `json:"why,omitempty"`
	// Restarts is the sum of the containers' restart counts; LastExit, when a container
	// restarted in place (restartPolicy OnFailure), its latest exit before the state the
	// pod was recorded in (a crash-looping pod's telling exit).
	Restarts int32                 `json:"restarts,omitempty"`
	LastExit *conditions.CauseExit `json:"lastExit,omitempty"`
	// Finished is when the pod's last container exited, when known.
	Finished *metav1.Time `json:"finished,omitempty"`
	// Recorded is when the shim recorded the entry.
	Recorded metav1.Time `json:"recorded"`
}

// Record is the entries of a Job's pods, oldest recorded first.
type Record struct {
	Entries []Entry `json:"entries,omitempty"`
	// Dropped counts the entries dropped to stay within the bound, by outcome.
	Dropped map[Outcome]int32 `json:"dropped,omitempty"`
}

// Decision is what the shim decided about a pod that leaves the Job, for Of.
type Decision struct {
	Outcome Outcome
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
func Of(p *corev1.Pod, d Decision, now metav1.Time) Entry {
	e := Entry{Name: p.Name, Node: p.Spec.NodeName, Phase: p.Status.Phase, Outcome: d.Outcome, Grown: d.Grown, Consequence: d.Consequence, Why: d.Why, Recorded: now}
	if ix, ok := completionIndex(p); ok {
		e.Index = &ix
	}
	if d.Outcome != OutcomeSucceeded {
		c := conditions.CauseOfDeath(p)
		if c.Class == conditions.CauseUnknown && d.Outcome == OutcomeDeleted {
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

// Add puts the entries into r (a pod recorded again replaces its entry: the later word
// wins, but keeps the Why of the shim's deletion, as a pod deleted while its Job fails is
// recorded when it is deleted and again when it is counted) and then drops entries past
// max (0: no bound), oldest first in the order Succeeded, Deleted, Ignored, Failed. It
// reports whether r changed.
func (r *Record) Add(max int, entries ...Entry) bool {
	changed := false
	for _, e := range entries {
		if i := slices.IndexFunc(r.Entries, func(x Entry) bool { return x.Name == e.Name }); i >= 0 {
			if e.Why == "" {
				e.Why = r.Entries[i].Why
			}
			if equal(r.Entries[i], e) {
				continue
			}
			r.Entries = slices.Delete(r.Entries, i, i+1)
		}
		r.Entries = append(r.Entries, e)
		changed = true
	}
	if max <= 0 {
		return changed
	}
	for _, o := range dropOrder {
		for len(r.Entries) > max {
			i := slices.IndexFunc(r.Entries, func(x Entry) bool { return x.Outcome == o })
			if i < 0 {
				break
			}
			r.Entries = slices.Delete(r.Entries, i, i+1)
			if r.Dropped == nil {
				r.Dropped = map[Outcome]int32{}
			}
			r.Dropped[o]++
			changed = true
		}
	}
	return changed
}

// Find returns the entry of the pod named name, if the record has it.
func (r *Record) Find(name string) (Entry, bool) {
	if i := slices.IndexFunc(r.Entries, func(x Entry) bool { return x.Name == name }); i >= 0 {
		return r.Entries[i], true
	}
	return Entry{}, false
}

// DroppedTotal is the number of entries dropped past the bound.
func (r *Record) DroppedTotal() int32 {
	var n int32
	for _, v := range r.Dropped {
		n += v
	}
	return n
}

// equal compares two entries, Recorded aside (re-recording an unchanged pod is no change).
func equal(a, b Entry) bool {
	a.Recorded, b.Recorded = metav1.Time{}, metav1.Time{}
	return equality.Semantic.DeepEqual(a, b)
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
