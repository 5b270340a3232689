package main

import (
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/conditions"
)

// nodeTry is a write to a Node the security scenario tries with the shim's token: a patch
// (Body of PatchType), or the Node's deletion (Delete). Allowed says whether it must pass:
// the shim may add, change and remove the taint coroner.dev/quarantined with effect
// NoSchedule, and nothing else (RBAC and the admission policy coroner-shim-node-quarantine).
type nodeTry struct {
	What      string
	Allowed   bool
	PatchType types.PatchType
	Body      []byte
	Delete    bool
}

// nodeTries are the tries against n (as read now): each patch is built the way the
// shim's own is (conditions.QuarantineTaintPatch: a JSON patch guarded by n's
// resourceVersion), so that only what it changes can be why it is refused.
func nodeTries(n *corev1.Node, now time.Time) ([]nodeTry, error) {
	quarantined := corev1.Taint{Key: conditions.QuarantineTaintKey, Value: string(conditions.DisruptionNodeOOM), Effect: corev1.TaintEffectNoSchedule, TimeAdded: &metav1.Time{Time: now.Truncate(time.Second)}}
	allowed, err := conditions.QuarantineTaintPatch(n, &quarantined)
	if err != nil {
		return nil, err
	}
	// Another taint: the shim's patch with one more taint in the list.
	other := n.DeepCopy()
	other.Spec.Taints = append(other.Spec.Taints, corev1.Taint{Key: "chaos.coroner.dev/other", Effect: corev1.TaintEffectNoSchedule})
	otherTaint, err := conditions.QuarantineTaintPatch(other, nil)
	if err != nil {
		return nil, err
	}
	evicting := quarantined
	evicting.Effect = corev1.TaintEffectNoExecute
	noExecute, err := conditions.QuarantineTaintPatch(n, &evicting)
	if err != nil {
		return nil, err
	}
	guarded := func(ops ...map[string]any) ([]byte, error) {
		return json.Marshal(append([]map[string]any{{"op": "test", "path": "/metadata/resourceVersion", "value": n.ResourceVersion}}, ops...))
	}
	cordon, err := guarded(map[string]any{"op": "add", "path": "/spec/unschedulable", "value": true})
	if err != nil {
		return nil, err
	}
	label, err := guarded(map[string]any{"op": "add", "path": "/metadata/labels/chaos.coroner.dev~1x", "value": "y"})
	if err != nil {
		return nil, err
	}
	return []nodeTry{
		{What: "taint the node " + conditions.QuarantineTaintKey + "=node-oom:NoSchedule (control)", Allowed: true, PatchType: types.JSONPatchType, Body: allowed},
		{What: "cordon the node (spec.unschedulable)", PatchType: types.JSONPatchType, Body: cordon},
		{What: "add another taint to the node", PatchType: types.JSONPatchType, Body: otherTaint},
		{What: "taint the node " + conditions.QuarantineTaintKey + " with effect NoExecute (evicts)", PatchType: types.JSONPatchType, Body: noExecute},
		{What: "label the node", PatchType: types.JSONPatchType, Body: label},
		{What: "delete the node", Delete: true},
	}, nil
}
