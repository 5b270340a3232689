package conditions

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeletedPodMessage: what the shim writes on deleting a pod, for people.
func TestDeletedPodMessage(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "train-3-x7k2p", Annotations: map[string]string{JobCompletionIndexAnnotation: "3"}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "setup",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: metav1.NewTime(at)}}}},
			ContainerStatuses: []corev1.ContainerStatus{
				{Name: "main", RestartCount: 6,
					State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
					LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled", FinishedAt: metav1.NewTime(at)}}},
				{Name: "side", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
				{Name: "odd", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: -1, Reason: "a; b (c)"}}},
			},
			Conditions: []corev1.PodCondition{
				{Type: OOMKilled, Status: corev1.ConditionTrue, Reason: ReasonMemoryLimitExceeded},
				{Type: DisruptionTarget, Status: corev1.ConditionFalse, Reason: ReasonStaleDisruptionTarget},
			},
		},
	}
	msg := DeletedPodMessage(pod, "job failed: BackoffLimitExceeded")
	want := "Deleted pod: train-3-x7k2p (job failed: BackoffLimitExceeded); index 3; phase Running; " +
		"init container setup exited 0 (Completed) at 2026-01-02T03:04:05Z; " +
		"container main waiting (CrashLoopBackOff), last exited 137 (OOMKilled) at 2026-01-02T03:04:05Z, 6 restarts; " +
		"container side running; container odd exited -1 (a, b [c]); condition coroner.dev/OOMKilled=True (MemoryLimitExceeded)"
	if msg != want {
		t.Errorf("message:\n got  %s\n want %s", msg, want)
	}
}
