package explain

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/indexes"
	"github.com/coroner-dev/coroner/shim/policy"
)

// maxIndexRows is the number of indexes above which the index table lists only the
// indexes that have pods or failed.
const maxIndexRows = 100

// noIndex marks a pod without a (valid) completion index.
const noIndex = -1

// Report is what explain prints about one Job: a pure function of the Job, its pods and
// its Events (Build), rendered by Write.
type Report struct {
	Job *batchv1.Job
	// Failed are the Job's failed pods, oldest finish first.
	Failed []FailedPod
	// Indexes is the per-index state of an Indexed Job, by index.
	Indexes []IndexState
	// Gone are the shim's PodFailurePolicy Event messages about pods that no longer exist.
	Gone []string
	// Notes are remarks about the report itself.
	Notes []string
}

// FailedPod is one failed pod and what the Job's policy made of it.
type FailedPod struct {
	Pod      *corev1.Pod
	Index    int
	Finished time.Time
	// Cause holds labelled lines ("exit", "oom", "disruption", ...) in print order.
	Cause  []Line
	Result policy.Result
	// Rule and Action describe the matching rule and its consequence for the Job.
	Rule, Action string
}

// Line is a labelled line of a report.
type Line struct{ Label, Text string }

// IndexState is one completion index of an Indexed Job.
type IndexState struct {
	Index int
	// State is completed, failed, active, terminating or pending.
	State string
	// Failures counts the index's failures that count towards backoffLimitPerIndex,
	// Ignored those an Ignore rule matched, from the pods' annotations plus the pods'
	// own failures.
	Failures, Ignored int32
	Pods              []*corev1.Pod
}

// Build makes the Report of job from its pods (any order; pods of other Jobs are left
// out) and the Events of the namespace.
func Build(job *batchv1.Job, pods []*corev1.Pod, events []corev1.Event) *Report {
	r := &Report{Job: job}
	var own []*corev1.Pod
	for _, p := range pods {
		if ref := metav1.GetControllerOf(p); ref != nil && ref.UID == job.UID {
			own = append(own, p)
		}
	}
	sort.SliceStable(own, func(i, j int) bool {
		ti, tj := own[i].CreationTimestamp, own[j].CreationTimestamp
		if !ti.Equal(&tj) {
			return ti.Before(&tj)
		}
		return own[i].Name < own[j].Name
	})
	perIndex := indexed(job) && job.Spec.BackoffLimitPerIndex != nil
	for _, p := range own {
		if p.Status.Phase != corev1.PodFailed {
			continue
		}
		fp := FailedPod{Pod: p, Index: podIndex(job, p), Finished: backoff.FinishTime(p), Cause: causeOfDeath(p)}
		fp.Result = policy.Match(job.Spec.PodFailurePolicy, p)
		fp.Rule = ruleText(job, fp.Result)
		fp.Action = actionText(job, p, fp.Index, fp.Result, perIndex)
		r.Failed = append(r.Failed, fp)
	}
	sort.SliceStable(r.Failed, func(i, j int) bool { return r.Failed[i].Finished.Before(r.Failed[j].Finished) })
	if indexed(job) {
		r.Indexes = indexStates(job, own)
	}
	r.Gone = goneDecisions(job, own, events)
	if n := int(job.Status.Failed); n > len(r.Failed) {
		r.Notes = append(r.Notes, fmt.Sprintf("status.failed is %d but %d failed pods remain: the others were deleted after they were counted", n, len(r.Failed)))
	}
	if mb := ptrValue(job.Spec.ManagedBy); mb != conditions.ManagedBy {
		who := "the built-in Job controller"
		if mb != "" && mb != conditions.BuiltInJobControllerName {
			who = mb
		}
		r.Notes = append(r.Notes, fmt.Sprintf("this Job is run by %s, not coroner-shim: the rules and actions above are what coroner-shim would decide", who))
	}
	return r
}

func indexed(job *batchv1.Job) bool {
	return job.Spec.CompletionMode != nil && *job.Spec.CompletionMode == batchv1.IndexedCompletion
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// podIndex is the pod's completion index (annotation, then label), or noIndex.
func podIndex(job *batchv1.Job, p *corev1.Pod) int {
	if !indexed(job) {
		return noIndex
	}
	v, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]
	if !ok {
		v, ok = p.Labels[batchv1.JobCompletionIndexAnnotation]
	}
	if !ok {
		return noIndex
	}
	ix, err := strconv.Atoi(v)
	if err != nil || ix < 0 || (job.Spec.Completions != nil && ix >= int(*job.Spec.Completions)) {
		return noIndex
	}
	return ix
}

// causeOfDeath lists what the pod says about its end: container exits, the OOM class
// coroner-agent stamped, a disruption, a forced termination, the pod's reason and the
// exit history of in-place restarts.
func causeOfDeath(p *corev1.Pod) []Line {
	var out []Line
	runtimeOOM := false
	for _, list := range []struct {
		kind     string
		statuses []corev1.ContainerStatus
	}{{"init container", p.Status.InitContainerStatuses}, {"container", p.Status.ContainerStatuses}} {
		for _, cs := range list.statuses {
			t := cs.State.Terminated
			if t == nil || (t.ExitCode == 0 && t.Reason != "OOMKilled") {
				continue
			}
			text := fmt.Sprintf("%s %s exited %d", list.kind, cs.Name, t.ExitCode)
			if t.Signal != 0 {
				text += fmt.Sprintf(" (signal %d)", t.Signal)
			}
			if t.Reason != "" {
				text += " (" + t.Reason + ")"
			}
			if !t.FinishedAt.IsZero() {
				text += " at " + stamp(t.FinishedAt.Time)
			}
			if t.Message != "" {
				text += ": " + oneLine(t.Message)
			}
			out = append(out, Line{"exit", text})
			runtimeOOM = runtimeOOM || t.Reason == "OOMKilled"
		}
	}
	if len(out) == 0 {
		out = append(out, Line{"exit", "no container exited with a non-zero code"})
	}

	oom := conditions.Find(&p.Status, conditions.OOMKilled)
	dt := conditions.Find(&p.Status, conditions.DisruptionTarget)
	switch {
	case oom != nil && oom.Status == corev1.ConditionTrue:
		out = append(out, Line{"oom", "over the pod's own memory limit: " + conditionText(oom)})
	case dt != nil && dt.Status == corev1.ConditionTrue && dt.Reason == conditions.ReasonNodeOOMKill:
		out = append(out, Line{"oom", "killed by the node's OOM killer (node memory pressure, not the pod's limit): " + conditionText(dt)})
	case runtimeOOM:
		out = append(out, Line{"oom", fmt.Sprintf("the runtime reports OOMKilled but coroner-agent did not classify it (no %s, no %s reason %s): limit or node unknown",
			conditions.OOMKilled, conditions.DisruptionTarget, conditions.ReasonNodeOOMKill)})
	}
	if dt != nil && dt.Status == corev1.ConditionTrue && dt.Reason != conditions.ReasonNodeOOMKill {
		out = append(out, Line{"disruption", conditionText(dt)})
	}
	if ft := conditions.Find(&p.Status, conditions.ForcefullyTerminated); ft != nil && ft.Status == corev1.ConditionTrue {
		out = append(out, Line{"recovery", conditionText(ft)})
	}
	if p.Status.Reason != "" || p.Status.Message != "" {
		out = append(out, Line{"pod", strings.TrimPrefix(p.Status.Reason+": "+oneLine(p.Status.Message), ": ")})
	}
	if v, ok := p.Annotations[conditions.AnnotationExitHistory]; ok {
		entries, err := exithistory.Parse(v)
		switch {
		case err != nil:
			out = append(out, Line{"history", fmt.Sprintf("%s is malformed: %v", conditions.AnnotationExitHistory, err)})
		case len(entries) > 0:
			var parts []string
			for _, e := range entries {
				s := fmt.Sprintf("%s exited %d", e.Container, e.ExitCode)
				var extra []string
				if e.Reason != "" {
					extra = append(extra, e.Reason)
				}
				if e.OOM != "" {
					extra = append(extra, "oom "+e.OOM)
				}
				if len(extra) > 0 {
					s += " (" + strings.Join(extra, ", ") + ")"
				}
				if !e.FinishedAt.IsZero() {
					s += " at " + stamp(e.FinishedAt)
				}
				parts = append(parts, s)
			}
			out = append(out, Line{"history", "in-place restarts, oldest first: " + strings.Join(parts, "; ")})
		}
	}
	return out
}

func conditionText(c *corev1.PodCondition) string {
	s := fmt.Sprintf("%s=%s", c.Type, c.Status)
	if c.Reason != "" {
		s += " (" + c.Reason + ")"
	}
	if c.Message != "" {
		s += ": " + oneLine(c.Message)
	}
	return s
}

func ruleText(job *batchv1.Job, r policy.Result) string {
	switch {
	case job.Spec.PodFailurePolicy == nil || len(job.Spec.PodFailurePolicy.Rules) == 0:
		return "no podFailurePolicy"
	case !r.Matched():
		return "no rule matched"
	case r.ConditionType != "":
		return fmt.Sprintf("rule %d (%s): pod condition %s", r.RuleIndex, r.Action, r.ConditionType)
	}
	kind := "container"
	if r.InitContainer {
		kind = "init container"
	}
	return fmt.Sprintf("rule %d (%s): %s %s exit code %d", r.RuleIndex, r.Action, kind, r.ContainerName, r.ExitCode)
}

// actionText says what the failure did to the Job when it happened, in the shim's terms:
// a counted failure of an index fails the index when the failures before it (the pod's
// job-index-failure-count annotation) already reached backoffLimitPerIndex.
func actionText(job *batchv1.Job, p *corev1.Pod, ix int, r policy.Result, perIndex bool) string {
	switch {
	case r.Action == batchv1.PodFailurePolicyActionIgnore:
		return "not counted; the pod is replaced"
	case r.Action == batchv1.PodFailurePolicyActionFailJob:
		return "the Job fails (reason PodFailurePolicy)"
	case r.Action == batchv1.PodFailurePolicyActionFailIndex && ix != noIndex:
		return fmt.Sprintf("index %d fails, without retries", ix)
	case perIndex && ix != noIndex:
		count, _ := backoff.IndexFailureCount(p)
		limit := *job.Spec.BackoffLimitPerIndex
		if count+1 > limit {
			return fmt.Sprintf("counted: failure %d of index %d, over backoffLimitPerIndex %d: index %d fails", count+1, ix, limit, ix)
		}
		return fmt.Sprintf("counted: failure %d of index %d, within backoffLimitPerIndex %d: the index is retried", count+1, ix, limit)
	}
	limit := ptrValue(job.Spec.BackoffLimit)
	if job.Spec.BackoffLimit == nil {
		limit = 6
	}
	return fmt.Sprintf("counted towards backoffLimit %d (status.failed %d)", limit, job.Status.Failed)
}

// indexStates computes the state of every index of an Indexed Job (or, for a large one,
// of those that have pods or failed).
func indexStates(job *batchv1.Job, pods []*corev1.Pod) []IndexState {
	completions := int(ptrValue(job.Spec.Completions))
	completed, _ := indexes.Parse(job.Status.CompletedIndexes)
	failed, _ := indexes.Parse(ptrValue(job.Status.FailedIndexes))
	byIndex := map[int][]*corev1.Pod{}
	for _, p := range pods {
		if ix := podIndex(job, p); ix != noIndex {
			byIndex[ix] = append(byIndex[ix], p)
		}
	}
	var out []IndexState
	for ix := 0; ix < completions; ix++ {
		ps := byIndex[ix]
		if completions > maxIndexRows && len(ps) == 0 && !failed.Has(ix) {
			continue
		}
		st := IndexState{Index: ix, Pods: ps}
		active, terminating := false, false
		for _, p := range ps {
			f, _ := backoff.IndexFailureCount(p)
			ig, _ := backoff.IndexIgnoredFailureCount(p)
			if p.Status.Phase == corev1.PodFailed {
				if policy.Match(job.Spec.PodFailurePolicy, p).CountsAsFailure() {
					f++
				} else {
					ig++
				}
			}
			st.Failures, st.Ignored = max(st.Failures, f), max(st.Ignored, ig)
			switch {
			case conditions.IsTerminalPhase(p.Status.Phase):
			case p.DeletionTimestamp != nil:
				terminating = true
			default:
				active = true
			}
		}
		switch {
		case completed.Has(ix):
			st.State = "completed"
		case failed.Has(ix):
			st.State = "failed"
		case active:
			st.State = "active"
		case terminating:
			st.State = "terminating"
		default:
			st.State = "pending"
		}
		out = append(out, st)
	}
	return out
}

// goneDecisions returns the messages of the shim's PodFailurePolicy Events on the Job
// about pods that no longer exist, oldest first.
func goneDecisions(job *batchv1.Job, pods []*corev1.Pod, events []corev1.Event) []string {
	live := map[string]bool{}
	for _, p := range pods {
		live[p.Namespace+"/"+p.Name] = true
	}
	var evs []corev1.Event
	for _, e := range events {
		if e.InvolvedObject.UID != job.UID || e.Reason != conditions.EventReasonPodFailurePolicy {
			continue
		}
		// "pod <namespace>/<name>: ..."
		rest, ok := strings.CutPrefix(e.Message, "pod ")
		name, _, ok2 := strings.Cut(rest, ":")
		if ok && ok2 && live[name] {
			continue
		}
		evs = append(evs, e)
	}
	sort.SliceStable(evs, func(i, j int) bool { return eventTime(evs[i]).Before(eventTime(evs[j])) })
	var out []string
	for _, e := range evs {
		out = append(out, e.Message)
	}
	return slices.Compact(out)
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
