package chaos

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
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

// preemptNode is lab-node-2 with 4 cpus: a system pod it cannot preempt (1 cpu), two
// candidates (low, 1 cpu at priority 0; nil-priority, 500m), a pod without a cpu request, a
// finished pod, and a pod on another node.
func preemptNode() []runtime.Object {
	return []runtime.Object{
		fakeNode("lab-node-2", "4"), fakeNode("lab-node-3", "4"),
		fakePod("kube-system", "critical", "lab-node-2", withPriority(2000001000), withCPU("1")),
		fakePod("default", "low", "lab-node-2", withPriority(0), withCPU("1")),
		fakePod("default", "nil-priority", "lab-node-2", withCPU("500m")),
		fakePod("default", "no-cpu", "lab-node-2"),
		fakePod("default", "done", "lab-node-2", withCPU("2"), withPhase(corev1.PodSucceeded)),
		fakePod("default", "elsewhere", "lab-node-3", withCPU("2")),
	}
}

// fakeScheduler plays kube-scheduler for the preemptor of node in ns: once the pod exists, it
// marks low preempted, deletes nil-priority and binds the preemptor. It stops with the test.
func fakeScheduler(t *testing.T, cs *fake.Clientset, ns, node string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		pods := cs.CoreV1().Pods(ns)
		for ctx.Err() == nil {
			p, err := pods.Get(ctx, PreemptorName(node), metav1.GetOptions{})
			if err != nil {
				time.Sleep(time.Millisecond)
				continue
			}
			low, err := cs.CoreV1().Pods("default").Get(ctx, "low", metav1.GetOptions{})
			if err != nil {
				t.Errorf("fake scheduler: %v", err)
				return
			}
			low.Status.Conditions = append(low.Status.Conditions, corev1.PodCondition{
				Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonPreemptionByScheduler,
			})
			if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, low, metav1.UpdateOptions{}); err != nil {
				t.Errorf("fake scheduler: %v", err)
			}
			if err := cs.CoreV1().Pods("default").Delete(ctx, "nil-priority", metav1.DeleteOptions{}); err != nil {
				t.Errorf("fake scheduler: %v", err)
			}
			p.Spec.NodeName = node
			if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Errorf("fake scheduler: %v", err)
			}
			return
		}
	}()
}

func TestFakePreempt(t *testing.T) {
	fastClusterTimings(t)
	cs := fake.NewClientset(preemptNode()...)
	fakeScheduler(t, cs, "default", "lab-node-2")

	var out bytes.Buffer
	undo, err := Preempt(context.Background(), cs, &out, "lab-node-2", PreemptOptions{Timeout: 5 * time.Second})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("Preempt: %v", err)
	}
	if want := "coronerctl chaos unpreempt lab-node-2"; undo != want {
		t.Errorf("undo = %q, want %q", undo, want)
	}

	pc, err := cs.SchedulingV1().PriorityClasses().Get(context.Background(), "coroner-chaos-preemptor", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the PriorityClass: %v", err)
	}
	if pc.Value != 1000000 || pc.GlobalDefault || ptr.Deref(pc.PreemptionPolicy, "") != corev1.PreemptLowerPriority || !strings.Contains(pc.Description, "coronerctl") {
		t.Errorf("PriorityClass = value %d, globalDefault %t, preemptionPolicy %v, description %q; want 1000000, false, PreemptLowerPriority, naming coronerctl",
			pc.Value, pc.GlobalDefault, ptr.Deref(pc.PreemptionPolicy, ""), pc.Description)
	}

	p, err := cs.CoreV1().Pods("default").Get(context.Background(), "coroner-chaos-preemptor-lab-node-2", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the preemptor: %v", err)
	}
	if p.Spec.PriorityClassName != "coroner-chaos-preemptor" {
		t.Errorf("priorityClassName = %q", p.Spec.PriorityClassName)
	}
	if len(p.Spec.NodeSelector) != 1 || p.Spec.NodeSelector[corev1.LabelHostname] != "lab-node-2" {
		t.Errorf("nodeSelector = %v, want kubernetes.io/hostname=lab-node-2", p.Spec.NodeSelector)
	}
	if p.Labels["app.kubernetes.io/managed-by"] != "coronerctl-chaos" {
		t.Errorf("labels = %v, want app.kubernetes.io/managed-by=coronerctl-chaos", p.Labels)
	}
	if ptr.Deref(p.Spec.TerminationGracePeriodSeconds, -1) != 1 || len(p.Spec.Tolerations) != 0 {
		t.Errorf("terminationGracePeriodSeconds = %v, tolerations %v; want 1, none", p.Spec.TerminationGracePeriodSeconds, p.Spec.Tolerations)
	}
	if len(p.Spec.Containers) != 1 {
		t.Fatalf("containers = %v, want one", p.Spec.Containers)
	}
	c := p.Spec.Containers[0]
	if c.Image != "registry.k8s.io/pause:3.10" || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %q, pull policy %q; want registry.k8s.io/pause:3.10, IfNotPresent", c.Image, c.ImagePullPolicy)
	}
	// 4 cpus less the 1 of the pod of priority 2000001000 it cannot preempt.
	want := resource.MustParse("3")
	if req, lim := c.Resources.Requests[corev1.ResourceCPU], c.Resources.Limits[corev1.ResourceCPU]; req.Cmp(want) != 0 || lim.Cmp(want) != 0 {
		t.Errorf("cpu request %s, limit %s; want 3 and 3", req.String(), lim.String())
	}
	if len(c.Resources.Requests) != 1 || len(c.Resources.Limits) != 1 {
		t.Errorf("resources = %v, want cpu only", c.Resources)
	}

	// The PriorityClass exists before the pod that names it.
	var order []string
	for _, a := range cs.Actions() {
		if a.GetVerb() == "create" {
			order = append(order, a.GetResource().Resource)
		}
	}
	if strings.Join(order, ",") != "priorityclasses,pods" {
		t.Errorf("creates = %v, want priorityclasses then pods", order)
	}

	for _, s := range []string{
		"preempt: 2 candidates on lab-node-2 (priority below 1000000, with a cpu request):\n" +
			"preempt: candidate default/low (priority 0, cpu 1)\n" +
			"preempt: candidate default/nil-priority (priority 0, cpu 500m)\n" +
			"preempt: created PriorityClass coroner-chaos-preemptor (value 1000000)\n" +
			"preempt: created default/coroner-chaos-preemptor-lab-node-2 (priority class coroner-chaos-preemptor, cpu 3, node lab-node-2)\n",
		"preempt: victim default/low: DisruptionTarget=True, reason PreemptionByScheduler (",
		"preempt: victim default/nil-priority gone (",
		"preempt: default/coroner-chaos-preemptor-lab-node-2 bound to lab-node-2 (",
		"preempt: 2 of 2 candidates preempted\n",
	} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("output does not contain %q", s)
		}
	}
	for _, s := range []string{"no-cpu", "done", "elsewhere", "critical", "not preempted"} {
		if strings.Contains(out.String(), s) {
			t.Errorf("output mentions %q", s)
		}
	}
}

func TestFakePreemptFails(t *testing.T) {
	fastClusterTimings(t)
	existing := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "chaos", Name: "coroner-chaos-preemptor-lab-node-2"}}
	cases := []struct {
		name    string
		node    string
		opts    PreemptOptions
		objs    []runtime.Object
		react   k8stesting.ReactionFunc // on pod creates, before the tracker
		wantErr string
		// wantUndo is the undo returned with the error, wantCreates the create requests made,
		// wantPreemptor whether the preemptor is left in default.
		wantUndo      string
		wantCreates   int
		wantPreemptor bool
	}{
		{name: "missing node", node: "nope", wantErr: "node nope not found"},
		{
			name: "preemptor exists", node: "lab-node-2", opts: PreemptOptions{Namespace: "chaos"}, objs: []runtime.Object{existing},
			wantErr: "preemptor pod chaos/coroner-chaos-preemptor-lab-node-2 exists already; run `coronerctl chaos unpreempt lab-node-2 -n chaos` first",
		},
		{
			name: "no cpu left", node: "lab-node-2", opts: PreemptOptions{Priority: 10},
			objs:    []runtime.Object{fakePod("default", "big", "lab-node-2", withPriority(10), withCPU("4"))},
			wantErr: "no cpu on node lab-node-2 for a preemptor of priority 10",
		},
		{
			name: "PriorityClass of another value", node: "lab-node-2",
			objs:    []runtime.Object{&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "coroner-chaos-preemptor"}, Value: 5}},
			wantErr: "PriorityClass coroner-chaos-preemptor exists with value 5, not 1000000",
		},
		{
			name: "never scheduled", node: "lab-node-2", opts: PreemptOptions{Timeout: 30 * time.Millisecond},
			react: func(a k8stesting.Action) (bool, runtime.Object, error) {
				p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
				p.Status.Conditions = []corev1.PodCondition{{
					Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
					Message: "0/2 nodes are available: 1 Insufficient cpu.",
				}}
				return false, nil, nil
			},
			wantErr:  "preemptor pod default/coroner-chaos-preemptor-lab-node-2 still unscheduled after 30ms: PodScheduled=False (Unschedulable): 0/2 nodes are available: 1 Insufficient cpu.",
			wantUndo: "coronerctl chaos unpreempt lab-node-2", wantCreates: 2, wantPreemptor: true,
		},
		{
			name: "creation refused", node: "lab-node-2",
			react: func(a k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(podResource.GroupResource(), "x", fixedError("exceeded quota"))
			},
			wantErr: "creating preemptor pod default/coroner-chaos-preemptor-lab-node-2: ", wantCreates: 2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(append(preemptNode(), tc.objs...)...)
			if tc.react != nil {
				cs.PrependReactor("create", "pods", tc.react)
			}
			if tc.opts.Timeout == 0 {
				tc.opts.Timeout = time.Second // no case should wait; a bug must not hang the test for 2m
			}
			var out bytes.Buffer
			undo, err := Preempt(context.Background(), cs, &out, tc.node, tc.opts)
			t.Logf("output:\n%s", out.String())
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Preempt error = %v, want one containing %q", err, tc.wantErr)
			}
			if undo != tc.wantUndo {
				t.Errorf("undo = %q, want %q", undo, tc.wantUndo)
			}
			creates := 0
			for _, a := range cs.Actions() {
				if a.GetVerb() == "create" {
					creates++
				}
			}
			if creates != tc.wantCreates {
				t.Errorf("create requests = %d, want %d", creates, tc.wantCreates)
			}
			created := fakeHasPod(t, cs, "default", PreemptorName("lab-node-2"))
			if created != tc.wantPreemptor {
				t.Errorf("preemptor created = %t, want %t", created, tc.wantPreemptor)
			}
		})
	}
}

func TestFakeUnpreempt(t *testing.T) {
	fastClusterTimings(t)
	cases := []struct {
		name      string
		namespace string
		pod       *corev1.Pod
		wantErr   string
		wantUndo  string
	}{
		{
			name: "default namespace", pod: fakePod("default", "coroner-chaos-preemptor-lab-node-2", "lab-node-2"),
			wantUndo: "coronerctl chaos preempt lab-node-2",
		},
		{
			name: "another namespace", namespace: "chaos", pod: fakePod("chaos", "coroner-chaos-preemptor-lab-node-2", "lab-node-2"),
			wantUndo: "coronerctl chaos preempt lab-node-2 -n chaos",
		},
		{name: "no preemptor", wantErr: "preemptor pod default/coroner-chaos-preemptor-lab-node-2 not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{fakeNode("lab-node-2", "4"), fakePod("default", "bystander", "lab-node-2")}
			if tc.pod != nil {
				objs = append(objs, tc.pod)
			}
			cs := fake.NewClientset(objs...)
			var out bytes.Buffer
			undo, err := Unpreempt(context.Background(), cs, &out, "lab-node-2", tc.namespace)
			t.Logf("output:\n%s", out.String())
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Unpreempt error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unpreempt: %v", err)
			}
			if undo != tc.wantUndo {
				t.Errorf("undo = %q, want %q", undo, tc.wantUndo)
			}
			if fakeHasPod(t, cs, tc.pod.Namespace, tc.pod.Name) {
				t.Error("the preemptor still exists")
			}
			if !fakeHasPod(t, cs, "default", "bystander") {
				t.Error("Unpreempt deleted another pod")
			}
			key := tc.pod.Namespace + "/" + tc.pod.Name
			for _, s := range []string{
				"unpreempt: deleted " + key + "\n",
				"unpreempt: " + key + " gone (",
				"unpreempt: left PriorityClass coroner-chaos-preemptor: it is cluster-wide and harmless",
			} {
				if !strings.Contains(out.String(), s) {
					t.Errorf("output does not contain %q", s)
				}
			}
		})
	}
}
