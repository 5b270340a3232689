package jobsync

// The Job's conditions.

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func (s *state) condition(t batchv1.JobConditionType, reason, message string) *batchv1.JobCondition {
	return &batchv1.JobCondition{
		Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: message,
		LastProbeTime: s.now, LastTransitionTime: s.now,
	}
}

// setCondition adds or updates a Job condition; a missing condition with status False is
// not added. It reports whether anything changed.
func (s *state) setCondition(t batchv1.JobConditionType, status corev1.ConditionStatus, reason, message string) bool {
	if c := findCondition(s.status.Conditions, t); c != nil {
		if c.Status == status && c.Reason == reason && c.Message == message {
			return false
		}
		*c = batchv1.JobCondition{Type: t, Status: status, Reason: reason, Message: message, LastProbeTime: s.now, LastTransitionTime: s.now}
		return true
	}
	if status == corev1.ConditionFalse {
		return false
	}
	s.status.Conditions = append(s.status.Conditions, *s.condition(t, reason, message))
	s.status.Conditions[len(s.status.Conditions)-1].Status = status
	return true
}

func findCondition(list []batchv1.JobCondition, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range list {
		if list[i].Type == t {
			return &list[i]
		}
	}
	return nil
}

// finishedCondition returns the Job's Complete or Failed condition when True.
func finishedCondition(job *batchv1.Job) *batchv1.JobCondition {
	for i, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return &job.Status.Conditions[i]
		}
	}
	return nil
}

func suspended(job *batchv1.Job) bool { return ptr.Deref(job.Spec.Suspend, false) }
