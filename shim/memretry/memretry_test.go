package memretry

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// pod is a Failed pod with container main (limit, request) and optionally a pod-level
// limit, killed as told.
func pod(limit, request, podLimit string, killed corev1.ContainerStateTerminated, conds ...corev1.PodCondition) *corev1.Pod {
	c := corev1.Container{Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}}
	if limit != "" {
		c.Resources.Limits[corev1.ResourceMemory] = resource.MustParse(limit)
	}
	if request != "" {
		c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse(request)
	}
	p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "side"}, c}}}
	if podLimit != "" {
		p.Spec.Resources = &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(podLimit)}}
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodFailed, Conditions: conds, ContainerStatuses: []corev1.ContainerStatus{
		{Name: "side", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}},
		{Name: "main", State: corev1.ContainerState{Terminated: &killed}},
	}}
	return p
}

var (
	limitOOM = corev1.PodCondition{Type: conditions.OOMKilled, Status: corev1.ConditionTrue, Reason: conditions.ReasonMemoryLimitExceeded}
	nodeOOM  = corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonNodeOOMKill}
	oomKill  = corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}
	spec     = v1alpha1.MemoryRetry{Factor: 2, Max: resource.MustParse("128Mi")}
)

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string // the growths, "" for none
	}{
		{"its own limit: doubled", pod("24Mi", "", "", oomKill, limitOOM), "container main 24Mi -> 48Mi"},
		{"rounded up to a MiB", pod("10M", "", "", oomKill, limitOOM), "container main 10M -> 20Mi"},
		{"capped at max", pod("100Mi", "", "", oomKill, limitOOM), "container main 100Mi -> 128Mi"},
		{"at max: handled as without the annotation", pod("128Mi", "", "", oomKill, limitOOM), ""},
		{"over max already", pod("256Mi", "", "", oomKill, limitOOM), ""},
		{"a node OOM never grows", pod("24Mi", "", "", oomKill, nodeOOM), ""},
		{"OOMKilled by the runtime but not stamped by the agent", pod("24Mi", "", "", oomKill), ""},
		{"a plain failure", pod("24Mi", "", "", corev1.ContainerStateTerminated{ExitCode: 1}), ""},
		{"no limit to grow", pod("", "", "", oomKill, limitOOM), ""},
		{"exit 137 without the runtime's reason", pod("24Mi", "", "", corev1.ContainerStateTerminated{ExitCode: 137}, limitOOM), "container main 24Mi -> 48Mi"},
		{"the pod-level limit when the container has none", pod("", "", "32Mi", oomKill, limitOOM), "the pod-level limit 32Mi -> 64Mi"},
		{"the pod-level limit grows with the container's past it", pod("24Mi", "", "40Mi", oomKill, limitOOM), "container main 24Mi -> 48Mi; the pod-level limit 40Mi -> 48Mi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, ok := Decide(spec, tc.pod)
			var got []string
			for _, x := range g {
				got = append(got, x.String())
			}
			if s := strings.Join(got, "; "); s != tc.want || ok != (tc.want != "") {
				t.Errorf("Decide = %q, %v; want %q", s, ok, tc.want)
			}
		})
	}
	running := pod("24Mi", "", "", oomKill, limitOOM)
	running.Status.Phase = corev1.PodRunning
	if _, ok := Decide(spec, running); ok {
		t.Error("a pod that has not failed grew")
	}
}

func TestApply(t *testing.T) {
	mem := func(p *corev1.Pod) (limit, request string) {
		c := p.Spec.Containers[1].Resources
		l, r := c.Limits[corev1.ResourceMemory], c.Requests[corev1.ResourceMemory]
		return l.String(), r.String()
	}
	for _, tc := range []struct {
		name                   string
		pod                    *corev1.Pod
		m                      v1alpha1.Memory
		wantLimit, wantRequest string
		wantChanged            string
	}{
		{"Guaranteed stays Guaranteed", pod("24Mi", "24Mi", "", oomKill), v1alpha1.Memory{"main": resource.MustParse("48Mi")}, "48Mi", "48Mi", "main=48Mi"},
		{"a smaller request stays", pod("24Mi", "16Mi", "", oomKill), v1alpha1.Memory{"main": resource.MustParse("48Mi")}, "48Mi", "16Mi", "main=48Mi"},
		{"never shrinks", pod("64Mi", "16Mi", "", oomKill), v1alpha1.Memory{"main": resource.MustParse("48Mi")}, "64Mi", "16Mi", ""},
		{"no limit in the template: none added", pod("", "16Mi", "", oomKill), v1alpha1.Memory{"main": resource.MustParse("48Mi")}, "0", "16Mi", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := Apply(tc.pod, tc.m)
			if l, r := mem(tc.pod); l != tc.wantLimit || r != tc.wantRequest || changed.String() != tc.wantChanged {
				t.Errorf("limit %s request %s changed %q; want %s %s %q", l, r, changed, tc.wantLimit, tc.wantRequest, tc.wantChanged)
			}
		})
	}
	p := pod("24Mi", "", "40Mi", oomKill)
	g, _ := Decide(spec, withCond(p, limitOOM))
	changed := Apply(p, v1alpha1.MemoryOf(p).With(g))
	if diff := cmp.Diff("main=48Mi,pod=48Mi", changed.String()); diff != "" {
		t.Errorf("pod-level growth applied (-want +got):\n%s", diff)
	}
	if got := v1alpha1.MemoryOf(p).String(); got != "main=48Mi,pod=48Mi" {
		t.Errorf("MemoryOf after Apply = %s", got)
	}
}

func withCond(p *corev1.Pod, c corev1.PodCondition) *corev1.Pod {
	p.Status.Conditions = append(p.Status.Conditions, c)
	return p
}
