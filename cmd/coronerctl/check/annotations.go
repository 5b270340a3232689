package check

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

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
