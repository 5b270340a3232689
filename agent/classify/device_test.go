package classify

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

// TestDecideDevice: the device verdict from a container's end and its devices' health, as
// the kubelet reports it in allocatedResourcesStatus (the shape measured on a real kubelet
// v1.36.3 with test/deviceplugin: a device flipped Unhealthy showed in the running pod's
// status within 0.1 s, and a container that then exited 42 kept it in its final status).
func TestDecideDevice(t *testing.T) {
	started := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	finished := started.Add(10 * time.Minute)
	const gpu = "coroner.dev/test-gpu"
	healthy := func(id string) DeviceHealth {
		return DeviceHealth{Resource: gpu, ID: id, Health: corev1.ResourceHealthStatusHealthy}
	}
	unhealthy := func(id string, since time.Time) DeviceHealth {
		return DeviceHealth{Resource: gpu, ID: id, Health: corev1.ResourceHealthStatusUnhealthy, Since: since}
	}
	xid := func(id string, code int, at time.Time) DeviceFault {
		return DeviceFault{Resource: "nvidia.com/gpu", ID: id, Code: code, At: at, Message: "GPU has fallen off the bus."}
	}
	facts := func(exit int32, devs []DeviceHealth, faults []DeviceFault, now time.Time) DeviceFacts {
		return DeviceFacts{Container: "main", ExitCode: exit, StartedAt: started, FinishedAt: finished,
			Devices: devs, Faults: faults, Now: now, Window: 30 * time.Second}
	}
	later := finished.Add(time.Minute) // past the window
	cases := []struct {
		name  string
		facts DeviceFacts
		want  DeviceVerdict
	}{{
		name:  "exit 1 while its device is Unhealthy",
		facts: facts(1, []DeviceHealth{healthy("gpu-0"), unhealthy("gpu-1", finished.Add(-2*time.Second))}, nil, later),
		want: DeviceVerdict{Failed: true, Resource: gpu, ID: "gpu-1", Signal: SignalKubelet,
			Health: corev1.ResourceHealthStatusUnhealthy, At: finished.Add(-2 * time.Second)},
	}, {
		name:  "the device turns Unhealthy within the window after the death",
		facts: facts(1, []DeviceHealth{unhealthy("gpu-0", finished.Add(5*time.Second))}, nil, finished.Add(6*time.Second)),
		want: DeviceVerdict{Failed: true, Resource: gpu, ID: "gpu-0", Signal: SignalKubelet,
			Health: corev1.ResourceHealthStatusUnhealthy, At: finished.Add(5 * time.Second)},
	}, {
		name:  "turned Unhealthy after the window: not the cause",
		facts: facts(1, []DeviceHealth{unhealthy("gpu-0", finished.Add(31*time.Second))}, nil, later),
		want:  DeviceVerdict{},
	}, {
		name:  "Unhealthy since a time the agent does not know",
		facts: facts(139, []DeviceHealth{unhealthy("gpu-0", time.Time{})}, nil, later),
		want:  DeviceVerdict{Failed: true, Resource: gpu, ID: "gpu-0", Signal: SignalKubelet, Health: corev1.ResourceHealthStatusUnhealthy},
	}, {
		name:  "killed by a signal while its device is Unhealthy",
		facts: DeviceFacts{Container: "main", Signal: 9, StartedAt: started, FinishedAt: finished, Devices: []DeviceHealth{unhealthy("gpu-0", started)}, Now: later, Window: time.Second},
		want:  DeviceVerdict{Failed: true, Resource: gpu, ID: "gpu-0", Signal: SignalKubelet, Health: corev1.ResourceHealthStatusUnhealthy, At: started},
	}, {
		name:  "exit 0 with an Unhealthy device: left alone",
		facts: facts(0, []DeviceHealth{unhealthy("gpu-0", started)}, nil, later),
		want:  DeviceVerdict{},
	}, {
		name:  "no device held: never a device failure, no wait",
		facts: facts(1, nil, nil, finished),
		want:  DeviceVerdict{},
	}, {
		name:  "healthy devices, within the window: wait for the plugin",
		facts: facts(1, []DeviceHealth{healthy("gpu-0")}, nil, finished.Add(time.Second)),
		want:  DeviceVerdict{WaitUntil: finished.Add(30 * time.Second)},
	}, {
		name:  "healthy devices, the window passed: the program's own failure",
		facts: facts(1, []DeviceHealth{healthy("gpu-0")}, nil, later),
		want:  DeviceVerdict{},
	}, {
		name:  "Unknown health (the plugin went away) is no failure",
		facts: facts(1, []DeviceHealth{{Resource: gpu, ID: "gpu-0", Health: corev1.ResourceHealthStatusUnknown}}, nil, later),
		want:  DeviceVerdict{},
	}, {
		name:  "a hardware Xid on its GPU while it ran, before any health change",
		facts: facts(1, []DeviceHealth{{Resource: "nvidia.com/gpu", ID: "GPU-a", Health: corev1.ResourceHealthStatusHealthy}}, []DeviceFault{xid("GPU-a", 79, finished.Add(-time.Second))}, finished.Add(time.Second)),
		want: DeviceVerdict{Failed: true, Resource: "nvidia.com/gpu", ID: "GPU-a", Signal: SignalDriver, Code: 79,
			At: finished.Add(-time.Second), Message: "GPU has fallen off the bus."},
	}, {
		name:  "an Xid logged before the container started is another run's",
		facts: facts(1, nil, []DeviceFault{xid("GPU-a", 79, started.Add(-time.Minute))}, later),
		want:  DeviceVerdict{},
	}, {
		name:  "an Xid logged after the window",
		facts: facts(1, nil, []DeviceFault{xid("GPU-a", 79, finished.Add(time.Minute))}, later.Add(time.Minute)),
		want:  DeviceVerdict{},
	}, {
		name: "several: the device that turned first is named",
		facts: facts(1, []DeviceHealth{unhealthy("gpu-1", finished.Add(-time.Second)), unhealthy("gpu-0", finished)},
			[]DeviceFault{xid("GPU-b", 48, finished.Add(-time.Minute))}, later),
		want: DeviceVerdict{Failed: true, Resource: "nvidia.com/gpu", ID: "GPU-b", Signal: SignalDriver, Code: 48,
			At: finished.Add(-time.Minute), Message: "GPU has fallen off the bus."},
	}, {
		name: "the kubelet and the driver name one device at one time: the kubelet's word",
		facts: facts(1, []DeviceHealth{{Resource: "nvidia.com/gpu", ID: "GPU-a", Health: corev1.ResourceHealthStatusUnhealthy, Since: finished}},
			[]DeviceFault{xid("GPU-a", 79, finished)}, later),
		want: DeviceVerdict{Failed: true, Resource: "nvidia.com/gpu", ID: "GPU-a", Signal: SignalKubelet,
			Health: corev1.ResourceHealthStatusUnhealthy, At: finished},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, DecideDevice(tc.facts)); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDeviceStampMessage(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 3, 0, time.UTC)
	cases := []struct {
		v    DeviceVerdict
		want string
	}{
		{DeviceVerdict{Failed: true, Resource: "coroner.dev/test-gpu", ID: "gpu-1", Signal: SignalKubelet, Health: corev1.ResourceHealthStatusUnhealthy, At: at},
			"container main died: its device coroner.dev/test-gpu gpu-1 is Unhealthy (the kubelet's device health) since 2026-12-07T12:00:03Z"},
		{DeviceVerdict{Failed: true, Resource: "coroner.dev/test-gpu", ID: "gpu-1", Signal: SignalKubelet, Health: corev1.ResourceHealthStatusUnhealthy},
			"container main died: its device coroner.dev/test-gpu gpu-1 is Unhealthy (the kubelet's device health) since a time not known"},
		{DeviceVerdict{Failed: true, Resource: "nvidia.com/gpu", ID: "GPU-a", Signal: SignalDriver, Code: 79, At: at, Message: "GPU has fallen off the bus."},
			"container main died: its device nvidia.com/gpu GPU-a reported a hardware fault (code 79) at 2026-12-07T12:00:03Z: GPU has fallen off the bus."},
	}
	for _, tc := range cases {
		if got := tc.v.StampMessage("main"); got != tc.want {
			t.Errorf("StampMessage = %q\nwant           %q", got, tc.want)
		}
	}
}
