package conditions

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
)

// Quarantine of nodes that keep killing pods (coroner-shim --quarantine, shim/quarantine;
// docs/choices.md, "Quarantine: defaults and why").
const (
	// QuarantineTaintKey is the key of the taint coroner-shim puts on a node on which too
	// many pods of its Jobs died of causes that blame the node: the value is the
	// DisruptionClass of the deaths, the effect NoSchedule (running pods stay). It is the
	// only change to a Node the shim may make (deploy/base/admission-policy.yaml,
	// coroner-shim-node-quarantine).
	QuarantineTaintKey = Prefix + "quarantined"

	// Reasons of the Events on Nodes.

	// ReasonNodeQuarantined (Warning): the node was tainted; the message names the deaths.
	ReasonNodeQuarantined = "NodeQuarantined"
	// ReasonQuarantineSpared (Warning): the node had as many deaths as a quarantine takes,
	// but --quarantine-max nodes were quarantined already.
	ReasonQuarantineSpared = "QuarantineSpared"
	// ReasonNodeQuarantineLifted (Normal): the taint was removed after --quarantine-for
	// without a new death blamed on the node.
	ReasonNodeQuarantineLifted = "NodeQuarantineLifted"
)

// QuarantineTaintPatch is the JSON patch (RFC 6902) that sets node's
// coroner.dev/quarantined taint to taint, or removes it when taint is nil, and changes
// nothing else: it replaces spec.taints with node's own, less any taint of that key, plus
// taint, and first tests that the node's resourceVersion is still node's, so that a
// change made to the node's taints in between (another controller's, an operator's) is
// never overwritten; the API server then refuses the patch and the caller reads the
// node again.
func QuarantineTaintPatch(node *corev1.Node, taint *corev1.Taint) ([]byte, error) {
	taints := make([]corev1.Taint, 0, len(node.Spec.Taints)+1)
	for _, t := range node.Spec.Taints {
		if t.Key != QuarantineTaintKey {
			taints = append(taints, t)
		}
	}
	if taint != nil {
		taints = append(taints, *taint)
	}
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	return json.Marshal([]op{
		{Op: "test", Path: "/metadata/resourceVersion", Value: node.ResourceVersion},
		{Op: "add", Path: "/spec/taints", Value: taints},
	})
}
