package conditions

// Reading the agent's device verdict back, for coroner-shim's Events and metrics and for
// coronerctl explain. The verdict's message is for people; it is read loosely here, and
// whoever shows it shows it whole.

import (
	"regexp"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Device signals: where the word that a device failed came from.
const (
	// DeviceSignalKubelet: the device's health in the pod's allocatedResourcesStatus (the
	// device plugin's or the DRA driver's, through the kubelet).
	DeviceSignalKubelet = "kubelet"
	// DeviceSignalDriver: a hardware fault the device's driver logged (an NVIDIA Xid).
	DeviceSignalDriver = "driver"
	// DeviceSignalAdmission: the kubelet refused the pod at admission, unable to allocate
	// its device (AdmissionDeviceFailure); no container ran.
	DeviceSignalAdmission = "admission"
)

// DeviceVerdict is coroner-agent's device verdict on a pod, as its conditions say it.
type DeviceVerdict struct {
	// Failed: DisruptionTarget=True reason DeviceFailure, or coroner.dev/DeviceFailed=True.
	// Otherwise coroner.dev/DeviceFailed=False: the agent found no failing device.
	Failed bool
	// Condition is the condition the verdict is read from: coroner.dev/DeviceFailed, else
	// the DisruptionTarget DeviceFailure.
	Condition corev1.PodCondition
	// What the message says, when it reads as the agent writes it (Parsed); zero otherwise.
	Parsed    bool
	Container string
	// Resource and ID name the device ("nvidia.com/gpu", "GPU-2f6c..."); Signal is
	// DeviceSignalKubelet (Health is then its health) or DeviceSignalDriver (Code is then
	// the driver's code and Detail its text).
	Resource, ID string
	Signal       string
	Health       string
	Code         int
	Detail       string
	// At is when the device turned, or the fault was logged; zero when not known.
	At time.Time
}

// DeviceVerdictOf reads p's device verdict; false when the agent gave none.
func DeviceVerdictOf(p *corev1.Pod) (DeviceVerdict, bool) {
	var v DeviceVerdict
	df := Find(&p.Status, DeviceFailed)
	dt := FindTrue(p, DisruptionTarget)
	if dt != nil && dt.Reason != ReasonDeviceFailure {
		dt = nil
	}
	switch {
	case df != nil && df.Status == corev1.ConditionTrue:
		v.Failed, v.Condition = true, *df
	case dt != nil:
		v.Failed, v.Condition = true, *dt
	case df != nil && df.Status == corev1.ConditionFalse:
		v.Condition = *df
	default:
		return DeviceVerdict{}, false
	}
	if v.Failed {
		v.parse(v.Condition.Message)
		if !v.Parsed && dt != nil && v.Condition.Type != dt.Type {
			v.parse(dt.Message)
		}
	}
	return v, true
}

var (
	kubeletVerdict   = regexp.MustCompile(`container (\S+) died: its device (\S+) (\S+) is (\S+) \(the kubelet's device health\) since (.+?)\s*$`)
	admissionVerdict = regexp.MustCompile(`the kubelet refused the pod: it could not allocate its device (\S+)(?: \((.*)\))?\s*$`)
	driverVerdict    = regexp.MustCompile(`container (\S+) died: its device (\S+) (\S+) reported a hardware fault \(code (-?\d+)\) at (\S+?)(?:: (.*))?\s*$`)
)

// parse reads the agent's DeviceFailure message (agent/classify's StampMessage).
func (v *DeviceVerdict) parse(msg string) {
	if m := kubeletVerdict.FindStringSubmatch(msg); m != nil {
		v.Parsed, v.Container, v.Resource, v.ID, v.Signal, v.Health = true, m[1], m[2], m[3], DeviceSignalKubelet, m[4]
		v.At, _ = time.Parse(time.RFC3339, m[5])
		return
	}
	if m := admissionVerdict.FindStringSubmatch(msg); m != nil {
		v.Parsed, v.Resource, v.Signal, v.Detail = true, m[1], DeviceSignalAdmission, m[2]
		return
	}
	if m := driverVerdict.FindStringSubmatch(msg); m != nil {
		v.Parsed, v.Container, v.Resource, v.ID, v.Signal, v.Detail = true, m[1], m[2], m[3], DeviceSignalDriver, m[6]
		v.Code, _ = strconv.Atoi(m[4])
		v.At, _ = time.Parse(time.RFC3339, m[5])
	}
}

// Message is the verdict's message, on one line.
func (v DeviceVerdict) Message() string { return oneLine(v.Condition.Message) }

// FailedResource is the resource of the device that failed: the one the message names,
// else the only one the kubelet reports Unhealthy, else the only one p holds; "" when
// not known.
func (v DeviceVerdict) FailedResource(p *corev1.Pod) string {
	if v.Resource != "" {
		return v.Resource
	}
	var unhealthy []string
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses} {
		for _, cs := range list {
			for _, r := range cs.AllocatedResourcesStatus {
				for _, h := range r.Resources {
					if h.Health == corev1.ResourceHealthStatusUnhealthy {
						unhealthy = append(unhealthy, string(r.Name))
					}
				}
			}
		}
	}
	if len(unhealthy) == 1 {
		return unhealthy[0]
	}
	if held := DeviceResources(p); len(held) == 1 && len(unhealthy) == 0 {
		return held[0]
	}
	return ""
}
