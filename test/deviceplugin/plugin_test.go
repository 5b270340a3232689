package deviceplugin

// plugin_test.go: the devices, their health, and the DevicePlugin service as the kubelet
// calls it on the plugin's socket.

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestListAndWatchSendsHealthChanges(t *testing.T) {
	p, _ := startRegistered(t, 3)
	stream, err := dialPlugin(t, p).ListAndWatch(testContext(t), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	recv := func(step string, want ...string) {
		t.Helper()
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if diff := cmp.Diff(want, healths(resp.Devices)); diff != "" {
			t.Errorf("%s: devices (-want +got):\n%s", step, diff)
		}
	}
	set := func(id string, healthy bool) {
		t.Helper()
		if _, err := p.SetHealth(id, healthy); err != nil {
			t.Fatal(err)
		}
	}

	recv("first list", "GPU-0=Healthy", "GPU-1=Healthy", "GPU-2=Healthy")
	set("GPU-1", false)
	recv("GPU-1 failed", "GPU-0=Healthy", "GPU-1=Unhealthy", "GPU-2=Healthy")
	// Failing GPU-1 again changes nothing and sends nothing: the next list is GPU-2's.
	set("GPU-1", false)
	set("GPU-2", false)
	recv("GPU-2 failed", "GPU-0=Healthy", "GPU-1=Unhealthy", "GPU-2=Unhealthy")
	set("GPU-1", true)
	recv("GPU-1 healed", "GPU-0=Healthy", "GPU-1=Healthy", "GPU-2=Unhealthy")

	if diff := cmp.Diff([]Device{
		{ID: "GPU-0", Health: "Healthy", PCI: "0000:10:00.0"},
		{ID: "GPU-1", Health: "Healthy", PCI: "0000:11:00.0"},
		{ID: "GPU-2", Health: "Unhealthy", PCI: "0000:12:00.0"},
	}, p.Devices()); diff != "" {
		t.Errorf("Devices (-want +got):\n%s", diff)
	}
	var unknown *UnknownDeviceError
	if _, err := p.SetHealth("GPU-3", false); !errors.As(err, &unknown) {
		t.Errorf("SetHealth of an unknown device: %v, want an UnknownDeviceError", err)
	}
}

func TestAllocate(t *testing.T) {
	cases := []struct {
		name      string
		unhealthy []string
		request   [][]string // device IDs per container
		want      []map[string]string
		wantCode  string
	}{
		{
			name:    "one device",
			request: [][]string{{"GPU-1"}},
			want:    []map[string]string{{"CORONER_TEST_GPU": "GPU-1", "CORONER_TEST_GPU_PCI": "0000:11:00.0"}},
		},
		{
			name:    "two containers, two devices in one",
			request: [][]string{{"GPU-2", "GPU-0"}, {"GPU-1"}},
			want: []map[string]string{
				{"CORONER_TEST_GPU": "GPU-2,GPU-0", "CORONER_TEST_GPU_PCI": "0000:12:00.0,0000:10:00.0"},
				{"CORONER_TEST_GPU": "GPU-1", "CORONER_TEST_GPU_PCI": "0000:11:00.0"},
			},
		},
		{
			name:     "unknown device",
			request:  [][]string{{"GPU-0", "GPU-9"}},
			wantCode: "NotFound",
		},
		{
			name:      "unhealthy device",
			unhealthy: []string{"GPU-1"},
			request:   [][]string{{"GPU-1"}},
			wantCode:  "FailedPrecondition",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := startRegistered(t, 3)
			for _, id := range tc.unhealthy {
				if _, err := p.SetHealth(id, false); err != nil {
					t.Fatal(err)
				}
			}
			req := &pluginapi.AllocateRequest{}
			for _, ids := range tc.request {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
			}
			resp, err := dialPlugin(t, p).Allocate(testContext(t), req)
			if tc.wantCode != "" {
				if code(err) != tc.wantCode {
					t.Fatalf("Allocate: %v, want code %s", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []map[string]string
			for _, c := range resp.ContainerResponses {
				got = append(got, c.Envs)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("envs per container (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGetPreferredAllocation(t *testing.T) {
	p, _ := startRegistered(t, 12)
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: []string{"GPU-10", "GPU-3", "GPU-2"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"GPU-1", "GPU-5", "GPU-4"}, MustIncludeDeviceIDs: []string{"GPU-5"}, AllocationSize: 2},
		{AvailableDeviceIDs: []string{"GPU-7"}, AllocationSize: 1},
	}}
	resp, err := dialPlugin(t, p).GetPreferredAllocation(testContext(t), req)
	if err != nil {
		t.Fatal(err)
	}
	want := &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{
		{DeviceIDs: []string{"GPU-2", "GPU-3"}},
		{DeviceIDs: []string{"GPU-5", "GPU-1"}},
		{DeviceIDs: []string{"GPU-7"}},
	}}
	if diff := cmp.Diff(want, resp, protocmp.Transform()); diff != "" {
		t.Errorf("GetPreferredAllocation (-want +got):\n%s", diff)
	}
}

func TestPreStartContainer(t *testing.T) {
	p, _ := startRegistered(t, 1)
	if _, err := dialPlugin(t, p).PreStartContainer(testContext(t), &pluginapi.PreStartContainerRequest{DevicesIds: []string{"GPU-0"}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name    string
		change  func(o *Options)
		wantErr bool
	}{
		{name: "defaults", change: func(*Options) {}},
		{name: "relative dir", change: func(o *Options) { o.Dir = "device-plugins" }, wantErr: true},
		{name: "resource without domain", change: func(o *Options) { o.ResourceName = "gpu" }, wantErr: true},
		{name: "socket named kubelet.sock", change: func(o *Options) { o.SocketName = "kubelet.sock" }, wantErr: true},
		{name: "socket in a subdirectory", change: func(o *Options) { o.SocketName = "a/b.sock" }, wantErr: true},
		{name: "no devices", change: func(o *Options) { o.Devices = 0 }, wantErr: true},
		{name: "most devices", change: func(o *Options) { o.Devices = MaxDevices }},
		{name: "too many devices", change: func(o *Options) { o.Devices = MaxDevices + 1 }, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			tc.change(&o)
			if err := o.Validate(); (err != nil) != tc.wantErr {
				t.Errorf("Validate: %v, want an error: %t", err, tc.wantErr)
			}
		})
	}
}
