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

	name    string // Version's RuntimeName
	version string // Version's RuntimeVersion; default "1.0"
	stream  bool   // serve GetContainerEvents
	// endAtOnce: GetContainerEvents returns nil at once (the client sees io.EOF), as
	// CRI-O does with enable_pod_events = false, its default (server/container_events.go,
	// v1.36).
	endAtOnce bool
	// backlog is sent first to every new subscriber: events from before it subscribed,
	// as containerd 1.7's shared channel of 1000 (pkg/cri/server/helpers.go, v1.7.34) and
	// containerd 2.x's queue of events nobody received (internal/eventq, v2.3.4) hand out.
	backlog []*runtimeapi.ContainerEventResponse
	// crioInfo: the verbose info has CRI-O's shape (server/container_status.go, v1.36).
	crioInfo bool

	mu            sync.Mutex
	containers    map[string]*runtimeapi.ContainerStatus
	sandboxes     map[string]string
	pids          map[string]int // verbose "pid"; 42 when not set
	listCalls     int
	subscriptions int // GetContainerEvents calls
	sent          int // stream events sent (Send returned)

	criEvents  chan *runtimeapi.ContainerEventResponse
	endStream  chan struct{} // a value ends the open stream with io.EOF
	subscribed chan struct{} // a GetContainerEvents stream is open
}

func newFakeRuntime(name string, stream bool) *fakeRuntime {
	return &fakeRuntime{
		name: name, version: "1.0", stream: stream,
		containers: map[string]*runtimeapi.ContainerStatus{},
		sandboxes:  map[string]string{},
		pids:       map[string]int{},
		criEvents:  make(chan *runtimeapi.ContainerEventResponse, 16),
		endStream:  make(chan struct{}),
		subscribed: make(chan struct{}, 64),
	}
}

// counts returns the number of GetContainerEvents calls and of events sent.
func (f *fakeRuntime) counts() (subscriptions, sent int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.subscriptions, f.sent
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
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: f.name, RuntimeVersion: f.version, RuntimeApiVersion: "v1"}, nil
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
		pid, ok := f.pids[r.ContainerId]
		if !ok {
			pid = 42
		}
		if f.crioInfo {
			// CRI-O's containerInfo: sandboxID, pid, runtimeSpec, privileged.
			resp.Info = map[string]string{"info": fmt.Sprintf(
				`{"sandboxID":%q,"pid":%d,"runtimeSpec":{"ociVersion":"1.2.0","linux":{"resources":{"memory":{"limit":20971520}},"cgroupsPath":"kubepods-burstable-pod%s.slice:crio:%s"}},"privileged":false}`,
				f.sandboxes[r.ContainerId], pid, st.Labels[LabelPodUID], r.ContainerId)}
		} else {
			// The shape of containerd 1.6's verbose info.
			resp.Info = map[string]string{"info": fmt.Sprintf(
				`{"sandboxID":%q,"pid":%d,"runtimeSpec":{"linux":{"resources":{"memory":{"limit":20971520}},"cgroupsPath":"/kubepods/burstable/pod%s/%s"}}}`,
				f.sandboxes[r.ContainerId], pid, st.Labels[LabelPodUID], r.ContainerId)}
		}
	}
	return resp, nil
}

func (f *fakeRuntime) GetContainerEvents(_ *runtimeapi.GetEventsRequest, s grpc.ServerStreamingServer[runtimeapi.ContainerEventResponse]) error {
	if !f.stream {
		return status.Error(codes.Unimplemented, "method GetContainerEvents not implemented")
	}
	f.mu.Lock()
	f.subscriptions++
	backlog := f.backlog
	f.mu.Unlock()
	select {
	case f.subscribed <- struct{}{}:
	default:
	}
	if f.endAtOnce {
		return nil
	}
	send := func(ev *runtimeapi.ContainerEventResponse) error {
		if err := s.Send(ev); err != nil {
			return err
		}
		f.mu.Lock()
		f.sent++
		f.mu.Unlock()
		return nil
	}
	for _, ev := range backlog {
		if err := send(ev); err != nil {
			return err
		}
	}
	for {
		select {
		case <-s.Context().Done():
			return nil
		case <-f.endStream:
			return nil
		case ev := <-f.criEvents:
			if err := send(ev); err != nil {
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

	mu   sync.Mutex
	sent int // envelopes sent (Send returned)
}

func (f *fakeEvents) sentCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent
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
			f.mu.Lock()
			f.sent++
			f.mu.Unlock()
		}
	}
}

// push sends a containerd event of topic with payload msg.
func (f *fakeEvents) push(t *testing.T, topic string, msg proto.Message, at time.Time) {
	t.Helper()
	f.envelopes <- envelope(t, topic, msg, at)
}

// envelope wraps a containerd event as containerd's event service sends it.
func envelope(t *testing.T, topic string, msg proto.Message, at time.Time) *types.Envelope {
	t.Helper()
	a, err := anypb.New(msg)
	if err != nil {
		t.Fatal(err)
	}
	// containerd names types without the type.googleapis.com/ prefix.
	a.TypeUrl = string(msg.ProtoReflect().Descriptor().FullName())
	return &types.Envelope{Timestamp: timestamppb.New(at), Namespace: "k8s.io", Topic: topic, Event: a}
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
	if opts.Endpoint == "" {
		opts.Endpoint = "unix://" + path
	}
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
