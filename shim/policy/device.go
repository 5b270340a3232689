package policy

// The wait for coroner-agent's device verdict on a failed pod that held devices.

import (
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// DefaultDeviceVerdictWait is coroner-shim's default --device-verdict-wait, which
// coronerctl explain assumes when it says how long a pod waits.
const DefaultDeviceVerdictWait = 30 * time.Second

// DeviceDeath is the container death of a failed pod that coroner-agent's device verdict
// is about: the failing container (a non-zero exit or a signal) that finished last.
type DeviceDeath struct {
	Container  string
	Init       bool
	FinishedAt time.Time
}

// AwaitsDeviceVerdict reports whether the failure of pod, a pod of a Job whose
// podFailurePolicy is pfp, is to be decided on coroner-agent's device verdict that the pod
// does not have yet, and from which death the wait counts. All of these hold:
//
//   - the pod is Failed and holds devices (conditions.HoldsDevices: extended resources,
//     the kubelet's allocatedResourcesStatus, DRA claims);
//   - a container (or an init container) terminated with a non-zero exit code or a
//     signal, with a finishedAt to count from;
//   - the pod has neither DisruptionTarget=True (the agent's DeviceFailure stamp, or any
//     other disruption, which decides already) nor a coroner.dev/DeviceFailed condition of
//     any status (True: a device failed; False, reason NoDeviceFailure: none did; either
//     is the verdict);
//   - the verdict can change what pfp does with the pod (DeviceVerdictMatters).
//
// It does not look at the clock: a pod judged past the wait that still awaits is one
// judged without the verdict.
func AwaitsDeviceVerdict(pfp *batchv1.PodFailurePolicy, pod *corev1.Pod) (DeviceDeath, bool) {
	if pod == nil || pod.Status.Phase != corev1.PodFailed {
		return DeviceDeath{}, false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == conditions.DeviceFailed || (c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue) {
			return DeviceDeath{}, false
		}
	}
	d, ok := DeviceDeathOf(pod)
	if !ok || !conditions.HoldsDevices(pod) || !DeviceVerdictMatters(pfp, pod) {
		return DeviceDeath{}, false
	}
	return d, true
}

// AwaitingDeviceVerdict says how much longer a failed pod of job waits for coroner-agent's
// device verdict (AwaitsDeviceVerdict), counted from its death's finishedAt, or 0 when it
// need not wait or the wait is over. wait 0 turns the wait off.
func AwaitingDeviceVerdict(job *batchv1.Job, pod *corev1.Pod, now time.Time, wait time.Duration) time.Duration {
	if wait <= 0 {
		return 0
	}
	d, ok := AwaitsDeviceVerdict(job.Spec.PodFailurePolicy, pod)
	if !ok {
		return 0
	}
	return max(0, d.FinishedAt.Add(wait).Sub(now))
}

// DeviceVerdictMatters reports whether coroner-agent's device verdict can change what pfp
// does with the failed pod: the action of the rule that matches the pod without a verdict
// differs from the one that matches it stamped with either verdict (DisruptionTarget=True
// reason DeviceFailure and coroner.dev/DeviceFailed=True, or coroner.dev/DeviceFailed=False
// reason NoDeviceFailure). A pod that has a verdict is judged without it first. No match
// and Count are the same outcome (counted). So a policy without a rule on those
// conditions never waits, nor does one whose earlier rule (on exit codes, say) decides the
// pod whatever its conditions.
func DeviceVerdictMatters(pfp *batchv1.PodFailurePolicy, pod *corev1.Pod) bool {
	if pfp == nil || pod == nil || !readsConditions(pfp) {
		return false
	}
	bare := withConditions(pod)
	bare.Status.Conditions = slices.DeleteFunc(bare.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == conditions.DeviceFailed || (c.Type == corev1.DisruptionTarget && c.Reason == conditions.ReasonDeviceFailure)
	})
	without := outcome(Match(pfp, bare))
	failed := withConditions(bare,
		corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure},
		corev1.PodCondition{Type: conditions.DeviceFailed, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure})
	healthy := withConditions(bare,
		corev1.PodCondition{Type: conditions.DeviceFailed, Status: corev1.ConditionFalse, Reason: conditions.ReasonNoDeviceFailure})
	return outcome(Match(pfp, failed)) != without || outcome(Match(pfp, healthy)) != without
}

// DeviceDeathOf is the failing container exit (a non-zero code or a signal) of pod that
// finished last, which coroner-agent's device verdict is about; false when none has a
// finishedAt. A pod the kubelet refused at admission because it could not allocate its
// device (conditions.AdmissionDeviceFailure) ran no container: its death is its Failed
// transition (the latest transition of its conditions), with no container named.
func DeviceDeathOf(pod *corev1.Pod) (DeviceDeath, bool) {
	if _, refused := conditions.AdmissionDeviceFailure(pod); refused {
		var at time.Time
		for _, c := range pod.Status.Conditions {
			if c.LastTransitionTime.After(at) {
				at = c.LastTransitionTime.Time
			}
		}
		return DeviceDeath{FinishedAt: at}, !at.IsZero()
	}
	return lastFailingExit(pod)
}

// outcome is what a result does to the Job: its action, Count when no rule matched.
func outcome(r Result) batchv1.PodFailurePolicyAction {
	if !r.Matched() {
		return batchv1.PodFailurePolicyActionCount
	}
	return r.Action
}

// withConditions is a copy of pod with the conditions set (replacing those of their types,
// appended otherwise), as the agent's stamp would leave it.
func withConditions(pod *corev1.Pod, set ...corev1.PodCondition) *corev1.Pod {
	c := &corev1.Pod{ObjectMeta: pod.ObjectMeta, Spec: pod.Spec, Status: pod.Status}
	c.Status.Conditions = append([]corev1.PodCondition(nil), pod.Status.Conditions...)
	for _, s := range set {
		replaced := false
		for i := range c.Status.Conditions {
			if c.Status.Conditions[i].Type == s.Type {
				c.Status.Conditions[i], replaced = s, true
			}
		}
		if !replaced {
			c.Status.Conditions = append(c.Status.Conditions, s)
		}
	}
	return c
}

// lastFailingExit is the container (init containers too) that terminated with a non-zero
// exit code or a signal and finished last; false when none did with a finishedAt.
func lastFailingExit(pod *corev1.Pod) (DeviceDeath, bool) {
	var d DeviceDeath
	for _, list := range []struct {
		init     bool
		statuses []corev1.ContainerStatus
	}{{true, pod.Status.InitContainerStatuses}, {false, pod.Status.ContainerStatuses}} {
		for _, s := range list.statuses {
			t := s.State.Terminated
			if t == nil || (t.ExitCode == 0 && t.Signal == 0) || t.FinishedAt.IsZero() {
				continue
			}
			if t.FinishedAt.After(d.FinishedAt) {
				d = DeviceDeath{Container: s.Name, Init: list.init, FinishedAt: t.FinishedAt.Time}
			}
		}
	}
	return d, !d.FinishedAt.IsZero()
}
