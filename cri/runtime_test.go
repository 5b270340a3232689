package cri

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stoppingRuntime is a fakeRuntime that also serves StopContainer and ListPodSandbox.
type stoppingRuntime struct {
	*fakeRuntime
	stops []*runtimeapi.StopContainerRequest // guarded by fakeRuntime.mu
	pods  []*runtimeapi.PodSandbox           // ListPodSandbox's answer; guarded by fakeRuntime.mu
}

// ListPodSandbox lists the sandboxes the test set, as a runtime lists them: every one,
// whatever its state, when the request has no filter.
func (f *stoppingRuntime) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.GetFilter() != nil {
		return nil, status.Errorf(codes.InvalidArgument, "unexpected filter %v", r.GetFilter())
	}
	return &runtimeapi.ListPodSandboxResponse{Items: f.pods}, nil
}

// StopContainer marks a container exited, as a runtime does once it has stopped it, and
// records the request.
func (f *stoppingRuntime) StopContainer(_ context.Context, r *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stops = append(f.stops, r)
	st, ok := f.containers[r.ContainerId]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %q not found", r.ContainerId)
	}
	st.State = runtimeapi.ContainerState_CONTAINER_EXITED
	st.ExitCode, st.Reason = 143, "Error"
	return &runtimeapi.StopContainerResponse{}, nil
}

func TestRuntimeClient(t *testing.T) {
	path := socketIn(t)
	rt := &stoppingRuntime{fakeRuntime: newFakeRuntime("containerd", false)}
	rt.set("c1", runtimeapi.ContainerState_CONTAINER_RUNNING, labels("ns", "a", "main"))
	rt.set("c2", runtimeapi.ContainerState_CONTAINER_EXITED, labels("ns", "b", "main"))
	rt.set("c3", runtimeapi.ContainerState_CONTAINER_RUNNING, map[string]string{"app": "not-the-kubelet"})
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	c, err := NewRuntimeClient("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	got, err := c.RunningContainers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []Container{{ID: "c1", SandboxID: "sandbox-a", Name: "main", PodNamespace: "ns", PodName: "a", PodUID: "uid-a", Running: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("RunningContainers (-want +got):\n%s", diff)
	}

	if err := c.StopContainer(ctx, "c1", 1500*time.Millisecond); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	if err := c.StopContainer(ctx, "gone", 0); err != nil {
		t.Errorf("StopContainer of a container that does not exist = %v, want nil", err)
	}
	rt.mu.Lock()
	stops := rt.stops
	rt.mu.Unlock()
	if len(stops) != 2 || stops[0].ContainerId != "c1" || stops[0].Timeout != 2 || stops[1].Timeout != 0 {
		t.Errorf("stop requests %v, want c1 with 2s (rounded up), then gone with 0s", stops)
	}
	if got, err := c.RunningContainers(ctx); err != nil || len(got) != 0 {
		t.Errorf("after the stop: running %+v, %v; want none", got, err)
	}
}

// TestRuntimeClientSandboxes: the sandboxes with the kubelet's pod labels, ready or not,
// with their annotations (the pod's, as the kubelet copies them).
func TestRuntimeClientSandboxes(t *testing.T) {
	path := socketIn(t)
	podLabels := func(ns, pod string) map[string]string {
		return map[string]string{LabelPodNamespace: ns, LabelPodName: pod, LabelPodUID: "uid-" + pod, "app": pod}
	}
	rt := &stoppingRuntime{fakeRuntime: newFakeRuntime("containerd", false), pods: []*runtimeapi.PodSandbox{
		{Id: "sb-a", State: runtimeapi.PodSandboxState_SANDBOX_READY, Labels: podLabels("ns", "a"),
			Annotations: map[string]string{"coroner.dev/safe-to-forcefully-delete": "true", "kubernetes.io/config.source": "api"}},
		{Id: "sb-b", State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY, Labels: podLabels("ns", "b")},
		{Id: "sb-other", State: runtimeapi.PodSandboxState_SANDBOX_READY, Labels: map[string]string{"app": "not-the-kubelet"},
			Annotations: map[string]string{"coroner.dev/safe-to-forcefully-delete": "true"}},
		{Id: "sb-no-uid", State: runtimeapi.PodSandboxState_SANDBOX_READY, Labels: map[string]string{LabelPodNamespace: "ns", LabelPodName: "c"}},
	}}
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	c, err := NewRuntimeClient("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.Sandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []Sandbox{
		{ID: "sb-a", PodNamespace: "ns", PodName: "a", PodUID: "uid-a", Ready: true,
			Annotations: map[string]string{"coroner.dev/safe-to-forcefully-delete": "true", "kubernetes.io/config.source": "api"}},
		{ID: "sb-b", PodNamespace: "ns", PodName: "b", PodUID: "uid-b", Annotations: map[string]string{}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Sandboxes (-want +got):\n%s", diff)
	}
}

func TestRuntimeClientWithoutRuntime(t *testing.T) {
	if _, err := NewRuntimeClient("tcp://127.0.0.1:1"); err == nil {
		t.Error("a tcp endpoint was accepted")
	}
	c, err := NewRuntimeClient("unix:///tmp/coroner-no-such-dir/cri.sock")
	if err != nil {
		t.Fatalf("NewRuntimeClient must not dial: %v", err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.RunningContainers(ctx); err == nil {
		t.Error("RunningContainers without a runtime succeeded")
	}
	if _, err := c.Sandboxes(ctx); err == nil {
		t.Error("Sandboxes without a runtime succeeded")
	}
}
