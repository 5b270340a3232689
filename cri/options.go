package cri

import (
	"time"

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
