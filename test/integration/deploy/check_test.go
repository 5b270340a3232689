package deploy_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/cmd/coronerctl/check"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestCheckAgreesWithTheAPIServer creates Jobs with a server-side dry run and compares the
// API server's verdict with `coronerctl check`'s: the same Jobs are rejected, on the same
// fields, with the same messages (coroner's lints aside).
func TestCheckAgreesWithTheAPIServer(t *testing.T) {
	env := harness.Shared(t)
	client := kubernetes.NewForConfigOrDie(env.Config)
	ns := env.Namespace(t)

	base := func() *wrappers.JobWrapper {
		return wrappers.MakeJob("train", ns).ManagedBy(conditions.ManagedBy).Indexed().
			Completions(4).Parallelism(4).BackoffLimitPerIndex(1).MaxFailedIndexes(2).
			PodFailurePolicy(
				wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42).InContainer("main"),
				wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget),
			)
	}
	rule := func(r batchv1.PodFailurePolicyRule) *wrappers.RuleWrapper {
		return &wrappers.RuleWrapper{PodFailurePolicyRule: r}
	}
	cases := []struct {
		name string
		job  *batchv1.Job
		// sameFieldsOnly compares the fields but not the messages (coroner words the size
		// limits of shim/indexes its own way).
		sameFieldsOnly bool
	}{
		{name: "valid", job: base().Obj()},
		{name: "FailIndex without backoffLimitPerIndex", job: func() *batchv1.Job {
			j := base().Obj()
			j.Spec.BackoffLimitPerIndex, j.Spec.MaxFailedIndexes = nil, nil
			return j
		}()},
		{name: "restartPolicy OnFailure", job: base().RestartPolicy(corev1.RestartPolicyOnFailure).Obj()},
		{name: "onExitCodes values", job: base().PodFailurePolicy(
			rule(batchv1.PodFailurePolicyRule{Action: batchv1.PodFailurePolicyActionCount,
				OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{ContainerName: ptr.To("mian"), Values: []int32{5, 0, 5}}}),
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionCount, "Between", 1),
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionCount, batchv1.PodFailurePolicyOnExitCodesOpNotIn),
			wrappers.OnExitCodes(batchv1.PodFailurePolicyActionCount, batchv1.PodFailurePolicyOnExitCodesOpIn, 0, 3),
		).Obj()},
		{name: "rule shapes", job: base().PodFailurePolicy(
			rule(batchv1.PodFailurePolicyRule{OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}),
			rule(batchv1.PodFailurePolicyRule{Action: "Retry", OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}),
			rule(batchv1.PodFailurePolicyRule{Action: batchv1.PodFailurePolicyActionCount}),
			rule(batchv1.PodFailurePolicyRule{Action: batchv1.PodFailurePolicyActionCount,
				OnExitCodes:     &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{1}},
				OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}),
			wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, "not a/valid/type").Status("Maybe"),
		).Obj()},
		{name: "managedBy", job: base().ManagedBy("shim").Obj()},
		{name: "managedBy too long", job: base().ManagedBy("coroner.dev/" + strings.Repeat("s", 60)).Obj()},
		{name: "per-index fields on a NonIndexed Job", job: wrappers.MakeJob("j", ns).ManagedBy(conditions.ManagedBy).BackoffLimitPerIndex(1).MaxFailedIndexes(1).Obj()},
		{name: "maxFailedIndexes alone", job: func() *batchv1.Job {
			j := base().PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj()
			j.Spec.BackoffLimitPerIndex = nil
			return j
		}()},
		{name: "negative counts", job: base().Parallelism(-1).BackoffLimit(-2).BackoffLimitPerIndex(-1).Obj()},
		{name: "maxFailedIndexes above completions", job: base().MaxFailedIndexes(5).Obj(), sameFieldsOnly: true},
		{name: "size limits", job: base().Completions(200_000).Parallelism(20_000).MaxFailedIndexes(20_000).Obj(), sameFieldsOnly: true},
		{name: "podReplacementPolicy with a podFailurePolicy", job: base().PodReplacementPolicy(batchv1.TerminatingOrFailed).Obj()},
		{name: "podReplacementPolicy unknown", job: wrappers.MakeJob("j", ns).ManagedBy(conditions.ManagedBy).PodReplacementPolicy("Never").Obj()},
		{name: "successPolicy rules", job: base().SuccessPolicy(
			batchv1.SuccessPolicyRule{},
			wrappers.SucceededIndexes("0,2-1"),
			wrappers.SucceededIndexes("1-3,7"),
			batchv1.SuccessPolicyRule{SucceededIndexes: ptr.To("0-1"), SucceededCount: ptr.To[int32](3)},
			wrappers.SucceededCount(5),
		).Obj()},
		{name: "successPolicy on a NonIndexed Job", job: wrappers.MakeJob("j", ns).ManagedBy(conditions.ManagedBy).SuccessPolicy(wrappers.SucceededCount(1)).Obj(), sameFieldsOnly: true},
		{name: "restartPolicy unset", job: base().RestartPolicy("").Obj()},
		{name: "Indexed Job name too long", job: func() *batchv1.Job { j := base().Obj(); j.Name = strings.Repeat("a", 62); return j }()},
	}
	ctx := context.Background()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var want []string
			_, err := client.BatchV1().Jobs(ns).Create(ctx, tc.job.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			var status apierrors.APIStatus
			switch {
			case err == nil:
			case errors.As(err, &status) && apierrors.IsInvalid(err):
				for _, c := range status.Status().Details.Causes {
					want = append(want, causeLine(c.Field, c.Message, tc.sameFieldsOnly))
				}
			default:
				t.Fatalf("the API server: %v", err)
			}
			if (len(want) == 0) != (tc.name == "valid") {
				t.Fatalf("the API server's verdict on %q: %v", tc.name, err)
			}
			var got []string
			for _, f := range check.Job(tc.job, conditions.ManagedBy) {
				if !f.Lint {
					got = append(got, causeLine(f.Field, f.Message, tc.sameFieldsOnly))
				}
			}
			slices.Sort(want)
			slices.Sort(got)
			want, got = slices.Compact(want), slices.Compact(got)
			if !slices.Equal(want, got) {
				t.Errorf("the API server and coronerctl check disagree\nAPI server:\n  %s\ncoronerctl check:\n  %s",
					strings.Join(want, "\n  "), strings.Join(got, "\n  "))
			}
		})
	}
}

func causeLine(field, message string, fieldOnly bool) string {
	if fieldOnly {
		return field
	}
	return field + ": " + message
}
