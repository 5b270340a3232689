package policy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/shim/policy"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const (
	failJob   = batchv1.PodFailurePolicyActionFailJob
	ignore    = batchv1.PodFailurePolicyActionIgnore
	count     = batchv1.PodFailurePolicyActionCount
	failIndex = batchv1.PodFailurePolicyActionFailIndex
	in        = batchv1.PodFailurePolicyOnExitCodesOpIn
	notIn     = batchv1.PodFailurePolicyOnExitCodesOpNotIn
)

// Result is a local name to keep the table short.
type Result = policy.Result

var (
	onExit = wrappers.OnExitCodes
	onCond = wrappers.OnPodCondition
	rules  = wrappers.Policy
)

// failedPod is the pod most cases start from: default/p, phase Failed.
func failedPod() *wrappers.PodWrapper {
	return wrappers.MakePod("p", "default").Phase(corev1.PodFailed)
}

func TestMatch(t *testing.T) {
	cases := map[string]struct {
		policy *batchv1.PodFailurePolicy
		pod    *corev1.Pod

		want                Result
		wantCountsAsFailure bool
		wantMessage         string
	}{
		"nil policy matches nothing and counts": {
			policy:              nil,
			pod:                 failedPod().ExitedContainer("main", 1).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"policy without rules matches nothing and counts": {
			policy:              rules(),
			pod:                 failedPod().ExitedContainer("main", 1).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"nil pod matches nothing": {
			policy:              rules(onExit(failJob, notIn, 99)),
			pod:                 nil,
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod / failed and matched no pod failure policy rule",
		},
		"In matches a listed exit code; FailJob message as upstream": {
			policy:              rules(onExit(failJob, in, 1, 2, 3)),
			pod:                 failedPod().ExitedContainer("main", 2).Obj(),
			want:                Result{RuleIndex: 0, Action: failJob, ContainerName: "main", ExitCode: 2},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 2 matching FailJob rule at index 0",
		},
		"In does not match an unlisted exit code": {
			policy:              rules(onExit(failJob, in, 1, 2, 3)),
			pod:                 failedPod().ExitedContainer("main", 4).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"NotIn matches an unlisted exit code": {
			policy:              rules(onExit(count, notIn, 1)),
			pod:                 failedPod().ExitedContainer("main", 5).Obj(),
			want:                Result{Action: count, ContainerName: "main", ExitCode: 5},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 5 matching Count rule at index 0",
		},
		"NotIn does not match a listed exit code": {
			policy:              rules(onExit(failJob, notIn, 1, 5)),
			pod:                 failedPod().ExitedContainer("main", 5).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"exit code 0 never matches, even In [0]": {
			policy:              rules(onExit(failJob, in, 0, 1)),
			pod:                 failedPod().ExitedContainer("main", 0).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"exit code 0 never matches NotIn": {
			policy:              rules(onExit(failJob, notIn, 1)),
			pod:                 failedPod().ExitedContainer("main", 0).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"NotIn [0] matches the failed container and passes over the successful sidecar": {
			policy: rules(onExit(failJob, notIn, 0)),
			pod: failedPod().
				ExitedContainer("sidecar", 0).
				ExitedContainer("main", 1).Obj(),
			want:                Result{Action: failJob, ContainerName: "main", ExitCode: 1},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 1 matching FailJob rule at index 0",
		},
		"containerName matches its own container": {
			policy: rules(onExit(failJob, in, 42).InContainer("main")),
			pod: failedPod().
				ExitedContainer("main", 42).
				ExitedContainer("sidecar", 42).Obj(),
			want:                Result{Action: failJob, ContainerName: "main", ExitCode: 42},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 42 matching FailJob rule at index 0",
		},
		"containerName ignores another container's exit code": {
			policy: rules(onExit(failJob, in, 42).InContainer("main")),
			pod: failedPod().
				ExitedContainer("main", 1).
				ExitedContainer("sidecar", 42).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"containerName may name an init container": {
			policy: rules(onExit(count, in, 3).InContainer("setup")),
			pod: failedPod().
				InitContainerExited("setup", 3).
				WaitingContainer("main", "PodInitializing").Obj(),
			want:                Result{Action: count, ContainerName: "setup", InitContainer: true, ExitCode: 3},
			wantCountsAsFailure: true,
			wantMessage:         "Container setup for pod default/p failed with exit code 3 matching Count rule at index 0",
		},
		"failing init container matches when no app container ran": {
			policy: rules(onExit(failJob, in, 3)),
			pod: failedPod().
				InitContainerExited("setup", 3).
				WaitingContainer("main", "PodInitializing").Obj(),
			want:                Result{Action: failJob, ContainerName: "setup", InitContainer: true, ExitCode: 3},
			wantCountsAsFailure: true,
			wantMessage:         "Container setup for pod default/p failed with exit code 3 matching FailJob rule at index 0",
		},
		"app container is preferred over init container": {
			policy: rules(onExit(failJob, notIn, 99)),
			pod: failedPod().
				InitContainerExited("setup", 1).
				ExitedContainer("main", 2).Obj(),
			want:                Result{Action: failJob, ContainerName: "main", ExitCode: 2},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 2 matching FailJob rule at index 0",
		},
		"second container matches when the first does not": {
			policy: rules(onExit(failIndex, in, 42)),
			pod: failedPod().
				ExitedContainer("main", 1).
				ExitedContainer("sidecar", 42).Obj(),
			want:                Result{Action: failIndex, ContainerName: "sidecar", ExitCode: 42},
			wantCountsAsFailure: true,
			wantMessage:         "Container sidecar for pod default/p failed with exit code 42 matching FailIndex rule at index 0",
		},
		"running and waiting containers are passed over": {
			policy: rules(onExit(failJob, notIn, 99)),
			pod: failedPod().
				RunningContainer("main").
				WaitingContainer("sidecar", "ContainerCreating").Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"terminated container matches beside running ones": {
			policy: rules(onExit(failJob, notIn, 99)),
			pod: failedPod().
				RunningContainer("main").
				ExitedContainer("sidecar", 7).Obj(),
			want:                Result{Action: failJob, ContainerName: "sidecar", ExitCode: 7},
			wantCountsAsFailure: true,
			wantMessage:         "Container sidecar for pod default/p failed with exit code 7 matching FailJob rule at index 0",
		},
		"negative exit code (Windows) matches In": {
			policy:              rules(onExit(ignore, in, -1073741510)),
			pod:                 failedPod().ExitedContainer("main", -1073741510).Obj(),
			want:                Result{Action: ignore, ContainerName: "main", ExitCode: -1073741510},
			wantCountsAsFailure: false,
			wantMessage:         "Container main for pod default/p failed with exit code -1073741510 matching Ignore rule at index 0",
		},
		"unknown operator matches nothing": {
			policy:              rules(onExit(failJob, "GreaterThan", 0)),
			pod:                 failedPod().ExitedContainer("main", 1).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"first match wins: onExitCodes rule before onPodConditions rule": {
			policy: rules(
				onExit(count, in, 42),
				onCond(ignore, corev1.DisruptionTarget),
			),
			pod: failedPod().
				ExitedContainer("main", 42).
				Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{Action: count, ContainerName: "main", ExitCode: 42},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 42 matching Count rule at index 0",
		},
		"first match wins: onPodConditions rule before onExitCodes rule": {
			policy: rules(
				onCond(ignore, corev1.DisruptionTarget),
				onExit(failJob, in, 42),
			),
			pod: failedPod().
				ExitedContainer("main", 42).
				Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{Action: ignore, ConditionType: corev1.DisruptionTarget},
			wantCountsAsFailure: false,
			wantMessage:         "Pod default/p has condition DisruptionTarget matching Ignore rule at index 0",
		},
		"first match wins among matching onExitCodes rules": {
			policy: rules(
				onExit(failJob, in, 1),
				onExit(ignore, notIn, 5),
				onExit(failJob, in, 42),
			),
			pod:                 failedPod().ExitedContainer("main", 42).Obj(),
			want:                Result{RuleIndex: 1, Action: ignore, ContainerName: "main", ExitCode: 42},
			wantCountsAsFailure: false,
			wantMessage:         "Container main for pod default/p failed with exit code 42 matching Ignore rule at index 1",
		},
		"no rule of several matches": {
			policy: rules(
				onExit(failJob, in, 1, 2, 3),
				onExit(ignore, notIn, 32, 33),
				onCond(count, "ResourceLimitExceeded").Status(corev1.ConditionTrue),
				onCond(ignore, corev1.DisruptionTarget),
			),
			pod: failedPod().
				ExitedContainer("main", 32).
				Condition(corev1.DisruptionTarget, corev1.ConditionFalse).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"condition pattern True does not match condition False": {
			policy:              rules(onCond(ignore, corev1.DisruptionTarget).Status(corev1.ConditionTrue)),
			pod:                 failedPod().Condition(corev1.DisruptionTarget, corev1.ConditionFalse).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"condition pattern False does not match condition True": {
			policy:              rules(onCond(ignore, corev1.DisruptionTarget).Status(corev1.ConditionFalse)),
			pod:                 failedPod().Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"condition pattern False matches condition False": {
			policy:              rules(onCond(ignore, corev1.PodReady).Status(corev1.ConditionFalse)),
			pod:                 failedPod().Condition(corev1.PodReady, corev1.ConditionFalse).Obj(),
			want:                Result{Action: ignore, ConditionType: corev1.PodReady},
			wantCountsAsFailure: false,
			wantMessage:         "Pod default/p has condition Ready matching Ignore rule at index 0",
		},
		"condition pattern Unknown matches condition Unknown": {
			policy:              rules(onCond(count, "Custom").Status(corev1.ConditionUnknown)),
			pod:                 failedPod().Condition("Custom", corev1.ConditionUnknown).Obj(),
			want:                Result{Action: count, ConditionType: "Custom"},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p has condition Custom matching Count rule at index 0",
		},
		"empty pattern status means True and matches condition True": {
			policy:              rules(onCond(ignore, corev1.DisruptionTarget)),
			pod:                 failedPod().Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{Action: ignore, ConditionType: corev1.DisruptionTarget},
			wantCountsAsFailure: false,
			wantMessage:         "Pod default/p has condition DisruptionTarget matching Ignore rule at index 0",
		},
		"empty pattern status means True and does not match condition False": {
			policy:              rules(onCond(ignore, corev1.DisruptionTarget)),
			pod:                 failedPod().Condition(corev1.DisruptionTarget, corev1.ConditionFalse).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"condition of another type does not match": {
			policy:              rules(onCond(ignore, corev1.DisruptionTarget)),
			pod:                 failedPod().Condition(corev1.PodScheduled, corev1.ConditionTrue).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"several patterns: the pod's first matching condition is reported": {
			policy: rules(&wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{
				Action: ignore,
				OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{
					{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue},
					{Type: "Custom", Status: corev1.ConditionTrue},
				},
			}}),
			pod: failedPod().
				Condition("Custom", corev1.ConditionTrue).
				Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{Action: ignore, ConditionType: "Custom"},
			wantCountsAsFailure: false,
			wantMessage:         "Pod default/p has condition Custom matching Ignore rule at index 0",
		},
		"FailJob on a pod condition; message as upstream": {
			policy:              rules(onCond(failJob, "ConfigIssue")),
			pod:                 failedPod().Condition("ConfigIssue", corev1.ConditionTrue).Obj(),
			want:                Result{Action: failJob, ConditionType: "ConfigIssue"},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p has condition ConfigIssue matching FailJob rule at index 0",
		},
		"FailIndex on a pod condition counts": {
			policy:              rules(onCond(failIndex, corev1.DisruptionTarget)),
			pod:                 failedPod().Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{Action: failIndex, ConditionType: corev1.DisruptionTarget},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p has condition DisruptionTarget matching FailIndex rule at index 0",
		},
		"Count on a pod condition counts": {
			policy:              rules(onCond(count, corev1.DisruptionTarget)),
			pod:                 failedPod().Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{Action: count, ConditionType: corev1.DisruptionTarget},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p has condition DisruptionTarget matching Count rule at index 0",
		},
		"unknown action on an onExitCodes rule is skipped; a later rule matches": {
			policy: rules(
				onExit("Restart", in, 42),
				onExit(count, in, 42),
			),
			pod:                 failedPod().ExitedContainer("main", 42).Obj(),
			want:                Result{RuleIndex: 1, Action: count, ContainerName: "main", ExitCode: 42},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 42 matching Count rule at index 1",
		},
		"unknown action on an onPodConditions rule is skipped; a later rule matches": {
			policy: rules(
				onCond("Retry", corev1.DisruptionTarget),
				onExit(failJob, notIn, 99),
			),
			pod: failedPod().
				ExitedContainer("main", 137).
				Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{RuleIndex: 1, Action: failJob, ContainerName: "main", ExitCode: 137},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 137 matching FailJob rule at index 1",
		},
		"unknown action alone matches nothing and counts": {
			policy:              rules(onExit("Restart", in, 42)),
			pod:                 failedPod().ExitedContainer("main", 42).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
		"rule with neither requirement never matches": {
			policy: rules(
				&wrappers.RuleWrapper{PodFailurePolicyRule: batchv1.PodFailurePolicyRule{Action: failJob}},
				onExit(count, notIn, 99),
			),
			pod:                 failedPod().ExitedContainer("main", 1).Obj(),
			want:                Result{RuleIndex: 1, Action: count, ContainerName: "main", ExitCode: 1},
			wantCountsAsFailure: true,
			wantMessage:         "Container main for pod default/p failed with exit code 1 matching Count rule at index 1",
		},
		// The KEP's example policy: fail the Job on a bug in the main
		// container, ignore disruptions.
		"KEP example: exit code of main-job-container fails the Job": {
			policy: rules(
				onExit(failJob, in, 1, 2, 3).InContainer("main-job-container"),
				onCond(ignore, corev1.DisruptionTarget),
			),
			pod: failedPod().
				ExitedContainer("main-job-container", 3).
				ExitedContainer("monitoring-job-container", 0).Obj(),
			want:                Result{Action: failJob, ContainerName: "main-job-container", ExitCode: 3},
			wantCountsAsFailure: true,
			wantMessage:         "Container main-job-container for pod default/p failed with exit code 3 matching FailJob rule at index 0",
		},
		"KEP example: DisruptionTarget is ignored": {
			policy: rules(
				onExit(failJob, in, 1, 2, 3).InContainer("main-job-container"),
				onCond(ignore, corev1.DisruptionTarget),
			),
			pod: failedPod().
				ExitedContainer("main-job-container", 137).
				ExitedContainer("monitoring-job-container", 137).
				Condition(corev1.DisruptionTarget, corev1.ConditionTrue).Obj(),
			want:                Result{RuleIndex: 1, Action: ignore, ConditionType: corev1.DisruptionTarget},
			wantCountsAsFailure: false,
			wantMessage:         "Pod default/p has condition DisruptionTarget matching Ignore rule at index 1",
		},
		"KEP example: monitoring container's exit code is not matched": {
			policy: rules(
				onExit(failJob, in, 1, 2, 3).InContainer("main-job-container"),
				onCond(ignore, corev1.DisruptionTarget),
			),
			pod: failedPod().
				ExitedContainer("main-job-container", 0).
				ExitedContainer("monitoring-job-container", 2).Obj(),
			want:                Result{},
			wantCountsAsFailure: true,
			wantMessage:         "Pod default/p failed and matched no pod failure policy rule",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := policy.Match(tc.policy, tc.pod)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Match() result mismatch (-want +got):\n%s", diff)
			}
			if got.Matched() != tc.want.Matched() {
				t.Errorf("Matched() = %v, want %v", got.Matched(), tc.want.Matched())
			}
			if got.CountsAsFailure() != tc.wantCountsAsFailure {
				t.Errorf("CountsAsFailure() = %v, want %v", got.CountsAsFailure(), tc.wantCountsAsFailure)
			}
			if msg := got.Message(tc.pod); msg != tc.wantMessage {
				t.Errorf("Message() = %q, want %q", msg, tc.wantMessage)
			}
		})
	}
}

func TestZeroResult(t *testing.T) {
	var r policy.Result
	if r.Matched() {
		t.Error("zero Result: Matched() = true, want false")
	}
	if !r.CountsAsFailure() {
		t.Error("zero Result: CountsAsFailure() = false, want true")
	}
}
