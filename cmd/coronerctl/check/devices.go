package check

import (
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/coroner-dev/coroner/conditions"
)

// lintDevices hints when a Job's pods ask for devices (extended resources such as
// nvidia.com/gpu, or DRA resource claims) but no rule of its podFailurePolicy would spare
// a pod that a failing device killed: coroner-agent stamps such a pod
// DisruptionTarget=True and coroner.dev/DeviceFailed=True (reason DeviceFailure), and only
// a rule with action Ignore on one of them keeps the failure from counting (Count,
// FailIndex and FailJob all count it, and a rule that matches only with another status
// does not match the stamp). restartPolicy OnFailure has no podFailurePolicy: the
// kubelet restarts the container in place.
func lintDevices(spec *batchv1.JobSpec, path *field.Path) []Finding {
	if spec.Template.Spec.RestartPolicy != corev1.RestartPolicyNever || sparesDeviceFailures(spec.PodFailurePolicy) {
		return nil
	}
	devices := templateDevices(&spec.Template.Spec)
	if len(devices) == 0 {
		return nil
	}
	p := path.Child("podFailurePolicy")
	if spec.PodFailurePolicy != nil {
		p = p.Child("rules")
	}
	msg := "the pods ask for devices (" + strings.Join(devices, ", ") + ") but no rule with action Ignore matches " +
		string(corev1.DisruptionTarget) + " or " + string(conditions.DeviceFailed) +
		": a pod killed by a failing device (coroner-agent's DeviceFailure stamp) counts as a failure of the Job; add " +
		"{action: Ignore, onPodConditions: [{type: " + string(conditions.DeviceFailed) + "}]} to retry device failures without counting them (or on " +
		string(corev1.DisruptionTarget) + " for every disruption)"
	return []Finding{{Severity: Hint, Field: p.String(), Message: msg, Lint: true}}
}

// sparesDeviceFailures reports whether a rule with action Ignore matches DisruptionTarget
// or coroner.dev/DeviceFailed with status True (or no status, which the API server
// defaults to True).
func sparesDeviceFailures(pfp *batchv1.PodFailurePolicy) bool {
	if pfp == nil {
		return false
	}
	for _, rule := range pfp.Rules {
		if rule.Action != batchv1.PodFailurePolicyActionIgnore {
			continue
		}
		for _, c := range rule.OnPodConditions {
			if (c.Type == corev1.DisruptionTarget || c.Type == conditions.DeviceFailed) && (c.Status == "" || c.Status == corev1.ConditionTrue) {
				return true
			}
		}
	}
	return false
}

// templateDevices are the devices a pod template asks for: the extended resources its
// containers and init containers request or limit (conditions.IsDeviceResource), and
// "claim:NAME" for its resource claims; sorted, without repeats.
func templateDevices(spec *corev1.PodSpec) []string {
	var out []string
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			for _, rl := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
				for name := range rl {
					if conditions.IsDeviceResource(name) && !slices.Contains(out, string(name)) {
						out = append(out, string(name))
					}
				}
			}
		}
	}
	for _, c := range spec.ResourceClaims {
		if s := "claim:" + c.Name; !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}
