package jobsync

// Finalizer tracking: finished pods counted into the status through
// uncountedTerminatedPods, and when a pod's tracking finalizer may go.

import (
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/observe"
	"github.com/coroner-dev/coroner/shim/policy"
	"github.com/coroner-dev/coroner/shim/record"
)

// track records newly finished pods in uncountedTerminatedPods (or completedIndexes),
// counts the pods recorded earlier whose finalizer is gone, plans finalizer removals,
// adds the interim and terminal conditions, and says what to tell the user.
func (s *state) track() {
	job := s.job
	uncounted := s.status.UncountedTerminatedPods
	withFinalizer := sets.New[types.UID]()
	for _, p := range s.in.Pods {
		if s.tracked(p) {
			withFinalizer.Insert(p.UID)
		}
	}
	// Pods recorded by an earlier sync whose finalizer is gone are now counted (when the
	// write that follows the removals, CountRemoved's, did not count them already).
	gone := sets.New[types.UID]()
	for _, u := range slices.Concat(uncounted.Succeeded, uncounted.Failed) {
		if !withFinalizer.Has(u) {
			gone.Insert(u)
		}
	}
	CountRemoved(&s.status, gone)

	pods := s.in.Pods
	if s.indexed {
		pods = byIndex(pods)
	}
	failures := map[string]int{}
	reachedMax := false
	added := 0
	for _, p := range pods {
		if !s.tracked(p) {
			continue
		}
		considerFailed := isFailed(p, job)
		if !s.canRemoveFinalizer(p, considerFailed) {
			continue
		}
		s.plan.RemoveFinalizer = append(s.plan.RemoveFinalizer, p)
		ix := s.validIndex(p)
		switch {
		case p.Status.Phase == corev1.PodSucceeded && !s.uncountedFailed.Has(p.UID):
			// An Indexed Job records a success in completedIndexes (decideFinish
			// added the index already); others go through uncountedTerminatedPods.
			if !s.indexed && !s.uncountedSucceeded.Has(p.UID) {
				uncounted.Succeeded = append(uncounted.Succeeded, p.UID)
				added++
			}
			// Not recorded: a success stays a pod (until its Job goes), the least telling
			// of stories, and recording them would cost every successful Job writes.
		case considerFailed || (s.finished != nil && s.finished.Type != batchv1.JobSuccessCriteriaMet):
			r := s.match(p)
			if s.uncountedFailed.Has(p.UID) {
				// Counted by an earlier sync, which also recorded it unless that record
				// write failed after the status write (the controller runs them side by
				// side): recorded again, which changes nothing but the entry's time when
				// it was stored.
				s.leave(p, s.decision(p, r, ix))
				break
			}
			if s.indexed && ix == noIndex {
				s.leave(p, record.Decision{Outcome: v1alpha1.OutcomeIgnored, Consequence: "not counted: its completion index is out of range"})
				break
			}
			action := string(r.Action)
			if !r.Matched() {
				action = "None"
			}
			failures[action]++
			if r.CountsAsFailure() {
				uncounted.Failed = append(uncounted.Failed, p.UID)
				added++
			}
			if v, ok := s.newBudgetVerdict(p); ok && considerFailed {
				if s.plan.BudgetVerdicts == nil {
					s.plan.BudgetVerdicts = map[types.UID]string{}
				}
				s.plan.BudgetVerdicts[p.UID] = v.String()
				s.observeBudget(v)
			}
			if g, grows := s.growths(p); grows && considerFailed {
				s.explainGrowth(p, g, ix)
			} else if v, spent := s.budgetSpent(p); spent && considerFailed {
				s.explainSpent(p, v, r, ix)
			} else if considerFailed && !s.explainDevice(p, r, ix) {
				s.explainFailure(p, r, ix)
			}
			s.leave(p, s.decision(p, r, ix))
		default:
			// Leaves without counting: the Job was deleted, or it succeeded while the
			// pod ran.
			s.leave(p, record.Decision{Outcome: v1alpha1.OutcomeDeleted})
		}
		if added >= maxUncountedPods {
			reachedMax = true
			break
		}
	}
	if len(failures) > 0 {
		s.plan.Observations.PodFailures = failures
	}
	if s.indexed {
		s.status.Succeeded = int32(s.succeededIdx.Count())
		s.status.CompletedIndexes = s.succeededIdx.String()
		if s.perIndex {
			s.status.FailedIndexes = ptr.To(s.failedIdx.String())
		}
		s.plan.Observations.FinishedIndexes = map[string]int{}
		if d := s.succeededIdx.Count() - s.prevSucceededIdx.Count(); d > 0 {
			s.plan.Observations.FinishedIndexes["succeeded"] = d
		}
		if d := s.failedIdx.Count() - s.prevFailedIdx.Count(); d > 0 {
			s.plan.Observations.FinishedIndexes["failed"] = d
		}
	}

	if s.finished != nil && s.finished.Type == batchv1.JobFailureTarget {
		s.status.Conditions = append(s.status.Conditions, *s.finished)
		s.finished = s.condition(batchv1.JobFailed, s.finished.Reason, s.finished.Message)
	}
	if s.finished != nil && s.finished.Type == batchv1.JobSuccessCriteriaMet {
		if c := findCondition(s.status.Conditions, batchv1.JobSuccessCriteriaMet); c == nil || c.Status != corev1.ConditionTrue {
			s.status.Conditions = append(s.status.Conditions, *s.finished)
		}
		s.finished = s.condition(batchv1.JobComplete, s.finished.Reason, s.finished.Message)
	}
	// The terminal condition waits until every pod is counted, none is terminating and
	// no tracking finalizer is left to remove (this write would precede the removal),
	// and comes at the earliest one write after its interim condition (FailureTarget,
	// SuccessCriteriaMet), which is thus always observable, as with the built-in
	// controller's two writes in one sync.
	if s.finished == nil || reachedMax || len(uncounted.Succeeded)+len(uncounted.Failed) > 0 || s.terminating > 0 {
		return
	}
	if len(s.plan.RemoveFinalizer) > 0 {
		s.requeueAfter(backoff.MinRequeue)
		return
	}
	if interim := findCondition(job.Status.Conditions, interimOf(s.finished.Type)); interim == nil || interim.Status != corev1.ConditionTrue {
		s.requeueAfter(backoff.MinRequeue)
		return
	}
	fin := s.finished
	s.setCondition(fin.Type, fin.Status, fin.Reason, fin.Message)
	done := &observe.JobFinished{Succeeded: fin.Type == batchv1.JobComplete, Reason: fin.Reason}
	s.plan.Observations.JobFinished = done
	if done.Succeeded {
		s.status.CompletionTime = ptr.To(s.now)
		if job.Spec.Completions != nil && s.status.Succeeded > *job.Spec.Completions {
			s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, "TooManySucceededPods", "Too many succeeded pods running after completion count reached"})
		}
		s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeNormal, "Completed", "Job completed"})
		return
	}
	if fin.Reason == batchv1.JobReasonPodFailurePolicy {
		// The decision was announced, in these words, when it was taken
		// (explainFailure): one Event per decision.
		return
	}
	s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, fin.Reason, fin.Message})
}

// interimOf names the interim condition that precedes a terminal one.
func interimOf(t batchv1.JobConditionType) batchv1.JobConditionType {
	if t == batchv1.JobComplete {
		return batchv1.JobSuccessCriteriaMet
	}
	return batchv1.JobFailureTarget
}

// canRemoveFinalizer: a finished pod's finalizer goes unless it is a failed pod of an
// index waiting for its replacement (KEP-3850); everything goes once the Job ends.
func (s *state) canRemoveFinalizer(p *corev1.Pod, considerFailed bool) bool {
	if s.job.DeletionTimestamp != nil || s.finished != nil || p.Status.Phase == corev1.PodSucceeded {
		return true
	}
	if !considerFailed {
		return false
	}
	if s.perIndex {
		if ix := completionIndex(p); ix != noIndex {
			if w, ok := s.delayed[ix]; ok && w.UID == p.UID {
				return false
			}
		}
	}
	return true
}

// LeavesCache reports whether pod, a pod of job whose tracking finalizer the shim removes,
// may leave the shim's pod cache once counted (the removal then adds
// conditions.CountedLabel, which the cache's selector excludes). A pod that finished and
// is counted is read by no later sync: the Job's status holds its count and its index
// (completedIndexes, failedIndexes, the per-index failure counts carried by the index's
// next pod, whose creation the failed pod's finalizer waits for). Five kinds stay:
//
//   - a pod that has not finished (a pod deleted with the Job, or by its end, while it
//     runs): it is terminating, which status.terminating and podReplacementPolicy count
//     until it is gone;
//   - a finished pod that is being deleted, or that node-failure recovery failed
//     (coroner.dev/ForcefullyTerminated): recovery force-deletes such a pod when its node
//     is unreachable and no kubelet will confirm the deletion (shim/recovery's
//     DeleteTerminal and FinishDeletion), which it can only do to a pod it sees; it goes
//     from the cache when it is gone;
//   - a failed pod that matches a FailJob rule of the Job's podFailurePolicy: the sync
//     that counts it writes FailureTarget only if it may finish the Job then (its
//     expectations satisfied, every active pod deleted); otherwise a later sync finds
//     the rule's match among the failed pods again (failJobMessage), as the built-in
//     controller does;
//   - a failed pod of a Job with the coroner.dev/oom-memory-retry annotation (valid or
//     not: it may be corrected): the memory of its index's next pod is planned from the
//     failed pods (planMemory), and that pod may be created syncs after the failure is
//     counted (a global backoff, expectations not yet satisfied). An annotation added to
//     a running Job grows the memory from the failures still cached, which are those
//     since it was added;
//   - a failed pod whose death blamed its node (conditions.NodeBlame), and every failed
//     pod of a Job with a coroner.dev/disruption-budget (valid or not): the next pod of
//     its index is given the nodes to avoid and the failures charged from the failed
//     pods, and may be created syncs after the failure is counted (nodeblame.go). Such
//     deaths are rare; the avoidance may be the shim's default (--avoid-failed-nodes), so
//     the pods stay whatever the Job's annotations.
//
// TestCountedPodsAreNotRead plays Jobs through syncs with and without the pods that
// leave, and finds the same decisions.
func LeavesCache(job *batchv1.Job, pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || conditions.IsTrue(&pod.Status, conditions.ForcefullyTerminated) {
		return false
	}
	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return true
	case corev1.PodFailed:
		if _, memoryRetry := job.Annotations[v1alpha1.AnnotationOOMMemoryRetry]; memoryRetry {
			return false
		}
		if _, budget := job.Annotations[v1alpha1.AnnotationDisruptionBudget]; budget {
			return false
		}
		if _, _, blamed := conditions.NodeBlame(pod); blamed {
			return false
		}
		return policy.Match(job.Spec.PodFailurePolicy, pod).Action != batchv1.PodFailurePolicyActionFailJob
	default:
		return false
	}
}

// CountRemoved counts the pods of status.uncountedTerminatedPods whose tracking finalizer
// is gone (removed: the removals that succeeded, or found the pod gone): their UIDs move
// from uncountedTerminatedPods.succeeded and .failed to status.succeeded and
// status.failed. It reports whether status changed. Nothing else is decided: a pod
// recorded there was already judged by the sync that recorded it (its index in
// completedIndexes or failedIndexes, its Events and its JobRecord entry).
func CountRemoved(status *batchv1.JobStatus, removed sets.Set[types.UID]) bool {
	u := status.UncountedTerminatedPods
	if u == nil || removed.Len() == 0 {
		return false
	}
	count := func(uids []types.UID) ([]types.UID, int32) {
		kept := slices.DeleteFunc(slices.Clone(uids), removed.Has)
		return kept, int32(len(uids) - len(kept))
	}
	succeeded, s := count(u.Succeeded)
	failed, f := count(u.Failed)
	if s == 0 && f == 0 {
		return false
	}
	u.Succeeded, u.Failed = succeeded, failed
	status.Succeeded += s
	status.Failed += f
	return true
}
