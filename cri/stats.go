package cri

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
