package e2e

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// oomPolicy fails the Job when a pod exceeded its own memory limit (a bug: more retries
// will not help) and ignores disruptions, a node OOM among them.
func oomPolicy() []*wrappers.RuleWrapper {
	return []*wrappers.RuleWrapper{
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionFailJob, conditions.OOMKilled),
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
	}
}

// A pod over its own 24Mi memory limit: the kernel kills it in the pod's cgroup, the agent
// stamps coroner.dev/OOMKilled (MemoryLimitExceeded), and the FailJob rule on that
// condition fails the Job at once. The built-in controller could only see exit code 137,
// the same as a node OOM.
func TestLimitOOMFailsJob(t *testing.T) {
	t.Parallel()
	ctx, ns := setup(t, 3*time.Minute)
	j := onNode(withResources(job("limit-oom", ns).
		BackoffLimit(3).
		PodFailurePolicy(oomPolicy()...).
		Command("memhog").Obj(), nil, quantities("memory", "24Mi")), quietNode)
	createJob(ctx, t, j)

	got := waitFinished(ctx, t, ns, j.Name, 2*time.Minute)
	wantOutcome(t, got, outcome{Condition: "Failed", Reason: conditions.JobReasonPodFailurePolicy, Failed: 1})
	pods := jobPods(ctx, t, ns, j.Name)
	if len(pods) != 1 {
		t.Fatalf("%d pods, want 1", len(pods))
	}
	p := &pods[0]
	wantCondition(t, p, conditions.OOMKilled, conditions.ReasonMemoryLimitExceeded)
	wantNoCondition(t, p, corev1.DisruptionTarget)
	if term := terminated(p); term == nil || term.ExitCode != 137 {
		t.Errorf("main container terminated %+v, want exit 137", term)
	}
	wantEvent(ctx, t, ns, j.Name, conditions.EventReasonPodFailurePolicy, string(conditions.OOMKilled), "FailJob")
}

// nodeOOM (part of TestDisruptions): the node runs out of memory (the lab lowers the
// limit of the node's kubepods cgroup with `coronerctl chaos oom --node`) and the kernel
// kills the pod that grows: the agent stamps DisruptionTarget NodeOOMKill, not
// coroner.dev/OOMKilled, so the same policy that fails the Job on a limit OOM ignores this
// one, and the replacement pod completes the Job.
func nodeOOM(t *testing.T) {
	ctx, ns := setup(t, 3*time.Minute)
	const script = `if [ "${IGNORED:-0}" = 0 ]; then exec memhog -step-mib 2 -interval 50ms -max-mib 1024; fi
echo "attempt after a node OOM: done"`
	j := onNode(withIgnoredCount(job("node-oom", ns).
		Indexed().Completions(1).BackoffLimitPerIndex(1).
		PodFailurePolicy(oomPolicy()...).
		Command("sh", "-c", script).Obj()), oomNode)
	createJob(ctx, t, j)
	first := waitRunning(ctx, t, ns, j.Name, 1, time.Minute)[0]
	time.Sleep(2 * time.Second) // let it grow past everything else on the node

	out := coronerctl(ctx, t, "chaos", "oom", "-n", ns, first.Name, "--node")
	if !strings.Contains(out, "kubepods") {
		t.Errorf("coronerctl chaos oom --node did not say it lowered the node's kubepods limit:\n%s", out)
	}

	got := waitFinished(ctx, t, ns, j.Name, 2*time.Minute)
	wantOutcome(t, got, outcome{Condition: "Complete", Reason: batchv1.JobReasonCompletionsReached, Succeeded: 1, CompletedIndexes: "0"})
	p := pod(ctx, t, ns, first.Name)
	wantCondition(t, p, corev1.DisruptionTarget, conditions.ReasonNodeOOMKill)
	wantNoCondition(t, p, conditions.OOMKilled)
	if term := terminated(p); term == nil || term.ExitCode != 137 {
		t.Errorf("first pod: main container terminated %+v, want exit 137", term)
	}
	pods := jobPods(ctx, t, ns, j.Name)
	if len(pods) != 2 || pods[1].Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation] != "1" {
		t.Errorf("want 2 pods, the second with %s=1; got %d", batchv1.JobIndexIgnoredFailureCountAnnotation, len(pods))
	}
	wantEvent(ctx, t, ns, j.Name, conditions.EventReasonPodFailurePolicy, conditions.ReasonNodeOOMKill, "Ignore")
}
