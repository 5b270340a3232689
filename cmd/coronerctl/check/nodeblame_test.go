package check

import (
	"bytes"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// finding is what a test expects of one finding: its severity, the end of its field
// path, a substring of its message.
type finding struct {
	sev   Severity
	field string
	text  string
}

// nodeBlameFindings are the findings on the node-blame annotations, wherever they are.
func nodeBlameFindings(fs []Finding) []Finding {
	var out []Finding
	for _, f := range fs {
		if strings.Contains(f.Field, v1alpha1.AnnotationAvoidFailedNodes) || strings.Contains(f.Field, v1alpha1.AnnotationDisruptionBudget) {
			out = append(out, f)
		}
	}
	return out
}

func matchFindings(t *testing.T, got []Finding, want []finding) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("findings:\n%s\nwant %d: %+v", findingsText(got), len(want), want)
	}
	for i, w := range want {
		g := got[i]
		if g.Severity != w.sev || !strings.HasSuffix(g.Field, w.field) || !strings.Contains(g.Message, w.text) {
			t.Errorf("finding %d: %s\nwant %v at ...%s saying %q", i, g, w.sev, w.field, w.text)
		}
	}
}

func findingsText(fs []Finding) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString("  " + f.String() + "\n")
	}
	return b.String()
}

const (
	avoidKey  = "metadata.annotations[coroner.dev/avoid-failed-nodes]"
	budgetKey = "metadata.annotations[coroner.dev/disruption-budget]"
)

func TestNodeBlameAnnotations(t *testing.T) {
	ignore := batchv1.PodFailurePolicyActionIgnore
	// A GPU training Job handed to coroner that ignores disruptions.
	base := func() *wrappers.JobWrapper {
		return wrappers.MakeJob("train", "ml").ManagedBy(conditions.ManagedBy).Indexed().Completions(4).Parallelism(4).BackoffLimitPerIndex(1).
			PodFailurePolicy(wrappers.OnPodCondition(ignore, corev1.DisruptionTarget))
	}
	pinHost := func(values ...string) func(*batchv1.Job) {
		return func(j *batchv1.Job) {
			j.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: values}}}},
			}}}
		}
	}
	// Kueue's and the author's terms: every term names gpu-7 by metadata.name, beside a zone.
	pinFieldEveryTerm := func(j *batchv1.Job) {
		name := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"gpu-7"}}
		zone := func(z string) []corev1.NodeSelectorRequirement {
			return []corev1.NodeSelectorRequirement{{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{z}}}
		}
		j.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: zone("eu-west-1a"), MatchFields: []corev1.NodeSelectorRequirement{name}},
				{MatchExpressions: zone("eu-west-1b"), MatchFields: []corev1.NodeSelectorRequirement{name}},
			},
		}}}
	}
	// One term pins, the other allows a whole zone: not pinned.
	pinOneTermOnly := func(j *batchv1.Job) {
		pinFieldEveryTerm(j)
		j.Spec.Template.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[1].MatchFields = nil
	}
	for _, tc := range []struct {
		name        string
		job         *wrappers.JobWrapper
		annotations map[string]string
		mutate      func(*batchv1.Job)
		want        []finding
	}{
		{name: "valid, handed to coroner, unpinned", job: base(),
			annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required", v1alpha1.AnnotationDisruptionBudget: "device=3,node-oom=5,node-lost=5,default=20"}},
		{name: "none and preferred are valid", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: " preferred "}},
		{name: "an unknown avoidance", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "always"},
			want: []finding{{Error, avoidKey, `"always": want preferred, required or none; coroner-shim ignores it`}}},
		{name: "each bad part of a budget is named", job: base(), annotations: map[string]string{v1alpha1.AnnotationDisruptionBudget: "device=3,gpu=2,node-oom=x,default=500,preemption"},
			want: []finding{
				{Error, budgetKey, `unknown class "gpu" (want device, node-oom, node-pressure, node-lost, node-shutdown, preemption, eviction, default)`},
				{Error, budgetKey, `node-oom="x": want a whole number from 0 to 100`},
				{Error, budgetKey, `default="500": want a whole number from 0 to 100`},
				{Error, budgetKey, `"preemption" is not class=N`},
			}},
		{name: "a class named twice", job: base(), annotations: map[string]string{v1alpha1.AnnotationDisruptionBudget: "device=3, device=4"},
			want: []finding{{Error, budgetKey, `"device=3, device=4": class device is named twice`}}},
		{name: "an empty budget", job: base(), annotations: map[string]string{v1alpha1.AnnotationDisruptionBudget: ""},
			want: []finding{{Error, budgetKey, `coroner.dev/disruption-budget is empty: want class=N`}}},
		{name: "another controller's Job", job: base().ManagedBy("kueue.x-k8s.io/multikueue"),
			annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required", v1alpha1.AnnotationDisruptionBudget: "device=3"},
			want: []finding{
				{Warning, avoidKey, `has no effect: only coroner-shim avoids nodes and keeps disruption budgets, and spec.managedBy "kueue.x-k8s.io/multikueue" does not hand this Job to it`},
				{Warning, budgetKey, `has no effect: only coroner-shim`},
			}},
		{name: "no managedBy: the built-in controller, unless the namespace opts in", job: wrappers.MakeJob("train", "ml").PodFailurePolicy(wrappers.OnPodCondition(ignore, corev1.DisruptionTarget)),
			annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "preferred"},
			want:        []finding{{Warning, avoidKey, "unless the namespace is opted in, labelled coroner.dev/jobs=managed"}}},
		{name: "a budget without a podFailurePolicy", job: wrappers.MakeJob("train", "ml").ManagedBy(conditions.ManagedBy),
			annotations: map[string]string{v1alpha1.AnnotationDisruptionBudget: "node-oom=2"},
			want:        []finding{{Hint, budgetKey, "the budget never applies: it bounds the failures that an Ignore rule of the podFailurePolicy ignores, and this Job has no podFailurePolicy"}}},
		{name: "a budget with no Ignore rule", job: wrappers.MakeJob("train", "ml").ManagedBy(conditions.ManagedBy).
			PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionCount, corev1.DisruptionTarget), wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)),
			annotations: map[string]string{v1alpha1.AnnotationDisruptionBudget: "default=2"},
			want:        []finding{{Hint, budgetKey, "no rule of this Job's has action Ignore"}}},
		{name: "required on a kubernetes.io/hostname nodeSelector", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required"},
			mutate: func(j *batchv1.Job) {
				j.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "gpu-7"}
			},
			want: []finding{{Warning, avoidKey, "is required but the template pins its pods to node gpu-7 (spec.template.spec.nodeSelector kubernetes.io/hostname): once that node kills a pod"}}},
		{name: "required on nodeName", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required"},
			mutate: func(j *batchv1.Job) { j.Spec.Template.Spec.NodeName = "gpu-7" },
			want:   []finding{{Warning, avoidKey, "pins its pods to node gpu-7 (spec.template.spec.nodeName)"}}},
		{name: "required on affinity naming one node in every term", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required"},
			mutate: pinFieldEveryTerm,
			want:   []finding{{Warning, avoidKey, "pins its pods to node gpu-7 (spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)"}}},
		{name: "required on kubernetes.io/hostname In [one]", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required"},
			mutate: pinHost("gpu-7"), want: []finding{{Warning, avoidKey, "pins its pods to node gpu-7"}}},
		{name: "required on a few hostnames: a hint", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required"},
			mutate: pinHost("gpu-8", "gpu-7"), want: []finding{{Hint, avoidKey, "the template allows only nodes gpu-7, gpu-8"}}},
		{name: "required, one term unpinned", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required"}, mutate: pinOneTermOnly},
		{name: "preferred on one node is harmless", job: base(), annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "preferred"}, mutate: pinHost("gpu-7")},
		{name: "on the pod template instead of the Job", job: base(),
			mutate: func(j *batchv1.Job) {
				j.Spec.Template.Annotations = map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required"}
			},
			want: []finding{{Warning, "spec.template.metadata.annotations[coroner.dev/avoid-failed-nodes]", "has no effect here: coroner-shim reads it on the Job; put it in metadata.annotations"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := tc.job.Obj()
			job.Annotations = tc.annotations
			if tc.mutate != nil {
				tc.mutate(job)
			}
			matchFindings(t, nodeBlameFindings(Job(job, conditions.ManagedBy)), tc.want)
		})
	}
}

// TestNodeBlameAnnotationsCronJob: a CronJob's Job template is checked at its own paths,
// and the annotations on the CronJob itself are said to belong on the Job template.
func TestNodeBlameAnnotationsCronJob(t *testing.T) {
	j := wrappers.MakeJob("j", "ns").ManagedBy(conditions.ManagedBy).Obj()
	j.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "gpu-7"}
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Annotations: map[string]string{v1alpha1.AnnotationDisruptionBudget: "device=1"}},
		Spec: batchv1.CronJobSpec{Schedule: "@daily", JobTemplate: batchv1.JobTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{v1alpha1.AnnotationAvoidFailedNodes: "required", v1alpha1.AnnotationDisruptionBudget: "device=1"}},
			Spec:       j.Spec}}}
	matchFindings(t, nodeBlameFindings(CronJob(cj, conditions.ManagedBy)), []finding{
		{Warning, "spec.jobTemplate.metadata.annotations[coroner.dev/avoid-failed-nodes]", "pins its pods to node gpu-7"},
		{Hint, "spec.jobTemplate.metadata.annotations[coroner.dev/disruption-budget]", "this Job has no podFailurePolicy"},
		{Warning, "metadata.annotations[coroner.dev/disruption-budget]", "put it in spec.jobTemplate.metadata.annotations"},
	})
}

// TestNodeBlameManifest: the lines `coronerctl check` prints for a manifest (the example
// in docs/explain.md).
func TestNodeBlameManifest(t *testing.T) {
	const manifest = `apiVersion: batch/v1
kind: Job
metadata:
  name: train
  namespace: ml
  annotations:
    coroner.dev/avoid-failed-nodes: required
    coroner.dev/disruption-budget: "device=3,gpu=2,node-oom=500"
spec:
  managedBy: coroner.dev/shim
  completionMode: Indexed
  completions: 4
  parallelism: 4
  backoffLimitPerIndex: 1
  activeDeadlineSeconds: 600
  podFailurePolicy:
    rules:
    - action: Ignore
      onPodConditions:
      - type: DisruptionTarget
  template:
    spec:
      restartPolicy: Never
      nodeSelector:
        kubernetes.io/hostname: gpu-7
      containers:
      - name: main
        image: trainer:1
`
	res, err := Manifest(strings.NewReader(manifest), "train.yaml", conditions.ManagedBy)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if !report(&out, res) {
		t.Error("the check passes")
	}
	want := `train.yaml: Job ml/train: warning: metadata.annotations[coroner.dev/avoid-failed-nodes]: is required but the template pins its pods to node gpu-7 (spec.template.spec.nodeSelector kubernetes.io/hostname): once that node kills a pod, the replacement avoids the only node it may run on and stays Pending, unschedulable; use preferred, or unpin the template
train.yaml: Job ml/train: error: metadata.annotations[coroner.dev/disruption-budget]: "device=3,gpu=2,node-oom=500": unknown class "gpu" (want device, node-oom, node-pressure, node-lost, node-shutdown, preemption, eviction, default)
train.yaml: Job ml/train: error: metadata.annotations[coroner.dev/disruption-budget]: "device=3,gpu=2,node-oom=500": node-oom="500": want a whole number from 0 to 100
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}
