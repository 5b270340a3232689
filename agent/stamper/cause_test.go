package stamper

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/conditions"
)

// TestAfterStamp: the agent's "Stamped pod" log line names the cause of death of the pod
// as its stamp leaves it, in the words of conditions.CauseOfDeath (those of coroner-shim's
// Events and coronerctl explain).
func TestAfterStamp(t *testing.T) {
	running := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning,
				ContainerStatuses: []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
	}
	oom := corev1.PodCondition{Type: conditions.OOMKilled, Status: corev1.ConditionTrue, Reason: conditions.ReasonMemoryLimitExceeded, Message: "container main hit 24Mi"}
	node := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonNodeOOMKill}
	exit42 := classify.ContainerState{Name: "main", State: classify.StateExited, ExitCode: 42, FinishedAt: time.Unix(1000, 0), Reason: "Error"}
	for _, tc := range []struct {
		name string
		st   classify.Stamp
		want string
	}{
		{"the limit OOM condition on a running pod", classify.Stamp{Kind: classify.KindLimitOOM, Condition: &oom},
			"OOM-killed over its own memory limit (coroner.dev/OOMKilled MemoryLimitExceeded)"},
		{"a node OOM", classify.Stamp{Kind: classify.KindNodeOOM, Condition: &node},
			"killed by the node's OOM killer, not over its own limit (DisruptionTarget NodeOOMKill)"},
		{"a terminal phase with the runtime's exit the pod lacked", classify.Stamp{Kind: classify.KindTerminalPhase, Phase: corev1.PodFailed, Terminated: []classify.ContainerState{exit42}},
			"container main exited 42"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := running()
			before := pod.DeepCopy()
			if got := conditions.CauseOfDeath(afterStamp(pod, tc.st)).String(); got != tc.want {
				t.Errorf("cause %q, want %q", got, tc.want)
			}
			if pod.Status.Phase != before.Status.Phase || len(pod.Status.Conditions) != 0 || pod.Status.ContainerStatuses[0].State.Running == nil {
				t.Errorf("the cached pod was modified: %+v", pod.Status)
			}
		})
	}
}
