package e2e

// A node that kills pods is avoided (issue 38): a replacement leaves the node that killed
// its predecessor (coroner.dev/avoid-failed-nodes), a disruption budget bounds the failures
// an Ignore rule ignores (coroner.dev/disruption-budget), and, with coroner-shim
// --quarantine, a node that keeps killing pods is tainted coroner.dev/quarantined.
//
// These tests do not run in parallel with the rest of the suite: they run alone, before
// the parallel tests (Go runs the top-level tests without t.Parallel first, in the order
// of the files and of the tests in them). The parallel tests kill pods on every node for
// reasons that blame it (node OOMs, device failures, partitions), which would count toward
// a quarantine, and TestNodeQuarantine restarts coroner-shim with other flags, which would
// hold up every other Job. TestNodeQuarantine comes first: the shim it starts counts the
// deaths of the failed pods it finds, and TestNodeBlame leaves some until its namespaces
// are deleted.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/test/lab"
)

// blamedNode and spareNode are the two nodes the node-blame cases kill pods on and move
// them to: lab-node-2 and lab-node-3 (on kind, its two workers). Nothing else runs there
// while these tests do.
func blamedNode() string { return oomNode }

func spareNode() string {
	if busyNode != oomNode {
		return busyNode
	}
	return quietNode
}

// preferNode lets the Job's pods run on node or other only, and prefers node: the first
// pod runs on node (checked by each case), and a replacement goes back there unless
// something keeps it off (the avoidance, a taint). The scheduler has no other reason to
// choose: both nodes are idle.
func preferNode(j *batchv1.Job, node, other string) *batchv1.Job {
	j.Spec.Template.Spec.NodeSelector = nil
	j.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{node, other}}},
		}}},
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{node}},
			}},
		}},
	}}
	return j
}

// withAnnotation sets a Job annotation.
func withAnnotation(j *batchv1.Job, k, v string) *batchv1.Job {
	if j.Annotations == nil {
		j.Annotations = map[string]string{}
	}
	j.Annotations[k] = v
	return j
}

// The quarantine's window and quiet period in TestNodeQuarantine.
const (
	quarantineWindow = 10 * time.Minute
	quarantineFor    = 45 * time.Second
)

// TestNodeQuarantine: coroner-shim restarted with --quarantine (3 deaths in 10m, lifted
// after 45s without one, at most 1 node at a time); three device failures on one node
// quarantine it, and, while it is, three on another spare that one.
func TestNodeQuarantine(t *testing.T) {
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	// The shim counts, when it starts, the deaths of the failed pods it finds within the
	// window: a node must not start with deaths of earlier tests (this test runs first of
	// those that kill pods of Jobs; an earlier failed test's namespace is kept).
	noBlamedDeaths(t, quarantineWindow)
	// Cleanups run last-registered first: the shim's flags are restored, then the taints
	// it left removed (it would not lift them without --quarantine).
	t.Cleanup(func() { removeQuarantines(t) })
	setShimArgs(t, "--quarantine", "--quarantine-deaths=3", "--quarantine-window="+quarantineWindow.String(),
		"--quarantine-for="+quarantineFor.String(), "--quarantine-max=1")
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"ThreeDeathsQuarantine", threeDeathsQuarantine},
		{"MaxSparesSecond", maxSparesSecond},
	} {
		if !t.Run(tc.name, tc.f) {
			t.Fatalf("%s failed: the rest of the chain is not run", tc.name)
		}
	}
}

// TestNodeBlame: the node-blame cases that need no other coroner-shim flags, at the same
// time on different nodes: a node OOM moves a replacement off its node (lab-node-2 and -3);
// on lab-node-1, one after the other (they share its test GPUs), a disruption budget
// counts the second device failure of an index, and a replacement that must avoid the only
// node it may run on is said to be unschedulable.
func TestNodeBlame(t *testing.T) {
	if suite.skip != "" {
		t.Skip(suite.skip)
	}
	t.Run("AvoidRequired", func(t *testing.T) {
		t.Parallel()
		avoidRequired(t)
	})
	t.Run("OnTheQuietNode", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			f    func(*testing.T, string)
		}{
			{"DisruptionBudget", disruptionBudget},
			{"AvoidedNodesUnschedulable", avoidedUnschedulable},
		} {
			t.Run(tc.name, func(t *testing.T) {
				healAll(t, quietNode)
				tc.f(t, quietNode)
			})
		}
	})
}

// avoidRequired: an Indexed Job with avoid-failed-nodes: required whose pod, on node X
// (preferred by the template), is killed by a node OOM (`coronerctl chaos oom --node`):
// the agent stamps DisruptionTarget NodeOOMKill, the Ignore rule replaces the pod without
// counting, and coroner-shim gives the replacement a required node affinity away from X
// in every required term (the template's own term kept): it runs on the other node,
// which the template does not prefer, and the Job completes.
func avoidRequired(t *testing.T) {
	x, y := blamedNode(), spareNode()
	ctx, ns := setup(t, 3*time.Minute)
	script := `if [ "${IGNORED:-0}" = 0 ]; then exec memhog -step-mib 2 -interval 50ms -max-mib 1024; fi
echo "replacement on $NODE: done"`
	j := preferNode(withIgnoredCount(job("avoid", ns).
		Indexed().Completions(1).BackoffLimitPerIndex(1).
		PodFailurePolicy(oomPolicy()...).
		Command("sh", "-c", script).Obj()), x, y)
	withResources(j, quantities("memory", "16Mi"), quantities("memory", "2Gi"))
	c := &j.Spec.Template.Spec.Containers[0]
	c.Env = append(c.Env, corev1.EnvVar{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
	withAnnotation(j, v1alpha1.AnnotationAvoidFailedNodes, string(v1alpha1.AvoidRequired))
	createJob(ctx, t, j)
	first := waitRunning(ctx, t, ns, j.Name, 1, time.Minute)[0]
	if first.Spec.NodeName != x {
		t.Fatalf("the first pod %s ran on %s, not on %s (preferred by its affinity)", first.Name, first.Spec.NodeName, x)
	}
	time.Sleep(2 * time.Second) // let it grow past everything else on the node
	coronerctl(ctx, t, "chaos", "oom", "-n", ns, first.Name, "--node")

	got := waitFinished(ctx, t, ns, j.Name, 2*time.Minute)
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	p := pod(ctx, t, ns, first.Name)
	wantCondition(t, p, corev1.DisruptionTarget, conditions.ReasonNodeOOMKill)
	pods := jobPods(ctx, t, ns, j.Name)
	if len(pods) != 2 {
		t.Fatalf("pods %v, want 2 (the first and its replacement)", podNames(pods))
	}
	r := &pods[1]
	wantReplacementOff(t, r, x, conditions.DisruptionNodeOOM, []string{x, y})
	if first.Annotations[v1alpha1.AnnotationAvoidedNodes] != "" || avoidsNode(&first, x) {
		t.Errorf("the first pod %s already avoids %s: %q", first.Name, x, first.Annotations[v1alpha1.AnnotationAvoidedNodes])
	}
	wantEvent(ctx, t, ns, j.Name, jobsync.EventReasonAvoidingNodes, x)
	if out := explainNodeBlame(ctx, t, ns, j.Name); !strings.Contains(out, x+" ("+string(conditions.DisruptionNodeOOM)+": "+first.Name) {
		t.Errorf("coronerctl explain does not say the replacement avoids %s for the %s of %s:\n%s", x, conditions.DisruptionNodeOOM, first.Name, out)
	}
	capture(ctx, t, "a node OOM, the replacement avoids the node (avoid-failed-nodes: required)",
		[]string{"kubectl", "get", "events", "-n", ns, "--sort-by=.lastTimestamp"},
		[]string{"kubectl", "get", "pods", "-n", ns, "-o", "wide"},
		[]string{"kubectl", "get", "pod", "-n", ns, r.Name, "-o", `jsonpath={.metadata.annotations.coroner\.dev/avoided-nodes}{"\n"}{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution}{"\n"}`},
		[]string{"coronerctl", "explain", "job", "-n", ns, j.Name})
}

// explainNodeBlame is the node-blame section of `coronerctl explain job` (its "Nodes
// avoided and disruption budgets" to the end); the test fails when there is none.
func explainNodeBlame(ctx context.Context, t *testing.T, ns, name string) string {
	t.Helper()
	out := coronerctl(ctx, t, "explain", "job", "-n", ns, name)
	_, section, ok := strings.Cut(out, "Nodes avoided and disruption budgets:")
	if !ok {
		t.Errorf("coronerctl explain job %s has no node-blame section", name)
	}
	return section
}

// wantReplacementOff fails the test unless the replacement r ran on a node other than x,
// carries coroner.dev/avoided-nodes x=class, and its required terms keep it off x while
// keeping the template's (wantAvoidsRequired).
func wantReplacementOff(t *testing.T, r *corev1.Pod, x string, class conditions.DisruptionClass, keep []string) {
	t.Helper()
	if r.Spec.NodeName == x || r.Spec.NodeName == "" {
		t.Errorf("the replacement %s ran on %q, want off %s, the node that killed its predecessor", r.Name, r.Spec.NodeName, x)
	}
	if got, want := r.Annotations[v1alpha1.AnnotationAvoidedNodes], x+"="+string(class); got != want {
		t.Errorf("the replacement %s: %s %q, want %q", r.Name, v1alpha1.AnnotationAvoidedNodes, got, want)
	}
	wantAvoidsRequired(t, r, x, keep)
}

// wantAvoidsRequired fails the test unless every required node selector term of p keeps
// it off node (a matchFields metadata.name NotIn, or a hostname NotIn, naming it) and the
// template's own term (hostname In keep) is still there.
func wantAvoidsRequired(t *testing.T, p *corev1.Pod, node string, keep []string) {
	t.Helper()
	var terms []corev1.NodeSelectorTerm
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}
	if len(terms) == 0 {
		t.Errorf("pod %s: no required node selector terms, want each to keep it off %s", p.Name, node)
		return
	}
	for i, term := range terms {
		if !termExcludes(term, node) {
			t.Errorf("pod %s: required term %d %+v does not keep it off %s", p.Name, i, term, node)
		}
		kept := slices.ContainsFunc(term.MatchExpressions, func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == hostnameLabel && r.Operator == corev1.NodeSelectorOpIn && slices.Equal(r.Values, keep)
		})
		if !kept {
			t.Errorf("pod %s: required term %d %+v lost the template's %s In %v", p.Name, i, term, hostnameLabel, keep)
		}
	}
}

// termExcludes reports whether the term keeps a pod off node.
func termExcludes(term corev1.NodeSelectorTerm, node string) bool {
	notIn := func(key string) func(corev1.NodeSelectorRequirement) bool {
		return func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == key && r.Operator == corev1.NodeSelectorOpNotIn && slices.Contains(r.Values, node)
		}
	}
	return slices.ContainsFunc(term.MatchFields, notIn("metadata.name")) || slices.ContainsFunc(term.MatchExpressions, notIn(hostnameLabel))
}

// avoidsNode reports whether any of p's node affinity terms, required or preferred, keeps
// it off node.
func avoidsNode(p *corev1.Pod, node string) bool {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil {
		return false
	}
	excludes := func(term corev1.NodeSelectorTerm) bool { return termExcludes(term, node) }
	if r := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution; r != nil && slices.ContainsFunc(r.NodeSelectorTerms, excludes) {
		return true
	}
	return slices.ContainsFunc(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution, func(pt corev1.PreferredSchedulingTerm) bool {
		return excludes(pt.Preference)
	})
}

// dieWithTheDeviceEveryTime is dieWithTheDevice for every attempt: a replacement holds a
// device too and dies when it fails.
const dieWithTheDeviceEveryTime = `f=/run/coroner-test-gpu/$CORONER_TEST_GPU
echo "attempt $((${IGNORED:-0} + ${FAILURES:-0} + 1)) on $CORONER_TEST_GPU"
i=0
while [ $i -lt 600 ]; do
  if [ "$(cat $f)" != Healthy ]; then echo "device $CORONER_TEST_GPU is $(cat $f)"; exit 1; fi
  sleep 0.1
  i=$((i+1))
done
exit 0`

// disruptionBudget: an Indexed Job whose podFailurePolicy Ignores DisruptionTarget, with
// backoffLimitPerIndex 0 and coroner.dev/disruption-budget "device=1": its pod's device
// fails, the failure is ignored and charged to the budget ("charged device"); the
// replacement, on the node's other device, dies of its device too: the budget is spent,
// the failure counts as if no rule matched ("spent device"), and the index fails. Without
// the budget, the rule would ignore every device failure.
func disruptionBudget(t *testing.T, node string) {
	ctx, ns := setup(t, 3*time.Minute)
	j := onNode(withFailureCount(withIgnoredCount(job("budget", ns).
		Indexed().Completions(1).BackoffLimitPerIndex(0).
		PodFailurePolicy(ignoreDisruptions()).
		Command("sh", "-c", dieWithTheDeviceEveryTime).Obj())), node)
	withResources(j, nil, corev1.ResourceList{testGPU: quantities("x", "1")["x"]})
	withAnnotation(j, v1alpha1.AnnotationDisruptionBudget, "device=1")
	first, dev := startOnGPU(ctx, t, j, node)
	coronerctl(ctx, t, "chaos", "device-fail", node, dev)

	p := waitPod(ctx, t, ns, first.Name, "Failed, stamped "+conditions.ReasonDeviceFailure, time.Minute, func(p *corev1.Pod) bool {
		c := condition(p, corev1.DisruptionTarget)
		return p == nil || p.Status.Phase == corev1.PodFailed && c != nil && c.Reason == conditions.ReasonDeviceFailure
	})
	if p == nil {
		t.Fatalf("pod %s gone before it was stamped", first.Name)
	}
	charged := v1alpha1.BudgetVerdict{Class: conditions.DisruptionDevice, Charged: true}.String()
	p = waitPod(ctx, t, ns, first.Name, "the budget verdict "+charged, eventWait, func(p *corev1.Pod) bool {
		return p == nil || p.Annotations[v1alpha1.AnnotationBudgetVerdict] != ""
	})
	if p == nil {
		t.Fatalf("pod %s gone before its budget verdict", first.Name)
	}
	if got := p.Annotations[v1alpha1.AnnotationBudgetVerdict]; got != charged {
		t.Fatalf("pod %s: %s %q, want %q", p.Name, v1alpha1.AnnotationBudgetVerdict, got, charged)
	}

	// The replacement: the first failure ignored (not counted), charged to the budget.
	var second corev1.Pod
	err := lab.Poll(ctx, time.Minute, "the replacement of "+first.Name+" running", func() (bool, error) {
		for _, q := range jobPods(ctx, t, ns, j.Name) {
			if q.UID != first.UID && q.Status.Phase == corev1.PodRunning && allStarted(&q) {
				second = q
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, j.Name))
	}
	if got := second.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation]; got != "1" {
		t.Errorf("the replacement %s: %s %q, want 1 (the first device failure ignored)", second.Name, batchv1.JobIndexIgnoredFailureCountAnnotation, got)
	}
	if got := second.Annotations[batchv1.JobIndexFailureCountAnnotation]; got != "0" {
		t.Errorf("the replacement %s: %s %q, want 0 (nothing counted yet)", second.Name, batchv1.JobIndexFailureCountAnnotation, got)
	}
	wantCharged := string(conditions.DisruptionDevice) + "=" + v1alpha1.ChargedID(string(first.UID))
	if got := second.Annotations[v1alpha1.AnnotationDisruptionsCharged]; got != wantCharged {
		t.Errorf("the replacement %s: %s %q, want %q", second.Name, v1alpha1.AnnotationDisruptionsCharged, got, wantCharged)
	}
	if mid, err := suite.cs.BatchV1().Jobs(ns).Get(ctx, j.Name, metav1.GetOptions{}); err == nil && (mid.Status.Failed != 0 || finished(mid) != nil) {
		t.Errorf("after the first device failure: failed %d, finished %v; want 0 and not finished (ignored, within the budget)", mid.Status.Failed, finished(mid))
	}
	dev2 := heldDevice(ctx, t, ns, second.Name, node)
	coronerctl(ctx, t, "chaos", "device-fail", node, dev2)

	got := waitFinished(ctx, t, ns, j.Name, 2*time.Minute)
	wantOutcome(t, got, outcome{Condition: "Failed", Reason: batchv1.JobReasonFailedIndexes, Failed: 1, FailedIndexes: "0"})
	p2 := pod(ctx, t, ns, second.Name)
	wantCondition(t, p2, corev1.DisruptionTarget, conditions.ReasonDeviceFailure)
	spent := v1alpha1.BudgetVerdict{Class: conditions.DisruptionDevice}.String()
	if got := p2.Annotations[v1alpha1.AnnotationBudgetVerdict]; got != spent {
		t.Errorf("pod %s: %s %q, want %q", p2.Name, v1alpha1.AnnotationBudgetVerdict, got, spent)
	}
	if pods := jobPods(ctx, t, ns, j.Name); len(pods) != 2 {
		t.Errorf("pods %v, want 2: the index failed at the second device failure", podNames(pods))
	}
	wantEvent(ctx, t, ns, j.Name, jobsync.EventReasonDisruptionBudgetSpent, string(conditions.DisruptionDevice))
	out := explainNodeBlame(ctx, t, ns, j.Name)
	for _, want := range []string{"device=1", "device 1/1 spent", first.Name, second.Name} {
		if !strings.Contains(out, want) {
			t.Errorf("coronerctl explain's node-blame section does not say %q:\n%s", want, out)
		}
	}
	capture(ctx, t, "a device=1 disruption budget: the second device failure of an index counts",
		[]string{"kubectl", "get", "events", "-n", ns, "--sort-by=.lastTimestamp"},
		[]string{"kubectl", "get", "pods", "-n", ns, "-o", `custom-columns=POD:.metadata.name,NODE:.spec.nodeName,PHASE:.status.phase,VERDICT:.metadata.annotations.coroner\.dev/disruption-budget-verdict,CHARGED:.metadata.annotations.coroner\.dev/disruptions-charged`},
		[]string{"coronerctl", "explain", "job", "-n", ns, j.Name})
}

// avoidedUnschedulable: a Job with avoid-failed-nodes: required whose pods may run on
// node only (nodeSelector); its pod dies of its device: the replacement must avoid the
// one node it may run on, and stays Pending. coroner-shim says so in a Warning Event, and
// explain says so too: the Job waits, and the user is told why.
func avoidedUnschedulable(t *testing.T, node string) {
	ctx, ns := setup(t, 2*time.Minute)
	j := withAnnotation(deviceJob("stuck", ns, node, dieWithTheDevice), v1alpha1.AnnotationAvoidFailedNodes, string(v1alpha1.AvoidRequired))
	// The Job goes before its namespace: a namespace deletes its pods first and waits for
	// them to be gone, and a pod deleted before it was scheduled keeps its Job's tracking
	// finalizer while the Job lives (coroner-shim and the built-in controller alike, seen
	// on the lab's v1.36.3): the namespace would stay Terminating.
	t.Cleanup(func() {
		_ = suite.cs.BatchV1().Jobs(ns).Delete(context.Background(), j.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
	j.Spec.BackoffLimitPerIndex = ptr.To[int32](1)
	first, dev := startOnGPU(ctx, t, j, node)
	coronerctl(ctx, t, "chaos", "device-fail", node, dev)

	var r corev1.Pod
	err := lab.Poll(ctx, time.Minute, "the replacement of "+first.Name+" unschedulable", func() (bool, error) {
		for _, p := range jobPods(ctx, t, ns, j.Name) {
			c := condition(&p, corev1.PodScheduled)
			if p.UID != first.UID && c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				r = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, describe(ns, j.Name))
	}
	if got, want := r.Annotations[v1alpha1.AnnotationAvoidedNodes], node+"="+string(conditions.DisruptionDevice); got != want {
		t.Errorf("the replacement %s: %s %q, want %q", r.Name, v1alpha1.AnnotationAvoidedNodes, got, want)
	}
	wantCondition(t, pod(ctx, t, ns, first.Name), corev1.DisruptionTarget, conditions.ReasonDeviceFailure)
	wantEvent(ctx, t, ns, j.Name, jobsync.EventReasonAvoidedNodesUnschedulable, r.Name, node)
	if out := explainNodeBlame(ctx, t, ns, j.Name); !strings.Contains(out, "cannot be scheduled: it avoids nodes "+node+" (") {
		t.Errorf("coronerctl explain does not say %s cannot be scheduled because it avoids %s:\n%s", r.Name, node, out)
	}
	capture(ctx, t, "a replacement that must avoid the only node it may run on",
		[]string{"kubectl", "get", "events", "-n", ns, "--field-selector", "involvedObject.kind=Job", "--sort-by=.lastTimestamp"},
		[]string{"coronerctl", "explain", "job", "-n", ns, j.Name})
	if got, err := suite.cs.BatchV1().Jobs(ns).Get(ctx, j.Name, metav1.GetOptions{}); err != nil || finished(got) != nil || got.Status.Failed != 0 {
		t.Errorf("the Job: %v; want it waiting, nothing counted", err)
	}
}

// threeDeathsQuarantine: two device failures on node X leave it alone, the third
// quarantines it: the taint coroner.dev/quarantined=device:NoSchedule, a NodeQuarantined
// Event, `coronerctl quarantine list` names it. A new Job that prefers X runs elsewhere.
// After the quiet period the taint is lifted (NodeQuarantineLifted).
func threeDeathsQuarantine(t *testing.T) {
	x, y := blamedNode(), spareNode()
	ctx, ns := setup(t, 3*time.Minute)
	healAll(t, x)
	start := time.Now()
	deviceDeaths(ctx, t, ns, "deaths-a", x, y, 2)
	// Two deaths are not enough.
	time.Sleep(5 * time.Second)
	if n := node(ctx, t, x); quarantineTaint(n) != nil {
		t.Fatalf("%s quarantined after two deaths: %+v", x, quarantineTaint(n))
	}
	deviceDeaths(ctx, t, ns, "deaths-b", x, y, 1)
	lastDeath := time.Now()

	var quarantinedAt time.Time
	waitNode(ctx, t, x, "tainted "+conditions.QuarantineTaintKey+"=device:NoSchedule", 30*time.Second, func(n *corev1.Node) bool {
		tn := quarantineTaint(n)
		if tn != nil && tn.TimeAdded != nil {
			quarantinedAt = tn.TimeAdded.Time
		}
		return tn != nil && tn.Value == string(conditions.DisruptionDevice) && tn.Effect == corev1.TaintEffectNoSchedule
	})
	if quarantinedAt.IsZero() {
		quarantinedAt = time.Now()
	}
	t.Logf("%s quarantined %v after its third death", x, time.Since(lastDeath).Round(100*time.Millisecond))
	wantNodeEvent(ctx, t, x, conditions.ReasonNodeQuarantined, start, string(conditions.DisruptionDevice))
	if out := coronerctl(ctx, t, "quarantine", "list"); quarantineListed(out, x) != string(conditions.DisruptionDevice) {
		t.Errorf("coronerctl quarantine list does not name %s, cause %s:\n%s", x, conditions.DisruptionDevice, out)
	}
	capture(ctx, t, "three device failures on "+x+" quarantine it",
		[]string{"kubectl", "get", "node", x, "-o", `jsonpath={.spec.taints}{"\n"}`},
		[]string{"coronerctl", "quarantine", "list"},
		[]string{"kubectl", "get", "events", "-n", ns, "--field-selector", "involvedObject.kind=Pod,reason=Stamped", "--sort-by=.lastTimestamp"},
		nodeEvents(x, conditions.ReasonNodeQuarantined))

	// A new Job that prefers X: its pod runs on Y.
	j := preferNode(job("after", ns).Command("true").Obj(), x, y)
	createJob(ctx, t, j)
	got := waitFinished(ctx, t, ns, j.Name, time.Minute)
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1})
	for _, p := range jobPods(ctx, t, ns, j.Name) {
		if p.Spec.NodeName == x {
			t.Errorf("the new Job's pod %s ran on the quarantined %s", p.Name, x)
		}
	}

	// Lifted after quarantineFor without a new death.
	waitNode(ctx, t, x, "the quarantine lifted", quarantineFor+45*time.Second, func(n *corev1.Node) bool {
		return quarantineTaint(n) == nil
	})
	held := time.Since(quarantinedAt)
	t.Logf("%s: quarantine lifted after %v", x, held.Round(100*time.Millisecond))
	if held < quarantineFor-2*time.Second {
		t.Errorf("%s: quarantine lifted after %v, before --quarantine-for=%v", x, held.Round(100*time.Millisecond), quarantineFor)
	}
	wantNodeEvent(ctx, t, x, conditions.ReasonNodeQuarantineLifted, quarantinedAt.Add(-time.Second))
	capture(ctx, t, "the quarantine of "+x+" lifted after --quarantine-for="+quarantineFor.String(),
		[]string{"kubectl", "get", "node", x, "-o", `jsonpath={.spec.taints}{"\n"}`},
		[]string{"coronerctl", "quarantine", "list"},
		nodeEvents(x, conditions.ReasonNodeQuarantineLifted))
}

// maxSparesSecond: with --quarantine-max=1, node Y is quarantined after three device
// failures; three on X then spare X (QuarantineSpared, no taint); `coronerctl quarantine
// lift Y` removes Y's taint.
func maxSparesSecond(t *testing.T) {
	x, y := blamedNode(), spareNode()
	ctx, ns := setup(t, 3*time.Minute)
	healAll(t, x)
	healAll(t, y)
	start := time.Now()
	deviceDeaths(ctx, t, ns, "deaths-y", y, x, 2)
	deviceDeaths(ctx, t, ns, "deaths-y2", y, x, 1)
	waitNode(ctx, t, y, "quarantined", 30*time.Second, func(n *corev1.Node) bool { return quarantineTaint(n) != nil })
	wantNodeEvent(ctx, t, y, conditions.ReasonNodeQuarantined, start)

	spareFrom := time.Now()
	deviceDeaths(ctx, t, ns, "deaths-x", x, y, 2)
	deviceDeaths(ctx, t, ns, "deaths-x2", x, y, 1)
	wantNodeEvent(ctx, t, x, conditions.ReasonQuarantineSpared, spareFrom)
	if n := node(ctx, t, x); quarantineTaint(n) != nil {
		t.Errorf("%s quarantined beside %s with --quarantine-max=1: %+v", x, y, quarantineTaint(n))
	}
	if n := node(ctx, t, y); quarantineTaint(n) == nil {
		t.Errorf("%s no longer quarantined", y)
	}

	capture(ctx, t, "--quarantine-max=1: "+y+" quarantined, "+x+" spared",
		[]string{"coronerctl", "quarantine", "list"},
		nodeEvents(y, conditions.ReasonNodeQuarantined),
		nodeEvents(x, conditions.ReasonQuarantineSpared))
	lift := coronerctl(ctx, t, "quarantine", "lift", y)
	waitNode(ctx, t, y, "the quarantine lifted by hand", 30*time.Second, func(n *corev1.Node) bool { return quarantineTaint(n) == nil })
	if out := coronerctl(ctx, t, "quarantine", "list"); quarantineListed(out, y) != "" {
		t.Errorf("coronerctl quarantine list still names %s after the lift:\n%s", y, out)
	}
	capture(ctx, t, "after `coronerctl quarantine lift "+y+"`, which said: "+strings.TrimSpace(lift),
		[]string{"kubectl", "get", "node", y, "-o", `jsonpath={.spec.taints}{"\n"}`},
		[]string{"coronerctl", "quarantine", "list"})
}

// deviceDeaths kills n (1 or 2: a node has two test GPUs) pods of a new Job on node with a
// device failure each, and waits until the agent stamped each: deaths that blame the
// node. Each index fails at its first failure (backoffLimitPerIndex 0, no rule to ignore
// it): no replacement takes a device of node or runs elsewhere. other is the node the
// Job's pods may run on too (node is preferred); node's test GPUs must be free when it
// starts.
func deviceDeaths(ctx context.Context, t *testing.T, ns, name, node, other string, n int32) {
	t.Helper()
	gpusFree(ctx, t, node)
	j := preferNode(job(name, ns).
		Indexed().Completions(n).Parallelism(n).BackoffLimitPerIndex(0).
		Command("sh", "-c", dieWithTheDevice).Obj(), node, other)
	withResources(j, nil, corev1.ResourceList{testGPU: quantities("x", "1")["x"]})
	createJob(ctx, t, j)
	pods := waitRunning(ctx, t, ns, j.Name, int(n), time.Minute)
	for _, p := range pods {
		if p.Spec.NodeName != node {
			t.Fatalf("pod %s ran on %s, not on %s (preferred by its affinity)", p.Name, p.Spec.NodeName, node)
		}
		heldDevice(ctx, t, ns, p.Name, node)
	}
	for _, p := range pods {
		coronerctl(ctx, t, "chaos", "device-fail", node, "pod/"+p.Name, "-n", ns)
	}
	for _, p := range pods {
		got := waitPod(ctx, t, ns, p.Name, "stamped "+conditions.ReasonDeviceFailure, time.Minute, func(p *corev1.Pod) bool {
			c := condition(p, corev1.DisruptionTarget)
			return p == nil || c != nil && c.Reason == conditions.ReasonDeviceFailure && p.Status.Phase == corev1.PodFailed
		})
		if got == nil {
			t.Fatalf("pod %s gone before its stamp", p.Name)
		}
	}
	coronerctl(ctx, t, "chaos", "device-heal", node)
}

// noBlamedDeaths waits until no failed pod whose death blames its node (a death the
// quarantine would count) within window is left in the cluster: the namespaces of the
// tests before are deleted as they end. It fails the test, naming them, when some stay.
func noBlamedDeaths(t *testing.T, window time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var left []string
	err := lab.Poll(ctx, 90*time.Second, "no deaths blamed on nodes left by earlier tests", func() (bool, error) {
		pods, err := suite.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		left = left[:0]
		kept := false
		for _, p := range pods.Items {
			if node, class, ok := conditions.NodeBlame(&p); ok && time.Since(diedAt(&p)) < window {
				left = append(left, fmt.Sprintf("%s/%s on %s (%s)", p.Namespace, p.Name, node, class))
				n, err := suite.cs.CoreV1().Namespaces().Get(ctx, p.Namespace, metav1.GetOptions{})
				kept = kept || err == nil && n.DeletionTimestamp == nil
			}
		}
		if kept {
			return false, fmt.Errorf("deaths blamed on nodes in namespaces not being deleted (kept by a failed test?)")
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("%v: the quarantine would count them: %v", err, left)
	}
}

// diedAt is the latest time the pod's status gives: its containers' ends and its
// conditions' transitions.
func diedAt(p *corev1.Pod) time.Time {
	var at time.Time
	for _, s := range p.Status.ContainerStatuses {
		if term := s.State.Terminated; term != nil && term.FinishedAt.After(at) {
			at = term.FinishedAt.Time
		}
	}
	for _, c := range p.Status.Conditions {
		if c.LastTransitionTime.After(at) {
			at = c.LastTransitionTime.Time
		}
	}
	return at
}

// gpusFree waits until the scheduler may give both of node's test GPUs to new pods: the
// kubelet reports them allocatable again (after a device-heal) and no pod that is not
// finished requests one there.
func gpusFree(ctx context.Context, t *testing.T, node string) {
	t.Helper()
	var last string
	err := lab.Poll(ctx, 30*time.Second, node+"'s test GPUs free", func() (bool, error) {
		n, err := suite.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q := n.Status.Allocatable[testGPU]
		pods, err := suite.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return false, nil
		}
		var holders []string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			for _, c := range p.Spec.Containers {
				if _, ok := c.Resources.Limits[testGPU]; ok {
					holders = append(holders, p.Namespace+"/"+p.Name)
				}
			}
		}
		last = fmt.Sprintf("allocatable %s, held by %v", q.String(), holders)
		return q.Value() == lab.TestGPUs && len(holders) == 0, nil
	})
	if err != nil {
		t.Fatalf("%v: %s", err, last)
	}
}

// capture appends, when CORONER_E2E_CAPTURE names a file, what the lab says to each
// command (kubectl's or coronerctl's, by the first word) to it: the README's examples come
// from a real run (CORONER_E2E_CAPTURE=/tmp/capture.txt go test -run 'TestNode' ...).
func capture(ctx context.Context, t *testing.T, title string, cmds ...[]string) {
	t.Helper()
	file := os.Getenv("CORONER_E2E_CAPTURE")
	if file == "" {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "### %s (%s, %s)\n", title, t.Name(), time.Now().UTC().Format(time.RFC3339))
	for _, c := range cmds {
		bin := filepath.Join(suite.cfg.BinDir, c[0])
		cmd := exec.CommandContext(ctx, bin, c[1:]...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+suite.kubeconfig)
		out, err := cmd.CombinedOutput()
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(c, " "), out)
		if len(out) > 0 && out[len(out)-1] != '\n' {
			b.WriteString("\n")
		}
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	b.WriteString("\n")
	captureMu.Lock()
	defer captureMu.Unlock()
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err == nil {
		_, err = f.WriteString(b.String())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Errorf("capture to %s: %v", file, err)
	}
}

var captureMu sync.Mutex

// nodeEvents is the kubectl command that lists the Events with reason on node.
func nodeEvents(node, reason string) []string {
	return []string{"kubectl", "get", "events", "-A", "--field-selector", "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + reason, "--sort-by=.lastTimestamp"}
}

// quarantineListed is the cause `coronerctl quarantine list` gives for node (its line's
// first two columns: NODE CAUSE), "" when it does not list it.
func quarantineListed(out, node string) string {
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == node {
			return f[1]
		}
	}
	return ""
}

// node gets a node.
func node(ctx context.Context, t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := suite.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	return n
}

// quarantineTaint is the node's coroner.dev/quarantined taint, or nil.
func quarantineTaint(n *corev1.Node) *corev1.Taint {
	for i, tn := range n.Spec.Taints {
		if tn.Key == conditions.QuarantineTaintKey {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// wantNodeEvent fails the test unless an Event with reason about node, last seen at or
// after since, holds every part in its message; it waits up to eventWait for it.
func wantNodeEvent(ctx context.Context, t *testing.T, name, reason string, since time.Time, parts ...string) {
	t.Helper()
	var seen []string
	err := lab.Poll(ctx, eventWait, "a "+reason+" Event on "+name, func() (bool, error) {
		l, err := suite.cs.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + name})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, e := range l.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason != reason || eventTime(&e).Before(since.Add(-time.Second)) {
				continue
			}
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(e.Message, p)
			}
			if ok {
				t.Logf("Event on %s: %s %s: %s", name, e.Type, e.Reason, e.Message)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("%v (since %s, with %q); Events on %s:\n  %s", err, since.Format(time.TimeOnly), parts, name, strings.Join(seen, "\n  "))
	}
}

// eventTime is when the Event was last seen.
func eventTime(e *corev1.Event) time.Time {
	at := e.CreationTimestamp.Time
	for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time} {
		if t.After(at) {
			at = t
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(at) {
		at = e.Series.LastObservedTime.Time
	}
	return at
}

// removeQuarantines removes coroner.dev/quarantined from every node.
func removeQuarantines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nodes, err := suite.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Errorf("list nodes: %v", err)
		return
	}
	for _, n := range nodes.Items {
		if quarantineTaint(&n) == nil {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := suite.cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(tn corev1.Taint) bool { return tn.Key == conditions.QuarantineTaintKey })
			_, err = suite.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Errorf("remove %s from %s: %v", conditions.QuarantineTaintKey, n.Name, err)
		} else {
			t.Logf("removed %s from %s", conditions.QuarantineTaintKey, n.Name)
		}
	}
}

// setShimArgs restarts coroner-shim with extra flags after those deploy/ gives it, waits
// until a replica with them leads, and restores the flags when the test ends.
func setShimArgs(t *testing.T, extra ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var orig []string
	update := func(ctx context.Context, args func(orig []string) []string) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			d, err := suite.cs.AppsV1().Deployments(lab.ShimNamespace).Get(ctx, "coroner-shim", metav1.GetOptions{})
			if err != nil {
				return err
			}
			c := shimContainer(d)
			if c == nil {
				return fmt.Errorf("deployment coroner-shim has no container %s", lab.ShimContainer)
			}
			if orig == nil {
				orig = slices.Clone(c.Args)
			}
			c.Args = args(orig)
			_, err = suite.cs.AppsV1().Deployments(lab.ShimNamespace).Update(ctx, d, metav1.UpdateOptions{})
			return err
		})
	}
	want := func(orig []string) []string { return append(slices.Clone(orig), extra...) }
	if err := update(ctx, want); err != nil {
		t.Fatalf("coroner-shim with %v: %v", extra, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := update(ctx, func([]string) []string { return orig }); err != nil {
			t.Errorf("restore coroner-shim's flags: %v", err)
			return
		}
		if err := waitShimLeads(ctx, orig); err != nil {
			t.Errorf("coroner-shim with its flags restored: %v", err)
		}
	})
	start := time.Now()
	if err := waitShimLeads(ctx, want(orig)); err != nil {
		t.Fatalf("coroner-shim with %v: %v", extra, err)
	}
	t.Logf("coroner-shim leads with %v, %v after the change", extra, time.Since(start).Round(100*time.Millisecond))
}

func shimContainer(d *appsv1.Deployment) *corev1.Container {
	for i, c := range d.Spec.Template.Spec.Containers {
		if c.Name == lab.ShimContainer {
			return &d.Spec.Template.Spec.Containers[i]
		}
	}
	return nil
}

// waitShimLeads waits until coroner-shim's rollout is done (every replica updated and
// available, no old one left) and the leader Lease is held by a replica run with args. A
// replica whose shim exits (a flag it does not know) ends the wait with its message.
func waitShimLeads(ctx context.Context, args []string) error {
	var last string
	err := lab.Poll(ctx, 2*time.Minute, "coroner-shim rolled out and led by a replica with the new flags", func() (bool, error) {
		d, err := suite.cs.AppsV1().Deployments(lab.ShimNamespace).Get(ctx, "coroner-shim", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pods, err := suite.cs.CoreV1().Pods(lab.ShimNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=coroner-shim"})
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			for _, s := range p.Status.ContainerStatuses {
				for _, term := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
					if s.Name == lab.ShimContainer && term != nil && term.ExitCode != 0 && slices.Equal(podShimArgs(&p), args) {
						logs, _ := suite.cs.CoreV1().Pods(lab.ShimNamespace).GetLogs(p.Name, &corev1.PodLogOptions{
							Container: lab.ShimContainer, Previous: term == s.LastTerminationState.Terminated, TailLines: ptr.To[int64](5),
						}).DoRaw(ctx)
						return false, fmt.Errorf("pod %s: the shim exited %d: %s\n%s", p.Name, term.ExitCode, term.Message, logs)
					}
				}
			}
		}
		want := ptr.Deref(d.Spec.Replicas, 1)
		s := d.Status
		last = fmt.Sprintf("generation %d observed %d, replicas %d updated %d available %d", d.Generation, s.ObservedGeneration, s.Replicas, s.UpdatedReplicas, s.AvailableReplicas)
		if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.Replicas != want || s.AvailableReplicas != want ||
			len(pods.Items) != int(want) {
			return false, nil // old replicas still terminating count too: what follows may list the shim's pods
		}
		holder, _, err := lab.LeaseHolder(ctx, suite.cs, lab.ShimNamespace, lab.ShimLease)
		if err != nil || holder == "" {
			return false, nil
		}
		leader, err := suite.cs.CoreV1().Pods(lab.ShimNamespace).Get(ctx, lab.PodOfIdentity(holder), metav1.GetOptions{})
		last += ", leader " + holder
		return err == nil && leader.DeletionTimestamp == nil && slices.Equal(podShimArgs(leader), args), nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, last)
	}
	return nil
}

func podShimArgs(p *corev1.Pod) []string {
	for _, c := range p.Spec.Containers {
		if c.Name == lab.ShimContainer {
			return c.Args
		}
	}
	return nil
}
