package chaos

import (
	"bytes"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

// withInit adds an init container with the cpu request; sidecar makes it restartable.
func withInit(cpu string, sidecar bool) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		c := corev1.Container{Name: "init", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}
		if sidecar {
			c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	}
}

// withContainer adds a container with the cpu request.
func withContainer(cpu string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
			Name: "extra", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}},
		})
	}
}

func TestPreemptorCPU(t *testing.T) {
	const prio = 1000
	high := withPriority(prio)
	cases := []struct {
		name    string
		alloc   string
		pods    []*corev1.Pod
		want    string
		wantErr string
	}{
		{name: "empty node", alloc: "4", want: "4"},
		{name: "millicores", alloc: "3500m", want: "3500m"},
		{name: "a pod it cannot preempt", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("1"))}, want: "3"},
		{name: "same priority cannot be preempted", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", withPriority(prio), withCPU("1500m"))}, want: "2500m"},
		{name: "higher priority", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", withPriority(2000001000), withCPU("250m"))}, want: "3750m"},
		{name: "lower priority does not count", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", withPriority(prio-1), withCPU("1"))}, want: "4"},
		{name: "no priority is 0 and does not count", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", withCPU("1"))}, want: "4"},
		{name: "terminal pods do not count", alloc: "4", pods: []*corev1.Pod{
			fakePod("d", "a", "n", high, withCPU("1"), withPhase(corev1.PodSucceeded)),
			fakePod("d", "b", "n", high, withCPU("1"), withPhase(corev1.PodFailed)),
		}, want: "4"},
		{name: "another node's pods do not count", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "other", high, withCPU("1"))}, want: "4"},
		{name: "containers add up", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("1"), withContainer("500m"))}, want: "2500m"},
		{name: "a bigger init container wins", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("500m"), withInit("2", false))}, want: "2"},
		{name: "a smaller init container does not", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("1"), withInit("500m", false))}, want: "3"},
		{name: "a sidecar adds to the containers", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("1"), withInit("500m", true))}, want: "2500m"},
		{name: "an init container after a sidecar runs beside it", alloc: "4", pods: []*corev1.Pod{
			fakePod("d", "a", "n", high, withCPU("100m"), withInit("1", true), withInit("2", false)),
		}, want: "1"},
		{name: "overhead counts", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("1"), func(p *corev1.Pod) {
			p.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}
		})}, want: "2750m"},
		{name: "a pod-level request replaces the containers'", alloc: "4", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("1"), func(p *corev1.Pod) {
			p.Spec.Resources = &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}
		})}, want: "2"},
		{name: "several pods", alloc: "8", pods: []*corev1.Pod{
			fakePod("d", "a", "n", high, withCPU("1")),
			fakePod("d", "b", "n", withPriority(prio+1), withCPU("1500m")),
			fakePod("d", "c", "n", withCPU("3")),
		}, want: "5500m"},
		{name: "full", alloc: "2", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("2"))},
			wantErr: "no cpu on node n for a preemptor of priority 1000: the pods it cannot preempt (priority 1000 or more) request 2 of the node's allocatable 2"},
		{name: "overcommitted", alloc: "1", pods: []*corev1.Pod{fakePod("d", "a", "n", high, withCPU("1500m"))},
			wantErr: "request 1500m of the node's allocatable 1"},
		{name: "no allocatable cpu", alloc: "", wantErr: "node n reports no allocatable cpu"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
			if tc.alloc != "" {
				node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(tc.alloc)}
			}
			pods := make([]corev1.Pod, len(tc.pods))
			for i, p := range tc.pods {
				pods[i] = *p
			}
			got, err := preemptorCPU(node, pods, prio)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("preemptorCPU error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("preemptorCPU: %v", err)
			}
			if want := resource.MustParse(tc.want); got.Cmp(want) != 0 {
				t.Errorf("preemptorCPU = %s, want %s", got.String(), tc.want)
			}
		})
	}
}

func TestPreemptionCandidates(t *testing.T) {
	pods := []corev1.Pod{
		*fakePod("d", "low", "n", withPriority(10), withCPU("1")),
		*fakePod("d", "nil-priority", "n", withCPU("1")),
		*fakePod("d", "no-cpu", "n", withPriority(10)),
		*fakePod("d", "init-cpu-only", "n", withInit("1", false)),
		*fakePod("d", "done", "n", withCPU("1"), withPhase(corev1.PodSucceeded)),
		*fakePod("d", "high", "n", withPriority(1000), withCPU("1")),
	}
	got := podNsNames(preemptionCandidates(pods, 1000))
	if want := "d/low, d/nil-priority, d/init-cpu-only"; got != want {
		t.Errorf("candidates = %q, want %q", got, want)
	}
}

func TestPreemptionWatch(t *testing.T) {
	a, b, c := fakePod("d", "a", "n"), fakePod("d", "b", "n"), fakePod("d", "c", "n")
	watch := newPreemptionWatch([]*corev1.Pod{a, b, c})
	aPreempted := a.DeepCopy()
	aPreempted.Status.Conditions = []corev1.PodCondition{{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonPreemptionByScheduler}}
	cEvicted := c.DeepCopy()
	cEvicted.Status.Conditions = []corev1.PodCondition{{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonEvictionByEvictionAPI}}
	// c replaced by a pod of the same name: not c.
	cReplacement := fakePod("d", "c", "n")
	cReplacement.UID = "uid-c-2"

	var out bytes.Buffer
	watch.observe(&out, map[types.UID]*corev1.Pod{a.UID: aPreempted, b.UID: b, c.UID: cEvicted}, 1500*time.Millisecond)
	watch.observe(&out, map[types.UID]*corev1.Pod{b.UID: b, c.UID: cEvicted}, 2*time.Second)
	if got, want := out.String(), "preempt: victim d/a: DisruptionTarget=True, reason PreemptionByScheduler (1.5s)\n"; got != want {
		t.Errorf("output = %q, want %q (a once; b alive; c evicted, not preempted)", got, want)
	}
	if got := podNsNames(watch.spared()); got != "d/b, d/c" {
		t.Errorf("spared = %q, want d/b, d/c", got)
	}
	out.Reset()
	watch.observe(&out, map[types.UID]*corev1.Pod{b.UID: b, cReplacement.UID: cReplacement}, 3*time.Second)
	if got, want := out.String(), "preempt: victim d/c gone (3.0s)\n"; got != want {
		t.Errorf("output = %q, want %q", got, want)
	}
}
