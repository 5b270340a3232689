package cri

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
)

// fakeRuntime is a hand-written CRI RuntimeService: containers are statuses the test sets;
// GetContainerEvents answers Unimplemented (like containerd 1.6) unless stream is set,
// then it forwards what the test pushes.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer

	name   string // Version's RuntimeName
	stream bool   // serve GetContainerEvents

	mu         sync.Mutex
	containers map[string]*runtimeapi.ContainerStatus
	sandboxes  map[string]string
	listCalls  int

	criEvents  chan *runtimeapi.ContainerEventResponse
	subscribed chan struct{} // a GetContainerEvents stream is open
}

func newFakeRuntime(name string, stream bool) *fakeRuntime {
	return &fakeRuntime{
		name: name, stream: stream,
		containers: map[string]*runtimeapi.ContainerStatus{},
		sandboxes:  map[string]string{},
		criEvents:  make(chan *runtimeapi.ContainerEventResponse, 16),
		subscribed: make(chan struct{}, 16),
	}
}

// labels are the kubelet's labels for container name of pod ns/pod.
func labels(ns, pod, name string) map[string]string {
	return map[string]string{
		LabelPodNamespace: ns, LabelPodName: pod, LabelPodUID: "uid-" + pod, LabelContainerName: name,
	}
}

// set adds or replaces a container.
func (f *fakeRuntime) set(id string, state runtimeapi.ContainerState, lbls map[string]string, mutate ...func(*runtimeapi.ContainerStatus)) *runtimeapi.ContainerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := &runtimeapi.ContainerStatus{
		Id:        id,
		Metadata:  &runtimeapi.ContainerMetadata{Name: lbls[LabelContainerName], Attempt: 0},
		State:     state,
		CreatedAt: time.Unix(100, 0).UnixNano(),
		StartedAt: time.Unix(101, 0).UnixNano(),
		Labels:    lbls,
	}
	for _, m := range mutate {
		m(st)
	}
	f.containers[id] = st
	f.sandboxes[id] = "sandbox-" + lbls[LabelPodName]
	return proto.Clone(st).(*runtimeapi.ContainerStatus)
}

// exit marks a container exited with code and reason.
func (f *fakeRuntime) exit(id string, code int32, reason string) *runtimeapi.ContainerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.containers[id]
	st.State = runtimeapi.ContainerState_CONTAINER_EXITED
	st.ExitCode, st.Reason = code, reason
	st.FinishedAt = time.Unix(200, 0).UnixNano()
	return proto.Clone(st).(*runtimeapi.ContainerStatus)
}

func (f *fakeRuntime) lists() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.listCalls
}

func (f *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: f.name, RuntimeVersion: "1.0", RuntimeApiVersion: "v1"}, nil
}

func (f *fakeRuntime) ListContainers(context.Context, *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listCalls++
	var out []*runtimeapi.Container
	for id, st := range f.containers {
		out = append(out, &runtimeapi.Container{
			Id: id, PodSandboxId: f.sandboxes[id], Metadata: st.Metadata, State: st.State,
			CreatedAt: st.CreatedAt, Labels: st.Labels,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return &runtimeapi.ListContainersResponse{Containers: out}, nil
}

func (f *fakeRuntime) ContainerStatus(_ context.Context, r *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.containers[r.ContainerId]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %q not found", r.ContainerId)
	}
	resp := &runtimeapi.ContainerStatusResponse{Status: proto.Clone(st).(*runtimeapi.ContainerStatus)}
	if r.Verbose {
		// The shape of containerd 1.6's verbose info.
		resp.Info = map[string]string{"info": fmt.Sprintf(
			`{"sandboxID":%q,"pid":42,"runtimeSpec":{"linux":{"resources":{"memory":{"limit":20971520}},"cgroupsPath":"/kubepods/burstable/pod%s/%s"}}}`,
			f.sandboxes[r.ContainerId], st.Labels[LabelPodUID], r.ContainerId)}
	}
	return resp, nil
}

func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	if !f.stream {
		return status.Error(codes.Unimplemented, "method GetContainerEvents not implemented")
	}
	f.subscribed <- struct{}{}
	for {
		select {
		case <-s.Context().Done():
			return nil
		case ev := <-f.criEvents:
			if err := s.Send(ev); err != nil {
				return err
			}
		}
	}
}

// fakeEvents is containerd's event service: it forwards envelopes the test pushes.
type fakeEvents struct {
	eventsapi.UnimplementedEventsServer
	envelopes  chan *types.Envelope
	subscribed chan []string // the filters of each subscription
}

func newFakeEvents() *fakeEvents {
	return &fakeEvents{envelopes: make(chan *types.Envelope, 16), subscribed: make(chan []string, 16)}
}

func (f *fakeEvents) Subscribe(r *eventsapi.SubscribeRequest, s eventsapi.Events_SubscribeServer) error {
	f.subscribed <- r.Filters
	for {
		select {
		case <-s.Context().Done():
			return nil
		case env := <-f.envelopes:
			if err := s.Send(env); err != nil {
				return err
			}
		}
	}
}

// push sends a containerd event of topic with payload msg.
func (f *fakeEvents) push(t *testing.T, topic string, msg proto.Message, at time.Time) {
	t.Helper()
	a, err := anypb.New(msg)
	if err != nil {
		t.Fatal(err)
	}
	// containerd names types without the type.googleapis.com/ prefix.
	a.TypeUrl = string(msg.ProtoReflect().Descriptor().FullName())
	f.envelopes <- &types.Envelope{Timestamp: timestamppb.New(at), Namespace: "k8s.io", Topic: topic, Event: a}
}

// fakeServer serves a fakeRuntime (and optionally fakeEvents) on a unix socket.
type fakeServer struct {
	path string
	srv  *grpc.Server
}

func socketIn(t *testing.T) string { return filepath.Join(t.TempDir(), "cri.sock") }

// serve starts a gRPC server on path with the given services; nil ones are left out.
func serve(t *testing.T, path string, rt *fakeRuntime, ev *fakeEvents) *fakeServer {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	if rt != nil {
		runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	}
	if ev != nil {
		eventsapi.RegisterEventsServer(srv, ev)
	}
	go func() { _ = srv.Serve(l) }()
	s := &fakeServer{path: path, srv: srv}
	t.Cleanup(s.stop)
	return s
}

// stop closes the server and its connections and removes the socket.
func (s *fakeServer) stop() { s.srv.Stop() }

// testWatcher starts a Watcher on endpoint with a fake clock.
func testWatcher(t *testing.T, path string, opts Options) (*Watcher, <-chan ContainerEvent, *testingclock.FakeClock) {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	opts.Endpoint = "unix://" + path
	opts.Clock = clk
	w := New(opts)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	events := w.Events(ctx)
	t.Cleanup(func() {
		cancel()
		for range events { // wait until the watcher has stopped
		}
	})
	return w, events, clk
}

// waitTimer waits until the watcher waits on the fake clock: a relist timer or a backoff
// (so whatever it was doing before has finished), then steps the clock by d.
func waitTimer(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("the watcher never waited on its clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// settled waits until a watcher on a runtime without GetContainerEvents has found that out
// (the answer is asynchronous) and set its relist timer.
func settled(t *testing.T, w *Watcher) {
	t.Helper()
	waitFor(t, "relist mode", func() bool { return w.Stats().Mode == ModeRelist })
}

func step(t *testing.T, clk *testingclock.FakeClock, d time.Duration) {
	t.Helper()
	waitTimer(t, clk)
	clk.Step(d)
}

// next returns the next event, failing after 10 s.
func next(t *testing.T, events <-chan ContainerEvent) ContainerEvent {
	t.Helper()
	select {
	case ev := <-events:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return ContainerEvent{}
}

// none fails if an event is waiting.
func none(t *testing.T, events <-chan ContainerEvent) {
	t.Helper()
	select {
	case ev := <-events:
		t.Fatalf("unexpected event %+v", ev)
	default:
	}
}

// waitFor polls cond until it holds, failing after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func wait(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not happen within 10s", what)
	}
}
