package check

import (
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const (
	failJob   = batchv1.PodFailurePolicyActionFailJob
	failIndex = batchv1.PodFailurePolicyActionFailIndex
	ignore    = batchv1.PodFailurePolicyActionIgnore
	count     = batchv1.PodFailurePolicyActionCount
	in        = batchv1.PodFailurePolicyOnExitCodesOpIn
	notIn     = batchv1.PodFailurePolicyOnExitCodesOpNotIn
)

// onConditions is a rule with several onPodConditions patterns, "Type" or "Type=Status".
func onConditions(action batchv1.PodFailurePolicyAction, patterns ...string) *wrappers.RuleWrapper {
	r := &wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{Action: action}}
	for _, p := range patterns {
		t, s, _ := strings.Cut(p, "=")
		r.OnPodConditions = append(r.OnPodConditions, batchv1.PodFailurePolicyOnPodConditionsPattern{
			Type: corev1.PodConditionType(t), Status: corev1.ConditionStatus(s)})
	}
	return r
}

// findingLines are the findings' strings that contain substr.
func findingLines(findings []Finding, substr string) []string {
	var out []string
	for _, f := range findings {
		if s := f.String(); strings.Contains(s, substr) {
			out = append(out, s)
		}
	}
	return out
}

func TestConditionTypes(t *testing.T) {
	cases := []struct {
		name     string
		typ      corev1.PodConditionType
		wantSev  Severity
		wantMsg  string // empty: no finding
		wantFail bool
	}{
		{name: "coroner's OOMKilled", typ: conditions.OOMKilled},
		{name: "coroner's ForcefullyTerminated", typ: conditions.ForcefullyTerminated},
		{name: "DisruptionTarget", typ: corev1.DisruptionTarget},
		{name: "AllContainersRestarting (v0.36)", typ: corev1.AllContainersRestarting},
		{name: "PodResizeInProgress", typ: corev1.PodResizeInProgress},
		{
			name: "a letter missing from coroner's type", typ: "coroner.dev/OOMKiled", wantSev: Warning, wantFail: true,
			wantMsg: `unknown condition type "coroner.dev/OOMKiled" (no such condition type), the rule never matches: did you mean coroner.dev/OOMKilled?`,
		},
		{
			name: "a letter missing from upstream's type", typ: "DisruptonTarget", wantSev: Warning, wantFail: true,
			wantMsg: `unknown condition type "DisruptonTarget" (no such condition type), the rule never matches: did you mean DisruptionTarget?`,
		},
		{
			name: "case differs", typ: "disruptionTarget", wantSev: Warning, wantFail: true,
			wantMsg: `unknown condition type "disruptionTarget" (condition types are case-sensitive), the rule never matches: did you mean DisruptionTarget?`,
		},
		{
			name: "case differs in coroner's type", typ: "coroner.dev/OomKilled", wantSev: Warning, wantFail: true,
			wantMsg: "(condition types are case-sensitive), the rule never matches: did you mean coroner.dev/OOMKilled?",
		},
		{name: "transposed letters", typ: "Raedy", wantSev: Warning, wantFail: true, wantMsg: "did you mean Ready?"},
		{name: "two typos in a long type", typ: "PodResizePendnig", wantSev: Warning, wantFail: true, wantMsg: "did you mean PodResizePending?"},
		{name: "coroner's name without its prefix (the container's reason)", typ: "OOMKilled", wantSev: Warning, wantFail: true, wantMsg: "did you mean coroner.dev/OOMKilled?"},
		{name: "coroner's name under a wrong prefix", typ: "coroner.io/OOMKilled", wantSev: Warning, wantFail: true, wantMsg: "did you mean coroner.dev/OOMKilled?"},
		{name: "coroner's other type misspelt", typ: "coroner.dev/ForcefulyTerminated", wantSev: Warning, wantFail: true, wantMsg: "did you mean coroner.dev/ForcefullyTerminated?"},
		{
			name: "another controller's condition is a hint", typ: "example.com/TrainingStalled", wantSev: Hint,
			wantMsg: `condition type "example.com/TrainingStalled" is set neither by Kubernetes nor by coroner: the rule matches only if another controller sets it on the pod`,
		},
		{name: "OOMKilled under another controller's prefix is a hint", typ: "example.com/OOMKilled", wantSev: Hint, wantMsg: "another controller"},
		{name: "an unprefixed custom type far from every known one", typ: "Preempted", wantSev: Hint, wantMsg: "another controller"},
		{name: "a type the API server rejects is left to its error", typ: "not a/valid/type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failIndex, in, 42).InContainer("main"),
				wrappers.OnPodCondition(failJob, tc.typ),
			).ActiveDeadlineSeconds(600).Obj()
			got := Job(job, conditions.ManagedBy)
			lines := findingLines(got, "spec.podFailurePolicy.rules[1].onPodConditions[0].type: ")
			lines = slices.DeleteFunc(lines, func(s string) bool { return strings.HasPrefix(s, "error:") })
			if tc.wantMsg == "" {
				if len(lines) > 0 {
					t.Errorf("want no lint on the type, got %q", lines)
				}
			} else if len(lines) != 1 || !strings.HasPrefix(lines[0], tc.wantSev.String()+": ") || !strings.Contains(lines[0], tc.wantMsg) {
				t.Errorf("got %q, want one %s containing %q", lines, tc.wantSev, tc.wantMsg)
			}
			if tc.typ != "not a/valid/type" && Fails(got) != tc.wantFail {
				t.Errorf("Fails = %v, want %v: %v", Fails(got), tc.wantFail, got)
			}
		})
	}
}

func TestOptInAnnotations(t *testing.T) {
	const (
		coroner   = conditions.AnnotationSafeToForcefullyDelete
		kueueTerm = conditions.AnnotationKueueSafeToForcefullyTerminate
		kueueDel  = conditions.AnnotationKueueSafeToForcefullyDelete
	)
	cases := []struct {
		name         string
		onJob, onPod map[string]string
		want         []string // every opt-in finding, exactly
	}{
		{name: "true on the pod template", onPod: map[string]string{coroner: "true", kueueTerm: "true"}},
		{name: "false on the pod template says what it does", onPod: map[string]string{coroner: "false"}},
		{name: "other annotations are not looked at", onJob: map[string]string{"example.com/x": "yes"}, onPod: map[string]string{"coroner.dev/other": "yes"}},
		{
			name:  "yes on the pod template",
			onPod: map[string]string{coroner: "yes"},
			want:  []string{`warning: spec.template.metadata.annotations[coroner.dev/safe-to-forcefully-delete]: is "yes": only the exact value "true" opts the pod in to zombie recovery`},
		},
		{
			name:  "True and 1 on Kueue's annotations",
			onPod: map[string]string{kueueTerm: "True", kueueDel: "1"},
			want: []string{
				`warning: spec.template.metadata.annotations[kueue.x-k8s.io/safe-to-forcefully-terminate]: is "True": only the exact value "true"`,
				`warning: spec.template.metadata.annotations[kueue.x-k8s.io/safe-to-forcefully-delete]: is "1": only the exact value "true"`,
			},
		},
		{
			name:  "on the Job instead of the pod template",
			onJob: map[string]string{coroner: "true"},
			want:  []string{"warning: metadata.annotations[coroner.dev/safe-to-forcefully-delete]: has no effect here: coroner-shim and coroner-agent read it on the pod; put it in spec.template.metadata.annotations"},
		},
		{
			name:  "on the Job with a wrong value too",
			onJob: map[string]string{kueueTerm: "yes"},
			want:  []string{`warning: metadata.annotations[kueue.x-k8s.io/safe-to-forcefully-terminate]: has no effect here: coroner-shim and coroner-agent read it on the pod; put it in spec.template.metadata.annotations, with the value "true" (not "yes")`},
		},
		{
			name:  "on both: the Job's copy is still flagged",
			onJob: map[string]string{coroner: "true"}, onPod: map[string]string{coroner: "true"},
			want: []string{"warning: metadata.annotations[coroner.dev/safe-to-forcefully-delete]: has no effect here"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := goodJob().Obj()
			job.Annotations, job.Spec.Template.Annotations = tc.onJob, tc.onPod
			got := Job(job, conditions.ManagedBy)
			lines := findingLines(got, "annotations[")
			if len(lines) != len(tc.want) {
				t.Fatalf("got %d findings %q, want %d", len(lines), lines, len(tc.want))
			}
			for i := range lines {
				if !strings.HasPrefix(lines[i], tc.want[i]) {
					t.Errorf("finding %d = %q, want it to start with %q", i, lines[i], tc.want[i])
				}
			}
			if Fails(got) != (len(tc.want) > 0) {
				t.Errorf("Fails = %v with %d opt-in findings", Fails(got), len(tc.want))
			}
		})
	}
}

func TestOptInAnnotationsCronJob(t *testing.T) {
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly", Annotations: map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}},
		Spec: batchv1.CronJobSpec{Schedule: "@daily", JobTemplate: batchv1.JobTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{conditions.AnnotationKueueSafeToForcefullyDelete: "true"}},
			Spec:       goodJob().Obj().Spec,
		}},
	}
	cj.Spec.JobTemplate.Spec.Template.Annotations = map[string]string{conditions.AnnotationSafeToForcefullyDelete: "yes"}
	want := []string{
		"warning: metadata.annotations[coroner.dev/safe-to-forcefully-delete]: has no effect here: coroner-shim and coroner-agent read it on the pod; put it in spec.jobTemplate.spec.template.metadata.annotations",
		"warning: spec.jobTemplate.metadata.annotations[kueue.x-k8s.io/safe-to-forcefully-delete]: has no effect here: coroner-shim and coroner-agent read it on the pod; put it in spec.jobTemplate.spec.template.metadata.annotations",
		`warning: spec.jobTemplate.spec.template.metadata.annotations[coroner.dev/safe-to-forcefully-delete]: is "yes": only the exact value "true" opts the pod in to zombie recovery`,
	}
	if got := findingLines(CronJob(cj, conditions.ManagedBy), "annotations["); !slices.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestNeverFires(t *testing.T) {
	withContainers := func(j *wrappers.JobWrapper, names ...string) *batchv1.Job {
		job := j.Obj()
		for _, n := range names {
			job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers, corev1.Container{Name: n, Image: "busybox"})
		}
		return job
	}
	cases := []struct {
		name string
		job  *batchv1.Job
		want []string // every "can never fire" finding, exactly
	}{
		{name: "the README's rules all fire", job: goodJob().Obj()},
		{
			name: "an exact duplicate",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failIndex, in, 42).InContainer("main"),
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
				wrappers.OnExitCodes(failIndex, in, 42).InContainer("main"),
			).Obj(),
			want: []string{"warning: spec.podFailurePolicy.rules[2]: rule 2 can never fire: rule 0 matches every pod it would (it repeats rule 0)"},
		},
		{
			name: "a duplicate with another action",
			job: goodJob().PodFailurePolicy(
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
				wrappers.OnPodCondition(failJob, corev1.DisruptionTarget).Status(corev1.ConditionTrue),
			).Obj(),
			want: []string{"warning: spec.podFailurePolicy.rules[1]: rule 1 can never fire: rule 0 matches every pod it would (it repeats rule 0, whose action Ignore wins over FailJob)"},
		},
		{
			name: "In values within an earlier rule's, same container",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(count, in, 1, 2, 3).InContainer("main"),
				wrappers.OnExitCodes(failJob, in, 2, 3).InContainer("main"),
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
			).Obj(),
			want: []string{"warning: spec.podFailurePolicy.rules[1]: rule 1 can never fire: rule 0 matches every pod it would"},
		},
		{
			name: "an earlier rule for every container covers one for main",
			job: withContainers(goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, in, 1, 2),
				wrappers.OnExitCodes(count, in, 2).InContainer("main"),
			), "sidecar"),
			want: []string{"warning: spec.podFailurePolicy.rules[1]: rule 1 can never fire: rule 0 matches every pod it would"},
		},
		{
			name: "a rule for main does not cover one for every container",
			job: withContainers(goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, in, 2).InContainer("main"),
				wrappers.OnExitCodes(count, in, 2),
			), "sidecar"),
		},
		{
			name: "a rule for main covers one for every container when main is the only one",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, in, 2).InContainer("main"),
				wrappers.OnExitCodes(count, in, 2),
			).Obj(),
			want: []string{"rule 1 can never fire: rule 0 matches every pod it would"},
		},
		{
			name: "rules for each container together cover one for every container",
			job: withContainers(goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, in, 2).InContainer("main"),
				wrappers.OnExitCodes(failJob, in, 2, 3).InContainer("sidecar"),
				wrappers.OnExitCodes(count, in, 2),
			), "sidecar"),
			want: []string{"warning: spec.podFailurePolicy.rules[2]: rule 2 can never fire: rules 0 and 1 together match every pod it would"},
		},
		{
			name: "In values not all covered",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, in, 1, 2),
				wrappers.OnExitCodes(count, in, 2, 3),
			).Obj(),
		},
		{
			name: "In values covered by two earlier rules",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, in, 1),
				wrappers.OnExitCodes(count, in, 7),
				wrappers.OnExitCodes(ignore, in, 2),
				wrappers.OnExitCodes(count, in, 1, 2),
			).Obj(),
			want: []string{"rule 3 can never fire: rules 0 and 2 together match every pod it would"},
		},
		{
			name: "In values outside an earlier NotIn",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, notIn, 1, 2),
				wrappers.OnExitCodes(count, in, 3, 4),
			).Obj(),
			want: []string{"rule 1 can never fire: rule 0 matches every pod it would"},
		},
		{
			name: "In values partly inside an earlier NotIn",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, notIn, 1, 2),
				wrappers.OnExitCodes(count, in, 2, 3),
			).Obj(),
		},
		{
			name: "NotIn with more values than an earlier NotIn",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, notIn, 0, 1),
				wrappers.OnExitCodes(count, notIn, 1, 2),
			).Obj(),
			want: []string{"rule 1 can never fire: rule 0 matches every pod it would"},
		},
		{
			name: "NotIn with other values than an earlier NotIn",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, notIn, 1),
				wrappers.OnExitCodes(count, notIn, 2),
			).Obj(),
		},
		{
			name: "NotIn covered by an earlier NotIn and In together",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, notIn, 1, 2),
				wrappers.OnExitCodes(ignore, in, 2),
				wrappers.OnExitCodes(count, notIn, 1),
			).Obj(),
			want: []string{"rule 2 can never fire: rules 0 and 1 together match every pod it would"},
		},
		{
			name: "a finite In never covers a NotIn",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, in, 1, 2, 3),
				wrappers.OnExitCodes(count, notIn, 1, 2, 3),
			).Obj(),
		},
		{
			name: "a superset of conditions",
			job: goodJob().PodFailurePolicy(
				onConditions(ignore, "DisruptionTarget", "coroner.dev/OOMKilled"),
				wrappers.OnPodCondition(failJob, conditions.OOMKilled),
			).Obj(),
			want: []string{"warning: spec.podFailurePolicy.rules[1]: rule 1 can never fire: rule 0 matches every pod it would"},
		},
		{
			name: "conditions held by two earlier rules",
			job: goodJob().PodFailurePolicy(
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
				wrappers.OnPodCondition(failJob, conditions.OOMKilled),
				onConditions(count, "coroner.dev/OOMKilled", "DisruptionTarget=True"),
			).Obj(),
			want: []string{"rule 2 can never fire: rules 0 and 1 together match every pod it would"},
		},
		{
			name: "another status of the same condition fires",
			job: goodJob().PodFailurePolicy(
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
				wrappers.OnPodCondition(failJob, corev1.DisruptionTarget).Status(corev1.ConditionFalse),
			).Obj(),
		},
		{
			name: "one condition more than the earlier rule fires",
			job: goodJob().PodFailurePolicy(
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
				onConditions(failJob, "DisruptionTarget", "coroner.dev/OOMKilled"),
			).Obj(),
		},
		{
			name: "exit codes and conditions never cover each other",
			job: goodJob().PodFailurePolicy(
				wrappers.OnExitCodes(failJob, notIn, 1),
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
			).Obj(),
		},
		{
			name: "a rule the API server rejects covers nothing",
			job: goodJob().PodFailurePolicy(
				wrappers.OnPodCondition("Retry", corev1.DisruptionTarget),
				wrappers.OnPodCondition(ignore, corev1.DisruptionTarget),
			).Obj(),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := findingLines(Job(tc.job, conditions.ManagedBy), "can never fire")
			if len(got) != len(tc.want) {
				t.Fatalf("got %q, want %d such findings: %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("finding %d = %q, want it to contain %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"ready", "ready", 0}, {"ready", "raedy", 1}, {"ready", "read", 1},
		{"disruptontarget", "disruptiontarget", 1}, {"kitten", "sitting", 3}, {"", "abc", 3},
	} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
