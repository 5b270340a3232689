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
