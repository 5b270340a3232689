package cri

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Options configure a Watcher. Zero fields take the defaults.
type Options struct {
	// Endpoint is the runtime's CRI socket, unix:///path (or a bare /path).
	Endpoint string
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
	// Clock times relists, backoff and retries; default the real clock.
	Clock clock.WithTicker
}

func (o *Options) complete() {
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
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

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
	// Runtime is the runtime's name and version from CRI Version, e.g.
	// "containerd 1.6.20~ds1"; ContainerdEvents whether containerd's event service is
	// subscribed.
	Runtime          string
	ContainerdEvents bool
	// Connects counts successful connections (the first and every reconnect).
	Connects uint64
	// Relists counts completed relists.
	Relists uint64
	// IgnoredContainers counts distinct containers without the kubelet's labels.
	IgnoredContainers uint64
	// Emitted counts events by kind.
	Emitted map[Kind]uint64
}

// Watcher is the CRI (and containerd) implementation of Source.
type Watcher struct {
	opts       Options
	socketPath string
	endpointOK error

	mu      sync.Mutex // guards tracker and stats, and serialises sends on out
	tracker *tracker
	stats   Stats
	lastErr error

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
	w.socketPath, w.endpointOK = socketPath(opts.Endpoint)
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
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastErr
}

// Stats returns a snapshot of the counters.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	s.Connected = w.connected.Load()
	s.IgnoredContainers = w.tracker.ignoredTotal
	s.Emitted = make(map[Kind]uint64, len(w.stats.Emitted))
	for k, v := range w.stats.Emitted {
		s.Emitted[k] = v
	}
	return s
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
// ctx is done.
func (w *Watcher) run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("cri")
	backoff := w.opts.Backoff
	for ctx.Err() == nil {
		wasConnected, err := w.session(ctx, logger)
		w.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if wasConnected {
			backoff = w.opts.Backoff
		}
		w.mu.Lock()
		w.lastErr = err
		w.stats.Mode = ModeNone
		w.stats.ContainerdEvents = false
		w.mu.Unlock()
		logger.Error(err, "Container runtime not usable; retrying", "endpoint", w.opts.Endpoint, "retryIn", backoff)
		select {
		case <-ctx.Done():
			return
		case <-w.opts.Clock.After(backoff):
		}
		backoff = min(2*backoff, w.opts.MaxBackoff)
	}
}

// session is one connection to the runtime: check that it serves CRI, relist, then follow
// the event stream or relist periodically until a call fails. It reports whether it got
// connected, and why it ended.
func (w *Watcher) session(ctx context.Context, logger klog.Logger) (bool, error) {
	if w.endpointOK != nil {
		return false, w.endpointOK
	}
	if _, err := os.Stat(w.socketPath); err != nil {
		return false, fmt.Errorf("CRI endpoint %s: socket %s does not exist: is the container runtime running? (%v)", w.opts.Endpoint, w.socketPath, err)
	}
	conn, err := grpc.NewClient("passthrough:///cri",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", w.socketPath)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)),
	)
	if err != nil {
		return false, fmt.Errorf("CRI endpoint %s: %w", w.opts.Endpoint, err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)

	vctx, cancel := context.WithTimeout(ctx, w.opts.CallTimeout)
	v, err := rt.Version(vctx, &runtimeapi.VersionRequest{})
	cancel()
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return false, fmt.Errorf("CRI endpoint %s does not serve the CRI v1 RuntimeService (Version: %s): not a CRI runtime, or one too old for CRI v1", w.opts.Endpoint, status.Convert(err).Message())
		}
		return false, fmt.Errorf("CRI endpoint %s: Version: %w", w.opts.Endpoint, err)
	}
	runtime := v.GetRuntimeName() + " " + v.GetRuntimeVersion()
	w.connected.Store(true)
	w.mu.Lock()
	w.lastErr = nil
	w.stats.Connects++
	w.stats.Runtime = runtime
	w.mu.Unlock()
	logger.Info("Connected to the container runtime", "endpoint", w.opts.Endpoint, "runtime", runtime, "criVersion", v.GetRuntimeApiVersion())

	sctx, cancelSession := context.WithCancel(ctx)
	s := &session{w: w, rt: rt, logger: logger}
	if v.GetRuntimeName() == "containerd" && !w.opts.NoContainerdEvents {
		s.spawn(func() { s.containerdEvents(sctx, conn) })
	}
	err = s.watch(sctx)
	// Nothing of this session may emit after it (Events closes the channel after the last
	// session).
	cancelSession()
	s.wg.Wait()
	return true, fmt.Errorf("CRI endpoint %s: connection lost: %w", w.opts.Endpoint, err)
}

// session is the state of one connection.
type session struct {
	w      *Watcher
	rt     runtimeapi.RuntimeServiceClient
	logger klog.Logger
	wg     sync.WaitGroup // goroutines that may emit
}

// spawn runs f in a goroutine the session waits for before it ends.
func (s *session) spawn(f func()) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
}

// watch opens the GetContainerEvents stream (before the first relist, so nothing falls
// between them), relists, then follows the stream or, where the runtime answers
// Unimplemented, relists every RelistPeriod.
func (s *session) watch(ctx context.Context) error {
	w := s.w
	type recv struct {
		ev  *runtimeapi.ContainerEventResponse
		err error
	}
	stream, err := s.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	var events chan recv
	if err == nil {
		events = make(chan recv, 64)
		go func() {
			for {
				ev, err := stream.Recv()
				select {
				case events <- recv{ev, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	} else if status.Code(err) != codes.Unimplemented {
		return fmt.Errorf("GetContainerEvents: %w", err)
	}

	if err := s.relist(ctx); err != nil {
		return err
	}
	mode := ModeRelist
	if events != nil {
		// Optimistic: a runtime without the stream answers Unimplemented at once.
		mode = ModeEvents
	}
	s.setMode(mode)

	// The next relist is due a period after the last one; stream events do not move it.
	clk := w.opts.Clock
	period := func() time.Duration {
		if mode == ModeEvents {
			return w.opts.ResyncPeriod
		}
		return w.opts.RelistPeriod
	}
	lastRelist := clk.Now()
	timer := clk.NewTimer(period())
	defer func() { timer.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case r := <-events:
			if r.err == nil {
				if err := s.handleCRIEvent(ctx, r.ev); err != nil {
					return err
				}
				continue
			}
			if status.Code(r.err) != codes.Unimplemented {
				return fmt.Errorf("GetContainerEvents stream: %w", r.err)
			}
			s.logger.V(2).Info("Runtime has no GetContainerEvents; relisting", "period", w.opts.RelistPeriod)
			events, mode = nil, ModeRelist
			timer.Stop()
			if remaining := w.opts.RelistPeriod - clk.Since(lastRelist); remaining > 0 {
				timer = clk.NewTimer(remaining)
			} else {
				if err := s.relist(ctx); err != nil {
					return err
				}
				lastRelist = clk.Now()
				timer = clk.NewTimer(period())
			}
			// Last, so that whoever sees the mode also sees the relist timer.
			s.setMode(mode)
		case <-timer.C():
			if err := s.relist(ctx); err != nil {
				return err
			}
			lastRelist = clk.Now()
			timer = clk.NewTimer(period())
		}
	}
}

func (s *session) setMode(m Mode) {
	s.w.mu.Lock()
	s.w.stats.Mode = m
	s.w.mu.Unlock()
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
	w.stats.Relists++
	w.mu.Unlock()
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
	if ev, ok := w.tracker.observe(st, info, sandboxID, source, w.opts.Clock.Now()); ok {
		w.sendLocked(ev)
	}
}

// sendLocked emits an event; w.mu is held so that events of one container keep their
// order whichever goroutine found them. A full channel blocks the watcher (back
// pressure), never drops. Stats waits meanwhile.
func (w *Watcher) sendLocked(ev ContainerEvent) {
	select {
	case w.out <- ev:
		w.stats.Emitted[ev.Kind]++
	case <-w.ctx.Done():
	}
}
