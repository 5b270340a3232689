// Package backoff computes how long the shim waits before it re-creates the
// failed pods of a Job: globally for the Job (requirement S4) or per index
// with backoffLimitPerIndex (S5, S6). Everything here is a pure function of
// pods, a policy and the current time, which callers pass in.
package backoff

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// FinishTime returns when a finished pod finished, the time from which its
// backoff delay runs. It is the first available of (KEP-3850, "Expotential
// backoff delay issue"):
//
//  1. the latest state.terminated.finishedAt of the pod's containers, when
//     every one of them is terminated with finishedAt set;
//  2. the lastTransitionTime of the Ready condition, when its status is False
//     and the time is set (the kubelet sets Ready=False as it moves a pod to
//     a terminal phase, so this covers containers the kubelet lost track of);
//  3. deletionTimestamp minus deletionGracePeriodSeconds (0 when unset), when
//     the pod is being deleted, which approximates when deletion began;
//  4. the pod's creationTimestamp.
//
// It never uses the current time: a time that kept moving forward with each
// sync would keep pushing the end of the backoff away.
//
// As the built-in controller does (getFinishedTime in v1.36), "its
// containers" in step 1 are the entries of status.containerStatuses plus the
// entries of status.initContainerStatuses that belong to sidecars (init
// containers whose spec has restartPolicy Always), because sidecars stop
// after the app containers. Ordinary init containers are ignored: they
// finished before the app containers started. A container without a status
// entry is not waited for, and a pod with no such entries at all has no
// container finish time and falls through to step 2. Only the first Ready
// condition is looked at, as upstream does.
func FinishTime(pod *corev1.Pod) time.Time {
	if t, ok := containersFinishTime(pod); ok {
		return t
	}
	if t, ok := readyFalseTime(pod); ok {
		return t
	}
	if pod.DeletionTimestamp != nil {
		grace := time.Duration(0)
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		return pod.DeletionTimestamp.Add(-grace)
	}
	return pod.CreationTimestamp.Time
}

// containersFinishTime is step 1 of FinishTime.
func containersFinishTime(pod *corev1.Pod) (time.Time, bool) {
	var latest time.Time
	seen := false
	consider := func(st corev1.ContainerStatus) bool {
		term := st.State.Terminated
		if term == nil || term.FinishedAt.IsZero() {
			return false
		}
		if !seen || term.FinishedAt.After(latest) {
			latest = term.FinishedAt.Time
		}
		seen = true
		return true
	}
	for _, st := range pod.Status.ContainerStatuses {
		if !consider(st) {
			return time.Time{}, false
		}
	}
	sidecars := make(map[string]bool)
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars[c.Name] = true
		}
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if sidecars[st.Name] && !consider(st) {
			return time.Time{}, false
		}
	}
	return latest, seen
}

// readyFalseTime is step 2 of FinishTime.
func readyFalseTime(pod *corev1.Pod) (time.Time, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		if c.Status == corev1.ConditionFalse && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time, true
		}
		return time.Time{}, false
	}
	return time.Time{}, false
}
