package policy

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

func TestAwaitingVerdict(t *testing.T) {
	now := time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)
	ignoreDisruptions := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action:          batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
	}}}
	exitCodesOnly := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
		Action:      batchv1.PodFailurePolicyActionFailJob,
		OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{137}},
	}}}
	terminated := func(reason string, ago time.Duration) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 137, Reason: reason, FinishedAt: metav1.NewTime(now.Add(-ago)),
		}}}
	}
	pod := func(phase corev1.PodPhase, conds []corev1.PodCondition, statuses ...corev1.ContainerStatus) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: phase, Conditions: conds, ContainerStatuses: statuses}}
	}
	for _, tc := range []struct {
		name   string
		policy *batchv1.PodFailurePolicy
		pod    *corev1.Pod
		wait   time.Duration
		want   time.Duration
	}{
		{name: "OOM-killed without a verdict waits the rest", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, nil, terminated("OOMKilled", 10*time.Second)), wait: 30 * time.Second, want: 20 * time.Second},
		{name: "past the wait: decided without the verdict", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, nil, terminated("OOMKilled", 31*time.Second)), wait: 30 * time.Second, want: 0},
		{name: "the latest OOM-killed container counts", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, nil, terminated("OOMKilled", 40*time.Second), terminated("OOMKilled", 5*time.Second)), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "coroner's limit OOM stamp is the verdict", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, []corev1.PodCondition{{Type: conditions.OOMKilled, Status: corev1.ConditionTrue}}, terminated("OOMKilled", time.Second)), wait: 30 * time.Second, want: 0},
		{name: "a node OOM's DisruptionTarget is the verdict", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonNodeOOMKill}}, terminated("OOMKilled", time.Second)), wait: 30 * time.Second, want: 0},
		{name: "DisruptionTarget False is no verdict", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionFalse}}, terminated("OOMKilled", time.Second)), wait: 30 * time.Second, want: 29 * time.Second},
		{name: "exit-code rules do not read a verdict", policy: exitCodesOnly,
			pod: pod(corev1.PodFailed, nil, terminated("OOMKilled", time.Second)), wait: 30 * time.Second, want: 0},
		{name: "no policy", policy: nil,
			pod: pod(corev1.PodFailed, nil, terminated("OOMKilled", time.Second)), wait: 30 * time.Second, want: 0},
		{name: "not an OOM kill", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, nil, terminated("Error", time.Second)), wait: 30 * time.Second, want: 0},
		{name: "not failed", policy: ignoreDisruptions,
			pod: pod(corev1.PodRunning, nil, terminated("OOMKilled", time.Second)), wait: 30 * time.Second, want: 0},
		{name: "no finishedAt: nothing to count from", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, nil, corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled"}}}), wait: 30 * time.Second, want: 0},
		{name: "turned off", policy: ignoreDisruptions,
			pod: pod(corev1.PodFailed, nil, terminated("OOMKilled", time.Second)), wait: 0, want: 0},
		{name: "an init container's OOM kill", policy: ignoreDisruptions,
			pod: &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, InitContainerStatuses: []corev1.ContainerStatus{terminated("OOMKilled", 2*time.Second)}}}, wait: 30 * time.Second, want: 28 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := &batchv1.Job{Spec: batchv1.JobSpec{PodFailurePolicy: tc.policy}}
			if got := AwaitingVerdict(job, tc.pod, now, tc.wait); got != tc.want {
				t.Errorf("AwaitingVerdict = %v, want %v", got, tc.want)
			}
		})
	}
}
