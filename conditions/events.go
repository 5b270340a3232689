package conditions

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Event messages coroner-shim writes on a Job about its pods, for people (kubectl
// describe, kubectl events). Nothing reads them back: coronerctl explain reads the Job's
// JobRecord (package api/v1alpha1).
//
// PodFailurePolicy Events (one per decision about a failed pod):
//
//	pod <namespace>/<name>: <cause>, <rule>: <consequence>
//
// except for the decision that fails the Job (a FailJob rule), whose one Event has the
// built-in controller's wording, the message of the Job's condition, followed by coroner's
// explanation when it adds to it:
//
//	Container <c> for pod <namespace>/<name> failed with exit code <n> matching FailJob rule at index <i>
//	Pod <namespace>/<name> has condition <type> matching FailJob rule at index <i>: reason <reason>
//
// SuccessfulDelete Events: upstream's "Deleted pod: <name>", then the pod's last state, so
// that its exits are still known once it is gone (DeletedPodMessage).
const (
	// PodDecisionPrefix starts coroner's PodFailurePolicy Event messages.
	PodDecisionPrefix = "pod "
	// DeletedPodPrefix starts SuccessfulDelete Event messages, as upstream.
	DeletedPodPrefix = "Deleted pod: "
)

// PodDecisionMessage is the message of a PodFailurePolicy Event about one pod.
func PodDecisionMessage(namespace, name, text string) string {
	return fmt.Sprintf("%s%s/%s: %s", PodDecisionPrefix, namespace, name, text)
}

// DeletedPod is what a SuccessfulDelete Event of coroner-shim records about the pod it
// deleted: its state when the shim deleted it.
type DeletedPod struct {
	Name string
	// Why is the shim's reason for the deletion ("job failed: BackoffLimitExceeded",
	// "excess pod", ...); empty when not recorded.
	Why string
	// Index is the pod's completion index (Indexed Jobs), empty when it has none.
	Index string
	Phase corev1.PodPhase
	// Containers are the init containers then the containers, with a status.
	Containers []DeletedContainer
	// Conditions are the pod's True conditions that tell a cause of death
	// (DisruptionTarget, coroner.dev/OOMKilled, coroner.dev/ForcefullyTerminated), as
	// "Type=True (Reason)".
	Conditions []string
}

// DeletedContainer is the last state of one container of a deleted pod.
type DeletedContainer struct {
	Init bool
	Name string
	// State is "running", "waiting", "exited" or "unknown".
	State string
	// Reason is the waiting or exit reason.
	Reason     string
	ExitCode   int32
	FinishedAt time.Time
	// LastExit is the exit before the current state (lastState), when there is one.
	LastExit *ContainerExit
	Restarts int32
}

// ContainerExit is one exit of a container.
type ContainerExit struct {
	ExitCode   int32
	Reason     string
	FinishedAt time.Time
}

// causeConditions are the pod conditions a deleted pod's Event records.
var causeConditions = []corev1.PodConditionType{DisruptionTarget, OOMKilled, ForcefullyTerminated}

// DeletedPodOf records p as the shim deletes it, why being the shim's reason.
func DeletedPodOf(p *corev1.Pod, why string) DeletedPod {
	d := DeletedPod{Name: p.Name, Why: why, Phase: p.Status.Phase, Index: p.Annotations[JobCompletionIndexAnnotation]}
	for _, list := range []struct {
		init     bool
		statuses []corev1.ContainerStatus
	}{{true, p.Status.InitContainerStatuses}, {false, p.Status.ContainerStatuses}} {
		for _, cs := range list.statuses {
			c := DeletedContainer{Init: list.init, Name: cs.Name, State: "unknown", Restarts: cs.RestartCount}
			switch st := cs.State; {
			case st.Terminated != nil:
				c.State, c.Reason, c.ExitCode, c.FinishedAt = "exited", st.Terminated.Reason, st.Terminated.ExitCode, st.Terminated.FinishedAt.Time
			case st.Waiting != nil:
				c.State, c.Reason = "waiting", st.Waiting.Reason
			case st.Running != nil:
				c.State = "running"
			}
			if t := cs.LastTerminationState.Terminated; t != nil {
				c.LastExit = &ContainerExit{ExitCode: t.ExitCode, Reason: t.Reason, FinishedAt: t.FinishedAt.Time}
			}
			d.Containers = append(d.Containers, c)
		}
	}
	for _, t := range causeConditions {
		if c := Find(&p.Status, t); c != nil && c.Status == corev1.ConditionTrue {
			s := fmt.Sprintf("%s=%s", c.Type, c.Status)
			if c.Reason != "" {
				s += " (" + c.Reason + ")"
			}
			d.Conditions = append(d.Conditions, s)
		}
	}
	return d
}

// DeletedPodMessage is the message of the SuccessfulDelete Event for p, for example
//
//	Deleted pod: train-x7k2p (job failed: BackoffLimitExceeded); phase Running; container main waiting (CrashLoopBackOff), last exited 1 (Error) at 2026-01-02T03:04:05Z, 6 restarts
func DeletedPodMessage(p *corev1.Pod, why string) string {
	return DeletedPodOf(p, why).String()
}

// String is the Event message for d.
func (d DeletedPod) String() string {
	head := DeletedPodPrefix + d.Name
	if d.Why != "" {
		head += " (" + sanitize(d.Why) + ")"
	}
	parts := []string{head}
	if d.Index != "" {
		parts = append(parts, "index "+sanitize(d.Index))
	}
	if d.Phase != "" {
		parts = append(parts, "phase "+string(d.Phase))
	}
	for _, c := range d.Containers {
		s := "container " + c.Name + " "
		if c.Init {
			s = "init " + s
		}
		switch c.State {
		case "exited":
			s += exitText(c.ExitCode, c.Reason, c.FinishedAt)
		case "waiting":
			s += "waiting"
			if c.Reason != "" {
				s += " (" + sanitize(c.Reason) + ")"
			}
		default:
			s += c.State
		}
		if c.LastExit != nil {
			s += ", last " + exitText(c.LastExit.ExitCode, c.LastExit.Reason, c.LastExit.FinishedAt)
		}
		if c.Restarts > 0 {
			s += fmt.Sprintf(", %d restarts", c.Restarts)
		}
		parts = append(parts, s)
	}
	for _, c := range d.Conditions {
		parts = append(parts, "condition "+c)
	}
	return strings.Join(parts, "; ")
}

func exitText(code int32, reason string, at time.Time) string {
	s := fmt.Sprintf("exited %d", code)
	if reason != "" {
		s += " (" + sanitize(reason) + ")"
	}
	if !at.IsZero() {
		s += " at " + at.UTC().Format(time.RFC3339)
	}
	return s
}

// sanitize keeps a free text from breaking the message's structure.
func sanitize(s string) string {
	return strings.NewReplacer(";", ",", "(", "[", ")", "]").Replace(strings.Join(strings.Fields(s), " "))
}
