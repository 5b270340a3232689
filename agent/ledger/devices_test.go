package ledger

// Tests of the device evidence: the health states kept from pods' statuses and when each
// turned, the drivers' faults joined to the containers by device ID, the facts a device
// verdict gets, the verdict's course on a container, and how long it is all kept.

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/cri"
)

const (
	gpu      = "nvidia.com/gpu"
	healthy  = corev1.ResourceHealthStatusHealthy
	unheal   = corev1.ResourceHealthStatusUnhealthy
	unknownH = corev1.ResourceHealthStatusUnknown
)

func report(container, id string, h corev1.ResourceHealthStatus) DeviceReport {
	return DeviceReport{Container: container, Resource: gpu, ID: id, Health: h}
}

// TestObserveDevices: each health is dated when the agent first saw it, zero for a pod
// first seen already so; what turned Unhealthy is reported once.
func TestObserveDevices(t *testing.T) {
	type step struct {
		at      time.Duration
		reports []DeviceReport
		turned  []string
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  []classify.DeviceHealth // main's devices after the steps
	}{
		{
			name:  "first seen Unhealthy: since unknown",
			steps: []step{{0, []DeviceReport{report("main", "GPU-a", unheal)}, []string{"main"}}},
			want:  []classify.DeviceHealth{{Resource: gpu, ID: "GPU-a", Health: unheal}},
		},
		{
			name: "turned Unhealthy while seen: since that report",
			steps: []step{
				{0, []DeviceReport{report("main", "GPU-a", healthy), report("main", "GPU-b", healthy)}, nil},
				{3 * time.Second, []DeviceReport{report("main", "GPU-a", unheal), report("main", "GPU-b", healthy)}, []string{"main"}},
				{5 * time.Second, []DeviceReport{report("main", "GPU-a", unheal), report("main", "GPU-b", healthy)}, nil},
			},
			want: []classify.DeviceHealth{
				{Resource: gpu, ID: "GPU-a", Health: unheal, Since: t0.Add(3 * time.Second)},
				{Resource: gpu, ID: "GPU-b", Health: healthy},
			},
		},
		{
			name: "a pod seen holding devices before the kubelet reported them: the first report is dated",
			steps: []step{
				{0, nil, nil},
				{2 * time.Second, []DeviceReport{report("main", "GPU-a", unheal)}, []string{"main"}},
			},
			want: []classify.DeviceHealth{{Resource: gpu, ID: "GPU-a", Health: unheal, Since: t0.Add(2 * time.Second)}},
		},
		{
			name: "healed and failed again: the new since",
			steps: []step{
				{0, []DeviceReport{report("main", "GPU-a", unheal)}, []string{"main"}},
				{time.Second, []DeviceReport{report("main", "GPU-a", healthy)}, nil},
				{4 * time.Second, []DeviceReport{report("main", "GPU-a", unheal)}, []string{"main"}},
			},
			want: []classify.DeviceHealth{{Resource: gpu, ID: "GPU-a", Health: unheal, Since: t0.Add(4 * time.Second)}},
		},
		{
			name: "another container's device turning is not main's",
			steps: []step{
				{0, []DeviceReport{report("main", "GPU-a", healthy), report("side", "GPU-b", healthy)}, nil},
				{time.Second, []DeviceReport{report("main", "GPU-a", healthy), report("side", "GPU-b", unheal)}, []string{"side"}},
			},
			want: []classify.DeviceHealth{{Resource: gpu, ID: "GPU-a", Health: healthy}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := New(classify.PIDFacts{})
			for i, s := range tc.steps {
				if got := tb.ObserveDevices(tablePod, s.reports, t0.Add(s.at)); !cmp.Equal(got, s.turned) {
					t.Errorf("step %d: turned %v, want %v", i, got, s.turned)
				}
			}
			got, _ := tb.DeviceFacts(tablePod, "main")
			// A healthy device first seen with the pod is dated zero too: only Unhealthy's
			// date matters to a verdict.
			for i := range got {
				if got[i].Health == healthy {
					got[i].Since = time.Time{}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("main's devices (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLearnFault: a driver's fault is joined to the containers whose pods report its
// device ID, and to no other; a container's facts carry the faults of its devices only,
// named with the resource they are allocated under, and PodResources' device IDs join
// like the status's.
func TestLearnFault(t *testing.T) {
	tb := New(classify.PIDFacts{})
	tb.ObserveDevices(tablePod, []DeviceReport{report("main", "GPU-a", healthy), report("side", "GPU-b", healthy)}, t0)
	tb.ObserveDevices("other-pod", []DeviceReport{report("main", "GPU-c", healthy)}, t0)
	tb.LearnAllocation("third-pod", "train", "example.com/gpu", []string{"GPU-d"}, t0)

	hw := DriverFault{ID: "GPU-a", Code: 79, At: t0.Add(time.Second), Message: "GPU has fallen off the bus."}
	if got, want := tb.LearnFault(hw, t0.Add(time.Second)), []DeviceKey{{PodUID: tablePod, Container: "main", Resource: gpu, ID: "GPU-a"}}; !cmp.Equal(got, want) {
		t.Errorf("holders %v, want %v", got, want)
	}
	if got := tb.LearnFault(DriverFault{ID: "GPU-z", Code: 48, At: t0}, t0); len(got) != 0 {
		t.Errorf("a device nobody holds joined %v", got)
	}
	if got := tb.LearnFault(DriverFault{ID: "GPU-d", Code: 48, At: t0}, t0); len(got) != 1 || got[0].Container != "train" {
		t.Errorf("PodResources' device: holders %v, want third-pod's train", got)
	}

	devices, faults := tb.DeviceFacts(tablePod, "main")
	if want := []classify.DeviceFault{{Resource: gpu, ID: "GPU-a", Code: 79, At: hw.At, Message: hw.Message}}; !cmp.Equal(faults, want) {
		t.Errorf("main's faults %+v, want %+v", faults, want)
	}
	if len(devices) != 1 || devices[0].ID != "GPU-a" {
		t.Errorf("main's devices %+v", devices)
	}
	if _, faults := tb.DeviceFacts(tablePod, "side"); len(faults) != 0 {
		t.Errorf("side's faults %+v: another container's device", faults)
	}
	devices, _ = tb.DeviceFacts("third-pod", "train")
	if want := []classify.DeviceHealth{{Resource: "example.com/gpu", ID: "GPU-d", Health: unknownH}}; !cmp.Equal(devices, want) {
		t.Errorf("PodResources' devices %+v, want %+v", devices, want)
	}
	// The status's health is not overwritten by PodResources' allocation.
	tb.LearnAllocation(tablePod, "main", gpu, []string{"GPU-a"}, t0)
	if devices, _ := tb.DeviceFacts(tablePod, "main"); devices[0].Health != healthy {
		t.Errorf("health %q after LearnAllocation, want the status's Healthy", devices[0].Health)
	}
}

// TestDeviceVerdictCourse: a verdict starts only on an exit and once, is found by its pod
// and container while pending, and is claimed once; a container whose verdict is pending
// outlives ContainerTTL.
func TestDeviceVerdictCourse(t *testing.T) {
	tb := New(classify.PIDFacts{})
	tb.apply(tableEvent(cri.Started, 1), t0, Reading{})
	if tb.StartDevice(containerID(1)) {
		t.Error("a verdict started on a running container")
	}
	tb.apply(tableEvent(cri.Exited, 1), t0, Reading{})
	if !tb.StartDevice(containerID(1)) || tb.StartDevice(containerID(1)) {
		t.Error("StartDevice: want true once")
	}
	if ev, ok := tb.DevicePending(containerID(1)); !ok || ev.Kind != cri.Exited {
		t.Errorf("DevicePending = %+v, %v", ev, ok)
	}
	if got := tb.PendingDevices(tablePod, "main"); !cmp.Equal(got, []string{containerID(1)}) {
		t.Errorf("PendingDevices(main) = %v", got)
	}
	if got := tb.PendingDevices(tablePod, "side"); len(got) != 0 {
		t.Errorf("PendingDevices(side) = %v", got)
	}
	tb.FinishExit(containerID(1), t0, t0, false)
	tb.Expire(t0.Add(ContainerTTL+time.Minute), nil)
	if _, ok := tb.Container(containerID(1)); !ok {
		t.Fatal("a container whose device verdict is pending expired")
	}
	if !tb.FinishDevice(containerID(1)) || tb.FinishDevice(containerID(1)) {
		t.Error("FinishDevice: want true once")
	}
	if _, ok := tb.DevicePending(containerID(1)); ok {
		t.Error("pending after FinishDevice")
	}
	tb.Expire(t0.Add(ContainerTTL+2*time.Minute), nil)
	if _, ok := tb.Container(containerID(1)); ok {
		t.Error("kept after its verdict")
	}
}

// TestDeviceEvidenceExpiry: device states go with their pod (Forget, or Expire once the
// pod is neither cached nor the ledger's), at most DeviceMax are kept (the least recently
// reported go), and faults go after FaultTTL, at most FaultMax of them.
func TestDeviceEvidenceExpiry(t *testing.T) {
	tb := New(classify.PIDFacts{})
	tb.ObserveDevices("deleted", []DeviceReport{report("main", "GPU-a", unheal)}, t0)
	tb.ObserveDevices("cached", []DeviceReport{report("main", "GPU-b", unheal)}, t0)
	tb.ObserveDevices("left", []DeviceReport{report("main", "GPU-c", unheal)}, t0)
	tb.Forget("deleted")
	if tb.HasDevices("deleted", "") {
		t.Error("a deleted pod's devices kept")
	}
	tb.Expire(t0.Add(time.Minute), []types.UID{"cached"})
	if !tb.HasDevices("cached", "main") || tb.HasDevices("left", "") {
		t.Errorf("after Expire: cached %v (want true), left %v (want false)", tb.HasDevices("cached", "main"), tb.HasDevices("left", ""))
	}

	tb = New(classify.PIDFacts{})
	for i := range DeviceMax + 1 {
		tb.ObserveDevices("many", []DeviceReport{report("main", fmt.Sprint("GPU-", i), healthy)}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n := len(tb.evidence.devices); n != DeviceMax {
		t.Errorf("%d device states kept, want %d", n, DeviceMax)
	}
	if _, ok := tb.evidence.devices[DeviceKey{PodUID: "many", Container: "main", Resource: gpu, ID: "GPU-0"}]; ok {
		t.Error("the least recently reported device kept over the bound")
	}

	for i := range FaultMax + 1 {
		tb.LearnFault(DriverFault{ID: "GPU-x", Code: i}, t0)
	}
	if n := len(tb.evidence.faults.recs); n != FaultMax || tb.evidence.faults.recs[0].rec.Code != 1 {
		t.Errorf("%d faults kept, the oldest %d; want %d from 1", n, tb.evidence.faults.recs[0].rec.Code, FaultMax)
	}
	tb.LearnFault(DriverFault{ID: "GPU-y", Code: 79}, t0.Add(FaultTTL))
	tb.Expire(t0.Add(FaultTTL+time.Second), nil)
	if n := len(tb.evidence.faults.recs); n != 1 {
		t.Errorf("%d faults kept after FaultTTL, want the newer one", n)
	}
}
