package check

import (
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/coroner-dev/coroner/conditions"
)

// LongRunning is how long a Job may run (its activeDeadlineSeconds; no deadline counts as
// longer) before coronerctl hints that disruptions should be ignored: over half an hour,
// a drain, a preemption or a node OOM kill becomes likely.
const LongRunning = 30 * time.Minute

// sigkill is the exit code of a container killed by SIGKILL (128+9).
const sigkill = 137

// lint returns coroner's own findings about a defaulted Job spec: Jobs the API server
// accepts but that will not behave as their author probably expects with coroner.
// managedBy is the value that hands a Job to coroner-shim. The opt-in annotations, which
// are not in the spec, are lintOptIn's.
func lint(spec *batchv1.JobSpec, path *field.Path, managedBy string) []Finding {
	var out []Finding
	add := func(sev Severity, p *field.Path, format string, args ...any) {
		out = append(out, Finding{Severity: sev, Field: p.String(), Message: fmt.Sprintf(format, args...), Lint: true})
	}

	switch {
	case spec.ManagedBy == nil:
		add(Warning, path.Child("managedBy"), "not set: the built-in Job controller runs this Job, not coroner-shim; set it to %s at creation (it is immutable)", managedBy)
	case *spec.ManagedBy != managedBy:
		add(Warning, path.Child("managedBy"), "is %q: coroner-shim runs only Jobs whose managedBy is %s", *spec.ManagedBy, managedBy)
	}

	pfp := spec.PodFailurePolicy
	rulesPath := path.Child("podFailurePolicy", "rules")
	if pfp != nil {
		for i, rule := range pfp.Rules {
			req := rule.OnExitCodes
			if req == nil {
				continue
			}
			if spec.Template.Spec.RestartPolicy == corev1.RestartPolicyOnFailure {
				add(Error, rulesPath.Index(i).Child("onExitCodes"),
					"never matches with restartPolicy OnFailure: the kubelet restarts the container in place, the pod does not fail; use restartPolicy Never (coroner records in-place restarts in the %s annotation)",
					conditions.AnnotationExitHistory)
			}
			if req.Operator != batchv1.PodFailurePolicyOnExitCodesOpIn {
				continue
			}
			for j, v := range req.Values {
				if v == sigkill {
					add(Warning, rulesPath.Index(i).Child("onExitCodes", "values").Index(j),
						"137 is any SIGKILL (the OOM killer, but also preemption, eviction, a failed liveness probe, a deletion past its grace period): match the pod condition %s (an OOM kill over the pod's own limit, stamped by coroner-agent) instead",
						conditions.OOMKilled)
				}
			}
		}
	}

	if pfp != nil {
		for i, rule := range pfp.Rules {
			for j, pat := range rule.OnPodConditions {
				if sev, msg, ok := conditionTypeFinding(pat.Type); ok {
					add(sev, rulesPath.Index(i).Child("onPodConditions").Index(j).Child("type"), "%s", msg)
				}
			}
		}
		out = append(out, neverFires(spec, rulesPath)...)
	}

	longRunning := spec.ActiveDeadlineSeconds == nil || time.Duration(*spec.ActiveDeadlineSeconds)*time.Second > LongRunning
	if longRunning && spec.Template.Spec.RestartPolicy == corev1.RestartPolicyNever && !ignoresDisruptions(pfp) {
		p := path.Child("podFailurePolicy")
		if pfp != nil {
			p = rulesPath
		}
		deadline := "no activeDeadlineSeconds"
		if spec.ActiveDeadlineSeconds != nil {
			deadline = fmt.Sprintf("activeDeadlineSeconds %d", *spec.ActiveDeadlineSeconds)
		}
		add(Hint, p, "no Ignore rule on the %s condition for a long-running Job (%s): preemptions, evictions, drains and node OOM kills will count as failures of the Job",
			corev1.DisruptionTarget, deadline)
	}
	return append(out, lintDevices(spec, path)...)
}

// ignoresDisruptions reports whether a rule with action Ignore matches DisruptionTarget=True.
func ignoresDisruptions(pfp *batchv1.PodFailurePolicy) bool {
	if pfp == nil {
		return false
	}
	for _, rule := range pfp.Rules {
		if rule.Action != batchv1.PodFailurePolicyActionIgnore {
			continue
		}
		for _, c := range rule.OnPodConditions {
			if c.Type == corev1.DisruptionTarget && (c.Status == "" || c.Status == corev1.ConditionTrue) {
				return true
			}
		}
	}
	return false
}
