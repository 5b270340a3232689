package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/clock"
)

// maxShortStreams: after this many GetContainerEvents streams in a row that ended
// (io.EOF) within ResyncPeriod of their opening, the Watcher stops subscribing and
// relists for the rest of its life.
const maxShortStreams = 3

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
	l := &watchLoop{s: s, mode: ModeRelist}
	if useStream {
		var err error
		if l.stream, why, err = s.openStream(ctx, why); err != nil {
			return err
		}
	}
	if err := s.relist(ctx); err != nil {
		return err
	}
	if l.stream != nil {
		// Optimistic: a runtime without the stream answers Unimplemented, or ends it, at
		// once.
		l.mode, why = ModeEvents, ""
	}
	s.setMode(l.mode, why)
	l.restartTimer()
	defer func() { l.timer.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.ready():
			if err := l.takeEvents(ctx); err != nil {
				return err
			}
		case <-s.relistNow:
			if err := l.relist(ctx); err != nil {
				return err
			}
		case <-l.timer.C():
			if err := l.relist(ctx); err != nil {
				return err
			}
		}
	}
}

// eventStream is an open GetContainerEvents stream: the queue its reader fills, and when
// it opened.
type eventStream struct {
	q      *streamQueue[*runtimeapi.ContainerEventResponse]
	opened time.Time
	// staleBefore (Unix nanoseconds): events created before it were queued by the runtime
	// before the subscription, and replayed.
	staleBefore int64
}

// watchLoop is the state of a session's watch: the stream (nil while relisting without
// one), the mode, and the timer of the next relist, due a period after the last one
// (stream events do not move it).
type watchLoop struct {
	s          *session
	stream     *eventStream
	mode       Mode
	timer      clock.Timer
	lastRelist time.Time
}

// openStream subscribes to GetContainerEvents and starts the goroutine that reads it. A
// runtime that answers Unimplemented gives no stream and why it has none; any other
// error ends the session.
func (s *session) openStream(ctx context.Context, why string) (*eventStream, string, error) {
	w := s.w
	// Events created before this moment (less a tolerance) are stale: containerd 1.7
	// keeps events in its shared channel of 1000 whether anyone listens or not
	// (pkg/cri/server/helpers.go, v1.7.34), and containerd 2.x replays to a new
	// subscriber what it queued while nobody listened, for up to 5 minutes
	// (internal/eventq/eventq.go, v2.3.4). The first relist covers them.
	opened := w.opts.Clock.Now()
	stream, err := s.rt.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	switch {
	case status.Code(err) == codes.Unimplemented:
		return nil, "the runtime has no GetContainerEvents (Unimplemented)", nil
	case err != nil:
		return nil, why, fmt.Errorf("GetContainerEvents: %w", err)
	}
	q := newStreamQueue[*runtimeapi.ContainerEventResponse](w.opts.StreamBuffer)
	go w.readStream(stream, q)
	return &eventStream{q: q, opened: opened, staleBefore: opened.Add(-w.opts.StaleTolerance).UnixNano()}, why, nil
}

// readStream receives the stream's events into q until the stream ends. It never waits
// for the session: a full queue drops events (counted here), and the session relists.
func (w *Watcher) readStream(stream runtimeapi.RuntimeService_GetContainerEventsClient, q *streamQueue[*runtimeapi.ContainerEventResponse]) {
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
}

// ready has a value while the stream has something queued; nil without a stream.
func (l *watchLoop) ready() <-chan struct{} {
	if l.stream == nil {
		return nil
	}
	return l.stream.q.ready
}

// period is how long after a relist the next one is due.
func (l *watchLoop) period() time.Duration {
	if l.mode == ModeEvents {
		return l.s.w.opts.ResyncPeriod
	}
	return l.s.w.opts.RelistPeriod
}

// restartTimer makes the next relist due a period from now.
func (l *watchLoop) restartTimer() {
	clk := l.s.w.opts.Clock
	l.lastRelist = clk.Now()
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer = clk.NewTimer(l.period())
}

// relist relists, and makes the next relist due a period after this one.
func (l *watchLoop) relist(ctx context.Context) error {
	if err := l.s.relist(ctx); err != nil {
		return err
	}
	l.restartTimer()
	return nil
}

// takeEvents handles what the stream queued: an overflow (a relist finds what the
// dropped events said), the events but the stale ones, then the stream's end.
func (l *watchLoop) takeEvents(ctx context.Context) error {
	w := l.s.w
	items, overflow, dropped, ended, end := l.stream.q.take()
	if overflow {
		l.s.logger.V(1).Info("CRI events came faster than they were handled; dropped some and relisting", "dropped", dropped)
		if err := l.relist(ctx); err != nil {
			return err
		}
	}
	for _, ev := range items {
		if at := ev.GetCreatedAt(); at > 0 && at < l.stream.staleBefore {
			w.updateStats(func(st *Stats) { st.StaleEvents++ })
			continue
		}
		if err := l.s.handleCRIEvent(ctx, ev); err != nil {
			return err
		}
	}
	if !ended {
		return nil
	}
	why, err := w.streamEnded(l.stream, end)
	if err != nil {
		return err
	}
	return l.relistWithoutStream(ctx, why)
}

// streamEnded says what the end of the stream means. Unimplemented, or io.EOF at once,
// means the runtime does not stream (CRI-O's GetContainerEvents returns nil at once when
// enable_pod_events is false, its default: server/container_events.go, v1.36): it
// returns why, and the session goes on without the stream. io.EOF after the stream worked
// is a connection lost (resync by reconnecting), and so is anything else: it returns the
// error that ends the session.
func (w *Watcher) streamEnded(st *eventStream, end error) (why string, err error) {
	lived := w.opts.Clock.Since(st.opened)
	switch {
	case status.Code(end) == codes.Unimplemented:
		return "the runtime has no GetContainerEvents (Unimplemented)", nil
	case errors.Is(end, io.EOF) && (st.q.count() == 0 || lived < w.opts.StreamGrace):
		return "the runtime ended the GetContainerEvents stream at once (CRI-O with enable_pod_events off?)", nil
	case errors.Is(end, io.EOF):
		if lived < w.opts.ResyncPeriod {
			w.shortStreams++
		} else {
			w.shortStreams = 0
		}
		return "", fmt.Errorf("%w after %v", errStreamEnded, lived)
	default:
		return "", fmt.Errorf("GetContainerEvents stream: %w", end)
	}
}

// relistWithoutStream goes on without the stream: a relist every RelistPeriod, the next
// one a period after the last (at once when that is past).
func (l *watchLoop) relistWithoutStream(ctx context.Context, why string) error {
	clk := l.s.w.opts.Clock
	l.s.logger.V(1).Info("No CRI event stream; relisting", "why", why, "period", l.s.w.opts.RelistPeriod)
	l.stream, l.mode = nil, ModeRelist
	l.timer.Stop()
	if remaining := l.s.w.opts.RelistPeriod - clk.Since(l.lastRelist); remaining > 0 {
		l.timer = clk.NewTimer(remaining)
	} else if err := l.relist(ctx); err != nil {
		return err
	}
	// Last, so that whoever sees the mode also sees the relist timer.
	l.s.setMode(l.mode, why)
	return nil
}
