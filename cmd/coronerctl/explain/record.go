package explain

// What coroner-shim's JobRecord (package api/v1alpha1) says of a Job's pods: the pods that
// are gone, told from their entries, and what the shim decided about those that remain.

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// RecordState says what explain had of the Job's JobRecord.
type RecordState struct {
	// Found: the Job has a JobRecord (of this Job: same UID).
	Found bool `json:"found"`
	// Entries is the number of pods it holds, MaxPods its bound.
	Entries int   `json:"entries"`
	MaxPods int32 `json:"maxPods,omitempty"`
	// Dropped counts the entries dropped past the bound, by outcome.
	Dropped map[string]int32 `json:"dropped,omitempty"`
}

// recordOf summarizes rec (nil: none).
func recordOf(rec *v1alpha1.JobRecord) RecordState {
	if rec == nil {
		return RecordState{}
	}
	s := RecordState{Found: true, Entries: len(rec.Pods), MaxPods: rec.MaxPods}
	for o, n := range rec.Dropped {
		if s.Dropped == nil {
			s.Dropped = map[string]int32{}
		}
		s.Dropped[string(o)] = n
	}
	return s
}

// gonePods are the reports of the recorded pods that are not in live, oldest recorded
// first.
func gonePods(job *batchv1.Job, rec *v1alpha1.JobRecord, live map[string]bool) []PodReport {
	if rec == nil {
		return nil
	}
	var out []PodReport
	for _, e := range rec.Record().Entries {
		if live[e.Name] {
			continue
		}
		pr := PodReport{Namespace: job.Namespace, Name: e.Name, Job: job.Name, Node: e.Node, State: StateDeleted, Restarts: e.Restarts,
			Cause: entryCause(e), Finished: e.Finished, entry: &e}
		if e.Index != nil {
			ix := int(*e.Index)
			pr.Index = &ix
		}
		pr.Details = append(pr.Details, Line{"recorded", entryOutcome(e)})
		if line, ok := goneDevice(e.Cause); ok {
			pr.Details = append(pr.Details, line)
		}
		if e.Cause != nil && e.Cause.Message != "" {
			pr.Details = append(pr.Details, Line{"message", e.Cause.Message})
		}
		if e.Outcome == v1alpha1.OutcomeFailed || e.Outcome == v1alpha1.OutcomeIgnored {
			pr.Rule = entryRule(job, e)
			pr.Action = e.Consequence
		}
		out = append(out, pr)
	}
	return out
}

// entryCause is the cause of a recorded pod in one line: its cause of death
// (conditions.Cause, as everywhere), the exit before a restart in place, and why the shim
// deleted it.
func entryCause(e v1alpha1.Entry) string {
	var parts []string
	switch {
	case e.Outcome == v1alpha1.OutcomeSucceeded:
		parts = append(parts, "succeeded")
	case e.Cause != nil && e.Cause.Class == conditions.CauseDeleted && e.Why != "":
		// "deleted by coroner-shim (...)" below says it.
	case e.Cause != nil:
		parts = append(parts, e.Cause.String())
	}
	if e.LastExit != nil {
		parts = append(parts, fmt.Sprintf("%d restarts, last: %s", e.Restarts, e.LastExit))
	}
	if e.Why != "" {
		parts = append(parts, "deleted by coroner-shim ("+e.Why+")")
	}
	if len(parts) == 0 {
		return "phase " + string(e.Phase)
	}
	return strings.Join(parts, "; ")
}

// entryOutcome says what the pod's end did to the Job, as the shim recorded it.
func entryOutcome(e v1alpha1.Entry) string {
	var what string
	switch e.Outcome {
	case v1alpha1.OutcomeSucceeded:
		what = "succeeded, counted"
	case v1alpha1.OutcomeFailed:
		what = "failed, counted"
	case v1alpha1.OutcomeIgnored:
		what = "failed, not counted"
	case v1alpha1.OutcomeDeleted:
		what = "deleted before it finished, not counted"
	default:
		what = string(e.Outcome)
	}
	return fmt.Sprintf("%s (last phase %s) at %s", what, e.Phase, stamp(e.Recorded.Time))
}

// entryRule is the rule that matched a recorded failure, in the words of ruleText.
func entryRule(job *batchv1.Job, e v1alpha1.Entry) string {
	switch {
	case e.Grown != "":
		return v1alpha1.AnnotationOOMMemoryRetry + ": " + e.Grown
	case e.Rule != nil:
		return fmt.Sprintf("rule %d (%s)", *e.Rule, e.Action)
	case job.Spec.PodFailurePolicy == nil || len(job.Spec.PodFailurePolicy.Rules) == 0:
		return "no podFailurePolicy"
	}
	return "no rule matched"
}

// entryDecision is what the shim recorded deciding about a pod that still exists.
func entryDecision(job *batchv1.Job, e v1alpha1.Entry) string {
	s := entryOutcome(e)
	if e.Outcome == v1alpha1.OutcomeFailed || e.Outcome == v1alpha1.OutcomeIgnored {
		s += "; " + entryRule(job, e)
		if e.Consequence != "" {
			s += ": " + e.Consequence
		}
	}
	if e.Why != "" {
		s += "; deleted by coroner-shim (" + e.Why + ")"
	}
	return s
}

// recordNotes say plainly where the story of the Job's pods is incomplete, and why.
func recordNotes(job *batchv1.Job, rec *v1alpha1.JobRecord, pods []PodReport) []string {
	var notes []string
	managed := ptrValue(job.Spec.ManagedBy) == conditions.ManagedBy
	switch {
	case rec == nil && managed:
		notes = append(notes, "coroner-shim has no record of this Job (JobRecord "+job.Namespace+"/"+job.Name+"): no pod of it has left yet, or the shim runs with --job-records=false, or the record was deleted; pods that are gone are not told")
	case rec != nil && len(rec.Dropped) > 0:
		var parts []string
		var total int32
		for _, o := range slices.Sorted(maps.Keys(rec.Dropped)) {
			parts = append(parts, fmt.Sprintf("%d %s", rec.Dropped[o], strings.ToLower(string(o))))
			total += rec.Dropped[o]
		}
		notes = append(notes, fmt.Sprintf("the record dropped %d pods past its bound of %d (%s, oldest first): those are not told (coroner-shim --job-record-max-pods)", total, rec.MaxPods, strings.Join(parts, ", ")))
	}
	// Every counted failure should be a pod that exists or a recorded one: a failed pod
	// the policy counts, or a pod the record says was counted failed (gone, or still
	// terminating after the Job failed while it ran).
	known := 0
	for _, p := range pods {
		switch {
		case p.pod != nil && p.pod.Status.Phase == corev1.PodFailed:
			if countsAsFailure(job, p.pod) {
				known++
			}
		case p.entry != nil && p.entry.Outcome == v1alpha1.OutcomeFailed:
			known++
		}
	}
	if n := int(job.Status.Failed); n > known {
		why := "were deleted without a record (before coroner-shim kept records, or by another controller)"
		if !managed {
			why = "were deleted (coroner-shim records only the Jobs it runs)"
		} else if rec == nil {
			why = "were deleted, and there is no record"
		} else if len(rec.Dropped) > 0 {
			why = "were dropped from the record, or deleted without one"
		}
		notes = append(notes, fmt.Sprintf("status.failed is %d but %d counted failed pods are known (existing or recorded): the other %d %s", n, known, n-known, why))
	}
	// Successes are not recorded: say how many are gone.
	succeeded := map[string]bool{}
	for _, p := range pods {
		if p.State != StateSucceeded {
			continue
		}
		key := p.Name
		if p.Index != nil {
			key = fmt.Sprint(*p.Index) // an Indexed Job counts completed indexes
		}
		succeeded[key] = true
	}
	if n := int(job.Status.Succeeded) - len(succeeded); n > 0 {
		notes = append(notes, fmt.Sprintf("status.succeeded is %d but %d succeeded pods exist: %d are gone, and coroner-shim records failures, ignored failures and deletions, not successes", job.Status.Succeeded, len(succeeded), n))
	}
	return notes
}
