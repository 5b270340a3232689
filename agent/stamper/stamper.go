// Package stamper is the node agent's write queue: it takes the stamps the agent decided
// (agent/classify.Stamp) and writes them on the pods, batching and deduplicating per pod
// and retrying with backoff, as node-problem-detector's condition manager does for node
// conditions.
//
//   - Batching: a pod's first pending stamp waits one BatchPeriod (default 100 ms) for
//     others of the same pod; then all of them go out together, so a pod gets at most one
//     write per batch period (one patch of the phase and conditions, plus one of the
//     exit history annotation when it changes too; both through pods/status).
//   - Deduplication: of several conditions of the same type the first stays (the first
//     cause of death is the one on the pod), of several terminal phases the first; the
//     conditions writers (package conditions) skip writes that change nothing and handle
//     conflicts by reading the pod again.
//   - Exit history (A5): the annotation is recomputed at every write from the pod's
//     current value and every exit the stamper has recorded for the pod, so that two
//     exits close together, or a write computed from a cache that has not seen the
//     previous one yet, never lose an entry.
//   - Retry: a failed write keeps the pod's stamps pending and retries after
//     RetryBase doubled per failure up to RetryMax, recomputed from the pod as then
//     known (new stamps of the pod join in). A pod that is gone (404, or its UID
//     changed) drops its stamps.
//   - A terminal phase carries the runtime's exits its stamp has (Stamp.Terminated)
//     into the container statuses, in the same patch, never over a terminated state
//     the kubelet wrote.
//   - It never deletes a pod and never writes a pod the Lookup does not know (the
//     agent's cache holds only pods of its own node).
//
// For each stamp written (a write that changed the pod), the stamper records the stamp
// metric and the latency from the request's EventTime (the runtime's time of the exit or
// OOM kill) to the successful patch, split at the request's ObservedTime (when the
// agent's runtime watcher had the event) into the observe and the write stage when that
// is known, logs, and emits a Stamped Event on the pod.
package stamper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
)

// Defaults of Config. DefaultBatchPeriod was measured against 10 and 20 ms (README,
// Performance): when a pod's containers die together a 10 ms batch took about 28% more
// pod writes and wrote no sooner; alone, a stamp is about 90 ms later at 100 ms.
const (
	DefaultBatchPeriod = 100 * time.Millisecond
	DefaultRetryBase   = 200 * time.Millisecond
	DefaultRetryMax    = 30 * time.Second
	DefaultWorkers     = 4
)

// PodRef names a pod.
type PodRef struct {
	Namespace, Name string
	UID             types.UID
}

func (r PodRef) String() string { return r.Namespace + "/" + r.Name }

// Request is one stamp to write on a pod.
type Request struct {
	Pod   PodRef
	Stamp classify.Stamp
	// History is the exit of a KindExitHistory stamp; the stamp's own annotation value
	// is not used (see the package comment).
	History *exithistory.Entry
	// EventTime is the runtime's time of what the stamp is about (finishedAt, OOM event
	// time), the start of the detection latency. Zero: not recorded.
	EventTime time.Time
	// ObservedTime is when the agent's runtime watcher had the event (cri.ContainerEvent's
	// ObservedAt), by the agent's clock: it splits the detection latency into the observe
	// stage (EventTime to ObservedTime) and the write stage (ObservedTime to the patch).
	// Zero: not recorded, neither stage is.
	ObservedTime time.Time
}

// Config configures a Stamper. Patcher and Lookup are required.
type Config struct {
	// Patcher reads and patches pods.
	Patcher conditions.PodPatcher
	// Lookup returns the pod with this UID as last known (the agent's informer cache),
	// or nil when it is gone. The pod is not modified.
	Lookup func(types.UID) *corev1.Pod
	// Clock times batches and retries; default the real clock.
	Clock clock.WithTicker
	// BatchPeriod: see the package comment; default 100ms.
	BatchPeriod time.Duration
	// RetryBase and RetryMax bound the backoff after a failed write; defaults 200ms
	// and 30s.
	RetryBase, RetryMax time.Duration
	// Workers is how many pods are written at the same time; default 4.
	Workers int
	// History bounds the exit history annotation; zero fields take
	// exithistory.DefaultLimits'.
	History exithistory.Limits
	// Metrics receives the stamp metrics; nil records nothing.
	Metrics *metrics.Metrics
	// Recorder emits a Stamped Event per stamp written; nil emits none.
	Recorder record.EventRecorder
	// RuntimeScheme returns the container runtime's name ("containerd", "cri-o"), the
	// scheme of the container IDs written with a terminal phase (Stamp.Terminated);
	// nil or "" means the scheme of the pod's own container IDs.
	RuntimeScheme func() string
}

// Stamper batches and writes stamps. Create it with New, feed it with Add, and run it
// with Run.
type Stamper struct {
	cfg  Config
	mu   sync.Mutex
	pods map[types.UID]*podQueue
	wake chan struct{}
	sem  chan struct{}
	wg   sync.WaitGroup
	// flushing: Flush was called; nothing waits for its batch period any more.
	flushing bool
}

// podQueue is the state of one pod.
type podQueue struct {
	ref      PodRef
	pending  []Request
	due      time.Time // when pending may be written
	retryAt  time.Time // not before (after a failure)
	failures int
	// writing is how many requests the write in flight carries; 0: none in flight.
	writing int
	// history is every exit recorded for the pod, for the annotation's recomputation.
	history []exithistory.Entry
	// forgotten: the pod was deleted while a write was in flight.
	forgotten bool
}

// New returns a Stamper.
func New(cfg Config) *Stamper {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.BatchPeriod <= 0 {
		cfg.BatchPeriod = DefaultBatchPeriod
	}
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = DefaultRetryBase
	}
	if cfg.RetryMax < cfg.RetryBase {
		cfg.RetryMax = max(DefaultRetryMax, cfg.RetryBase)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.History.MaxEntries == 0 {
		cfg.History.MaxEntries = exithistory.DefaultLimits.MaxEntries
	}
	if cfg.History.MaxBytes == 0 {
		cfg.History.MaxBytes = exithistory.DefaultLimits.MaxBytes
	}
	if cfg.Metrics != nil && cfg.Patcher != nil {
		cfg.Patcher = countingPatcher{cfg.Patcher, cfg.Metrics}
	}
	return &Stamper{
		cfg:  cfg,
		pods: map[types.UID]*podQueue{},
		wake: make(chan struct{}, 1),
		sem:  make(chan struct{}, cfg.Workers),
	}
}

// Add queues requests. Stamps that write nothing are ignored; a request equal to one
// already pending for the pod is dropped (the earlier one, with the earlier EventTime,
// stays).
func (s *Stamper) Add(reqs ...Request) {
	now := s.cfg.Clock.Now()
	added := false
	s.mu.Lock()
	for _, r := range reqs {
		if !r.Stamp.Writes() || r.Pod.UID == "" {
			continue
		}
		if r.Stamp.Kind == classify.KindExitHistory && r.History == nil {
			continue // nothing to recompute the annotation from
		}
		q := s.pods[r.Pod.UID]
		if q == nil {
			q = &podQueue{ref: r.Pod}
			s.pods[r.Pod.UID] = q
		}
		if r.History != nil {
			q.remember(*r.History, s.cfg.History.MaxEntries)
		}
		if q.hasPending(r) {
			continue
		}
		if len(q.pending) == 0 {
			q.due = now
			if !s.flushing {
				q.due = now.Add(s.cfg.BatchPeriod)
			}
		}
		q.pending = append(q.pending, r)
		added = true
	}
	s.mu.Unlock()
	if added {
		s.poke()
	}
}

// Forget drops everything about a pod (it was deleted).
func (s *Stamper) Forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.pods[uid]; q != nil {
		q.forgotten = true
		delete(s.pods, uid)
	}
}

// Pending returns how many requests wait for the pod (for tests and logs).
func (s *Stamper) Pending(uid types.UID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.pods[uid]; q != nil {
		return len(q.pending)
	}
	return 0
}

// Flush ends batching for good: every pending stamp, and every one added later, is
// written as soon as a worker is free (retries still back off). For a stopping agent,
// which should not spend its grace period waiting for batches.
func (s *Stamper) Flush() {
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	s.flushing = true
	for _, q := range s.pods {
		if q.due.After(now) {
			q.due = now
		}
	}
	s.mu.Unlock()
	s.poke()
}

// Idle reports whether nothing is pending or being written.
func (s *Stamper) Idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.pods {
		if q.writing > 0 || len(q.pending) > 0 {
			return false
		}
	}
	return true
}

// Unwritten returns the pods with stamps pending or being written, and how many stamps
// they wait for in all (a shutdown's log and drop count). A stamp in a write still in
// flight counts: whether it lands is not known when the agent stops.
func (s *Stamper) Unwritten() (pods []PodRef, stamps int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range s.pods {
		if q.writing > 0 || len(q.pending) > 0 {
			pods = append(pods, q.ref)
			stamps += len(q.pending) + q.writing
		}
	}
	return pods, stamps
}

func (s *Stamper) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run writes due stamps until ctx is done, then waits for the writes in flight.
func (s *Stamper) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("stamper")
	defer s.wg.Wait()
	for {
		now := s.cfg.Clock.Now()
		for _, w := range s.takeDue(now) {
			select {
			case s.sem <- struct{}{}:
			case <-ctx.Done():
				s.requeue(w, nil)
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() { <-s.sem }()
				s.write(ctx, logger, w)
				s.poke()
			}()
		}
		var timer clock.Timer
		var fire <-chan time.Time
		if next, ok := s.nextDue(); ok {
			timer = s.cfg.Clock.NewTimer(max(next.Sub(now), 0))
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return
		case <-s.wake:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// work is one pod's write: its pending requests and its exit history.
type work struct {
	q       *podQueue
	reqs    []Request
	history []exithistory.Entry
}

// takeDue moves the due pods' pending requests out and marks them in flight.
func (s *Stamper) takeDue(now time.Time) []work {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []work
	for _, q := range s.pods {
		if q.writing > 0 || len(q.pending) == 0 || now.Before(q.due) || now.Before(q.retryAt) {
			continue
		}
		q.writing = len(q.pending)
		out = append(out, work{q: q, reqs: q.pending, history: append([]exithistory.Entry(nil), q.history...)})
		q.pending = nil
	}
	return out
}

// nextDue is the earliest time a pod not in flight may be written.
func (s *Stamper) nextDue() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var next time.Time
	found := false
	for _, q := range s.pods {
		if q.writing > 0 || len(q.pending) == 0 {
			continue
		}
		t := q.due
		if q.retryAt.After(t) {
			t = q.retryAt
		}
		if !found || t.Before(next) {
			next, found = t, true
		}
	}
	return next, found
}

// requeue puts requests that were not written back, ahead of those added meanwhile, and
// ends the write. failed says whether to back off.
func (s *Stamper) requeue(w work, failed error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := w.q
	q.writing = 0
	if q.forgotten {
		return
	}
	now := s.cfg.Clock.Now()
	if failed != nil {
		q.failures++
		backoff := s.cfg.RetryBase << min(q.failures-1, 20)
		if backoff <= 0 || backoff > s.cfg.RetryMax {
			backoff = s.cfg.RetryMax
		}
		q.retryAt = now.Add(backoff)
	}
	if len(w.reqs) == 0 {
		return
	}
	rest := q.pending
	q.pending = nil
	for _, r := range w.reqs {
		if !q.hasPending(r) {
			q.pending = append(q.pending, r)
		}
	}
	for _, r := range rest {
		if !q.hasPending(r) {
			q.pending = append(q.pending, r)
		}
	}
	if failed == nil && q.due.After(now) {
		q.due = now
	}
}

// done ends a successful write.
func (s *Stamper) done(w work) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.q.writing = 0
	w.q.failures = 0
	w.q.retryAt = time.Time{}
	if !w.q.forgotten && len(w.q.pending) == 0 && len(w.q.history) == 0 {
		delete(s.pods, w.q.ref.UID)
	}
}

// drop ends a write whose pod is gone.
func (s *Stamper) drop(w work) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.q.writing = 0
	if s.pods[w.q.ref.UID] == w.q {
		delete(s.pods, w.q.ref.UID)
	}
}

// hasPending reports whether a request equal to r is pending.
func (q *podQueue) hasPending(r Request) bool {
	for _, p := range q.pending {
		if sameStamp(p, r) {
			return true
		}
	}
	return false
}

func sameStamp(a, b Request) bool {
	sa, sb := a.Stamp, b.Stamp
	if sa.Kind != sb.Kind || sa.Phase != sb.Phase || (sa.Condition == nil) != (sb.Condition == nil) {
		return false
	}
	if sa.Condition != nil && (sa.Condition.Type != sb.Condition.Type || sa.Condition.Status != sb.Condition.Status ||
		sa.Condition.Reason != sb.Condition.Reason || sa.Condition.Message != sb.Condition.Message) {
		return false
	}
	if (a.History == nil) != (b.History == nil) {
		return false
	}
	return a.History == nil || *a.History == *b.History
}

// remember records an exit for the annotation, keeping the latest max*2.
func (q *podQueue) remember(e exithistory.Entry, limit int) {
	for _, h := range q.history {
		if h == e {
			return
		}
	}
	q.history = append(q.history, e)
	if n := 2 * max(limit, 1); len(q.history) > n {
		q.history = q.history[len(q.history)-n:]
	}
}

// write writes one pod's requests.
func (s *Stamper) write(ctx context.Context, logger klog.Logger, w work) {
	ref := w.q.ref
	logger = logger.WithValues("pod", klog.KRef(ref.Namespace, ref.Name), "podUID", ref.UID)
	pod := s.cfg.Lookup(ref.UID)
	if pod == nil || pod.UID != ref.UID {
		logger.V(2).Info("Pod is gone; dropping its stamps", "stamps", len(w.reqs))
		for range w.reqs {
			s.cfg.Metrics.Dropped(metrics.DroppedPodGone)
		}
		s.drop(w)
		return
	}
	written, rest, err := s.apply(ctx, pod, w)
	end := s.cfg.Clock.Now()
	for _, r := range written {
		s.stamped(logger, pod, r, end)
	}
	switch {
	case errors.Is(err, conditions.ErrPodGone):
		logger.V(2).Info("Pod is gone; dropping its stamps", "stamps", len(rest))
		for range rest {
			s.cfg.Metrics.Dropped(metrics.DroppedPodGone)
		}
		s.drop(w)
	case err != nil:
		s.cfg.Metrics.WriteFailed()
		w.reqs = rest
		s.requeue(w, err)
		s.mu.Lock()
		retryIn := w.q.retryAt.Sub(end)
		s.mu.Unlock()
		logger.Error(err, "Writing the pod failed; retrying", "stamps", len(rest), "retryIn", retryIn)
	default:
		s.done(w)
	}
}

// apply makes the writes and returns the requests it wrote (changed the pod), those
// still to write (on error) and the error.
func (s *Stamper) apply(ctx context.Context, pod *corev1.Pod, w work) (written, rest []Request, err error) {
	now := func() metav1.Time { return metav1.NewTime(s.cfg.Clock.Now()) }

	// Merge: the first terminal phase, the first condition of each type, the history.
	var phase *Request
	type condReq struct {
		cond corev1.PodCondition
		reqs []Request
	}
	var conds []*condReq
	var hist []Request
	addCond := func(r Request) {
		for _, c := range conds {
			if c.cond.Type == r.Stamp.Condition.Type {
				return // a later condition of a type already stamped: merged away
			}
		}
		conds = append(conds, &condReq{cond: *r.Stamp.Condition, reqs: []Request{r}})
	}
	for _, r := range w.reqs {
		switch {
		case r.Stamp.Phase != "":
			if phase == nil { // a later phase is merged away
				rr := r
				phase = &rr
			}
		case r.Stamp.Condition != nil:
			addCond(r)
		}
		if r.History != nil {
			hist = append(hist, r)
		}
	}
	// Status: one patch with the phase and every condition, or the conditions alone.
	var phaseCond *corev1.PodCondition
	if phase != nil {
		phaseCond = phase.Stamp.Condition
	}
	others := conds
	if phaseCond != nil {
		others = nil
		for _, c := range conds {
			if c.cond.Type == phaseCond.Type {
				continue // the phase stamp carries its own
			}
			others = append(others, c)
		}
	}
	pending := func(from int) []Request {
		var out []Request
		for _, c := range others[from:] {
			out = append(out, c.reqs...)
		}
		return append(out, hist...)
	}

	if phase != nil && !conditions.IsTerminalPhase(pod.Status.Phase) {
		all := []corev1.PodCondition{}
		if phaseCond != nil {
			all = append(all, *phaseCond)
		}
		for _, c := range others {
			all = append(all, c.cond)
		}
		var changed bool
		var err error
		if len(phase.Stamp.Terminated) > 0 {
			// The runtime's exits go with the phase into the container statuses.
			var scheme string
			if s.cfg.RuntimeScheme != nil {
				scheme = s.cfg.RuntimeScheme()
			}
			changed, err = ensurePhaseWithExits(ctx, s.cfg.Patcher, pod, phase.Stamp.Phase, phase.Stamp.Terminated, scheme, now, all...)
		} else {
			changed, err = conditions.EnsurePodPhase(ctx, s.cfg.Patcher, pod, phase.Stamp.Phase, now, all...)
		}
		if err != nil {
			return nil, append([]Request{*phase}, pending(0)...), err
		}
		if changed {
			written = append(written, *phase)
			for _, c := range others {
				written = append(written, c.reqs...)
			}
			others = nil
		}
		// Not changed: the pod turned terminal meanwhile (the kubelet's word wins; its
		// condition comes with the next decision) or already had it all. The other
		// conditions go on their own below, which writes nothing when they are there.
	}
	for i, c := range others {
		changed, err := conditions.EnsurePodCondition(ctx, s.cfg.Patcher, pod, c.cond, now)
		if err != nil {
			return written, pending(i), err
		}
		if changed {
			written = append(written, c.reqs...)
		}
	}

	// Metadata: the exit history, recomputed.
	if len(hist) > 0 {
		cur := pod.Annotations[conditions.AnnotationExitHistory]
		value := cur
		for _, e := range w.history {
			if v, _, err := exithistory.Append(value, e, s.cfg.History); err == nil || errors.Is(err, exithistory.ErrMalformed) {
				value = v
			}
		}
		if value != cur {
			changed, err := conditions.EnsurePodAnnotation(ctx, s.cfg.Patcher, pod, conditions.AnnotationExitHistory, value)
			if err != nil {
				return written, hist, err
			}
			if changed {
				written = append(written, hist...)
			}
		}
	}
	return written, nil, nil
}

// stamped records, logs and announces one written stamp.
func (s *Stamper) stamped(logger klog.Logger, pod *corev1.Pod, r Request, at time.Time) {
	st := r.Stamp
	var latency time.Duration
	if !r.EventTime.IsZero() {
		latency = at.Sub(r.EventTime)
		s.cfg.Metrics.Stamped(string(st.Kind), st.Reason, latency.Seconds())
	} else if s.cfg.Metrics != nil {
		s.cfg.Metrics.Stamps.WithLabelValues(string(st.Kind), st.Reason).Inc()
	}
	observed, observedOK, written, writtenOK := stages(r, at)
	if observedOK {
		s.cfg.Metrics.Observed(string(st.Kind), observed.Seconds())
	}
	if writtenOK {
		s.cfg.Metrics.Written(string(st.Kind), written.Seconds())
	}
	logger.Info("Stamped pod", "kind", st.Kind, "reason", st.Reason, "latency", latency, "observed", observed, "written", written, "message", st.Message)
	if s.cfg.Recorder == nil || st.Kind == classify.KindExitHistory {
		return
	}
	eventType := corev1.EventTypeWarning
	msg := st.Message
	if st.Condition != nil && st.Phase == "" {
		msg = fmt.Sprintf("%s=%s (%s): %s", st.Condition.Type, st.Condition.Status, st.Condition.Reason, st.Message)
	}
	if st.Kind == classify.KindTerminalPhase && st.Phase == corev1.PodSucceeded {
		eventType = corev1.EventTypeNormal
	}
	s.cfg.Recorder.Event(pod, eventType, conditions.EventReasonStamped, msg)
}

// stages splits a written stamp's detection latency at its ObservedTime: observed is
// EventTime to ObservedTime, written ObservedTime to at (the patch). A stage is not
// known (zero, false) when one of its times is zero or it is negative (clock skew
// between the runtime and the agent).
func stages(r Request, at time.Time) (observed time.Duration, observedOK bool, written time.Duration, writtenOK bool) {
	if r.ObservedTime.IsZero() {
		return 0, false, 0, false
	}
	if !r.EventTime.IsZero() {
		if d := r.ObservedTime.Sub(r.EventTime); d >= 0 {
			observed, observedOK = d, true
		}
	}
	if !at.IsZero() {
		if d := at.Sub(r.ObservedTime); d >= 0 {
			written, writtenOK = d, true
		}
	}
	return observed, observedOK, written, writtenOK
}

// countingPatcher counts the patches it passes on (metrics.PodWrites).
type countingPatcher struct {
	conditions.PodPatcher
	m *metrics.Metrics
}

func (c countingPatcher) PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, subresources ...string) (*corev1.Pod, error) {
	c.m.Wrote()
	return c.PodPatcher.PatchPod(ctx, namespace, name, pt, data, subresources...)
}
