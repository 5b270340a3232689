package explain

// The device story of a pod (issue 37): which device failed, which signal said so, when it
// turned, from coroner-agent's verdict (conditions.DeviceVerdictOf: the conditions' fields
// first, the message read loosely and always shown whole); the devices the kubelet reports
// for the pod's containers; and, for a failed pod still without a verdict, whether
// coroner-shim waits for one.

import (
	"fmt"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/policy"
)

// now is explain's clock, for the device verdict's wait; tests set it.
var now = time.Now

// deviceDetails are the lines of p's device verdict and of its devices' health:
//
//	device:   coroner.dev/test-gpu gpu-0 failed: Unhealthy since 2026-12-07T19:40:01Z (the kubelet's device health)
//	verdict:  coroner.dev/DeviceFailed=True (DeviceFailure) at 2026-12-07T19:40:03Z: container main died: ...
//	devices:  container main: coroner.dev/test-gpu gpu-0 Unhealthy
func deviceDetails(p *corev1.Pod) []Line {
	var out []Line
	if v, ok := conditions.DeviceVerdictOf(p); ok {
		stamped := conditionText(&v.Condition)
		if t := v.Condition.LastTransitionTime; !t.IsZero() {
			stamped = strings.Replace(stamped, ": ", " at "+stamp(t.Time)+": ", 1)
			if v.Condition.Message == "" {
				stamped += " at " + stamp(t.Time)
			}
		}
		if v.Failed {
			out = append(out, Line{"device", failedDevice(v, p)})
		} else {
			out = append(out, Line{"device", "checked by coroner-agent: no device explains the death (every device the pod held stayed healthy, and no driver fault was logged for them)"})
		}
		out = append(out, Line{"verdict", stamped})
	}
	if held := deviceHealth(p); held != "" {
		out = append(out, Line{"devices", held})
	}
	return out
}

// failedDevice says which device failed and how coroner-agent knew: "coroner.dev/test-gpu
// gpu-0 failed: Unhealthy since T (the kubelet's device health)", "nvidia.com/gpu GPU-x
// failed: hardware fault code 79 at T (its driver's word: the kernel log): GPU has fallen
// off the bus".
func failedDevice(v conditions.DeviceVerdict, p *corev1.Pod) string {
	if !v.Parsed {
		what := "a device allocated to the pod failed"
		if r := v.FailedResource(p); r != "" {
			what = "a device of " + r + " failed"
		}
		return what + " (coroner-agent's words are in the verdict below)"
	}
	when := "a time coroner-agent does not know"
	if !v.At.IsZero() {
		when = stamp(v.At)
	}
	if v.Signal == conditions.DeviceSignalAdmission {
		s := fmt.Sprintf("%s could not be allocated: the kubelet refused the pod at admission (a device turned Unhealthy after the scheduler placed the pod); no container ran", v.Resource)
		if v.Detail != "" {
			s += ": " + v.Detail
		}
		return s
	}
	if v.Signal == conditions.DeviceSignalDriver {
		s := fmt.Sprintf("%s %s failed: hardware fault code %d at %s (its driver's word, in the kernel log)", v.Resource, v.ID, v.Code, when)
		if v.Detail != "" {
			s += ": " + v.Detail
		}
		return s
	}
	return fmt.Sprintf("%s %s failed: %s since %s (the kubelet's device health, from the device plugin or DRA driver)", v.Resource, v.ID, v.Health, when)
}

// deviceHealth is what the kubelet reports of the devices of p's containers
// (allocatedResourcesStatus): "container main: coroner.dev/test-gpu gpu-0 Unhealthy, gpu-1
// Healthy"; "" when it reports none.
func deviceHealth(p *corev1.Pod) string {
	var parts []string
	for _, cs := range allStatuses(p) {
		var res []string
		for _, r := range cs.status.AllocatedResourcesStatus {
			var ids []string
			for _, h := range r.Resources {
				health := string(h.Health)
				if health == "" {
					health = "health not reported"
				}
				ids = append(ids, string(h.ResourceID)+" "+health)
			}
			res = append(res, string(r.Name)+" "+strings.Join(ids, ", "))
		}
		if len(res) > 0 {
			parts = append(parts, fmt.Sprintf("%s %s: %s", cs.kind, cs.status.Name, strings.Join(res, "; ")))
		}
	}
	return strings.Join(parts, "; ")
}

// awaitingDevice says, for a failed pod of job without a device verdict that coroner-shim
// would wait for (policy.AwaitsDeviceVerdict), whether it still waits (up to
// policy.DefaultDeviceVerdictWait after the container's death: explain does not know the
// shim's --device-verdict-wait) or was decided without it. ok is false for every other
// pod, and for a Job coroner-shim does not run.
func awaitingDevice(job *batchv1.Job, p *corev1.Pod) (line Line, waiting bool, ok bool) {
	if job == nil || ptrValue(job.Spec.ManagedBy) != conditions.ManagedBy {
		return Line{}, false, false
	}
	d, awaits := policy.AwaitsDeviceVerdict(job.Spec.PodFailurePolicy, p)
	if !awaits {
		return Line{}, false, false
	}
	container := "container " + d.Container
	if d.Init {
		container = "init " + container
	}
	wait := policy.DefaultDeviceVerdictWait
	if now().Before(d.FinishedAt.Add(wait)) {
		return Line{"device", fmt.Sprintf("waiting for coroner-agent's device verdict (up to %s after %s's exit), until %s at the latest: not counted, not replaced meanwhile",
			wait, container, stamp(d.FinishedAt.Add(wait)))}, true, true
	}
	return Line{"device", fmt.Sprintf("no device verdict from coroner-agent: decided without it once the wait was over (%s after %s's exit at %s, coroner-shim's default --device-verdict-wait); is coroner-agent running on node %s?",
		wait, container, stamp(d.FinishedAt), p.Spec.NodeName)}, false, true
}

// goneDevice is the device line of a recorded pod that a device killed, from its recorded
// cause (the DisruptionTarget DeviceFailure's message).
func goneDevice(c *conditions.Cause) (Line, bool) {
	if c == nil || c.Class != conditions.CauseDevice {
		return Line{}, false
	}
	p := &corev1.Pod{Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: c.Condition, Status: corev1.ConditionTrue, Reason: c.Reason, Message: c.Message}}}}
	v, ok := conditions.DeviceVerdictOf(p)
	if !ok {
		return Line{}, false
	}
	return Line{"device", failedDevice(v, p)}, true
}
