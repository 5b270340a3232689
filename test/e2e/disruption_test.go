package e2e

import (
	"bytes"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/cmd/coronerctl/chaos"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/images"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// ignoreDisruptions is the policy of a Job that must survive disruptions: a pod with
// DisruptionTarget is replaced without counting, anything else counts.
func ignoreDisruptions() *wrappers.RuleWrapper {
	return wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)
}

// disruptedOnce is a Job of n indexes whose first attempt runs disturb (and then sleeps)
// and whose attempts after an ignored failure succeed at once.
func disruptedOnce(name, ns string, n int32, disturb string) *batchv1.Job {
	script := `if [ "${IGNORED:-0}" = 0 ]; then ` + disturb + `; sleep 600; fi
echo "attempt after a disruption: done"`
	return withIgnoredCount(job(name, ns).
		Indexed().Completions(n).Parallelism(n).BackoffLimitPerIndex(1).
		PodFailurePolicy(ignoreDisruptions()).
		Command("sh", "-c", script).Obj())
}

// The kubelet evicts a pod whose emptyDir outgrows its sizeLimit: the pod gets
// DisruptionTarget TerminationByKubelet (from the kubelet, or from the agent on kubelets
// that do not add it), the Ignore rule replaces it without counting, and the Job
// completes; the built-in controller agrees. On every node configuration.
func TestKubeletEvictionIgnored(t *testing.T) {
	t.Parallel()
	onEachNode(t, kubeletEviction)
}

func kubeletEviction(t *testing.T, node string) {
	ctx, ns := setup(t, budget(node, 4*time.Minute))
	j := onNode(disruptedOnce("evicted", ns, 1, "dd if=/dev/zero of=/scratch/fill bs=1M count=24"), node)
	spec := &j.Spec.Template.Spec
	spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptrQuantity("8Mi")}}}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}

	got := runBoth(ctx, t, j, budget(node, 3*time.Minute))
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	pods := jobPods(ctx, t, ns, j.Name)
	if len(pods) != 2 {
		t.Fatalf("%d pods, want 2 (the evicted one and its replacement)", len(pods))
	}
	evicted := &pods[0]
	if evicted.Status.Phase != corev1.PodFailed || evicted.Status.Reason != "Evicted" {
		t.Errorf("first pod phase %s reason %q, want Failed/Evicted", evicted.Status.Phase, evicted.Status.Reason)
	}
	wantCondition(t, evicted, corev1.DisruptionTarget, conditions.ReasonTerminationByKubelet)
	wantEvent(ctx, t, ns, j.Name, conditions.EventReasonPodFailurePolicy, conditions.ReasonTerminationByKubelet, "Ignore")
}

// preemption (part of TestDisruptions): a pod of higher priority needs the node's CPU, the
// scheduler preempts the Job's two pods (DisruptionTarget PreemptionByScheduler), the
// Ignore rule replaces them without counting; once the preemptor is gone they complete.
func preemption(t *testing.T) {
	notOnKind(t, "the preemptor's image (the lab's pause) is not in the kind nodes")
	ctx, ns := setup(t, 4*time.Minute)
	j := onNode(withResources(disruptedOnce("preempted", ns, 2, "true"), quantities("cpu", "100m"), nil), busyNode)
	createJob(ctx, t, j)
	victims := waitRunning(ctx, t, ns, j.Name, 2, time.Minute)

	var out bytes.Buffer
	undo, err := chaos.Preempt(ctx, suite.cs, &out, busyNode, chaos.PreemptOptions{
		Namespace: ns, Image: images.PauseName, PullPolicy: corev1.PullNever, Timeout: time.Minute,
	})
	t.Logf("chaos preempt %s:\n%s", busyNode, out.String())
	if err != nil {
		t.Fatalf("preempt: %v", err)
	}
	// The scheduler stamps the victims and deletes them: they may be gone at once, in which
	// case the shim's Events say what it saw on them.
	for _, v := range victims {
		p := waitPod(ctx, t, ns, v.Name, "preempted", time.Minute, func(p *corev1.Pod) bool {
			return p == nil || condition(p, corev1.DisruptionTarget) != nil
		})
		if p != nil && p.UID == v.UID {
			wantCondition(t, p, corev1.DisruptionTarget, conditions.ReasonPreemptionByScheduler)
		}
	}
	out.Reset()
	if _, err := chaos.Unpreempt(ctx, suite.cs, &out, busyNode, ns); err != nil {
		t.Fatalf("%s: %v\n%s", undo, err, out.String())
	}
	got := waitFinished(ctx, t, ns, j.Name, 2*time.Minute)
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 2, CompletedIndexes: "0,1"})
	for _, v := range victims {
		wantEvent(ctx, t, ns, j.Name, conditions.EventReasonPodFailurePolicy,
			"pod "+ns+"/"+v.Name, conditions.ReasonPreemptionByScheduler, "rule 0 (Ignore)")
	}
}

// drain (part of TestDisruptions): the node of the Job's pod is drained with `coronerctl
// chaos drain`: the eviction API stamps DisruptionTarget EvictionByEvictionAPI, the Ignore
// rule replaces the pod without counting, on another node, and the Job completes.
func drain(t *testing.T) {
	notOnKind(t, "the drained pod's replacement needs a second disturbed node")
	ctx, ns := setup(t, 4*time.Minute)
	j := disruptedOnce("drained", ns, 1, "true")
	// Not on the quiet node, whose tests a drain would disturb.
	j.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{oomNode, busyNode}}},
		}}},
	}}
	createJob(ctx, t, j)
	first := waitRunning(ctx, t, ns, j.Name, 1, time.Minute)[0]
	node := first.Spec.NodeName

	out := coronerctl(ctx, t, "chaos", "drain", node)
	if !strings.Contains(out, "coronerctl chaos uncordon "+node) {
		t.Errorf("drain did not say how to undo it:\n%s", out)
	}
	t.Cleanup(func() { _, _ = chaos.Uncordon(ctx, suite.cs, &bytes.Buffer{}, node) })

	got := waitFinished(ctx, t, ns, j.Name, 2*time.Minute)
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	// The evicted pod is gone (drain waits for that): the shim's Event says what it saw.
	wantEvent(ctx, t, ns, j.Name, conditions.EventReasonPodFailurePolicy,
		"pod "+ns+"/"+first.Name, conditions.ReasonEvictionByEvictionAPI, "rule 0 (Ignore)")
	pods := jobPods(ctx, t, ns, j.Name)
	if len(pods) != 1 || pods[0].Name == first.Name {
		t.Fatalf("pods %v, want only the replacement of %s", podNames(pods), first.Name)
	}
	if pods[0].Spec.NodeName == node {
		t.Errorf("the replacement ran on the drained node %s", node)
	}
	coronerctl(ctx, t, "chaos", "uncordon", node)
	n, err := suite.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil || n.Spec.Unschedulable {
		t.Errorf("%s still cordoned after uncordon (%v)", node, err)
	}
}
