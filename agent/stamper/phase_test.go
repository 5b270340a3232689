package stamper

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/conditions"
)

// TestPhaseCarriesTheExits (A4 with item 7 of issue 12): a terminal phase stamp with the
// runtime's exits writes phase, condition and the exits' terminated states in one patch,
// only where the kubelet's status says running or lacks the container; and after a
// conflict the statuses are recomputed from the pod as the kubelet left it.
func TestPhaseCarriesTheExits(t *testing.T) {
	finished := t0.Add(-10 * time.Second)
	exits := []classify.ContainerState{
		{Name: "main", State: classify.StateExited, ExitCode: 42, Reason: "Error", FinishedAt: finished, StartedAt: t0.Add(-time.Minute), ContainerID: "aaa"},
		{Name: "side", State: classify.StateExited, ExitCode: 0, Reason: "Completed", FinishedAt: finished, ContainerID: "bbb"},
	}
	stamp := func() classify.Stamp {
		s := phase(corev1.PodFailed)
		s.Terminated = exits
		s.Condition = &corev1.PodCondition{Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: conditions.ReasonTerminationByKubelet, Message: "evicted"}
		return s
	}
	running := func(name, id string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, Image: "busybox", ContainerID: id, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(t0.Add(-time.Minute))}}}
	}

	t.Run("running statuses get the runtime's exits", func(t *testing.T) {
		p := testPod()
		p.Status.ContainerStatuses = []corev1.ContainerStatus{running("main", "containerd://aaa")}
		e := newEnv(t, p)
		e.s.Add(Request{Pod: ref, Stamp: stamp()})
		e.step(DefaultBatchPeriod)
		e.waitPatches(1)
		got := e.pods.Pod(ns, podName)
		if got.Status.Phase != corev1.PodFailed || !conditions.IsTrue(&got.Status, conditions.DisruptionTarget) {
			t.Fatalf("phase %q, conditions %+v", got.Status.Phase, got.Status.Conditions)
		}
		if len(got.Status.ContainerStatuses) != 2 {
			t.Fatalf("container statuses %+v, want main and side", got.Status.ContainerStatuses)
		}
		for _, want := range []struct {
			name   string
			code   int32
			reason string
			id     string
		}{{"main", 42, "Error", "containerd://aaa"}, {"side", 0, "Completed", "containerd://bbb"}} {
			var st *corev1.ContainerStatus
			for i := range got.Status.ContainerStatuses {
				if got.Status.ContainerStatuses[i].Name == want.name {
					st = &got.Status.ContainerStatuses[i]
				}
			}
			if st == nil || st.State.Terminated == nil {
				t.Fatalf("container %s: status %+v, want terminated", want.name, st)
			}
			term := st.State.Terminated
			if term.ExitCode != want.code || term.Reason != want.reason || term.ContainerID != want.id || !term.FinishedAt.Time.Equal(finished) || st.Ready {
				t.Errorf("container %s: %+v (ready %v), want exit %d %s %s finished %v", want.name, term, st.Ready, want.code, want.reason, want.id, finished)
			}
		}
	})

	t.Run("the kubelet's terminated state, written meanwhile, is kept", func(t *testing.T) {
		p := testPod()
		p.Status.ContainerStatuses = []corev1.ContainerStatus{running("main", "containerd://aaa"), running("side", "containerd://bbb")}
		e := newEnv(t, p)
		// The kubelet writes main's termination (not the phase) between the agent's read
		// and its patch: a conflict, then the statuses are recomputed.
		e.pods.BeforePatch = func(f *fakePods) {
			f.BeforePatch = nil
			cur := f.Pod(ns, podName)
			cur.Status.ContainerStatuses[0].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 7, Reason: "Error", ContainerID: "containerd://aaa"}}
			f.Store(cur)
		}
		e.s.Add(Request{Pod: ref, Stamp: stamp()})
		e.step(DefaultBatchPeriod)
		e.waitPatches(2)
		got := e.pods.Pod(ns, podName)
		if got.Status.Phase != corev1.PodFailed {
			t.Fatalf("phase %q", got.Status.Phase)
		}
		if term := got.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 7 {
			t.Errorf("main: %+v, want the kubelet's exit 7 kept", got.Status.ContainerStatuses[0].State)
		}
		if term := got.Status.ContainerStatuses[1].State.Terminated; term == nil || term.ExitCode != 0 || term.ContainerID != "containerd://bbb" {
			t.Errorf("side: %+v, want the runtime's exit 0", got.Status.ContainerStatuses[1].State)
		}
	})

	t.Run("a pod the kubelet made terminal is not written", func(t *testing.T) {
		p := testPod()
		p.Status.Phase = corev1.PodSucceeded
		p.Status.ContainerStatuses = []corev1.ContainerStatus{running("main", "containerd://aaa")}
		e := newEnv(t, p)
		e.s.Add(Request{Pod: ref, Stamp: stamp()})
		e.step(DefaultBatchPeriod)
		e.waitIdle()
		got := e.pods.Pod(ns, podName)
		if got.Status.Phase != corev1.PodSucceeded || got.Status.ContainerStatuses[0].State.Running == nil {
			t.Errorf("status %+v: the kubelet's terminal pod was written", got.Status)
		}
	})
}
