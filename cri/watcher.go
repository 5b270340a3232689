package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Options configure a Watcher. Zero fields take the defaults.
type Options struct {
	// Endpoint is the runtime's CRI socket, unix:///path (or a bare /path); "" or
	// EndpointAuto: the first of Sockets that exists and answers CRI Version.
	Endpoint string
	// Sockets are the candidates of discovery, in order; default DefaultSockets.
	Sockets []string
	// HostPrefix is prepended to every candidate of discovery: where the host's
	// directories are mounted when not at their own paths (e.g. /host); default none.
	HostPrefix string
	// ContainerdNamespace is the containerd namespace of the kubelet's containers, for
	// containerd's event service; default "k8s.io".
	ContainerdNamespace string
	// NoContainerdEvents turns containerd's event service off even where the runtime is
	// containerd (exits then come from relists alone).
	NoContainerdEvents bool
	// RelistPeriod is how often to relist when the runtime has no GetContainerEvents;
	// default 1s.
	RelistPeriod time.Duration
	// ResyncPeriod is how often to relist while the GetContainerEvents stream is in use;
	// default 1m.
	ResyncPeriod time.Duration
	// Backoff is the first wait before reconnecting, doubled after every failure up to
	// MaxBackoff; defaults 500ms and 5s (a missing socket costs one stat per retry).
	Backoff, MaxBackoff time.Duration
	// CallTimeout bounds every unary call to the runtime; default 10s.
	CallTimeout time.Duration
	// Buffer is the capacity of the events channel; default 256.
	Buffer int
	// StreamBuffer is how many received events (of the CRI stream, and of containerd's
	// event service) wait for the watcher before more are dropped and a relist replaces
	// them; default 1024. The streams are never made to wait.
	StreamBuffer int
	// StreamGrace: a GetContainerEvents stream that ends (io.EOF) before any event or
	// within StreamGrace of its opening is taken for a runtime that does not stream
	// (CRI-O with its pod events off); default 2s.
	StreamGrace time.Duration
	// StaleTolerance: CRI events created more than this before the subscription are
	// stale (replayed from before it) and ignored; default 1s.
	StaleTolerance time.Duration
	// ErrorLogInterval: the same connection error is logged again only after this long
	// (with how often it repeated meanwhile); default 5m.
	ErrorLogInterval time.Duration
	// Clock times relists, backoff and retries; default the real clock.
	Clock clock.WithTicker
}

func (o *Options) complete() {
	if len(o.Sockets) == 0 {
		o.Sockets = DefaultSockets
	}
	if o.ContainerdNamespace == "" {
		o.ContainerdNamespace = "k8s.io"
	}
	if o.RelistPeriod <= 0 {
		o.RelistPeriod = time.Second
	}
	if o.ResyncPeriod <= 0 {
		o.ResyncPeriod = time.Minute
	}
	if o.Backoff <= 0 {
		o.Backoff = 500 * time.Millisecond
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(5*time.Second, o.Backoff)
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.Buffer <= 0 {
		o.Buffer = 256
	}
	if o.StreamBuffer <= 0 {
		o.StreamBuffer = 1024
	}
	if o.StreamGrace <= 0 {
		o.StreamGrace = 2 * time.Second
	}
	if o.StaleTolerance <= 0 {
		o.StaleTolerance = time.Second
	}
	if o.ErrorLogInterval <= 0 {
		o.ErrorLogInterval = 5 * time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// maxShortStreams: after this many GetContainerEvents streams in a row that ended
// (io.EOF) within ResyncPeriod of their opening, the Watcher stops subscribing and
// relists for the rest of its life.
const maxShortStreams = 3

// Mode is how a Watcher learns about CRI container changes.
type Mode string

const (
	// ModeNone: not connected yet.
	ModeNone Mode = ""
	// ModeRelist: ListContainers every RelistPeriod.
	ModeRelist Mode = "relist"
	// ModeEvents: the GetContainerEvents stream, with a relist every ResyncPeriod.
	ModeEvents Mode = "events"
)

// Stats are a Watcher's counters, for the agent's metrics.
type Stats struct {
	Connected bool
	Mode      Mode
	// Endpoint is the runtime's CRI endpoint, configured or discovered ("" while none
	// is found).
	Endpoint string
	// Runtime is the runtime's name and version from CRI Version, e.g.
	// "containerd 1.6.20~ds1"; ContainerdEvents whether containerd's event service is
	// subscribed.
	Runtime          string
	ContainerdEvents bool
	// NoStream says why the GetContainerEvents stream is not used ("" when it is, or
	// before the first connection): the runtime answers Unimplemented, ends the stream
	// at once, or is a containerd before 2.0.
	NoStream string
	// Connects counts successful connections (the first and every reconnect).
	Connects uint64
	// Relists counts completed relists.
	Relists uint64
	// IgnoredContainers counts distinct containers without the kubelet's labels.
	IgnoredContainers uint64
	// StaleEvents counts CRI events created before the subscription (replayed by the
	// runtime from before it), ignored.
	StaleEvents uint64
	// StreamOverflows counts the times the CRI event stream delivered faster than the
	// watcher handled it (the consumer or the runtime's answers were slow) and events were
	// dropped, each answered with a relist; StreamDropped counts the dropped events.
	StreamOverflows, StreamDropped uint64
	// ContainerdOverflows and ContainerdDropped are the same for containerd's event
	// service. A dropped task exit is found again by the relist; a dropped OOM event of a
	// container that keeps running is lost.
	ContainerdOverflows, ContainerdDropped uint64
	// Emitted counts events by kind.
	Emitted map[Kind]uint64
}

// Watcher is the CRI (and containerd) implementation of Source.
type Watcher struct {
	opts        Options
	endpointErr error

	sockMu     sync.Mutex
	socketPath string // configured, or found by discovery; "" before

	mu      sync.Mutex // guards tracker and serialises sends on out
	tracker *tracker

	statsMu sync.Mutex // guards stats and lastErr; never held while waiting
	stats   Stats
	lastErr error

	// shortStreams counts GetContainerEvents streams in a row that ended soon after
	// they opened; only the run goroutine uses it.
	shortStreams int

	connected atomic.Bool
	out       chan ContainerEvent
	started   atomic.Bool
	// ctx is Events' context: sends give up only when it is done, never when a session
	// ends, so an exit the tracker has marked emitted is always delivered.
	ctx context.Context
}

var _ Source = (*Watcher)(nil)

// New returns a Watcher; nothing happens until Events is called.
func New(opts Options) *Watcher {
	opts.complete()
	w := &Watcher{opts: opts, tracker: newTracker(), out: make(chan ContainerEvent, opts.Buffer)}
	w.stats.Emitted = map[Kind]uint64{}
	if !IsAuto(opts.Endpoint) {
		w.socketPath, w.endpointErr = socketPath(opts.Endpoint)
	}
	return w
}

// socketPath accepts unix:///path and /path.
func socketPath(endpoint string) (string, error) {
	if strings.HasPrefix(endpoint, "/") {
		return endpoint, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "unix" || u.Path == "" {
		return "", fmt.Errorf("CRI endpoint %q: want unix:///path/to/socket", endpoint)
	}
	return u.Path, nil
}

// Connected reports whether the runtime answered the last call.
func (w *Watcher) Connected() bool { return w.connected.Load() }

// LastError says why the Watcher is not connected (nil when it is).
func (w *Watcher) LastError() error {
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	return w.lastErr
}

// Stats returns a snapshot of the counters. It does not wait for a stalled consumer.
func (w *Watcher) Stats() Stats {
	w.statsMu.Lock()
	defer w.statsMu.Unlock()
	s := w.stats
	s.Connected = w.connected.Load()
	s.Endpoint = w.Endpoint()
	s.Emitted = make(map[Kind]uint64, len(w.stats.Emitted))
	for k, v := range w.stats.Emitted {
		s.Emitted[k] = v
	}
	return s
}

// updateStats changes the stats under their lock.
func (w *Watcher) updateStats(f func(*Stats)) {
	w.statsMu.Lock()
	f(&w.stats)
	w.statsMu.Unlock()
}

// Events starts the watcher; see Source. It panics when called twice.
func (w *Watcher) Events(ctx context.Context) <-chan ContainerEvent {
	if !w.started.CompareAndSwap(false, true) {
		panic("cri: Watcher.Events called twice")
	}
	w.ctx = ctx
	go func() {
		defer close(w.out)
		w.run(ctx)
	}()
	return w.out
}

// run connects, watches until the connection breaks, and reconnects with backoff, until
// ctx is done. The same error is logged once per ErrorLogInterval, not on every retry.
func (w *Watcher) run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("cri")
	backoff := w.opts.Backoff
	var lastLogged string
	var loggedAt time.Time
	var repeats int
	for ctx.Err() == nil {
		wasConnected, err := w.session(ctx, logger)
		w.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if wasConnected {
			backoff = w.opts.Backoff
			lastLogged = "" // a new failure after a connection is news
		}
		w.statsMu.Lock()
		w.lastErr = err
		w.stats.Mode = ModeNone
		w.stats.ContainerdEvents = false
		w.statsMu.Unlock()
		now := w.opts.Clock.Now()
		if msg := err.Error(); msg != lastLogged || now.Sub(loggedAt) >= w.opts.ErrorLogInterval {
			logger.Error(err, "Container runtime not usable; retrying", "endpoint", w.endpointName(), "retryIn", backoff, "repeatedSinceLastLog", repeats)
			lastLogged, loggedAt, repeats = msg, now, 0
		} else {
			repeats++
			logger.V(4).Info("Container runtime still not usable; retrying", "err", err, "retryIn", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-w.opts.Clock.After(backoff):
		}
		backoff = min(2*backoff, w.opts.MaxBackoff)
	}
}

// endpointName is the endpoint for logs: the configured one, or "auto" and what
// discovery found.
func (w *Watcher) endpointName() string {
	if IsAuto(w.opts.Endpoint) {
		if e := w.Endpoint(); e != "" {
			return "auto: " + e
		}
		return EndpointAuto
	}
	return w.opts.Endpoint
}

// session is one connection to the runtime: check that it serves CRI, relist, then follow
// the event stream or relist periodically until a call fails. It reports whether it got
// connected, and why it ended.
func (w *Watcher) session(ctx context.Context, logger klog.Logger) (bool, error) {
	c, err := w.connect(ctx)
	if err != nil {
		return false, err
	}
	defer c.cc.Close()
	v := c.version
	runtime := v.GetRuntimeName() + " " + v.GetRuntimeVersion()
	w.connected.Store(true)
	w.statsMu.Lock()
	w.lastErr = nil
	w.stats.Connects++
	w.stats.Runtime = runtime
	w.statsMu.Unlock()
	logger.Info("Connected to the container runtime", "endpoint", c.endpoint, "runtime", runtime, "criVersion", v.GetRuntimeApiVersion())

	sctx, cancelSession := context.WithCancel(ctx)
	s := &session{w: w, rt: c.rt, logger: logger, relistNow: make(chan struct{}, 1)}
	if v.GetRuntimeName() == "containerd" && !w.opts.NoContainerdEvents {
		s.spawn(func() { s.containerdEvents(sctx, c.cc) })
	}
	useStream, why := streamVerdict(v.GetRuntimeName(), v.GetRuntimeVersion())
	if useStream && w.shortStreams >= maxShortStreams {
		useStream, why = false, fmt.Sprintf("the runtime ended its last %d GetContainerEvents streams soon after they opened", w.shortStreams)
	}
	if !useStream {
		logger.Info("Not subscribing to CRI GetContainerEvents; relisting", "why", why, "period", w.opts.RelistPeriod)
	}
	err = s.watch(sctx, useStream, why)
	// Nothing of this session may emit after it (Events closes the channel after the last
	// session).
	cancelSession()
	s.wg.Wait()
	return true, fmt.Errorf("CRI endpoint %s: connection lost: %w", c.endpoint, err)
}

// session is the state of one connection.
type session struct {
	w      *Watcher
	rt     runtimeapi.RuntimeServiceClient
	logger klog.Logger
	wg     sync.WaitGroup // goroutines that may emit
	// relistNow asks the session's loop for a relist at once (containerd's event queue
	// overflowed, or too many task exits are being waited for).
	relistNow chan struct{}
}

// spawn runs f in a goroutine the session waits for before it ends.
func (s *session) spawn(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// requestRelist asks the session's loop for a relist; it never blocks.
func (s *session) requestRelist() {
	select {
	case s.relistNow <- struct{}{}:
	default:
	}
}

// errStreamEnded: the runtime ended the GetContainerEvents stream (io.EOF) after it had
// worked for a while.
var errStreamEnded = errors.New("the runtime ended the GetContainerEvents stream")

// watch opens the GetContainerEvents stream when useStream (before the first relist, so
// nothing falls between them), relists, then follows the stream or relists every
// RelistPeriod: without the stream, when the runtime answers Unimplemented, or when it
// ends the stream at once (CRI-O with its pod events off). The stream is read by a
// goroutine of its own into a bounded queue, so that the runtime never waits for the
// watcher.
func (s *session) watch(ctx context.Context, useStream bool, why string) error {
	w := s.w
	clk := w.opts.Clock
	var q *streamQueue[*runtimeapi.ContainerEventResponse]
	var opened time.Time
	if useStream {
		// Events created before this moment (less a tolerance) are stale: containerd 1.7
		// keeps events in its shared channel of 1000 whether anyone listens or not
		// (pkg/cri/server/helpers.go, v1.7.34), and containerd 2.x replays to a new
		// subscriber what it queued while nobody listened, for up to 5 minutes
		// (internal/eventq/eventq.go, v2.3.4). The relist below covers them.
		opened = clk.Now()
		stream, err := s.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
		switch {
		case err == nil:
			q = newStreamQueue[*runtimeapi.ContainerEventResponse](w.opts.StreamBuffer)
			go func() {
				for {
					ev, err := stream.Recv()
					if err != nil {
						q.close(err)
						return
					}
					if dropped, overflowed := q.push(ev); dropped {
						w.updateStats(func(st *Stats) {
							st.StreamDropped++
							if overflowed {
								st.StreamOverflows++
							}
						})
					}
				}
			}()
		case status.Code(err) == codes.Unimplemented:
			why = "the runtime has no GetContainerEvents (Unimplemented)"
		default:
			return fmt.Errorf("GetContainerEvents: %w", err)
		}
	}
	staleBefore := opened.Add(-w.opts.StaleTolerance).UnixNano()

	if err := s.relist(ctx); err != nil {
		return err
	}
	mode := ModeRelist
	if q != nil {
		// Optimistic: a runtime without the stream answers Unimplemented, or ends it, at
		// once.
		mode, why = ModeEvents, ""
	}
	s.setMode(mode, why)

	// The next relist is due a period after the last one; stream events do not move it.
	period := func() time.Duration {
		if mode == ModeEvents {
			return w.opts.ResyncPeriod
		}
		return w.opts.RelistPeriod
	}
	lastRelist := clk.Now()
	timer := clk.NewTimer(period())
	defer func() { timer.Stop() }()
	relist := func() error {
		if err := s.relist(ctx); err != nil {
			return err
		}
		lastRelist = clk.Now()
		timer.Stop()
		timer = clk.NewTimer(period())
		return nil
	}
	var ready <-chan struct{}
	if q != nil {
		ready = q.ready
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ready:
			items, overflow, dropped, ended, end := q.take()
			if overflow {
				s.logger.V(1).Info("CRI events came faster than they were handled; dropped some and relisting", "dropped", dropped)
				if err := relist(); err != nil {
					return err
				}
			}
			for _, ev := range items {
				if at := ev.GetCreatedAt(); at > 0 && at < staleBefore {
					w.updateStats(func(st *Stats) { st.StaleEvents++ })
					continue
				}
				if err := s.handleCRIEvent(ctx, ev); err != nil {
					return err
				}
			}
			if !ended {
				continue
			}
			// The stream ended: Unimplemented, or io.EOF at once, means the runtime does
			// not stream (CRI-O's GetContainerEvents returns nil at once when
			// enable_pod_events is false, its default: server/container_events.go,
			// v1.36); io.EOF after it worked is a connection lost (resync by
			// reconnecting); anything else too.
			lived := clk.Since(opened)
			switch {
			case status.Code(end) == codes.Unimplemented:
				why = "the runtime has no GetContainerEvents (Unimplemented)"
			case errors.Is(end, io.EOF) && (q.count() == 0 || lived < w.opts.StreamGrace):
				why = "the runtime ended the GetContainerEvents stream at once (CRI-O with enable_pod_events off?)"
			case errors.Is(end, io.EOF):
				if lived < w.opts.ResyncPeriod {
					w.shortStreams++
				} else {
					w.shortStreams = 0
				}
				return fmt.Errorf("%w after %v", errStreamEnded, lived)
			default:
				return fmt.Errorf("GetContainerEvents stream: %w", end)
			}
			s.logger.V(1).Info("No CRI event stream; relisting", "why", why, "period", w.opts.RelistPeriod)
			q, ready, mode = nil, nil, ModeRelist
			timer.Stop()
			if remaining := w.opts.RelistPeriod - clk.Since(lastRelist); remaining > 0 {
				timer = clk.NewTimer(remaining)
			} else if err := relist(); err != nil {
				return err
			}
			// Last, so that whoever sees the mode also sees the relist timer.
			s.setMode(mode, why)
		case <-s.relistNow:
			if err := relist(); err != nil {
				return err
			}
		case <-timer.C():
			if err := relist(); err != nil {
				return err
			}
		}
	}
}

func (s *session) setMode(m Mode, noStream string) {
	s.w.updateStats(func(st *Stats) {
		st.Mode = m
		st.NoStream = noStream
	})
}

// relist lists every container and fetches the status of those that changed.
func (s *session) relist(ctx context.Context) error {
	w := s.w
	w.mu.Lock()
	begin := w.tracker.beginList()
	w.mu.Unlock()

	lctx, cancel := context.WithTimeout(ctx, w.opts.CallTimeout)
	r, err := s.rt.ListContainers(lctx, &runtimeapi.ListContainersRequest{})
	cancel()
	if err != nil {
		return fmt.Errorf("ListContainers: %w", err)
	}
	var check []*runtimeapi.Container
	w.mu.Lock()
	for _, c := range r.GetContainers() {
		if w.tracker.listed(c) {
			check = append(check, c)
		}
	}
	w.mu.Unlock()
	for _, c := range check {
		if err := s.checkContainer(ctx, c.GetId(), c.GetPodSandboxId(), SourceRelist); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.tracker.endList(begin)
	ignored := w.tracker.ignoredTotal
	w.mu.Unlock()
	w.updateStats(func(st *Stats) {
		st.Relists++
		st.IgnoredContainers = ignored
	})
	return nil
}

// checkContainer fetches a container's verbose status and emits what changed. A container
// that is gone is not an error.
func (s *session) checkContainer(ctx context.Context, id, sandboxID, source string) error {
	st, info, err := s.status(ctx, id)
	if status.Code(err) == codes.NotFound {
		return nil
	}
	if err != nil {
		return err
	}
	s.w.observe(st, info, sandboxID, source)
	return nil
}

func (s *session) status(ctx context.Context, id string) (*runtimeapi.ContainerStatus, map[string]string, error) {
	cctx, cancel := context.WithTimeout(ctx, s.w.opts.CallTimeout)
	defer cancel()
	r, err := s.rt.ContainerStatus(cctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("ContainerStatus %s: %w", id, err)
	}
	return r.GetStatus(), r.GetInfo(), nil
}

// handleCRIEvent applies one GetContainerEvents event.
func (s *session) handleCRIEvent(ctx context.Context, ev *runtimeapi.ContainerEventResponse) error {
	id := ev.GetContainerId()
	switch ev.GetContainerEventType() {
	case runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT:
		s.w.mu.Lock()
		s.w.tracker.forget(id)
		s.w.mu.Unlock()
		return nil
	case runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT:
		// The event carries the pod's container statuses; the exit needs no call.
		for _, st := range ev.GetContainersStatuses() {
			if st.GetId() == id && st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED {
				s.w.observe(st, nil, ev.GetPodSandboxStatus().GetId(), SourceCRIEvents)
				return nil
			}
		}
		return s.checkContainer(ctx, id, ev.GetPodSandboxStatus().GetId(), SourceCRIEvents)
	case runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT:
		// Started needs the verbose status for the cgroup path.
		return s.checkContainer(ctx, id, ev.GetPodSandboxStatus().GetId(), SourceCRIEvents)
	}
	return nil
}

// observe runs a status through the tracker and emits the result.
func (w *Watcher) observe(st *runtimeapi.ContainerStatus, info map[string]string, sandboxID, source string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ev, ok := w.tracker.observe(st, info, sandboxID, source, w.opts.Clock.Now())
	ignored := w.tracker.ignoredTotal
	w.updateStats(func(st *Stats) { st.IgnoredContainers = ignored })
	if ok {
		w.sendLocked(ev)
	}
}

// sendLocked emits an event; w.mu is held so that events of one container keep their
// order whichever goroutine found them. A full channel blocks the watcher's calls to the
// runtime (back pressure), never drops an event the tracker has marked emitted; the
// runtime's event streams are not held back meanwhile (their queues drop and a relist
// follows), nor is Stats.
func (w *Watcher) sendLocked(ev ContainerEvent) {
	select {
	case w.out <- ev:
		w.updateStats(func(st *Stats) { st.Emitted[ev.Kind]++ })
	case <-w.ctx.Done():
	}
}
