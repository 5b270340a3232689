package cri

import (
	"context"
	"fmt"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerd event topics the watcher subscribes to.
const (
	topicTaskExit = "/tasks/exit"
	topicTaskOOM  = "/tasks/oom"
)

// exitRetries and exitRetryInterval bound how long a containerd task exit waits for the
// CRI plugin to record it (it handles the same event asynchronously); the next relist
// catches anything slower.
const (
	exitRetries       = 25
	exitRetryInterval = 20 * time.Millisecond
)

// maxExitWaiters bounds the task exits waited for at once (exitSoon); beyond it, an exit
// is left to a relist, requested at once.
const maxExitWaiters = 32

// containerdEvents follows containerd's event service on the runtime's socket until ctx
// is done, resubscribing with backoff when the stream breaks.
func (s *session) containerdEvents(ctx context.Context, conn *grpc.ClientConn) {
	w := s.w
	client := eventsapi.NewEventsClient(conn)
	backoff := w.opts.Backoff
	for ctx.Err() == nil {
		err := s.subscribe(ctx, client)
		w.updateStats(func(st *Stats) { st.ContainerdEvents = false })
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.Unimplemented {
			s.logger.Info("Runtime calls itself containerd but has no event service; using CRI alone", "err", err)
			return
		}
		s.logger.Error(err, "containerd event stream broke; resubscribing", "retryIn", backoff)
		select {
		case <-ctx.Done():
			return
		case <-w.opts.Clock.After(backoff):
		}
		backoff = min(2*backoff, w.opts.MaxBackoff)
	}
}

// subscribe reads task exit and OOM events of the kubelet's namespace until the stream
// breaks. A goroutine receives into a bounded queue and never waits for the watcher:
// containerd's exchange gives each subscriber an unbounded queue
// (core/events/exchange/exchange.go, goevents.NewQueue, v2.3.4 and v1.7.34), so a
// subscriber that does not read costs containerd memory. This goroutine handles them;
// when the queue overflowed, the dropped events are replaced by a relist (which finds
// the exits; an OOM event of a container that keeps running is lost, and counted).
func (s *session) subscribe(ctx context.Context, client eventsapi.EventsClient) error {
	w := s.w
	ns := w.opts.ContainerdNamespace
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Subscribe(sctx, &eventsapi.SubscribeRequest{Filters: []string{
		fmt.Sprintf(`topic==%q,namespace==%q`, topicTaskExit, ns),
		fmt.Sprintf(`topic==%q,namespace==%q`, topicTaskOOM, ns),
	}})
	if err != nil {
		return err
	}
	w.updateStats(func(st *Stats) { st.ContainerdEvents = true })
	q := newStreamQueue[*types.Envelope](w.opts.StreamBuffer)
	go func() {
		for {
			env, err := stream.Recv()
			if err != nil {
				q.close(err)
				return
			}
			if dropped, overflowed := q.push(env); dropped {
				w.updateStats(func(st *Stats) {
					st.ContainerdDropped++
					if overflowed {
						st.ContainerdOverflows++
					}
				})
			}
		}
	}()
	waiters := make(chan struct{}, maxExitWaiters)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-q.ready:
		}
		envs, overflow, dropped, ended, end := q.take()
		if overflow {
			s.logger.V(1).Info("containerd events came faster than they were handled; dropped some and relisting", "dropped", dropped)
			s.requestRelist()
		}
		for _, env := range envs {
			s.handleEnvelope(ctx, env, waiters)
		}
		if ended {
			return end
		}
	}
}

// handleEnvelope handles one containerd event: a task exit is waited for in a goroutine
// of its own (at most maxExitWaiters at once; beyond, a relist finds it), an OOM at once.
func (s *session) handleEnvelope(ctx context.Context, env *types.Envelope, waiters chan struct{}) {
	switch env.GetTopic() {
	case topicTaskExit:
		var e eventtypes.TaskExit
		if err := anypb.UnmarshalTo(env.GetEvent(), &e, proto.UnmarshalOptions{}); err != nil {
			s.logger.Error(err, "Undecodable containerd event", "topic", env.GetTopic(), "type", env.GetEvent().GetTypeUrl())
			return
		}
		if e.GetID() != e.GetContainerID() {
			return // an exec'd process, not the container's
		}
		id := e.GetContainerID()
		select {
		case waiters <- struct{}{}:
			s.spawn(func() {
				defer func() { <-waiters }()
				s.exitSoon(ctx, id)
			})
		default:
			s.requestRelist()
		}
	case topicTaskOOM:
		var e eventtypes.TaskOOM
		if err := anypb.UnmarshalTo(env.GetEvent(), &e, proto.UnmarshalOptions{}); err != nil {
			s.logger.Error(err, "Undecodable containerd event", "topic", env.GetTopic(), "type", env.GetEvent().GetTypeUrl())
			return
		}
		s.oom(ctx, e.GetContainerID(), env.GetTimestamp().AsTime())
	}
}

// exitSoon fetches the CRI status of a container whose task containerd says exited, until
// CRI reports the exit (and the watcher emits it) or exitRetries run out.
func (s *session) exitSoon(ctx context.Context, id string) {
	w := s.w
	for range exitRetries {
		w.mu.Lock()
		done := w.tracker.exitEmitted(id)
		w.mu.Unlock()
		if done {
			return
		}
		st, info, err := s.status(ctx, id)
		switch {
		case status.Code(err) == codes.NotFound:
			return // a pod sandbox, or removed already
		case err != nil:
			return // the session is ending; the next one relists
		case !hasKubeletLabels(st.GetLabels()):
			w.observe(st, info, "", SourceContainerd) // counts it
			return
		case st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED:
			w.observe(st, info, "", SourceContainerd)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-w.opts.Clock.After(exitRetryInterval):
		}
	}
}

// oom emits an OOM event for a container, fetching its identity first if the watcher has
// not seen it yet. OOM events of pod sandboxes (not CRI containers) are dropped.
func (s *session) oom(ctx context.Context, id string, at time.Time) {
	w := s.w
	w.mu.Lock()
	known := w.tracker.known(id)
	w.mu.Unlock()
	if !known {
		st, info, err := s.status(ctx, id)
		if err != nil {
			return
		}
		w.observe(st, info, "", SourceContainerd)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if ev, ok := w.tracker.oom(id, at, w.opts.Clock.Now()); ok {
		w.sendLocked(ev)
	}
}
