package conditions

// Devices: which pods hold devices (extended resources of device plugins, DRA claims), and
// the reasons the agent writes on coroner.dev/DeviceFailed.

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Reasons of the coroner.dev/DeviceFailed pod condition. True has ReasonDeviceFailure
// (as the DisruptionTarget it comes with); False has ReasonNoDeviceFailure: the agent
// judged a container death of a pod holding devices and no device explains it (every
// device it held stayed healthy until the window after the death was over, and the driver
// logged no hardware fault for them). Either status means the verdict is in.
const (
	ReasonNoDeviceFailure = "NoDeviceFailure"
)

// DeviceResources lists what devices p holds, sorted and without repeats: every extended
// resource its containers (init containers too) request or limit that is not one of
// Kubernetes' own (cpu, memory, ephemeral-storage, hugepages-*, names in the
// kubernetes.io domains), every resource named in its containers'
// allocatedResourcesStatus (the kubelet's word, device plugins and DRA alike), and
// "claim:NAME" for each of its resource claims. Empty when it holds none.
func DeviceResources(p *corev1.Pod) []string {
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range list {
			for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
				for name := range rl {
					if IsDeviceResource(name) {
						add(string(name))
					}
				}
			}
		}
	}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			for _, r := range cs.AllocatedResourcesStatus {
				add(string(r.Name))
			}
		}
	}
	for _, c := range p.Spec.ResourceClaims {
		add("claim:" + c.Name)
	}
	slices.Sort(out)
	return out
}

// HoldsDevices reports whether p holds a device (DeviceResources is not empty).
func HoldsDevices(p *corev1.Pod) bool { return len(DeviceResources(p)) > 0 }

// IsDeviceResource reports whether name is an extended resource (a device plugin's, such
// as nvidia.com/gpu): a name with a domain that is not Kubernetes' own, and not a
// "requests." quota name.
func IsDeviceResource(name corev1.ResourceName) bool {
	s := string(name)
	domain, _, ok := strings.Cut(s, "/")
	if !ok || strings.HasPrefix(s, "requests.") {
		return false
	}
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io")
}

// ReasonUnexpectedAdmissionError is the kubelet's status.reason for a pod it refused at
// admission after the scheduler had placed it, among others when its device manager
// could not allocate the pod's devices.
const ReasonUnexpectedAdmissionError = "UnexpectedAdmissionError"

// AdmissionDeviceFailure reports whether the kubelet refused p, a Failed pod, because it
// could not allocate a device the pod asks for: status.reason UnexpectedAdmissionError and
// a device manager's "Allocate failed" message naming one of the pod's device resources.
// The kubelet v1.36.3 writes, when a device turned Unhealthy (or was taken) between the
// scheduler's choice and the kubelet's admission (measured on the lab, test GPUs failing
// while pods were placed):
//
//	Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices coroner.dev/test-gpu, which is unexpected
//	Pod was rejected: Allocate failed due to requested number of devices unavailable for coroner.dev/test-gpu. Requested: 1, Available: 0, which is unexpected
//
// It returns the resource the message names.
func AdmissionDeviceFailure(p *corev1.Pod) (string, bool) {
	if p.Status.Phase != corev1.PodFailed || p.Status.Reason != ReasonUnexpectedAdmissionError || !strings.Contains(p.Status.Message, "Allocate failed") {
		return "", false
	}
	for _, r := range DeviceResources(p) {
		if !strings.HasPrefix(r, "claim:") && strings.Contains(p.Status.Message, r) {
			return r, true
		}
	}
	return "", false
}
