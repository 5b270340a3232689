package conditions

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCauseOfDeath(t *testing.T) {
	exited := func(name string, code int32, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}
	}
	running := corev1.ContainerStatus{Name: "side", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	cond := func(typ corev1.PodConditionType, status corev1.ConditionStatus, reason, msg string) corev1.PodCondition {
		return corev1.PodCondition{Type: typ, Status: status, Reason: reason, Message: msg}
	}
	pod := func(phase corev1.PodPhase, containers []corev1.ContainerStatus, conds ...corev1.PodCondition) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: phase, ContainerStatuses: containers, Conditions: conds}}
	}
	oom137 := exited("main", 137, "OOMKilled")
	for _, tc := range []struct {
		name  string
		pod   *corev1.Pod
		class CauseClass
		want  string
	}{
		{"a plain exit: the kubelet's Error left out", pod(corev1.PodFailed, []corev1.ContainerStatus{running, exited("main", 42, "Error")}),
			CauseNonZeroExit, "container main exited 42"},
		{"an init container first", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed,
			InitContainerStatuses: []corev1.ContainerStatus{exited("setup", 3, "Error")}, ContainerStatuses: []corev1.ContainerStatus{exited("main", 1, "Error")}}},
			CauseNonZeroExit, "init container setup exited 3"},
		{"a signal and a reason other than Error", pod(corev1.PodFailed, []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 143, Signal: 15, Reason: "Completed"}}}}),
			CauseNonZeroExit, "container main exited 143 (signal 15) (Completed)"},
		{"the agent's limit OOM before the exit", pod(corev1.PodFailed, []corev1.ContainerStatus{oom137}, cond(OOMKilled, corev1.ConditionTrue, ReasonMemoryLimitExceeded, "container main hit 24Mi")),
			CauseLimitOOM, "OOM-killed over its own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded); container main exited 137 (OOMKilled)"},
		{"a node OOM is not the pod's limit", pod(corev1.PodFailed, []corev1.ContainerStatus{oom137}, cond(DisruptionTarget, corev1.ConditionTrue, ReasonNodeOOMKill, "node memory pressure")),
			CauseNodeOOM, "killed by the node's OOM killer, not over its own limit (DisruptionTarget NodeOOMKill); container main exited 137 (OOMKilled)"},
		{"a failing device", pod(corev1.PodFailed, []corev1.ContainerStatus{exited("main", 1, "Error")}, cond(DisruptionTarget, corev1.ConditionTrue, ReasonDeviceFailure, "container main died: its device x"), cond(DeviceFailed, corev1.ConditionTrue, ReasonDeviceFailure, "container main died: its device x")),
			CauseDevice, "killed by a failing device (DisruptionTarget DeviceFailure); container main exited 1"},
		{"a disruption, no exit", pod(corev1.PodFailed, nil, cond(DisruptionTarget, corev1.ConditionTrue, "PreemptionByScheduler", "preempted\nby x")),
			CauseDisruption, "disrupted (DisruptionTarget PreemptionByScheduler)"},
		{"a False DisruptionTarget (stale, set False) says nothing", pod(corev1.PodFailed, []corev1.ContainerStatus{exited("main", 1, "Error")}, cond(DisruptionTarget, corev1.ConditionFalse, "StaleDisruptionTarget", "")),
			CauseNonZeroExit, "container main exited 1"},
		{"coroner-shim's recovery", pod(corev1.PodFailed, []corev1.ContainerStatus{running}, cond(ForcefullyTerminated, corev1.ConditionTrue, ReasonNodeFenced, "fenced")),
			CauseForcefullyTerminated, "forcefully terminated by coroner-shim (coroner.dev/ForcefullyTerminated NodeFenced)"},
		{"a condition without a reason", pod(corev1.PodFailed, nil, cond(DisruptionTarget, corev1.ConditionTrue, "", "")),
			CauseDisruption, "disrupted (DisruptionTarget)"},
		{"an OOM kill nobody classified", pod(corev1.PodFailed, []corev1.ContainerStatus{oom137}),
			CauseUnclassifiedOOM, "container main exited 137 (OOMKilled), an OOM kill coroner-agent did not classify (limit or node unknown)"},
		{"the pod's own reason", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "DeadlineExceeded", Message: "Pod was active on the node longer than the specified deadline"}},
			CausePodReason, "pod failed: DeadlineExceeded: Pod was active on the node longer than the specified deadline"},
		{"deleted while running", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{}}, Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{running}}},
			CauseDeleted, "deleted before it finished"},
		{"nothing says why", pod(corev1.PodFailed, []corev1.ContainerStatus{exited("main", 0, "Completed")}),
			CauseUnknown, "no container exited with a non-zero code, and nothing on the pod says why"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			c := CauseOfDeath(tc.pod)
			if c.Class != tc.class {
				t.Errorf("class %s, want %s", c.Class, tc.class)
			}
			if got := c.String(); got != tc.want {
				t.Errorf("String:\n got  %q\n want %q", got, tc.want)
			}
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Errorf("the pod was modified:\n%s", diff)
			}
		})
	}
	// The message stays in the Cause, on one line, for the places that show it.
	c := CauseOfDeath(pod(corev1.PodFailed, nil, cond(DisruptionTarget, corev1.ConditionTrue, "PreemptionByScheduler", "preempted\nby x")))
	if c.Message != "preempted; by x" {
		t.Errorf("message %q", c.Message)
	}
}
