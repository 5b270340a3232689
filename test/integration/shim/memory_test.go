package shim_test

import (
	"context"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/cmd/coronerctl/explain"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// ownLimitOOM is the kubelet's OOMKilled exit with coroner-agent's stamp: the pod's own
// limit killed it.
func ownLimitOOM() kubeletOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses[0].State.Terminated.Reason = "OOMKilled"
		setPodCondition(p, conditions.OOMKilled, corev1.ConditionTrue, conditions.ReasonMemoryLimitExceeded, metav1.Now())
	}
}

// TestMemoryRetry (issue 22) on the real API server: an index killed at its own limit of
// 24Mi is retried with 48Mi (factor 2), not counted against backoffLimitPerIndex 0, and
// the Job completes; once at max, the same kill fails the index.
func TestMemoryRetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	w := wrappers.MakeJob("grow", f.ns).Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(0)
	job := w.Obj()
	job.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=2,max=64Mi"}
	job.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("24Mi")},
		Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("24Mi")},
	}
	job = f.createJob(&wrappers.JobWrapper{Job: *job})
	pods := f.waitActive(job, 2, settle)
	f.succeedPod(pods[0])
	memoryOf := func(p *corev1.Pod) string {
		q := p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]
		r := p.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]
		return q.String() + "/" + r.String()
	}

	// 24Mi -> 48Mi.
	f.failPod(pods[1], 137, ownLimitOOM())
	second := f.waitNewActive(job, 1, settle, pods[1])
	if got := memoryOf(second); got != "48Mi/48Mi" {
		t.Fatalf("the replacement of index 1 has limit/request %s, want 48Mi/48Mi", got)
	}
	if a := second.Annotations[v1alpha1.AnnotationMemoryGiven]; !strings.HasPrefix(a, "main=48Mi: "+pods[1].Name+": container main OOM-killed at its limit of 24Mi; retried with 48Mi") {
		t.Errorf("%s = %q", v1alpha1.AnnotationMemoryGiven, a)
	}
	f.waitEvent(job, corev1.EventTypeNormal, jobsync.EventReasonMemoryGrown,
		"index 1 (pod "+pods[1].Name+"): container main OOM-killed at its limit of 24Mi; retried with 48Mi (coroner.dev/oom-memory-retry factor=2,max=64Mi)")

	// 48Mi -> 64Mi (max), then at max the kill counts: backoffLimitPerIndex 0 fails index 1.
	f.failPod(second, 137, ownLimitOOM())
	third := f.waitNewActive(job, 1, settle, pods[1], second)
	if got := memoryOf(third); got != "64Mi/64Mi" {
		t.Fatalf("the third pod of index 1 has %s, want 64Mi/64Mi", got)
	}
	f.failPod(third, 137, ownLimitOOM())
	done := f.waitFinished(job, batchv1.JobFailed, settle)
	if done.Status.Failed != 1 || done.Status.FailedIndexes == nil || *done.Status.FailedIndexes != "1" || done.Status.CompletedIndexes != "0" {
		t.Errorf("failed %d, failedIndexes %v, completed %q: want the kill at max alone counted, index 1 failed",
			done.Status.Failed, done.Status.FailedIndexes, done.Status.CompletedIndexes)
	}
	ctx := context.Background()
	list, err := f.client.CoreV1().Pods(f.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 4 {
		t.Errorf("%d pods, want 4: index 0, and index 1 at 24Mi, 48Mi, 64Mi", len(list.Items))
	}

	// explain shows the ladder, and which failures grew rather than counted.
	r, err := explain.JobReport(ctx, explain.Client{Interface: f.client, Dynamic: dynamic.NewForConfigOrDie(f.env.Config)}, f.ns, job.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Indexes) != 2 || r.Indexes[1].Memory != "main=24Mi -> main=48Mi -> main=64Mi" || r.Indexes[1].Failures != 1 || r.Indexes[1].Ignored != 2 {
		t.Errorf("explain's indexes = %+v, want index 1's ladder main=24Mi -> main=48Mi -> main=64Mi, 1 failure, 2 ignored", r.Indexes)
	}
	for _, p := range r.Pods {
		switch p.Name {
		case pods[1].Name:
			if p.Rule != v1alpha1.AnnotationOOMMemoryRetry+": container main 24Mi -> 48Mi" || p.Action != "not counted; the replacement gets more memory" {
				t.Errorf("explain of %s: rule %q, action %q", p.Name, p.Rule, p.Action)
			}
			// The JobRecord kept what grew (the CRD's schema has the field: an unknown one
			// would be pruned).
			if len(p.Decisions) != 1 || !strings.Contains(p.Decisions[0], "failed, not counted") || !strings.Contains(p.Decisions[0], v1alpha1.AnnotationOOMMemoryRetry+": container main 24Mi -> 48Mi") {
				t.Errorf("explain's record of %s: %q", p.Name, p.Decisions)
			}
		case third.Name:
			if p.Rule != "no podFailurePolicy" || !strings.HasPrefix(p.Action, "counted") {
				t.Errorf("explain of %s (at max): rule %q, action %q", p.Name, p.Rule, p.Action)
			}
		}
	}
}

// TestMemoryRetryRefused: a LimitRange refuses the grown pod: said in a Warning Event, and
// the failure counts as without the annotation (backoffLimitPerIndex 0 fails the index)
// instead of a loop of refused creations.
func TestMemoryRetryRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, controller.Config{})
	ctx := context.Background()
	if _, err := f.client.CoreV1().LimitRanges(f.ns).Create(ctx, &corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: "small"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer,
			Max: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("40Mi")}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job := wrappers.MakeJob("refused", f.ns).Indexed().Completions(1).BackoffLimitPerIndex(0).Obj()
	job.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=2,max=64Mi"}
	job.Spec.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("24Mi")}
	job = f.createJob(&wrappers.JobWrapper{Job: *job})
	pods := f.waitActive(job, 1, settle)
	f.failPod(pods[0], 137, ownLimitOOM())
	done := f.waitFinished(job, batchv1.JobFailed, settle)
	if done.Status.FailedIndexes == nil || *done.Status.FailedIndexes != "0" || done.Status.Failed != 1 {
		t.Errorf("failedIndexes %v, failed %d: want index 0 failed, the kill counted", done.Status.FailedIndexes, done.Status.Failed)
	}
	events, err := f.client.CoreV1().Events(f.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refused, created := 0, 0
	for _, e := range events.Items {
		switch e.Reason {
		case jobsync.EventReasonMemoryRefused:
			refused++
			if !strings.Contains(e.Message, "index 0: the pod with more memory (main=48Mi: ") || !strings.Contains(e.Message, "40Mi") {
				t.Errorf("refusal Event %q", e.Message)
			}
		case conditions.EventReasonFailedCreate:
			created += int(e.Count)
		}
	}
	if refused != 1 || created > 2 {
		t.Errorf("%d MemoryGrowthRefused Events, %d FailedCreate: want one refusal and no loop", refused, created)
	}
}
