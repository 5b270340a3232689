package classify

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// status.reason values the kubelet writes when it terminates or rejects a
// pod itself (kubernetes v1.36 pkg/kubelet).
const (
	// PodReasonEvicted: node-pressure eviction (eviction manager).
	PodReasonEvicted = "Evicted"
	// PodReasonNodeShutdownTerminated: graceful node shutdown terminated the
	// pod (node shutdown manager).
	PodReasonNodeShutdownTerminated = "Terminated"
	// PodReasonNodeShutdownRejected: the pod was rejected at admission
	// because the node is shutting down.
	PodReasonNodeShutdownRejected = "NodeShutdown"
	// PodReasonPreempting: the kubelet preempted the pod to admit a critical
	// pod.
	PodReasonPreempting = "Preempting"
)

// kubeletTerminations maps the kubelet's status.reason of a pod it ended to
// the DisruptionTarget message used when the pod's status.message is empty.
// For Preempting the message is always this one: it is the one the kubelet
// itself puts on the condition (the status.message is the Event's text).
var kubeletTerminations = map[string]string{
	PodReasonEvicted:                "Pod was evicted by the kubelet.",
	PodReasonNodeShutdownTerminated: "Pod was terminated in response to imminent node shutdown.",
	PodReasonNodeShutdownRejected:   "Pod was rejected as the node is shutting down.",
	PodReasonPreempting:             "Pod was preempted by Kubelet to accommodate a critical pod.",
}

// RunState is what a container is doing, for StampsForPod.
type RunState string

const (
	// StateUnknown: nothing known (no status yet, or waiting to be created:
	// it may be starting right now).
	StateUnknown RunState = ""
	// StateRunning: running.
	StateRunning RunState = "Running"
	// StateExited: exited, with ExitCode and FinishedAt.
	StateExited RunState = "Exited"
	// StateWaitingAfterExit: exited before and waiting to be restarted
	// (CrashLoopBackOff): stopped, but never "succeeded", as the kubelet
	// counts it.
	StateWaitingAfterExit RunState = "WaitingAfterExit"
	// StateNotCreated: the runtime has no container for it: it never
	// started. Only the runtime can say so; a pod status cannot.
	StateNotCreated RunState = "NotCreated"
)

// ContainerState is the state of one container of a pod: from the pod's
// status (ContainerStatesFromPod) or from the runtime.
type ContainerState struct {
	Name       string
	State      RunState
	ExitCode   int32
	FinishedAt time.Time
	// ContainerID (the runtime's, without a scheme), Reason (the runtime's:
	// "Error", "OOMKilled", "Completed"), StartedAt and Attempt (the CRI
	// attempt, the kubelet's restart count) are the runtime's word on an
	// exited container, written into the pod's container statuses with a
	// terminal phase (TerminatedStatuses); empty when not known.
	ContainerID string
	Reason      string
	StartedAt   time.Time
	Attempt     int32
}

// ContainerStatesFromPod reads the containers' states (app and init) from
// the pod's status. A container waiting after a termination is
// StateWaitingAfterExit with that termination's exit code and time; a
// container waiting for its first start, or without a status, is
// StateUnknown.
func ContainerStatesFromPod(pod *corev1.Pod) []ContainerState {
	var out []ContainerState
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, st := range statuses {
			s := ContainerState{Name: st.Name}
			switch {
			case st.State.Running != nil:
				s.State = StateRunning
			case st.State.Terminated != nil:
				s.State, s.ExitCode, s.FinishedAt = StateExited, st.State.Terminated.ExitCode, st.State.Terminated.FinishedAt.Time
			case st.State.Waiting != nil && st.LastTerminationState.Terminated != nil:
				last := st.LastTerminationState.Terminated
				s.State, s.ExitCode, s.FinishedAt = StateWaitingAfterExit, last.ExitCode, last.FinishedAt.Time
			}
			out = append(out, s)
		}
	}
	return out
}

// PodDecision is what StampsForPod decided.
type PodDecision struct {
	// Stamps to write now, at most one.
	Stamps []Stamp
	// RecheckAt, when not zero, is when to decide again: a terminal phase
	// will be due then unless the kubelet writes one first.
	RecheckAt time.Time
	// Why says why no (further) stamp is due yet, for the log.
	Why string
}

// StampsForPod decides the pod-level stamps of a pod on this node, as of
// now. observed are the containers' states as the runtime reports them, which
// take precedence over the pod's status (the kubelet may be slow to report,
// or gone); nil means the pod's status alone. grace is how long the kubelet
// has, after the last container exit, to write a terminal phase itself
// (the agent's --phase-grace, default 5s). pod is not modified.
//
// A3, kubelet-initiated termination. A pod whose status.reason says the
// kubelet ended it (Evicted; Terminated or NodeShutdown, graceful node
// shutdown; Preempting, the kubelet's preemption for a critical pod) and that
// has no DisruptionTarget=True gets DisruptionTarget=True, reason
// TerminationByKubelet, with the pod's status.message as message (as the
// kubelets that add it do; for Preempting the kubelet's own fixed text), as
// soon as it is seen. Newer kubelets add that condition themselves; older
// ones (and kubelets with the feature off) do not, and a podFailurePolicy
// "Ignore on DisruptionTarget" rule would count the eviction as the pod's
// failure. Such a pod also gets phase Failed, if the kubelet has not set a
// terminal phase, once its containers have stopped (below).
//
// A4, pods being deleted. A pod with a deletionTimestamp whose phase is still
// Pending or Running gets a terminal phase once all its containers have
// stopped: Succeeded when every app container exited 0, else Failed, the rule
// the kubelet applies to a pod it terminates (kubernetes getPhase with
// podIsTerminal: the restartPolicy does not matter, nothing restarts any
// more). Without it a Job with podReplacementPolicy Failed (the default with
// a podFailurePolicy) never replaces the pod (KEP-3939's risk "Pods are not
// guaranteed to transition to a terminal phase").
//
// "All stopped" means every app container exited (or, by the runtime's word,
// never started: Failed, as the kubelet's ContainerStatusUnknown) and no
// init container (sidecars included) is running. A container that is
// running, or whose state is unknown, makes the decision wait, with no
// RecheckAt: its exit is an event of its own. The phase is due grace after
// the last container exit (for a pod being deleted, after the deletion began
// if that is later); until then the decision is RecheckAt. A static pod's
// mirror pod is left alone: the kubelet owns it.
//
// The phase stamp carries the runtime's exits that the pod's container
// statuses lack (Stamp.Terminated): with the kubelet gone, they still say
// running, and an onExitCodes rule could not match the exit code.
//
// The kubelet's word wins: a pod already Failed or Succeeded never gets a
// phase, and a DisruptionTarget already True is never replaced.
func StampsForPod(pod *corev1.Pod, observed []ContainerState, now time.Time, grace time.Duration) PodDecision {
	if pod == nil {
		return PodDecision{}
	}
	var cond *corev1.PodCondition
	reason := pod.Status.Reason
	fallback, byKubelet := kubeletTerminations[reason]
	if byKubelet && !conditions.IsTrue(&pod.Status, conditions.DisruptionTarget) {
		msg := pod.Status.Message
		if msg == "" || reason == PodReasonPreempting {
			msg = fallback
		}
		cond = &corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: conditions.ReasonTerminationByKubelet, Message: msg, LastTransitionTime: metav1.NewTime(now)}
	}
	condOnly := func(why string, recheck time.Time) PodDecision {
		d := PodDecision{Why: why, RecheckAt: recheck}
		if cond != nil {
			d.Stamps = []Stamp{{Kind: KindTerminationByKubelet, Reason: reason, Condition: cond,
				Message: fmt.Sprintf("the kubelet ended the pod (%s): %s", reason, cond.Message)}}
		}
		return d
	}

	deleting := pod.DeletionTimestamp != nil
	switch {
	case conditions.IsTerminalPhase(pod.Status.Phase):
		return condOnly("phase is already "+string(pod.Status.Phase), time.Time{})
	case !byKubelet && !deleting:
		return PodDecision{Why: "not being deleted and not ended by the kubelet"}
	case isMirrorPod(pod):
		return condOnly("a static pod's phase is the kubelet's", time.Time{})
	}

	st := stoppedState(pod, observed)
	if st.blocker != "" {
		return condOnly(st.blocker, time.Time{})
	}
	ref := st.lastFinished
	if deleting {
		if ds := deletionStart(pod); ds.After(ref) {
			ref = ds
		}
	}
	if due := ref.Add(grace); now.Before(due) {
		return condOnly(fmt.Sprintf("all containers stopped; the kubelet has until %s to set a terminal phase", due.UTC().Format(time.RFC3339)), due)
	}

	phase := corev1.PodFailed
	if !byKubelet && st.allSucceeded {
		phase = corev1.PodSucceeded
	}
	var why string
	switch {
	case byKubelet:
		why = fmt.Sprintf("the kubelet ended the pod (%s) and all its containers have stopped, but its phase is still %s", reason, phaseOf(pod))
	default:
		why = fmt.Sprintf("the pod is being deleted and all its containers have stopped, but its phase is still %s", phaseOf(pod))
	}
	s := Stamp{Kind: KindTerminalPhase, Reason: string(phase), Phase: phase, Condition: cond,
		Message: fmt.Sprintf("phase %s: %s", phase, why), Terminated: exitsToWrite(pod, observed)}
	if cond != nil {
		s.Kind, s.Reason = KindTerminationByKubelet, reason
	}
	return PodDecision{Stamps: []Stamp{s}}
}

type stopped struct {
	blocker      string // why not all stopped; empty when all are
	allSucceeded bool
	lastFinished time.Time
}

func stoppedState(pod *corev1.Pod, observed []ContainerState) stopped {
	states := map[string]ContainerState{}
	for _, s := range ContainerStatesFromPod(pod) {
		states[s.Name] = s
	}
	for _, s := range observed {
		states[s.Name] = s
	}
	st := stopped{allSucceeded: true}
	for _, c := range pod.Spec.InitContainers {
		s := states[c.Name]
		if s.State == StateRunning {
			return stopped{blocker: fmt.Sprintf("init container %s is running", c.Name)}
		}
		if s.FinishedAt.After(st.lastFinished) {
			st.lastFinished = s.FinishedAt
		}
	}
	for _, c := range pod.Spec.Containers {
		s := states[c.Name]
		switch s.State {
		case StateRunning:
			return stopped{blocker: fmt.Sprintf("container %s is running", c.Name)}
		case StateUnknown:
			return stopped{blocker: fmt.Sprintf("container %s has not been seen to exit", c.Name)}
		case StateExited:
			st.allSucceeded = st.allSucceeded && s.ExitCode == 0
		case StateWaitingAfterExit, StateNotCreated:
			st.allSucceeded = false
		}
		if s.FinishedAt.After(st.lastFinished) {
			st.lastFinished = s.FinishedAt
		}
	}
	if len(pod.Spec.Containers) == 0 {
		st.allSucceeded = false
	}
	return st
}

// deletionStart approximates when the pod's deletion was requested:
// deletionTimestamp minus the grace period it was given.
func deletionStart(pod *corev1.Pod) time.Time {
	t := pod.DeletionTimestamp.Time
	if pod.DeletionGracePeriodSeconds != nil {
		t = t.Add(-time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second)
	}
	return t
}

func isMirrorPod(pod *corev1.Pod) bool {
	_, ok := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return ok
}

func phaseOf(pod *corev1.Pod) string {
	if pod.Status.Phase == "" {
		return "empty"
	}
	return string(pod.Status.Phase)
}
