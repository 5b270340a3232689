package jobsync

// Device verdicts (issue 37): the Event that says what coroner made of a failed pod that
// coroner-agent judged by its devices, and what the metrics count of it. The wait for the
// verdict is verdict.go's.

import (
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/observe"
	"github.com/coroner-dev/coroner/shim/policy"
)

// Reasons of the Events about device verdicts.
const (
	// EventReasonDeviceFailure: the pod died of a failing device (coroner-agent's
	// DisruptionTarget DeviceFailure); Normal when a rule Ignored it, Warning otherwise.
	EventReasonDeviceFailure = conditions.ReasonDeviceFailure
	// EventReasonNoDeviceFailure: coroner-agent found no failing device
	// (coroner.dev/DeviceFailed=False), and the policy decided as for any failure.
	EventReasonNoDeviceFailure = conditions.ReasonNoDeviceFailure
	// EventReasonDeviceVerdictMissing (Warning): the pod was decided without the device
	// verdict, which did not come within --device-verdict-wait.
	EventReasonDeviceVerdictMissing = "DeviceVerdictMissing"
)

// explainDevice adds the one Event about a failed pod whose story is a device verdict,
// instead of explainFailure's PodFailurePolicy Event, and records the metrics of it; it
// reports whether it did. A pod that a device killed always has one (when coroner runs the
// Job, whatever its policy: without a rule that spares it, the reader learns that it
// counted); a pod found healthy, or decided without a verdict, has one only when the
// verdict could change what the policy did (policy.DeviceVerdictMatters), the case the
// shim waits for.
func (s *state) explainDevice(p *corev1.Pod, r policy.Result, ix int) bool {
	pfp := s.job.Spec.PodFailurePolicy
	verdict, judged := conditions.DeviceVerdictOf(p)
	matters := policy.DeviceVerdictMatters(pfp, p)
	var eventType, reason, text, label string
	switch {
	case judged && verdict.Failed:
		resource := verdict.FailedResource(p)
		label, reason, text = observe.VerdictDeviceFailure, EventReasonDeviceFailure, verdict.Message()
		if text == "" {
			text = conditions.CauseOfDeath(p).String()
		}
		if s.plan.Observations.DeviceFailures == nil {
			s.plan.Observations.DeviceFailures = map[observe.DeviceFailure]int{}
		}
		s.plan.Observations.DeviceFailures[observe.DeviceFailure{Resource: resourceLabel(resource), Action: actionLabel(r)}]++
	case judged && matters:
		label, reason = observe.VerdictNoDeviceFailure, EventReasonNoDeviceFailure
		text = "coroner-agent found no failing device"
		if m := verdict.Message(); m != "" {
			text += " (" + m + ")"
		}
		text += ": " + conditions.CauseOfDeath(p).String()
	case !judged && matters:
		death, ok := policy.AwaitsDeviceVerdict(pfp, p)
		if !ok {
			return false
		}
		label, reason, eventType = observe.VerdictMissing, EventReasonDeviceVerdictMissing, corev1.EventTypeWarning
		within := fmt.Sprintf("none came within %s of %s's exit", s.in.DeviceVerdictWait, containerName(death))
		if s.in.DeviceVerdictWait <= 0 {
			within = "coroner-shim runs with --device-verdict-wait=0"
		}
		text = fmt.Sprintf("judged without coroner-agent's device verdict (%s; is coroner-agent running on node %s?): %s",
			within, nodeName(p), conditions.CauseOfDeath(p))
	default:
		return false
	}
	if matters {
		if death, ok := policy.DeviceDeathOf(p); ok {
			s.plan.Observations.DeviceVerdicts = append(s.plan.Observations.DeviceVerdicts,
				observe.DeviceVerdict{Verdict: label, Seconds: max(0, s.in.Now.Sub(death.FinishedAt).Seconds())})
		}
	}
	if eventType == "" {
		eventType = corev1.EventTypeWarning
		if r.Action == batchv1.PodFailurePolicyActionIgnore {
			eventType = corev1.EventTypeNormal
		}
	}
	who := fmt.Sprintf("pod %s/%s", p.Namespace, p.Name)
	if ix != noIndex {
		who += fmt.Sprintf(" (index %d)", ix)
	}
	msg := fmt.Sprintf("%s: %s; %s (%s)", who, text, s.consequence(p, r, ix), s.ruleWords(r))
	s.plan.Events = append(s.plan.Events, Event{eventType, reason, msg})
	return true
}

// ruleWords names the rule that decided a failure: "podFailurePolicy rule 0: Ignore on
// DisruptionTarget", "... FailJob on container main exit code 1", "no podFailurePolicy
// rule matched", "no podFailurePolicy".
func (s *state) ruleWords(r policy.Result) string {
	switch {
	case s.job.Spec.PodFailurePolicy == nil || len(s.job.Spec.PodFailurePolicy.Rules) == 0:
		return "no podFailurePolicy"
	case !r.Matched():
		return "no podFailurePolicy rule matched"
	case r.ConditionType != "":
		return fmt.Sprintf("podFailurePolicy rule %d: %s on %s", r.RuleIndex, r.Action, r.ConditionType)
	}
	c := "container " + r.ContainerName
	if r.InitContainer {
		c = "init " + c
	}
	return fmt.Sprintf("podFailurePolicy rule %d: %s on %s exit code %d", r.RuleIndex, r.Action, c, r.ExitCode)
}

// resourceLabel bounds the resource label of the metrics: DRA claims are named per pod
// template, so all of them are "claim".
func resourceLabel(resource string) string {
	switch {
	case resource == "":
		return "unknown"
	case strings.HasPrefix(resource, "claim:"):
		return "claim"
	}
	return resource
}

// actionLabel is the action label of a decision, as coroner_pod_failures_handled_by_failure_policy_total's.
func actionLabel(r policy.Result) string {
	if !r.Matched() {
		return "None"
	}
	return string(r.Action)
}

func containerName(d policy.DeviceDeath) string {
	if d.Init {
		return "init container " + d.Container
	}
	return "container " + d.Container
}

func nodeName(p *corev1.Pod) string {
	if p.Spec.NodeName == "" {
		return "(none)"
	}
	return p.Spec.NodeName
}
