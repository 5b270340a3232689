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
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/agent/exithistory"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// Defaults of Config. DefaultBatchPeriod was measured against 10 and 20 ms
// (docs/performance.md): when a pod's containers die together a 10 ms batch took about 28% more
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
	History *v1alpha1.Exit
	// EventTime is the runtime's time of what the stamp is about (finishedAt, OOM event
	// time), the start of the detection latency. Zero: not recorded.
	EventTime time.Time
	// ObservedTime is when the agent's runtime watcher had the event (cri.ContainerEvent's
	// ObservedAt), by the agent's clock: it splits the detection latency into the observe
	// stage (EventTime to ObservedTime) and the write stage (ObservedTime to the patch).
	// Zero: not recorded, neither stage is.
	ObservedTime time.Time
	// DeviceSignal, on the request of a device verdict's coroner.dev/DeviceFailed stamp,
	// is the verdict's signal (kubelet, driver, none): its written stamp records the
	// device verdict's latency from EventTime.
	DeviceSignal string
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
	history []v1alpha1.Exit
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
