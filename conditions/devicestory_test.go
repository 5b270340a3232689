package conditions

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestDeviceVerdictOf(t *testing.T) {
	at := time.Date(2026, 12, 7, 19, 40, 1, 0, time.UTC)
	kubelet := "container main died: its device coroner.dev/test-gpu gpu-0 is Unhealthy (the kubelet's device health) since 2026-12-07T19:40:01Z"
	driver := "container main died: its device nvidia.com/gpu GPU-2f6c reported a hardware fault (code 79) at 2026-12-07T19:40:01Z: GPU has fallen off the bus"
	admission := "the kubelet refused the pod: it could not allocate its device coroner.dev/test-gpu (Allocate failed due to no healthy devices present; cannot allocate unhealthy devices coroner.dev/test-gpu, which is unexpected)"
	pod := func(conds ...corev1.PodCondition) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Conditions: conds}}
	}
	dt := func(reason, msg string) corev1.PodCondition {
		return corev1.PodCondition{Type: DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason, Message: msg}
	}
	df := func(s corev1.ConditionStatus, reason, msg string) corev1.PodCondition {
		return corev1.PodCondition{Type: DeviceFailed, Status: s, Reason: reason, Message: msg}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		ok   bool
		want DeviceVerdict
	}{
		{name: "the kubelet's health", pod: pod(dt(ReasonDeviceFailure, kubelet), df(corev1.ConditionTrue, ReasonDeviceFailure, kubelet)), ok: true,
			want: DeviceVerdict{Failed: true, Condition: df(corev1.ConditionTrue, ReasonDeviceFailure, kubelet), Parsed: true, Container: "main",
				Resource: "coroner.dev/test-gpu", ID: "gpu-0", Signal: DeviceSignalKubelet, Health: "Unhealthy", At: at}},
		{name: "the driver's fault", pod: pod(df(corev1.ConditionTrue, ReasonDeviceFailure, driver), dt(ReasonDeviceFailure, driver)), ok: true,
			want: DeviceVerdict{Failed: true, Condition: df(corev1.ConditionTrue, ReasonDeviceFailure, driver), Parsed: true, Container: "main",
				Resource: "nvidia.com/gpu", ID: "GPU-2f6c", Signal: DeviceSignalDriver, Code: 79, Detail: "GPU has fallen off the bus", At: at}},
		{name: "refused at admission", pod: pod(dt(ReasonDeviceFailure, admission), df(corev1.ConditionTrue, ReasonDeviceFailure, admission)), ok: true,
			want: DeviceVerdict{Failed: true, Condition: df(corev1.ConditionTrue, ReasonDeviceFailure, admission), Parsed: true,
				Resource: "coroner.dev/test-gpu", Signal: DeviceSignalAdmission, Detail: "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices coroner.dev/test-gpu, which is unexpected"}},
		{name: "a time not known", pod: pod(dt(ReasonDeviceFailure, "container main died: its device example.com/gpu dev-1 is Unhealthy (the kubelet's device health) since a time not known")), ok: true,
			want: DeviceVerdict{Failed: true, Condition: dt(ReasonDeviceFailure, "container main died: its device example.com/gpu dev-1 is Unhealthy (the kubelet's device health) since a time not known"),
				Parsed: true, Container: "main", Resource: "example.com/gpu", ID: "dev-1", Signal: DeviceSignalKubelet, Health: "Unhealthy"}},
		{name: "a message in other words is kept, not parsed", pod: pod(df(corev1.ConditionTrue, ReasonDeviceFailure, "the GPU died")), ok: true,
			want: DeviceVerdict{Failed: true, Condition: df(corev1.ConditionTrue, ReasonDeviceFailure, "the GPU died")}},
		{name: "no failing device", pod: pod(df(corev1.ConditionFalse, ReasonNoDeviceFailure, "devices healthy")), ok: true,
			want: DeviceVerdict{Condition: df(corev1.ConditionFalse, ReasonNoDeviceFailure, "devices healthy")}},
		{name: "another disruption is no device verdict", pod: pod(dt(ReasonPreemptionByScheduler, "preempted"))},
		{name: "nothing", pod: pod()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := DeviceVerdictOf(tc.pod)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("DeviceVerdictOf (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFailedResource(t *testing.T) {
	gpu := corev1.ResourceList{"example.com/gpu": resource.MustParse("1")}
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: gpu}}}}}
	v := DeviceVerdict{Failed: true}
	if got := v.FailedResource(p); got != "example.com/gpu" {
		t.Errorf("the only device held: %q", got)
	}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", AllocatedResourcesStatus: []corev1.ResourceStatus{
		{Name: "example.com/gpu", Resources: []corev1.ResourceHealth{{ResourceID: "a", Health: corev1.ResourceHealthStatusHealthy}}},
		{Name: "claim:gpu/req", Resources: []corev1.ResourceHealth{{ResourceID: "drv/pool/dev", Health: corev1.ResourceHealthStatusUnhealthy}}},
	}}}
	if got := v.FailedResource(p); got != "claim:gpu/req" {
		t.Errorf("the only Unhealthy one: %q", got)
	}
	v.Resource = "nvidia.com/gpu"
	if got := v.FailedResource(p); got != "nvidia.com/gpu" {
		t.Errorf("the message's: %q", got)
	}
}
