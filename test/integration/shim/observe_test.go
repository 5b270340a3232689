package shim_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

// mirror watches one namespace's Jobs and pods. It keeps every pod it ever saw with the
// resourceVersions at which the pod changed state, every status of every tracked Job, and
// checks invariants on every event. Tests read the state they wait for from here rather
// than polling the API server.
//
// ResourceVersions are compared as numbers: with etcd they are its global revision, so
// they order the writes of pods and Jobs against each other.
type mirror struct {
	t      testing.TB
	client kubernetes.Interface
	ns     string

	mu         sync.Mutex
	pods       map[types.UID]*podRecord // every pod seen
	jobs       map[types.UID]*jobRecord // tracked Jobs
	violations []string
	violated   map[string]bool
}

// podRecord is the life of one pod as watched.
type podRecord struct {
	first *corev1.Pod // as created
	last  *corev1.Pod // latest state (the final one once gone)
	// firstSeen is the wall-clock time the watch delivered the pod's creation.
	firstSeen time.Time
	createdRV uint64
	// terminatingRV..terminatingEndRV is when the pod was terminating (deletionTimestamp
	// set and phase not terminal); 0 for not yet / never.
	terminatingRV, terminatingEndRV uint64
	// terminalRV is the first version in phase Succeeded or Failed.
	terminalRV uint64
	// finalizerGoneRV is the first version without the Job tracking finalizer.
	finalizerGoneRV uint64
	gone            bool
	goneRV          uint64
}

// jobRecord is one tracked Job and the statuses it went through.
type jobRecord struct {
	job      *batchv1.Job // latest
	statuses []statusAt
}

type statusAt struct {
	rv     uint64
	at     time.Time
	status batchv1.JobStatus
}

func startMirror(t *testing.T, client kubernetes.Interface, ns string) *mirror {
	t.Helper()
	m := &mirror{t: t, client: client, ns: ns, pods: map[types.UID]*podRecord{}, jobs: map[types.UID]*jobRecord{}, violated: map[string]bool{}}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	podInf := factory.Core().V1().Pods().Informer()
	jobInf := factory.Batch().V1().Jobs().Informer()
	_, err := podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.podEvent(obj.(*corev1.Pod), false) },
		UpdateFunc: func(_, obj any) { m.podEvent(obj.(*corev1.Pod), false) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				m.podEvent(p, true)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = jobInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { m.jobEvent(obj.(*batchv1.Job)) },
		UpdateFunc: func(_, obj any) { m.jobEvent(obj.(*batchv1.Job)) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("watch of %v in %s did not sync", typ, ns)
		}
	}
	return m
}

func rvOf(o metav1.Object) uint64 {
	n, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
	return n
}

func isTerminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func isActive(p *corev1.Pod) bool { return !isTerminal(p) && p.DeletionTimestamp == nil }

func isTerminating(p *corev1.Pod) bool { return !isTerminal(p) && p.DeletionTimestamp != nil }

func hasTrackingFinalizer(p *corev1.Pod) bool {
	for _, f := range p.Finalizers {
		if f == conditions.JobTrackingFinalizer {
			return true
		}
	}
	return false
}

func (m *mirror) podEvent(p *corev1.Pod, deleted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rv := rvOf(p)
	r := m.pods[p.UID]
	if r == nil {
		r = &podRecord{first: p, firstSeen: time.Now(), createdRV: rv}
		m.pods[p.UID] = r
	}
	r.last = p
	if isTerminating(p) && !deleted && r.terminatingRV == 0 {
		r.terminatingRV = rv
	}
	if r.terminatingRV != 0 && r.terminatingEndRV == 0 && (deleted || !isTerminating(p)) {
		r.terminatingEndRV = rv
	}
	if isTerminal(p) && r.terminalRV == 0 {
		r.terminalRV = rv
	}
	if (deleted || !hasTrackingFinalizer(p)) && r.finalizerGoneRV == 0 {
		r.finalizerGoneRV = rv
	}
	if deleted {
		r.gone, r.goneRV = true, rv
	}
	m.checkPodInvariants()
}

// checkPodInvariants checks, after every pod event, what must hold at all times for every
// tracked Job: no more active pods than parallelism, and for Indexed Jobs at most one
// active pod per index.
func (m *mirror) checkPodInvariants() {
	for _, jr := range m.jobs {
		job := jr.job
		var active []*corev1.Pod
		for _, r := range m.pods {
			if !r.gone && ownedBy(r.last, job) && isActive(r.last) {
				active = append(active, r.last)
			}
		}
		if par := ptr.Deref(job.Spec.Parallelism, 1); int32(len(active)) > par {
			m.violation(job.Name+"/parallelism", fmt.Sprintf("Job %s had %d active pods at once, parallelism is %d: %s", job.Name, len(active), par, podNames(active)))
		}
		if isIndexed(job) {
			byIndex := map[string][]*corev1.Pod{}
			for _, p := range active {
				ix := p.Annotations[batchv1.JobCompletionIndexAnnotation]
				byIndex[ix] = append(byIndex[ix], p)
			}
			for ix, ps := range byIndex {
				if len(ps) > 1 {
					m.violation(job.Name+"/index/"+ix, fmt.Sprintf("Job %s had %d active pods for index %s at once: %s", job.Name, len(ps), ix, podNames(ps)))
				}
			}
		}
	}
}

func (m *mirror) jobEvent(j *batchv1.Job) {
	m.mu.Lock()
	defer m.mu.Unlock()
	jr := m.jobs[j.UID]
	if jr == nil {
		return // not tracked
	}
	jr.job = j
	if n := len(jr.statuses); n > 0 {
		prev := jr.statuses[n-1].status
		if j.Status.Succeeded < prev.Succeeded || j.Status.Failed < prev.Failed {
			m.violation(j.Name+"/counters", fmt.Sprintf("Job %s: counters went down: succeeded %d -> %d, failed %d -> %d",
				j.Name, prev.Succeeded, j.Status.Succeeded, prev.Failed, j.Status.Failed))
		}
		for _, c := range prev.Conditions {
			if c.Status == corev1.ConditionTrue && c.Type != batchv1.JobSuspended && !hasCondition(j.Status.Conditions, c.Type) {
				m.violation(j.Name+"/conditions", fmt.Sprintf("Job %s: condition %s=True was removed: %s", j.Name, c.Type, condList(j.Status.Conditions)))
			}
		}
		if statusEqual(prev, j.Status) {
			return
		}
	}
	jr.statuses = append(jr.statuses, statusAt{rv: rvOf(j), at: time.Now(), status: *j.Status.DeepCopy()})
}

func statusEqual(a, b batchv1.JobStatus) bool {
	return fmt.Sprintf("%+v", a) == fmt.Sprintf("%+v", b)
}

// violation records a broken invariant, once per key.
func (m *mirror) violation(key, msg string) {
	if m.violated[key] {
		return
	}
	m.violated[key] = true
	m.violations = append(m.violations, msg)
}

// track starts recording job's statuses and checking its invariants.
func (m *mirror) track(job *batchv1.Job) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.jobs[job.UID] == nil {
		m.jobs[job.UID] = &jobRecord{job: job}
	}
}

// job returns the latest watched state of the tracked Job.
func (m *mirror) job(uid types.UID) *batchv1.Job {
	m.mu.Lock()
	defer m.mu.Unlock()
	if jr := m.jobs[uid]; jr != nil {
		return jr.job
	}
	return nil
}

// statuses returns the distinct statuses the Job went through, in order.
func (m *mirror) statuses(uid types.UID) []statusAt {
	m.mu.Lock()
	defer m.mu.Unlock()
	if jr := m.jobs[uid]; jr != nil {
		return append([]statusAt(nil), jr.statuses...)
	}
	return nil
}

// podsOf returns the current pods of job (not deleted), ordered by index, then creation.
func (m *mirror) podsOf(job *batchv1.Job) []*corev1.Pod {
	var out []*corev1.Pod
	for _, r := range m.records(job) {
		if !r.gone {
			out = append(out, r.last)
		}
	}
	return out
}

// records returns the records of every pod job ever had, ordered by index, then creation.
func (m *mirror) records(job *batchv1.Job) []*podRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*podRecord
	for _, r := range m.pods {
		if ownedBy(r.first, job) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if ia, ib := podIndex(a.first), podIndex(b.first); ia != ib {
			return ia < ib
		}
		return a.createdRV < b.createdRV
	})
	return out
}

// record returns the record of the pod with uid.
func (m *mirror) record(uid types.UID) *podRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pods[uid]
}

func ownedBy(p *corev1.Pod, job *batchv1.Job) bool {
	ref := metav1.GetControllerOf(p)
	return ref != nil && ref.UID == job.UID
}

func isIndexed(job *batchv1.Job) bool {
	return ptr.Deref(job.Spec.CompletionMode, batchv1.NonIndexedCompletion) == batchv1.IndexedCompletion
}

// podIndex returns the completion index of an Indexed Job's pod, -1 when it has none.
func podIndex(p *corev1.Pod) int {
	s, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

func podNames(pods []*corev1.Pod) string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

func hasCondition(conds []batchv1.JobCondition, t batchv1.JobConditionType) bool {
	return findCondition(conds, t) != nil
}

// findCondition returns the condition of type t with status True, or nil.
func findCondition(conds []batchv1.JobCondition, t batchv1.JobConditionType) *batchv1.JobCondition {
	for i := range conds {
		if conds[i].Type == t && conds[i].Status == corev1.ConditionTrue {
			return &conds[i]
		}
	}
	return nil
}

// condList renders conditions as "Type/Status/Reason", in order.
func condList(conds []batchv1.JobCondition) []string {
	out := []string{}
	for _, c := range conds {
		out = append(out, fmt.Sprintf("%s/%s/%s", c.Type, c.Status, c.Reason))
	}
	return out
}

// finished reports whether job has Complete=True or Failed=True.
func finished(job *batchv1.Job) bool {
	return hasCondition(job.Status.Conditions, batchv1.JobComplete) || hasCondition(job.Status.Conditions, batchv1.JobFailed)
}

// describe renders job's status and pods for failure messages.
func (f *fixture) describe(job *batchv1.Job) string {
	var b strings.Builder
	cur := f.mirror.job(job.UID)
	if cur == nil {
		cur = job
	}
	s := cur.Status
	fmt.Fprintf(&b, "Job %s/%s (%s, resourceVersion %s) status:\n", cur.Namespace, cur.Name, f.target(), cur.ResourceVersion)
	fmt.Fprintf(&b, "  active=%d ready=%s terminating=%s succeeded=%d failed=%d completedIndexes=%q failedIndexes=%s\n",
		s.Active, ptrStr(s.Ready), ptrStr(s.Terminating), s.Succeeded, s.Failed, s.CompletedIndexes, strPtr(s.FailedIndexes))
	fmt.Fprintf(&b, "  startTime=%s completionTime=%s uncounted=%+v\n", timeStr(s.StartTime), timeStr(s.CompletionTime), s.UncountedTerminatedPods)
	for _, c := range s.Conditions {
		fmt.Fprintf(&b, "  condition %s=%s reason=%s at %s: %s\n", c.Type, c.Status, c.Reason, c.LastTransitionTime.Format(time.RFC3339), c.Message)
	}
	fmt.Fprintf(&b, "pods ever seen:\n")
	for _, r := range f.mirror.records(job) {
		p := r.last
		state := string(p.Status.Phase)
		if state == "" {
			state = "Pending"
		}
		if r.gone {
			state += ",gone"
		} else if p.DeletionTimestamp != nil {
			state += ",deleting"
		}
		fmt.Fprintf(&b, "  %s index=%s %s finalizer=%v created=%s exit=%s node=%q annotations=%s\n",
			p.Name, indexStr(p), state, hasTrackingFinalizer(p), p.CreationTimestamp.Format(time.RFC3339), exitStr(p), p.Spec.NodeName, jobAnnotations(p))
	}
	return b.String()
}

func ptrStr(p *int32) string {
	if p == nil {
		return "nil"
	}
	return strconv.Itoa(int(*p))
}

func strPtr(p *string) string {
	if p == nil {
		return "nil"
	}
	return strconv.Quote(*p)
}

func timeStr(t *metav1.Time) string {
	if t == nil {
		return "nil"
	}
	return t.Format(time.RFC3339)
}

func indexStr(p *corev1.Pod) string {
	if ix, ok := p.Annotations[batchv1.JobCompletionIndexAnnotation]; ok {
		return ix
	}
	return "-"
}

func exitStr(p *corev1.Pod) string {
	var parts []string
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Terminated != nil {
			parts = append(parts, fmt.Sprintf("%s:%d", cs.Name, cs.State.Terminated.ExitCode))
		}
	}
	return strings.Join(parts, ",")
}

// jobAnnotations renders the pod's batch.kubernetes.io/ annotations but the completion
// index.
func jobAnnotations(p *corev1.Pod) string {
	var keys []string
	for k := range p.Annotations {
		if strings.HasPrefix(k, "batch.kubernetes.io/") && k != batchv1.JobCompletionIndexAnnotation {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, strings.TrimPrefix(k, "batch.kubernetes.io/")+"="+p.Annotations[k])
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// waitFor polls cond every pollInterval until it returns true, and fails the test when it
// returns an error or timeout passes; what says what was awaited, diag (may be nil) adds
// the state to the failure message.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, error), diag func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if err != nil || time.Now().After(deadline) {
			msg := fmt.Sprintf("timed out after %v waiting for %s", timeout, what)
			if err != nil {
				msg = fmt.Sprintf("while waiting for %s: %v", what, err)
			}
			if diag != nil {
				msg += "\n" + diag()
			}
			t.Fatal(msg)
		}
		time.Sleep(pollInterval)
	}
}

// waitJob waits until cond holds for the watched Job and its current pods. A Job that has
// finished (Complete or Failed) and still does not satisfy cond two seconds later fails
// the wait at once: a finished Job does not change any more.
func (f *fixture) waitJob(job *batchv1.Job, timeout time.Duration, what string, cond func(j *batchv1.Job, pods []*corev1.Pod) bool) *batchv1.Job {
	f.t.Helper()
	var finishedSince time.Time
	var last *batchv1.Job
	waitFor(f.t, timeout, what, func() (bool, error) {
		last = f.mirror.job(job.UID)
		if cond(last, f.mirror.podsOf(job)) {
			return true, nil
		}
		if finished(last) {
			if finishedSince.IsZero() {
				finishedSince = time.Now()
			} else if time.Since(finishedSince) > 2*time.Second {
				return false, fmt.Errorf("the Job finished (%v) without it", condList(last.Status.Conditions))
			}
		}
		return false, nil
	}, func() string { return f.describe(job) })
	return last
}

// consistently checks that cond holds for the watched Job and its pods during d.
func (f *fixture) consistently(job *batchv1.Job, d time.Duration, what string, cond func(j *batchv1.Job, pods []*corev1.Pod) bool) {
	f.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !cond(f.mirror.job(job.UID), f.mirror.podsOf(job)) {
			f.t.Fatalf("expected %s for %v, but it stopped holding\n%s", what, d, f.describe(job))
		}
		time.Sleep(pollInterval)
	}
}

// activePods returns the active pods among pods.
func activePods(pods []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if isActive(p) {
			out = append(out, p)
		}
	}
	return out
}

// waitActive waits until job has exactly n active pods and returns them, ordered by index
// then creation.
func (f *fixture) waitActive(job *batchv1.Job, n int, timeout time.Duration) []*corev1.Pod {
	f.t.Helper()
	var got []*corev1.Pod
	f.waitJob(job, timeout, fmt.Sprintf("%d active pods", n), func(_ *batchv1.Job, pods []*corev1.Pod) bool {
		got = activePods(pods)
		return len(got) == n
	})
	return got
}

// waitNewActive waits for an active pod of job that is not one of the excluded pods and,
// for ix >= 0, has completion index ix.
func (f *fixture) waitNewActive(job *batchv1.Job, ix int, timeout time.Duration, exclude ...*corev1.Pod) *corev1.Pod {
	f.t.Helper()
	var got *corev1.Pod
	what := "a new active pod"
	if ix >= 0 {
		what = fmt.Sprintf("a new active pod for index %d", ix)
	}
	f.waitJob(job, timeout, what, func(_ *batchv1.Job, pods []*corev1.Pod) bool {
	next:
		for _, p := range activePods(pods) {
			if ix >= 0 && podIndex(p) != ix {
				continue
			}
			for _, e := range exclude {
				if e.UID == p.UID {
					continue next
				}
			}
			got = p
			return true
		}
		return false
	})
	return got
}

// waitFinished waits until the Job has the terminal condition cType and returns it.
func (f *fixture) waitFinished(job *batchv1.Job, cType batchv1.JobConditionType, timeout time.Duration) *batchv1.Job {
	f.t.Helper()
	return f.waitJob(job, timeout, fmt.Sprintf("condition %s=True", cType), func(j *batchv1.Job, _ []*corev1.Pod) bool {
		return hasCondition(j.Status.Conditions, cType)
	})
}

// wantConditions checks the Job's conditions, in order, as "Type/Status/Reason".
func (f *fixture) wantConditions(job *batchv1.Job, want ...string) {
	f.t.Helper()
	cur := f.mirror.job(job.UID)
	got := condList(cur.Status.Conditions)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		f.t.Errorf("Job %s conditions = %v, want %v\n%s", job.Name, got, want, f.describe(job))
	}
}

// wantConditionMessage checks the message of the Job's condition of type t, whatever its
// status.
func (f *fixture) wantConditionMessage(job *batchv1.Job, t batchv1.JobConditionType, want string) {
	f.t.Helper()
	for _, c := range f.mirror.job(job.UID).Status.Conditions {
		if c.Type == t {
			if c.Message != want {
				f.t.Errorf("Job %s condition %s message = %q, want %q", job.Name, t, c.Message, want)
			}
			return
		}
	}
	f.t.Errorf("Job %s has no %s condition\n%s", job.Name, t, f.describe(job))
}

// counters is the part of a Job status most scenarios check.
type counters struct {
	Active, Ready, Terminating, Succeeded, Failed int32
	CompletedIndexes                              string
	FailedIndexes                                 *string
}

func (c counters) String() string {
	return fmt.Sprintf("active=%d ready=%d terminating=%d succeeded=%d failed=%d completedIndexes=%q failedIndexes=%s",
		c.Active, c.Ready, c.Terminating, c.Succeeded, c.Failed, c.CompletedIndexes, strPtr(c.FailedIndexes))
}

func (c counters) eq(o counters) bool { return c.String() == o.String() }

func countersOf(s batchv1.JobStatus) counters {
	return counters{
		Active: s.Active, Ready: ptr.Deref(s.Ready, 0), Terminating: ptr.Deref(s.Terminating, 0),
		Succeeded: s.Succeeded, Failed: s.Failed,
		CompletedIndexes: s.CompletedIndexes, FailedIndexes: s.FailedIndexes,
	}
}

// wantCounters checks the Job's counters.
func (f *fixture) wantCounters(job *batchv1.Job, want counters) {
	f.t.Helper()
	got := countersOf(f.mirror.job(job.UID).Status)
	if got.String() != want.String() {
		f.t.Errorf("Job %s status:\n  got  %v\n  want %v\n%s", job.Name, got, want, f.describe(job))
	}
}

// waitCounters waits until the Job's counters are want.
func (f *fixture) waitCounters(job *batchv1.Job, want counters, timeout time.Duration) {
	f.t.Helper()
	f.waitJob(job, timeout, "status "+want.String(), func(j *batchv1.Job, _ []*corev1.Pod) bool {
		return countersOf(j.Status).String() == want.String()
	})
}

// waitEvent waits for an Event on the Job with the type, reason and message.
func (f *fixture) waitEvent(job *batchv1.Job, eventType, reason, message string) {
	f.t.Helper()
	var seen []string
	waitFor(f.t, settle, fmt.Sprintf("a %s Event %s %q on Job %s", eventType, reason, message, job.Name), func() (bool, error) {
		list, err := f.client.CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range list.Items {
			if e.InvolvedObject.UID != job.UID {
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s %q", e.Type, e.Reason, e.Message))
			if e.Type == eventType && e.Reason == reason && e.Message == message {
				return true, nil
			}
		}
		return false, nil
	}, func() string { return "Events on the Job:\n  " + strings.Join(seen, "\n  ") })
}

func strp(s string) *string { return &s }
