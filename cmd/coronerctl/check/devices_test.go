package check

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestDeviceFailureHint(t *testing.T) {
	gpu := func(job *batchv1.Job) *batchv1.Job {
		job.Spec.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
		return job
	}
	claim := func(job *batchv1.Job) *batchv1.Job {
		job.Spec.Template.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("a100")}}
		return job
	}
	short := func(w *wrappers.JobWrapper) *batchv1.Job {
		j := w.ManagedBy(conditions.ManagedBy).Obj()
		j.Spec.ActiveDeadlineSeconds = ptr.To[int64](600) // no long-running hint beside
		return j
	}
	const hint = "no rule with action Ignore matches DisruptionTarget or coroner.dev/DeviceFailed"
	for _, tc := range []struct {
		name      string
		job       *batchv1.Job
		wantField string // "" for no hint
		wantText  string
	}{
		{name: "a GPU Job without a policy", job: gpu(short(wrappers.MakeJob("j", "ns"))),
			wantField: "spec.podFailurePolicy", wantText: "the pods ask for devices (nvidia.com/gpu)"},
		{name: "a GPU Job counting exit codes only", job: gpu(short(wrappers.MakeJob("j", "ns").PodFailurePolicy(wrappers.OnExitCodes(failJob, in, 42)))), wantField: "spec.podFailurePolicy.rules", wantText: "add {action: Ignore, onPodConditions: [{type: coroner.dev/DeviceFailed}]}"},
		{name: "Count on DisruptionTarget counts the device failure", job: gpu(short(wrappers.MakeJob("j", "ns").PodFailurePolicy(wrappers.OnPodCondition(count, corev1.DisruptionTarget)))),
			wantField: "spec.podFailurePolicy.rules", wantText: hint},
		{name: "FailIndex on DeviceFailed fails the index", job: gpu(short(wrappers.MakeJob("j", "ns").Indexed().Completions(2).BackoffLimitPerIndex(1).PodFailurePolicy(wrappers.OnPodCondition(failIndex, conditions.DeviceFailed)))),
			wantField: "spec.podFailurePolicy.rules", wantText: hint},
		{name: "Ignore on DisruptionTarget=False does not match the stamp", job: gpu(short(wrappers.MakeJob("j", "ns").PodFailurePolicy(onConditions(ignore, "DisruptionTarget=False")))),
			wantField: "spec.podFailurePolicy.rules", wantText: hint},
		{name: "a DRA claim", job: claim(short(wrappers.MakeJob("j", "ns"))), wantField: "spec.podFailurePolicy", wantText: "(claim:gpu)"},
		{name: "Ignore on DisruptionTarget spares it", job: gpu(short(wrappers.MakeJob("j", "ns").PodFailurePolicy(wrappers.OnPodCondition(ignore, corev1.DisruptionTarget))))},
		{name: "Ignore on DeviceFailed spares it", job: gpu(short(wrappers.MakeJob("j", "ns").PodFailurePolicy(wrappers.OnPodCondition(ignore, conditions.DeviceFailed))))},
		{name: "Ignore on DeviceFailed among other patterns", job: gpu(short(wrappers.MakeJob("j", "ns").PodFailurePolicy(onConditions(ignore, "example.com/Preempted", "coroner.dev/DeviceFailed=True"))))},
		{name: "no devices: no hint", job: short(wrappers.MakeJob("j", "ns"))},
		{name: "cpu, memory, hugepages are not devices", job: func() *batchv1.Job {
			j := short(wrappers.MakeJob("j", "ns"))
			j.Spec.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"cpu": resource.MustParse("1"), "hugepages-2Mi": resource.MustParse("2Mi"), "memory": resource.MustParse("1Gi")}
			return j
		}()},
		{name: "restartPolicy OnFailure has no policy to hint at", job: gpu(short(wrappers.MakeJob("j", "ns").RestartPolicy(corev1.RestartPolicyOnFailure)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []Finding
			for _, f := range Job(tc.job, conditions.ManagedBy) {
				if strings.Contains(f.Message, "ask for devices") {
					got = append(got, f)
				}
			}
			if tc.wantField == "" {
				if len(got) != 0 {
					t.Errorf("findings %v, want no device hint", got)
				}
				return
			}
			if len(got) != 1 || got[0].Severity != Hint || got[0].Field != tc.wantField || !strings.Contains(got[0].Message, tc.wantText) {
				t.Errorf("findings %v, want one hint at %s saying %q", got, tc.wantField, tc.wantText)
			}
		})
	}
}

// TestDeviceFailureHintCronJob: a CronJob's Job template gets the hint too, at its own path.
func TestDeviceFailureHintCronJob(t *testing.T) {
	j := wrappers.MakeJob("j", "ns").ManagedBy(conditions.ManagedBy).Obj()
	j.Spec.ActiveDeadlineSeconds = ptr.To[int64](600)
	j.Spec.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"coroner.dev/test-gpu": resource.MustParse("1")}
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "nightly"}, Spec: batchv1.CronJobSpec{Schedule: "@daily", JobTemplate: batchv1.JobTemplateSpec{Spec: j.Spec}}}
	var fields []string
	for _, f := range CronJob(cj, conditions.ManagedBy) {
		if strings.Contains(f.Message, "ask for devices (coroner.dev/test-gpu)") {
			fields = append(fields, f.Field)
		}
	}
	if len(fields) != 1 || fields[0] != "spec.jobTemplate.spec.podFailurePolicy" {
		t.Errorf("hint fields %v, want spec.jobTemplate.spec.podFailurePolicy", fields)
	}
}

// TestDeviceFailedIsKnown: a rule on coroner.dev/DeviceFailed is on a condition coroner
// sets, and a misspelling of it is caught.
func TestDeviceFailedIsKnown(t *testing.T) {
	if _, _, ok := conditionTypeFinding(conditions.DeviceFailed); ok {
		t.Error("coroner.dev/DeviceFailed is taken for an unknown condition type")
	}
	sev, msg, ok := conditionTypeFinding("coroner.dev/DevicesFailed")
	if !ok || sev != Warning || !strings.Contains(msg, "did you mean coroner.dev/DeviceFailed") {
		t.Errorf("coroner.dev/DevicesFailed: %v %q %v, want a warning naming coroner.dev/DeviceFailed", sev, msg, ok)
	}
}
