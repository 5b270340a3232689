package conditions

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodOfDecision(t *testing.T) {
	cases := []struct {
		msg, wantNS, wantName string
		wantOK                bool
	}{
		{"pod ns/x-1: container main exited 1, no rule matched: counts towards the backoff limit", "ns", "x-1", true},
		{AggregatedEventPrefix + "pod ns/x-1: condition DisruptionTarget (NodeOOMKill), matched rule 1 (Ignore): not counted", "ns", "x-1", true},
		{"Container main for pod ns/x-2 failed with exit code 42 matching FailJob rule at index 0", "ns", "x-2", true},
		{"Pod ns/x-3 has condition coroner.dev/OOMKilled matching FailJob rule at index 1: reason MemoryLimitExceeded", "ns", "x-3", true},
		{"Job has reached the specified backoff limit", "", "", false},
		{"pod with spaces: x", "", "", false},
	}
	for _, tc := range cases {
		ns, name, ok := PodOfDecision(tc.msg)
		if ns != tc.wantNS || name != tc.wantName || ok != tc.wantOK {
			t.Errorf("PodOfDecision(%q) = %q, %q, %v; want %q, %q, %v", tc.msg, ns, name, ok, tc.wantNS, tc.wantName, tc.wantOK)
		}
	}
}

// TestDeletedPodMessage: what the shim writes on deleting a pod reads back the same.
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
	got, ok := ParseDeletedPodMessage(AggregatedEventPrefix + msg)
	if !ok {
		t.Fatal("not parsed")
	}
	wantPod := DeletedPodOf(pod, "job failed: BackoffLimitExceeded")
	wantPod.Containers[3].Reason = "a, b [c]"
	if diff := cmp.Diff(wantPod, got); diff != "" {
		t.Errorf("parsed (-want +got):\n%s", diff)
	}

	// Upstream's message, and others.
	if d, ok := ParseDeletedPodMessage("Deleted pod: x-1"); !ok || d.Name != "x-1" || len(d.Containers) != 0 {
		t.Errorf("upstream message parsed as %+v, %v", d, ok)
	}
	if _, ok := ParseDeletedPodMessage("Created pod: x-1"); ok {
		t.Error("a creation parsed as a deletion")
	}
}
