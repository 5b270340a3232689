package cri

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

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
