package jobsync

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// blamedPod is a failed pod of index ix (-1: NonIndexed) on node, stamped DisruptionTarget
// with reason (none: a plain exit 1).
func blamedPod(name string, ix int, node, reason string) *corev1.Pod {
	w := failed(name, 1)
	if ix >= 0 {
		w = w.Index(ix)
	}
	p := tracked(w)
	p.UID = types.UID(name + "-uid") // the first 8 characters are the charged id
	p.Spec.NodeName = node
	if reason != "" {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: reason})
	}
	return p
}

func syncWith(in Input) Plan {
	in.Now, in.Backoff, in.ExpectationsSatisfied, in.FinalizersBeingRemoved = now, backoff.Default, true, sets.New[types.UID]()
	return Sync(in)
}

func annotated(j *batchv1.Job, kv ...string) *batchv1.Job {
	if j.Annotations == nil {
		j.Annotations = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		j.Annotations[kv[i]] = kv[i+1]
	}
	return j
}

func eventsOf(p Plan) string {
	var out []string
	for _, e := range p.Events {
		out = append(out, e.Type+" "+e.Reason+": "+e.Message)
	}
	return strings.Join(out, "\n")
}

// TestAvoidFailedNodes: the replacement of a pod whose death blamed its node gets affinity
// away from it, as the Job (or the shim's default) asks; other deaths move nothing.
func TestAvoidFailedNodes(t *testing.T) {
	indexed := func(kv ...string) *batchv1.Job {
		return annotated(job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2)), kv...)
	}
	notIn := func(nodes ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: nodes}
	}
	for _, tc := range []struct {
		name         string
		job          *batchv1.Job
		def          v1alpha1.Avoidance
		failed       *corev1.Pod
		wantAvoided  string // the replacement's coroner.dev/avoided-nodes
		wantRequired bool
		wantPrefer   bool
	}{
		{name: "required: a node OOM kill moves the replacement off the node", job: indexed(v1alpha1.AnnotationAvoidFailedNodes, "required"),
			failed: blamedPod("j-1-a", 1, "n1", conditions.ReasonNodeOOMKill), wantAvoided: "n1=node-oom", wantRequired: true},
		{name: "preferred: a device failure", job: indexed(v1alpha1.AnnotationAvoidFailedNodes, "preferred"),
			failed: blamedPod("j-1-a", 1, "n1", conditions.ReasonDeviceFailure), wantAvoided: "n1=device", wantPrefer: true},
		{name: "the shim's default applies to a Job without the annotation", job: indexed(), def: v1alpha1.AvoidRequired,
			failed: blamedPod("j-1-a", 1, "n1", conditions.ReasonNodeOOMKill), wantAvoided: "n1=node-oom", wantRequired: true},
		{name: "the annotation none overrides the default", job: indexed(v1alpha1.AnnotationAvoidFailedNodes, "none"), def: v1alpha1.AvoidRequired,
			failed: blamedPod("j-1-a", 1, "n1", conditions.ReasonNodeOOMKill)},
		{name: "a bug blames no node", job: indexed(v1alpha1.AnnotationAvoidFailedNodes, "required"),
			failed: blamedPod("j-1-a", 1, "n1", "")},
		{name: "a drain blames no node", job: indexed(v1alpha1.AnnotationAvoidFailedNodes, "required"),
			failed: blamedPod("j-1-a", 1, "n1", conditions.ReasonEvictionByEvictionAPI)},
		{name: "a preemption blames no node", job: indexed(v1alpha1.AnnotationAvoidFailedNodes, "required"),
			failed: blamedPod("j-1-a", 1, "n1", conditions.ReasonPreemptionByScheduler)},
		{name: "an invalid annotation: as the default, said", job: notStarted(indexed(v1alpha1.AnnotationAvoidFailedNodes, "always")),
			failed: blamedPod("j-1-a", 1, "n1", conditions.ReasonNodeOOMKill)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := tracked(running("j-0-a").Index(0))
			plan := syncWith(Input{Job: tc.job, Pods: []*corev1.Pod{other, tc.failed}, DefaultAvoidance: tc.def})
			if len(plan.Create) != 1 {
				t.Fatalf("created %d pods, want index 1's replacement; events:\n%s", len(plan.Create), eventsOf(plan))
			}
			pod := plan.Create[0].Pod
			if got := pod.Annotations[v1alpha1.AnnotationAvoidedNodes]; got != tc.wantAvoided {
				t.Errorf("%s = %q, want %q", v1alpha1.AnnotationAvoidedNodes, got, tc.wantAvoided)
			}
			var na *corev1.NodeAffinity
			if pod.Spec.Affinity != nil {
				na = pod.Spec.Affinity.NodeAffinity
			}
			gotRequired := na != nil && na.RequiredDuringSchedulingIgnoredDuringExecution != nil &&
				equality.Semantic.DeepEqual(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms, []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{notIn("n1")}}})
			gotPrefer := na != nil && len(na.PreferredDuringSchedulingIgnoredDuringExecution) == 1 &&
				equality.Semantic.DeepEqual(na.PreferredDuringSchedulingIgnoredDuringExecution[0].Preference.MatchFields, []corev1.NodeSelectorRequirement{notIn("n1")})
			if gotRequired != tc.wantRequired || gotPrefer != tc.wantPrefer {
				t.Errorf("affinity %+v: required %v preferred %v, want %v %v", pod.Spec.Affinity, gotRequired, gotPrefer, tc.wantRequired, tc.wantPrefer)
			}
			events := eventsOf(plan)
			if want := tc.wantAvoided != ""; strings.Contains(events, EventReasonAvoidingNodes+": the new pod of index 1 avoids") != want {
				t.Errorf("AvoidingNodes Event present = %v, want %v; events:\n%s", !want, want, events)
			}
			if tc.wantAvoided != "" && plan.Observations.NodeAvoidances[string(tc.def)+tc.job.Annotations[v1alpha1.AnnotationAvoidFailedNodes]] != 1 {
				t.Errorf("observations %v", plan.Observations.NodeAvoidances)
			}
			if strings.Contains(tc.name, "invalid") != strings.Contains(events, EventReasonInvalidNodeBlame+`: coroner.dev/avoid-failed-nodes "always"`) {
				t.Errorf("events:\n%s", events)
			}
			// The failure itself is judged as without the feature: counted.
			if plan.Status.Failed+int32(len(plan.Status.UncountedTerminatedPods.Failed)) != 1 {
				t.Errorf("failed %d, uncounted %v: want the failure counted", plan.Status.Failed, plan.Status.UncountedTerminatedPods.Failed)
			}
		})
	}
}

// TestAvoidFailedNodesCarriedOn: the nodes an index avoids accumulate, oldest first, on
// the pods of the index, and the template's own required terms are each narrowed.
func TestAvoidFailedNodesCarriedOn(t *testing.T) {
	j := annotated(job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).Parallelism(1)), v1alpha1.AnnotationAvoidFailedNodes, "required")
	gpu := corev1.NodeSelectorRequirement{Key: "gpu", Operator: corev1.NodeSelectorOpExists}
	j.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{gpu}}}}}}
	// The first pod died on n1 (its replacement, second, carries n1) and the replacement
	// died on n2; the first pod is gone.
	second := blamedPod("j-0-b", 0, "n2", conditions.ReasonDeviceFailure)
	second.Annotations[v1alpha1.AnnotationAvoidedNodes] = "n1=node-oom"
	plan := sync(j, second)
	if len(plan.Create) != 1 {
		t.Fatalf("created %d pods; events:\n%s", len(plan.Create), eventsOf(plan))
	}
	pod := plan.Create[0].Pod
	if got := pod.Annotations[v1alpha1.AnnotationAvoidedNodes]; got != "n1=node-oom,n2=device" {
		t.Errorf("avoided %q, want n1=node-oom,n2=device", got)
	}
	terms := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	want := []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{gpu}, MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1", "n2"}}}}}
	if !equality.Semantic.DeepEqual(terms, want) {
		t.Errorf("terms %+v, want %+v", terms, want)
	}
	if tmpl := j.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0]; len(tmpl.MatchFields) != 0 {
		t.Errorf("the Job's template was modified: %+v", tmpl)
	}
	if !strings.Contains(eventsOf(plan), "avoids (required) the nodes that killed its predecessors: n1 (node-oom), n2 (device)") {
		t.Errorf("events:\n%s", eventsOf(plan))
	}
}

// TestAvoidedNodesUnschedulable: a pod that must avoid nodes and cannot be scheduled is
// said in a Warning.
func TestAvoidedNodesUnschedulable(t *testing.T) {
	j := annotated(job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).Parallelism(1)), v1alpha1.AnnotationAvoidFailedNodes, "required")
	p := tracked(wrappers.MakePod("j-0-b", "ns").Index(0).Phase(corev1.PodPending))
	p.Annotations[v1alpha1.AnnotationAvoidedNodes] = "n1=node-oom"
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."}}
	events := eventsOf(sync(j, p))
	want := "Warning " + EventReasonAvoidedNodesUnschedulable + ": pod j-0-b cannot be scheduled; it avoids n1 (node-oom) (coroner.dev/avoid-failed-nodes: required); the scheduler: 0/1 nodes are available"
	if !strings.Contains(events, want) {
		t.Errorf("events:\n%s\nwant %q", events, want)
	}
	p.Status.Conditions[0] = corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}
	if events := eventsOf(sync(j, p)); strings.Contains(events, EventReasonAvoidedNodesUnschedulable) {
		t.Errorf("a scheduled pod: %s", events)
	}
}

// TestDisruptionBudget: with device=1 the first device failure of an index is ignored and
// charged, carried on by the replacement; the second counts, with the Event that names
// the budget. The verdicts are written as the finalizers go, and once written they stay.
func TestDisruptionBudget(t *testing.T) {
	j := annotated(job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, conditions.DisruptionTarget))),
		v1alpha1.AnnotationDisruptionBudget, "device=1")
	other := tracked(running("j-0-a").Index(0))
	first := blamedPod("j-1-a", 1, "n1", conditions.ReasonDeviceFailure)
	plan := sync(j, other, first)
	if plan.Status.Failed != 0 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 {
		t.Errorf("first failure counted: failed %d uncounted %v", plan.Status.Failed, plan.Status.UncountedTerminatedPods.Failed)
	}
	if v := plan.BudgetVerdicts[first.UID]; v != "charged device" {
		t.Errorf("verdict %q, want charged device", v)
	}
	if plan.Observations.BudgetVerdicts["charged/device"] != 1 {
		t.Errorf("observations %v", plan.Observations.BudgetVerdicts)
	}
	if len(plan.Create) != 1 {
		t.Fatalf("created %d; events:\n%s", len(plan.Create), eventsOf(plan))
	}
	repl := plan.Create[0].Pod
	if got, want := repl.Annotations[v1alpha1.AnnotationDisruptionsCharged], "device="+v1alpha1.ChargedID(string(first.UID)); got != want {
		t.Errorf("charged %q, want %q", got, want)
	}
	if _, ok := repl.Annotations[v1alpha1.AnnotationAvoidedNodes]; ok {
		t.Error("avoided nodes without the avoidance")
	}

	// The first pod is gone; the replacement dies of a device too.
	j.Status = plan.Status
	second := blamedPod("j-1-b", 1, "n2", conditions.ReasonDeviceFailure)
	for k, v := range repl.Annotations {
		second.Annotations[k] = v
	}
	plan = sync(j, other, second)
	if got := plan.Status.UncountedTerminatedPods.Failed; len(got) != 1 || got[0] != second.UID {
		t.Errorf("uncounted failed %v, want the second failure counted", got)
	}
	if v := plan.BudgetVerdicts[second.UID]; v != "spent device" {
		t.Errorf("verdict %q, want spent device", v)
	}
	events := eventsOf(plan)
	want := "Warning " + EventReasonDisruptionBudgetSpent + ": pod ns/j-1-b: killed by a failing device (DisruptionTarget DeviceFailure); container main exited 1, matched rule 0 (Ignore) but its device budget (coroner.dev/disruption-budget device=1) is spent: counts towards the backoff limit"
	if !strings.Contains(events, want) {
		t.Errorf("events:\n%s\nwant %q", events, want)
	}
	if strings.Contains(events, conditions.EventReasonPodFailurePolicy) {
		t.Errorf("a PodFailurePolicy Event beside the budget's:\n%s", events)
	}
	if len(plan.Leaving) != 1 || plan.Leaving[0].Outcome != v1alpha1.OutcomeFailed || !strings.HasPrefix(plan.Leaving[0].Consequence, "its device budget") {
		t.Errorf("record %+v", plan.Leaving)
	}
	if plan.Observations.BudgetVerdicts["spent/device"] != 1 {
		t.Errorf("observations %v", plan.Observations.BudgetVerdicts)
	}

	// A verdict written stays: the second pod, counted, with its verdict, and an earlier
	// device failure that shows up late are not judged again.
	second.Annotations[v1alpha1.AnnotationBudgetVerdict] = "spent device"
	second.Finalizers = nil
	early := blamedPod("j-1-0", 1, "n3", conditions.ReasonDeviceFailure)
	early.Status.ContainerStatuses[0].State.Terminated.FinishedAt.Time = now.Add(-time.Hour)
	j.Status = plan.Status
	j.Status.Failed, j.Status.UncountedTerminatedPods = 1, nil
	plan = sync(j, other, second, early)
	if _, ok := plan.BudgetVerdicts[second.UID]; ok {
		t.Error("the written verdict was written again")
	}
	if v := plan.BudgetVerdicts[early.UID]; v != "spent device" {
		t.Errorf("the late failure's verdict %q, want spent device (the budget went to j-1-a)", v)
	}
}

// TestDisruptionBudgetPerIndex: under backoffLimitPerIndex a spent budget's failure adds to
// the index's failure count, which the next pod carries.
func TestDisruptionBudgetPerIndex(t *testing.T) {
	j := annotated(job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(1).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, conditions.DisruptionTarget))),
		v1alpha1.AnnotationDisruptionBudget, "device=1")
	second := blamedPod("j-1-b", 1, "n2", conditions.ReasonDeviceFailure)
	second.Annotations[v1alpha1.AnnotationDisruptionsCharged] = "device=gone0000"
	second.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation] = "1"
	second.Annotations[batchv1.JobIndexFailureCountAnnotation] = "0"
	plan := sync(j, tracked(running("j-0-a").Index(0)), second)
	if len(plan.Create) != 1 {
		t.Fatalf("created %d; events:\n%s", len(plan.Create), eventsOf(plan))
	}
	a := plan.Create[0].Pod.Annotations
	if a[batchv1.JobIndexFailureCountAnnotation] != "1" || a[batchv1.JobIndexIgnoredFailureCountAnnotation] != "1" {
		t.Errorf("counts failed %q ignored %q, want 1 and 1", a[batchv1.JobIndexFailureCountAnnotation], a[batchv1.JobIndexIgnoredFailureCountAnnotation])
	}
	if a[v1alpha1.AnnotationDisruptionsCharged] != "device=gone0000" {
		t.Errorf("charged %q", a[v1alpha1.AnnotationDisruptionsCharged])
	}
}

// TestDisruptionBudgetNonIndexed: a NonIndexed Job's budget is the Job's: of two device
// failures with device=1, one is ignored, the other counts and spends backoffLimit 0.
func TestDisruptionBudgetNonIndexed(t *testing.T) {
	j := annotated(job(wrappers.MakeJob("j", "ns").Parallelism(2).Completions(2).BackoffLimit(0).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, conditions.DisruptionTarget))),
		v1alpha1.AnnotationDisruptionBudget, "device=1")
	a := blamedPod("j-a", -1, "n1", conditions.ReasonDeviceFailure)
	b := blamedPod("j-b", -1, "n1", conditions.ReasonDeviceFailure)
	b.Status.ContainerStatuses[0].State.Terminated.FinishedAt.Time = now.Add(-10 * time.Second)
	plan := sync(j, a, b)
	if plan.BudgetVerdicts[a.UID] != "charged device" || plan.BudgetVerdicts[b.UID] != "spent device" {
		t.Errorf("verdicts %v, want a charged (it finished first), b spent", plan.BudgetVerdicts)
	}
	if c := findCondition(plan.Status.Conditions, batchv1.JobFailureTarget); c == nil || c.Reason != batchv1.JobReasonBackoffLimitExceeded {
		t.Errorf("conditions %v, want FailureTarget BackoffLimitExceeded", conditionSummary(plan.Status.Conditions))
	}
}

// TestNodeBlameParity: without the annotations and the default, the plan is the one the
// shim makes without the feature: no annotation, no affinity, no verdict.
func TestNodeBlameParity(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).Parallelism(2).BackoffLimitPerIndex(1).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, conditions.DisruptionTarget)))
	plan := sync(j, tracked(running("j-0-a").Index(0)), blamedPod("j-1-a", 1, "n1", conditions.ReasonNodeOOMKill))
	if len(plan.Create) != 1 {
		t.Fatalf("created %d", len(plan.Create))
	}
	p := plan.Create[0].Pod
	for k := range p.Annotations {
		if strings.HasPrefix(k, conditions.Prefix) {
			t.Errorf("annotation %s on the replacement", k)
		}
	}
	if p.Spec.Affinity != nil || plan.BudgetVerdicts != nil || plan.Observations.NodeAvoidances != nil {
		t.Errorf("affinity %v, verdicts %v, avoidances %v", p.Spec.Affinity, plan.BudgetVerdicts, plan.Observations.NodeAvoidances)
	}
}
