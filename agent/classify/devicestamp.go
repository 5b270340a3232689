package classify

// The device verdict's stamps: what DecideDevice's verdict on a container's death means
// for its pod.

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// Stamp kinds of the device verdict.
const (
	// KindDeviceFailure: DisruptionTarget=True, reason DeviceFailure.
	KindDeviceFailure Kind = "DeviceFailure"
	// KindDeviceVerdict: coroner.dev/DeviceFailed, True (reason DeviceFailure) or False
	// (reason NoDeviceFailure): the verdict is in.
	KindDeviceVerdict Kind = "DeviceVerdict"
)

// SignalNone is the "signal" of a verdict that no device explains the death (for metrics
// and logs).
const SignalNone Signal = "none"

// VerdictSignal is v's signal: kubelet or driver when a device failed, none otherwise.
func (v DeviceVerdict) VerdictSignal() Signal {
	if !v.Failed {
		return SignalNone
	}
	return v.Signal
}

// EventTime is when the death became a device failure: the later of the container's
// finish and the device's turn (or fault); the finish when no device failed or the turn is
// not known.
func (v DeviceVerdict) EventTime(f DeviceFacts) time.Time {
	if v.Failed && v.At.After(f.FinishedAt) {
		return v.At
	}
	return f.FinishedAt
}

// StampsForDevice returns the stamps of DecideDevice's final verdict v on the death f
// describes (a verdict that waits, WaitUntil, has none yet). pod is not modified.
//
//   - A device failed: DisruptionTarget=True and coroner.dev/DeviceFailed=True, both
//     reason DeviceFailure, both with v.StampMessage, meant to be written together (the
//     stamper writes a pod's conditions in one patch). A pod that has DisruptionTarget=True
//     with another reason keeps it (an eviction or a preemption was first and stays, as
//     for NodeOOM) and gets DeviceFailed=True alone (coroner's own condition, as
//     OOMKilled is written whatever DisruptionTarget says). None when the pod already has
//     a DeviceFailed condition (the first verdict stays), nor when the kubelet restarts
//     the container in place
//     (ContainerWillRestart: the pod goes on running, and a condition an
//     onPodConditions rule matches would excuse a later, real failure of the pod).
//   - No device explains it: coroner.dev/DeviceFailed=False, reason NoDeviceFailure,
//     naming the devices and that they stayed healthy through the window, so that a
//     controller waiting for the verdict stops waiting. Not when the pod already has a
//     DeviceFailed condition, nor for a container restarted in place (nothing waits on a
//     running pod).
//   - A death that is no death (exit 0, no signal): none.
func StampsForDevice(pod *corev1.Pod, v DeviceVerdict, f DeviceFacts) []Stamp {
	admission := v.Failed && v.Signal == SignalAdmission
	if pod == nil || !v.WaitUntil.IsZero() || (f.ExitCode == 0 && f.Signal == 0 && !admission) {
		return nil
	}
	if conditions.Find(&pod.Status, conditions.DeviceFailed) != nil || (!admission && ContainerWillRestart(pod, f.Container, f.ExitCode)) {
		return nil
	}
	at := metav1.NewTime(v.EventTime(f))
	if at.IsZero() {
		at = metav1.NewTime(f.Now)
	}
	cond := func(t corev1.PodConditionType, status corev1.ConditionStatus, reason, msg string) *corev1.PodCondition {
		return &corev1.PodCondition{Type: t, Status: status, Reason: reason, Message: msg, LastTransitionTime: at}
	}
	if !v.Failed {
		msg := NoDeviceFailureMessage(f)
		return []Stamp{{Kind: KindDeviceVerdict, Reason: conditions.ReasonNoDeviceFailure,
			Condition: cond(conditions.DeviceFailed, corev1.ConditionFalse, conditions.ReasonNoDeviceFailure, msg), Message: msg}}
	}
	msg := v.StampMessage(f.Container)
	verdict := Stamp{Kind: KindDeviceVerdict, Reason: conditions.ReasonDeviceFailure,
		Condition: cond(conditions.DeviceFailed, corev1.ConditionTrue, conditions.ReasonDeviceFailure, msg), Message: msg}
	if dt := conditions.Find(&pod.Status, conditions.DisruptionTarget); dt != nil && dt.Status == corev1.ConditionTrue && dt.Reason != conditions.ReasonDeviceFailure {
		return []Stamp{verdict} // the first disruption stays
	}
	return []Stamp{
		{Kind: KindDeviceFailure, Reason: conditions.ReasonDeviceFailure,
			Condition: cond(conditions.DisruptionTarget, corev1.ConditionTrue, conditions.ReasonDeviceFailure, msg), Message: msg},
		verdict,
	}
}

// NoDeviceFailureMessage is the message of DeviceFailed=False for the death f describes:
// which devices the container held, and that none failed by the end of the window.
func NoDeviceFailureMessage(f DeviceFacts) string {
	death := fmt.Sprintf("container %s died (exit %d)", f.Container, f.ExitCode)
	if f.Signal != 0 {
		death = fmt.Sprintf("container %s died (signal %d)", f.Container, f.Signal)
	}
	if len(f.Devices) == 0 {
		return death + "; which devices it held is not known (no allocatedResourcesStatus in the pod's status, no PodResources answer), so none is blamed"
	}
	names := make([]string, 0, len(f.Devices))
	for _, d := range f.Devices {
		names = append(names, d.Resource+" "+d.ID)
	}
	return fmt.Sprintf("%s; its devices %s stayed healthy through the %v window after the death (none reported Unhealthy, no hardware fault logged by their drivers)",
		death, strings.Join(names, ", "), f.Window)
}
