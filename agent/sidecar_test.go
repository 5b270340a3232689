package agent

// Tests of native sidecars' exits in the exit history.

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
)

// TestNativeSidecarExitHistory (issue 12, item 8): the kubelet restarts a native sidecar
// (an init container with restartPolicy Always) in place even in a restartPolicy Never
// pod; each of its exits is recorded in the exit history, once.
func TestNativeSidecarExitHistory(t *testing.T) {
	uid := types.UID("abababab-abab-4bab-8bab-abababababab")
	p := newPod("with-proxy", uid, corev1.RestartPolicyNever, "main")
	p.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: ptr(corev1.ContainerRestartPolicyAlways)}}
	e := newTestEnv(t, nil, p)
	for attempt := range uint32(2) {
		id := containerID(300 + int(attempt))
		ev := exited(p, "proxy", id, 1, "Error")
		ev.Attempt = attempt
		ev.FinishedAt = t0.Add(time.Duration(attempt) * time.Minute)
		e.src.Send(ev)
		e.until("the exit classified", e.containerDone(id))
		e.src.Send(ev) // seen again (a relist): no second entry
	}
	var entries []v1alpha1.Exit
	e.stepUntil("both exits recorded", 20*time.Millisecond, func() bool {
		entries, _ = v1alpha1.ParseExitHistory(e.pod("with-proxy").Annotations[conditions.AnnotationExitHistory])
		return len(entries) == 2
	})
	for range 10 {
		e.clk.Step(20 * time.Millisecond)
		e.settle()
	}
	entries, _ = v1alpha1.ParseExitHistory(e.pod("with-proxy").Annotations[conditions.AnnotationExitHistory])
	if len(entries) != 2 || entries[0].Container != "proxy" || entries[0].RestartCount != 0 || entries[1].RestartCount != 1 {
		t.Errorf("exit history %+v, want proxy's exits of restart 0 and 1", entries)
	}
	if got := e.pod("with-proxy"); got.Status.Phase != corev1.PodRunning || len(got.Status.Conditions) != 0 {
		t.Errorf("status changed: %+v", got.Status)
	}
}
