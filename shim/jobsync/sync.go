package jobsync

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/indexes"
	"github.com/coroner-dev/coroner/shim/policy"
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

	newSucceeded, newFailed := s.newlyFinished()
	s.succeeded = s.status.Succeeded + int32(len(newSucceeded)) + int32(s.uncountedSucceeded.Len())
	s.failed = s.status.Failed + int32(s.uncountedFailed.Len())
	for _, p := range newFailed {
		if policy.Match(job.Spec.PodFailurePolicy, p).CountsAsFailure() {
			s.failed++
		}
	}
	if s.status.StartTime == nil && !suspended(job) {
		s.status.StartTime = ptr.To(s.now)
	}
	s.plan.Record = in.Record.Fold(newSucceeded, newFailed)

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
		if r := policy.Match(s.job.Spec.PodFailurePolicy, p); r.Action == batchv1.PodFailurePolicyActionFailJob {
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
	r := policy.Match(s.job.Spec.PodFailurePolicy, p)
	if r.Action == batchv1.PodFailurePolicyActionFailIndex {
		return true
	}
	count, _ := backoff.IndexFailureCount(p)
	return r.CountsAsFailure() && count >= *s.job.Spec.BackoffLimitPerIndex
}

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
		if remaining := s.plan.Record.Remaining(s.in.Now, s.in.Backoff); remaining > 0 {
			s.requeueAfter(remaining)
			return active
		}
	}
	diff = min(diff, MaxPodCreateDeletePerSync)
	reason := s.createReason()
	if !s.indexed {
		for range diff {
			s.plan.Create = append(s.plan.Create, PodCreate{Pod: newPod(job, noIndex, 0, 0), Reason: reason})
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
			if policy.Match(job.Spec.PodFailurePolicy, prev).CountsAsFailure() {
				failures++
			} else {
				ignored++
			}
		}
		s.plan.Create = append(s.plan.Create, PodCreate{Pod: newPod(job, ix, failures, ignored), Reason: reason})
	}
	return active + int32(len(pending))
}

func (s *state) createReason() CreateReason {
	switch {
	case ptr.Deref(s.job.Spec.PodReplacementPolicy, batchv1.TerminatingOrFailed) == batchv1.Failed && s.failed > 0:
		return CreateRecreateFailed
	case s.failed > 0 || s.terminating > 0:
		return CreateRecreateTerminatingOrFailed
	}
	return CreateNew
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
	// Pods recorded by an earlier sync whose finalizer is gone are now counted.
	keep := func(uids []types.UID) []types.UID {
		return slices.DeleteFunc(slices.Clone(uids), func(u types.UID) bool { return !withFinalizer.Has(u) })
	}
	if kept := keep(uncounted.Succeeded); len(kept) != len(uncounted.Succeeded) {
		s.status.Succeeded += int32(len(uncounted.Succeeded) - len(kept))
		uncounted.Succeeded = kept
	}
	if kept := keep(uncounted.Failed); len(kept) != len(uncounted.Failed) {
		s.status.Failed += int32(len(uncounted.Failed) - len(kept))
		uncounted.Failed = kept
	}

	pods := slices.Clone(s.in.Pods)
	if s.indexed {
		slices.SortStableFunc(pods, func(a, b *corev1.Pod) int { return completionIndex(a) - completionIndex(b) })
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
		case considerFailed || (s.finished != nil && s.finished.Type != batchv1.JobSuccessCriteriaMet):
			if s.uncountedFailed.Has(p.UID) || (s.indexed && ix == noIndex) {
				break
			}
			r := policy.Match(job.Spec.PodFailurePolicy, p)
			action := string(r.Action)
			if !r.Matched() {
				action = "None"
			}
			failures[action]++
			if r.CountsAsFailure() {
				uncounted.Failed = append(uncounted.Failed, p.UID)
				added++
			}
			if considerFailed {
				s.explainFailure(p, r, ix)
			}
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
	done := &JobFinished{Succeeded: fin.Type == batchv1.JobComplete, Reason: fin.Reason}
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

// explainFailure adds the one Event that says what coroner made of a failed pod, e.g.
// "pod default/x-2-abcde: container main exited 42, matched rule 0 (FailIndex): index 2
// failed" (conditions.PodDecisionMessage). A FailJob decision has the built-in
// controller's words instead, those of the Job's FailureTarget and Failed conditions, with
// coroner's explanation after them when it adds something (failJobEvent); it is announced
// here, when the decision is taken, and not again when the Job gets its Failed condition.
// Jobs without a pod failure policy and without backoffLimitPerIndex get none: the
// counters say it all.
func (s *state) explainFailure(p *corev1.Pod, r policy.Result, ix int) {
	if s.job.Spec.PodFailurePolicy == nil && !s.perIndex {
		return
	}
	if r.Action == batchv1.PodFailurePolicyActionFailJob {
		s.plan.Events = append(s.plan.Events, Event{corev1.EventTypeWarning, conditions.EventReasonPodFailurePolicy, failJobEvent(p, r)})
		return
	}
	rule := "no rule matched"
	if r.Matched() {
		rule = fmt.Sprintf("matched rule %d (%s)", r.RuleIndex, r.Action)
	}
	eventType := corev1.EventTypeWarning
	var consequence string
	switch {
	case r.Action == batchv1.PodFailurePolicyActionIgnore:
		eventType = corev1.EventTypeNormal
		consequence = "not counted, the pod will be replaced"
	case s.perIndex && ix != noIndex && s.failedIdx.Has(ix):
		consequence = fmt.Sprintf("index %d failed", ix)
	case s.perIndex && ix != noIndex:
		count, _ := backoff.IndexFailureCount(p)
		consequence = fmt.Sprintf("index %d failure %d of %d allowed", ix, count+1, *s.job.Spec.BackoffLimitPerIndex+1)
	default:
		consequence = "counts towards the backoff limit"
	}
	msg := conditions.PodDecisionMessage(p.Namespace, p.Name, fmt.Sprintf("%s, %s: %s", causeOfDeath(p, r), rule, consequence))
	s.plan.Events = append(s.plan.Events, Event{eventType, conditions.EventReasonPodFailurePolicy, msg})
}

// failJobEvent is the message of the Event of a FailJob decision: the built-in
// controller's sentence (the Job condition's message when p is the pod it names), then
// what coroner knows beyond it: the matched condition's reason and the container's exit
// for a condition rule; the runtime's reason and coroner's OOM or disruption stamp for an
// exit code rule. For example "Pod ns/x has condition coroner.dev/OOMKilled matching
// FailJob rule at index 0: reason MemoryLimitExceeded, container main exited 137
// (OOMKilled)".
func failJobEvent(p *corev1.Pod, r policy.Result) string {
	var extra []string
	if r.ConditionType != "" {
		if c := conditions.Find(&p.Status, r.ConditionType); c != nil && c.Reason != "" {
			extra = append(extra, "reason "+c.Reason)
		}
		if exit := causeOfDeath(p, policy.Result{}); strings.HasPrefix(exit, "container ") {
			extra = append(extra, exit)
		}
	} else {
		for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
			for _, c := range list {
				if t := c.State.Terminated; c.Name == r.ContainerName && t != nil && t.Reason != "" && t.Reason != "Error" {
					extra = append(extra, "reason "+t.Reason)
				}
			}
		}
		for _, t := range []corev1.PodConditionType{conditions.OOMKilled, conditions.DisruptionTarget} {
			if c := conditions.Find(&p.Status, t); c != nil && c.Status == corev1.ConditionTrue {
				extra = append(extra, strings.TrimSuffix(fmt.Sprintf("%s (%s)", t, c.Reason), " ()"))
			}
		}
	}
	msg := r.Message(p)
	if len(extra) > 0 {
		msg += ": " + strings.Join(extra, ", ")
	}
	return msg
}

// causeOfDeath says in a few words why the pod failed.
func causeOfDeath(p *corev1.Pod, r policy.Result) string {
	if r.ContainerName != "" {
		return fmt.Sprintf("container %s exited %d", r.ContainerName, r.ExitCode)
	}
	if r.ConditionType != "" {
		// The reason says which disruption or which OOM it was (NodeOOMKill,
		// PreemptionByScheduler, MemoryLimitExceeded, ...).
		if c := conditions.Find(&p.Status, r.ConditionType); c != nil && c.Reason != "" {
			return fmt.Sprintf("condition %s (%s)", r.ConditionType, c.Reason)
		}
		return fmt.Sprintf("condition %s", r.ConditionType)
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for _, c := range list {
			if t := c.State.Terminated; t != nil && t.ExitCode != 0 {
				if t.Reason != "" && t.Reason != "Error" {
					return fmt.Sprintf("container %s exited %d (%s)", c.Name, t.ExitCode, t.Reason)
				}
				return fmt.Sprintf("container %s exited %d", c.Name, t.ExitCode)
			}
		}
	}
	if c := conditions.Find(&p.Status, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		return "disrupted (" + c.Reason + ")"
	}
	if p.DeletionTimestamp != nil && p.Status.Phase != corev1.PodFailed {
		return "deleted before it finished"
	}
	if p.Status.Reason != "" {
		return "failed (" + p.Status.Reason + ")"
	}
	return "failed"
}

func (s *state) requeueAfter(d time.Duration) {
	if d > 0 && (s.requeue == 0 || d < s.requeue) {
		s.requeue = d
	}
}

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

// awaitVerdicts returns the pods as this sync sees them: a Failed pod whose OOM kill
// still waits for the agent's verdict (policy.AwaitingVerdict) is seen as it was a moment
// before, Running: not counted, not replaced, its finalizer kept, until the verdict is in
// or the wait is over. The second result is the shortest wait left, for a requeue. The
// informer's pods are not modified: a waiting pod is a shallow copy with its own status.
func awaitVerdicts(in Input) ([]*corev1.Pod, time.Duration) {
	var pods []*corev1.Pod
	var shortest time.Duration
	for i, p := range in.Pods {
		left := policy.AwaitingVerdict(in.Job, p, in.Now, in.VerdictWait)
		if left <= 0 {
			if pods != nil {
				pods = append(pods, p)
			}
			continue
		}
		if pods == nil {
			pods = append(make([]*corev1.Pod, 0, len(in.Pods)), in.Pods[:i]...)
		}
		view := *p
		view.Status = *p.Status.DeepCopy()
		view.Status.Phase = corev1.PodRunning
		pods = append(pods, &view)
		if shortest == 0 || left < shortest {
			shortest = left
		}
	}
	if pods == nil {
		return in.Pods, 0
	}
	return pods, shortest
}
