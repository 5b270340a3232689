package classify

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// TestStampsForDevice: a final verdict's conditions on the pod, and when the pod already
// says otherwise or goes on running.
func TestStampsForDevice(t *testing.T) {
	started := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	finished := started.Add(time.Minute)
	const gpu = "nvidia.com/gpu"
	facts := DeviceFacts{Container: "main", ExitCode: 1, StartedAt: started, FinishedAt: finished,
		Devices: []DeviceHealth{{Resource: gpu, ID: "GPU-a", Health: corev1.ResourceHealthStatusUnhealthy, Since: finished.Add(2 * time.Second)}},
		Now:     finished.Add(3 * time.Second), Window: 10 * time.Second}
	failed := DecideDevice(facts)
	if !failed.Failed {
		t.Fatalf("the fixture's verdict %+v is not a failure", failed)
	}
	none := DeviceVerdict{}
	pod := func(policy corev1.RestartPolicy, conds ...corev1.PodCondition) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: policy, Containers: []corev1.Container{{Name: "main"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: conds}}
	}
	evicted := corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonEvictionByEvictionAPI}
	verdictIn := corev1.PodCondition{Type: conditions.DeviceFailed, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure}
	exit0 := facts
	exit0.ExitCode = 0

	type want struct {
		kind   Kind
		typ    corev1.PodConditionType
		status corev1.ConditionStatus
		reason string
	}
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		v     DeviceVerdict
		facts DeviceFacts
		want  []want
	}{
		{"a device failed: DisruptionTarget and DeviceFailed, both DeviceFailure", pod(corev1.RestartPolicyNever), failed, facts, []want{
			{KindDeviceFailure, conditions.DisruptionTarget, corev1.ConditionTrue, conditions.ReasonDeviceFailure},
			{KindDeviceVerdict, conditions.DeviceFailed, corev1.ConditionTrue, conditions.ReasonDeviceFailure}}},
		{"no device to blame: DeviceFailed=False NoDeviceFailure", pod(corev1.RestartPolicyNever), none, facts, []want{
			{KindDeviceVerdict, conditions.DeviceFailed, corev1.ConditionFalse, conditions.ReasonNoDeviceFailure}}},
		{"a verdict still waiting: nothing", pod(corev1.RestartPolicyNever), DeviceVerdict{WaitUntil: finished.Add(10 * time.Second)}, facts, nil},
		{"exit 0: nothing", pod(corev1.RestartPolicyNever), none, exit0, nil},
		{"someone else's DisruptionTarget stays: DeviceFailed alone", pod(corev1.RestartPolicyNever, evicted), failed, facts, []want{
			{KindDeviceVerdict, conditions.DeviceFailed, corev1.ConditionTrue, conditions.ReasonDeviceFailure}}},
		{"someone else's DisruptionTarget, no device to blame: the verdict is still said", pod(corev1.RestartPolicyNever, evicted), none, facts, []want{
			{KindDeviceVerdict, conditions.DeviceFailed, corev1.ConditionFalse, conditions.ReasonNoDeviceFailure}}},
		{"a verdict already on the pod: nothing", pod(corev1.RestartPolicyNever, verdictIn), failed, facts, nil},
		{"restarted in place: nothing", pod(corev1.RestartPolicyOnFailure), failed, facts, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := StampsForDevice(tc.pod, tc.v, tc.facts)
			if len(got) != len(tc.want) {
				t.Fatalf("%d stamps %+v, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				s := got[i]
				if s.Kind != w.kind || s.Condition == nil || s.Condition.Type != w.typ || s.Condition.Status != w.status || s.Condition.Reason != w.reason || s.Reason != w.reason {
					t.Errorf("stamp %d: %+v, want %+v", i, s, w)
					continue
				}
				if s.Condition.Message != s.Message || !strings.Contains(s.Message, "container main") || !strings.Contains(s.Message, "GPU-a") {
					t.Errorf("stamp %d: message %q does not name the container and the device", i, s.Message)
				}
			}
			if len(got) > 0 && tc.v.Failed && len(got) == 2 {
				// Dated when the death became a device failure: the device turned 2 s after it.
				if want := metav1.NewTime(finished.Add(2 * time.Second)); !got[0].Condition.LastTransitionTime.Equal(&want) {
					t.Errorf("lastTransitionTime %v, want %v", got[0].Condition.LastTransitionTime, want)
				}
			}
		})
	}
	if msg := NoDeviceFailureMessage(facts); !strings.Contains(msg, "exit 1") || !strings.Contains(msg, "nvidia.com/gpu GPU-a stayed healthy through the 10s window") {
		t.Errorf("NoDeviceFailure message %q", msg)
	}
	unknown := facts
	unknown.Devices = nil
	if msg := NoDeviceFailureMessage(unknown); !strings.Contains(msg, "not known") {
		t.Errorf("message without devices %q", msg)
	}
}

// TestDecideAdmission: a pod the kubelet refused because it could not allocate its GPU is
// a device failure, stamped though no container ran, in words conditions.DeviceVerdictOf
// (coroner-shim's Events, coronerctl explain) reads back.
func TestDecideAdmission(t *testing.T) {
	now := time.Date(2026, 12, 7, 20, 34, 19, 0, time.UTC)
	p := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"coroner.dev/test-gpu": resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: conditions.ReasonUnexpectedAdmissionError,
			// The kubelet v1.36.3's words, from the lab's device storm.
			Message:           "Pod was rejected: Allocate failed due to requested number of devices unavailable for coroner.dev/test-gpu. Requested: 1, Available: 0, which is unexpected",
			ContainerStatuses: []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "ContainerStatusUnknown"}}}}},
	}
	v, f, ok := DecideAdmission(p, now)
	if !ok || !v.Failed || v.Signal != SignalAdmission || v.Resource != "coroner.dev/test-gpu" {
		t.Fatalf("DecideAdmission = %+v, %v", v, ok)
	}
	stamps := StampsForDevice(p, v, f)
	if len(stamps) != 2 || stamps[0].Condition.Type != conditions.DisruptionTarget || stamps[1].Condition.Type != conditions.DeviceFailed {
		t.Fatalf("stamps %+v, want DisruptionTarget and DeviceFailed", stamps)
	}
	stamped := p.DeepCopy()
	for _, s := range stamps {
		stamped.Status.Conditions = append(stamped.Status.Conditions, *s.Condition)
	}
	back, ok := conditions.DeviceVerdictOf(stamped)
	if !ok || !back.Parsed || back.Signal != conditions.DeviceSignalAdmission || back.Resource != "coroner.dev/test-gpu" ||
		back.Detail != "Allocate failed due to requested number of devices unavailable for coroner.dev/test-gpu. Requested: 1, Available: 0, which is unexpected" {
		t.Errorf("read back %+v from %q", back, stamps[1].Condition.Message)
	}
	other := p.DeepCopy()
	other.Status.Message = "Pod was rejected: node(s) didn't have free ports for the requested pod ports"
	if _, _, ok := DecideAdmission(other, now); ok {
		t.Errorf("another admission error taken for a device failure")
	}
}
