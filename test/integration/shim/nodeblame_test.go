package shim_test

import (
	"context"
	"fmt"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// nodeBlameJob is an Indexed Job of two indexes whose podFailurePolicy Ignores
// disruptions, with backoffLimitPerIndex 0 and the annotations given.
func nodeBlameJob(f *fixture, name string, annotations ...string) *batchv1.Job {
	f.t.Helper()
	w := wrappers.MakeJob(name, f.ns).Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(0).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, conditions.DisruptionTarget))
	w.Annotations = map[string]string{}
	for i := 0; i+1 < len(annotations); i += 2 {
		w.Annotations[annotations[i]] = annotations[i+1]
	}
	return f.createJob(w)
}

// getPod reads a pod from the API server.
func (f *fixture) getPod(name string) *corev1.Pod {
	f.t.Helper()
	p, err := f.client.CoreV1().Pods(f.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatalf("reading pod %s: %v", name, err)
	}
	return p
}

// TestAvoidFailedNodes (issue 38) on the real API server: a node OOM kill of index 1's pod
// on node-a gives its replacement a required affinity away from node-a (the API server
// accepts it), the annotation and the Event; the failure is ignored and the Job completes.
// A drain of index 0's pod moves nothing.
func TestAvoidFailedNodes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := nodeBlameJob(f, "avoid", v1alpha1.AnnotationAvoidFailedNodes, "required")
	pods := f.waitActive(job, 2, settle)
	for _, p := range pods {
		f.bindPod(p, "node-a")
	}

	f.failPod(pods[1], 137, disruption(conditions.ReasonNodeOOMKill))
	next := f.waitNewActive(job, 1, settle, pods[1])
	f.wantAnnotation(next, v1alpha1.AnnotationAvoidedNodes, "node-a=node-oom")
	want := []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-a"}}}}}
	if a := next.Spec.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
		fmt.Sprint(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != fmt.Sprint(want) {
		t.Errorf("the replacement's affinity is %+v, want required terms %+v", next.Spec.Affinity, want)
	}
	f.waitEvent(job, corev1.EventTypeNormal, jobsync.EventReasonAvoidingNodes,
		"the new pod of index 1 avoids (required) the nodes that killed its predecessors: node-a (node-oom) (coroner.dev/avoid-failed-nodes: required)")

	// A drain blames no node: index 0's replacement avoids nothing.
	f.failPod(pods[0], 143, disruption(conditions.ReasonEvictionByEvictionAPI))
	next0 := f.waitNewActive(job, 0, settle, pods[0])
	if _, ok := next0.Annotations[v1alpha1.AnnotationAvoidedNodes]; ok || next0.Spec.Affinity != nil {
		t.Errorf("index 0's replacement after a drain has %v and affinity %+v", next0.Annotations, next0.Spec.Affinity)
	}
	f.bindPod(next, "node-b")
	f.succeedPod(next)
	f.succeedPod(next0)
	done := f.waitFinished(job, batchv1.JobComplete, settle)
	if done.Status.Failed != 0 {
		t.Errorf("failed %d: the disruptions were ignored", done.Status.Failed)
	}
}

// TestDisruptionBudget (issue 38) on the real API server: with device=1 the first device
// failure of index 0 is ignored and its pod says "charged device"; the replacement carries
// the charge; the second device failure counts, fails the index (backoffLimitPerIndex 0)
// with the DisruptionBudgetSpent Event, and its pod says "spent device".
func TestDisruptionBudget(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	job := nodeBlameJob(f, "budget", v1alpha1.AnnotationDisruptionBudget, "device=1")
	pods := f.waitActive(job, 2, settle)
	f.succeedPod(pods[1])

	first := f.failPod(pods[0], 1, disruption(conditions.ReasonDeviceFailure))
	second := f.waitNewActive(job, 0, settle, pods[0])
	f.wantAnnotation(second, v1alpha1.AnnotationDisruptionsCharged, "device="+v1alpha1.ChargedID(string(first.UID)))
	f.waitJob(job, settle, "the first pod's verdict written as its finalizer went", func(_ *batchv1.Job, _ []*corev1.Pod) bool {
		p := f.getPod(first.Name)
		return !hasTrackingFinalizer(p) && p.Annotations[v1alpha1.AnnotationBudgetVerdict] == "charged device"
	})

	f.failPod(second, 1, disruption(conditions.ReasonDeviceFailure))
	done := f.waitFinished(job, batchv1.JobFailed, settle)
	if done.Status.Failed != 1 || ptr.Deref(done.Status.FailedIndexes, "") != "0" {
		t.Errorf("failed %d, failedIndexes %q: want the second device failure counted, index 0 failed", done.Status.Failed, ptr.Deref(done.Status.FailedIndexes, ""))
	}
	if v := f.getPod(second.Name).Annotations[v1alpha1.AnnotationBudgetVerdict]; v != "spent device" {
		t.Errorf("the second pod's verdict is %q, want spent device", v)
	}
	f.waitEvent(job, corev1.EventTypeWarning, jobsync.EventReasonDisruptionBudgetSpent,
		fmt.Sprintf("pod %s/%s: killed by a failing device (DisruptionTarget DeviceFailure); container main exited 1, matched rule 0 (Ignore) but its device budget (coroner.dev/disruption-budget device=1) is spent: index 0 failed", f.ns, second.Name))
}
