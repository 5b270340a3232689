package agent

// Tests of the device verdict through the agent (fake API server, runtime and clock): the
// kubelet's device health and the driver's Xids as evidence, the window, and what is
// never blamed.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/agent/kmsg"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/agent/nvidia"
	"github.com/coroner-dev/coroner/conditions"
)

const (
	testGPU  = "nvidia.com/gpu"
	gpuA     = "GPU-9221d5d1-b60b-a624-bf14-0a1819cfda3b"
	gpuB     = "GPU-2f4c8a1e-0d3b-4c5e-9f6a-7b8c9d0e1f2a"
	gpuAAddr = "0000:3b:00.0"
)

// gpuPod is a pod whose containers each hold one GPU (main gpuA, side gpuB when named),
// the kubelet reporting them Healthy.
func gpuPod(name string, uid types.UID, policy corev1.RestartPolicy, containers ...string) *corev1.Pod {
	p := newPod(name, uid, policy, containers...)
	for i := range p.Spec.Containers {
		p.Spec.Containers[i].Resources.Limits = corev1.ResourceList{testGPU: resource.MustParse("1")}
		id := gpuA
		if i > 0 {
			id = gpuB
		}
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: p.Spec.Containers[i].Name,
			AllocatedResourcesStatus: []corev1.ResourceStatus{{Name: testGPU, Resources: []corev1.ResourceHealth{
				{ResourceID: corev1.ResourceID(id), Health: corev1.ResourceHealthStatusHealthy}}}}})
	}
	return p
}

// setHealth writes a device's health in the pod's status, as the kubelet does.
func (e *testEnv) setHealth(name, container string, h corev1.ResourceHealthStatus) {
	e.t.Helper()
	p := e.pod(name)
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == container {
			p.Status.ContainerStatuses[i].AllocatedResourcesStatus[0].Resources[0].Health = h
		}
	}
	if _, err := e.client.CoreV1().Pods(ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.until("the health in the ledger", func() bool {
		devs, _ := e.a.ledger.DeviceFacts(p.UID, container)
		return len(devs) == 1 && devs[0].Health == h
	})
}

// deviceCondition returns the pod's condition typ, nil when it has none.
func (e *testEnv) deviceCondition(name string, typ corev1.PodConditionType) *corev1.PodCondition {
	return conditions.Find(&e.pod(name).Status, typ)
}

// fakeGPUs writes a driver's GPU list with gpuA at gpuAAddr (the information file's
// format: kernel-open/nvidia/nv-procfs.c, as in agent/nvidia's tests) and returns it.
func fakeGPUs(t *testing.T) string {
	dir := t.TempDir()
	gpu := filepath.Join(dir, gpuAAddr)
	if err := os.MkdirAll(gpu, 0o755); err != nil {
		t.Fatal(err)
	}
	info := "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 10\nGPU UUID: \t " + gpuA + "\nVideo BIOS: \t 96.00.99.00.01\n" +
		"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t " + gpuAAddr + "\nDevice Minor: \t 5\n" +
		"GPU Firmware: \t 535.129.03\nGPU Excluded: \t No\n"
	if err := os.WriteFile(filepath.Join(gpu, "information"), []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func xid(t *testing.T, line string) kmsg.XidReport {
	x, ok, err := nvidia.ParseXid(line)
	if !ok || err != nil {
		t.Fatalf("ParseXid(%q): %v %v", line, ok, err)
	}
	return kmsg.XidReport{Xid: x, Time: t0.Add(-time.Second), HasTime: true}
}

// TestDeviceVerdict: a container's death judged by its devices.
func TestDeviceVerdict(t *testing.T) {
	for _, tc := range []struct {
		name       string
		policy     corev1.RestartPolicy
		containers []string
		code       int32
		before     func(e *testEnv, p *corev1.Pod) // before the exit
		after      func(e *testEnv, p *corev1.Pod) // after the exit was judged once
		// want: "failed" (both True), "none" (DeviceFailed=False), "" nothing.
		want    string
		message []string
		signal  string
	}{
		{
			name: "Unhealthy at the death: stamped at once", policy: corev1.RestartPolicyNever, containers: []string{"main"}, code: 1,
			before: func(e *testEnv, p *corev1.Pod) { e.setHealth(p.Name, "main", corev1.ResourceHealthStatusUnhealthy) },
			want:   "failed", signal: "kubelet",
			message: []string{"container main died", testGPU + " " + gpuA, "is Unhealthy (the kubelet's device health) since 2026-03-01T10:00:00Z"},
		},
		{
			name: "turns Unhealthy 2s after the death, within the window", policy: corev1.RestartPolicyNever, containers: []string{"main"}, code: 1,
			after: func(e *testEnv, p *corev1.Pod) {
				e.clk.Step(2 * time.Second)
				e.setHealth(p.Name, "main", corev1.ResourceHealthStatusUnhealthy)
			},
			want: "failed", signal: "kubelet", message: []string{"since 2026-03-01T10:00:02Z"},
		},
		{
			name: "turns Unhealthy after the window: no device failure", policy: corev1.RestartPolicyNever, containers: []string{"main"}, code: 1,
			after: func(e *testEnv, p *corev1.Pod) {
				e.stepUntil("the window over", 500*time.Millisecond, func() bool { return e.deviceCondition(p.Name, conditions.DeviceFailed) != nil })
				e.setHealth(p.Name, "main", corev1.ResourceHealthStatusUnhealthy)
			},
			want: "none", signal: "none", message: []string{"container main died (exit 1)", testGPU + " " + gpuA + " stayed healthy through the 10s window"},
		},
		{
			name: "exit 0 with an Unhealthy device: nothing", policy: corev1.RestartPolicyNever, containers: []string{"main"}, code: 0,
			before: func(e *testEnv, p *corev1.Pod) { e.setHealth(p.Name, "main", corev1.ResourceHealthStatusUnhealthy) },
		},
		{
			name: "another container's device: not blamed", policy: corev1.RestartPolicyNever, containers: []string{"main", "side"}, code: 1,
			before: func(e *testEnv, p *corev1.Pod) { e.setHealth(p.Name, "side", corev1.ResourceHealthStatusUnhealthy) },
			want:   "none", signal: "none", message: []string{gpuA},
		},
		{
			name: "restarted in place: nothing", policy: corev1.RestartPolicyOnFailure, containers: []string{"main"}, code: 1,
			before: func(e *testEnv, p *corev1.Pod) { e.setHealth(p.Name, "main", corev1.ResourceHealthStatusUnhealthy) },
			signal: "kubelet",
		},
		{
			name: "a hardware Xid on its GPU: stamped by the driver's word", policy: corev1.RestartPolicyNever, containers: []string{"main"}, code: 1,
			before: func(e *testEnv, _ *corev1.Pod) {
				e.xids <- xid(e.t, "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
				e.until("the fault kept", func() bool { _, f := e.a.ledger.DeviceFacts(e.pod("gpu").UID, "main"); return len(f) == 1 })
			},
			want: "failed", signal: "driver", message: []string{"reported a hardware fault (code 79)", "GPU has fallen off the bus."},
		},
		{
			name: "an application Xid on its GPU: not blamed", policy: corev1.RestartPolicyNever, containers: []string{"main"}, code: 1,
			before: func(e *testEnv, _ *corev1.Pod) {
				e.xids <- xid(e.t, "NVRM: Xid (PCI:0000:3b:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter")
				e.settle()
			},
			want: "none", signal: "none",
		},
		{
			name: "a hardware Xid on another GPU: not blamed", policy: corev1.RestartPolicyNever, containers: []string{"main"}, code: 1,
			before: func(e *testEnv, _ *corev1.Pod) {
				e.xids <- xid(e.t, "NVRM: Xid (PCI:0000:af:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
				e.settle()
			},
			want: "none", signal: "none",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uid := types.UID("d0d0d0d0-d0d0-4d0d-8d0d-d0d0d0d0d0d0")
			p := gpuPod("gpu", uid, tc.policy, tc.containers...)
			xids := make(chan kmsg.XidReport, 4)
			gpus := fakeGPUs(t)
			e := newTestEnv(t, func(c *Config) { c.Xids, c.NvidiaGPUsDir = xids, gpus }, p)
			e.xids = xids
			e.until("the pod's devices seen", func() bool { return e.a.ledger.HasDevices(uid, "main") })
			if tc.before != nil {
				tc.before(e, p)
			}
			id := containerID(700)
			e.src.Send(exited(p, "main", id, tc.code, "Error"))
			e.until("the exit classified", e.containerDone(id))
			e.settle()
			if tc.after != nil {
				tc.after(e, p)
			}
			// Past the window and the batch period.
			for range 30 {
				e.clk.Step(500 * time.Millisecond)
				time.Sleep(3 * time.Millisecond)
			}
			e.settle()
			e.clk.Step(time.Second)
			e.settle()
			dt, df := e.deviceCondition("gpu", conditions.DisruptionTarget), e.deviceCondition("gpu", conditions.DeviceFailed)
			switch tc.want {
			case "failed":
				if dt == nil || dt.Status != corev1.ConditionTrue || dt.Reason != conditions.ReasonDeviceFailure ||
					df == nil || df.Status != corev1.ConditionTrue || df.Reason != conditions.ReasonDeviceFailure || df.Message != dt.Message {
					t.Fatalf("DisruptionTarget %+v, DeviceFailed %+v: want both True, DeviceFailure, one message", dt, df)
				}
				if n := e.patcher.count(); n != 1 {
					t.Errorf("%d patches, want both conditions in 1", n)
				}
			case "none":
				if dt != nil || df == nil || df.Status != corev1.ConditionFalse || df.Reason != conditions.ReasonNoDeviceFailure {
					t.Fatalf("DisruptionTarget %+v, DeviceFailed %+v: want DeviceFailed=False NoDeviceFailure only", dt, df)
				}
			default:
				// A container restarted in place has its exit history written, nothing else.
				if dt != nil || df != nil || e.patcher.count() != len(e.pod("gpu").Annotations) {
					t.Fatalf("DisruptionTarget %+v, DeviceFailed %+v, %d patches, annotations %v: want nothing", dt, df, e.patcher.count(), e.pod("gpu").Annotations)
				}
			}
			if df != nil {
				for _, m := range tc.message {
					if !strings.Contains(df.Message, m) {
						t.Errorf("message %q does not say %q", df.Message, m)
					}
				}
			}
			if tc.signal != "" {
				if v := metrics.Value(e.m.DeviceVerdicts.WithLabelValues(testGPU, tc.signal)); v != 1 {
					t.Errorf("device_verdicts_total{%s,%s} = %v, want 1", testGPU, tc.signal, v)
				}
			}
			if tc.want != "" {
				if v := metrics.Value(e.m.DeviceLatency.WithLabelValues(tc.signal).(prometheus.Histogram)); v != 1 {
					t.Errorf("device verdict latency samples {%s} = %v, want 1", tc.signal, v)
				}
			}
		})
	}
}

// TestDeviceVerdictFromStatus: an agent that starts to find a pod Failed, holding a device
// first seen Unhealthy, whose failed container the runtime no longer reports, judges it
// from the pod's status; a Failed pod that has a verdict is left alone.
func TestDeviceVerdictFromStatus(t *testing.T) {
	p := gpuPod("gone", "e0e0e0e0-e0e0-4e0e-8e0e-e0e0e0e0e0e0", corev1.RestartPolicyNever, "main")
	p.Status.Phase = corev1.PodFailed
	cs := &p.Status.ContainerStatuses[0]
	cs.AllocatedResourcesStatus[0].Resources[0].Health = corev1.ResourceHealthStatusUnhealthy
	cs.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", ContainerID: "containerd://" + containerID(800),
		StartedAt: metav1.NewTime(t0.Add(-time.Hour)), FinishedAt: metav1.NewTime(t0.Add(-time.Minute))}
	judged := p.DeepCopy()
	judged.Name, judged.UID = "judged", "e1e1e1e1-e1e1-4e1e-8e1e-e1e1e1e1e1e1"
	judged.Status.Conditions = []corev1.PodCondition{{Type: conditions.DeviceFailed, Status: corev1.ConditionFalse, Reason: conditions.ReasonNoDeviceFailure}}
	e := newTestEnv(t, nil, p, judged)
	e.stepUntil("the verdict from the status", 200*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("gone").Status, conditions.DeviceFailed)
	})
	if c := e.deviceCondition("gone", conditions.DisruptionTarget); c == nil || c.Reason != conditions.ReasonDeviceFailure ||
		!strings.Contains(c.Message, "since a time not known") {
		t.Errorf("DisruptionTarget %+v", c)
	}
	if c := e.deviceCondition("judged", conditions.DeviceFailed); c.Status != corev1.ConditionFalse || e.deviceCondition("judged", conditions.DisruptionTarget) != nil {
		t.Errorf("the judged pod was written: %+v", e.pod("judged").Status.Conditions)
	}
}

// TestDeviceVerdictOnAdmission: a pod the kubelet refused at admission because its GPU
// turned Unhealthy after the scheduler placed it (the kubelet v1.36.3's status, seen on
// the lab) is stamped a device failure at once, though no container ran; a pod refused
// for another reason is not.
func TestDeviceVerdictOnAdmission(t *testing.T) {
	refused := func(name string, uid types.UID, msg string) *corev1.Pod {
		p := newPod(name, uid, corev1.RestartPolicyNever, "main")
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{testGPU: resource.MustParse("1")}
		p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, conditions.ReasonUnexpectedAdmissionError, msg
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 137, Reason: "ContainerStatusUnknown", Message: "The container could not be located when the pod was terminated"}}}}
		return p
	}
	p := refused("refused", "e2e2e2e2-e2e2-4e2e-8e2e-e2e2e2e2e2e2",
		"Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "+testGPU+", which is unexpected")
	other := refused("other", "e3e3e3e3-e3e3-4e3e-8e3e-e3e3e3e3e3e3", "Pod was rejected: failed to sync secret cache: timed out waiting for the condition")
	e := newTestEnv(t, nil, p, other)
	e.stepUntil("the admission verdict", 200*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("refused").Status, conditions.DeviceFailed)
	})
	c := e.deviceCondition("refused", conditions.DisruptionTarget)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != conditions.ReasonDeviceFailure ||
		!strings.Contains(c.Message, "the kubelet refused the pod: it could not allocate its device "+testGPU) {
		t.Errorf("DisruptionTarget %+v", c)
	}
	if c := e.deviceCondition("other", conditions.DisruptionTarget); c != nil {
		t.Errorf("a pod refused for another reason was stamped: %+v", c)
	}
	if c := e.deviceCondition("other", conditions.DeviceFailed); c != nil && c.Status == corev1.ConditionTrue {
		t.Errorf("a pod refused for another reason blamed on a device: %+v", c)
	}
}

// stubPodResources answers List with fixed devices.
type stubPodResources []AllocatedDevices

func (s stubPodResources) List(context.Context) ([]AllocatedDevices, error) { return s, nil }

// TestDeviceVerdictFromPodResources: a pod whose status lists no devices (the kubelet's
// ResourceHealthStatus off) but asks for a GPU: at the death the kubelet's PodResources
// say which GPU the container held, and a hardware Xid read before on that GPU blames it.
func TestDeviceVerdictFromPodResources(t *testing.T) {
	uid := types.UID("f0f0f0f0-0000-4f0f-8f0f-f0f0f0f0f0f0")
	p := gpuPod("old-kubelet", uid, corev1.RestartPolicyNever, "main")
	p.Status.ContainerStatuses = nil
	xids := make(chan kmsg.XidReport, 1)
	gpus := fakeGPUs(t)
	lister := stubPodResources{{Namespace: ns, Pod: "old-kubelet", Container: "main", Resource: testGPU, IDs: []string{gpuA}}}
	e := newTestEnv(t, func(c *Config) { c.Xids, c.NvidiaGPUsDir, c.PodResources = xids, gpus, lister }, p)
	xids <- xid(t, "NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.")
	e.until("the Xid read", func() bool { return len(xids) == 0 })
	e.settle()
	id := containerID(900)
	e.src.Send(exited(p, "main", id, 1, "Error"))
	e.stepUntil("the verdict", 100*time.Millisecond, func() bool {
		return conditions.IsTrue(&e.pod("old-kubelet").Status, conditions.DeviceFailed)
	})
	if c := e.deviceCondition("old-kubelet", conditions.DeviceFailed); !strings.Contains(c.Message, gpuA) || !strings.Contains(c.Message, "code 48") {
		t.Errorf("DeviceFailed %+v", c)
	}
}
