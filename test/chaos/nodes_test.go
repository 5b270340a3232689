package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// TestNodeTries applies each of the security scenario's node patches to a node, as the
// API server would, and checks that it changes exactly what it says: the control only the
// quarantine taint, each refused try one thing the shim may not do.
func TestNodeTries(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-node-2", ResourceVersion: "99", Labels: map[string]string{"kubernetes.io/hostname": "lab-node-2"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "lab.coroner.dev/gpu", Effect: corev1.TaintEffectPreferNoSchedule}}},
	}
	tries, err := nodeTries(n, now)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	quarantine := corev1.Taint{Key: conditions.QuarantineTaintKey, Value: "node-oom", Effect: corev1.TaintEffectNoSchedule, TimeAdded: &metav1.Time{Time: now}}
	want := map[string]func(m *corev1.Node){
		"taint the node coroner.dev/quarantined=node-oom:NoSchedule (control)": func(m *corev1.Node) { m.Spec.Taints = append(m.Spec.Taints, quarantine) },
		"cordon the node (spec.unschedulable)":                                 func(m *corev1.Node) { m.Spec.Unschedulable = true },
		"add another taint to the node": func(m *corev1.Node) {
			m.Spec.Taints = append(m.Spec.Taints, corev1.Taint{Key: "chaos.coroner.dev/other", Effect: corev1.TaintEffectNoSchedule})
		},
		"taint the node coroner.dev/quarantined with effect NoExecute (evicts)": func(m *corev1.Node) {
			q := quarantine
			q.Effect = corev1.TaintEffectNoExecute
			m.Spec.Taints = append(m.Spec.Taints, q)
		},
		"label the node": func(m *corev1.Node) { m.Labels["chaos.coroner.dev/x"] = "y" },
	}
	allowed := 0
	for _, tr := range tries {
		if tr.Allowed {
			allowed++
		}
		if tr.Delete {
			continue
		}
		mutate, ok := want[tr.What]
		if !ok {
			t.Errorf("unexpected try %q", tr.What)
			continue
		}
		p, err := jsonpatch.DecodePatch(tr.Body)
		if err != nil {
			t.Fatalf("%s: %v", tr.What, err)
		}
		out, err := p.Apply(doc)
		if err != nil {
			t.Fatalf("%s: applying %s: %v", tr.What, tr.Body, err)
		}
		var got corev1.Node
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		exp := n.DeepCopy()
		mutate(exp)
		if diff := cmp.Diff(exp, &got); diff != "" {
			t.Errorf("%s changes (-want +got):\n%s", tr.What, diff)
		}
		// Guarded by the resourceVersion: on a node changed since, the patch fails.
		stale := n.DeepCopy()
		stale.ResourceVersion = "100"
		staleDoc, _ := json.Marshal(stale)
		if _, err := p.Apply(staleDoc); err == nil {
			t.Errorf("%s applies to a node of another resourceVersion", tr.What)
		}
	}
	if allowed != 1 || len(tries) != 6 {
		t.Errorf("%d tries, %d allowed; want 6 and only the control", len(tries), allowed)
	}
}
