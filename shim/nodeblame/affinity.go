package nodeblame

import (
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

// AvoidWeight is the weight of the preferred term that keeps a pod off the nodes it
// avoids: the most a term may have, so that it outweighs the scheduler's spreading and
// the template's own preferences of lower weight.
const AvoidWeight = 100

// nodeNameField is the only field a node selector's matchFields may name. A node's name
// is what the pod's spec.nodeName said; its kubernetes.io/hostname label need not be the
// same (cloud providers name nodes after instances), so the avoidance selects on the name.
const nodeNameField = "metadata.name"

// Avoid gives pod (a new pod, not yet created) node affinity away from nodes:
//
//   - AvoidRequired: a matchFields "metadata.name NotIn nodes" requirement in every term
//     of its required node affinity (the terms are ORed, so each must exclude them), or
//     a term of its own when the pod has none. The template's terms and Kueue's
//     (which are the pod's by the time the shim sees its template) are kept as they are,
//     only narrowed.
//   - AvoidPreferred: a preferred term of weight AvoidWeight for the nodes not in nodes.
//   - AvoidNone, or no nodes: nothing.
//
// The pod's nodeSelector and its other affinities are not touched.
func Avoid(pod *corev1.Pod, nodes []string, mode v1alpha1.Avoidance) {
	if len(nodes) == 0 || (mode != v1alpha1.AvoidRequired && mode != v1alpha1.AvoidPreferred) {
		return
	}
	req := corev1.NodeSelectorRequirement{Key: nodeNameField, Operator: corev1.NodeSelectorOpNotIn, Values: slices.Clone(nodes)}
	if pod.Spec.Affinity == nil {
		pod.Spec.Affinity = &corev1.Affinity{}
	}
	if pod.Spec.Affinity.NodeAffinity == nil {
		pod.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Spec.Affinity.NodeAffinity
	if mode == v1alpha1.AvoidPreferred {
		na.PreferredDuringSchedulingIgnoredDuringExecution = append(na.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.PreferredSchedulingTerm{Weight: AvoidWeight, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{req}}})
		return
	}
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchFields = append(terms[i].MatchFields, req)
	}
}
