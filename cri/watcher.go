package cri

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

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
