package conditions

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestQuarantineTaintPatch(t *testing.T) {
	other := corev1.Taint{Key: "example.com/gpu", Value: "a100", Effect: corev1.TaintEffectNoSchedule}
	old := corev1.Taint{Key: QuarantineTaintKey, Value: "device", Effect: corev1.TaintEffectNoSchedule}
	newer := corev1.Taint{Key: QuarantineTaintKey, Value: "node-oom", Effect: corev1.TaintEffectNoSchedule}
	node := func(taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "42"}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	for _, tc := range []struct {
		name  string
		node  *corev1.Node
		taint *corev1.Taint
		want  string
	}{
		{"add to a node without taints", node(), &newer,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/spec/taints","value":[{"key":"coroner.dev/quarantined","value":"node-oom","effect":"NoSchedule"}]}]`},
		{"add beside another taint", node(other), &newer,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/spec/taints","value":[{"key":"example.com/gpu","value":"a100","effect":"NoSchedule"},{"key":"coroner.dev/quarantined","value":"node-oom","effect":"NoSchedule"}]}]`},
		{"change", node(old, other), &newer,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/spec/taints","value":[{"key":"example.com/gpu","value":"a100","effect":"NoSchedule"},{"key":"coroner.dev/quarantined","value":"node-oom","effect":"NoSchedule"}]}]`},
		{"remove, others kept", node(other, old), nil,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/spec/taints","value":[{"key":"example.com/gpu","value":"a100","effect":"NoSchedule"}]}]`},
		{"remove the last", node(old), nil,
			`[{"op":"test","path":"/metadata/resourceVersion","value":"42"},{"op":"add","path":"/spec/taints","value":[]}]`},
	} {
		got, err := QuarantineTaintPatch(tc.node, tc.taint)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: QuarantineTaintPatch = %s, %v\nwant %s", tc.name, got, err, tc.want)
		}
	}
}
