package jobsync

// The Events that explain each failure decision, for people (coronerctl explain reads
// them too).

import (
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/policy"
)

// explainFailure adds the one Event that says what coroner made of a failed pod, e.g.
// "pod default/x-2-abcde: container main exited 42, matched rule 0 (FailIndex): index 2
// failed" (conditions.PodDecisionMessage). A FailJob decision has the built-in
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
	var consequence string
	switch {
	case r.Action == batchv1.PodFailurePolicyActionIgnore:
		eventType = corev1.EventTypeNormal
		consequence = "not counted, the pod will be replaced"
	case s.perIndex && ix != noIndex && s.failedIdx.Has(ix):
		consequence = fmt.Sprintf("index %d failed", ix)
	case s.perIndex && ix != noIndex:
		count, _ := backoff.IndexFailureCount(p)
		consequence = fmt.Sprintf("index %d failure %d of %d allowed", ix, count+1, *s.job.Spec.BackoffLimitPerIndex+1)
	default:
		consequence = "counts towards the backoff limit"
	}
	msg := conditions.PodDecisionMessage(p.Namespace, p.Name, fmt.Sprintf("%s, %s: %s", causeOfDeath(p, r), rule, consequence))
	s.plan.Events = append(s.plan.Events, Event{eventType, conditions.EventReasonPodFailurePolicy, msg})
}

// failJobEvent is the message of the Event of a FailJob decision: the built-in
// controller's sentence (the Job condition's message when p is the pod it names), then
// what coroner knows beyond it: the matched condition's reason and the container's exit
// for a condition rule; the runtime's reason and coroner's OOM or disruption stamp for an
// exit code rule. For example "Pod ns/x has condition coroner.dev/OOMKilled matching
// FailJob rule at index 0: reason MemoryLimitExceeded, container main exited 137
// (OOMKilled)".
func failJobEvent(p *corev1.Pod, r policy.Result) string {
	var extra []string
	if r.ConditionType != "" {
		if c := conditions.Find(&p.Status, r.ConditionType); c != nil && c.Reason != "" {
			extra = append(extra, "reason "+c.Reason)
		}
		if exit := causeOfDeath(p, policy.Result{}); strings.HasPrefix(exit, "container ") {
			extra = append(extra, exit)
		}
	} else {
		for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
			for _, c := range list {
				if t := c.State.Terminated; c.Name == r.ContainerName && t != nil && t.Reason != "" && t.Reason != "Error" {
					extra = append(extra, "reason "+t.Reason)
				}
			}
		}
		for _, t := range []corev1.PodConditionType{conditions.OOMKilled, conditions.DisruptionTarget} {
			if c := conditions.Find(&p.Status, t); c != nil && c.Status == corev1.ConditionTrue {
				extra = append(extra, strings.TrimSuffix(fmt.Sprintf("%s (%s)", t, c.Reason), " ()"))
			}
		}
	}
	msg := r.Message(p)
	if len(extra) > 0 {
		msg += ": " + strings.Join(extra, ", ")
	}
	return msg
}

// causeOfDeath says in a few words why the pod failed.
func causeOfDeath(p *corev1.Pod, r policy.Result) string {
	if r.ContainerName != "" {
		return fmt.Sprintf("container %s exited %d", r.ContainerName, r.ExitCode)
	}
	if r.ConditionType != "" {
		// The reason says which disruption or which OOM it was (NodeOOMKill,
		// PreemptionByScheduler, MemoryLimitExceeded, ...).
		if c := conditions.Find(&p.Status, r.ConditionType); c != nil && c.Reason != "" {
			return fmt.Sprintf("condition %s (%s)", r.ConditionType, c.Reason)
		}
		return fmt.Sprintf("condition %s", r.ConditionType)
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for _, c := range list {
			if t := c.State.Terminated; t != nil && t.ExitCode != 0 {
				if t.Reason != "" && t.Reason != "Error" {
					return fmt.Sprintf("container %s exited %d (%s)", c.Name, t.ExitCode, t.Reason)
				}
				return fmt.Sprintf("container %s exited %d", c.Name, t.ExitCode)
			}
		}
	}
	if c := conditions.Find(&p.Status, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		return "disrupted (" + c.Reason + ")"
	}
	if p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodFailed {
		return "deleted before it finished"
	}
	if p.Status.Reason != "" {
		return "failed (" + p.Status.Reason + ")"
	}
	return "failed"
}
