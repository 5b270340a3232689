package check

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// lintOptIn checks the annotations that opt pods in to zombie recovery
// (conditions.SafeToForcefullyDeleteAnnotations). The shim and the agent read them on the
// pod, and only the exact value "true" opts in (conditions.OptedInToForcefulDeletion): on
// an object that is not the pod template (the Job, a CronJob, its jobTemplate) an
// annotation is a warning saying where it must go; on the pod template a value other than
// "true" is a warning naming it. "false" is left alone: it says what it does.
//
// elsewhere are the objects' annotations that are not the pod's, each with its
// metadata path; pod is the pod template's, with its path.
func lintOptIn(elsewhere []annotationsAt, pod annotationsAt) []Finding {
	var out []Finding
	for _, at := range elsewhere {
		for _, k := range conditions.SafeToForcefullyDeleteAnnotations {
			v, ok := at.annotations[k]
			if !ok {
				continue
			}
			value := ""
			if v != "true" {
				value = fmt.Sprintf(`, with the value "true" (not %q)`, v)
			}
			out = append(out, Finding{Severity: Warning, Lint: true, Field: at.path.Key(k).String(),
				Message: fmt.Sprintf("has no effect here: coroner-shim and coroner-agent read it on the pod; put it in %s%s",
					pod.path.String(), value)})
		}
	}
	for _, k := range conditions.SafeToForcefullyDeleteAnnotations {
		v, ok := pod.annotations[k]
		if !ok || v == "true" || v == "false" {
			continue
		}
		out = append(out, Finding{Severity: Warning, Lint: true, Field: pod.path.Key(k).String(),
			Message: fmt.Sprintf(`is %q: only the exact value "true" opts the pod in to zombie recovery`, v)})
	}
	return out
}

// annotationsAt are an object's annotations and the path of its metadata.annotations.
type annotationsAt struct {
	annotations map[string]string
	path        *field.Path
}

// lintMemoryRetry checks coroner.dev/oom-memory-retry (package api/v1alpha1) on a Job (at
// its metadata path): a value that does not parse is an error (the shim ignores it and
// says so once); a max below a memory limit of the template is an error (no pod could
// ever grow); on a Job not handed to coroner-shim it has no effect, a warning; a template
// without a memory limit to grow is a warning too.
func lintMemoryRetry(at annotationsAt, spec *batchv1.JobSpec, managedBy string) []Finding {
	v, ok := at.annotations[v1alpha1.AnnotationOOMMemoryRetry]
	if !ok {
		return nil
	}
	path := at.path.Key(v1alpha1.AnnotationOOMMemoryRetry).String()
	s, err := v1alpha1.ParseMemoryRetry(v)
	if err != nil {
		return []Finding{{Severity: Error, Field: path, Message: err.Error()}}
	}
	var out []Finding
	if spec.ManagedBy == nil || *spec.ManagedBy != managedBy {
		out = append(out, Finding{Severity: Warning, Lint: true, Field: path,
			Message: "has no effect: only coroner-shim grows memory, and spec.managedBy does not hand this Job to it (" + managedBy + ")"})
	}
	limited := false
	tmpl := &spec.Template.Spec
	for _, c := range tmpl.Containers {
		if q, has := c.Resources.Limits[corev1.ResourceMemory]; has {
			limited = true
			if s.Max.Cmp(q) < 0 {
				out = append(out, Finding{Severity: Error, Field: path,
					Message: fmt.Sprintf("max %s is below container %s's memory limit of %s: no retry could grow it", s.Max.String(), c.Name, q.String())})
			}
		}
	}
	if tmpl.Resources != nil {
		if _, has := tmpl.Resources.Limits[corev1.ResourceMemory]; has {
			limited = true
		}
	}
	if !limited {
		out = append(out, Finding{Severity: Warning, Lint: true, Field: path,
			Message: "no container of the template (nor the pod) has a memory limit: there is no limit to grow"})
	}
	if tmpl.RestartPolicy == corev1.RestartPolicyOnFailure {
		out = append(out, Finding{Severity: Warning, Lint: true, Field: path,
			Message: "has no effect with restartPolicy OnFailure: the kubelet restarts the killed container in place, no new pod is made, and coroner-shim does not resize running pods; use restartPolicy Never"})
	}
	return out
}
