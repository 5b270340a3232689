package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

const (
	testGPU = "nvidia.com/gpu"
	gpuA    = "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b" // at PCI 0000:3b:00.0
	gpuB    = "GPU-2f4c8a1e-0d3b-4c5e-9f6a-7b8c9d0e1f2a" // at PCI 0000:af:00.0
	// deviceWindow is the agent's --device-window in these tests (10s by default).
	deviceWindow = 4 * time.Second
)

// gpuPod creates a pod whose containers (gated: each exits with its code once released)
// ask for one GPU each.
func (f *fixture) gpuPod(name string, codes map[string]int, containers []string) *kubeletsim.Pod {
	f.t.Helper()
	var ctrs []containerd.Container
	for _, c := range containers {
		ctrs = append(ctrs, containerd.Container{Name: c, Command: gated(fmt.Sprintf("exit %d", codes[c]))})
	}
	return f.podWith(nodeA, name, kubeletsim.PodOptions{Containers: ctrs, Mutate: func(p *corev1.Pod) {
		for i := range p.Spec.Containers {
			p.Spec.Containers[i].Resources.Limits = corev1.ResourceList{testGPU: resource.MustParse("1")}
		}
	}})
}

// writeDevices plays the kubelet's status of a running pod whose containers hold the
// devices given (container -> device ID -> health), in allocatedResourcesStatus, as the
// kubelet v1.36 writes it (ResourceHealthStatus, beta and on by default).
func (f *fixture) writeDevices(p *kubeletsim.Pod, ids map[string]string, devices map[string]map[string]corev1.ResourceHealthStatus) {
	f.t.Helper()
	cur := f.get(p)
	cur.Status.Phase = corev1.PodRunning
	cur.Status.ContainerStatuses = nil
	for _, c := range cur.Spec.Containers {
		cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ContainerID: "containerd://" + ids[c.Name], Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}}
		var health []corev1.ResourceHealth
		for id, h := range devices[c.Name] {
			health = append(health, corev1.ResourceHealth{ResourceID: corev1.ResourceID(id), Health: h})
		}
		if len(health) > 0 {
			cs.AllocatedResourcesStatus = []corev1.ResourceStatus{{Name: testGPU, Resources: health}}
		}
		cur.Status.ContainerStatuses = append(cur.Status.ContainerStatuses, cs)
	}
	if _, err := f.client.CoreV1().Pods(f.ns).UpdateStatus(f.ctx, cur, metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
		f.t.Fatal(err)
	}
}

// deviceConditions returns the pod's DisruptionTarget and DeviceFailed conditions.
func (f *fixture) deviceConditions(p *kubeletsim.Pod) (dt, df *corev1.PodCondition) {
	got := f.get(p)
	return conditions.Find(&got.Status, conditions.DisruptionTarget), conditions.Find(&got.Status, conditions.DeviceFailed)
}

// waitDeviceFailed waits for the pod's DeviceFailed condition and returns both.
func (f *fixture) waitDeviceFailed(p *kubeletsim.Pod) (dt, df *corev1.PodCondition) {
	f.t.Helper()
	waitFor(f.t, "DeviceFailed on "+p.Object.Name, func() bool {
		dt, df = f.deviceConditions(p)
		return df != nil
	})
	return dt, df
}

func wantFailed(t *testing.T, dt, df *corev1.PodCondition, msg ...string) {
	t.Helper()
	if dt == nil || dt.Status != corev1.ConditionTrue || dt.Reason != conditions.ReasonDeviceFailure ||
		df == nil || df.Status != corev1.ConditionTrue || df.Reason != conditions.ReasonDeviceFailure || df.Message != dt.Message {
		t.Fatalf("DisruptionTarget %+v, DeviceFailed %+v: want both True, reason DeviceFailure, one message", dt, df)
	}
	for _, m := range msg {
		if !strings.Contains(df.Message, m) {
			t.Errorf("message %q does not say %q", df.Message, m)
		}
	}
	if !df.LastTransitionTime.Equal(&dt.LastTransitionTime) {
		t.Errorf("the conditions were written apart: %v and %v", dt.LastTransitionTime, df.LastTransitionTime)
	}
}

func wantNoDeviceFailure(t *testing.T, dt, df *corev1.PodCondition, msg ...string) {
	t.Helper()
	if dt != nil || df == nil || df.Status != corev1.ConditionFalse || df.Reason != conditions.ReasonNoDeviceFailure {
		t.Fatalf("DisruptionTarget %+v, DeviceFailed %+v: want DeviceFailed=False NoDeviceFailure only", dt, df)
	}
	for _, m := range msg {
		if !strings.Contains(df.Message, m) {
			t.Errorf("message %q does not say %q", df.Message, m)
		}
	}
}

// TestDeviceVerdictKubelet (issue 37): a container dies while the kubelet reports its
// device Unhealthy, or reports it so within the window after the death, and the agent
// stamps DisruptionTarget and DeviceFailed, DeviceFailure, in one write; a device that
// turns after the window, another container's device, and an exit 0 blame nothing.
func TestDeviceVerdictKubelet(t *testing.T) {
	f := newFixture(t, containerdtest.Shared(t))
	a := startDeviceAgent(t, f, func(o *agent.Options) {
		o.DeviceWindow = deviceWindow
		o.NvidiaGPUsDir, o.PodResourcesSocket = "", ""
	})
	healthy, unhealthy := corev1.ResourceHealthStatusHealthy, corev1.ResourceHealthStatusUnhealthy

	t.Run("Unhealthy at the death", func(t *testing.T) {
		f := f.sub(t)
		p := f.gpuPod("unhealthy", map[string]int{"main": 1}, []string{"main"})
		id := f.start(p)
		f.writeDevices(p, map[string]string{"main": id}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: unhealthy}})
		time.Sleep(300 * time.Millisecond) // the agent's cache has the status
		f.release(p, id)
		_, _, finished := f.waitExited(p, id)
		dt, df := f.waitDeviceFailed(p)
		wantFailed(t, dt, df, "container main died", testGPU+" "+gpuA, "is Unhealthy (the kubelet's device health)")
		t.Logf("stamped, seen %v after the exit: %q", time.Since(finished).Round(time.Millisecond), df.Message)
	})

	t.Run("turns Unhealthy 2s after the death, within the window", func(t *testing.T) {
		f := f.sub(t)
		p := f.gpuPod("turns", map[string]int{"main": 3}, []string{"main"})
		id := f.start(p)
		f.writeDevices(p, map[string]string{"main": id}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: healthy}})
		f.release(p, id)
		f.waitExited(p, id)
		time.Sleep(2 * time.Second)
		if _, df := f.deviceConditions(p); df != nil {
			t.Fatalf("DeviceFailed %+v before the window is over", df)
		}
		f.writeDevices(p, map[string]string{"main": id}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: unhealthy}})
		turned := time.Now()
		dt, df := f.waitDeviceFailed(p)
		wantFailed(t, dt, df, testGPU+" "+gpuA)
		t.Logf("stamped %v after the device turned", time.Since(turned).Round(time.Millisecond))
	})

	t.Run("turns Unhealthy after the window", func(t *testing.T) {
		f := f.sub(t)
		p := f.gpuPod("late", map[string]int{"main": 1}, []string{"main"})
		id := f.start(p)
		f.writeDevices(p, map[string]string{"main": id}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: healthy}})
		f.release(p, id)
		f.waitExited(p, id)
		dt, df := f.waitDeviceFailed(p)
		wantNoDeviceFailure(t, dt, df, testGPU+" "+gpuA+" stayed healthy through the 4s window")
		f.writeDevices(p, map[string]string{"main": id}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: unhealthy}})
		time.Sleep(time.Second)
		dt, df = f.deviceConditions(p)
		wantNoDeviceFailure(t, dt, df)
	})

	t.Run("another container's device", func(t *testing.T) {
		f := f.sub(t)
		p := f.gpuPod("other", map[string]int{"main": 1, "side": 0}, []string{"main", "side"})
		id := f.start(p)
		side, err := p.StartContainer(f.ctx, "side")
		if err != nil {
			t.Fatal(err)
		}
		f.writeDevices(p, map[string]string{"main": id, "side": side},
			map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: healthy}, "side": {gpuB: unhealthy}})
		time.Sleep(300 * time.Millisecond)
		f.release(p, id)
		f.waitExited(p, id)
		dt, df := f.waitDeviceFailed(p)
		wantNoDeviceFailure(t, dt, df, gpuA)
		if strings.Contains(df.Message, gpuB) {
			t.Errorf("message %q names the other container's device", df.Message)
		}
	})

	t.Run("exit 0", func(t *testing.T) {
		f := f.sub(t)
		p := f.gpuPod("success", map[string]int{"main": 0}, []string{"main"})
		id := f.start(p)
		f.writeDevices(p, map[string]string{"main": id}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: unhealthy}})
		time.Sleep(300 * time.Millisecond)
		f.release(p, id)
		f.waitExited(p, id)
		time.Sleep(deviceWindow + time.Second)
		if dt, df := f.deviceConditions(p); dt != nil || df != nil || writtenByAgent(f.get(p)) {
			t.Errorf("DisruptionTarget %+v, DeviceFailed %+v after exit 0", dt, df)
		}
	})

	if v := a.metric(t, "coroner_agent_device_verdicts_total", "resource="+testGPU, "signal=kubelet"); v != 2 {
		t.Errorf("kubelet verdicts %v, want 2", v)
	}
	if v := a.metric(t, "coroner_agent_device_verdicts_total", "signal=none"); v != 2 {
		t.Errorf("verdicts without a device to blame %v, want 2", v)
	}
	if v := a.metric(t, "coroner_agent_device_verdict_latency_seconds_count"); v != 4 {
		t.Errorf("verdict latency samples %v, want 4", v)
	}
}

// TestDeviceVerdictXid (issue 37): the NVIDIA driver's Xid lines in the kernel log (here a
// file in dmesg's format, the agent's --kmsg-path) name a GPU by its PCI address, which the
// driver's GPU list (a fake /proc/driver/nvidia/gpus, --nvidia-gpus-dir) maps to the UUID
// the pod's status reports: a hardware Xid (79) on the container's GPU while it ran blames
// it, an application Xid (13) does not.
func TestDeviceVerdictXid(t *testing.T) {
	f := newFixture(t, containerdtest.Shared(t))
	gpus := t.TempDir()
	for uuid, addr := range map[string]string{gpuA: "0000:3b:00.0", gpuB: "0000:af:00.0"} {
		dir := filepath.Join(gpus, addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// The driver's format (kernel-open/nvidia/nv-procfs.c, nv_procfs_read_gpu_info).
		info := "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 10\nGPU UUID: \t " + uuid + "\nVideo BIOS: \t 96.00.99.00.01\n" +
			"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t " + addr + "\nDevice Minor: \t 0\n" +
			"GPU Firmware: \t 535.129.03\nGPU Excluded: \t No\n"
		if err := os.WriteFile(filepath.Join(dir, "information"), []byte(info), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hw := f.gpuPod("fallen", map[string]int{"main": 1}, []string{"main"})
	app := f.gpuPod("illegal", map[string]int{"main": 1}, []string{"main"})
	hwID, appID := f.start(hw), f.start(app)
	time.Sleep(time.Second) // the Xids come while the containers run

	// Real lines (agent/nvidia's TestParseXid cites their sources), at the kernel's clock
	// now.
	up := uptime(t)
	kmsg := filepath.Join(t.TempDir(), "kmsg")
	lines := fmt.Sprintf("[%12.6f] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n", up) +
		fmt.Sprintf("[%12.6f] NVRM: Xid (PCI:0000:af:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter\n", up)
	if err := os.WriteFile(kmsg, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startDeviceAgent(t, f, func(o *agent.Options) {
		o.DeviceWindow, o.KmsgPath, o.NvidiaGPUsDir, o.PodResourcesSocket = deviceWindow, kmsg, gpus, ""
	})
	healthy := corev1.ResourceHealthStatusHealthy
	f.writeDevices(hw, map[string]string{"main": hwID}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuA: healthy}})
	f.writeDevices(app, map[string]string{"main": appID}, map[string]map[string]corev1.ResourceHealthStatus{"main": {gpuB: healthy}})
	time.Sleep(time.Second)
	f.release(hw, hwID)
	f.release(app, appID)

	dt, df := f.waitDeviceFailed(hw)
	wantFailed(t, dt, df, testGPU+" "+gpuA, "reported a hardware fault (code 79)", "GPU has fallen off the bus.")
	dt, df = f.waitDeviceFailed(app)
	wantNoDeviceFailure(t, dt, df, gpuB)
	if v := a.metric(t, "coroner_agent_device_verdicts_total", "resource="+testGPU, "signal=driver"); v != 1 {
		t.Errorf("driver verdicts %v, want 1", v)
	}
}

// sub is f for a subtest.
func (f *fixture) sub(t *testing.T) *fixture {
	g := *f
	g.t = t
	return &g
}

// uptime is the kernel's clock now, in seconds (/proc/uptime).
func uptime(t *testing.T) float64 {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	v, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// startDeviceAgent is startAgent with tweaks of its options.
func startDeviceAgent(t *testing.T, f *fixture, tweak func(*agent.Options)) *runningAgent {
	t.Helper()
	a, _ := startStoppableAgent(t, f.api, nodeA, f.cri.Endpoint, tweak)
	return a
}
