package jobsync

import (
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/indexes"
	"github.com/coroner-dev/coroner/shim/nodeblame"
	"github.com/coroner-dev/coroner/shim/record"
)

// EventReasonInvalidFailureCount is the reason of the Warning Event that names a failed
// pod's garbage batch.kubernetes.io/job-index-(ignored-)failure-count annotation.
const EventReasonInvalidFailureCount = "InvalidIndexFailureCount"

// maxUncountedPods bounds the UIDs one sync adds to status.uncountedTerminatedPods, which
// keeps the Job object small (the built-in controller's limit).
const maxUncountedPods = 500

// Messages of the Job conditions, the built-in controller's.
const (
	msgBackoffLimitExceeded     = "Job has reached the specified backoff limit"
	msgDeadlineExceeded         = "Job was active longer than specified deadline"
	msgMaxFailedIndexesExceeded = "Job has exceeded the specified maximal number of failed indexes"
	msgFailedIndexes            = "Job has failed indexes"
	msgCompletionsReached       = "Reached expected number of succeeded pods"
)

// state is one sync's working memory.
type state struct {
	in     Input
	job    *batchv1.Job
	status batchv1.JobStatus // the new status, built in place
	now    metav1.Time
	plan   Plan

	indexed     bool
	completions int  // only for Jobs with completions
	perIndex    bool // backoffLimitPerIndex

	active      []*corev1.Pod
	ready       int32
	terminating int32

	uncountedSucceeded, uncountedFailed sets.Set[types.UID]

	succeeded, failed int32 // counted + uncounted + newly finished (failed: not Ignore-d)

	prevSucceededIdx, succeededIdx indexes.Set
	prevFailedIdx, failedIdx       indexes.Set
	delayed                        map[int]*corev1.Pod // per index: a failed pod kept until its replacement exists

	finished *batchv1.JobCondition // the condition the Job is heading to, if any
	requeue  time.Duration

	memory  *v1alpha1.MemoryRetry // the Job's coroner.dev/oom-memory-retry, if valid
	memPlan map[int]memoryChoice  // the memory of new pods by index (memory.go)

	avoid   v1alpha1.Avoidance        // the Job's avoidance of failed nodes (nodeblame.go)
	budget  v1alpha1.DisruptionBudget // the Job's disruption budget, if valid
	stories map[int]nodeblame.Story   // by index (noIndex: the Job); nil without opt-in
}

// Sync decides what to do for in.Job. See the package documentation.
func Sync(in Input) Plan {
	job := in.Job
	if mode := ptr.Deref(job.Spec.CompletionMode, batchv1.NonIndexedCompletion); mode != batchv1.NonIndexedCompletion && mode != batchv1.IndexedCompletion {
		return Plan{Skip: "unknown completion mode", Events: []Event{{corev1.EventTypeWarning, "UnknownCompletionMode", "Skipped Job sync because completion mode is unknown"}}}
	}
	if err := indexes.CheckLimits(&job.Spec); err != nil {
		return Plan{Skip: "beyond the backoffLimitPerIndex size limits", Events: []Event{{corev1.EventTypeWarning, "JobTooLarge", "coroner does not manage this Job: " + err.Error()}}}
	}
	if finishedCondition(job) != nil {
		// Done: nothing but the tracking finalizers of pods left over.
		var plan Plan
		for _, p := range in.Pods {
			if hasTrackingFinalizer(p) && !in.FinalizersBeingRemoved.Has(p.UID) {
				plan.RemoveFinalizer = append(plan.RemoveFinalizer, p)
				if p.Status.Phase != corev1.PodSucceeded {
					plan.Leaving = append(plan.Leaving, record.Of(p, record.Decision{Outcome: v1alpha1.OutcomeDeleted, Why: "left after the Job finished, not counted"}, metav1.NewTime(in.Now.Truncate(time.Second))))
				}
			}
		}
		return plan
	}

	var verdictWait time.Duration
	in.Pods, verdictWait = awaitVerdicts(in)

	s := &state{in: in, job: job, status: *job.Status.DeepCopy(), now: metav1.NewTime(in.Now.Truncate(time.Second))}
	s.requeueAfter(verdictWait)
	s.indexed = isIndexed(job)
	if job.Spec.Completions != nil {
		s.completions = int(*job.Spec.Completions)
	}
	s.perIndex = s.indexed && job.Spec.BackoffLimitPerIndex != nil
	s.readMemoryRetry()
	s.readNodeBlame()
	if s.status.UncountedTerminatedPods == nil {
		s.status.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{}
	}
	s.uncountedSucceeded = sets.New(s.status.UncountedTerminatedPods.Succeeded...)
	s.uncountedFailed = sets.New(s.status.UncountedTerminatedPods.Failed...)
	for _, p := range in.Pods {
		switch {
		case isActive(p):
			s.active = append(s.active, p)
			if isReady(p) {
				s.ready++
			}
		case isTerminating(p):
			s.terminating++
		}
	}

	s.sayUnschedulable()

	newSucceeded, newFailed := s.newlyFinished()
	s.succeeded = s.status.Succeeded + int32(len(newSucceeded)) + int32(s.uncountedSucceeded.Len())
	s.failed = s.status.Failed + int32(s.uncountedFailed.Len())
	for _, p := range newFailed {
		if s.match(p).CountsAsFailure() {
			s.failed++
		}
	}
	if s.status.StartTime == nil && !suspended(job) {
		s.status.StartTime = ptr.To(s.now)
	}
	s.plan.Retries = in.Retries.Fold(newSucceeded, backoff.Delaying(newFailed)) // pods lost with their node do not delay

	s.decideFinish()
	active := int32(len(s.active))
	if s.finished != nil {
		why := "job failed: " + s.finished.Reason
		if t := s.finished.Type; t == batchv1.JobComplete || t == batchv1.JobSuccessCriteriaMet {
			why = "job succeeded: " + s.finished.Reason
		}
		deleted, deletedReady := s.deletePods(s.active, false, why)
		if int(deleted) != len(s.active) || !in.ExpectationsSatisfied {
			// Pods remain, or the informer may not show every pod yet: not finished yet.
			s.finished = nil
		}
		active -= deleted
		s.terminating += deleted
		s.ready -= deletedReady
	} else {
		managed := false
		if in.ExpectationsSatisfied && job.DeletionTimestamp == nil {
			active = s.manage()
			managed = true
		}
		var complete bool
		if job.Spec.Completions == nil {
			complete = s.succeeded > 0 && active == 0
		} else {
			complete = s.succeeded >= int32(s.completions) && active == 0
		}
		if complete {
			s.finished = s.condition(batchv1.JobSuccessCriteriaMet, batchv1.JobReasonCompletionsReached, msgCompletionsReached)
		} else if managed {
			s.updateSuspended()
		}
	}
	s.status.Active = active
	s.status.Ready = ptr.To(s.ready)
	s.status.Terminating = ptr.To(s.terminating)

	s.track()

	s.plan.Status = s.status
	s.plan.WriteStatus = !equality.Semantic.DeepEqual(job.Status, s.status)
	if s.requeue > 0 {
		s.plan.RequeueAfter = backoff.RequeueDelay(s.requeue)
	}
	s.plan.Observations.PodsFinished = map[string]int{}
	if d := int(s.status.Succeeded - job.Status.Succeeded); d > 0 {
		s.plan.Observations.PodsFinished["succeeded"] = d
	}
	if d := int(s.status.Failed - job.Status.Failed); d > 0 {
		s.plan.Observations.PodsFinished["failed"] = d
	}
	return s.plan
}

// tracked: the pod still has the tracking finalizer and no removal is in flight.
func (s *state) tracked(p *corev1.Pod) bool {
	return hasTrackingFinalizer(p) && !s.in.FinalizersBeingRemoved.Has(p.UID)
}

// validIndex: the pod's index when the Job is Indexed and it is in range, else noIndex.
func (s *state) validIndex(p *corev1.Pod) int {
	if !s.indexed {
		return noIndex
	}
	ix := completionIndex(p)
	if ix >= s.completions {
		return noIndex
	}
	return ix
}

// newlyFinished returns the tracked pods that finished and are not yet recorded in
// uncountedTerminatedPods.
func (s *state) newlyFinished() (succeeded, failed []*corev1.Pod) {
	for _, p := range s.in.Pods {
		if !s.tracked(p) || (s.indexed && s.validIndex(p) == noIndex) {
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded && !s.uncountedSucceeded.Has(p.UID) {
			succeeded = append(succeeded, p)
		}
		if isFailed(p, s.job) && !s.uncountedFailed.Has(p.UID) {
			failed = append(failed, p)
		}
	}
	return succeeded, failed
}

func (s *state) requeueAfter(d time.Duration) {
	if d > 0 && (s.requeue == 0 || d < s.requeue) {
		s.requeue = d
	}
}

// adjust: see Plan.Adjust.
func adjust(p *Plan, old *batchv1.JobStatus, failedCreates int, failedDeletes []*corev1.Pod) {
	if failedCreates == 0 && len(failedDeletes) == 0 {
		return
	}
	p.Status.Active -= int32(failedCreates)
	p.Status.Active += int32(len(failedDeletes))
	var ready int32
	for _, d := range failedDeletes {
		if isReady(d) {
			ready++
		}
	}
	p.Status.Ready = ptr.To(ptr.Deref(p.Status.Ready, 0) + ready)
	p.Status.Terminating = ptr.To(max(ptr.Deref(p.Status.Terminating, 0)-int32(len(failedDeletes)), 0))
	if len(failedDeletes) > 0 {
		// A terminal condition assumed that every pod was gone.
		p.Status.Conditions = slices.DeleteFunc(p.Status.Conditions, func(c batchv1.JobCondition) bool {
			return (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && findCondition(old.Conditions, c.Type) == nil
		})
		if findCondition(old.Conditions, batchv1.JobComplete) == nil {
			p.Status.CompletionTime = old.CompletionTime
		}
		p.Observations.JobFinished = nil
		p.Events = slices.DeleteFunc(p.Events, func(e Event) bool { return e.Reason == "Completed" || e.Reason == "TooManySucceededPods" })
	}
	p.WriteStatus = !equality.Semantic.DeepEqual(*old, p.Status)
}
