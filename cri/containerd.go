package cri

import (
	"context"
	"fmt"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
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

// containerdEvents follows containerd's event service on the runtime's socket until ctx
// is done, resubscribing with backoff when the stream breaks.
func (s *session) containerdEvents(ctx context.Context, conn *grpc.ClientConn) {
	w := s.w
	client := eventsapi.NewEventsClient(conn)
	backoff := w.opts.Backoff
	for ctx.Err() == nil {
		err := s.subscribe(ctx, client)
		w.mu.Lock()
		w.stats.ContainerdEvents = false
		w.mu.Unlock()
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
// breaks.
func (s *session) subscribe(ctx context.Context, client eventsapi.EventsClient) error {
	ns := s.w.opts.ContainerdNamespace
	stream, err := client.Subscribe(ctx, &eventsapi.SubscribeRequest{Filters: []string{
		fmt.Sprintf(`topic==%q,namespace==%q`, topicTaskExit, ns),
		fmt.Sprintf(`topic==%q,namespace==%q`, topicTaskOOM, ns),
	}})
	if err != nil {
		return err
	}
	s.w.mu.Lock()
	s.w.stats.ContainerdEvents = true
	s.w.mu.Unlock()
	for {
		env, err := stream.Recv()
		if err != nil {
			return err
		}
		switch env.GetTopic() {
		case topicTaskExit:
			var e eventtypes.TaskExit
			if err := anypb.UnmarshalTo(env.GetEvent(), &e, proto.UnmarshalOptions{}); err != nil {
				s.logger.Error(err, "Undecodable containerd event", "topic", env.GetTopic(), "type", env.GetEvent().GetTypeUrl())
				continue
			}
			if e.GetID() != e.GetContainerID() {
				continue // an exec'd process, not the container's
			}
			id := e.GetContainerID()
			s.spawn(func() { s.exitSoon(ctx, id) })
		case topicTaskOOM:
			var e eventtypes.TaskOOM
			if err := anypb.UnmarshalTo(env.GetEvent(), &e, proto.UnmarshalOptions{}); err != nil {
				s.logger.Error(err, "Undecodable containerd event", "topic", env.GetTopic(), "type", env.GetEvent().GetTypeUrl())
				continue
			}
			s.oom(ctx, e.GetContainerID(), env.GetTimestamp().AsTime())
		}
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
