package main

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// recorder holds what the simulated kubelet did and what a watch of the Jobs saw, with
// when: the raw material of the measurements and of the outcome check.
type recorder struct {
	mu   sync.Mutex
	jobs map[string]*jobRecord // by namespace/name
	// attempts counts the pods the kubelet took on, by namespace/job/index.
	attempts map[string]int
	taken    map[types.UID]bool
	deleting map[types.UID]bool

	failOnce sync.Once
	err      error
	failed   chan struct{} // closed by fail
}

// jobRecord is one Job of the workload.
type jobRecord struct {
	ns, name string
	number   int // -1 for the warm-up Job
	// created is just before the create call; finished is when a watch delivered the Job
	// with a terminal condition.
	created, finished time.Time
	// successes are the terminal writes of succeeded pods, by index; failures those of
	// failed pods.
	successes map[int]*termWrite
	failures  []*termWrite
	// lastFailure is the latest failure of each index.
	lastFailure map[int]*termWrite
	pods        int // pods the kubelet took on
	deleted     int // pods the controller deleted
	// pendingSuccesses counts the successes not counted yet.
	pendingSuccesses int
	// doomIndex is the index whose failure ends the Job at once (workload.doomIndex), -1
	// for none; doom is that failure's write, target when a watch first delivered the Job
	// with FailureTarget (or Failed) True, deletions when it delivered each pod the
	// controller deleted with its deletionTimestamp.
	doomIndex int
	doom      *termWrite
	target    time.Time
	deletions []time.Time
}

// termWrite is a terminal pod status written by the simulated kubelet.
type termWrite struct {
	uid  types.UID
	kind podKind
	// acked is when the API server acknowledged the write; counted is when a watch first
	// delivered the Job with a status that counts the pod.
	acked, counted time.Time
	// replaced is when a watch delivered the pod that replaced a failed one.
	replaced time.Time
	// uncounted is set once a Job status listed the pod in uncountedTerminatedPods;
	// late, when the watch missed that (it restarted) and the pod was found counted
	// only once status.failed counted every failure of the Job.
	uncounted, late bool
}

// podKind is how a pod ends.
type podKind int

const (
	podSucceeded podKind = iota
	podFailIndex         // exit 42: FailIndex, counted at once
	podRetried           // exit 1: counted once its replacement exists (KEP-3850)
	podFailJob           // exit 43: FailJob
	podKinds
)

func kindOf(code int32) podKind {
	switch code {
	case 0:
		return podSucceeded
	case exitFailIndex:
		return podFailIndex
	case exitFailJob:
		return podFailJob
	}
	return podRetried
}

func newRecorder() *recorder {
	return &recorder{
		jobs:     map[string]*jobRecord{},
		attempts: map[string]int{},
		taken:    map[types.UID]bool{},
		deleting: map[types.UID]bool{},
		failed:   make(chan struct{}),
	}
}

// fail records the first error of the kubelet or the watch; the run stops on it.
func (r *recorder) fail(err error) {
	r.failOnce.Do(func() {
		r.err = err
		close(r.failed)
	})
}

// addJob records a Job about to be created.
func (r *recorder) addJob(ns, name string, number, doomIndex int) *jobRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	jr := &jobRecord{ns: ns, name: name, number: number, doomIndex: doomIndex, created: time.Now(), successes: map[int]*termWrite{}, lastFailure: map[int]*termWrite{}}
	r.jobs[ns+"/"+name] = jr
	return jr
}

// takePod claims a new pod for the kubelet; it returns the pod's Job, its index and how
// many pods of that index the kubelet ran before. ok is false for a pod already taken
// or not of a recorded Job.
func (r *recorder) takePod(pod *corev1.Pod) (jr *jobRecord, index, attempt int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.taken[pod.UID] {
		return nil, 0, 0, false
	}
	jr = r.jobs[pod.Namespace+"/"+pod.Labels[batchv1.JobNameLabel]]
	if jr == nil {
		return nil, 0, 0, false
	}
	r.taken[pod.UID] = true
	index, err := strconv.Atoi(pod.Annotations[batchv1.JobCompletionIndexAnnotation])
	if err != nil {
		r.fail(fmt.Errorf("pod %s/%s of Job %s has no valid completion index annotation (%q)", pod.Namespace, pod.Name, jr.name, pod.Annotations[batchv1.JobCompletionIndexAnnotation]))
		return nil, 0, 0, false
	}
	key := fmt.Sprintf("%s/%s/%d", jr.ns, jr.name, index)
	attempt = r.attempts[key]
	if w := jr.lastFailure[index]; attempt > 0 && w != nil && w.replaced.IsZero() {
		w.replaced = time.Now()
	}
	r.attempts[key]++
	jr.pods++
	return jr, index, attempt, true
}

// takeDeletion claims a pod the controller deleted, for the kubelet to finish the
// deletion once; false when it was claimed already.
func (r *recorder) takeDeletion(pod *corev1.Pod) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.deleting[pod.UID] {
		return false
	}
	r.deleting[pod.UID] = true
	if jr := r.jobs[pod.Namespace+"/"+pod.Labels[batchv1.JobNameLabel]]; jr != nil {
		jr.deleted++
		jr.deletions = append(jr.deletions, time.Now())
	}
	return true
}

// terminalWrite records a terminal status about to be written for a pod of index i.
func (r *recorder) terminalWrite(jr *jobRecord, pod *corev1.Pod, index int, code int32) *termWrite {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := &termWrite{uid: pod.UID, kind: kindOf(code)}
	if w.kind != podSucceeded {
		jr.failures = append(jr.failures, w)
		jr.lastFailure[index] = w
		if index == jr.doomIndex && jr.doom == nil {
			jr.doom = w
		}
	} else {
		jr.pendingSuccesses++
		if jr.successes[index] != nil {
			r.fail(fmt.Errorf("a second pod of index %d of Job %s/%s succeeded", index, jr.ns, jr.name))
		}
		jr.successes[index] = w
	}
	return w
}

// ack records that the API server acknowledged the terminal write.
func (r *recorder) ack(w *termWrite, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.acked = at
}

// dropWrite forgets a terminal write that did not happen (the pod was gone).
func (r *recorder) dropWrite(jr *jobRecord, index int, w *termWrite) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if jr.successes[index] == w {
		delete(jr.successes, index)
		jr.pendingSuccesses--
	}
	if jr.doom == w {
		jr.doom = nil
	}
	jr.failures = slices.DeleteFunc(jr.failures, func(x *termWrite) bool { return x == w })
}

// jobEvent takes a Job as a watch delivered it: a terminal condition finishes the Job,
// and the status counts the terminal pods it reflects. A succeeded pod of an Indexed Job
// is counted when its index is in status.completedIndexes (both controllers put it there
// and in status.succeeded in one write). A failed pod is counted in status.failed in two
// steps, the job-tracking protocol: its UID goes to status.uncountedTerminatedPods.failed,
// its finalizer is removed, and a later status moves it from there to the counter; it is
// counted at the first status that no longer lists it after one did. The counters never
// go down, so the first status that counts a pod is the one that matters.
func (r *recorder) jobEvent(obj any) {
	job, ok := obj.(*batchv1.Job)
	if !ok {
		return
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	jr := r.jobs[job.Namespace+"/"+job.Name]
	if jr == nil {
		return
	}
	if jr.finished.IsZero() && finished(job) {
		jr.finished = now
	}
	if jr.target.IsZero() && failing(job) {
		jr.target = now
	}
	if jr.pendingSuccesses > 0 {
		done, err := parseIntervals(job.Status.CompletedIndexes)
		if err != nil {
			r.fail(fmt.Errorf("status.completedIndexes of Job %s/%s: %w", jr.ns, jr.name, err))
			return
		}
		for i, w := range jr.successes {
			if w.counted.IsZero() && done.has(i) {
				w.counted = now
				jr.pendingSuccesses--
			}
		}
	}
	uncounted := map[types.UID]bool{}
	if u := job.Status.UncountedTerminatedPods; u != nil {
		for _, uid := range u.Failed {
			uncounted[uid] = true
		}
	}
	all := int(job.Status.Failed) >= len(jr.failures) && len(uncounted) == 0
	for _, w := range jr.failures {
		switch {
		case !w.counted.IsZero():
		case uncounted[w.uid]:
			w.uncounted = true
		case w.uncounted:
			w.counted = now
		case all:
			w.counted, w.late = now, true
		}
	}
}

func finished(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// failing reports whether job has FailureTarget or Failed True.
func failing(job *batchv1.Job) bool {
	for _, c := range job.Status.Conditions {
		if (c.Type == batchv1.JobFailureTarget || c.Type == batchv1.JobFailed) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// unfinished lists the workload's Jobs in ns that have not finished.
func (r *recorder) unfinished(ns string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, jr := range r.jobs {
		if jr.ns == ns && jr.finished.IsZero() {
			out = append(out, jr.name)
		}
	}
	slices.Sort(out)
	return out
}

// result is what a controller achieved on the workload.
type result struct {
	jobs                      int
	start, end                time.Time
	podsFinished, podFailures int
	// the sync latencies by podKind
	lat [podKinds][]time.Duration
	// doomed are the Jobs ended by one pod's failure (FailJob, or FailIndex with
	// maxFailedIndexes 0).
	doomed []doomSample
	// notCounted are terminal writes no Job status counted; early, those counted before
	// the write was acknowledged (latency 0); late, failures whose passage through
	// uncountedTerminatedPods the watch missed (their latency is an upper bound).
	notCounted, early, late int
	// replaceLat is, for the retried pods, the time from the failure to the replacement.
	replaceLat []time.Duration
	jobTimes   []time.Duration
	calls      calls
}

func (res result) wall() time.Duration { return res.end.Sub(res.start) }

// result sums up the workload's Jobs in ns, measured from start.
func (r *recorder) result(ns string, start time.Time) result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := result{start: start, end: start}
	add := func(w *termWrite) {
		if w.acked.IsZero() {
			return
		}
		res.podsFinished++
		if w.counted.IsZero() {
			res.notCounted++
			return
		}
		if w.late {
			res.late++
		}
		if !w.replaced.IsZero() {
			res.replaceLat = append(res.replaceLat, max(w.replaced.Sub(w.acked), 0))
		}
		d := w.counted.Sub(w.acked)
		if d < 0 {
			res.early++
			d = 0
		}
		res.lat[w.kind] = append(res.lat[w.kind], d)
	}
	for _, jr := range r.jobs {
		if jr.ns != ns || jr.number < 0 {
			continue
		}
		res.jobs++
		if jr.finished.After(res.end) {
			res.end = jr.finished
		}
		res.jobTimes = append(res.jobTimes, jr.finished.Sub(jr.created))
		if jr.doom != nil && !jr.doom.acked.IsZero() {
			res.doomed = append(res.doomed, doomOf(jr))
		}
		for _, w := range jr.successes {
			add(w)
		}
		for _, w := range jr.failures {
			if !w.acked.IsZero() {
				res.podFailures++
			}
			add(w)
		}
	}
	return res
}

// podCounts returns, by Job name, the pods the kubelet ran and the pods the controller
// deleted, for the Jobs in ns.
func (r *recorder) podCounts(ns string) map[string][2]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][2]int{}
	for _, jr := range r.jobs {
		if jr.ns == ns {
			out[jr.name] = [2]int{jr.pods, jr.deleted}
		}
	}
	return out
}

// errNotFinished says the Jobs did not finish in time.
var errNotFinished = errors.New("the Jobs did not finish in time")

// doomSample is how fast a controller acted on a failure that ends the Job: from the
// API server's acknowledgement of the pod's terminal status to the FailureTarget
// condition seen through a watch, and to the last of the Job's other pods seen with a
// deletionTimestamp; wasted is the time the other pods ran on after the failure,
// summed (pod-seconds).
type doomSample struct {
	toTarget, toLastDeletion time.Duration
	deleted                  int
	wasted                   time.Duration
}

func doomOf(jr *jobRecord) doomSample {
	t0 := jr.doom.acked
	d := doomSample{deleted: len(jr.deletions)}
	if !jr.target.IsZero() {
		d.toTarget = max(jr.target.Sub(t0), 0)
	}
	for _, at := range jr.deletions {
		late := max(at.Sub(t0), 0)
		d.toLastDeletion = max(d.toLastDeletion, late)
		d.wasted += late
	}
	return d
}

// intervals is a parsed status.completedIndexes, sorted ranges [lo, hi].
type intervals [][2]int

// parseIntervals parses the compressed format ("1,3-5,7") without building a set, so that
// a Job of 100,000 indexes costs little per watch event.
func parseIntervals(s string) (intervals, error) {
	var out intervals
	if s == "" {
		return out, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("bad index range %q in %q", part, s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad index range %q in %q", part, s)
			}
		}
		if n := len(out); n > 0 && a <= out[n-1][1] {
			return nil, fmt.Errorf("index ranges out of order at %q in %q", part, s)
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

// has reports whether i is in one of the intervals.
func (iv intervals) has(i int) bool {
	k, _ := slices.BinarySearchFunc(iv, i, func(r [2]int, i int) int { return cmp.Compare(r[1], i) })
	return k < len(iv) && iv[k][0] <= i && i <= iv[k][1]
}
