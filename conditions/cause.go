package conditions

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// CauseClass is the kind of a pod's cause of death, most specific first: the order in
// which CauseOfDeath looks.
type CauseClass string

const (
	// CauseLimitOOM: coroner.dev/OOMKilled=True, the agent's stamp for an OOM kill over
	// the pod's own memory limit (a container's, the pod-level one, or a child process's).
	CauseLimitOOM CauseClass = "LimitOOM"
	// CauseNodeOOM: DisruptionTarget=True with reason NodeOOMKill, the agent's stamp for a
	// kill by the node's OOM killer (node memory pressure), not the pod's own limit.
	CauseNodeOOM CauseClass = "NodeOOM"
	// CauseDevice: DisruptionTarget=True with reason DeviceFailure (and
	// coroner.dev/DeviceFailed=True), the agent's stamp for a container that died while a
	// device allocated to it had failed.
	CauseDevice CauseClass = "Device"
	// CauseDisruption: DisruptionTarget=True for any other reason (preemption, eviction,
	// the kubelet's termination, a taint, ...).
	CauseDisruption CauseClass = "Disruption"
	// CauseForcefullyTerminated: coroner.dev/ForcefullyTerminated=True, coroner-shim's
	// recovery of a pod on a lost node.
	CauseForcefullyTerminated CauseClass = "ForcefullyTerminated"
	// CauseUnclassifiedOOM: the runtime reports OOMKilled and the agent stamped neither
	// class (it was not running, or had no evidence): limit or node unknown.
	CauseUnclassifiedOOM CauseClass = "UnclassifiedOOM"
	// CauseNonZeroExit: a container exited with a non-zero code, nothing more specific
	// known.
	CauseNonZeroExit CauseClass = "Exit"
	// CausePodReason: no container exit; the pod's own status.reason (Evicted,
	// DeadlineExceeded, ...).
	CausePodReason CauseClass = "PodReason"
	// CauseDeleted: deleted before it finished, with no exit or reason.
	CauseDeleted CauseClass = "Deleted"
	// CauseUnknown: nothing on the pod says why.
	CauseUnknown CauseClass = "Unknown"
)

// Cause is a pod's cause of death as coroner tells it, everywhere: coroner-shim's
// decision Events, `coronerctl explain` and the agent's log render it (String), so that
// they never describe one pod differently.
// It is also what a record of the pod keeps (api/v1alpha1.Entry): the JSON form is part
// of that record's format, and the JobRecord CRD's schema of it is checked against this
// type with the rest of the record's (api/v1alpha1's TestCRDMatchesJobRecord).
type Cause struct {
	Class CauseClass `json:"class"`
	// Condition is the condition the class comes from (empty for the exit, the pod's
	// reason, deleted and unknown), with its reason and its message on one line.
	Condition corev1.PodConditionType `json:"condition,omitempty"`
	Reason    string                  `json:"reason,omitempty"`
	Message   string                  `json:"message,omitempty"`
	// Exit is the first container (init containers first) that exited with a non-zero
	// code or was OOM-killed; nil when none did.
	Exit *CauseExit `json:"exit,omitempty"`
}

// CauseExit is a container's exit within a Cause.
type CauseExit struct {
	Init      bool   `json:"init,omitempty"`
	Container string `json:"container"`
	Code      int32  `json:"code"`
	Signal    int32  `json:"signal,omitempty"`
	// Reason is the runtime's ("OOMKilled", "Error", ...).
	Reason string `json:"reason,omitempty"`
}

// CauseOfDeath reads why p died (or, for a pod still running, what coroner has found so
// far): coroner's OOM class first, then a disruption, coroner-shim's forced termination,
// an OOM kill nobody classified, a container's exit, the pod's own reason, a deletion.
// It reads p only.
func CauseOfDeath(p *corev1.Pod) Cause {
	c := Cause{Class: CauseUnknown, Exit: firstBadExit(p)}
	withCondition := func(class CauseClass, cond *corev1.PodCondition) Cause {
		c.Class, c.Condition, c.Reason, c.Message = class, cond.Type, cond.Reason, oneLine(cond.Message)
		return c
	}
	if cond := FindTrue(p, OOMKilled); cond != nil {
		return withCondition(CauseLimitOOM, cond)
	}
	if cond := FindTrue(p, DisruptionTarget); cond != nil {
		switch cond.Reason {
		case ReasonNodeOOMKill:
			return withCondition(CauseNodeOOM, cond)
		case ReasonDeviceFailure:
			return withCondition(CauseDevice, cond)
		}
		return withCondition(CauseDisruption, cond)
	}
	if cond := FindTrue(p, ForcefullyTerminated); cond != nil {
		return withCondition(CauseForcefullyTerminated, cond)
	}
	switch {
	case c.Exit != nil && c.Exit.Reason == "OOMKilled":
		c.Class = CauseUnclassifiedOOM
	case c.Exit != nil:
		c.Class = CauseNonZeroExit
	case p.Status.Reason != "":
		c.Class, c.Reason, c.Message = CausePodReason, p.Status.Reason, oneLine(p.Status.Message)
	case p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodFailed && p.Status.Phase != corev1.PodSucceeded:
		c.Class = CauseDeleted
	}
	return c
}

// String is the cause on one line, for example
//
//	container main exited 42
//	OOM-killed over its own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded); container main exited 137 (OOMKilled)
//	killed by the node's OOM killer, not over its own limit (DisruptionTarget NodeOOMKill); container main exited 137 (OOMKilled)
//	disrupted (DisruptionTarget PreemptionByScheduler)
//	killed by a failing device (DisruptionTarget DeviceFailure); container main exited 1
//
// The condition's message is left to the places that show a pod in full (explain's
// details); the condition type and reason are always named, so that a reader (and a grep)
// can find the stamp.
func (c Cause) String() string {
	cond := "(" + strings.TrimSpace(string(c.Condition)+" "+c.Reason) + ")"
	var head string
	switch c.Class {
	case CauseLimitOOM:
		head = "OOM-killed over its own memory limit " + cond
	case CauseNodeOOM:
		head = "killed by the node's OOM killer, not over its own limit " + cond
	case CauseDevice:
		head = "killed by a failing device " + cond
	case CauseDisruption:
		head = "disrupted " + cond
	case CauseForcefullyTerminated:
		head = "forcefully terminated by coroner-shim " + cond
	case CauseUnclassifiedOOM:
		return c.Exit.String() + ", an OOM kill coroner-agent did not classify (limit or node unknown)"
	case CauseNonZeroExit:
		return c.Exit.String()
	case CausePodReason:
		return strings.TrimSuffix("pod failed: "+c.Reason+": "+c.Message, ": ")
	case CauseDeleted:
		return "deleted before it finished"
	default:
		return "no container exited with a non-zero code, and nothing on the pod says why"
	}
	if c.Exit != nil {
		head += "; " + c.Exit.String()
	}
	return head
}

// String is the exit in a few words: "container main exited 137 (OOMKilled)". The
// kubelet's "Error", the reason of every plain non-zero exit, is left out.
func (e CauseExit) String() string {
	s := fmt.Sprintf("container %s exited %d", e.Container, e.Code)
	if e.Init {
		s = "init " + s
	}
	if e.Signal != 0 {
		s += fmt.Sprintf(" (signal %d)", e.Signal)
	}
	if e.Reason != "" && e.Reason != "Error" {
		s += " (" + e.Reason + ")"
	}
	return s
}

// firstBadExit is the first container, init containers first, whose current state is an
// exit with a non-zero code or an OOM kill.
func firstBadExit(p *corev1.Pod) *CauseExit {
	for _, list := range []struct {
		init     bool
		statuses []corev1.ContainerStatus
	}{{true, p.Status.InitContainerStatuses}, {false, p.Status.ContainerStatuses}} {
		for _, cs := range list.statuses {
			if t := cs.State.Terminated; t != nil && (t.ExitCode != 0 || t.Reason == "OOMKilled") {
				return &CauseExit{Init: list.init, Container: cs.Name, Code: t.ExitCode, Signal: t.Signal, Reason: t.Reason}
			}
		}
	}
	return nil
}

// FindTrue is p's condition of type t when it is True, else nil.
func FindTrue(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	if c := Find(&p.Status, t); c != nil && c.Status == corev1.ConditionTrue {
		return c
	}
	return nil
}

// oneLine joins the lines of s with "; " and collapses runs of spaces (condition messages
// may hold several lines).
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}
