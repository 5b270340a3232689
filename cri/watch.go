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
