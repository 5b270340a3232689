package agent

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	testingclock "k8s.io/utils/clock/testing"
)

// fakePodResources is the kubelet's PodResources service with a fixed answer.
type fakePodResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	calls atomic.Int32
}

func (f *fakePodResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	f.calls.Add(1)
	return &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Name: "train-0", Namespace: "ml",
		Containers: []*podresourcesv1.ContainerResources{
			{Name: "main", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{gpuA, gpuB}}}, CpuIds: []int64{2, 3}},
			{Name: "sidecar"},
		},
	}}}, nil
}

// TestPodResourcesClient: the client lists device plugins' devices per container over the
// kubelet's socket, reuses an answer for podResourcesTTL, and says when the socket is
// missing.
func TestPodResourcesClient(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	clk := testingclock.NewFakeClock(t0)
	c := NewPodResourcesClient(socket, clk)
	defer c.Close()
	if _, err := c.List(context.Background()); !errors.Is(err, ErrNoPodResourcesSocket) {
		t.Fatalf("List without a socket: %v, want ErrNoPodResourcesSocket", err)
	}

	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fake := &fakePodResources{}
	podresourcesv1.RegisterPodResourcesListerServer(srv, fake)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	want := []AllocatedDevices{{Namespace: "ml", Pod: "train-0", Container: "main", Resource: "nvidia.com/gpu", IDs: []string{gpuA, gpuB}}}
	for i := range 2 {
		got, err := c.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("List %d (-want +got):\n%s", i, diff)
		}
	}
	if n := fake.calls.Load(); n != 1 {
		t.Errorf("%d calls to the kubelet, want 1 (the answer reused)", n)
	}
	clk.Step(podResourcesTTL + time.Millisecond)
	if _, err := c.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := fake.calls.Load(); n != 2 {
		t.Errorf("%d calls to the kubelet after the TTL, want 2", n)
	}
}
