// Package policy decides what a Job's podFailurePolicy (KEP-3329) says about
// one failed pod. It is a pure function of two objects: no client, no context,
// no clock. The caller decides that the pod has failed; Match does not look at
// the pod's phase.
//
// The semantics follow the built-in Job controller of Kubernetes v1.36:
//
//   - Rules are tried in order and the first one that matches decides. A nil
//     policy, or one without rules, matches nothing.
//   - A rule whose action is not FailJob, Ignore, Count or FailIndex is
//     skipped, and matching goes on with the next rule, as the API asks of
//     clients that meet an action they do not know.
//   - onExitCodes looks only at the current state of each container
//     (state.terminated.exitCode), first through the app container statuses
//     and then through the init container statuses, each in status order.
//     Containers that are running or waiting have no exit code and are passed
//     over; so is the last termination state of a restarted container.
//     Containers that exited with code 0 never match, under In or NotIn.
//     containerName, when set, restricts the check to the container of that
//     name. An operator other than In or NotIn matches nothing.
//   - onPodConditions matches when the pod has a condition of the pattern's
//     type and status. When several patterns match, the reported condition is
//     the first matching one in the pod's own condition order.
//   - A rule that sets both onExitCodes and onPodConditions (which API
//     validation rejects) is judged by onExitCodes alone; a rule that sets
//     neither never matches.
//   - A failure that matches no rule is counted, like one matching Count.
//     Only Ignore keeps a failure out of status.failed and the backoff
//     counters.
//
// Choices that differ from upstream, where upstream relies on API defaulting
// or a feature gate:
//
//   - A pattern with an empty status is taken to mean True. The API server
//     defaults it to True, so this changes nothing for stored Jobs, but it
//     lets offline checks (coronerctl) give the same answer on a manifest
//     that was never defaulted. Upstream compares the status literally.
//   - FailIndex is always honoured. Upstream skips such a rule when the
//     JobBackoffLimitPerIndex feature gate is off; the gate has been GA and
//     locked on since Kubernetes 1.33. Match does not check that the Job uses
//     backoffLimitPerIndex: API validation already requires it for FailIndex.
//   - A nil pod matches nothing (upstream would panic).
package policy

import (
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// Result is the outcome of matching one failed pod against a podFailurePolicy.
// The zero Result means that no rule matched.
type Result struct {
	// RuleIndex is the index of the matching rule in the policy's rules. It is
	// meaningful only when Matched reports true.
	RuleIndex int
	// Action is the matching rule's action; empty when no rule matched.
	Action batchv1.PodFailurePolicyAction

	// ContainerName, InitContainer and ExitCode describe the container whose
	// exit code matched an onExitCodes rule; they are zero otherwise.
	ContainerName string
	InitContainer bool
	ExitCode      int32

	// ConditionType is the pod condition that matched an onPodConditions
	// rule; empty otherwise.
	ConditionType corev1.PodConditionType
}

// Matched reports whether a rule of the policy matched the pod.
func (r Result) Matched() bool {
	return r.Action != ""
}

// CountsAsFailure reports whether the failure is added to status.failed and
// to the backoff counters (backoffLimit, and backoffLimitPerIndex for the
// pod's index). It is true when no rule matched and for Count, FailJob and
// FailIndex; it is false only for Ignore.
func (r Result) CountsAsFailure() bool {
	return r.Action != batchv1.PodFailurePolicyActionIgnore
}

// Message describes the result for people: for the Job's Failed condition
// when the action is FailJob, and for Events. pod must be the pod that was
// matched. The FailJob texts are the built-in controller's, word for word, so
// that users and tools see the same condition message; the other actions use
// the same sentences with their own action name.
func (r Result) Message(pod *corev1.Pod) string {
	var namespace, name string
	if pod != nil {
		namespace, name = pod.Namespace, pod.Name
	}
	switch {
	case !r.Matched():
		return fmt.Sprintf("Pod %s/%s failed and matched no pod failure policy rule", namespace, name)
	case r.ConditionType != "":
		return fmt.Sprintf("Pod %s/%s has condition %v matching %v rule at index %d",
			namespace, name, r.ConditionType, r.Action, r.RuleIndex)
	default:
		return fmt.Sprintf("Container %s for pod %s/%s failed with exit code %v matching %v rule at index %d",
			r.ContainerName, namespace, name, r.ExitCode, r.Action, r.RuleIndex)
	}
}

// Match returns the first rule of p that matches the failed pod, or the zero
// Result when none does. See the package documentation for the semantics.
func Match(p *batchv1.PodFailurePolicy, pod *corev1.Pod) Result {
	if p == nil || pod == nil {
		return Result{}
	}
	for i, rule := range p.Rules {
		if !knownAction(rule.Action) {
			continue
		}
		switch {
		case rule.OnExitCodes != nil:
			if r, ok := matchExitCodes(&pod.Status, rule.OnExitCodes); ok {
				r.RuleIndex, r.Action = i, rule.Action
				return r
			}
		case rule.OnPodConditions != nil:
			if t, ok := matchConditions(pod.Status.Conditions, rule.OnPodConditions); ok {
				return Result{RuleIndex: i, Action: rule.Action, ConditionType: t}
			}
		}
	}
	return Result{}
}

func knownAction(a batchv1.PodFailurePolicyAction) bool {
	switch a {
	case batchv1.PodFailurePolicyActionFailJob,
		batchv1.PodFailurePolicyActionIgnore,
		batchv1.PodFailurePolicyActionCount,
		batchv1.PodFailurePolicyActionFailIndex:
		return true
	}
	return false
}

// matchExitCodes looks for a terminated container that satisfies req, app
// containers first, then init containers.
func matchExitCodes(status *corev1.PodStatus, req *batchv1.PodFailurePolicyOnExitCodesRequirement) (Result, bool) {
	if cs, ok := firstExitMatch(status.ContainerStatuses, req); ok {
		return Result{ContainerName: cs.Name, ExitCode: cs.State.Terminated.ExitCode}, true
	}
	if cs, ok := firstExitMatch(status.InitContainerStatuses, req); ok {
		return Result{ContainerName: cs.Name, InitContainer: true, ExitCode: cs.State.Terminated.ExitCode}, true
	}
	return Result{}, false
}

// firstExitMatch returns the first status in statuses whose container has
// terminated with a non-zero exit code that satisfies req. The returned
// status always has State.Terminated set.
func firstExitMatch(statuses []corev1.ContainerStatus, req *batchv1.PodFailurePolicyOnExitCodesRequirement) (corev1.ContainerStatus, bool) {
	for _, cs := range statuses {
		term := cs.State.Terminated
		if term == nil || term.ExitCode == 0 {
			continue
		}
		if req.ContainerName != nil && *req.ContainerName != cs.Name {
			continue
		}
		if exitCodeSatisfies(term.ExitCode, req) {
			return cs, true
		}
	}
	return corev1.ContainerStatus{}, false
}

func exitCodeSatisfies(code int32, req *batchv1.PodFailurePolicyOnExitCodesRequirement) bool {
	switch req.Operator {
	case batchv1.PodFailurePolicyOnExitCodesOpIn:
		return slices.Contains(req.Values, code)
	case batchv1.PodFailurePolicyOnExitCodesOpNotIn:
		return !slices.Contains(req.Values, code)
	}
	return false
}

// matchConditions returns the type of the first pod condition, in the pod's
// order, that satisfies any of the patterns.
func matchConditions(conds []corev1.PodCondition, patterns []batchv1.PodFailurePolicyOnPodConditionsPattern) (corev1.PodConditionType, bool) {
	for _, c := range conds {
		for _, pat := range patterns {
			want := pat.Status
			if want == "" {
				want = corev1.ConditionTrue
			}
			if c.Type == pat.Type && c.Status == want {
				return c.Type, true
			}
		}
	}
	return "", false
}
