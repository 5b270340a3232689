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
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/indexes"
	"github.com/coroner-dev/coroner/shim/memretry"
	"github.com/coroner-dev/coroner/shim/policy"
)

// maxIndexRows is the number of indexes above which the index table lists only the
// indexes that have pods or failed.
const maxIndexRows = 100

// noIndex marks a pod without a (valid) completion index.
const noIndex = -1

// Build makes the Report of job from its pods (any order; pods of other Jobs are left
// out) and coroner-shim's record of the Job (nil when there is none, or it is an earlier
// Job's).
func Build(job *batchv1.Job, pods []*corev1.Pod, rec *v1alpha1.JobRecord) *Report {
	if rec != nil && rec.JobUID != job.UID {
		rec = nil
	}
	r := &Report{TypeMeta: typeMeta(KindJobReport), job: job, Job: summary(job), Record: recordOf(rec)}
	if pfp := job.Spec.PodFailurePolicy; pfp != nil {
		for i, rule := range pfp.Rules {
			r.Rules = append(r.Rules, fmt.Sprintf("rule %d: %s", i, describeRule(rule)))
		}
	}
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
	live := map[string]bool{}
	for _, p := range own {
		live[p.Name] = true
		pr := podReport(job, p)
		if rec != nil {
			if e, ok := rec.Pods[p.Name]; ok {
				pr.entry = &e
				pr.Decisions = []string{entryDecision(job, e)}
			}
		}
		r.Pods = append(r.Pods, pr)
	}
	r.Pods = append(r.Pods, gonePods(job, rec, live)...)
	if indexed(job) {
		r.Indexes = indexStates(job, own)
	}
	r.NodeBlame = nodeBlameReport(job, own, r.Pods)
	r.Notes = append(r.Notes, recordNotes(job, rec, r.Pods)...)
	if mb := ptrValue(job.Spec.ManagedBy); mb != conditions.ManagedBy {
		who := "the built-in Job controller"
		if mb != "" && mb != conditions.BuiltInJobControllerName {
			who = mb
		}
		r.Notes = append(r.Notes, fmt.Sprintf("this Job is run by %s, not coroner-shim: the rules and actions above are what coroner-shim would decide", who))
	}
	return r
}

// summary is the JobSummary of job.
func summary(job *batchv1.Job) JobSummary {
	spec, st := &job.Spec, &job.Status
	s := JobSummary{
		Namespace: job.Namespace, Name: job.Name, ManagedBy: ptrValue(spec.ManagedBy), Mode: "NonIndexed",
		Completions: spec.Completions, Parallelism: spec.Parallelism,
		BackoffLimitPerIndex: spec.BackoffLimitPerIndex, MaxFailedIndexes: spec.MaxFailedIndexes,
		State:  jobState(job),
		Active: st.Active, Ready: st.Ready, Succeeded: st.Succeeded, Failed: st.Failed, Terminating: st.Terminating,
		CompletedIndexes: st.CompletedIndexes, FailedIndexes: ptrValue(st.FailedIndexes),
	}
	if indexed(job) {
		s.Mode = "Indexed"
	}
	if spec.BackoffLimitPerIndex == nil {
		s.BackoffLimit = ptrTo(ptrValue(spec.BackoffLimit))
		if spec.BackoffLimit == nil {
			s.BackoffLimit = ptrTo[int32](6)
		}
	}
	if spec.PodReplacementPolicy != nil {
		s.PodReplacementPolicy = string(*spec.PodReplacementPolicy)
	}
	return s
}

// podReport explains one existing pod; job, when not nil, is the Job that controls it.
func podReport(job *batchv1.Job, p *corev1.Pod) PodReport {
	pr := PodReport{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, pod: p}
	pr.State, pr.Cause = classify(p)
	pr.Details = details(p)
	pr.Warnings = warnings(p)
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			pr.Restarts += cs.RestartCount
		}
	}
	if conditions.IsTerminalPhase(p.Status.Phase) {
		pr.Finished = &metav1.Time{Time: backoff.FinishTime(p)}
	}
	if job == nil {
		return pr
	}
	pr.Job = job.Name
	if ix := podIndex(job, p); ix != noIndex {
		pr.Index = &ix
	}
	nodeBlameDetails(job, p, &pr)
	if g, grew := growth(job, p); grew {
		pr.Rule = v1alpha1.AnnotationOOMMemoryRetry + ": " + g[0].String()
		pr.Action = "not counted; the replacement gets more memory"
	} else if p.Status.Phase == corev1.PodFailed {
		res := policy.Match(job.Spec.PodFailurePolicy, p)
		pr.Rule = ruleText(job, res)
		perIndex := indexed(job) && job.Spec.BackoffLimitPerIndex != nil
		pr.Action = actionText(job, p, podIndex(job, p), res, perIndex)
		if a, ok := budgetAction(job, p, res, actionText(job, p, podIndex(job, p), policy.Result{}, perIndex)); ok {
			pr.Action = a
		}
		if line, waiting, ok := awaitingDevice(job, p); ok && waiting {
			// coroner-shim sees it running until the verdict is in.
			pr.Rule = "not decided yet: coroner-agent's device verdict can change the rule that matches"
			pr.Action = line.Text
		} else if ok {
			pr.Details = append(pr.Details, line)
		}
	}
	return pr
}

func ptrTo[T any](v T) *T { return &v }

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
	idle := idleIndexState(job)
	var out []IndexState
	for ix := 0; ix < completions; ix++ {
		ps := byIndex[ix]
		if completions > maxIndexRows && len(ps) == 0 && !failed.Has(ix) {
			continue
		}
		st := IndexState{Index: ix, Memory: memoryLadder(job, ps)}
		active, terminating := false, false
		for _, p := range ps {
			state, _ := classify(p)
			if _, waiting, ok := awaitingDevice(job, p); ok && waiting {
				// coroner-shim sees it running until coroner-agent's device verdict.
				st.Pods = append(st.Pods, fmt.Sprintf("%s (%s, awaiting the device verdict)", p.Name, state))
				active = true
				continue
			}
			st.Pods = append(st.Pods, fmt.Sprintf("%s (%s)", p.Name, state))
			f, _ := backoff.IndexFailureCount(p)
			ig, _ := backoff.IndexIgnoredFailureCount(p)
			if p.Status.Phase == corev1.PodFailed {
				if _, grew := growth(job, p); !grew && countsAsFailure(job, p) {
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
			st.State = idle
		}
		out = append(out, st)
	}
	return out
}

// idleIndexState is the state of an index that is neither completed nor failed and has no
// pod running or being deleted: "pending" only while the Job runs. A finished Job (or one
// its controller has decided to finish: FailureTarget, SuccessCriteriaMet) will never
// complete the index, whether or not it ran; a suspended Job creates no pod until resumed.
func idleIndexState(job *batchv1.Job) string {
	if c := trueCondition(job, batchv1.JobFailed, batchv1.JobFailureTarget); c != nil {
		return "unfinished: the Job failed" + reasonOf(c)
	}
	if c := trueCondition(job, batchv1.JobComplete, batchv1.JobSuccessCriteriaMet); c != nil {
		return "not needed: the Job succeeded" + reasonOf(c)
	}
	if trueCondition(job, batchv1.JobSuspended) != nil || ptrValue(job.Spec.Suspend) {
		return "suspended"
	}
	return "pending"
}

// trueCondition is the first of the types that the Job has with status True, nil if none.
func trueCondition(job *batchv1.Job, types ...batchv1.JobConditionType) *batchv1.JobCondition {
	for _, t := range types {
		for i, c := range job.Status.Conditions {
			if c.Type == t && c.Status == corev1.ConditionTrue {
				return &job.Status.Conditions[i]
			}
		}
	}
	return nil
}

// reasonOf is " (REASON)", or "" for a condition without a reason.
func reasonOf(c *batchv1.JobCondition) string {
	if c.Reason == "" {
		return ""
	}
	return " (" + c.Reason + ")"
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// growth is the memory growth coroner-shim makes of a failed pod of a Job with
// coroner.dev/oom-memory-retry (package shim/memretry, as the shim decides it).
func growth(job *batchv1.Job, p *corev1.Pod) ([]v1alpha1.Growth, bool) {
	spec, err := v1alpha1.MemoryRetryOf(job.Annotations)
	if err != nil || spec == nil {
		return nil, false
	}
	return memretry.Decide(*spec, p)
}

// memoryLadder is, for a Job with coroner.dev/oom-memory-retry, the memory its pods of one
// index were given, smallest first ("main=24Mi -> main=48Mi"); "" otherwise or when it
// never grew.
func memoryLadder(job *batchv1.Job, pods []*corev1.Pod) string {
	if _, ok := job.Annotations[v1alpha1.AnnotationOOMMemoryRetry]; !ok {
		return ""
	}
	var steps []v1alpha1.Memory
	for _, p := range pods {
		m := v1alpha1.MemoryOf(p)
		if !slices.ContainsFunc(steps, func(x v1alpha1.Memory) bool { return x.String() == m.String() }) {
			steps = append(steps, m)
		}
	}
	if len(steps) < 2 {
		return ""
	}
	slices.SortFunc(steps, func(a, b v1alpha1.Memory) int { return total(a).Cmp(*total(b)) })
	var out []string
	for _, m := range steps {
		out = append(out, m.String())
	}
	return strings.Join(out, " -> ")
}

// total is the sum of a Memory's limits, to order the steps of a ladder.
func total(m v1alpha1.Memory) *resource.Quantity {
	var q resource.Quantity
	for _, v := range m {
		q.Add(v)
	}
	return &q
}
