package quarantine

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

// DeathOf is pod's death when conditions.NodeBlame blames its node; ok is false
// otherwise. observed is when the controller saw it (DeathTime).
func DeathOf(pod *corev1.Pod, observed time.Time) (node string, d Death, ok bool) {
	node, class, ok := conditions.NodeBlame(pod)
	if !ok {
		return "", Death{}, false
	}
	return node, Death{
		Pod:   types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}.String(),
		UID:   pod.UID,
		Class: class,
		At:    DeathTime(pod, observed),
	}, true
}

// DeathTime is when pod died, as its status tells: the latest finish of its containers
// and of the True conditions that say why it died (DisruptionTarget,
// coroner.dev/DeviceFailed, coroner.dev/ForcefullyTerminated); observed when the status
// tells none, or a later time (clocks differ), so that a death is never in the future.
// The status, not the time the controller saw it, is what places a death in the window
// across a restart of the shim, which lists again the failed pods it has not counted.
func DeathTime(pod *corev1.Pod, observed time.Time) time.Time {
	var at time.Time
	later := func(t time.Time) {
		if t.After(at) {
			at = t
		}
	}
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			if t := s.State.Terminated; t != nil {
				later(t.FinishedAt.Time)
			}
		}
	}
	for _, c := range pod.Status.Conditions {
		switch c.Type {
		case conditions.DisruptionTarget, conditions.DeviceFailed, conditions.ForcefullyTerminated:
			if c.Status == corev1.ConditionTrue {
				later(c.LastTransitionTime.Time)
			}
		}
	}
	if at.IsZero() || at.After(observed) {
		return observed
	}
	return at
}
