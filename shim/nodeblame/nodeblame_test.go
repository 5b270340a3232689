package nodeblame

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// pod is a pod of the group: created at minute created, and when finished >= 0, failed
// at that minute on node with the DisruptionTarget reason (none: an exit 1).
type podSpec struct {
	name, node, reason string
	created, finished  int
	ann                map[string]string
}

func mk(s podSpec) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, UID: types.UID(s.name + "-0000-uid"), CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(s.created) * time.Minute)), Annotations: s.ann},
		Spec:       corev1.PodSpec{NodeName: s.node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if s.finished >= 0 {
		p.Status.Phase = corev1.PodFailed
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 1, FinishedAt: metav1.NewTime(t0.Add(time.Duration(s.finished) * time.Minute))}}}}
		if s.reason != "" {
			p.Status.Conditions = []corev1.PodCondition{{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: s.reason}}
		}
	}
	return p
}

// ignoreDisruptions is a podFailurePolicy with one Ignore rule on DisruptionTarget.
func ignoreDisruptions(p *corev1.Pod) bool {
	return conditions.FindTrue(p, conditions.DisruptionTarget) != nil
}

func id(name string) string { return v1alpha1.ChargedID(name + "-0000-uid") }

func TestJudgeAvoided(t *testing.T) {
	cases := []struct {
		name string
		pods []podSpec
		want string
	}{
		{"nothing failed", []podSpec{{name: "a", node: "n1", finished: -1}}, ""},
		{"a bug blames no node", []podSpec{{name: "a", node: "n1", finished: 1}}, ""},
		{"a preemption blames no node", []podSpec{{name: "a", node: "n1", finished: 1, reason: conditions.ReasonPreemptionByScheduler}}, ""},
		{"a drain blames no node", []podSpec{{name: "a", node: "n1", finished: 1, reason: conditions.ReasonEvictionByEvictionAPI}}, ""},
		{"node OOM then device, in the order they finished", []podSpec{
			{name: "b", node: "n2", finished: 5, reason: conditions.ReasonDeviceFailure},
			{name: "a", node: "n1", finished: 2, reason: conditions.ReasonNodeOOMKill},
		}, "n1=node-oom,n2=device"},
		{"carried on by the newest pod, the failed pods gone", []podSpec{
			{name: "c", node: "n3", finished: -1, created: 9, ann: map[string]string{v1alpha1.AnnotationAvoidedNodes: "n1=node-oom,n2=device"}},
			{name: "old", node: "n9", finished: -1, created: 3, ann: map[string]string{v1alpha1.AnnotationAvoidedNodes: "n1=node-oom"}},
		}, "n1=node-oom,n2=device"},
		{"carried, and a new death after the newest pod was made", []podSpec{
			{name: "c", node: "n1", finished: 10, created: 9, reason: conditions.ReasonNodeOOMKill, ann: map[string]string{v1alpha1.AnnotationAvoidedNodes: "n1=node-oom,n2=device"}},
		}, "n2=device,n1=node-oom"},
		{"a failure the newest pod already carries is not moved", []podSpec{
			{name: "a", node: "n1", finished: 2, reason: conditions.ReasonNodeOOMKill},
			{name: "c", node: "n3", finished: -1, created: 9, ann: map[string]string{v1alpha1.AnnotationAvoidedNodes: "n1=node-oom,n2=device"}},
		}, "n1=node-oom,n2=device"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var pods []*corev1.Pod
			for _, s := range c.pods {
				pods = append(pods, mk(s))
			}
			st := Judge(pods, nil, ignoreDisruptions)
			if got := st.Avoided.String(); got != c.want {
				t.Errorf("Avoided = %q, want %q", got, c.want)
			}
			if len(st.Verdicts) != 0 {
				t.Errorf("verdicts without a budget: %v", st.Verdicts)
			}
		})
	}
}

func TestJudgeLostWithNode(t *testing.T) {
	p := mk(podSpec{name: "a", node: "n1", finished: -1})
	p.DeletionTimestamp = &metav1.Time{Time: t0}
	p.Status.Conditions = []corev1.PodCondition{{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeletionByTaintManager}}
	if got := Judge([]*corev1.Pod{p}, nil, ignoreDisruptions).Avoided.String(); got != "n1=node-lost" {
		t.Errorf("Avoided = %q, want n1=node-lost", got)
	}
}

func TestJudgeBudget(t *testing.T) {
	dev := conditions.ReasonDeviceFailure
	oom := conditions.ReasonNodeOOMKill
	cases := []struct {
		name     string
		budget   string
		pods     []podSpec
		verdicts map[string]string // pod -> verdict
		new      []string
		charged  string
	}{
		{"within the budget", "device=2", []podSpec{
			{name: "a", node: "n1", finished: 1, reason: dev},
			{name: "b", node: "n1", finished: 2, reason: dev},
		}, map[string]string{"a": "charged device", "b": "charged device"}, []string{"a", "b"}, "device=" + id("a") + "+" + id("b")},
		{"the second device failure counts with device=1, in the order they finished", "device=1", []podSpec{
			{name: "b", node: "n1", finished: 2, reason: dev},
			{name: "a", node: "n2", finished: 1, reason: dev},
		}, map[string]string{"a": "charged device", "b": "spent device"}, []string{"a", "b"}, "device=" + id("a")},
		{"a bug is not bounded: no Ignore rule matched it", "default=0", []podSpec{
			{name: "a", node: "n1", finished: 1},
		}, map[string]string{}, nil, ""},
		{"classes not named fall to the default", "device=5,default=1", []podSpec{
			{name: "a", node: "n1", finished: 1, reason: oom},
			{name: "b", node: "n1", finished: 2, reason: conditions.ReasonPreemptionByScheduler},
			{name: "c", node: "n1", finished: 3, reason: dev},
		}, map[string]string{"a": "charged default", "b": "spent default", "c": "charged device"}, []string{"a", "b", "c"}, "device=" + id("c") + ",default=" + id("a")},
		{"a class neither named nor defaulted is unbounded", "device=0", []podSpec{
			{name: "a", node: "n1", finished: 1, reason: oom},
		}, map[string]string{}, nil, ""},
		{"verdicts taken stay, whatever finished earlier", "device=1", []podSpec{
			{name: "late", node: "n1", finished: 9, reason: dev, ann: map[string]string{v1alpha1.AnnotationBudgetVerdict: "charged device"}},
			{name: "early", node: "n1", finished: 1, reason: dev},
		}, map[string]string{"late": "charged device", "early": "spent device"}, []string{"early"}, "device=" + id("late")},
		{"charged failures carried on by the replacement count though the failed pod is gone", "device=1", []podSpec{
			{name: "next", node: "n2", finished: 5, created: 3, reason: dev, ann: map[string]string{v1alpha1.AnnotationDisruptionsCharged: "device=" + id("gone")}},
		}, map[string]string{"next": "spent device"}, []string{"next"}, "device=" + id("gone")},
		{"a failure carried on as charged is charged, not judged again", "device=1", []podSpec{
			{name: "a", node: "n1", finished: 1, reason: dev},
			{name: "next", node: "n2", finished: -1, created: 3, ann: map[string]string{v1alpha1.AnnotationDisruptionsCharged: "device=" + id("a")}},
		}, map[string]string{"a": "charged device"}, []string{"a"}, "device=" + id("a")},
		{"a budget of 0 spends the first", "node-oom=0", []podSpec{
			{name: "a", node: "n1", finished: 1, reason: oom},
		}, map[string]string{"a": "spent node-oom"}, []string{"a"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			budget, err := v1alpha1.ParseDisruptionBudget(c.budget)
			if err != nil {
				t.Fatal(err)
			}
			var pods []*corev1.Pod
			byName := map[string]*corev1.Pod{}
			for _, s := range c.pods {
				p := mk(s)
				pods = append(pods, p)
				byName[s.name] = p
			}
			st := Judge(pods, budget, ignoreDisruptions)
			got := map[string]string{}
			for name, p := range byName {
				if v, ok := st.Verdicts[string(p.UID)]; ok {
					got[name] = v.String()
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(c.verdicts) {
				t.Errorf("verdicts = %v, want %v", got, c.verdicts)
			}
			var gotNew []string
			for _, s := range c.pods {
				if st.New[string(byName[s.name].UID)] {
					gotNew = append(gotNew, s.name)
				}
			}
			if fmt.Sprint(sortedCopy(gotNew)) != fmt.Sprint(sortedCopy(c.new)) {
				t.Errorf("new = %v, want %v", gotNew, c.new)
			}
			if got := st.Charged.String(); got != c.charged {
				t.Errorf("charged = %q, want %q", got, c.charged)
			}
			for name, want := range c.verdicts {
				v, spent := st.Spent(byName[name])
				if spent != (want[:5] == "spent") || v.String() != want {
					t.Errorf("Spent(%s) = %v, %v; want %s", name, v, spent, want)
				}
			}
		})
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func TestJudgeDamagedAnnotations(t *testing.T) {
	p := mk(podSpec{name: "a", node: "n1", finished: 1, reason: conditions.ReasonDeviceFailure, ann: map[string]string{
		v1alpha1.AnnotationBudgetVerdict: "maybe",
	}})
	next := mk(podSpec{name: "b", finished: -1, created: 2, ann: map[string]string{
		v1alpha1.AnnotationAvoidedNodes:       "n0=device,garbage",
		v1alpha1.AnnotationDisruptionsCharged: "gpu=1",
	}})
	st := Judge([]*corev1.Pod{p, next}, v1alpha1.DisruptionBudget{conditions.DisruptionDevice: 1}, ignoreDisruptions)
	if len(st.Damaged) != 3 {
		t.Errorf("damaged = %v, want 3 errors", st.Damaged)
	}
	// What parsed is kept; the pod with a garbage verdict is judged again.
	if got := st.Avoided.String(); got != "n0=device,n1=device" {
		t.Errorf("Avoided = %q", got)
	}
	if v := st.Verdicts[string(p.UID)]; !v.Charged || !st.New[string(p.UID)] {
		t.Errorf("verdict %v (new %v), want charged device, new", v, st.New[string(p.UID)])
	}
}
