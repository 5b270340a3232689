package check

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

// nodeBlameAnnotations are the Job annotations of node blame (issue 38), read by
// coroner-shim on the Job only.
var nodeBlameAnnotations = []string{v1alpha1.AnnotationAvoidFailedNodes, v1alpha1.AnnotationDisruptionBudget}

// lintNodeBlame checks coroner.dev/avoid-failed-nodes and coroner.dev/disruption-budget
// on a Job (at its metadata path, with its defaulted spec):
//
//   - a value that does not parse is an error, one per bad part of a budget (the shim
//     ignores the annotation: no avoidance beyond its --avoid-failed-nodes default, no
//     budget, Ignore unbounded);
//   - on a Job not handed to coroner-shim either has no effect, a warning (a Job without
//     spec.managedBy may still be handed over at creation by the namespace opt-in, which
//     an offline check cannot see: the message says so);
//   - a budget with no Ignore rule to bound never applies, a hint;
//   - avoid-failed-nodes: required on a template pinned to one node (nodeName, a
//     kubernetes.io/hostname nodeSelector, or required node affinity naming one node by
//     metadata.name or kubernetes.io/hostname) is a warning: once that node kills a pod,
//     the replacement can be scheduled nowhere; pinned to a few nodes (at most
//     MaxAvoidedNodes) it is a hint.
func lintNodeBlame(at annotationsAt, spec *batchv1.JobSpec, managedBy string) []Finding {
	var out []Finding
	handed := spec.ManagedBy != nil && *spec.ManagedBy == managedBy
	for _, k := range nodeBlameAnnotations {
		if _, ok := at.annotations[k]; ok && !handed {
			out = append(out, Finding{Severity: Warning, Lint: true, Field: at.path.Key(k).String(), Message: notHanded(spec, managedBy)})
		}
	}

	if v, ok := at.annotations[v1alpha1.AnnotationAvoidFailedNodes]; ok {
		path := at.path.Key(v1alpha1.AnnotationAvoidFailedNodes).String()
		a, err := v1alpha1.ParseAvoidance(v)
		switch {
		case err != nil:
			out = append(out, Finding{Severity: Error, Field: path, Message: err.Error() + "; coroner-shim ignores it and applies its --avoid-failed-nodes default"})
		case a == v1alpha1.AvoidRequired:
			if nodes, where := pinnedNodes(&spec.Template.Spec); len(nodes) == 1 {
				out = append(out, Finding{Severity: Warning, Lint: true, Field: path, Message: fmt.Sprintf(
					"is required but the template pins its pods to node %s (%s): once that node kills a pod, the replacement avoids the only node it may run on and stays Pending, unschedulable; use preferred, or unpin the template",
					nodes[0], where)})
			} else if len(nodes) > 1 && len(nodes) <= v1alpha1.MaxAvoidedNodes {
				out = append(out, Finding{Severity: Hint, Lint: true, Field: path, Message: fmt.Sprintf(
					"is required and the template allows only nodes %s (%s): once each of them has killed a pod of an index, its replacement can be scheduled nowhere",
					strings.Join(nodes, ", "), where)})
			}
		}
	}

	if v, ok := at.annotations[v1alpha1.AnnotationDisruptionBudget]; ok {
		path := at.path.Key(v1alpha1.AnnotationDisruptionBudget).String()
		if _, err := v1alpha1.ParseDisruptionBudget(v); err != nil {
			for _, e := range budgetErrors(v, err) {
				out = append(out, Finding{Severity: Error, Field: path, Message: e})
			}
		} else if !hasIgnoreRule(spec.PodFailurePolicy) {
			out = append(out, Finding{Severity: Hint, Lint: true, Field: path, Message: "the budget never applies: it bounds the failures that an Ignore rule of the podFailurePolicy ignores, and " + noIgnore(spec)})
		}
	}
	return out
}

// notHanded says why a node-blame annotation on a Job coroner-shim does not run has no
// effect.
func notHanded(spec *batchv1.JobSpec, managedBy string) string {
	if spec.ManagedBy == nil {
		return "has no effect unless coroner-shim runs the Job: spec.managedBy is not set, so the built-in Job controller runs it " +
			"(unless the namespace is opted in, labelled coroner.dev/jobs=managed, which sets spec.managedBy to " + managedBy + " at creation); set spec.managedBy: " + managedBy
	}
	return fmt.Sprintf("has no effect: only coroner-shim avoids nodes and keeps disruption budgets, and spec.managedBy %q does not hand this Job to it (%s)", *spec.ManagedBy, managedBy)
}

// budgetErrors are the messages of ParseDisruptionBudget's error on v: one per bad part,
// each after the value and naming its part, or the error whole when it is about the
// whole value (an empty one).
func budgetErrors(v string, err error) []string {
	var joined interface{ Unwrap() []error }
	if inner := errors.Unwrap(err); inner != nil && errors.As(inner, &joined) {
		var out []string
		for _, e := range joined.Unwrap() {
			out = append(out, fmt.Sprintf("%q: %s", v, e))
		}
		return out
	}
	return []string{err.Error()}
}

// hasIgnoreRule reports whether a rule of pfp has action Ignore.
func hasIgnoreRule(pfp *batchv1.PodFailurePolicy) bool {
	return pfp != nil && slices.ContainsFunc(pfp.Rules, func(r batchv1.PodFailurePolicyRule) bool {
		return r.Action == batchv1.PodFailurePolicyActionIgnore
	})
}

func noIgnore(spec *batchv1.JobSpec) string {
	switch {
	case spec.Template.Spec.RestartPolicy == corev1.RestartPolicyOnFailure:
		return "with restartPolicy OnFailure there is no podFailurePolicy"
	case spec.PodFailurePolicy == nil:
		return "this Job has no podFailurePolicy"
	}
	return "no rule of this Job's has action Ignore"
}

// pinnedNodes are the only nodes the template's pods may run on, when its spec names
// them: nodeName, a kubernetes.io/hostname nodeSelector, or a required node affinity
// every term of which allows a finite set of nodes (matchFields metadata.name In, or
// kubernetes.io/hostname In); where says which field pinned them. nil when the pods may
// run on nodes not named.
func pinnedNodes(spec *corev1.PodSpec) (nodes []string, where string) {
	if spec.NodeName != "" {
		return []string{spec.NodeName}, "spec.template.spec.nodeName"
	}
	if h, ok := spec.NodeSelector[corev1.LabelHostname]; ok {
		return []string{h}, "spec.template.spec.nodeSelector " + corev1.LabelHostname
	}
	a := spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil, ""
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return nil, ""
	}
	var all []string
	for _, t := range terms { // the terms are ORed: each must pin
		allowed, pinned := termNodes(t)
		if !pinned {
			return nil, ""
		}
		for _, n := range allowed {
			if !slices.Contains(all, n) {
				all = append(all, n)
			}
		}
	}
	slices.Sort(all)
	return all, "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
}

// termNodes are the nodes a node selector term allows when one of its requirements (they
// are ANDed) is In on the node's name or hostname: the intersection of those.
func termNodes(t corev1.NodeSelectorTerm) ([]string, bool) {
	var allowed []string
	pinned := false
	for _, reqs := range []struct {
		key  string
		list []corev1.NodeSelectorRequirement
	}{{"metadata.name", t.MatchFields}, {corev1.LabelHostname, t.MatchExpressions}} {
		for _, r := range reqs.list {
			if r.Key != reqs.key || r.Operator != corev1.NodeSelectorOpIn {
				continue
			}
			if !pinned {
				allowed, pinned = slices.Clone(r.Values), true
				continue
			}
			allowed = slices.DeleteFunc(allowed, func(n string) bool { return !slices.Contains(r.Values, n) })
		}
	}
	return allowed, pinned
}

// lintNodeBlamePlacement warns of a node-blame annotation on an object coroner-shim does
// not read it on (the pod template, a CronJob itself): it belongs on the Job (jobAt).
func lintNodeBlamePlacement(elsewhere []annotationsAt, jobAt annotationsAt) []Finding {
	var out []Finding
	for _, at := range elsewhere {
		for _, k := range nodeBlameAnnotations {
			if _, ok := at.annotations[k]; ok {
				out = append(out, Finding{Severity: Warning, Lint: true, Field: at.path.Key(k).String(),
					Message: "has no effect here: coroner-shim reads it on the Job; put it in " + jobAt.path.String()})
			}
		}
	}
	return out
}
