package shim_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/informers"
	"github.com/coroner-dev/coroner/shim/recoverer"
	"github.com/coroner-dev/coroner/shim/recovery"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// The tests of node-failure recovery (Z1-Z4) play the node controller too: they make
// Nodes, taint them unreachable, and write the agents' Leases.

// recoveryFixture is a fixture whose controller recovers with short times, reading agent
// Leases from the test's namespace.
func recoveryFixture(t *testing.T) *fixture {
	t.Helper()
	return recoveryFixtureWith(t, controller.Config{})
}

// recoveryFixtureWith is recoveryFixture with the Job controller's config (newFixture's
// defaults for its zero fields).
func recoveryFixtureWith(t *testing.T, jobs controller.Config) *fixture {
	t.Helper()
	if builtinTarget {
		t.Skip("node-failure recovery is coroner's own")
	}
	// Each test reads agent Leases from a namespace of its own (made by agentNamespace).
	return newShimFixture(t, shim.Config{
		Jobs: jobs,
		Recovery: recoverer.Config{Recovery: recovery.Config{Threshold: 2 * time.Second, FenceMargin: time.Second, StaleAfter: 3 * time.Second,
			OrphanQuarantine: time.Second}},
		Informers: informers.Config{AgentNamespace: fmt.Sprintf("agents-%d-%d", os.Getpid(), agentNamespaceSeq.Add(1))},
	})
}

var agentNamespaceSeq atomic.Int32

// agentNamespace creates the namespace the fixture's controller reads agent Leases from.
func (f *fixture) agentNamespace() string {
	f.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.cfg.Informers.AgentNamespace}}
	if _, err := f.client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("creating namespace %s: %v", ns.Name, err)
	}
	f.t.Cleanup(func() {
		_ = f.client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

// node creates a Node named after the test's namespace, with taints, removed at the end.
func (f *fixture) node(suffix string, taints ...corev1.Taint) string {
	f.t.Helper()
	name := f.ns + "-" + suffix
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints}}
	if _, err := f.client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		f.t.Fatalf("creating node %s: %v", name, err)
	}
	f.t.Cleanup(func() { _ = f.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return name
}

// taintUnreachable adds the taints the node controller adds to a node it lost.
func (f *fixture) taintUnreachable(node string) {
	f.t.Helper()
	n, err := f.client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	now := metav1.Now()
	n.Spec.Taints = append(n.Spec.Taints,
		corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
		corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: &now})
	if _, err := f.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		f.t.Fatalf("tainting %s: %v", node, err)
	}
}

func optedInJob(name, ns string) *wrappers.JobWrapper {
	w := wrappers.MakeJob(name, ns).BackoffLimit(3).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget))
	w.Spec.Template.Annotations = map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}
	return w
}

// waitRecovered waits until the pod is Failed with ForcefullyTerminated (reason) and
// has been force-deleted (gone, or kept only by its finalizer with grace period 0).
func (f *fixture) waitRecovered(job *batchv1.Job, pod *corev1.Pod, reason string, timeout time.Duration) *corev1.Pod {
	f.t.Helper()
	var last *corev1.Pod
	f.waitJob(job, timeout, "pod "+pod.Name+" recovered ("+reason+") and force-deleted", func(_ *batchv1.Job, _ []*corev1.Pod) bool {
		r := f.mirror.record(pod.UID)
		last = r.last
		// The status write comes first, the forced deletion right after it.
		forced := r.gone || (last.DeletionTimestamp != nil && ptr.Deref(last.DeletionGracePeriodSeconds, -1) == 0)
		return last.Status.Phase == corev1.PodFailed && podHasCondition(last, conditions.ForcefullyTerminated, reason) && forced
	})
	return last
}

func podHasCondition(p *corev1.Pod, t corev1.PodConditionType, reason string) bool {
	c := conditions.Find(&p.Status, t)
	return c != nil && c.Status == corev1.ConditionTrue && c.Reason == reason
}

// Z1: an opted-in pod being deleted on an unreachable node is failed and force-deleted
// once its deletionTimestamp plus the threshold has passed; the Ignore rule on
// DisruptionTarget replaces it without counting; a pod that is not opted in is left
// terminating.
func TestZombieRecovery(t *testing.T) {
	t.Parallel()
	f := recoveryFixture(t)
	node := f.node("zombie")
	job := f.createJob(optedInJob("zombie", f.ns).PodReplacementPolicy(batchv1.Failed))
	first := f.waitActive(job, 1, settle)[0]
	f.bindPod(first, node)
	f.runPod(first, true)

	f.taintUnreachable(node)
	// The taint manager's eviction, or a user: a graceful deletion the kubelet never ends.
	deleted := time.Now()
	if err := f.client.CoreV1().Pods(f.ns).Delete(context.Background(), first.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
		t.Fatal(err)
	}
	got := f.waitRecovered(job, first, conditions.ReasonNodeUnreachable, settle)
	// deletionTimestamp has whole seconds: up to 1s earlier than deletion + grace.
	if took := time.Since(deleted); took < 2*time.Second {
		t.Errorf("recovered %v after the deletion, before grace (1s) + threshold (2s) - 1s", took)
	}
	if !podHasCondition(got, corev1.DisruptionTarget, conditions.ReasonNodeUnreachable) {
		t.Errorf("recovered pod without DisruptionTarget: %+v", got.Status.Conditions)
	}
	second := f.waitNewActive(job, -1, f.replacementWait(1), first)
	f.waitEvent(job, corev1.EventTypeWarning, conditions.EventReasonForcefullyTerminated,
		"pod "+f.ns+"/"+first.Name+": "+conditions.Find(&got.Status, conditions.ForcefullyTerminated).Message)

	f.runPod(second, true)
	f.succeedPod(second)
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantCounters(job, counters{Succeeded: 1})

	// Not opted in: left alone.
	plain := f.createJob(wrappers.MakeJob("plain", f.ns).BackoffLimit(3).PodReplacementPolicy(batchv1.Failed))
	p := f.waitActive(plain, 1, settle)[0]
	f.bindPod(p, node)
	f.runPod(p, true)
	if err := f.client.CoreV1().Pods(f.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
		t.Fatal(err)
	}
	f.consistently(plain, 5*time.Second, "the pod that is not opted in stays terminating", func(_ *batchv1.Job, pods []*corev1.Pod) bool {
		return len(pods) == 1 && pods[0].Status.Phase == corev1.PodRunning
	})
	// Its kubelet comes back and ends it, so the final checks find no pod terminating.
	f.failPod(p, 137)
	f.finishDeletion(p)
	again := f.waitNewActive(plain, -1, f.replacementWait(1), p)
	f.succeedPod(again)
	f.waitFinished(plain, batchv1.JobComplete, settle)
}

// Z2: the node's agent stopped renewing its fencing Lease longer ago than its fence-after
// plus the margin, and the node is unreachable: an opted-in pod that nobody deleted is
// recovered at once (NodeFenced), without waiting for a toleration.
func TestFencedNodeRecovery(t *testing.T) {
	t.Parallel()
	f := recoveryFixture(t)
	node := f.node("fenced")
	job := f.createJob(optedInJob("fenced", f.ns))
	first := f.waitActive(job, 1, settle)[0]
	f.bindPod(first, node)
	f.runPod(first, true)

	f.agentLease(node, 5*time.Second)
	f.taintUnreachable(node)
	// Fenced once renewTime + 10s + 1s margin has passed: about 6s from now, not before.
	f.consistently(job, 4*time.Second, "the pod left alone while the agent may still run it", func(_ *batchv1.Job, pods []*corev1.Pod) bool {
		return len(pods) == 1 && pods[0].Status.Phase == corev1.PodRunning
	})
	got := f.waitRecovered(job, first, conditions.ReasonNodeFenced, settle)
	if msg := conditions.Find(&got.Status, conditions.ForcefullyTerminated).Message; !strings.Contains(msg, "fenced") || !strings.Contains(msg, node) {
		t.Errorf("message %q does not say the node is fenced", msg)
	}
	second := f.waitNewActive(job, -1, f.replacementWait(1), first)
	f.runPod(second, true)
	f.succeedPod(second)
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantCounters(job, counters{Succeeded: 1})
}

// agentLease writes node's agent Lease as an agent with --fence-after=10s leaves it when
// it last renewed ago: fenced once ago passes 10s + the fixture's 1s margin.
func (f *fixture) agentLease(node string, ago time.Duration) {
	f.t.Helper()
	agents := f.agentNamespace()
	renewed := metav1.NewMicroTime(time.Now().Add(-ago))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: conditions.AgentLeaseName(node), Namespace: agents,
			Annotations: map[string]string{conditions.AnnotationFenceAfter: "10s"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](10), RenewTime: &renewed},
	}
	if _, err := f.client.CoordinationV1().Leases(agents).Create(context.Background(), lease, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// Z2 on the kubelet's heartbeat (--fence-signal=node-lease): the agent's Lease says it
// fences on its kubelet's node Lease and names its pod; the shim reads that node Lease
// (kube-node-lease) and the pod on demand. The pod of a node whose kubelet last renewed 5s
// ago is recovered once 10s + the 1s margin have passed, not before; the agent's pod shows
// the node lifecycle controller's mark (Ready=False, no reason, after the last renewal),
// which still counts as alive. On a second node the agent's kubelet had reported it not
// ready (ContainersNotReady) before the node went silent: a dead agent fences nothing, and
// its node's pod is left alone.
func TestFencedNodeRecoveryOnNodeLease(t *testing.T) {
	t.Parallel()
	f := recoveryFixture(t)
	agents := f.agentNamespace()
	node, dead := f.node("kubelet-fenced"), f.node("agent-dead")
	job := f.createJob(optedInJob("kubelet-fenced", f.ns).Parallelism(2).Completions(2))
	pods := f.waitActive(job, 2, settle)
	f.bindPod(pods[0], node)
	f.bindPod(pods[1], dead)
	f.runPod(pods[0], true)
	f.runPod(pods[1], true)

	heard := time.Now().Add(-5 * time.Second)
	f.nodeLeaseAgent(agents, node, heard, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse,
		LastTransitionTime: metav1.NewTime(heard.Add(4 * time.Second))})
	f.nodeLeaseAgent(agents, dead, heard, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse,
		Reason: "ContainersNotReady", LastTransitionTime: metav1.NewTime(heard.Add(-20 * time.Second))})
	f.taintUnreachable(node)
	f.taintUnreachable(dead)
	f.consistently(job, 4*time.Second, "the pods left alone while the agents may still run them", func(_ *batchv1.Job, pods []*corev1.Pod) bool {
		return len(pods) == 2 && pods[0].Status.Phase == corev1.PodRunning && pods[1].Status.Phase == corev1.PodRunning
	})
	got := f.waitRecovered(job, pods[0], conditions.ReasonNodeFenced, settle)
	if took := time.Since(heard); took < 11*time.Second-time.Second {
		t.Errorf("recovered %v after the kubelet's last renewal, before fence-after 10s + margin 1s", took)
	}
	if msg := conditions.Find(&got.Status, conditions.ForcefullyTerminated).Message; !strings.Contains(msg, "kube-node-lease/"+node) {
		t.Errorf("message %q does not name the kubelet's Lease", msg)
	}
	f.consistentlyPods(3*time.Second, "the pod of the node whose agent was not ready left running", pods[1])
}

// nodeLeaseAgent makes what an agent with --fence-signal=node-lease --fence-after=10s and
// its kubelet leave behind on node: the agent's pod (Running, with the Ready condition
// ready), its Lease naming it, and the kubelet's node Lease last renewed at heard.
func (f *fixture) nodeLeaseAgent(agents, node string, heard time.Time, ready corev1.PodCondition) {
	f.t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "coroner-agent-" + node, Namespace: agents},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "agent", Image: "coroner-agent"}}}}
	pod, err := f.client.CoreV1().Pods(agents).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{ready}
	if _, err := f.client.CoreV1().Pods(agents).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		_ = f.client.CoreV1().Pods(agents).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	started := metav1.NewMicroTime(heard.Add(-time.Hour))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: conditions.AgentLeaseName(node), Namespace: agents,
			Annotations: map[string]string{conditions.AnnotationFenceOnNodeLease: "10s", conditions.AnnotationAgentPod: agents + "/" + pod.Name}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](10), RenewTime: &started},
	}
	if _, err := f.client.CoordinationV1().Leases(agents).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	renewed := metav1.NewMicroTime(heard)
	nodeLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: conditions.NodeLeaseNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &renewed}}
	if _, err := f.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Create(ctx, nodeLease, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		_ = f.client.CoordinationV1().Leases(conditions.NodeLeaseNamespace).Delete(context.Background(), node, metav1.DeleteOptions{})
	})
}

// A node lost with all of a Job's pods, under a backoff of 20s, doubling: the pods
// recovered from the fenced node are replaced at once, all of them (the built-in
// controller's rule, which coroner-shim followed before, would make the Job wait
// 20s x 2^3 = 160s after four failures at once); a failure of the workload afterwards
// still waits the 20s (docs/choices.md).
func TestNodeLossReplacedWithoutBackoff(t *testing.T) {
	t.Parallel()
	slow := backoff.Policy{Base: 20 * time.Second, Max: 10 * time.Minute}
	f := recoveryFixtureWith(t, controller.Config{Backoff: slow})
	node := f.node("lost")
	const n = 4
	job := f.createJob(optedInJob("lost", f.ns).Parallelism(n).Completions(n))
	first := f.waitActive(job, n, settle)
	for _, p := range first {
		f.bindPod(p, node)
		f.runPod(p, true)
	}
	f.agentLease(node, time.Minute) // fenced already
	f.taintUnreachable(node)
	for _, p := range first {
		f.waitRecovered(job, p, conditions.ReasonNodeFenced, settle)
	}
	recovered := time.Now()
	// Well under the 20s a single failure that delays would cost.
	second := f.waitActive(job, n, 10*time.Second)
	t.Logf("%d replacements active %v after the last recovery", n, time.Since(recovered).Round(time.Millisecond))
	f.waitCounters(job, counters{Active: n}, settle)

	// A workload failure still delays its replacement by the base 20s.
	other := f.node("alive")
	for _, p := range second {
		f.bindPod(p, other)
		f.runPod(p, true)
	}
	failedAt := time.Now()
	f.failPod(second[0], 1)
	f.consistently(job, 15*time.Second, "the exit's replacement waits for the backoff", func(_ *batchv1.Job, pods []*corev1.Pod) bool {
		for _, p := range activePods(pods) {
			if !slices.ContainsFunc(second, func(q *corev1.Pod) bool { return q.UID == p.UID }) {
				return false
			}
		}
		return true
	})
	third := f.waitNewActive(job, -1, f.replacementWait(1), second...)
	if took := time.Since(failedAt); took < 18*time.Second {
		t.Errorf("the exit was replaced after %v, before the 20s backoff", took)
	}
	for _, p := range append(second[1:], third) {
		f.runPod(p, true)
		f.succeedPod(p)
	}
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantCounters(job, counters{Succeeded: n, Failed: 1})
}

// Z3: a pod bound to a node that does not exist is failed with DisruptionTarget
// DeletionByPodGC and deleted.
func TestOrphanedPodRecovery(t *testing.T) {
	t.Parallel()
	f := recoveryFixture(t)
	job := f.createJob(wrappers.MakeJob("orphan", f.ns).BackoffLimit(3).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)))
	first := f.waitActive(job, 1, settle)[0]
	f.bindPodNoNode(first, f.ns+"-no-such-node")
	got := f.waitRecovered(job, first, conditions.ReasonNodeDeleted, settle)
	if !podHasCondition(got, corev1.DisruptionTarget, conditions.ReasonDeletionByPodGC) {
		t.Errorf("orphan without DisruptionTarget DeletionByPodGC: %+v", got.Status.Conditions)
	}
	second := f.waitNewActive(job, -1, f.replacementWait(1), first)
	f.succeedPod(second)
	f.waitFinished(job, batchv1.JobComplete, settle)
	f.wantCounters(job, counters{Succeeded: 1})
	waitFor(t, settle, "the orphan gone", func() (bool, error) {
		_, err := f.client.CoreV1().Pods(f.ns).Get(context.Background(), first.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}, func() string { return f.describe(job) })
}

// Z4: a DisruptionTarget that stayed True on a running pod nobody deleted (an eviction
// that did not happen) is set False after StaleAfter, and a later real failure of the pod
// is not taken for a disruption.
func TestStaleDisruptionTargetCleared(t *testing.T) {
	t.Parallel()
	f := recoveryFixture(t)
	node := f.node("stale")
	job := f.createJob(wrappers.MakeJob("stale", f.ns).BackoffLimit(0).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)))
	first := f.waitActive(job, 1, settle)[0]
	f.bindPod(first, node)
	f.runPod(first, true)
	f.writeStatus(first, "a DisruptionTarget whose eviction failed", func(p *corev1.Pod) {
		setPodCondition(p, corev1.DisruptionTarget, corev1.ConditionTrue, conditions.ReasonEvictionByEvictionAPI, metav1.Now())
	})
	var cleared *corev1.Pod
	f.waitJob(job, settle, "DisruptionTarget cleared", func(_ *batchv1.Job, _ []*corev1.Pod) bool {
		cleared = f.mirror.record(first.UID).last
		c := conditions.Find(&cleared.Status, corev1.DisruptionTarget)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == conditions.ReasonStaleDisruptionTarget
	})
	// The pod now fails for real: with backoffLimit 0 the Job fails, as no disruption
	// excuses it any more.
	f.failPod(first, 1)
	f.waitFinished(job, batchv1.JobFailed, settle)
	f.wantCounters(job, counters{Failed: 1})
}

// otherPod creates a pod the shim does not own, bound to node at creation, with the
// annotations, and writes the Running status its kubelet would. With job, the pod is that
// Job's (its controller, with the labels the built-in Job controller puts).
func (f *fixture) otherPod(name, node string, annotations map[string]string, job *batchv1.Job) *corev1.Pod {
	f.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers:                    []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	if job != nil {
		p.Labels = map[string]string{batchv1.ControllerUidLabel: string(job.UID), batchv1.JobNameLabel: job.Name}
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}
	}
	created, err := f.client.CoreV1().Pods(f.ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating pod %s: %v", name, err)
	}
	// Whatever the test leaves is force-deleted, as its kubelet would once back.
	f.t.Cleanup(func() {
		_ = f.client.CoreV1().Pods(f.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return f.runPod(created, true)
}

// builtinJob creates a Job of the built-in controller (no managedBy), suspended: no Job
// controller runs here, the test makes its pod.
func (f *fixture) builtinJob(name string) *batchv1.Job {
	f.t.Helper()
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec: batchv1.JobSpec{
			Suspend: ptr.To(true),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
			}},
		},
	}
	job, err := f.client.BatchV1().Jobs(f.ns).Create(context.Background(), job, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating Job %s: %v", name, err)
	}
	f.t.Cleanup(func() {
		_ = f.client.BatchV1().Jobs(f.ns).Delete(context.Background(), name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationOrphan)})
	})
	return job
}

// deleteGracefully deletes the pod gracefully, as the taint manager does: bound to a node, it stays
// terminating until its kubelet (or the shim) ends it.
func (f *fixture) deleteGracefully(p *corev1.Pod, grace int64) {
	f.t.Helper()
	if err := f.client.CoreV1().Pods(f.ns).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(grace)}); err != nil {
		f.t.Fatalf("deleting pod %s: %v", p.Name, err)
	}
}

// waitPodRecord waits until cond holds for the watched life of the pod.
func (f *fixture) waitPodRecord(p *corev1.Pod, what string, cond func(r *podRecord) bool) *podRecord {
	f.t.Helper()
	var r *podRecord
	waitFor(f.t, settle, "pod "+p.Name+": "+what, func() (bool, error) {
		r = f.mirror.record(p.UID)
		return r != nil && cond(r), nil
	}, func() string {
		if r == nil {
			return "the pod was never seen"
		}
		return fmt.Sprintf("last seen (gone %v): phase %s, deletionTimestamp %v, grace %s, conditions %+v", r.gone, r.last.Status.Phase,
			r.last.DeletionTimestamp, ptrStr64(r.last.DeletionGracePeriodSeconds), r.last.Status.Conditions)
	})
	return r
}

func ptrStr64(p *int64) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

// consistentlyPods checks for d that every pod is still there, in its phase and not
// force-deleted.
func (f *fixture) consistentlyPods(d time.Duration, what string, pods ...*corev1.Pod) {
	f.t.Helper()
	phases := map[*corev1.Pod]corev1.PodPhase{}
	for _, p := range pods {
		phases[p] = f.mirror.record(p.UID).last.Status.Phase
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(pollInterval) {
		for _, p := range pods {
			r := f.mirror.record(p.UID)
			if r.gone || r.last.Status.Phase != phases[p] || ptr.Deref(r.last.DeletionGracePeriodSeconds, -1) == 0 ||
				conditions.Find(&r.last.Status, conditions.ForcefullyTerminated) != nil {
				f.t.Fatalf("%s: pod %s touched (gone %v, phase %s, grace %s, conditions %+v)", what, p.Name, r.gone, r.last.Status.Phase,
					ptrStr64(r.last.DeletionGracePeriodSeconds), r.last.Status.Conditions)
			}
		}
	}
}

// waitPodEvent waits for a Warning Event with reason on the pod whose message contains part.
func (f *fixture) waitPodEvent(p *corev1.Pod, reason, part string) {
	f.t.Helper()
	var seen []string
	waitFor(f.t, settle, fmt.Sprintf("a Warning Event %s on pod %s", reason, p.Name), func() (bool, error) {
		list, err := f.client.CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range list.Items {
			if e.InvolvedObject.UID != p.UID {
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s %q", e.Type, e.Reason, e.Message))
			if e.Type == corev1.EventTypeWarning && e.Reason == reason && strings.Contains(e.Message, part) {
				return true, nil
			}
		}
		return false, nil
	}, func() string { return "Events on the pod:\n  " + strings.Join(seen, "\n  ") })
}

// Issue 12 item 5 (Z1/Z2 as Kueue): with --recover-pods=all (the default) an opted-in pod
// that is not of a Job coroner manages is recovered too: a built-in Job's pod opted in by
// Kueue's annotation and a bare pod opted in by coroner's (both seen by the informer of the
// unreachable node's pods, which the taint starts) are failed with the conditions and force-deleted
// once their deletion plus the threshold has passed; a pod that is not opted in is left
// terminating; an opted-in terminal pod being deleted on the unreachable node is
// force-deleted at once.
func TestZombieRecoveryOfOtherPods(t *testing.T) {
	t.Parallel()
	f := recoveryFixture(t)
	node := f.node("others")
	job := f.builtinJob("builtin")
	ofJob := f.otherPod("of-builtin-job", node, map[string]string{conditions.AnnotationKueueSafeToForcefullyTerminate: "true"}, job)
	bare := f.otherPod("bare", node, map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}, nil)
	plain := f.otherPod("plain", node, map[string]string{"example.com/other": "true"}, nil)
	notTrue := f.otherPod("not-true", node, map[string]string{conditions.AnnotationSafeToForcefullyDelete: "yes"}, nil)
	terminal := f.otherPod("terminal", node, map[string]string{conditions.AnnotationKueueSafeToForcefullyDelete: "true"}, nil)

	f.taintUnreachable(node)
	deleted := time.Now()
	for _, p := range []*corev1.Pod{ofJob, bare, plain, notTrue} {
		f.deleteGracefully(p, 1)
	}
	// The API server deletes a terminal pod at once; one is left terminating when it became
	// terminal after its deletion began: its kubelet's last word before the partition, or
	// a controller (Kueue's failure recovery) that fails pods without deleting them.
	f.deleteGracefully(terminal, 30)
	f.failPod(terminal, 1)

	// The terminal pod goes at once: not after its 30s grace period, nor the threshold.
	r := f.waitPodRecord(terminal, "force-deleted", func(r *podRecord) bool { return r.gone })
	if took := time.Since(deleted); took > 15*time.Second {
		t.Errorf("terminal pod deleted %v after its deletion, want at once", took)
	}
	if r.last.Status.Phase != corev1.PodFailed || conditions.Find(&r.last.Status, conditions.ForcefullyTerminated) != nil {
		t.Errorf("terminal pod's status was written: phase %s, conditions %+v", r.last.Status.Phase, r.last.Status.Conditions)
	}
	f.waitPodEvent(terminal, recovery.EventReasonForcefullyDeleted, "phase Failed, being deleted on node "+node)

	for _, tc := range []struct {
		pod   *corev1.Pod
		optIn string
	}{{ofJob, conditions.AnnotationKueueSafeToForcefullyTerminate}, {bare, conditions.AnnotationSafeToForcefullyDelete}} {
		r := f.waitPodRecord(tc.pod, "failed (NodeUnreachable) and force-deleted", func(r *podRecord) bool {
			forced := r.gone || ptr.Deref(r.last.DeletionGracePeriodSeconds, -1) == 0
			return forced && r.last.Status.Phase == corev1.PodFailed && podHasCondition(r.last, conditions.ForcefullyTerminated, conditions.ReasonNodeUnreachable)
		})
		if took := time.Since(deleted); took < 2*time.Second {
			t.Errorf("pod %s recovered %v after the deletion, before grace (1s) + threshold (2s) - 1s", tc.pod.Name, took)
		}
		if !podHasCondition(r.last, corev1.DisruptionTarget, conditions.ReasonNodeUnreachable) {
			t.Errorf("pod %s recovered without DisruptionTarget: %+v", tc.pod.Name, r.last.Status.Conditions)
		}
		msg := conditions.Find(&r.last.Status, conditions.ForcefullyTerminated).Message
		if !strings.Contains(msg, node) || !strings.Contains(msg, tc.optIn) {
			t.Errorf("pod %s: message %q does not name the node and %s", tc.pod.Name, msg, tc.optIn)
		}
		f.waitPodEvent(tc.pod, conditions.EventReasonForcefullyTerminated, msg)
		waitFor(t, settle, "pod "+tc.pod.Name+" gone", func() (bool, error) {
			_, err := f.client.CoreV1().Pods(f.ns).Get(context.Background(), tc.pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}, nil)
	}

	// Not opted in (no annotation, or a value other than "true"): left terminating.
	f.consistentlyPods(3*time.Second, "not opted in", plain, notTrue)
}

// With --recover-pods=managed, opted-in pods that are not of managed Jobs are left alone,
// terminal or not; the pods of managed Jobs are still recovered.
func TestZombieRecoveryNarrowedToManagedJobs(t *testing.T) {
	t.Parallel()
	if builtinTarget {
		t.Skip("node-failure recovery is coroner's own")
	}
	f := newShimFixture(t, shim.Config{Recovery: recoverer.Config{
		Recovery:    recovery.Config{Threshold: 2 * time.Second, FenceMargin: time.Second, StaleAfter: 3 * time.Second, OrphanQuarantine: time.Second},
		RecoverPods: recoverer.RecoverManaged,
	}})
	node := f.node("narrowed")
	job := f.builtinJob("builtin")
	ofJob := f.otherPod("of-builtin-job", node, map[string]string{conditions.AnnotationKueueSafeToForcefullyTerminate: "true"}, job)
	bare := f.otherPod("bare", node, map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}, nil)
	terminal := f.otherPod("terminal", node, map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}, nil)
	managed := f.createJob(optedInJob("managed", f.ns).PodReplacementPolicy(batchv1.Failed))
	first := f.waitActive(managed, 1, settle)[0]
	f.bindPod(first, node)
	f.runPod(first, true)

	f.taintUnreachable(node)
	for _, p := range []*corev1.Pod{ofJob, bare, first} {
		f.deleteGracefully(p, 1)
	}
	f.deleteGracefully(terminal, 30)
	f.failPod(terminal, 1)
	f.waitRecovered(managed, first, conditions.ReasonNodeUnreachable, settle)
	// Past grace (1s) + threshold (2s) by now; watch a little longer.
	f.consistentlyPods(3*time.Second, "--recover-pods=managed", ofJob, bare, terminal)

	second := f.waitNewActive(managed, -1, f.replacementWait(1), first)
	f.runPod(second, true)
	f.succeedPod(second)
	f.waitFinished(managed, batchv1.JobComplete, settle)
}
