package classify

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// Kind says what a Stamp is for; it is the "kind" label of the agent's
// stamp metrics (A8).
type Kind string

const (
	// KindLimitOOM: coroner.dev/OOMKilled=True, reason MemoryLimitExceeded.
	KindLimitOOM Kind = "LimitOOM"
	// KindNodeOOM: DisruptionTarget=True, reason NodeOOMKill.
	KindNodeOOM Kind = "NodeOOM"
	// KindUnknownOOM: nothing to write; an OOM kill nobody could place, for
	// the metric and the log only.
	KindUnknownOOM Kind = "UnknownOOM"
	// KindTerminationByKubelet: DisruptionTarget=True, reason
	// TerminationByKubelet (A3), with phase Failed when that is due too.
	KindTerminationByKubelet Kind = "TerminationByKubelet"
	// KindTerminalPhase: phase Failed or Succeeded for a pod whose
	// containers have all exited (A4, and A3 when the condition is there).
	KindTerminalPhase Kind = "TerminalPhase"
	// KindExitHistory: the coroner.dev/exit-history annotation (A5).
	KindExitHistory Kind = "ExitHistory"
)

// Annotation is a pod annotation to set.
type Annotation struct {
	Key, Value string
}

// Stamp is one write to make on a pod, all of whose parts go in one API
// call:
//
//   - Phase set (Failed or Succeeded): conditions.EnsurePodPhase(pod,
//     Phase, Condition...), which writes nothing at all when the pod's phase
//     is already terminal by then (the kubelet's word wins; the condition
//     then comes with the next decision, which sees a terminal pod);
//   - else Condition set: conditions.EnsurePodCondition;
//   - Annotation set: conditions.EnsurePodAnnotation.
//
// A Stamp with none of them (KindUnknownOOM) is for the metric and the log.
type Stamp struct {
	Kind Kind
	// Reason is the "reason" label of the stamp metrics: the condition's
	// reason (MemoryLimitExceeded, NodeOOMKill), the kubelet's status.reason
	// for TerminationByKubelet (Evicted, Terminated, NodeShutdown,
	// Preempting), the phase for TerminalPhase, "Unknown" for UnknownOOM, and
	// "Recorded" or "Replaced" (a malformed annotation was replaced) for
	// ExitHistory.
	Reason     string
	Condition  *corev1.PodCondition
	Phase      corev1.PodPhase
	Annotation *Annotation
	// Terminated, with Phase, are the runtime's exits of containers whose
	// status in the pod does not say terminated yet (missing, running or
	// waiting): they are written as terminated states into the pod's
	// container statuses in the same write as the phase
	// (TerminatedStatuses, recomputed against the pod as it is then), so that
	// an onExitCodes rule matches the exit code of a pod the kubelet could
	// not finish. Never over a terminated state the kubelet wrote.
	Terminated []ContainerState
	// Message says what and why, for the log and the Stamped Event.
	Message string
}

// Writes reports whether the stamp writes anything.
func (s Stamp) Writes() bool {
	return s.Condition != nil || s.Phase != "" || s.Annotation != nil
}

// Exit is one container exit as the agent saw it.
type Exit struct {
	Container   string
	ContainerID string
	ExitCode    int32
	// Reason is the runtime's reason ("OOMKilled", "Error", "Completed").
	Reason                string
	StartedAt, FinishedAt time.Time
	// RestartCount is the container's restart count while it ran (the
	// kubelet's io.kubernetes.container.restartCount annotation on the CRI
	// container); negative when unknown.
	RestartCount int32
}

// ExitOptions are the agent's settings for StampsForExit.
type ExitOptions struct {
	// History bounds the exit history annotation (--exit-history-size sets
	// MaxEntries); zero fields take exithistory.DefaultLimits'.
	History exithistory.Limits
}

// StampsForExit returns the stamps for one container exit of pod, given
// ClassifyOOM's verdict on it. now is the fallback time of a condition when
// the exit has no finish time. pod is not modified.
//
//   - LimitOOM: coroner.dev/OOMKilled=True, reason MemoryLimitExceeded, with
//     the verdict's message (container, limit, peak), its
//     lastTransitionTime the container's finish time. Not when the pod
//     already has it True: the first OOM kill stays on the pod, the later
//     ones are in the exit history.
//   - NodeOOM: DisruptionTarget=True, reason NodeOOMKill, so that a
//     podFailurePolicy "Ignore on DisruptionTarget" rule treats the kill as
//     the infrastructure failure it is. Not when the pod already has
//     DisruptionTarget=True (whoever set it, with whatever reason, was
//     first and stays), and not when the kubelet will restart the container
//     in place (ContainerWillRestart): the pod goes on running, and a
//     DisruptionTarget on a running pod would claim a disruption that is
//     not happening (the shim clears such a stale condition after two
//     minutes, Z4) and could excuse a later real failure. The exit history
//     records such a kill as "node".
//   - UnknownOOM: a stamp that writes nothing, for the metric and the log.
//     An OOM kill that cannot be placed is left to the pod's own failure
//     policy, as it would be without coroner: a wrong OOMKilled could fail a
//     Job a node problem killed, a wrong DisruptionTarget could retry a
//     buggy pod forever; neither guess is worth it.
//   - The exit history (A5): for a pod whose containers the kubelet restarts
//     in place (restartPolicy OnFailure or Always, or a container with its
//     own restartPolicy), the exit is appended to coroner.dev/exit-history
//     (see package exithistory), when that changes it. Not for a pod being
//     deleted or already terminal: its containers' exits are its end, not
//     restarts, and its container statuses say them.
func StampsForExit(pod *corev1.Pod, v Verdict, e Exit, now time.Time, opts ExitOptions) []Stamp {
	if pod == nil {
		return nil
	}
	var stamps []Stamp
	at := e.FinishedAt
	if at.IsZero() {
		at = now
	}
	cond := func(t corev1.PodConditionType, reason, msg string) *corev1.PodCondition {
		return &corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(at)}
	}

	switch v.Kind {
	case LimitOOM:
		if !conditions.IsTrue(&pod.Status, conditions.OOMKilled) {
			msg := v.Message()
			stamps = append(stamps, Stamp{Kind: KindLimitOOM, Reason: conditions.ReasonMemoryLimitExceeded,
				Condition: cond(conditions.OOMKilled, conditions.ReasonMemoryLimitExceeded, msg), Message: msg})
		}
	case NodeOOM:
		if !conditions.IsTrue(&pod.Status, conditions.DisruptionTarget) && !ContainerWillRestart(pod, e.Container, e.ExitCode) {
			msg := v.Message()
			stamps = append(stamps, Stamp{Kind: KindNodeOOM, Reason: conditions.ReasonNodeOOMKill,
				Condition: cond(conditions.DisruptionTarget, conditions.ReasonNodeOOMKill, msg), Message: msg})
		}
	case UnknownOOM:
		stamps = append(stamps, Stamp{Kind: KindUnknownOOM, Reason: "Unknown",
			Message: fmt.Sprintf("container %s was OOM-killed; whose limit is unknown (%s)", e.Container, v.Basis)})
	}

	if s, ok := historyStamp(pod, v, e, opts); ok {
		stamps = append(stamps, s)
	}
	return stamps
}

func historyStamp(pod *corev1.Pod, v Verdict, e Exit, opts ExitOptions) (Stamp, bool) {
	if !restartsInPlace(pod, e.Container) {
		return Stamp{}, false
	}
	lim := opts.History
	if lim.MaxEntries == 0 {
		lim.MaxEntries = exithistory.DefaultLimits.MaxEntries
	}
	if lim.MaxBytes == 0 {
		lim.MaxBytes = exithistory.DefaultLimits.MaxBytes
	}
	entry := v1alpha1.Exit{
		Container: e.Container, ExitCode: e.ExitCode, Reason: e.Reason,
		FinishedAt: e.FinishedAt, RestartCount: e.RestartCount, OOM: oomField(v.Kind),
	}
	value, changed, err := exithistory.Append(pod.Annotations[conditions.AnnotationExitHistory], entry, lim)
	if err != nil && !errors.Is(err, v1alpha1.ErrMalformedExitHistory) || !changed {
		return Stamp{}, false
	}
	s := Stamp{Kind: KindExitHistory, Reason: "Recorded",
		Annotation: &Annotation{Key: conditions.AnnotationExitHistory, Value: value},
		Message:    fmt.Sprintf("exit %d of container %s recorded in %s", e.ExitCode, e.Container, conditions.AnnotationExitHistory)}
	if err != nil {
		s.Reason = "Replaced"
		s.Message += "; the previous value was replaced: " + err.Error()
	}
	return s, true
}

func oomField(k OOMKind) string {
	switch k {
	case LimitOOM:
		return v1alpha1.ExitOOMLimit
	case NodeOOM:
		return v1alpha1.ExitOOMNode
	case UnknownOOM:
		return v1alpha1.ExitOOMUnknown
	}
	return ""
}

// restartsInPlace reports whether exits of the named container are kept in
// the exit history: the pod is neither being deleted nor terminal, and its
// restartPolicy is OnFailure or Always, or the container has a restartPolicy
// of its own: an app container's (container restart rules), or a native
// sidecar's (an init container with restartPolicy Always, which the kubelet
// restarts in place whatever the pod's restartPolicy, Never included).
func restartsInPlace(pod *corev1.Pod, name string) bool {
	if pod.DeletionTimestamp != nil || conditions.IsTerminalPhase(pod.Status.Phase) {
		return false
	}
	c, _, ok := findContainer(pod, name)
	if !ok {
		return false
	}
	if pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure || pod.Spec.RestartPolicy == corev1.RestartPolicyAlways {
		return true
	}
	return c.RestartPolicy != nil
}

// ContainerWillRestart reports whether the kubelet restarts the named
// container of pod in place after it exited with exitCode, as the kubelet
// decides (kubernetes pkg/api/v1/pod ContainerShouldRestart):
//
//   - never for a pod being deleted or already terminal, or a container
//     not in the spec (ephemeral containers are never restarted);
//   - a sidecar (init container with restartPolicy Always): always;
//   - an ordinary init container: never after exit 0 (it is done),
//     otherwise as an app container;
//   - an app container: its first restartPolicyRules rule matching the exit
//     code (action Restart or RestartAllContainers: restart), else its own
//     restartPolicy, else the pod's (Always: restart; OnFailure: restart
//     unless exit 0; Never: no; empty: Always, the API default).
func ContainerWillRestart(pod *corev1.Pod, name string, exitCode int32) bool {
	if pod == nil || pod.DeletionTimestamp != nil || conditions.IsTerminalPhase(pod.Status.Phase) {
		return false
	}
	c, init, ok := findContainer(pod, name)
	if !ok {
		return false
	}
	if init {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return true
		}
		if exitCode == 0 {
			return false
		}
	}
	return shouldRestart(c, pod.Spec.RestartPolicy, exitCode)
}

func shouldRestart(c *corev1.Container, podPolicy corev1.RestartPolicy, exitCode int32) bool {
	if c.RestartPolicy != nil {
		for _, r := range c.RestartPolicyRules {
			if r.ExitCodes == nil || !matchesExitCodes(*r.ExitCodes, exitCode) {
				continue
			}
			if r.Action == corev1.ContainerRestartRuleActionRestart || r.Action == corev1.ContainerRestartRuleActionRestartAllContainers {
				return true
			}
			break // the first match decides; an unknown action falls back to the policy
		}
		switch *c.RestartPolicy {
		case corev1.ContainerRestartPolicyAlways:
			return true
		case corev1.ContainerRestartPolicyOnFailure:
			return exitCode != 0
		case corev1.ContainerRestartPolicyNever:
			return false
		}
	}
	switch podPolicy {
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	case corev1.RestartPolicyNever:
		return false
	}
	return true
}

func matchesExitCodes(r corev1.ContainerRestartRuleOnExitCodes, code int32) bool {
	in := false
	for _, v := range r.Values {
		if v == code {
			in = true
			break
		}
	}
	switch r.Operator {
	case corev1.ContainerRestartRuleOnExitCodesOpIn:
		return in
	case corev1.ContainerRestartRuleOnExitCodesOpNotIn:
		return !in
	}
	return false
}

// findContainer finds the named container in the pod's spec: app containers
// first, then init containers.
func findContainer(pod *corev1.Pod, name string) (c *corev1.Container, init, ok bool) {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], false, true
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i], true, true
		}
	}
	return nil, false, false
}
