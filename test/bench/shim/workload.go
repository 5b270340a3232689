package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/wrappers"
)

const (
	// nodeName is the Node every pod is bound to.
	nodeName = "bench-node"
	// warmupJob is the single-pod Job each controller runs before the measurement.
	warmupJob = "warmup"
	// The exit codes of the workload's failing pods.
	exitFailOnce  = 1  // no rule matches: counted against backoffLimitPerIndex, retried
	exitFailIndex = 42 // FailIndex
	exitFailJob   = 43 // FailJob
)

// workload decides the Jobs and the pod histories, the same for both controllers.
type workload struct {
	jobs, completions, parallelism int
	// perIndex is spec.backoffLimitPerIndex, maxFailedIndexes spec.maxFailedIndexes;
	// negative: unset (then the Job has the global backoffLimit, 6, and no FailIndex rule).
	perIndex, maxFailedIndexes            int
	failOncePct, failIndexPct, failJobPct int
}

// doomIndex is the index of Job j whose failure ends the Job at once, with FailJob
// (exit 43) or with FailIndex (exit 42) when maxFailedIndexes is 0; -1 for none. The
// other pods of such a Job run long (kubelet.longRunTime): the controller stops them.
func (w workload) doomIndex(j int) int {
	if ix := w.failJobIndex(j); ix >= 0 {
		return ix
	}
	if w.perIndex >= 0 && w.maxFailedIndexes == 0 {
		return w.failedIndex(j)
	}
	return -1
}

// failJobIndex is the index of Job j whose pod fails with exit code 43 (FailJob), or -1.
// Exactly failJobPct percent of the Jobs (rounded down) have one, evenly spread, and not
// the Jobs that failedIndex picks when both percentages are 50.
func (w workload) failJobIndex(j int) int {
	if j < 0 || (j+2)*w.failJobPct/100 == (j+1)*w.failJobPct/100 {
		return -1
	}
	ix := int(mix(5, uint64(j), 0) % uint64(w.completions))
	if ix == w.failedIndex(j) {
		return -1
	}
	return ix
}

func jobName(j int) string { return fmt.Sprintf("job-%03d", j) }

// jobNumber is the inverse of jobName; false for other names (the warm-up Job).
func jobNumber(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, "job-")
	if !ok {
		return 0, false
	}
	j, err := strconv.Atoi(s)
	return j, err == nil && jobName(j) == name
}

// job builds Job number j; managedBy empty leaves spec.managedBy unset (the built-in
// controller's).
func (w workload) job(ns, name string, completions int, managedBy string) *batchv1.Job {
	var rules []*wrappers.RuleWrapper
	if w.perIndex >= 0 {
		rules = append(rules, wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, exitFailIndex))
	}
	rules = append(rules,
		wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, exitFailJob),
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget))
	b := wrappers.MakeJob(name, ns).
		Indexed().
		Completions(int32(completions)).
		Parallelism(int32(min(completions, w.parallelism))).
		PodFailurePolicy(rules...)
	if w.perIndex >= 0 {
		b.BackoffLimitPerIndex(int32(w.perIndex))
	}
	if w.maxFailedIndexes >= 0 && w.perIndex >= 0 {
		b.MaxFailedIndexes(int32(w.maxFailedIndexes))
	}
	if managedBy != "" {
		b.ManagedBy(managedBy)
	}
	return b.Obj()
}

// exitCode is the exit code of the pod of index i of Job j that runs after attempt
// earlier pods of that index (0 for the warm-up Job, j < 0).
func (w workload) exitCode(j, i, attempt int) int32 {
	switch {
	case j < 0 || attempt > 0:
		return 0
	case i == w.failedIndex(j):
		return exitFailIndex
	case i == w.failJobIndex(j):
		return exitFailJob
	case int(mix(1, uint64(j), uint64(i))%100) < w.failOncePct:
		return exitFailOnce
	}
	return 0
}

// failedIndex is the index of Job j that fails with exit code 42, or -1. Exactly
// failIndexPct percent of the Jobs (rounded down) have one, evenly spread.
func (w workload) failedIndex(j int) int {
	if j < 0 || (j+1)*w.failIndexPct/100 == j*w.failIndexPct/100 {
		return -1
	}
	return int(mix(3, uint64(j), 0) % uint64(w.completions))
}

// mix is a deterministic hash (splitmix64's finaliser) of three numbers.
func mix(a, b, c uint64) uint64 {
	x := a*0x9E3779B97F4A7C15 ^ (b+1)*0xBF58476D1CE4E5B9 ^ (c+1)*0x94D049BB133111EB
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// outcome is what is compared of a finished Job.
type outcome struct {
	terminal         string // "Complete/CompletionsReached", "Failed/FailedIndexes"
	conditions       string // every condition with status True, as type/reason, sorted
	succeeded        int32
	failed           int32
	active           int32
	ready            int32
	terminating      int32
	completedIndexes string
	failedIndexes    string
	uncounted        int
	pods             int // pods the simulated kubelet ran
	deleted          int // pods the controller deleted
}

// expected is the outcome the workload implies for Job j, and the fields it does not
// know in advance (conditions always; for a Job ended by one pod's failure, how its
// other pods are counted): those are compared between the controllers only.
func (w workload) expected(j int) (outcome, []string) {
	if d := w.doomIndex(j); d >= 0 {
		// Every pod started at once (validate: parallelism = completions); the one of
		// index d fails, the controller deletes the others before they finish.
		o := outcome{terminal: "Failed/PodFailurePolicy", pods: w.completions, deleted: w.completions - 1}
		if w.exitCode(j, d, 0) == exitFailIndex {
			o.terminal = "Failed/MaxFailedIndexesExceeded"
		}
		return o, []string{"conditions", "failed", "failedIndexes"}
	}
	var done, failed []int
	o := outcome{terminal: "Complete/CompletionsReached"}
	for i := range w.completions {
		switch w.exitCode(j, i, 0) {
		case exitFailIndex:
			failed = append(failed, i)
			o.failed++
			o.pods++
		case exitFailOnce:
			done = append(done, i)
			o.failed++
			o.pods += 2
		default:
			done = append(done, i)
			o.pods++
		}
	}
	o.succeeded = int32(len(done))
	o.completedIndexes = rangeString(done)
	o.failedIndexes = rangeString(failed)
	if len(failed) > 0 {
		o.terminal = "Failed/FailedIndexes"
	}
	return o, []string{"conditions"}
}

// outcomeOf reads the outcome of a finished Job; pods and deleted come from the
// simulated kubelet.
func outcomeOf(job *batchv1.Job, pods, deleted int) outcome {
	o := outcome{
		succeeded:        job.Status.Succeeded,
		failed:           job.Status.Failed,
		active:           job.Status.Active,
		ready:            ptr.Deref(job.Status.Ready, 0),
		terminating:      ptr.Deref(job.Status.Terminating, 0),
		completedIndexes: job.Status.CompletedIndexes,
		failedIndexes:    ptr.Deref(job.Status.FailedIndexes, ""),
		pods:             pods,
		deleted:          deleted,
	}
	if u := job.Status.UncountedTerminatedPods; u != nil {
		o.uncounted = len(u.Succeeded) + len(u.Failed)
	}
	var conds []string
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		s := string(c.Type) + "/" + c.Reason
		conds = append(conds, s)
		if c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed {
			o.terminal = s
		}
	}
	slices.Sort(conds)
	o.conditions = strings.Join(conds, ",")
	return o
}

// fields lists the outcome's fields by name, for comparisons.
func (o outcome) fields() [][2]string {
	return [][2]string{
		{"terminal condition", o.terminal},
		{"conditions", o.conditions},
		{"succeeded", fmt.Sprint(o.succeeded)},
		{"failed", fmt.Sprint(o.failed)},
		{"active", fmt.Sprint(o.active)},
		{"ready", fmt.Sprint(o.ready)},
		{"terminating", fmt.Sprint(o.terminating)},
		{"completedIndexes", o.completedIndexes},
		{"failedIndexes", o.failedIndexes},
		{"uncountedTerminatedPods", fmt.Sprint(o.uncounted)},
		{"pods run", fmt.Sprint(o.pods)},
		{"pods deleted by the controller", fmt.Sprint(o.deleted)},
	}
}

// diff lists the fields in which a and b differ, as "field: a vs b". skip names fields
// not to compare.
func diff(a, b outcome, skip ...string) []string {
	var out []string
	fb := b.fields()
	for i, f := range a.fields() {
		if slices.Contains(skip, f[0]) {
			continue
		}
		if f[1] != fb[i][1] {
			out = append(out, fmt.Sprintf("%s %q vs %q", f[0], f[1], fb[i][1]))
		}
	}
	return out
}

// rangeString writes sorted indexes in the API's compressed format: runs of three or
// more as ranges, the others one by one ("1,3-5,7,8").
func rangeString(ixs []int) string {
	var parts []string
	for k := 0; k < len(ixs); {
		e := k
		for e+1 < len(ixs) && ixs[e+1] == ixs[e]+1 {
			e++
		}
		if e-k >= 2 {
			parts = append(parts, strconv.Itoa(ixs[k])+"-"+strconv.Itoa(ixs[e]))
		} else {
			for i := k; i <= e; i++ {
				parts = append(parts, strconv.Itoa(ixs[i]))
			}
		}
		k = e + 1
	}
	return strings.Join(parts, ",")
}

// parseRanges parses the compressed format into a set; it is the benchmark's own
// parser (parseIntervals), independent of the controller under test.
func parseRanges(s string) (map[int]bool, error) {
	iv, err := parseIntervals(s)
	if err != nil {
		return nil, err
	}
	set := map[int]bool{}
	for _, r := range iv {
		for i := r[0]; i <= r[1]; i++ {
			set[i] = true
		}
	}
	return set, nil
}
