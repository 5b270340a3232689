package jobsync

// The Job's end: whether this sync finishes it, and why (backoff limits, the active
// deadline, failed indexes, the success policy).

import (
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/indexes"
)

// decideFinish evaluates, in the built-in controller's order, whether the Job is heading
// to an end: an earlier SuccessCriteriaMet or FailureTarget, a FailJob rule, the backoff
// limit, the active deadline, the per-index limits, the success policy.
func (s *state) decideFinish() {
	job := s.job
	if c := findCondition(job.Status.Conditions, batchv1.JobSuccessCriteriaMet); c != nil && c.Status == corev1.ConditionTrue {
		s.finished = c.DeepCopy()
	}
	if s.finished == nil {
		if c := findCondition(job.Status.Conditions, batchv1.JobFailureTarget); c != nil && c.Status == corev1.ConditionTrue {
			s.finished = s.condition(batchv1.JobFailed, c.Reason, c.Message)
		} else if msg, ok := s.failJobMessage(); ok {
			s.finished = s.condition(batchv1.JobFailureTarget, batchv1.JobReasonPodFailurePolicy, msg)
		}
	}
	if s.finished == nil {
		switch {
		case s.failed > ptr.Deref(job.Spec.BackoffLimit, 6) || s.pastBackoffLimitOnFailure():
			s.finished = s.condition(batchv1.JobFailureTarget, batchv1.JobReasonBackoffLimitExceeded, msgBackoffLimitExceeded)
		case s.pastActiveDeadline():
			s.finished = s.condition(batchv1.JobFailureTarget, batchv1.JobReasonDeadlineExceeded, msgDeadlineExceeded)
		case job.Spec.ActiveDeadlineSeconds != nil && !suspended(job):
			s.requeueAfter(time.Duration(*job.Spec.ActiveDeadlineSeconds)*time.Second - s.in.Now.Sub(s.status.StartTime.Time))
		}
	}
	if !s.indexed {
		return
	}
	s.prevSucceededIdx = lenientIndexes(job.Status.CompletedIndexes, s.completions)
	s.succeededIdx = s.prevSucceededIdx.Clone()
	// Only pods still tracked add indexes: a pod whose finalizer removal is in flight was
	// written into completedIndexes or failedIndexes by the status write that preceded
	// the removal (and a pod deleted because the Job failed must not become a failed
	// index when the next sync sees it terminating with its finalizer).
	for _, p := range s.in.Pods {
		if ix := s.validIndex(p); ix != noIndex && p.Status.Phase == corev1.PodSucceeded && s.tracked(p) {
			s.succeededIdx.Add(ix)
		}
	}
	s.succeeded = int32(s.succeededIdx.Count())
	if s.perIndex {
		s.prevFailedIdx = lenientIndexes(ptr.Deref(job.Status.FailedIndexes, ""), s.completions)
		s.failedIdx = s.prevFailedIdx.Clone()
		for _, p := range s.in.Pods {
			if ix := s.validIndex(p); ix != noIndex && s.tracked(p) && s.indexFailed(p) {
				s.failedIdx.Add(ix)
			}
		}
		if s.finished == nil {
			failed := s.failedIdx.Count()
			switch {
			case job.Spec.MaxFailedIndexes != nil && failed > int(*job.Spec.MaxFailedIndexes):
				s.finished = s.condition(batchv1.JobFailureTarget, batchv1.JobReasonMaxFailedIndexesExceeded, msgMaxFailedIndexesExceeded)
			case failed > 0 && failed+s.succeededIdx.Count() >= s.completions:
				s.finished = s.condition(batchv1.JobFailureTarget, batchv1.JobReasonFailedIndexes, msgFailedIndexes)
			}
		}
		s.delayed = s.podsAwaitingReplacement()
	}
	if s.finished == nil {
		if msg, ok := matchSuccessPolicy(job.Spec.SuccessPolicy, s.completions, s.succeededIdx); ok {
			s.finished = s.condition(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonSuccessPolicy, msg)
		}
	}
}

// failJobMessage: the message of the first failed pod that matches a FailJob rule.
func (s *state) failJobMessage() (string, bool) {
	if s.job.Spec.PodFailurePolicy == nil {
		return "", false
	}
	for _, p := range s.in.Pods {
		if !isFailed(p, s.job) {
			continue
		}
		if r := s.match(p); r.Action == batchv1.PodFailurePolicyActionFailJob {
			return r.Message(p), true
		}
	}
	return "", false
}

// pastBackoffLimitOnFailure: with restartPolicy OnFailure, failures are container
// restarts of running pods.
func (s *state) pastBackoffLimitOnFailure() bool {
	if s.job.Spec.Template.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
		return false
	}
	var n int32
	for _, p := range s.in.Pods {
		if p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodPending {
			continue
		}
		for _, c := range p.Status.InitContainerStatuses {
			n += c.RestartCount
		}
		for _, c := range p.Status.ContainerStatuses {
			n += c.RestartCount
		}
	}
	limit := ptr.Deref(s.job.Spec.BackoffLimit, 6)
	if limit == 0 {
		return n > 0
	}
	return n >= limit
}

func (s *state) pastActiveDeadline() bool {
	job := s.job
	if job.Spec.ActiveDeadlineSeconds == nil || s.status.StartTime == nil || suspended(job) {
		return false
	}
	return s.in.Now.Sub(s.status.StartTime.Time) >= time.Duration(*job.Spec.ActiveDeadlineSeconds)*time.Second
}

// indexFailed: the pod's failure fails its index (FailIndex, or the per-index limit).
func (s *state) indexFailed(p *corev1.Pod) bool {
	if !isFailed(p, s.job) {
		return false
	}
	r := s.match(p)
	if r.Action == batchv1.PodFailurePolicyActionFailIndex {
		return true
	}
	count, _ := backoff.IndexFailureCount(p)
	return r.CountsAsFailure() && count >= *s.job.Spec.BackoffLimitPerIndex
}

// lenientIndexes reads completedIndexes/failedIndexes as the built-in controller does:
// malformed parts are skipped and indexes at or beyond completions dropped (completions
// of an elastic Indexed Job may have shrunk). Our own writes are always canonical.
func lenientIndexes(s string, completions int) indexes.Set {
	var out indexes.Set
	if s == "" {
		return out
	}
	for part := range strings.SplitSeq(s, ",") {
		set, err := indexes.Parse(part)
		if err != nil {
			continue
		}
		for ix := range set.All() {
			if ix >= completions {
				break
			}
			out.Add(ix)
		}
	}
	return out
}

// matchSuccessPolicy returns the message of the first success policy rule the succeeded
// indexes satisfy: all of a rule's succeededIndexes, or succeededCount of them, or
// succeededCount indexes in all.
func matchSuccessPolicy(sp *batchv1.SuccessPolicy, completions int, succeeded indexes.Set) (string, bool) {
	if sp == nil || succeeded.Count() == 0 {
		return "", false
	}
	for i, rule := range sp.Rules {
		if rule.SucceededIndexes != nil {
			required := lenientIndexes(*rule.SucceededIndexes, completions)
			if required.Count() == 0 {
				continue
			}
			n := 0
			for ix := range required.All() {
				if succeeded.Has(ix) {
					n++
				}
			}
			if n == required.Count() || (rule.SucceededCount != nil && n >= int(*rule.SucceededCount)) {
				return fmt.Sprintf("Matched rules at index %d", i), true
			}
		} else if rule.SucceededCount != nil && succeeded.Count() >= int(*rule.SucceededCount) {
			return fmt.Sprintf("Matched rules at index %d", i), true
		}
	}
	return "", false
}
