package explain

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// startingReasons are the waiting reasons of a container on its normal way to running.
var startingReasons = map[string]bool{"": true, "ContainerCreating": true, "PodInitializing": true}

// classify gives the pod its state and a one-line cause.
func classify(p *corev1.Pod) (PodState, string) {
	switch p.Status.Phase {
	case corev1.PodFailed:
		return StateFailed, conditions.CauseOfDeath(p).String()
	case corev1.PodSucceeded:
		if oom := conditions.FindTrue(p, conditions.OOMKilled); oom != nil {
			return StateSucceeded, "succeeded, but a process of the pod was OOM-killed over its memory limit (" + conditionText(oom) + ")"
		}
		return StateSucceeded, "every container exited 0"
	}
	if p.DeletionTimestamp != nil {
		cause := "being deleted since " + stamp(p.DeletionTimestamp.Time)
		if p.Spec.NodeName != "" {
			cause += ", waiting for node " + p.Spec.NodeName + " to confirm its containers stopped"
		}
		if dt := conditions.FindTrue(p, conditions.DisruptionTarget); dt != nil {
			cause += "; " + conditionText(dt)
		}
		return StateTerminating, cause
	}
	// A container that cannot start, or crash-loops, is not running whatever the phase.
	for _, cs := range allStatuses(p) {
		w := cs.status.State.Waiting
		if w == nil || startingReasons[w.Reason] {
			continue
		}
		if w.Reason == "CrashLoopBackOff" {
			text := fmt.Sprintf("%s %s crash-looping (CrashLoopBackOff)", cs.kind, cs.status.Name)
			if t := cs.status.LastTerminationState.Terminated; t != nil {
				text += ": last " + exitText(t)
			}
			return StateRestarting, text + fmt.Sprintf(", %d restarts", cs.status.RestartCount)
		}
		text := fmt.Sprintf("%s %s waiting: %s", cs.kind, cs.status.Name, w.Reason)
		if w.Message != "" {
			text += ": " + oneLine(w.Message)
		}
		return StateWaiting, text
	}
	var restarts int32
	var last string
	for _, cs := range allStatuses(p) {
		restarts += cs.status.RestartCount
		if t := cs.status.LastTerminationState.Terminated; t != nil && cs.status.RestartCount > 0 {
			last = fmt.Sprintf("%s %s last %s", cs.kind, cs.status.Name, exitText(t))
		}
		if t := cs.status.State.Terminated; t != nil && !cs.init {
			// Exited, to be restarted in place.
			return StateRestarting, fmt.Sprintf("%s %s %s, to be restarted in place (%d restarts so far)", cs.kind, cs.status.Name, exitText(t), cs.status.RestartCount)
		}
	}
	history, _ := v1alpha1.ParseExitHistory(p.Annotations[conditions.AnnotationExitHistory])
	if restarts > 0 || len(history) > 0 {
		text := fmt.Sprintf("running, restarted in place %d times", restarts)
		if len(history) > 0 {
			e := history[len(history)-1]
			last = fmt.Sprintf("container %s last exited %d", e.Container, e.ExitCode)
			if e.Reason != "" {
				last += " (" + e.Reason + ")"
			}
			if e.OOM != "" {
				last += " (OOM kill, " + oomVerdict(e.OOM) + ")"
			}
			if !e.FinishedAt.IsZero() {
				last += " at " + stamp(e.FinishedAt)
			}
		}
		if last != "" {
			text += "; " + last
		}
		return StateRestarting, text
	}
	if p.Status.Phase == corev1.PodRunning {
		if c := conditions.Find(&p.Status, corev1.PodReady); c != nil && c.Status != corev1.ConditionTrue {
			return StateRunning, "running, not ready"
		}
		return StateRunning, "running"
	}
	if c := conditions.Find(&p.Status, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse {
		return StatePending, strings.TrimSuffix("not scheduled: "+c.Reason+": "+oneLine(c.Message), ": ")
	}
	if p.Spec.NodeName == "" {
		return StatePending, "not scheduled yet"
	}
	return StatePending, "containers being created on " + p.Spec.NodeName
}

// details lists what the pod says about its state: container exits and waits, the OOM
// class coroner-agent stamped, a disruption, a forced termination, the pod's reason and
// the exit history of in-place restarts.
func details(p *corev1.Pod) []Line {
	var out []Line
	if given, ok := p.Annotations[v1alpha1.AnnotationMemoryGiven]; ok {
		out = append(out, Line{"memory", "given " + given})
	}
	runtimeOOM := false
	failed := p.Status.Phase == corev1.PodFailed
	for _, cs := range allStatuses(p) {
		switch st := cs.status.State; {
		case st.Terminated != nil:
			t := st.Terminated
			if t.ExitCode == 0 && t.Reason != "OOMKilled" && (failed || p.Status.Phase == corev1.PodSucceeded) {
				continue
			}
			text := fmt.Sprintf("%s %s %s", cs.kind, cs.status.Name, exitText(t))
			if t.Message != "" {
				text += ": " + oneLine(t.Message)
			}
			out = append(out, Line{"exit", text})
			runtimeOOM = runtimeOOM || t.Reason == "OOMKilled"
		case st.Waiting != nil && !startingReasons[st.Waiting.Reason]:
			text := fmt.Sprintf("%s %s %s", cs.kind, cs.status.Name, st.Waiting.Reason)
			if st.Waiting.Message != "" {
				text += ": " + oneLine(st.Waiting.Message)
			}
			out = append(out, Line{"waiting", text})
		}
		if t := cs.status.LastTerminationState.Terminated; t != nil && !conditions.IsTerminalPhase(p.Status.Phase) {
			out = append(out, Line{"last exit", fmt.Sprintf("%s %s %s, %d restarts", cs.kind, cs.status.Name, exitText(t), cs.status.RestartCount)})
		}
	}
	if failed && len(out) == 0 {
		out = append(out, Line{"exit", "no container exited with a non-zero code"})
	}

	oom := conditions.FindTrue(p, conditions.OOMKilled)
	dt := conditions.FindTrue(p, conditions.DisruptionTarget)
	switch {
	case oom != nil:
		out = append(out, Line{"oom", "over the pod's own memory limit: " + conditionText(oom)})
	case dt != nil && dt.Reason == conditions.ReasonNodeOOMKill:
		out = append(out, Line{"oom", "killed by the node's OOM killer (node memory pressure, not the pod's limit): " + conditionText(dt)})
	case runtimeOOM:
		out = append(out, Line{"oom", fmt.Sprintf("the runtime reports OOMKilled but coroner-agent did not classify it (no %s, no %s reason %s): limit or node unknown",
			conditions.OOMKilled, conditions.DisruptionTarget, conditions.ReasonNodeOOMKill)})
	}
	if dt != nil && dt.Reason != conditions.ReasonNodeOOMKill && dt.Reason != conditions.ReasonDeviceFailure {
		out = append(out, Line{"disruption", conditionText(dt)})
	}
	out = append(out, deviceDetails(p)...)
	if ft := conditions.FindTrue(p, conditions.ForcefullyTerminated); ft != nil {
		out = append(out, Line{"recovery", conditionText(ft)})
	}
	if p.Status.Reason != "" || p.Status.Message != "" {
		out = append(out, Line{"pod", strings.TrimPrefix(p.Status.Reason+": "+oneLine(p.Status.Message), ": ")})
	}
	if v, ok := p.Annotations[conditions.AnnotationExitHistory]; ok {
		entries, err := v1alpha1.ParseExitHistory(v)
		switch {
		case err != nil:
			out = append(out, Line{"history", fmt.Sprintf("%s is malformed: %v", conditions.AnnotationExitHistory, err)})
		case len(entries) > 0:
			var parts []string
			for _, e := range entries {
				s := fmt.Sprintf("%s exited %d", e.Container, e.ExitCode)
				var extra []string
				if e.Reason != "" {
					extra = append(extra, e.Reason)
				}
				if e.OOM != "" {
					extra = append(extra, "oom "+e.OOM)
				}
				if len(extra) > 0 {
					s += " (" + strings.Join(extra, ", ") + ")"
				}
				if !e.FinishedAt.IsZero() {
					s += " at " + stamp(e.FinishedAt)
				}
				parts = append(parts, s)
			}
			out = append(out, Line{"history", "in-place restarts, oldest first: " + strings.Join(parts, "; ")})
		}
	}
	return out
}

// warnings are what a reader of the pod must not miss.
func warnings(p *corev1.Pod) []string {
	var out []string
	if oom := conditions.FindTrue(p, conditions.OOMKilled); oom != nil && p.Status.Phase == corev1.PodSucceeded {
		out = append(out, fmt.Sprintf("the pod Succeeded although coroner-agent stamped %s=True (%s): a child process was OOM-killed over the pod's memory limit while the main process exited 0; "+
			"the Job counts it as a success and no podFailurePolicy rule acts on a Succeeded pod: its output may be incomplete", conditions.OOMKilled, oom.Reason))
	}
	return out
}

func oomVerdict(v string) string {
	switch v {
	case v1alpha1.ExitOOMLimit:
		return "the pod's own limit"
	case v1alpha1.ExitOOMNode:
		return "node memory pressure"
	}
	return "not classified"
}

type statusOf struct {
	kind   string
	init   bool
	status corev1.ContainerStatus
}

// allStatuses are the init containers' statuses, then the containers'.
func allStatuses(p *corev1.Pod) []statusOf {
	var out []statusOf
	for _, cs := range p.Status.InitContainerStatuses {
		out = append(out, statusOf{"init container", true, cs})
	}
	for _, cs := range p.Status.ContainerStatuses {
		out = append(out, statusOf{"container", false, cs})
	}
	return out
}

// exitText is "exited 137 (signal 9) (OOMKilled) at 2026-01-02T03:04:05Z".
func exitText(t *corev1.ContainerStateTerminated) string {
	text := fmt.Sprintf("exited %d", t.ExitCode)
	if t.Signal != 0 {
		text += fmt.Sprintf(" (signal %d)", t.Signal)
	}
	if t.Reason != "" {
		text += " (" + t.Reason + ")"
	}
	if !t.FinishedAt.IsZero() {
		text += " at " + stamp(t.FinishedAt.Time)
	}
	return text
}

// hasCoronerStamp reports whether coroner wrote on the pod: one of its conditions, a
// DisruptionTarget reason of its own, or the exit history.
func hasCoronerStamp(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if strings.HasPrefix(string(c.Type), conditions.Prefix) {
			return true
		}
		if c.Type == conditions.DisruptionTarget && (c.Reason == conditions.ReasonNodeOOMKill || c.Reason == conditions.ReasonStaleDisruptionTarget || c.Reason == conditions.ReasonDeviceFailure) {
			return true
		}
	}
	_, ok := p.Annotations[conditions.AnnotationExitHistory]
	return ok
}
