package policy

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/conditions"
)

func TestAwaitingDeviceVerdict(t *testing.T) {
	now := time.Date(2026, 12, 7, 19, 40, 0, 0, time.UTC)
	rule := func(action batchv1.PodFailurePolicyAction, t corev1.PodConditionType, s corev1.ConditionStatus) batchv1.PodFailurePolicyRule {
		return batchv1.PodFailurePolicyRule{Action: action, OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: t, Status: s}}}
	}
	exitRule := func(action batchv1.PodFailurePolicyAction, codes ...int32) batchv1.PodFailurePolicyRule {
		return batchv1.PodFailurePolicyRule{Action: action, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: codes}}
	}
	policy := func(rules ...batchv1.PodFailurePolicyRule) *batchv1.PodFailurePolicy {
		return &batchv1.PodFailurePolicy{Rules: rules}
	}
	ignoreDisruptions := policy(rule(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget, corev1.ConditionTrue))
	gpu := corev1.ResourceList{"coroner.dev/test-gpu": resource.MustParse("1")}
	exit := func(code, signal int32, ago time.Duration) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: code, Signal: signal, Reason: "Error", FinishedAt: metav1.NewTime(now.Add(-ago))}}}
	}
	type podOpt func(*corev1.Pod)
	pod := func(opts ...podOpt) *corev1.Pod {
		p := &corev1.Pod{
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: gpu, Requests: gpu}}}},
			Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{exit(1, 0, 5*time.Second)}},
		}
		for _, o := range opts {
			o(p)
		}
		return p
	}
	cond := func(t corev1.PodConditionType, s corev1.ConditionStatus, reason string) podOpt {
		return func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: s, Reason: reason})
		}
	}
	statuses := func(cs ...corev1.ContainerStatus) podOpt {
		return func(p *corev1.Pod) { p.Status.ContainerStatuses = cs }
	}
	noDevices := func(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} }
	for _, tc := range []struct {
		name   string
		policy *batchv1.PodFailurePolicy
		pod    *corev1.Pod
		wait   time.Duration
		want   time.Duration
	}{
		{name: "exit 1 holding a GPU, no verdict: waits the rest", policy: ignoreDisruptions, pod: pod(), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "killed by a signal", policy: ignoreDisruptions, pod: pod(statuses(exit(0, 9, 10*time.Second))), wait: 30 * time.Second, want: 20 * time.Second},
		{name: "the latest failing container counts", policy: ignoreDisruptions,
			pod:  pod(statuses(exit(1, 0, 40*time.Second), corev1.ContainerStatus{Name: "side", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, FinishedAt: metav1.NewTime(now.Add(-2 * time.Second))}}})),
			wait: 30 * time.Second, want: 28 * time.Second},
		{name: "a container that exited 0 later does not count", policy: ignoreDisruptions,
			pod: pod(statuses(exit(1, 0, 20*time.Second), exit(0, 0, time.Second))), wait: 30 * time.Second, want: 10 * time.Second},
		{name: "past the wait: decided without the verdict", policy: ignoreDisruptions, pod: pod(statuses(exit(1, 0, 31*time.Second))), wait: 30 * time.Second, want: 0},
		{name: "DisruptionTarget DeviceFailure is the verdict", policy: ignoreDisruptions,
			pod: pod(cond(corev1.DisruptionTarget, corev1.ConditionTrue, conditions.ReasonDeviceFailure), cond(conditions.DeviceFailed, corev1.ConditionTrue, conditions.ReasonDeviceFailure)), wait: 30 * time.Second, want: 0},
		{name: "DeviceFailed=False NoDeviceFailure is the verdict", policy: ignoreDisruptions,
			pod: pod(cond(conditions.DeviceFailed, corev1.ConditionFalse, conditions.ReasonNoDeviceFailure)), wait: 30 * time.Second, want: 0},
		{name: "another disruption decides already", policy: ignoreDisruptions,
			pod: pod(cond(corev1.DisruptionTarget, corev1.ConditionTrue, conditions.ReasonPreemptionByScheduler)), wait: 30 * time.Second, want: 0},
		{name: "a DRA device-taint eviction decides already", policy: ignoreDisruptions,
			pod: pod(cond(corev1.DisruptionTarget, corev1.ConditionTrue, "DeletionByDeviceTaintManager")), wait: 30 * time.Second, want: 0},
		{name: "DisruptionTarget False is no verdict", policy: ignoreDisruptions,
			pod: pod(cond(corev1.DisruptionTarget, corev1.ConditionFalse, conditions.ReasonStaleDisruptionTarget)), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "no device: no wait", policy: ignoreDisruptions, pod: pod(noDevices), wait: 30 * time.Second, want: 0},
		{name: "a device named only in allocatedResourcesStatus", policy: ignoreDisruptions,
			pod: pod(noDevices, func(p *corev1.Pod) {
				p.Status.ContainerStatuses[0].AllocatedResourcesStatus = []corev1.ResourceStatus{{Name: "example.com/gpu", Resources: []corev1.ResourceHealth{{ResourceID: "dev-0", Health: corev1.ResourceHealthStatusUnhealthy}}}}
			}), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "a DRA claim", policy: ignoreDisruptions,
			pod: pod(noDevices, func(p *corev1.Pod) { p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu"}} }), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "exit 0 is no death", policy: ignoreDisruptions, pod: pod(statuses(exit(0, 0, time.Second))), wait: 30 * time.Second, want: 0},
		{name: "not failed", policy: ignoreDisruptions, pod: pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning }), wait: 30 * time.Second, want: 0},
		{name: "no finishedAt: nothing to count from", policy: ignoreDisruptions,
			pod: pod(statuses(corev1.ContainerStatus{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}})), wait: 30 * time.Second, want: 0},
		{name: "turned off", policy: ignoreDisruptions, pod: pod(), wait: 0, want: 0},
		{name: "no policy", policy: nil, pod: pod(), wait: 30 * time.Second, want: 0},
		{name: "exit-code rules alone do not read the verdict", policy: policy(exitRule(batchv1.PodFailurePolicyActionFailJob, 42)), pod: pod(), wait: 30 * time.Second, want: 0},
		{name: "a rule on another condition does not read it", policy: policy(rule(batchv1.PodFailurePolicyActionIgnore, "example.com/Preempted", corev1.ConditionTrue)), pod: pod(), wait: 30 * time.Second, want: 0},
		{name: "an earlier exit-code rule decides whatever the verdict", policy: policy(exitRule(batchv1.PodFailurePolicyActionFailJob, 1), ignoreDisruptions.Rules[0]), pod: pod(), wait: 30 * time.Second, want: 0},
		{name: "an earlier exit-code rule that does not match this exit", policy: policy(exitRule(batchv1.PodFailurePolicyActionFailJob, 42), ignoreDisruptions.Rules[0]), pod: pod(), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "Count on DisruptionTarget: counted either way", policy: policy(rule(batchv1.PodFailurePolicyActionCount, corev1.DisruptionTarget, corev1.ConditionTrue)), pod: pod(), wait: 30 * time.Second, want: 0},
		{name: "FailJob on DeviceFailed=False reads the healthy verdict", policy: policy(rule(batchv1.PodFailurePolicyActionFailJob, conditions.DeviceFailed, corev1.ConditionFalse)), pod: pod(), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "Ignore on DeviceFailed", policy: policy(rule(batchv1.PodFailurePolicyActionIgnore, conditions.DeviceFailed, corev1.ConditionTrue)), pod: pod(), wait: 30 * time.Second, want: 25 * time.Second},
		{name: "refused at admission, its GPU gone Unhealthy: waits from the Failed transition", policy: ignoreDisruptions,
			pod:  pod(admissionRefused("Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate unhealthy devices coroner.dev/test-gpu, which is unexpected", now.Add(-4*time.Second))),
			wait: 30 * time.Second, want: 26 * time.Second},
		{name: "refused at admission for another reason: no wait", policy: ignoreDisruptions,
			pod:  pod(admissionRefused("Pod was rejected: failed to sync secret cache: timed out waiting for the condition", now.Add(-4*time.Second))),
			wait: 30 * time.Second, want: 0},
		{name: "an init container's death", policy: ignoreDisruptions,
			pod: pod(statuses(), func(p *corev1.Pod) {
				p.Status.InitContainerStatuses = []corev1.ContainerStatus{exit(1, 0, 3*time.Second)}
			}), wait: 30 * time.Second, want: 27 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job := &batchv1.Job{Spec: batchv1.JobSpec{PodFailurePolicy: tc.policy}}
			if got := AwaitingDeviceVerdict(job, tc.pod, now, tc.wait); got != tc.want {
				t.Errorf("AwaitingDeviceVerdict = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAwaitsDeviceVerdictNamesTheDeath(t *testing.T) {
	at := time.Date(2026, 12, 7, 19, 40, 1, 0, time.UTC)
	gpu := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	p := &corev1.Pod{
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{Limits: gpu}}}},
		Status: corev1.PodStatus{Phase: corev1.PodFailed,
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "setup", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, FinishedAt: metav1.NewTime(at.Add(-time.Minute))}}}},
			ContainerStatuses:     []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: metav1.NewTime(at)}}}}},
	}
	pfp := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}}}}}
	d, ok := AwaitsDeviceVerdict(pfp, p)
	if !ok || d != (DeviceDeath{Container: "main", FinishedAt: at}) {
		t.Errorf("AwaitsDeviceVerdict = %+v, %v; want container main at %v", d, ok, at)
	}
	if len(p.Status.Conditions) != 0 {
		t.Errorf("the pod was modified: %v", p.Status.Conditions)
	}
}

// TestDeviceVerdictMattersOnAStampedPod: the question is asked of pods judged with their
// verdict too (for the Events and metrics): the verdict is taken off first.
func TestDeviceVerdictMattersOnAStampedPod(t *testing.T) {
	ignore := &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionIgnore,
		OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}}}}
	p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Conditions: []corev1.PodCondition{
		{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure},
		{Type: conditions.DeviceFailed, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure},
	}}}
	if !DeviceVerdictMatters(ignore, p) {
		t.Error("a DeviceFailure stamp under Ignore on DisruptionTarget: want it to matter")
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: conditions.DeviceFailed, Status: corev1.ConditionFalse, Reason: conditions.ReasonNoDeviceFailure}}
	if !DeviceVerdictMatters(ignore, p) {
		t.Error("a NoDeviceFailure stamp under Ignore on DisruptionTarget: want it to matter")
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonPreemptionByScheduler}}
	if DeviceVerdictMatters(ignore, p) {
		t.Error("a preempted pod is Ignored whatever the device verdict")
	}
}

// admissionRefused makes the pod one the kubelet refused at admission with msg, as the
// kubelet v1.36.3 leaves it (seen on the lab): status.reason UnexpectedAdmissionError, its
// container "terminated" 137 without a finishedAt, conditions turned at failed.
func admissionRefused(msg string, failed time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Reason, p.Status.Message = conditions.ReasonUnexpectedAdmissionError, msg
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 137, Reason: "ContainerStatusUnknown"}}}}
		p.Status.Conditions = append(p.Status.Conditions,
			corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(failed.Add(-time.Second))},
			corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "PodFailed", LastTransitionTime: metav1.NewTime(failed)})
	}
}
