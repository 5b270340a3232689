package main

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func TestSetTaint(t *testing.T) {
	ctx := context.Background()
	other := corev1.Taint{Key: "example.com/other", Effect: corev1.TaintEffectNoExecute}
	cs := fake.NewClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "lab-node-4"},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{other}},
	})
	taints := func() []corev1.Taint {
		n, err := cs.CoreV1().Nodes().Get(ctx, "lab-node-4", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n.Spec.Taints
	}
	for _, step := range []struct {
		name string
		on   bool
		want []corev1.Taint
	}{
		{"added beside the node's own", true, []corev1.Taint{other, slowTaint}},
		{"added once", true, []corev1.Taint{other, slowTaint}},
		{"removed, the node's own kept", false, []corev1.Taint{other}},
		{"removing again is a no-op", false, []corev1.Taint{other}},
	} {
		if err := setTaint(ctx, cs, "lab-node-4", step.on); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		got := taints()
		if len(got) != len(step.want) {
			t.Fatalf("%s: taints %v, want %v", step.name, got, step.want)
		}
		for i := range got {
			if got[i].Key != step.want[i].Key || got[i].Effect != step.want[i].Effect {
				t.Errorf("%s: taints %v, want %v", step.name, got, step.want)
			}
		}
	}
	if err := setTaint(ctx, cs, "lab-node-9", false); err != nil {
		t.Errorf("removing the taint of a node that is gone: %v", err)
	}
	if err := setTaint(ctx, cs, "lab-node-9", true); err == nil {
		t.Errorf("tainting a node that does not exist: no error")
	}
}
