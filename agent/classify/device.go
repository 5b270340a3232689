package classify

// The device verdict: did a container die because a device allocated to it failed? Pure:
// the agent gathers the facts (the health the kubelet reports in the pod's
// status.containerStatuses[].allocatedResourcesStatus, with the time the agent first saw
// each health; the hardware faults the driver logged for the container's devices) and
// writes the stamps (StampsForDevice, devicestamp.go). The facts are kept in the ledger's
// evidence (agent/ledger/devices.go); the agent judges in agent/devices.go.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// Signal is where the word that a device failed came from.
type Signal string

const (
	// SignalKubelet: the device's health in the pod's allocatedResourcesStatus, which the
	// kubelet takes from the device plugin (ListAndWatch) or the DRA driver (KEP-4680).
	SignalKubelet Signal = "kubelet"
	// SignalDriver: a hardware fault the device's driver wrote to the kernel log (an
	// NVIDIA Xid, agent/nvidia), before or without the plugin's health.
	SignalDriver Signal = "driver"
	// SignalAdmission: the kubelet refused the pod at admission because it could not
	// allocate its device (conditions.AdmissionDeviceFailure): a device turned Unhealthy
	// between the scheduler's choice and the kubelet's admission. No container ran.
	SignalAdmission Signal = "admission"
)

// DeviceHealth is what the agent knows of one device allocated to a container.
type DeviceHealth struct {
	// Resource is the allocatedResourcesStatus name: an extended resource
	// ("nvidia.com/gpu") or a DRA claim's request ("claim:NAME/REQUEST").
	Resource string
	// ID is the device's resourceID (a device plugin's device ID, or a DRA
	// driver/pool/device).
	ID string
	// Health is the health last reported.
	Health corev1.ResourceHealthStatus
	// Since is when the agent first saw the device with this health; zero when it does
	// not know (the health was already so when the agent first saw the pod).
	Since time.Time
}

// DeviceFault is a hardware fault the driver reported for a device the container held.
type DeviceFault struct {
	Resource, ID string
	// Code is the driver's code for it (an NVIDIA Xid).
	Code int
	// At is when the kernel logged it.
	At time.Time
	// Message is the driver's text, for the stamp's message.
	Message string
}

// DeviceFacts are the facts about one container's death and its devices.
type DeviceFacts struct {
	// Container is the container's name; ExitCode and Signal its termination (a non-zero
	// code, or a signal, is a death; 0 and no signal is a success).
	Container string
	ExitCode  int32
	Signal    int32
	// StartedAt and FinishedAt bound the container's run; a fault logged before it started
	// is another run's.
	StartedAt, FinishedAt time.Time
	// Devices are the devices allocated to this container (none of another container's:
	// a device the container did not hold never blames it).
	Devices []DeviceHealth
	// Faults are the hardware faults logged for the container's devices.
	Faults []DeviceFault
	// Now is the time of the judgement; Window how long after FinishedAt a device that
	// turns Unhealthy (or a fault logged) still explains the death: the program often
	// dies of the fault before the plugin reports it.
	Now    time.Time
	Window time.Duration
}

// DeviceVerdict is what DecideDevice found.
type DeviceVerdict struct {
	// Failed: the container died while a device allocated to it had failed.
	Failed bool
	// WaitUntil, when Failed is false and it is not zero: no device explains the death
	// yet, but one still may until then (FinishedAt + Window); judge again then.
	WaitUntil time.Time

	// The device that failed, when Failed.
	Resource, ID string
	Signal       Signal
	Health       corev1.ResourceHealthStatus // SignalKubelet
	Code         int                         // SignalDriver
	// At is when the device turned Unhealthy, or the fault was logged; zero when unknown.
	At      time.Time
	Message string // SignalDriver: the driver's text
}

// DecideAdmission is the device verdict on a pod the kubelet refused at admission because
// it could not allocate a device the pod asks for (conditions.AdmissionDeviceFailure), or
// false. Its facts name no container and no exit (none ran).
func DecideAdmission(pod *corev1.Pod, now time.Time) (DeviceVerdict, DeviceFacts, bool) {
	resource, ok := conditions.AdmissionDeviceFailure(pod)
	if !ok {
		return DeviceVerdict{}, DeviceFacts{}, false
	}
	msg := strings.TrimPrefix(pod.Status.Message, "Pod was rejected: ")
	return DeviceVerdict{Failed: true, Resource: resource, Signal: SignalAdmission, At: now, Message: msg},
		DeviceFacts{Now: now, FinishedAt: now}, true
}

// DecideDevice judges one container's death by its devices:
//
//   - a container that succeeded (exit 0, no signal), or that held no device, is never
//     a device failure;
//   - a device the kubelet reports Unhealthy, since before the death or since at most
//     Window after it (or since a time the agent does not know), failed the container;
//   - so did a hardware fault logged for one of its devices while it ran or within Window
//     after its death;
//   - otherwise, until FinishedAt + Window, the verdict waits (WaitUntil).
//
// When several devices explain the death, the one that turned first is named (ties:
// resource, then ID), the kubelet's word before the driver's at the same time.
func DecideDevice(f DeviceFacts) DeviceVerdict {
	if (f.ExitCode == 0 && f.Signal == 0) || (len(f.Devices) == 0 && len(f.Faults) == 0) {
		return DeviceVerdict{}
	}
	deadline := f.FinishedAt.Add(f.Window)
	var found []DeviceVerdict
	for _, d := range f.Devices {
		if d.Health != corev1.ResourceHealthStatusUnhealthy {
			continue
		}
		if !d.Since.IsZero() && d.Since.After(deadline) {
			continue // turned after the window: not what killed it
		}
		found = append(found, DeviceVerdict{Failed: true, Resource: d.Resource, ID: d.ID,
			Signal: SignalKubelet, Health: d.Health, At: d.Since})
	}
	for _, x := range f.Faults {
		if x.At.Before(f.StartedAt) || x.At.After(deadline) {
			continue
		}
		found = append(found, DeviceVerdict{Failed: true, Resource: x.Resource, ID: x.ID,
			Signal: SignalDriver, Code: x.Code, At: x.At, Message: x.Message})
	}
	if len(found) > 0 {
		return slices.MinFunc(found, func(a, b DeviceVerdict) int {
			return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Resource, b.Resource),
				cmp.Compare(a.ID, b.ID), cmp.Compare(signalRank(a.Signal), signalRank(b.Signal)))
		})
	}
	if f.Now.Before(deadline) {
		return DeviceVerdict{WaitUntil: deadline}
	}
	return DeviceVerdict{}
}

// signalRank orders the signals naming the same device at the same time: the kubelet's
// first.
func signalRank(s Signal) int {
	if s == SignalKubelet {
		return 0
	}
	return 1
}

// StampMessage is the message of the DeviceFailed and DisruptionTarget conditions for v,
// the verdict on container: which device, which signal, when it turned.
func (v DeviceVerdict) StampMessage(container string) string {
	when := "a time not known"
	if !v.At.IsZero() {
		when = v.At.UTC().Format(time.RFC3339)
	}
	if v.Signal == SignalAdmission {
		msg := fmt.Sprintf("the kubelet refused the pod: it could not allocate its device %s", v.Resource)
		if v.Message != "" {
			msg += " (" + v.Message + ")"
		}
		return msg
	}
	if v.Signal == SignalDriver {
		msg := fmt.Sprintf("container %s died: its device %s %s reported a hardware fault (code %d) at %s", container, v.Resource, v.ID, v.Code, when)
		if v.Message != "" {
			msg += ": " + v.Message
		}
		return msg
	}
	return fmt.Sprintf("container %s died: its device %s %s is %s (the kubelet's device health) since %s", container, v.Resource, v.ID, v.Health, when)
}
