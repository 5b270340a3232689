package main

import (
	"fmt"
	"sort"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// jobCheck is what checkStormJob found for one Job.
type jobCheck struct {
	Lost, Double int
	// Overlap is the largest time two attempts of one index ran at once (seconds), at
	// OverlapIndex.
	Overlap      float64
	OverlapIndex int
	// Problems are the bars missed, each said in a sentence.
	Problems []string
	// Notes are facts worth printing that miss no bar.
	Notes []string
}

func (c *jobCheck) problem(format string, args ...any) {
	c.Problems = append(c.Problems, fmt.Sprintf(format, args...))
}

// checkStormJob compares a finished storm Job with its pods' own record and with the
// outcome it has without faults: Complete, every index succeeded once, no failed index,
// status.failed equal to the attempts that exited non-zero, the failure count carried by
// each index's succeeding pod equal to its index's failures, no index run twice at once.
// ignoredExits are exits the runtime reported with another code than the pod's own
// (containerd 2.x after its restart: 255 Unknown), which the Job may count in addition.
func checkStormJob(s stormJob, j *batchv1.Job, truth jobTruth, pods []*corev1.Pod) jobCheck {
	var c jobCheck
	c.Overlap, c.OverlapIndex = truth.maxOverlap()
	if c.Overlap > 0 {
		var who []string
		for _, a := range truth[c.OverlapIndex] {
			who = append(who, fmt.Sprintf("%s on %s [%.2f, %.2f]", a.Pod, a.Node, a.Start, a.End))
		}
		c.problem("index %d ran twice at once for %.2fs: %v", c.OverlapIndex, c.Overlap, who)
	}

	// The workload itself: every index in Fail failed exactly once, no other did.
	truthFailures := truth.failures()
	for _, ix := range s.Fail {
		if n := truth.failuresOf(ix); n != 1 && finishedOK(j) {
			c.problem("harness: index %d was to fail once, its pods recorded %d failures", ix, n)
		}
	}

	if j == nil {
		c.problem("the Job is gone")
		return c
	}
	fc := finishedCondition(j)
	switch {
	case fc == nil:
		c.problem("the Job did not finish: active %d, succeeded %d, failed %d, completedIndexes %q, failedIndexes %v",
			j.Status.Active, j.Status.Succeeded, j.Status.Failed, j.Status.CompletedIndexes, strOrNil(j.Status.FailedIndexes))
	case fc.Type != batchv1.JobComplete:
		c.problem("the Job ended %s (%s: %s), without faults it completes", fc.Type, fc.Reason, fc.Message)
	}
	if got, want := j.Status.Succeeded, *j.Spec.Completions; got != want {
		c.problem("status.succeeded %d, want %d", got, want)
	}
	if got, want := j.Status.CompletedIndexes, indexRange(*j.Spec.Completions); got != want && fc != nil {
		c.problem("completedIndexes %q, want %q", got, want)
	}
	if fi := strOrNil(j.Status.FailedIndexes); fi != "" && fi != "<nil>" {
		c.problem("failedIndexes %q, want none", fi)
	}
	if u := j.Status.UncountedTerminatedPods; u != nil && (len(u.Failed) > 0 || len(u.Succeeded) > 0) && fc != nil {
		c.problem("uncountedTerminatedPods left: %d failed, %d succeeded", len(u.Failed), len(u.Succeeded))
	}
	unrec := unrecordedFailures(truth, pods)
	want := truthFailures + len(unrec)
	if int(j.Status.Failed) > want {
		d := int(j.Status.Failed) - want
		c.Double += d
		c.problem("status.failed %d, but %d attempts failed (%d more pods ended without an exit of their own: %v): %d counted twice",
			j.Status.Failed, truthFailures, len(unrec), unrec, d)
	} else if d := truthFailures - int(j.Status.Failed); d > 0 {
		c.Lost += d
		c.problem("status.failed %d, but %d attempts failed: %d lost", j.Status.Failed, truthFailures, d)
	}
	if len(unrec) > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("%d pods ended without an exit of their own, each a failure counted at most once (not at all when a rule ignores it): %v", len(unrec), unrec))
	}

	// Per index: the failures the succeeding pod carries, and how many pods succeeded.
	byIndex := map[int][]*corev1.Pod{}
	for _, p := range pods {
		ix, err := strconv.Atoi(p.Annotations[batchv1.JobCompletionIndexAnnotation])
		if err != nil {
			continue
		}
		byIndex[ix] = append(byIndex[ix], p)
	}
	var lostIdx, doubleIdx []int
	extra := 0
	for ix := 0; ix < int(*j.Spec.Completions); ix++ {
		var succeeded []*corev1.Pod
		for _, p := range byIndex[ix] {
			if p.Status.Phase == corev1.PodSucceeded {
				succeeded = append(succeeded, p)
			}
		}
		if len(succeeded) > 1 {
			c.problem("index %d: %d pods succeeded", ix, len(succeeded))
		}
		if len(byIndex[ix]) > len(truth[ix]) {
			extra += len(byIndex[ix]) - len(truth[ix])
		}
		if len(succeeded) == 0 {
			continue
		}
		carried, err := strconv.Atoi(succeeded[0].Annotations[batchv1.JobIndexFailureCountAnnotation])
		if err != nil {
			carried = 0
		}
		want := truth.failuresOf(ix)
		switch {
		case carried < want:
			c.Lost += want - carried
			lostIdx = append(lostIdx, ix)
		case carried > want:
			c.Double += carried - want
			doubleIdx = append(doubleIdx, ix)
		}
	}
	if len(lostIdx) > 0 {
		c.problem("indexes whose failure the succeeding pod does not carry (job-index-failure-count too low): %v", lostIdx)
	}
	if len(doubleIdx) > 0 {
		c.problem("indexes whose succeeding pod carries more failures than happened: %v", doubleIdx)
	}
	if extra > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("%d pods created that never started their command (deleted before, or still pending)", extra))
	}
	return c
}

// unrecordedFailures names the pods that did not succeed and never recorded an exit of their
// own command: a pod whose container the runtime failed to start (StartError while its
// containerd restarted), or one deleted before it ran or while it ran (the Job's end deletes
// its active pods). Such a pod is a failure the Job counts at most once, as the built-in
// controller does, and not at all when a rule ignores it (a pod fenced or disrupted, with
// DisruptionTarget): an upper bound of status.failed beside the truth files' failures, never
// a lower one.
func unrecordedFailures(truth jobTruth, pods []*corev1.Pod) []string {
	exited := map[string]bool{}
	for _, as := range truth {
		for _, a := range as {
			if a.Exited {
				exited[a.Pod] = true
			}
		}
	}
	var out []string
	for _, p := range pods {
		if p.Status.Phase != corev1.PodSucceeded && !exited[p.Name] {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

func finishedOK(j *batchv1.Job) bool {
	if j == nil {
		return false
	}
	fc := finishedCondition(j)
	return fc != nil && fc.Type == batchv1.JobComplete
}

func strOrNil(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// condition returns the pod's condition of type t.
func condition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// forcefullyTerminated is the reason of the pod's coroner.dev/ForcefullyTerminated, "" if none.
func forcefullyTerminated(p *corev1.Pod) string {
	if c := condition(p, conditions.ForcefullyTerminated); c != nil && c.Status == corev1.ConditionTrue {
		return c.Reason
	}
	return ""
}

// mainTerminated is the terminated state of the pod's main container (the last one).
func mainTerminated(p *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Terminated != nil {
			return s.State.Terminated
		}
	}
	return nil
}
