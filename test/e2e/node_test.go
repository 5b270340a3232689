package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	batchv1 "k8s.io/api/batch/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/images"
	"github.com/coroner-dev/coroner/test/lab"
)

// TestDisruptions runs the tests that disturb a node, one after the other (the parallel
// tests meanwhile run on the quiet node): first the exit -> stamp latency on lab-node-3
// (containerd 1.7) and lab-node-2 (containerd 1.6) while nothing else runs there, then a
// node OOM on lab-node-2, a preemption on
// lab-node-3, a drain, a zombie pod recovered from a partitioned node, then lab-node-3
// partitioned while lab-node-2's kubelet is killed.
func TestDisruptions(t *testing.T) {
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	t.Parallel()
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"ExitToStamp", exitToStamp},
		{"NodeOOMIgnored", func(t *testing.T) { nodeOOM(t, oomNode) }},
		{"PreemptionIgnored", preemption},
		{"NodeDrained", drain},
		{"ZombieRecovered", zombie},
		{"NodeLoss", nodeLoss},
	} {
		if !t.Run(tc.name, tc.f) {
			// A node left disturbed would fail the next test for the wrong reason.
			t.Fatalf("%s failed: the rest of the chain is not run", tc.name)
		}
	}
}

// nodeLoss takes lab-node-3 off the network and kills lab-node-2's kubelet, with
// `coronerctl chaos`, at the same time: the node controller marks both NotReady and taints
// them unreachable; healed and restarted, both are Ready and untainted again.
func nodeLoss(t *testing.T) {
	notOnKind(t, "it partitions one node while it kills another's kubelet; kind has one worker to disturb")
	for _, tc := range []struct {
		node, break_, repair, undoHint string
	}{
		{busyNode, "partition", "heal", "coronerctl chaos heal " + busyNode},
		{oomNode, "kill-kubelet", "start-kubelet", "coronerctl chaos start-kubelet " + oomNode},
	} {
		t.Run(tc.break_, func(t *testing.T) {
			t.Parallel()
			ctx, _ := setup(t, 4*time.Minute)
			out := coronerctl(ctx, t, "chaos", tc.break_, tc.node)
			if !strings.Contains(out, tc.undoHint) {
				t.Errorf("coronerctl chaos %s did not say how to undo it (%q):\n%s", tc.break_, tc.undoHint, out)
			}
			repaired := false
			t.Cleanup(func() {
				if !repaired {
					coronerctl(context.Background(), t, "chaos", tc.repair, tc.node)
				}
			})
			start := time.Now()
			waitNode(ctx, t, tc.node, "NotReady and tainted unreachable", 90*time.Second, func(n *corev1.Node) bool {
				return readyStatus(n) == corev1.ConditionUnknown &&
					hasTaint(n, corev1.TaintNodeUnreachable, corev1.TaintEffectNoSchedule) &&
					hasTaint(n, corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute)
			})
			t.Logf("%s: NotReady and tainted unreachable %v after %s", tc.node, time.Since(start).Round(100*time.Millisecond), tc.break_)

			coronerctl(ctx, t, "chaos", tc.repair, tc.node)
			repaired = true
			start = time.Now()
			waitNode(ctx, t, tc.node, "Ready without the unreachable taint", 90*time.Second, func(n *corev1.Node) bool {
				return readyStatus(n) == corev1.ConditionTrue && !hasTaint(n, corev1.TaintNodeUnreachable, "")
			})
			t.Logf("%s: Ready again %v after %s", tc.node, time.Since(start).Round(100*time.Millisecond), tc.repair)
		})
	}
}

func waitNode(ctx context.Context, t *testing.T, name, what string, timeout time.Duration, f func(*corev1.Node) bool) {
	t.Helper()
	var last *corev1.Node
	err := lab.Poll(ctx, timeout, name+" "+what, func() (bool, error) {
		n, err := suite.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n
		return f(n), nil
	})
	if err != nil {
		t.Fatalf("%v; last seen: Ready=%s taints=%v", err, readyStatus(last), taints(last))
	}
}

func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	if n == nil {
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// hasTaint reports whether the node has the taint key with effect (any effect when "").
func hasTaint(n *corev1.Node, key string, effect corev1.TaintEffect) bool {
	for _, tn := range n.Spec.Taints {
		if tn.Key == key && (effect == "" || tn.Effect == effect) {
			return true
		}
	}
	return false
}

func taints(n *corev1.Node) []string {
	if n == nil {
		return nil
	}
	var s []string
	for _, tn := range n.Spec.Taints {
		s = append(s, tn.Key+":"+string(tn.Effect))
	}
	return s
}

// The agent's credentials are those of its pod, bound to its node: the admission policy
// lets it write the status of a pod on its own node and refuses a pod on another node,
// with a message that says so.
func TestAgentRefusedOnAnotherNode(t *testing.T) {
	t.Parallel()
	ctx, ns := setup(t, 2*time.Minute)
	agents, err := suite.cs.CoreV1().Pods("coroner-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=coroner-agent", FieldSelector: "spec.nodeName=" + quietNode,
	})
	if err != nil || len(agents.Items) != 1 {
		t.Fatalf("the agent pod on %s: %v (%d found)", quietNode, err, len(agents.Items))
	}
	agent := agents.Items[0]
	agentCS, err := lab.AsPod(ctx, suite.cs, suite.rest, &agent)
	if err != nil {
		t.Fatal(err)
	}

	stamp := []byte(`{"status":{"conditions":[{"type":"DisruptionTarget","status":"True","reason":"TerminationByKubelet","message":"e2e: written with the agent's token"}]}}`)
	for _, tc := range []struct {
		node    string
		allowed bool
	}{{quietNode, true}, {oomNode, false}} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "on-" + tc.node, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeName: tc.node, TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "600"}}},
			},
		}
		if _, err := suite.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := agentCS.CoreV1().Pods(ns).Patch(ctx, p.Name, types.StrategicMergePatchType, stamp,
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		switch {
		case tc.allowed && err != nil:
			t.Errorf("the agent of %s patching a pod on its own node: %v", quietNode, err)
		case !tc.allowed && !apierrors.IsForbidden(err):
			t.Errorf("the agent of %s patching a pod on %s: err %v, want Forbidden", quietNode, tc.node, err)
		case !tc.allowed && !strings.Contains(err.Error(), "may only write pods bound to its own node"):
			t.Errorf("refused, but the message does not say why: %v", err)
		case !tc.allowed:
			t.Logf("refused as it should be: %v", err)
		}
	}
}

// zombie (part of TestDisruptions): the node of a running opted-in Job pod is taken off
// the network. The node controller taints it unreachable, the taint manager evicts the
// pod after its 5s toleration, and the pod stays terminating: no kubelet can confirm it
// stopped. coroner-shim fails it and force-deletes it (ForcefullyTerminated: NodeUnreachable
// after --zombie-threshold, or NodeFenced once the node's agent has fenced), the Ignore rule
// on DisruptionTarget replaces it without counting, and the replacement completes the Job
// on another node while the first node is still cut off.
func zombie(t *testing.T) {
	pc := partitionCase{
		name: "zombie", nodes: []string{oomNode, busyNode}, evictAfter: ptr.To[int64](5),
		want: []string{conditions.ReasonNodeUnreachable, conditions.ReasonNodeFenced},
	}
	if suite.kind { // one disturbed worker: the replacement runs on the other
		pc.nodes, pc.prefer = []string{busyNode, quietNode}, busyNode
	}
	partitioned(t, pc)
}

// TestVMDisruptions takes the VM node (LAB_VM=1) for what disturbs it, one after the
// other, in its turn (vmTurn): a node OOM
// (kubepods.slice's memory.max lowered in the guest), then fencing: its tap device cut
// with an opted-in pod on it.
func TestVMDisruptions(t *testing.T) {
	t.Parallel()
	needVM(t)
	vmTurn(t)
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"NodeOOMIgnored", func(t *testing.T) { nodeOOM(t, vmNode) }},
		{"Fenced", vmFenced},
	} {
		if !t.Run(tc.name, tc.f) {
			t.Fatalf("%s failed: the rest of the chain is not run", tc.name)
		}
	}
}

// vmFenced (part of TestVMDisruptions): an opted-in Job pod on the VM node, which is cut
// off (`coronerctl chaos partition lab-node-4`: its tap device down). The pod keeps the
// default 300 s toleration of unreachable, so no eviction makes it a zombie: the agent in
// the VM, cut off for --fence-after (30 s in the lab), stops the pod's container, and the
// shim, reading the agent's Lease, recovers the pod as NodeFenced; the replacement
// completes the Job on a process node while the VM is still cut off. Healed, the VM's
// agent records the fencing in an Event on the Node.
func vmFenced(t *testing.T) {
	partitioned(t, partitionCase{
		name: "fenced", nodes: []string{vmNode, quietNode}, prefer: vmNode,
		want: []string{conditions.ReasonNodeFenced},
	})
}

// partitionCase is a Job pod on a node that is partitioned.
type partitionCase struct {
	name string
	// nodes the Job's pods may run on; prefer, if set, the one the first pod should
	// run on (the others take the replacement).
	nodes  []string
	prefer string
	// evictAfter, if set, is the pod's toleration of unreachable and not-ready (NoExecute):
	// the taint manager deletes it then, which makes it a zombie.
	evictAfter *int64
	// want are the accepted reasons of ForcefullyTerminated.
	want []string
}

func partitioned(t *testing.T, pc partitionCase) {
	slow := slices.ContainsFunc(pc.nodes, isVM)
	timeout := func(d time.Duration) time.Duration {
		if slow {
			return budget(vmNode, d)
		}
		return d
	}
	ctx, ns := setup(t, timeout(5*time.Minute))
	j := disruptedOnce(pc.name, ns, 1, "true")
	spec := &j.Spec.Template.Spec
	j.Spec.Template.Annotations = map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}
	if pc.evictAfter != nil {
		spec.Tolerations = []corev1.Toleration{
			{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: pc.evictAfter},
			{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: pc.evictAfter},
		}
	}
	if slow {
		tolerateVM(spec)
	}
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: pc.nodes}},
		}}},
	}}
	if pc.prefer != "" {
		spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{
			Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{pc.prefer}},
			}},
		}}
	}
	createJob(ctx, t, j)
	first := waitRunning(ctx, t, ns, j.Name, 1, timeout(time.Minute))[0]
	node := first.Spec.NodeName
	if pc.prefer != "" && node != pc.prefer {
		t.Fatalf("the first pod %s ran on %s, not on %s (preferred by its affinity)", first.Name, node, pc.prefer)
	}

	start := time.Now()
	coronerctl(ctx, t, "chaos", "partition", node)
	healed := false
	heal := func() {
		if !healed {
			healed = true
			coronerctl(context.Background(), t, "chaos", "heal", node)
		}
	}
	t.Cleanup(heal)

	// The shim writes the condition and deletes the pod at once; a poll may see only the
	// deletion, so watch every version.
	var recovered *corev1.Pod
	watchPod(ctx, t, ns, first.Name, "forcefully terminated", 3*time.Minute, func(p *corev1.Pod) bool {
		if p != nil && condition(p, conditions.ForcefullyTerminated) != nil {
			recovered = p.DeepCopy()
		}
		return p == nil || recovered != nil
	})
	took := time.Since(start)
	if recovered != nil {
		c := condition(recovered, conditions.ForcefullyTerminated)
		t.Logf("%s recovered %v after the partition: %s: %s", first.Name, took.Round(100*time.Millisecond), c.Reason, c.Message)
		if !slices.Contains(pc.want, c.Reason) {
			t.Errorf("ForcefullyTerminated reason %s, want one of %v", c.Reason, pc.want)
		}
		if recovered.Status.Phase != corev1.PodFailed {
			t.Errorf("recovered pod in phase %s, want Failed", recovered.Status.Phase)
		}
	} else if pc.evictAfter == nil {
		t.Errorf("%s gone %v after the partition without coroner.dev/ForcefullyTerminated", first.Name, took.Round(100*time.Millisecond))
	}
	wantEvent(ctx, t, ns, j.Name, conditions.EventReasonForcefullyTerminated, "pod "+ns+"/"+first.Name, node)

	got := waitFinished(ctx, t, ns, j.Name, 2*time.Minute)
	t.Logf("Job complete %v after the partition, its node still cut off", time.Since(start).Round(100*time.Millisecond))
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	for _, p := range jobPods(ctx, t, ns, j.Name) {
		if p.UID != first.UID && p.Spec.NodeName == node {
			t.Errorf("the replacement %s ran on the partitioned node", p.Name)
		}
	}
	heal()
	healedAt := time.Now()
	waitNode(ctx, t, node, "Ready after heal", timeout(90*time.Second), func(n *corev1.Node) bool {
		return readyStatus(n) == corev1.ConditionTrue && !hasTaint(n, corev1.TaintNodeUnreachable, "")
	})
	t.Logf("%s: Ready again %v after heal", node, time.Since(healedAt).Round(100*time.Millisecond))
	// The node's agent (fencing on in the lab, after 30s) stopped the pod's container while
	// cut off, and says so on the Node once it is back.
	var fenced string
	err := lab.Poll(ctx, timeout(time.Minute), "a Fenced Event on "+node+" naming "+first.Name, func() (bool, error) {
		evs, err := suite.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + conditions.EventReasonFenced})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			// The pod's name (random suffix) makes the Event this run's; its time is the
			// agent's clock, which on the VM node may be off the host's.
			if strings.Contains(e.Message, ns+"/"+first.Name) {
				fenced = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Error(err)
	} else {
		t.Logf("the agent of %s: %s", node, fenced)
	}
}
