package chaos

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// fakePod is a running pod bound to node, with a UID from its name, changed by the mods.
func fakePod(namespace, name, node string, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "busybox"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

// withCPU gives the pod's first container a cpu request.
func withCPU(cpu string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	}
}

// withPriority sets the pod's resolved priority.
func withPriority(prio int32) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Priority = &prio }
}

// withPhase sets the pod's phase.
func withPhase(phase corev1.PodPhase) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Phase = phase }
}

func TestPodFate(t *testing.T) {
	cases := []struct {
		name string
		cur  *corev1.Pod
		want string
	}{
		{"gone", nil, "gone"},
		{"running", fakePod("default", "a", "n"), ""},
		{"pending", fakePod("default", "a", "n", withPhase(corev1.PodPending)), ""},
		{"failed", fakePod("default", "a", "n", withPhase(corev1.PodFailed)), "terminated, phase Failed"},
		{"succeeded", fakePod("default", "a", "n", withPhase(corev1.PodSucceeded)), "terminated, phase Succeeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := podFate(tc.cur); got != tc.want {
				t.Errorf("podFate = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNodePodsFiltersByNode(t *testing.T) {
	// The fake clientset ignores field selectors: nodePods must still keep only the node's.
	cs := fake.NewClientset(
		fakePod("default", "here", "lab-node-2"),
		fakePod("other", "here-too", "lab-node-2"),
		fakePod("default", "there", "lab-node-3"),
		fakePod("default", "pending", ""),
	)
	pods, err := nodePods(context.Background(), cs, "lab-node-2")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for i := range pods {
		got[podNsName(&pods[i])] = true
	}
	if len(got) != 2 || !got["default/here"] || !got["other/here-too"] {
		t.Errorf("nodePods = %v, want default/here and other/here-too", got)
	}
}
