package jobsync

// Pod management: which pods to create (replacements, pending indexes) and delete, and
// suspension.

import (
	"errors"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/observe"
	"github.com/coroner-dev/coroner/shim/record"
)

// podsAwaitingReplacement returns, per index that is neither finished nor running, the
// failed pod whose finalizer stays until the index's replacement exists: the one with the
// highest failure count (counted + ignored), the latest finished among equals. Its
// annotations seed the replacement's and its finish time starts the per-index backoff.
func (s *state) podsAwaitingReplacement() map[int]*corev1.Pod {
	activeIdx := map[int]bool{}
	for _, p := range s.active {
		if ix := completionIndex(p); ix != noIndex {
			activeIdx[ix] = true
		}
	}
	out := map[int]*corev1.Pod{}
	for _, p := range s.in.Pods {
		ix := s.validIndex(p)
		if !s.tracked(p) || ix == noIndex || !isFailed(p, s.job) {
			continue
		}
		if s.succeededIdx.Has(ix) || s.failedIdx.Has(ix) || activeIdx[ix] {
			continue
		}
		prev, ok := out[ix]
		if !ok || (absoluteFailures(prev) <= absoluteFailures(p) && !backoff.FinishTime(p).Before(backoff.FinishTime(prev))) {
			out[ix] = p
		}
	}
	return out
}

func absoluteFailures(p *corev1.Pod) int32 {
	a, _ := backoff.IndexFailureCount(p)
	b, _ := backoff.IndexIgnoredFailureCount(p)
	return a + b
}

// manage creates and deletes pods towards the wanted number of active pods; it returns
// the number of active pods once the Plan is carried out.
func (s *state) manage() int32 {
	job := s.job
	active := int32(len(s.active))
	if suspended(job) {
		deleted, deletedReady := s.deletePods(podsForRemoval(job, s.active, len(s.active)), true, "job suspended")
		s.terminating += deleted
		s.ready -= deletedReady
		return active - deleted
	}
	parallelism := ptr.Deref(job.Spec.Parallelism, 1)
	var want int32
	if job.Spec.Completions == nil {
		want = parallelism
		if s.succeeded > 0 {
			want = active
		}
	} else {
		want = max(min(int32(s.completions)-s.succeeded, parallelism), 0)
	}
	if rm := podsForRemoval(job, s.active, int(max(active-want, 0))); len(rm) > 0 {
		deleted, deletedReady := s.deletePods(rm, true, "excess pod")
		s.terminating += deleted
		s.ready -= deletedReady
		return active - deleted
	}
	var terminating int32
	if onlyReplaceFailedPods(job) {
		terminating = s.terminating
	}
	diff := want - terminating - active
	if diff <= 0 {
		return active
	}
	if !s.perIndex {
		if remaining := s.plan.Retries.Remaining(s.in.Now, s.in.Backoff); remaining > 0 {
			s.requeueAfter(remaining)
			return active
		}
	}
	diff = min(diff, MaxPodCreateDeletePerSync)
	reason := s.createReason()
	s.planMemory()
	if !s.indexed {
		for range diff {
			pod := newPod(job, noIndex, 0, 0)
			s.giveMemory(pod, noIndex)
			s.giveAvoidance(pod, noIndex)
			s.plan.Create = append(s.plan.Create, PodCreate{Pod: pod, Reason: reason})
		}
		return active + diff
	}
	pending := s.firstPendingIndexes(int(diff))
	if s.perIndex {
		ready, wait := backoff.ReadyIndexes(s.in.Now, s.in.Backoff, pending, s.delayed)
		if wait > 0 {
			s.requeueAfter(wait)
		}
		pending = ready
	}
	for _, ix := range pending {
		var failures, ignored int32
		if prev := s.delayed[ix]; prev != nil {
			var errF, errI error
			failures, errF = backoff.IndexFailureCount(prev)
			ignored, errI = backoff.IndexIgnoredFailureCount(prev)
			if err := errors.Join(errF, errI); err != nil {
				// Counted as 0, as the built-in controller does; said once, when the
				// replacement that carries the count on is made.
				s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, EventReasonInvalidFailureCount,
					fmt.Sprintf("%v: counted as 0 for the replacement of index %d", err, ix)})
			}
			if s.match(prev).CountsAsFailure() {
				failures++
			} else {
				ignored++
			}
		}
		pod := newPod(job, ix, failures, ignored)
		s.giveMemory(pod, ix)
		s.giveAvoidance(pod, ix)
		s.plan.Create = append(s.plan.Create, PodCreate{Pod: pod, Reason: reason})
	}
	return active + int32(len(pending))
}

func (s *state) createReason() observe.CreateReason {
	switch {
	case ptr.Deref(s.job.Spec.PodReplacementPolicy, batchv1.TerminatingOrFailed) == batchv1.Failed && s.failed > 0:
		return observe.CreateRecreateFailed
	case s.failed > 0 || s.terminating > 0:
		return observe.CreateRecreateTerminatingOrFailed
	}
	return observe.CreateNew
}

// firstPendingIndexes returns up to count indexes, lowest first, that are neither
// succeeded, failed, running, nor (under podReplacementPolicy Failed) terminating.
func (s *state) firstPendingIndexes(count int) []int {
	taken := s.succeededIdx.Union(s.failedIdx)
	for _, p := range s.in.Pods {
		if isActive(p) || (onlyReplaceFailedPods(s.job) && isTerminating(p)) {
			if ix := completionIndex(p); ix != noIndex {
				taken.Add(ix)
			}
		}
	}
	var out []int
	for ix := 0; ix < s.completions && len(out) < count; ix++ {
		if !taken.Has(ix) {
			out = append(out, ix)
		}
	}
	return out
}

// deletePods plans the deletion of up to MaxPodCreateDeletePerSync pods and returns how
// many, and how many of them were ready.
func (s *state) deletePods(pods []*corev1.Pod, removeFinalizerFirst bool, reason string) (deleted, deletedReady int32) {
	for _, p := range pods[:min(len(pods), MaxPodCreateDeletePerSync)] {
		s.plan.Delete = append(s.plan.Delete, PodDelete{Pod: p, RemoveFinalizerFirst: removeFinalizerFirst, Reason: reason})
		s.leave(p, record.Decision{Outcome: v1alpha1.OutcomeDeleted, Why: reason})
		deleted++
		if isReady(p) {
			deletedReady++
		}
	}
	return deleted, deletedReady
}

// updateSuspended keeps the Suspended condition in line with spec.suspend; suspending
// clears startTime, resuming sets it anew (activeDeadlineSeconds counts continuous
// activity).
func (s *state) updateSuspended() {
	if suspended(s.job) {
		if s.setCondition(batchv1.JobSuspended, corev1.ConditionTrue, conditions.JobReasonSuspended, "Job suspended") {
			s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeNormal, conditions.EventReasonSuspended, "Job suspended"})
			s.status.StartTime = nil
		}
		return
	}
	if s.setCondition(batchv1.JobSuspended, corev1.ConditionFalse, conditions.JobReasonResumed, "Job resumed") {
		s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeNormal, conditions.EventReasonResumed, "Job resumed"})
		s.status.StartTime = ptr.To(s.now)
	}
}
