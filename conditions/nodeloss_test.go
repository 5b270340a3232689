package conditions

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestLostWithNode(t *testing.T) {
	cond := func(typ corev1.PodConditionType, status corev1.ConditionStatus, reason string) corev1.PodCondition {
		return corev1.PodCondition{Type: typ, Status: status, Reason: reason}
	}
	for _, tc := range []struct {
		name  string
		conds []corev1.PodCondition
		want  string
	}{
		{"no condition", nil, ""},
		{"recovered from a fenced node", []corev1.PodCondition{cond(ForcefullyTerminated, corev1.ConditionTrue, ReasonNodeFenced),
			cond(DisruptionTarget, corev1.ConditionTrue, ReasonNodeFenced)}, "coroner.dev/ForcefullyTerminated NodeFenced"},
		{"recovered after the threshold", []corev1.PodCondition{cond(ForcefullyTerminated, corev1.ConditionTrue, ReasonNodeUnreachable)},
			"coroner.dev/ForcefullyTerminated NodeUnreachable"},
		{"taint eviction first, then recovered", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionTrue, ReasonDeletionByTaintManager),
			cond(ForcefullyTerminated, corev1.ConditionTrue, ReasonNodeFenced)}, "coroner.dev/ForcefullyTerminated NodeFenced"},
		{"taint eviction", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionTrue, ReasonDeletionByTaintManager)},
			"DisruptionTarget DeletionByTaintManager"},
		{"node gone (pod GC)", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionTrue, ReasonDeletionByPodGC)},
			"DisruptionTarget DeletionByPodGC"},
		{"a taint eviction that was called off", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionFalse, ReasonDeletionByTaintManager)}, ""},
		{"ForcefullyTerminated False", []corev1.PodCondition{cond(ForcefullyTerminated, corev1.ConditionFalse, ReasonNodeFenced)}, ""},
		{"preempted: not a node loss", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionTrue, ReasonPreemptionByScheduler)}, ""},
		{"evicted (drain): not a node loss", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionTrue, ReasonEvictionByEvictionAPI)}, ""},
		{"node pressure: not a node loss", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionTrue, ReasonTerminationByKubelet)}, ""},
		{"node OOM kill: not a node loss", []corev1.PodCondition{cond(DisruptionTarget, corev1.ConditionTrue, ReasonNodeOOMKill)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, Conditions: tc.conds}}
			if got := LostWithNode(p); got != tc.want {
				t.Errorf("LostWithNode = %q, want %q", got, tc.want)
			}
		})
	}
}
