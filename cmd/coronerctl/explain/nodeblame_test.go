package explain

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/record"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const unschedulableMsg = "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."

// blameJob is an Indexed Job of 3 GPU pods with avoid-failed-nodes: required and
// disruption-budget device=1,node-oom=5,default=20 (backoffLimitPerIndex 2, Ignore on
// DisruptionTarget), as the API server holds it once coroner-shim and the agent wrote:
//
//   - index 0: its first pod killed by a failing device on node-a, charged to the device
//     budget and gone (its JobRecord entry); the second killed by a device on node-b,
//     the budget spent so it counted; the third avoids node-a and node-b and cannot be
//     scheduled (the other node is the control plane's);
//   - index 1: killed by the node's OOM killer on node-b, charged; its replacement runs
//     on node-c, avoiding node-b;
//   - index 2: runs on node-a, nothing to say.
func blameJob() (*batchv1.Job, []runtime.Object) {
	job := wrappers.MakeJob("train", "default").ManagedBy(conditions.ManagedBy).Indexed().
		Completions(3).Parallelism(3).BackoffLimitPerIndex(2).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj()
	job.UID = "train-uid"
	job.Annotations = map[string]string{
		v1alpha1.AnnotationAvoidFailedNodes: "required",
		v1alpha1.AnnotationDisruptionBudget: "device=1,node-oom=5,default=20",
	}
	job.Status = batchv1.JobStatus{Active: 3, Failed: 1, StartTime: &metav1.Time{Time: t0}}

	deviceDeath := func(w *wrappers.PodWrapper, id string) *wrappers.PodWrapper {
		msg := "container main died: its device coroner.dev/test-gpu " + id + " is Unhealthy (the kubelet's device health) since 2026-01-02T03:00:58Z"
		withCondition(w, corev1.DisruptionTarget, conditions.ReasonDeviceFailure, msg)
		return withCondition(w, conditions.DeviceFailed, conditions.ReasonDeviceFailure, msg)
	}
	on := func(w *wrappers.PodWrapper, node, uid string) *wrappers.PodWrapper {
		w.Spec.NodeName, w.UID = node, types.UID(uid)
		return w
	}

	first := deviceDeath(on(ownedPod(job, "train-0-a", 0), "node-a", "aaaa1111-0000-4000-8000-000000000001").
		Index(0).Phase(corev1.PodFailed).ExitedContainer("main", 1).FinishedAt(t0.Add(time.Minute)), "gpu-0").
		Annotation(v1alpha1.AnnotationBudgetVerdict, "charged device").Obj()
	var r v1alpha1.Record
	r.Add(0, record.Of(first, record.Decision{Outcome: v1alpha1.OutcomeIgnored, Rule: 0, Action: batchv1.PodFailurePolicyActionIgnore,
		Consequence: "not counted, the pod will be replaced"}, metav1.NewTime(t0.Add(70*time.Second))))
	rec := v1alpha1.New("default", "train", "train-uid")
	rec.Set(r, 100)

	second := deviceDeath(on(ownedPod(job, "train-0-b", 2*time.Minute), "node-b", "bbbb2222-0000-4000-8000-000000000002").
		Index(0).Phase(corev1.PodFailed).ExitedContainer("main", 1).FinishedAt(t0.Add(3*time.Minute)), "gpu-1").
		Annotation(v1alpha1.AnnotationAvoidedNodes, "node-a=device").
		Annotation(v1alpha1.AnnotationDisruptionsCharged, "device=aaaa1111").
		Annotation(batchv1.JobIndexIgnoredFailureCountAnnotation, "1").
		Annotation(v1alpha1.AnnotationBudgetVerdict, "spent device").Obj()

	third := ownedPod(job, "train-0-c", 4*time.Minute).Index(0).Phase(corev1.PodPending).
		Annotation(v1alpha1.AnnotationAvoidedNodes, "node-a=device,node-b=device").
		Annotation(v1alpha1.AnnotationDisruptionsCharged, "device=aaaa1111").
		Annotation(batchv1.JobIndexFailureCountAnnotation, "1").
		Annotation(batchv1.JobIndexIgnoredFailureCountAnnotation, "1")
	third.Spec.NodeName = ""
	third.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-a", "node-b"}}}}},
	}}}
	third.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: unschedulableMsg}}

	oom := withCondition(withReason(on(ownedPod(job, "train-1-a", 0), "node-b", "cccc3333-0000-4000-8000-000000000003").
		Index(1).Phase(corev1.PodFailed).ExitedContainer("main", 137).FinishedAt(t0.Add(90*time.Second)), "main", "OOMKilled"),
		corev1.DisruptionTarget, conditions.ReasonNodeOOMKill, "container main was killed by the node's OOM killer").
		Annotation(v1alpha1.AnnotationBudgetVerdict, "charged node-oom").Obj()
	next := on(ownedPod(job, "train-1-b", 2*time.Minute), "node-c", "dddd4444").Index(1).Phase(corev1.PodRunning).RunningContainer("main").
		Annotation(v1alpha1.AnnotationAvoidedNodes, "node-b=node-oom").
		Annotation(v1alpha1.AnnotationDisruptionsCharged, "node-oom=cccc3333").
		Annotation(batchv1.JobIndexIgnoredFailureCountAnnotation, "1").Obj()
	quiet := ownedPod(job, "train-2-a", 0).Index(2).Phase(corev1.PodRunning).RunningContainer("main").Obj()
	return job, []runtime.Object{job, rec, second, third.Obj(), oom, next, quiet}
}

func TestNodeBlameStory(t *testing.T) {
	_, objs := blameJob()
	got := explainJob(t, "default", "train", objs...)
	assertLinesInOrder(t, got, []string{
		"Failed pods (2):",
		"  train-1-a  index 1  node node-b  finished 2026-01-02T03:01:30Z",
		"    blame:      node node-b is blamed (node-oom): its replacement avoids it (avoid-failed-nodes: required)",
		"    rule:       rule 0 (Ignore): pod condition DisruptionTarget",
		"    action:     not counted; the pod is replaced; charged to its node-oom budget (1/5)",
		"  train-0-b  index 0  node node-b  finished 2026-01-02T03:03:00Z",
		"    avoids:     node-a (device); avoid-failed-nodes: required",
		"    blame:      node node-b is blamed (device): its replacement avoids it (avoid-failed-nodes: required)",
		"    rule:       rule 0 (Ignore): pod condition DisruptionTarget",
		"    action:     counted: its device budget (1) was spent; failure 1 of index 0, within backoffLimitPerIndex 2: the index is retried",
		"Pods that are gone (1, from coroner-shim's record):",
		"  train-0-a  index 0  node node-a",
		"Other pods (3):",
		"  train-0-c  index 0  Pending: not scheduled: Unschedulable: 0/3 nodes are available",
		"    WARNING:    cannot be scheduled: it avoids nodes node-a, node-b (avoid-failed-nodes: required); scheduler: " + unschedulableMsg,
		"    avoids:     node-a (device), node-b (device); avoid-failed-nodes: required",
		"  and 2 running without restarts or warnings",
		"Indexes:",
		"  INDEX  STATE   FAILURES  IGNORED  PODS",
		"  0      active  1         1        train-0-b (Failed), train-0-c (Pending)",
		"  1      active  0         1        train-1-a (Failed), train-1-b (Running)",
		"  2      active  0         0        train-2-a (Running)",
		"Nodes avoided and disruption budgets:",
		"  avoid-failed-nodes: required",
		"  disruption-budget:  device=1,node-oom=5,default=20",
		"  index 0:",
		"    avoids:     node-a (device: train-0-a), node-b (device: train-0-b), carried by train-0-c",
		"    budget:     device 1/1 spent (counted since: train-0-b), node-oom 0/5, default 0/20",
		"    WARNING:    train-0-c cannot be scheduled: it avoids nodes node-a, node-b (avoid-failed-nodes: required); scheduler: " + unschedulableMsg,
		"  index 1:",
		"    avoids:     node-b (node-oom: train-1-a), carried by train-1-b",
		"    budget:     device 0/1, node-oom 1/5, default 0/20",
	})
	if strings.Contains(got, "index 2:") {
		t.Error("index 2 has nothing to say but is listed")
	}

	// The JSON report carries the same, for tools.
	client := fakeClient(t, objs...)
	var out bytes.Buffer
	r, err := JobReport(context.Background(), client, "default", "train")
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(r.NodeBlame)
	if err != nil {
		t.Fatal(err)
	}
	var nb NodeBlameReport
	if err := json.Unmarshal(js, &nb); err != nil {
		t.Fatal(err)
	}
	want := BlameGroup{Index: ptr.To(0), Pod: "train-0-c",
		Nodes: []AvoidedNodeReport{{Node: "node-a", Class: "device", Pods: []string{"train-0-a"}, Avoided: true}, {Node: "node-b", Class: "device", Pods: []string{"train-0-b"}, Avoided: true}},
		Budgets: []BudgetUse{{Class: "device", Charged: 1, Limit: 1, Spent: true, Counted: []string{"train-0-b"}},
			{Class: "node-oom", Limit: 5}, {Class: "default", Limit: 20}},
		Unschedulable: []string{"train-0-c cannot be scheduled: it avoids nodes node-a, node-b (avoid-failed-nodes: required); scheduler: " + unschedulableMsg}}
	if len(nb.Groups) != 2 {
		t.Fatalf("groups %+v, want indexes 0 and 1", nb.Groups)
	}
	if diff := cmp.Diff(want, nb.Groups[0]); diff != "" {
		t.Errorf("index 0 (-want +got):\n%s", diff)
	}
	if c := r.DeepCopyObject().(*Report); !cmp.Equal(c.NodeBlame, r.NodeBlame) {
		t.Error("DeepCopyObject loses the node-blame report")
	}

	// The pod that cannot be scheduled, alone.
	pr, err := Pod(context.Background(), client, "default", "train-0-c")
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := pr.Write(&out); err != nil {
		t.Fatal(err)
	}
	assertLinesInOrder(t, out.String(), []string{
		"Pod default/train-0-c",
		"  state:      Pending",
		"  WARNING:    cannot be scheduled: it avoids nodes node-a, node-b (avoid-failed-nodes: required); scheduler: 0/3 nodes are available",
		"  avoids:     node-a (device), node-b (device); avoid-failed-nodes: required",
	})
}

// TestNodeBlameNonIndexed: a NonIndexed Job is one group; a failure coroner-shim has not
// marked yet is told as its budget will take it, from what the pod carries; a node a
// death blamed but no replacement carries yet is told apart.
func TestNodeBlameNonIndexed(t *testing.T) {
	job := wrappers.MakeJob("etl", "default").ManagedBy(conditions.ManagedBy).BackoffLimit(3).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
			wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, conditions.ForcefullyTerminated)).Obj()
	job.UID = "etl-uid"
	job.Annotations = map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "preferred", v1alpha1.AnnotationDisruptionBudget: "node-lost=1"}
	job.Status = batchv1.JobStatus{Active: 1, StartTime: &metav1.Time{Time: t0}}
	lost := func(name, node string, created time.Duration) *wrappers.PodWrapper {
		w := withCondition(ownedPod(job, name, created).Phase(corev1.PodFailed).ExitedContainer("main", 137).FinishedAt(t0.Add(created+time.Minute)),
			conditions.ForcefullyTerminated, conditions.ReasonNodeFenced, "node "+node+" fenced its pods")
		w.Spec.NodeName = node
		return w
	}
	for _, tc := range []struct {
		name       string
		charged    string // on the pod that just failed
		wantAction string
		wantBudget string
	}{
		{name: "within the budget", wantAction: "not counted; the pod is replaced; to be charged to its node-lost budget (1/1; coroner-shim has not marked it yet)",
			wantBudget: "    budget:     node-lost 0/1"},
		{name: "past the budget", charged: "node-lost=eeee5555", wantAction: "counted: its node-lost budget (1) is spent (1 charged before this pod; coroner-shim has not marked it yet); it counts towards backoffLimit 3 (status.failed 0)",
			wantBudget: "    budget:     node-lost 1/1 spent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := lost("etl-b", "node-b", 2*time.Minute)
			if tc.charged != "" {
				w.Annotation(v1alpha1.AnnotationDisruptionsCharged, tc.charged).Annotation(v1alpha1.AnnotationAvoidedNodes, "node-a=node-lost")
			}
			r := Build(job, []*corev1.Pod{w.Obj()}, nil)
			var out bytes.Buffer
			if err := r.Write(&out); err != nil {
				t.Fatal(err)
			}
			got := out.String()
			t.Logf("output:\n%s", got)
			want := []string{
				"  etl-b  node node-b  finished 2026-01-02T03:03:00Z",
				"    blame:      node node-b is blamed (node-lost): its replacement avoids it (avoid-failed-nodes: preferred)",
				"    action:     " + tc.wantAction,
				"Nodes avoided and disruption budgets:",
				"  avoid-failed-nodes: preferred",
				"  disruption-budget:  node-lost=1",
				"  the Job:",
			}
			if tc.charged != "" {
				want = append(want, "    avoids:     node-a (node-lost), carried by etl-b")
			}
			want = append(want, "    blamed:     node-b (node-lost: etl-b); not carried by the newest pod", tc.wantBudget)
			assertLinesInOrder(t, got, want)
		})
	}
}

// TestNodeBlameProblems: annotations that do not parse are said, with what the shim does
// instead; a Job without the annotations, whose pods carry none, has no such section.
func TestNodeBlameProblems(t *testing.T) {
	job := wrappers.MakeJob("j", "default").ManagedBy(conditions.ManagedBy).Obj()
	job.UID = "j-uid"
	job.Annotations = map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "always", v1alpha1.AnnotationDisruptionBudget: "gpu=3"}
	var out bytes.Buffer
	if err := Build(job, nil, nil).Write(&out); err != nil {
		t.Fatal(err)
	}
	assertLinesInOrder(t, out.String(), []string{
		"Nodes avoided and disruption budgets:",
		"  avoid-failed-nodes: not set (coroner-shim's --avoid-failed-nodes decides)",
		"  disruption-budget:  not set (Ignore is unbounded)",
		`  PROBLEM:            coroner.dev/avoid-failed-nodes "always": want preferred, required or none; coroner-shim uses its --avoid-failed-nodes default`,
		`  PROBLEM:            coroner.dev/disruption-budget "gpu=3": unknown class "gpu"`,
		"  no node blamed, no disruption charged",
	})

	// On a Job coroner-shim does not run, the annotations do nothing: said.
	job.Spec.ManagedBy = nil
	job.Annotations = map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "none"}
	out.Reset()
	if err := Build(job, nil, nil).Write(&out); err != nil {
		t.Fatal(err)
	}
	assertLinesInOrder(t, out.String(), []string{
		"  avoid-failed-nodes: none (the nodes are remembered, not avoided)",
		"  PROBLEM:            coroner-shim does not run this Job (spec.managedBy is not coroner.dev/shim): the annotations have no effect",
	})

	job.Annotations = nil
	p := withCondition(ownedPod(job, "j-a", 0).Phase(corev1.PodFailed).ExitedContainer("main", 137), corev1.DisruptionTarget, conditions.ReasonNodeOOMKill, "").Obj()
	r := Build(job, []*corev1.Pod{p}, nil)
	out.Reset()
	if err := r.Write(&out); err != nil {
		t.Fatal(err)
	}
	if r.NodeBlame != nil || strings.Contains(out.String(), "Nodes avoided") || strings.Contains(out.String(), "blame:") {
		t.Errorf("a Job without the annotations tells a node-blame story:\n%s", out.String())
	}
}
