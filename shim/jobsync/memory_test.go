package jobsync

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// withMemory gives the Job's container main a memory limit (and request).
func withMemory(j *batchv1.Job, limit, request string) *batchv1.Job {
	c := &j.Spec.Template.Spec.Containers[0]
	c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}
	if request != "" {
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(request)}
	}
	return j
}

// oomPod is a failed pod of index ix whose container main, limited to limit, was
// OOM-killed, stamped as cond says.
func oomPod(name string, ix int, limit string, cond corev1.PodCondition) *corev1.Pod {
	p := tracked(failed(name, 137).Index(ix))
	p.Status.ContainerStatuses[0].State.Terminated.Reason = "OOMKilled"
	p.Spec.Containers = []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(limit)}}}}
	p.Status.Conditions = append(p.Status.Conditions, cond)
	return p
}

var (
	ownLimit = corev1.PodCondition{Type: conditions.OOMKilled, Status: corev1.ConditionTrue, Reason: conditions.ReasonMemoryLimitExceeded}
	nodeOOMd = corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonNodeOOMKill}
)

// TestMemoryRetry: with coroner.dev/oom-memory-retry, a pod killed at its own limit is not
// counted and its replacement gets the limit times the factor, up to max; at max, or for a
// node OOM, the failure counts as without the annotation.
func TestMemoryRetry(t *testing.T) {
	indexedJob := func(annotation string) *batchv1.Job {
		j := withMemory(job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(0).
			PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionFailJob, conditions.OOMKilled))), "24Mi", "24Mi")
		if annotation != "" {
			j.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: annotation}
		}
		return j
	}
	for _, tc := range []struct {
		name       string
		job        *batchv1.Job
		failed     *corev1.Pod
		wantGrow   string // the replacement's limit and request of main, "" for no replacement
		wantFailed string // status.failedIndexes
		wantEvent  string
	}{
		{
			name:      "killed at its own limit: not counted, retried with twice the memory, Guaranteed kept",
			job:       indexedJob("factor=2,max=128Mi"),
			failed:    oomPod("j-1-a", 1, "24Mi", ownLimit),
			wantGrow:  "48Mi/48Mi",
			wantEvent: "index 1 (pod j-1-a): container main OOM-killed at its limit of 24Mi; retried with 48Mi (coroner.dev/oom-memory-retry factor=2,max=128Mi)",
		},
		{
			name:     "the agent's words quoted: the peak it measured",
			job:      indexedJob("factor=2,max=128Mi"),
			failed:   oomPod("j-1-a", 1, "24Mi", withMessage(ownLimit, "container main was OOM-killed at its memory limit of 24Mi (peak 24Mi)")),
			wantGrow: "48Mi/48Mi",
			wantEvent: "index 1 (pod j-1-a): container main OOM-killed at its limit of 24Mi; retried with 48Mi (coroner.dev/oom-memory-retry factor=2,max=128Mi; " +
				"coroner-agent: container main was OOM-killed at its memory limit of 24Mi (peak 24Mi))",
		},
		{
			name:      "capped at max",
			job:       indexedJob("factor=4,max=64Mi"),
			failed:    oomPod("j-1-b", 1, "24Mi", ownLimit),
			wantGrow:  "64Mi/64Mi",
			wantEvent: "retried with 64Mi",
		},
		{
			name:       "at max: the pod failure policy decides (FailJob on OOMKilled)",
			job:        indexedJob("factor=2,max=128Mi"),
			failed:     oomPod("j-1-c", 1, "128Mi", ownLimit),
			wantFailed: "FailJob",
		},
		{
			name:       "a node OOM never grows: counted, the index fails (backoffLimitPerIndex 0)",
			job:        indexedJob("factor=2,max=128Mi"),
			failed:     oomPod("j-1-d", 1, "24Mi", nodeOOMd),
			wantFailed: "1",
		},
		{
			name:       "without the annotation: FailJob",
			job:        indexedJob(""),
			failed:     oomPod("j-1-e", 1, "24Mi", ownLimit),
			wantFailed: "FailJob",
		},
		{
			name:       "an invalid annotation: as without it, said as the Job starts",
			job:        notStarted(indexedJob("factor=20,max=128Mi")),
			failed:     oomPod("j-1-f", 1, "24Mi", ownLimit),
			wantFailed: "FailJob",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := tracked(running("j-0-a").Index(0))
			plan := sync(tc.job, other, tc.failed)
			var created []*corev1.Pod
			for _, c := range plan.Create {
				created = append(created, c.Pod)
			}
			var events []string
			for _, e := range plan.Events {
				events = append(events, e.Reason+": "+e.Message)
			}
			all := strings.Join(events, "\n")
			switch {
			case tc.wantGrow != "":
				if len(created) != 1 {
					t.Fatalf("created %d pods, want the replacement of index 1; events:\n%s", len(created), all)
				}
				res := created[0].Spec.Containers[0].Resources
				l, r := res.Limits[corev1.ResourceMemory], res.Requests[corev1.ResourceMemory]
				if got := l.String() + "/" + r.String(); got != tc.wantGrow {
					t.Errorf("replacement memory limit/request = %s, want %s", got, tc.wantGrow)
				}
				if a := created[0].Annotations[v1alpha1.AnnotationMemoryGiven]; !strings.Contains(a, tc.failed.Name+": container main OOM-killed at its limit of 24Mi") {
					t.Errorf("%s = %q", v1alpha1.AnnotationMemoryGiven, a)
				}
				if created[0].Annotations[batchv1.JobIndexFailureCountAnnotation] != "0" || created[0].Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation] != "1" {
					t.Errorf("replacement counts failed %q ignored %q, want 0 and 1", created[0].Annotations[batchv1.JobIndexFailureCountAnnotation], created[0].Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation])
				}
				// The next sync lets the failed pod go: one Event, one growth, not counted.
				j := tc.job.DeepCopy()
				j.Status = plan.Status
				plan = sync(j, other, tc.failed, tracked(running(created[0].GenerateName+"x").Index(1)))
				var grown []string
				for _, e := range plan.Events {
					if e.Reason == EventReasonMemoryGrown {
						grown = append(grown, e.Message)
					}
				}
				if len(grown) != 1 || !strings.Contains(grown[0], tc.wantEvent) {
					t.Errorf("MemoryGrown events %q, want one with %q", grown, tc.wantEvent)
				}
				if plan.Observations.MemoryGrowths != 1 || plan.Status.Failed != 0 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 {
					t.Errorf("growths %d, failed %d, uncounted %v: want 1 growth, nothing counted", plan.Observations.MemoryGrowths, plan.Status.Failed, plan.Status.UncountedTerminatedPods.Failed)
				}
				if len(plan.Leaving) != 1 || plan.Leaving[0].Outcome != "Ignored" || !strings.HasPrefix(plan.Leaving[0].Consequence, "not counted: container main OOM-killed") || plan.Leaving[0].Rule != nil || plan.Leaving[0].Grown != "container main 24Mi -> 48Mi" && plan.Leaving[0].Grown != "container main 24Mi -> 64Mi" {
					t.Errorf("record = %+v", plan.Leaving)
				}
			case tc.wantFailed == "FailJob":
				if c := findCondition(plan.Status.Conditions, batchv1.JobFailureTarget); c == nil || c.Reason != batchv1.JobReasonPodFailurePolicy {
					t.Errorf("conditions %v, want FailureTarget PodFailurePolicy", conditionSummary(plan.Status.Conditions))
				}
			default:
				if got := ptrString(plan.Status.FailedIndexes); got != tc.wantFailed {
					t.Errorf("failedIndexes %q, want %q", got, tc.wantFailed)
				}
			}
			if strings.Contains(tc.name, "invalid") != strings.Contains(all, EventReasonInvalidMemoryRetry+": coroner.dev/oom-memory-retry \"factor=20,max=128Mi\"") {
				t.Errorf("events:\n%s", all)
			}
			for _, p := range created {
				if tc.wantGrow == "" && p.Annotations[v1alpha1.AnnotationMemoryGiven] != "" {
					t.Errorf("a pod was given memory: %v", p.Annotations)
				}
			}
		})
	}
}

// TestMemoryRetryNonIndexed: a NonIndexed Job's new pods take the largest memory a failed
// pod of the Job was given, grown.
func TestMemoryRetryNonIndexed(t *testing.T) {
	j := withMemory(job(wrappers.MakeJob("j", "ns").Completions(1).BackoffLimit(0)), "24Mi", "")
	j.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=1.5,max=1Gi"}
	first := oomPod("j-a", 0, "24Mi", ownLimit)
	delete(first.Annotations, batchv1.JobCompletionIndexAnnotation)
	plan := sync(j, first)
	if len(plan.Create) != 1 {
		t.Fatalf("created %d pods, want 1 (not counted against backoffLimit 0)", len(plan.Create))
	}
	res := plan.Create[0].Pod.Spec.Containers[0].Resources
	if l := res.Limits[corev1.ResourceMemory]; l.String() != "36Mi" {
		t.Errorf("new pod's limit %s, want 36Mi", l.String())
	}
	if _, has := res.Requests[corev1.ResourceMemory]; has {
		t.Error("a request was added")
	}
	if plan.Status.Failed != 0 || findCondition(plan.Status.Conditions, batchv1.JobFailureTarget) != nil {
		t.Errorf("failed %d, conditions %v: the growth was counted", plan.Status.Failed, conditionSummary(plan.Status.Conditions))
	}
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func notStarted(j *batchv1.Job) *batchv1.Job {
	j.Status.StartTime = nil
	return j
}

// TestMemoryRetryWaitsForTheVerdict: the kubelet's OOMKilled before coroner-agent's stamp
// is not counted and not replaced yet, even without a policy rule on pod conditions.
func TestMemoryRetryWaitsForTheVerdict(t *testing.T) {
	j := withMemory(job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).BackoffLimitPerIndex(0)), "24Mi", "")
	j.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=2,max=1Gi"}
	p := oomPod("j-0-a", 0, "24Mi", corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse})
	p.Status.ContainerStatuses[0].State.Terminated.FinishedAt.Time = now.Add(-time.Second)
	plan := Sync(Input{Job: j, Pods: []*corev1.Pod{p}, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true, VerdictWait: 30 * time.Second})
	if len(plan.Create) != 0 || ptrString(plan.Status.FailedIndexes) != "" || plan.RequeueAfter <= 0 {
		t.Errorf("create %d, failedIndexes %q, requeue %v: want a wait for the verdict", len(plan.Create), ptrString(plan.Status.FailedIndexes), plan.RequeueAfter)
	}
	p.Status.Conditions = append(p.Status.Conditions, ownLimit)
	// Stamped; the index's replacement after its backoff (10s).
	plan = Sync(Input{Job: j, Pods: []*corev1.Pod{p}, Now: now.Add(20 * time.Second), Backoff: backoff.Default, ExpectationsSatisfied: true, VerdictWait: 30 * time.Second})
	if len(plan.Create) != 1 {
		t.Errorf("created %d pods once stamped, want the grown replacement", len(plan.Create))
	}
}

// TestMemoryRefused: when the API server refused the grown pod of an index (a LimitRange,
// a ResourceQuota), its failure counts as without the annotation: no retry loop.
func TestMemoryRefused(t *testing.T) {
	j := withMemory(job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(0)), "24Mi", "")
	j.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=2,max=1Gi"}
	in := Input{Job: j, Pods: []*corev1.Pod{tracked(running("j-0-a").Index(0)), oomPod("j-1-a", 1, "24Mi", ownLimit)}, Now: now,
		Backoff: backoff.Default, ExpectationsSatisfied: true, MemoryRefused: map[int]string{1: "forbidden: maximum memory usage per Container is 40Mi"}}
	plan := Sync(in)
	if len(plan.Create) != 0 || ptrString(plan.Status.FailedIndexes) != "1" || plan.Observations.MemoryGrowths != 0 {
		t.Errorf("create %d, failedIndexes %q, growths %d: want index 1 failed as without the annotation",
			len(plan.Create), ptrString(plan.Status.FailedIndexes), plan.Observations.MemoryGrowths)
	}
}

// TestMemoryLadder: two kills of an index within one second (creation times tie): the
// next pod grows from the larger memory, the newer pod's.
func TestMemoryLadder(t *testing.T) {
	j := withMemory(job(wrappers.MakeJob("j", "ns").Indexed().Completions(1)), "24Mi", "")
	j.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=2,max=1Gi"}
	second := oomPod("j-0-b", 0, "48Mi", ownLimit)
	first := oomPod("j-0-a", 0, "24Mi", ownLimit)
	for _, order := range [][]*corev1.Pod{{first, second}, {second, first}} {
		plan := sync(j, order...)
		if len(plan.Create) != 1 {
			t.Fatalf("created %d pods", len(plan.Create))
		}
		p := plan.Create[0].Pod
		if l := p.Spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; l.String() != "96Mi" ||
			!strings.Contains(p.Annotations[v1alpha1.AnnotationMemoryGiven], "j-0-b: container main OOM-killed at its limit of 48Mi") {
			t.Errorf("next pod: limit %s, %q; want 96Mi grown from j-0-b", l.String(), p.Annotations[v1alpha1.AnnotationMemoryGiven])
		}
	}
}

func withMessage(c corev1.PodCondition, msg string) corev1.PodCondition {
	c.Message = msg
	return c
}
