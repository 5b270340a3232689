package deviceplugin

// service.go: the DevicePlugin gRPC service, as the kubelet calls it.

import (
	"context"
	"path"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// service implements pluginapi.DevicePluginServer for a Plugin; it is kept apart so that the
// Plugin's own methods are only the ones a test calls.
type service struct {
	pluginapi.UnimplementedDevicePluginServer
	p      *Plugin
	logger klog.Logger
}

// options is what the plugin tells the kubelet, at registration and in GetDevicePluginOptions:
// it answers GetPreferredAllocation and needs no PreStartContainer call.
func options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: false, GetPreferredAllocationAvailable: true}
}

func (s *service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return options(), nil
}

// ListAndWatch sends the devices, then sends them again after every change of health, until
// the kubelet goes away or the server stops.
func (s *service) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devices, changed := s.p.watchDevices()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		s.logger.V(2).Info("Sent devices", "devices", devices)
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation prefers, for each container, the devices it must include, then the
// available ones in ID order.
func (s *service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		ids := slices.Clone(c.MustIncludeDeviceIDs)
		available := slices.Clone(c.AvailableDeviceIDs)
		slices.SortFunc(available, compareIDs)
		for _, id := range available {
			if len(ids) >= int(c.AllocationSize) {
				break
			}
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate gives each container the env vars EnvDevices and EnvPCI for its devices and,
// with a StateDir, each device's health file mounted read-only at
// ContainerHealthDir/<ID>. It refuses a device it does not have or one that is unhealthy,
// as a real plugin would.
func (s *service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		devices, err := s.p.lookup(c.DevicesIds)
		if err != nil {
			return nil, status.Error(codes.NotFound, err.Error())
		}
		ids := make([]string, 0, len(devices))
		pcis := make([]string, 0, len(devices))
		var mounts []*pluginapi.Mount
		for _, d := range devices {
			if d.Health != pluginapi.Healthy {
				return nil, status.Errorf(codes.FailedPrecondition, "device %q is %s", d.ID, d.Health)
			}
			ids = append(ids, d.ID)
			pcis = append(pcis, d.PCI)
			if s.p.opts.StateDir != "" {
				mounts = append(mounts, &pluginapi.Mount{
					ContainerPath: path.Join(ContainerHealthDir, d.ID),
					HostPath:      HealthFile(s.p.opts.StateDir, d.ID),
					ReadOnly:      true,
				})
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs:   map[string]string{EnvDevices: strings.Join(ids, ","), EnvPCI: strings.Join(pcis, ",")},
			Mounts: mounts,
		})
	}
	s.logger.Info("Allocated", "request", req.ContainerRequests)
	return resp, nil
}

// PreStartContainer has nothing to prepare; the kubelet does not call it since options()
// says it is not required.
func (s *service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// compareIDs orders GPU-2 before GPU-10.
func compareIDs(a, b string) int {
	if len(a) != len(b) {
		return len(a) - len(b)
	}
	return strings.Compare(a, b)
}
