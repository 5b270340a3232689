package shim_test

import (
	"context"
	"fmt"
	"os"
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
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/recovery"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// The tests of node-failure recovery (Z1-Z4) play the node controller too: they make
// Nodes, taint them unreachable, and write the agents' Leases.

// recoveryFixture is a fixture whose controller recovers with short times, reading agent
// Leases from the test's namespace.
func recoveryFixture(t *testing.T) *fixture {
	t.Helper()
	if builtinTarget {
		t.Skip("node-failure recovery is coroner's own")
	}
	// Each test reads agent Leases from a namespace of its own (made by agentNamespace).
	return newFixture(t, controller.Config{
		Recovery: recovery.Config{Threshold: 2 * time.Second, FenceMargin: time.Second, StaleAfter: 3 * time.Second,
			OrphanQuarantine: time.Second},
		AgentNamespace: fmt.Sprintf("agents-%d-%d", os.Getpid(), agentNamespaceSeq.Add(1)),
	})
}

var agentNamespaceSeq atomic.Int32

// agentNamespace creates the namespace the fixture's controller reads agent Leases from.
func (f *fixture) agentNamespace() string {
	f.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.cfg.AgentNamespace}}
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

	agents := f.agentNamespace()
	renewed := metav1.NewMicroTime(time.Now().Add(-5 * time.Second))
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: conditions.AgentLeaseName(node), Namespace: agents,
			Annotations: map[string]string{conditions.AnnotationFenceAfter: "10s"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](10), RenewTime: &renewed},
	}
	if _, err := f.client.CoordinationV1().Leases(agents).Create(context.Background(), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
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
