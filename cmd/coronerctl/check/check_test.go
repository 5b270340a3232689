package check

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// goodJob is the README's example: handed to coroner, Indexed with per-index backoff, a
// FailIndex rule and an Ignore rule on disruptions. It has no finding at all.
func goodJob() *wrappers.JobWrapper {
	return wrappers.MakeJob("train", "default").ManagedBy(conditions.ManagedBy).Indexed().
		Completions(4).Parallelism(4).BackoffLimitPerIndex(1).MaxFailedIndexes(2).
		PodFailurePolicy(
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42).InContainer("main"),
			wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
		)
}

func TestJob(t *testing.T) {
	cases := []struct {
		name string
		job  *batchv1.Job
		// want are substrings of findings (Finding.String()), each of which must be found.
		want []string
		// wantFail is whether the findings fail the check.
		wantFail bool
	}{
		{
			name: "the README's Job is clean",
			job:  goodJob().Obj(),
		},
		{
			name: "a short NonIndexed Job with a deadline needs no Ignore rule",
			job: wrappers.MakeJob("short", "default").ManagedBy(conditions.ManagedBy).ActiveDeadlineSeconds(600).
				PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 3)).Obj(),
		},
		{
			name:     "FailIndex without backoffLimitPerIndex",
			job:      wrappers.MakeJob("j", "d").ManagedBy(conditions.ManagedBy).PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42), wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj(),
			want:     []string{`error: spec.podFailurePolicy.rules[0].action: Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set`},
			wantFail: true,
		},
		{
			name: "onExitCodes with restartPolicy OnFailure",
			job:  goodJob().RestartPolicy(corev1.RestartPolicyOnFailure).Obj(),
			want: []string{
				`error: spec.template.spec.restartPolicy: Invalid value: "OnFailure": only "Never" is supported when podFailurePolicy is specified`,
				`error: spec.podFailurePolicy.rules[0].onExitCodes: never matches with restartPolicy OnFailure`,
			},
			wantFail: true,
		},
		{
			name:     "no managedBy",
			job:      func() *batchv1.Job { j := goodJob().Obj(); j.Spec.ManagedBy = nil; return j }(),
			want:     []string{"warning: spec.managedBy: not set: the built-in Job controller runs this Job"},
			wantFail: true,
		},
		{
			name:     "another controller's managedBy",
			job:      goodJob().ManagedBy("kueue.x-k8s.io/multikueue").Obj(),
			want:     []string{`warning: spec.managedBy: is "kueue.x-k8s.io/multikueue": coroner-shim runs only Jobs whose managedBy is coroner.dev/shim`},
			wantFail: true,
		},
		{
			name:     "invalid managedBy",
			job:      goodJob().ManagedBy("shim").Obj(),
			want:     []string{`error: spec.managedBy: Invalid value: "shim": must be a domain-prefixed path`},
			wantFail: true,
		},
		{
			name:     "managedBy too long",
			job:      goodJob().ManagedBy("coroner.dev/" + strings.Repeat("s", 60)).Obj(),
			want:     []string{"error: spec.managedBy: Too long: may not be more than 63 bytes"},
			wantFail: true,
		},
		{
			name: "long-running Job without Ignore on DisruptionTarget is a hint only",
			job: wrappers.MakeJob("j", "d").ManagedBy(conditions.ManagedBy).
				PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 3)).Obj(),
			want: []string{"hint: spec.podFailurePolicy.rules: no Ignore rule on the DisruptionTarget condition for a long-running Job (no activeDeadlineSeconds)"},
		},
		{
			name: "a deadline over LongRunning still gets the hint",
			job:  wrappers.MakeJob("j", "d").ManagedBy(conditions.ManagedBy).ActiveDeadlineSeconds(7200).Obj(),
			want: []string{"hint: spec.podFailurePolicy: no Ignore rule on the DisruptionTarget condition for a long-running Job (activeDeadlineSeconds 7200)"},
		},
		{
			name: "Ignore on DisruptionTarget=False does not count as ignoring disruptions",
			job: wrappers.MakeJob("j", "d").ManagedBy(conditions.ManagedBy).
				PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget).Status(corev1.ConditionFalse)).Obj(),
			want: []string{"hint: spec.podFailurePolicy.rules: no Ignore rule"},
		},
		{
			name:     "exit code 137 under In",
			job:      goodJob().PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 1, 137), wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj(),
			want:     []string{"warning: spec.podFailurePolicy.rules[0].onExitCodes.values[1]: 137 is any SIGKILL", "coroner.dev/OOMKilled"},
			wantFail: true,
		},
		{
			name: "exit code 137 under NotIn is fine",
			job:  goodJob().PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpNotIn, 137), wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj(),
		},
		{
			name: "onExitCodes: operator, containerName, values",
			job: goodJob().PodFailurePolicy(
				&wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{Action: batchv1.PodFailurePolicyActionCount,
					OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{ContainerName: ptr.To("mian"), Values: []int32{5, 0, 5}}}},
				wrappers.OnExitCodes(batchv1.PodFailurePolicyActionCount, "Between", 1),
				wrappers.OnExitCodes(batchv1.PodFailurePolicyActionCount, batchv1.PodFailurePolicyOnExitCodesOpNotIn),
				wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
			).Obj(),
			want: []string{
				`error: spec.podFailurePolicy.rules[0].onExitCodes.operator: Required value: valid values: ["In" "NotIn"]`,
				`error: spec.podFailurePolicy.rules[0].onExitCodes.containerName: Invalid value: "mian": must be one of the container or initContainer names in the pod template`,
				`error: spec.podFailurePolicy.rules[0].onExitCodes.values[2]: Duplicate value: 5`,
				`error: spec.podFailurePolicy.rules[0].onExitCodes.values: Invalid value: [5,0,5]: must be ordered`,
				`error: spec.podFailurePolicy.rules[1].onExitCodes.operator: Unsupported value: "Between": supported values: "In", "NotIn"`,
				`error: spec.podFailurePolicy.rules[2].onExitCodes.values: Invalid value: null: at least one value is required`,
			},
			wantFail: true,
		},
		{
			name:     "exit code 0 under In",
			job:      goodJob().PodFailurePolicy(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionCount, batchv1.PodFailurePolicyOnExitCodesOpIn, 0, 1), wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj(),
			want:     []string{`error: spec.podFailurePolicy.rules[0].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator`},
			wantFail: true,
		},
		{
			name: "rule actions and requirements",
			job: goodJob().PodFailurePolicy(
				&wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}},
				&wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{Action: "Retry", OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}},
				&wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{Action: batchv1.PodFailurePolicyActionCount}},
				&wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{Action: batchv1.PodFailurePolicyActionCount,
					OnExitCodes:     &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{1}},
					OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}},
				wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, "not a/valid/type").Status("Maybe"),
			).Obj(),
			want: []string{
				`error: spec.podFailurePolicy.rules[0].action: Required value: valid values: ["Count" "FailIndex" "FailJob" "Ignore"]`,
				`error: spec.podFailurePolicy.rules[1].action: Unsupported value: "Retry": supported values: "Count", "FailIndex", "FailJob", "Ignore"`,
				`error: spec.podFailurePolicy.rules[2]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required`,
				`error: spec.podFailurePolicy.rules[3]: Invalid value: specifying both OnExitCodes and OnPodConditions is not supported`,
				`error: spec.podFailurePolicy.rules[4].onPodConditions[0].type: Invalid value: "not a/valid/type"`,
				`error: spec.podFailurePolicy.rules[4].onPodConditions[0].status: Unsupported value: "Maybe": supported values: "False", "True", "Unknown"`,
			},
			wantFail: true,
		},
		{
			name: "too many rules",
			job: func() *batchv1.Job {
				var rules []*wrappers.RuleWrapper
				for i := 0; i < 21; i++ {
					rules = append(rules, wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget))
				}
				return goodJob().PodFailurePolicy(rules...).Obj()
			}(),
			want:     []string{"error: spec.podFailurePolicy.rules: Too many: 21: must have at most 20 items"},
			wantFail: true,
		},
		{
			name: "backoffLimitPerIndex and maxFailedIndexes need Indexed",
			job: wrappers.MakeJob("j", "d").ManagedBy(conditions.ManagedBy).ActiveDeadlineSeconds(60).
				BackoffLimitPerIndex(1).MaxFailedIndexes(1).Obj(),
			want: []string{
				"error: spec.backoffLimitPerIndex: Invalid value: 1: requires indexed completion mode",
				"error: spec.maxFailedIndexes: Invalid value: 1: requires indexed completion mode",
			},
			wantFail: true,
		},
		{
			name: "maxFailedIndexes without backoffLimitPerIndex, negative counts",
			job: goodJob().Parallelism(-1).BackoffLimit(-2).MaxFailedIndexes(1).
				Obj(),
			wantFail: true,
			want: []string{
				"error: spec.parallelism: Invalid value: -1: must be greater than or equal to 0",
				"error: spec.backoffLimit: Invalid value: -2: must be greater than or equal to 0",
			},
		},
		{
			name: "maxFailedIndexes alone",
			job: func() *batchv1.Job {
				j := goodJob().PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj()
				j.Spec.BackoffLimitPerIndex = nil
				return j
			}(),
			want:     []string{"error: spec.backoffLimitPerIndex: Required value: when maxFailedIndexes is specified"},
			wantFail: true,
		},
		{
			name: "Indexed without completions",
			job: func() *batchv1.Job {
				j := goodJob().Obj()
				j.Spec.Completions = nil
				j.Spec.MaxFailedIndexes = nil
				return j
			}(),
			want:     []string{"error: spec.completions: Required value: when completion mode is Indexed"},
			wantFail: true,
		},
		{
			name: "unknown completion mode",
			job: func() *batchv1.Job {
				j := goodJob().Obj()
				j.Spec.CompletionMode = ptr.To(batchv1.CompletionMode("Sharded"))
				return j
			}(),
			want:     []string{`error: spec.completionMode: Unsupported value: "Sharded": supported values: "NonIndexed", "Indexed"`},
			wantFail: true,
		},
		{
			name: "limits of indexes.CheckLimits",
			job:  goodJob().Completions(200_000).Parallelism(20_000).MaxFailedIndexes(20_000).Obj(),
			want: []string{
				"error: spec.maxFailedIndexes: Invalid value: 20000: must be at most 10000 with backoffLimitPerIndex and completions (200000) above 100000",
				"error: spec.parallelism: Invalid value: 20000: must be at most 10000 with backoffLimitPerIndex and completions (200000) above 100000",
			},
			wantFail: true,
		},
		{
			name:     "maxFailedIndexes above completions",
			job:      goodJob().MaxFailedIndexes(5).Obj(),
			want:     []string{"error: spec.maxFailedIndexes: Invalid value: 5: must be at most completions (4)"},
			wantFail: true,
		},
		{
			name:     "podReplacementPolicy with a podFailurePolicy",
			job:      goodJob().PodReplacementPolicy(batchv1.TerminatingOrFailed).Obj(),
			want:     []string{`error: spec.podReplacementPolicy: Unsupported value: "TerminatingOrFailed": supported values: "Failed"`},
			wantFail: true,
		},
		{
			name: "podReplacementPolicy unknown",
			job: wrappers.MakeJob("j", "d").ManagedBy(conditions.ManagedBy).ActiveDeadlineSeconds(60).
				PodReplacementPolicy("Never").Obj(),
			want:     []string{`error: spec.podReplacementPolicy: Unsupported value: "Never": supported values: "Failed", "TerminatingOrFailed"`},
			wantFail: true,
		},
		{
			name: "successPolicy needs Indexed",
			job: wrappers.MakeJob("j", "d").ManagedBy(conditions.ManagedBy).ActiveDeadlineSeconds(60).
				SuccessPolicy(wrappers.SucceededCount(1)).Obj(),
			want:     []string{"error: spec.successPolicy: Invalid value: requires indexed completion mode"},
			wantFail: true,
		},
		{
			name: "successPolicy rules",
			job: goodJob().SuccessPolicy(
				batchv1.SuccessPolicyRule{},
				wrappers.SucceededIndexes("0,2-1"),
				wrappers.SucceededIndexes("1-3,7"),
				batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To("0-1"), SucceededCount: ptr.To[int32](3)},
				wrappers.SucceededCount(5),
			).Obj(),
			want: []string{
				"error: spec.successPolicy.rules[0]: Required value: at least one of succeededCount or succeededIndexes must be specified",
				`error: spec.successPolicy.rules[1].succeededIndexes: Invalid value: "0,2-1": error parsing succeededIndexes: non-increasing order, previous: 2, current: 1`,
				`error: spec.successPolicy.rules[2].succeededIndexes: Invalid value: "1-3,7": error parsing succeededIndexes: too large index: "7"`,
				"error: spec.successPolicy.rules[3].succeededCount: Invalid value: 3: must be less than or equal to 2 (the number of indexes in the specified succeededIndexes field)",
				"error: spec.successPolicy.rules[4].succeededCount: Invalid value: 5: must be less than or equal to 4 (the number of specified completions)",
			},
			wantFail: true,
		},
		{
			name:     "successPolicy without rules",
			job:      func() *batchv1.Job { j := goodJob().Obj(); j.Spec.SuccessPolicy = &batchv1.SuccessPolicy{}; return j }(),
			want:     []string{"error: spec.successPolicy.rules: Required value: at least one rules must be specified"},
			wantFail: true,
		},
		{
			name:     "restartPolicy unset (defaults to Always)",
			job:      goodJob().RestartPolicy("").Obj(),
			want:     []string{`error: spec.template.spec.restartPolicy: Required value: valid values: "OnFailure", "Never"`},
			wantFail: true,
		},
		{
			name:     "Indexed Job name too long for its last pod's hostname",
			job:      func() *batchv1.Job { j := goodJob().Obj(); j.Name = strings.Repeat("a", 62); return j }(),
			want:     []string{"error: metadata.name: Invalid value: \"" + strings.Repeat("a", 62) + "\": will not able to create pod with invalid DNS label: " + strings.Repeat("a", 62) + "-3"},
			wantFail: true,
		},
		{
			name: "no containers, bad container names",
			job: func() *batchv1.Job {
				j := goodJob().PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj()
				j.Spec.Template.Spec.Containers = nil
				j.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "Init"}, {Name: "x"}, {Name: "x"}}
				return j
			}(),
			want: []string{
				"error: spec.template.spec.containers: Required value",
				`error: spec.template.spec.initContainers[0].name: Invalid value: "Init"`,
				`error: spec.template.spec.initContainers[2].name: Duplicate value: "x"`,
			},
			wantFail: true,
		},
		{
			name: "a manual selector must select the template",
			job: func() *batchv1.Job {
				j := goodJob().Obj()
				j.Spec.ManualSelector = ptr.To(true)
				j.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
				return j
			}(),
			want:     []string{"error: spec.template.metadata.labels: Invalid value: null: `selector` does not match template `labels`"},
			wantFail: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Job(tc.job, conditions.ManagedBy)
			var lines []string
			for _, f := range got {
				lines = append(lines, f.String())
			}
			all := strings.Join(lines, "\n")
			if len(tc.want) == 0 && len(got) > 0 {
				t.Errorf("want no finding, got:\n%s", all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("no finding contains %q; got:\n%s", w, all)
				}
			}
			if Fails(got) != tc.wantFail {
				t.Errorf("Fails = %v, want %v; findings:\n%s", Fails(got), tc.wantFail, all)
			}
		})
	}
}

func TestCronJobPaths(t *testing.T) {
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly"},
		Spec: batchv1.CronJobSpec{Schedule: "@daily", JobTemplate: batchv1.JobTemplateSpec{
			Spec: goodJob().BackoffLimitPerIndex(-1).Obj().Spec,
		}},
	}
	got := CronJob(cj, conditions.ManagedBy)
	want := "error: spec.jobTemplate.spec.backoffLimitPerIndex: Invalid value: -1: must be greater than or equal to 0"
	if len(got) != 1 || got[0].String() != want {
		t.Errorf("CronJob findings = %v, want exactly %q", got, want)
	}
}

const manifest = `# a comment-only document first
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: train
  namespace: ml
spec:
  managedBy: coroner.dev/shim
  completionMode: Indexed
  completions: 4
  parallelism: 4
  backoffLimitPerIndex: 1
  podFailurePolicy:
    rules:
    - action: FailIndex
      onExitCodes: {containerName: main, operator: In, values: [42]}
    - action: Ignore
      onPodConditions: [{type: DisruptionTarget}]
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: busybox}]
---
apiVersion: batch/v1
kind: Job
metadata:
  name: typo
spec:
  managedBy: coroner.dev/shim
  activeDeadlineSeconds: 60
  podFailurePolicy:
    rules:
    - action: FailJob
      onExitCode: {operator: In, values: [3]}
  template:
    spec:
      restartPolicy: Never
      containers: [{name: main, image: busybox}]
---
`

func TestManifest(t *testing.T) {
	results, err := Manifest(strings.NewReader(manifest), "jobs.yaml", conditions.ManagedBy)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 {
		t.Fatalf("got %d results, want 2 (the ConfigMap and the empty documents are skipped): %+v", len(results), results)
	}
	if r := results[0]; r.Source != "jobs.yaml (document 2)" || r.Object != "Job ml/train" || len(r.Findings) != 0 {
		t.Errorf("first result = %+v, want a clean Job ml/train in document 2", r)
	}
	r := results[1]
	if r.Source != "jobs.yaml (document 3)" || r.Object != "Job typo" {
		t.Errorf("second result is %s %s, want Job typo in document 3", r.Source, r.Object)
	}
	var lines []string
	for _, f := range r.Findings {
		lines = append(lines, f.String())
	}
	all := strings.Join(lines, "\n")
	for _, w := range []string{
		"error: spec.podFailurePolicy.rules[0].onExitCode: unknown field",
		"error: spec.podFailurePolicy.rules[0]: Invalid value: specifying one of OnExitCodes and OnPodConditions is required",
	} {
		if !strings.Contains(all, w) {
			t.Errorf("no finding contains %q; got:\n%s", w, all)
		}
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	none := filepath.Join(dir, "none.yaml")
	goodYAML := strings.SplitN(manifest, "---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: typo", 2)[0]
	for name, body := range map[string]string{good: goodYAML, bad: manifest, none: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"} {
		if err := os.WriteFile(name, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	var out bytes.Buffer
	o := NewOptions()
	o.Files = []string{good}
	if err := o.Run(&out, nil); err != nil {
		t.Fatalf("Run(good) = %v, want nil; output:\n%s", err, out.String())
	}
	if want := good + " (document 2): Job ml/train: ok\n"; out.String() != want {
		t.Errorf("Run(good) printed %q, want %q", out.String(), want)
	}

	out.Reset()
	o.Files = []string{bad}
	if err := o.Run(&out, nil); !errors.Is(err, ErrFailed) {
		t.Fatalf("Run(bad) = %v, want ErrFailed", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !strings.HasPrefix(line, bad+" (document ") {
			t.Errorf("line %q does not start with the source", line)
		}
	}
	if !strings.Contains(out.String(), "Job typo: error: spec.podFailurePolicy.rules[0].onExitCode: unknown field") {
		t.Errorf("Run(bad) output lacks the unknown field:\n%s", out.String())
	}

	out.Reset()
	o.Files = []string{"-"}
	if err := o.Run(&out, strings.NewReader(goodYAML)); err != nil || !strings.HasPrefix(out.String(), "<stdin> (document 2): Job ml/train: ok") {
		t.Errorf("Run(-) = %v, output %q", err, out.String())
	}

	o.Files = []string{none}
	if err := o.Run(&out, nil); err == nil || !strings.Contains(err.Error(), "no batch/v1 Job or CronJob") {
		t.Errorf("Run(none) = %v, want the no-Job error", err)
	}
	o.Files = nil
	if err := o.Run(&out, nil); err == nil {
		t.Error("Run without files succeeded")
	}
}
