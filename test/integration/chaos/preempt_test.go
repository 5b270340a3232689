package chaos_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/cmd/coronerctl/chaos"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
)

// preemptorClass is the PriorityClass Preempt makes (cluster-scoped, fixed name): the
// tests that make it are not parallel, and each starts and ends without it.
const preemptorClass = "coroner-chaos-preemptor"

// withoutPreemptorClass deletes the preemptor's PriorityClass now and when the test ends.
func withoutPreemptorClass(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	del := func() {
		err := cs.SchedulingV1().PriorityClasses().Delete(context.Background(), preemptorClass, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting PriorityClass %s: %v", preemptorClass, err)
		}
	}
	del()
	t.Cleanup(del)
}

// preemptNode makes node (4 cpus) and other, and the pods of node: a system pod the
// preemptor cannot preempt (1 cpu, system-node-critical), two candidates (low, 1 cpu;
// nil-priority, 500m; both of priority 0, no PriorityClass), a pod without a cpu request, a
// finished pod; and a pod on other.
func preemptNode(t *testing.T, cs kubernetes.Interface, ns, node, other string) {
	t.Helper()
	createNode(t, cs, node, "4", false)
	createNode(t, cs, other, "4", false)
	createPod(t, cs, ns, "critical", podSpec{node: node, cpu: "1", priorityClass: "system-node-critical"})
	createPod(t, cs, ns, "low", podSpec{node: node, cpu: "1"})
	createPod(t, cs, ns, "nil-priority", podSpec{node: node, cpu: "500m"})
	createPod(t, cs, ns, "no-cpu", podSpec{node: node})
	createPod(t, cs, ns, "done", podSpec{node: node, cpu: "2", phase: corev1.PodSucceeded})
	createPod(t, cs, ns, "elsewhere", podSpec{node: other, cpu: "2"})
}

// playScheduler plays kube-scheduler for the preemptor of node in ns until the test ends:
// once the pod exists, act does what the scheduler does with it.
func playScheduler(t *testing.T, cs kubernetes.Interface, ns, node string, act func(ctx context.Context, p *corev1.Pod) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			p, err := cs.CoreV1().Pods(ns).Get(ctx, chaos.PreemptorName(node), metav1.GetOptions{})
			if err != nil {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if err := act(ctx, p); err != nil && ctx.Err() == nil {
				t.Errorf("played scheduler: %v", err)
			}
			return
		}
	}()
}

// preemptVictims marks low preempted (DisruptionTarget, PreemptionByScheduler, as
// kube-scheduler writes it before deleting a victim; low is left there, not deleted, to see
// the condition reported), deletes nil-priority, and binds the preemptor to the node.
func preemptVictims(cs kubernetes.Interface, ns, node string) func(ctx context.Context, p *corev1.Pod) error {
	return func(ctx context.Context, p *corev1.Pod) error {
		low, err := cs.CoreV1().Pods(ns).Get(ctx, "low", metav1.GetOptions{})
		if err != nil {
			return err
		}
		low.Status.Conditions = append(low.Status.Conditions, corev1.PodCondition{
			Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonPreemptionByScheduler,
			Message: "default-scheduler: preempting to accommodate a higher priority pod",
			// Set as the scheduler does: the disruption controller (running for the eviction
			// tests) removes at once a DisruptionTarget without a recent transition time from
			// a pod that is not terminating.
			LastTransitionTime: metav1.Now(),
		})
		if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, low, metav1.UpdateOptions{}); err != nil {
			return err
		}
		if err := cs.CoreV1().Pods(ns).Delete(ctx, "nil-priority", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			return err
		}
		return cs.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: p.Name, UID: p.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{})
	}
}

func TestPreempt(t *testing.T) {
	env := harness.Shared(t)
	ns := env.Namespace(t)
	admin := adminClient(env)
	ctx := context.Background()
	withoutPreemptorClass(t, admin)
	node, other := ns+"-2", ns+"-3"
	preemptNode(t, admin, ns, node, other)
	playScheduler(t, admin, ns, node, preemptVictims(admin, ns, node))
	cs, rec := recordedClient(t, env)

	var out bytes.Buffer
	undo, err := chaos.Preempt(ctx, cs, &out, node, chaos.PreemptOptions{Namespace: ns, Timeout: 30 * time.Second})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatalf("Preempt: %v", err)
	}
	if want := "coronerctl chaos unpreempt " + node + " -n " + ns; undo != want {
		t.Errorf("undo = %q, want %q", undo, want)
	}

	pc, err := admin.SchedulingV1().PriorityClasses().Get(ctx, preemptorClass, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the PriorityClass: %v", err)
	}
	if pc.Value != 1000000 || pc.GlobalDefault || ptr.Deref(pc.PreemptionPolicy, "") != corev1.PreemptLowerPriority || !strings.Contains(pc.Description, "coronerctl") {
		t.Errorf("PriorityClass = value %d, globalDefault %t, preemptionPolicy %v, description %q; want 1000000, false, PreemptLowerPriority, naming coronerctl",
			pc.Value, pc.GlobalDefault, ptr.Deref(pc.PreemptionPolicy, ""), pc.Description)
	}

	p, err := admin.CoreV1().Pods(ns).Get(ctx, chaos.PreemptorName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the preemptor: %v", err)
	}
	if p.Name != "coroner-chaos-preemptor-"+node || p.Spec.PriorityClassName != preemptorClass {
		t.Errorf("name %q, priorityClassName %q", p.Name, p.Spec.PriorityClassName)
	}
	// The API server's Priority admission resolved the class.
	if ptr.Deref(p.Spec.Priority, -1) != 1000000 || ptr.Deref(p.Spec.PreemptionPolicy, "") != corev1.PreemptLowerPriority {
		t.Errorf("priority %v, preemptionPolicy %v; want 1000000, PreemptLowerPriority", p.Spec.Priority, p.Spec.PreemptionPolicy)
	}
	if len(p.Spec.NodeSelector) != 1 || p.Spec.NodeSelector[corev1.LabelHostname] != node {
		t.Errorf("nodeSelector = %v, want kubernetes.io/hostname=%s", p.Spec.NodeSelector, node)
	}
	if p.Spec.NodeName != node {
		t.Errorf("nodeName = %q, want %q (bound)", p.Spec.NodeName, node)
	}
	if p.Labels["app.kubernetes.io/managed-by"] != "coronerctl-chaos" {
		t.Errorf("labels = %v, want app.kubernetes.io/managed-by=coronerctl-chaos", p.Labels)
	}
	// The only tolerations are the two the DefaultTolerationSeconds admission plugin adds.
	for _, tol := range p.Spec.Tolerations {
		if (tol.Key != corev1.TaintNodeNotReady && tol.Key != corev1.TaintNodeUnreachable) || ptr.Deref(tol.TolerationSeconds, 0) != 300 {
			t.Errorf("toleration %+v; want none but the API server's defaults", tol)
		}
	}
	if ptr.Deref(p.Spec.TerminationGracePeriodSeconds, -1) != 1 {
		t.Errorf("terminationGracePeriodSeconds = %v, want 1", p.Spec.TerminationGracePeriodSeconds)
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

	// The PriorityClass is created before the pod that names it (the API server refuses a pod
	// of a class that does not exist). The API server's Priority admission reads classes from
	// its informer, which can lag the create by a moment: createPreemptor retries the pod's
	// create while it is refused with 403 for that reason (CI saw one such refusal), so
	// refused creates are left out; the one that succeeded is counted.
	var order []string
	refused := 0
	for _, r := range rec.requests() {
		if r.Method != http.MethodPost {
			continue
		}
		if r.Code == http.StatusForbidden && r.Path == "/api/v1/namespaces/"+ns+"/pods" {
			refused++
			continue
		}
		order = append(order, r.Path)
	}
	if refused > 0 {
		t.Logf("the preemptor's create was refused %d time(s) while admission's PriorityClass cache lagged", refused)
	}
	if wantOrder := []string{"/apis/scheduling.k8s.io/v1/priorityclasses", "/api/v1/namespaces/" + ns + "/pods"}; strings.Join(order, ",") != strings.Join(wantOrder, ",") {
		t.Errorf("creates = %v, want %v", order, wantOrder)
	}

	for _, s := range []string{
		"preempt: 2 candidates on " + node + " (priority below 1000000, with a cpu request):\n" +
			"preempt: candidate " + ns + "/low (priority 0, cpu 1)\n" +
			"preempt: candidate " + ns + "/nil-priority (priority 0, cpu 500m)\n" +
			"preempt: created PriorityClass coroner-chaos-preemptor (value 1000000)\n" +
			"preempt: created " + ns + "/coroner-chaos-preemptor-" + node + " (priority class coroner-chaos-preemptor, cpu 3, node " + node + ")\n",
		"preempt: victim " + ns + "/low: DisruptionTarget=True, reason PreemptionByScheduler (",
		"preempt: victim " + ns + "/nil-priority gone (",
		"preempt: " + ns + "/coroner-chaos-preemptor-" + node + " bound to " + node + " (",
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

func TestPreemptFails(t *testing.T) {
	env := harness.Shared(t)
	cases := []struct {
		name    string
		missing bool
		opts    chaos.PreemptOptions
		// setup adds to the fixture (ns, node); scheduler, when set, is the played
		// scheduler's act.
		setup     func(t *testing.T, cs kubernetes.Interface, ns, node string)
		scheduler func(cs kubernetes.Interface) func(ctx context.Context, p *corev1.Pod) error
		wantErr   string // NS and NODE stand for the namespace and the node
		// wantUndo is the undo returned with the error, wantCreates the create requests made,
		// wantPreemptor whether the preemptor is left.
		wantUndo      string
		wantCreates   int
		wantPreemptor bool
	}{
		{name: "missing node", missing: true, wantErr: "node NODE not found"},
		{
			name: "preemptor exists",
			setup: func(t *testing.T, cs kubernetes.Interface, ns, node string) {
				createPod(t, cs, ns, chaos.PreemptorName(node), podSpec{})
			},
			wantErr:       "preemptor pod NS/coroner-chaos-preemptor-NODE exists already; run `coronerctl chaos unpreempt NODE -n NS` first",
			wantPreemptor: true,
		},
		{
			name: "no cpu left", opts: chaos.PreemptOptions{Priority: 10},
			setup: func(t *testing.T, cs kubernetes.Interface, ns, node string) {
				pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-10"}, Value: 10}
				if _, err := cs.SchedulingV1().PriorityClasses().Create(context.Background(), pc, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() {
					_ = cs.SchedulingV1().PriorityClasses().Delete(context.Background(), pc.Name, metav1.DeleteOptions{})
				})
				createPod(t, cs, ns, "big", podSpec{node: node, cpu: "4", priorityClass: pc.Name})
			},
			wantErr: "no cpu on node NODE for a preemptor of priority 10",
		},
		{
			name: "PriorityClass of another value",
			setup: func(t *testing.T, cs kubernetes.Interface, ns, node string) {
				pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: preemptorClass}, Value: 5}
				if _, err := cs.SchedulingV1().PriorityClasses().Create(context.Background(), pc, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "PriorityClass coroner-chaos-preemptor exists with value 5, not 1000000",
		},
		{
			name: "never scheduled", opts: chaos.PreemptOptions{Timeout: 2 * time.Second},
			scheduler: func(cs kubernetes.Interface) func(ctx context.Context, p *corev1.Pod) error {
				return func(ctx context.Context, p *corev1.Pod) error {
					p.Status.Conditions = []corev1.PodCondition{{
						Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
						Message: "0/2 nodes are available: 1 Insufficient cpu.",
					}}
					_, err := cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
					return err
				}
			},
			wantErr:  "preemptor pod NS/coroner-chaos-preemptor-NODE still unscheduled after 2s: PodScheduled=False (Unschedulable): 0/2 nodes are available: 1 Insufficient cpu.",
			wantUndo: "coronerctl chaos unpreempt NODE -n NS", wantCreates: 2, wantPreemptor: true,
		},
		{
			name: "creation refused",
			setup: func(t *testing.T, cs kubernetes.Interface, ns, node string) {
				q := &corev1.ResourceQuota{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "no-pods"},
					Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
				}
				q, err := cs.CoreV1().ResourceQuotas(ns).Create(context.Background(), q, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				// No resourcequota controller runs: write the status it would.
				q.Status = corev1.ResourceQuotaStatus{Hard: q.Spec.Hard, Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}
				if _, err := cs.CoreV1().ResourceQuotas(ns).UpdateStatus(context.Background(), q, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: `creating preemptor pod NS/coroner-chaos-preemptor-NODE: pods "coroner-chaos-preemptor-NODE" is forbidden: exceeded quota: no-pods`, wantCreates: 2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			admin := adminClient(env)
			withoutPreemptorClass(t, admin)
			node := ns + "-2"
			preemptNode(t, admin, ns, node, ns+"-3")
			if tc.setup != nil {
				tc.setup(t, admin, ns, node)
			}
			if tc.scheduler != nil {
				playScheduler(t, admin, ns, node, tc.scheduler(admin))
			}
			target := node
			if tc.missing {
				target = ns + "-nope"
			}
			expand := func(s string) string {
				return strings.ReplaceAll(strings.ReplaceAll(s, "NODE", target), "NS", ns)
			}
			tc.opts.Namespace = ns
			if tc.opts.Timeout == 0 {
				tc.opts.Timeout = 5 * time.Second // no case should wait; a bug must not hang the test for 2m
			}
			cs, rec := recordedClient(t, env)
			var out bytes.Buffer
			undo, err := chaos.Preempt(context.Background(), cs, &out, target, tc.opts)
			t.Logf("output:\n%s", out.String())
			if want := expand(tc.wantErr); err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Preempt error = %v, want one containing %q", err, want)
			}
			if want := expand(tc.wantUndo); undo != want {
				t.Errorf("undo = %q, want %q", undo, want)
			}
			// Objects it tried to create: the PriorityClass and the pod. The pod's create
			// is retried while the API server's admission has not seen the class yet
			// (chaos.createPreemptor), a few times at most.
			if creates := rec.distinctPaths(http.MethodPost); creates != tc.wantCreates {
				t.Errorf("objects created = %d, want %d (%v)", creates, tc.wantCreates, rec.requests())
			}
			if posts := rec.count(http.MethodPost, "/"); posts > tc.wantCreates+5 {
				t.Errorf("%d create requests for %d objects (%v)", posts, tc.wantCreates, rec.requests())
			}
			if created := hasPod(t, admin, ns, chaos.PreemptorName(node)); created != tc.wantPreemptor {
				t.Errorf("preemptor exists = %t, want %t", created, tc.wantPreemptor)
			}
		})
	}
}

func TestUnpreempt(t *testing.T) {
	env := harness.Shared(t)
	cases := []struct {
		name      string
		namespace string // "" is default; NS stands for the test's namespace
		noPod     bool
		wantErr   string
		wantUndo  string
	}{
		{name: "default namespace", wantUndo: "coronerctl chaos preempt NODE"},
		{name: "another namespace", namespace: "NS", wantUndo: "coronerctl chaos preempt NODE -n NS"},
		{name: "no preemptor", noPod: true, wantErr: "preemptor pod default/coroner-chaos-preemptor-NODE not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			admin := adminClient(env)
			// The node's name is unique, and so is its preemptor's: the default namespace
			// is safe to use.
			node := ns + "-2"
			expand := func(s string) string {
				return strings.ReplaceAll(strings.ReplaceAll(s, "NODE", node), "NS", ns)
			}
			createNode(t, admin, node, "4", false)
			createPod(t, admin, ns, "bystander", podSpec{node: node})
			podNS := expand(tc.namespace)
			if podNS == "" {
				podNS = metav1.NamespaceDefault
			}
			name := chaos.PreemptorName(node)
			if !tc.noPod {
				createPod(t, admin, podNS, name, podSpec{node: node})
				t.Cleanup(func() {
					_ = admin.CoreV1().Pods(podNS).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				})
			}
			// Bound to the node, the deleted preemptor stays terminating until its kubelet
			// is done.
			playKubelet(t, admin, node, kubeletDelete, false)
			var out bytes.Buffer
			undo, err := chaos.Unpreempt(context.Background(), admin, &out, node, expand(tc.namespace))
			t.Logf("output:\n%s", out.String())
			if tc.wantErr != "" {
				if err == nil || err.Error() != expand(tc.wantErr) {
					t.Fatalf("Unpreempt error = %v, want %q", err, expand(tc.wantErr))
				}
				return
			}
			if err != nil {
				t.Fatalf("Unpreempt: %v", err)
			}
			if undo != expand(tc.wantUndo) {
				t.Errorf("undo = %q, want %q", undo, expand(tc.wantUndo))
			}
			if hasPod(t, admin, podNS, name) {
				t.Error("the preemptor still exists")
			}
			if !hasPod(t, admin, ns, "bystander") {
				t.Error("Unpreempt deleted another pod")
			}
			key := podNS + "/" + name
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
