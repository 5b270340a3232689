package conditions

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestDeviceResources(t *testing.T) {
	one := resource.MustParse("1")
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want []string
	}{
		{"cpu and memory only", &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{corev1.ResourceCPU: one, corev1.ResourceMemory: one, "hugepages-2Mi": one, corev1.ResourceEphemeralStorage: one}}}}}}, nil},
		{"a GPU limit", &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{"nvidia.com/gpu": one, corev1.ResourceCPU: one}}}}}}, []string{"nvidia.com/gpu"}},
		{"Kubernetes' own domains are not devices", &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{"kubernetes.io/x": one, "node.kubernetes.io/y": one, "requests.nvidia.com/gpu": one}}}}}}, nil},
		{"init container, status and claim", &corev1.Pod{
			Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"coroner.dev/test-gpu": one}}}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus"}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{AllocatedResourcesStatus: []corev1.ResourceStatus{
				{Name: "claim:gpus/gpu"}, {Name: "coroner.dev/test-gpu"}}}}}},
			[]string{"claim:gpus", "claim:gpus/gpu", "coroner.dev/test-gpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := DeviceResources(tc.pod)
			if !slices.Equal(got, tc.want) {
				t.Errorf("DeviceResources = %q, want %q", got, tc.want)
			}
			if HoldsDevices(tc.pod) != (len(tc.want) > 0) {
				t.Errorf("HoldsDevices = %v", HoldsDevices(tc.pod))
			}
		})
	}
}

func TestAdmissionDeviceFailure(t *testing.T) {
	gpu := corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"coroner.dev/test-gpu": resource.MustParse("1")}}}}}
	// The kubelet v1.36.3's messages, from pods it refused on the lab while their test GPU
	// failed (the fault suite's device storm).
	const unhealthy = "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices coroner.dev/test-gpu, which is unexpected"
	const taken = "Pod was rejected: Allocate failed due to requested number of devices unavailable for coroner.dev/test-gpu. Requested: 1, Available: 0, which is unexpected"
	for _, tc := range []struct {
		name            string
		spec            corev1.PodSpec
		phase           corev1.PodPhase
		reason, message string
		want            string
	}{
		{"no healthy device", gpu, corev1.PodFailed, ReasonUnexpectedAdmissionError, unhealthy, "coroner.dev/test-gpu"},
		{"devices unavailable", gpu, corev1.PodFailed, ReasonUnexpectedAdmissionError, taken, "coroner.dev/test-gpu"},
		{"another admission error", gpu, corev1.PodFailed, ReasonUnexpectedAdmissionError, "Pod was rejected: failed to sync secret cache: timed out waiting for the condition", ""},
		{"a resource the pod does not ask for", corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}, corev1.PodFailed, ReasonUnexpectedAdmissionError, unhealthy, ""},
		{"not Failed", gpu, corev1.PodPending, ReasonUnexpectedAdmissionError, unhealthy, ""},
		{"evicted", gpu, corev1.PodFailed, "Evicted", "The node was low on resource: memory.", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{Spec: tc.spec, Status: corev1.PodStatus{Phase: tc.phase, Reason: tc.reason, Message: tc.message}}
			got, ok := AdmissionDeviceFailure(p)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("AdmissionDeviceFailure = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}
