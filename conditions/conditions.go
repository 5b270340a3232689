package conditions

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Find returns the condition of type t in status, or nil. The pointer is into
// status.Conditions: writing through it changes status.
func Find(status *corev1.PodStatus, t corev1.PodConditionType) *corev1.PodCondition {
	if status == nil {
		return nil
	}
	for i := range status.Conditions {
		if status.Conditions[i].Type == t {
			return &status.Conditions[i]
		}
	}
	return nil
}

// IsTrue reports whether status has a condition of type t with status True.
func IsTrue(status *corev1.PodStatus, t corev1.PodConditionType) bool {
	c := Find(status, t)
	return c != nil && c.Status == corev1.ConditionTrue
}

// Set adds c to status.Conditions, or updates the condition of the same type,
// and reports whether that changed anything a reader cares about.
//
// The condition written is c, with these rules:
//   - lastTransitionTime: kept when the condition exists and its status does
//     not change; otherwise (new condition or status change) it is
//     c.LastTransitionTime when the caller set it (for example the time an
//     exit was observed), else now. Times are truncated to seconds, the
//     precision the API server stores, so that what Set computes is what a
//     later read returns.
//   - lastProbeTime and observedGeneration: a zero value in c keeps the
//     existing value (coroner does not probe, and the condition may carry an
//     observedGeneration written by someone else); a non-zero value is
//     written.
//   - status, reason and message are always written.
//
// Set returns true when the condition is new or its status, reason or message
// changed, or a non-zero lastProbeTime or observedGeneration in c differs;
// when it returns false, status is left exactly as it was.
func Set(status *corev1.PodStatus, c corev1.PodCondition, now metav1.Time) bool {
	old := Find(status, c.Type)
	if old == nil {
		if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = now
		}
		c.LastTransitionTime = seconds(c.LastTransitionTime)
		c.LastProbeTime = seconds(c.LastProbeTime)
		status.Conditions = append(status.Conditions, c)
		return true
	}

	changed := old.Status != c.Status || old.Reason != c.Reason || old.Message != c.Message
	if c.ObservedGeneration != 0 && c.ObservedGeneration != old.ObservedGeneration {
		changed = true
	}
	if probe := seconds(c.LastProbeTime); !probe.IsZero() && !probe.Equal(&old.LastProbeTime) {
		changed = true
	}
	if !changed {
		return false
	}

	if old.Status != c.Status {
		if c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = now
		}
		old.LastTransitionTime = seconds(c.LastTransitionTime)
	}
	if c.ObservedGeneration != 0 {
		old.ObservedGeneration = c.ObservedGeneration
	}
	if !c.LastProbeTime.IsZero() {
		old.LastProbeTime = seconds(c.LastProbeTime)
	}
	old.Status = c.Status
	old.Reason = c.Reason
	old.Message = c.Message
	return true
}

// seconds truncates t to the precision of its RFC 3339 serialization.
func seconds(t metav1.Time) metav1.Time {
	if t.IsZero() {
		return t
	}
	return metav1.NewTime(t.UTC().Truncate(time.Second))
}
