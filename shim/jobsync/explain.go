package jobsync

// The Events that explain each failure decision, for people, and the record of each pod
// that leaves the Job, for coronerctl explain (package shim/record).

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/policy"
	"github.com/coroner-dev/coroner/shim/record"
)

// explainFailure adds the one Event that says what coroner made of a failed pod: its
// cause of death as conditions.CauseOfDeath tells it (as explain and the agent's log do),
// the rule, the consequence, e.g. "pod default/x-2-abcde: container main exited 42,
// matched rule 0 (FailIndex): index 2 failed" (conditions.PodDecisionMessage). A FailJob decision has the built-in
// controller's words instead, those of the Job's FailureTarget and Failed conditions, with
// coroner's explanation after them when it adds something (failJobEvent); it is announced
// here, when the decision is taken, and not again when the Job gets its Failed condition.
// Jobs without a pod failure policy and without backoffLimitPerIndex get none: the
// counters say it all.
func (s *state) explainFailure(p *corev1.Pod, r policy.Result, ix int) {
	if s.job.Spec.PodFailurePolicy == nil && !s.perIndex {
		return
	}
	if r.Action == batchv1.PodFailurePolicyActionFailJob {
		s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, conditions.EventReasonPodFailurePolicy, failJobEvent(p, r)})
		return
	}
	rule := "no rule matched"
	if r.Matched() {
		rule = fmt.Sprintf("matched rule %d (%s)", r.RuleIndex, r.Action)
	}
	eventType := corev1.EventTypeWarning
	if r.Action == batchv1.PodFailurePolicyActionIgnore {
		eventType = corev1.EventTypeNormal
	}
	msg := conditions.PodDecisionMessage(p.Namespace, p.Name, fmt.Sprintf("%s, %s: %s", conditions.CauseOfDeath(p), rule, s.consequence(p, r, ix)))
	s.plan.Events = append(s.plan.Events, Event{eventType, conditions.EventReasonPodFailurePolicy, msg})
}

// consequence says what a failed pod did to the Job, for its Event and its record entry.
func (s *state) consequence(p *corev1.Pod, r policy.Result, ix int) string {
	if g, ok := s.growths(p); ok && r.RuleIndex == growthRule {
		return "not counted: " + growthText(g)
	}
	if v, spent := s.budgetSpent(p); spent && !r.Matched() {
		return s.budgetWords(v) + ": " + s.ruleConsequence(p, r, ix)
	}
	return s.ruleConsequence(p, r, ix)
}

// ruleConsequence is consequence for a pod whose failure rule r decided.
func (s *state) ruleConsequence(p *corev1.Pod, r policy.Result, ix int) string {
	switch {
	case r.Action == batchv1.PodFailurePolicyActionIgnore:
		return "not counted, the pod will be replaced"
	case r.Action == batchv1.PodFailurePolicyActionFailJob:
		return "the Job fails (reason PodFailurePolicy)"
	case s.finished != nil && s.finished.Type != batchv1.JobSuccessCriteriaMet && p.Status.Phase != corev1.PodFailed:
		// Running (or being deleted, by this plan or an earlier one) when the Job failed.
		return "counted as failed: the Job failed (" + s.finished.Reason + ") while it ran"
	case s.perIndex && ix != noIndex && s.failedIdx.Has(ix):
		return fmt.Sprintf("index %d failed", ix)
	case s.perIndex && ix != noIndex:
		count, _ := backoff.IndexFailureCount(p)
		return fmt.Sprintf("index %d failure %d of %d allowed", ix, count+1, *s.job.Spec.BackoffLimitPerIndex+1)
	}
	return "counts towards the backoff limit"
}

// decision is the record of a failed pod that leaves the Job: counted, or ignored by a
// rule.
func (s *state) decision(p *corev1.Pod, r policy.Result, ix int) record.Decision {
	d := record.Decision{Outcome: v1alpha1.OutcomeFailed, Consequence: s.consequence(p, r, ix)}
	if !r.CountsAsFailure() {
		d.Outcome = v1alpha1.OutcomeIgnored
	}
	if r.Matched() && r.RuleIndex != growthRule {
		d.Rule, d.Action = r.RuleIndex, r.Action
	}
	if g, ok := s.growths(p); ok && r.RuleIndex == growthRule {
		d.Grown = g[0].String()
	}
	return d
}

// leave records p, which leaves the Job in this plan (its finalizer removed, or deleted by
// the shim), for coronerctl explain (Plan.Leaving).
// A pod the plan deletes as the Job fails also loses its finalizer in the same plan,
// counted as failed: its one entry says both.
func (s *state) leave(p *corev1.Pod, d record.Decision) {
	e := record.Of(p, d, s.now)
	for i := range s.plan.Leaving {
		if was := s.plan.Leaving[i]; was.Name == e.Name {
			if e.Why == "" {
				e.Why = was.Why
			}
			if e.Cause != nil && e.Cause.Class == conditions.CauseUnknown && was.Cause != nil && was.Cause.Class == conditions.CauseDeleted {
				e.Cause.Class = conditions.CauseDeleted
			}
			s.plan.Leaving[i] = e
			return
		}
	}
	s.plan.Leaving = append(s.plan.Leaving, e)
}

// failJobEvent is the message of the Event of a FailJob decision: the built-in
// controller's sentence (the Job condition's message when p is the pod it names), then
// the pod's cause of death (conditions.CauseOfDeath) when it says more than the sentence,
// which already names the container and its exit code. For example "Pod ns/x has
// condition coroner.dev/OOMKilled matching FailJob rule at index 0: OOM-killed over its
// own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded); container main exited 137
// (OOMKilled)".
func failJobEvent(p *corev1.Pod, r policy.Result) string {
	msg := r.Message(p)
	cause := conditions.CauseOfDeath(p)
	if e := cause.Exit; cause.Class == conditions.CauseNonZeroExit && r.ContainerName == e.Container &&
		r.ExitCode == e.Code && e.Signal == 0 && (e.Reason == "" || e.Reason == "Error") {
		return msg // "Container main for pod ns/x failed with exit code 42 ...": all there is
	}
	return msg + ": " + cause.String()
}
