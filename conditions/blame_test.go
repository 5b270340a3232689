package conditions

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDisruptionClassOf(t *testing.T) {
	failed := func(mut func(p *corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: corev1.PodFailed}}
		mut(p)
		return p
	}
	cond := func(t corev1.PodConditionType, reason, msg string) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, Reason: reason, Message: msg})
		}
	}
	exit := func(code int32, reason string) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}}}}
		}
	}
	both := func(fs ...func(p *corev1.Pod)) func(p *corev1.Pod) {
		return func(p *corev1.Pod) {
			for _, f := range fs {
				f(p)
			}
		}
	}
	// The kubelet's messages (v1.36): pkg/kubelet/eviction's eviction message and
	// pkg/kubelet/nodeshutdown's.
	pressure := both(cond(DisruptionTarget, ReasonTerminationByKubelet, "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "),
		func(p *corev1.Pod) {
			p.Status.Reason, p.Status.Message = "Evicted", "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
		})
	shutdown := both(cond(DisruptionTarget, ReasonTerminationByKubelet, "Pod was terminated in response to imminent node shutdown."),
		func(p *corev1.Pod) {
			p.Status.Reason, p.Status.Message = "Terminated", "Pod was terminated in response to imminent node shutdown."
		})
	cases := []struct {
		name  string
		pod   *corev1.Pod
		class DisruptionClass
		blame bool
	}{
		{"exit 1", failed(exit(1, "Error")), DisruptionDefault, false},
		{"limit OOM", failed(both(exit(137, "OOMKilled"), cond(OOMKilled, ReasonMemoryLimitExceeded, ""))), DisruptionDefault, false},
		{"unclassified OOM", failed(exit(137, "OOMKilled")), DisruptionDefault, false},
		{"node OOM", failed(both(exit(137, "OOMKilled"), cond(DisruptionTarget, ReasonNodeOOMKill, ""))), DisruptionNodeOOM, true},
		{"device", failed(both(exit(1, "Error"), cond(DisruptionTarget, ReasonDeviceFailure, ""), cond(DeviceFailed, ReasonDeviceFailure, ""))), DisruptionDevice, true},
		{"node pressure", failed(pressure), DisruptionNodePressure, true},
		{"node shutdown", failed(shutdown), DisruptionNodeShutdown, false},
		{"preemption", failed(cond(DisruptionTarget, ReasonPreemptionByScheduler, "")), DisruptionPreemption, false},
		{"drain", failed(cond(DisruptionTarget, ReasonEvictionByEvictionAPI, "")), DisruptionEviction, false},
		{"taint manager", failed(cond(DisruptionTarget, ReasonDeletionByTaintManager, "")), DisruptionNodeLost, true},
		{"pod GC", failed(cond(DisruptionTarget, ReasonDeletionByPodGC, "")), DisruptionNodeLost, true},
		{"recovered by the shim", failed(cond(ForcefullyTerminated, ReasonNodeFenced, "")), DisruptionNodeLost, true},
		{"stale disruption", failed(cond(DisruptionTarget, ReasonStaleDisruptionTarget, "")), DisruptionDefault, false},
		{"node OOM, never bound", failed(both(cond(DisruptionTarget, ReasonNodeOOMKill, ""), func(p *corev1.Pod) { p.Spec.NodeName = "" })), DisruptionNodeOOM, false},
		{"node OOM stamped on a running pod", failed(both(cond(DisruptionTarget, ReasonNodeOOMKill, ""), func(p *corev1.Pod) { p.Status.Phase = corev1.PodRunning })), DisruptionNodeOOM, false},
		{"lost with its node, being deleted while running", failed(both(cond(DisruptionTarget, ReasonDeletionByTaintManager, ""), func(p *corev1.Pod) {
			p.Status.Phase, p.DeletionTimestamp = corev1.PodRunning, &metav1.Time{}
		})), DisruptionNodeLost, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := DisruptionClassOf(c.pod); got != c.class {
				t.Errorf("DisruptionClassOf = %q, want %q", got, c.class)
			}
			node, class, ok := NodeBlame(c.pod)
			if ok != c.blame || (ok && (node != "n1" || class != c.class)) {
				t.Errorf("NodeBlame = %q, %q, %v; want n1, %q, %v", node, class, ok, c.class, c.blame)
			}
			if !c.class.Valid() {
				t.Errorf("%q is not Valid", c.class)
			}
		})
	}
	if DisruptionClass("gpu").Valid() {
		t.Error(`"gpu" is Valid`)
	}
}
