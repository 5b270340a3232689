package conditions

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	t0 = metav1.NewTime(time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC))
	// t1 has a fraction of a second, which Set drops.
	t1      = metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC))
	t1Trunc = metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	tProbe  = metav1.NewTime(time.Date(2026, 1, 2, 3, 2, 0, 0, time.UTC))
)

func ready(status corev1.ConditionStatus) corev1.PodCondition {
	return corev1.PodCondition{Type: corev1.PodReady, Status: status, LastTransitionTime: t0}
}

func TestSet(t *testing.T) {
	nodeOOM := corev1.PodCondition{
		Type:    DisruptionTarget,
		Status:  corev1.ConditionTrue,
		Reason:  ReasonNodeOOMKill,
		Message: "container main killed by the node's OOM killer",
	}
	nodeOOMAt := func(ltt metav1.Time) corev1.PodCondition {
		c := nodeOOM
		c.LastTransitionTime = ltt
		return c
	}
	with := func(c corev1.PodCondition, f func(*corev1.PodCondition)) corev1.PodCondition {
		f(&c)
		return c
	}

	cases := []struct {
		name        string
		conditions  []corev1.PodCondition
		set         corev1.PodCondition
		wantChanged bool
		want        []corev1.PodCondition
	}{
		{
			name:        "new condition is appended with lastTransitionTime now, truncated to seconds",
			conditions:  []corev1.PodCondition{ready(corev1.ConditionTrue)},
			set:         nodeOOM,
			wantChanged: true,
			want:        []corev1.PodCondition{ready(corev1.ConditionTrue), nodeOOMAt(t1Trunc)},
		},
		{
			name:        "new condition keeps a lastTransitionTime given by the caller",
			set:         nodeOOMAt(tProbe),
			wantChanged: true,
			want:        []corev1.PodCondition{nodeOOMAt(tProbe)},
		},
		{
			name:        "same status, reason and message is no change and keeps lastTransitionTime",
			conditions:  []corev1.PodCondition{ready(corev1.ConditionTrue), nodeOOMAt(t0)},
			set:         nodeOOM,
			wantChanged: false,
			want:        []corev1.PodCondition{ready(corev1.ConditionTrue), nodeOOMAt(t0)},
		},
		{
			name:        "a different lastTransitionTime from the caller alone is no change",
			conditions:  []corev1.PodCondition{nodeOOMAt(t0)},
			set:         nodeOOMAt(tProbe),
			wantChanged: false,
			want:        []corev1.PodCondition{nodeOOMAt(t0)},
		},
		{
			name:        "reason change keeps lastTransitionTime",
			conditions:  []corev1.PodCondition{nodeOOMAt(t0)},
			set:         with(nodeOOM, func(c *corev1.PodCondition) { c.Reason = ReasonTerminationByKubelet }),
			wantChanged: true,
			want: []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) {
				c.Reason = ReasonTerminationByKubelet
			})},
		},
		{
			name:        "message change keeps lastTransitionTime",
			conditions:  []corev1.PodCondition{nodeOOMAt(t0)},
			set:         with(nodeOOM, func(c *corev1.PodCondition) { c.Message = "other" }),
			wantChanged: true,
			want:        []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) { c.Message = "other" })},
		},
		{
			name:       "status change sets lastTransitionTime to now",
			conditions: []corev1.PodCondition{ready(corev1.ConditionTrue), nodeOOMAt(t0)},
			set: with(nodeOOM, func(c *corev1.PodCondition) {
				c.Status = corev1.ConditionFalse
				c.Reason = ReasonStaleDisruptionTarget
				c.Message = ""
			}),
			wantChanged: true,
			want: []corev1.PodCondition{ready(corev1.ConditionTrue), {
				Type: DisruptionTarget, Status: corev1.ConditionFalse, Reason: ReasonStaleDisruptionTarget, LastTransitionTime: t1Trunc,
			}},
		},
		{
			name:        "status change uses a lastTransitionTime given by the caller",
			conditions:  []corev1.PodCondition{nodeOOMAt(t0)},
			set:         with(nodeOOMAt(tProbe), func(c *corev1.PodCondition) { c.Status = corev1.ConditionFalse }),
			wantChanged: true,
			want: []corev1.PodCondition{with(nodeOOMAt(tProbe), func(c *corev1.PodCondition) {
				c.Status = corev1.ConditionFalse
			})},
		},
		{
			name: "zero observedGeneration and lastProbeTime keep the stored ones",
			conditions: []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) {
				c.ObservedGeneration = 3
				c.LastProbeTime = tProbe
			})},
			set:         nodeOOM,
			wantChanged: false,
			want: []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) {
				c.ObservedGeneration = 3
				c.LastProbeTime = tProbe
			})},
		},
		{
			name: "zero observedGeneration keeps the stored one on a change",
			conditions: []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) {
				c.ObservedGeneration = 3
			})},
			set:         with(nodeOOM, func(c *corev1.PodCondition) { c.Message = "other" }),
			wantChanged: true,
			want: []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) {
				c.ObservedGeneration = 3
				c.Message = "other"
			})},
		},
		{
			name:        "different non-zero observedGeneration is a change",
			conditions:  []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) { c.ObservedGeneration = 3 })},
			set:         with(nodeOOM, func(c *corev1.PodCondition) { c.ObservedGeneration = 4 }),
			wantChanged: true,
			want:        []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) { c.ObservedGeneration = 4 })},
		},
		{
			name:        "different non-zero lastProbeTime is a change",
			conditions:  []corev1.PodCondition{nodeOOMAt(t0)},
			set:         with(nodeOOM, func(c *corev1.PodCondition) { c.LastProbeTime = t1 }),
			wantChanged: true,
			want:        []corev1.PodCondition{with(nodeOOMAt(t0), func(c *corev1.PodCondition) { c.LastProbeTime = t1Trunc })},
		},
		{
			name:        "only the condition of the same type is touched, order is kept",
			conditions:  []corev1.PodCondition{nodeOOMAt(t0), ready(corev1.ConditionFalse)},
			set:         corev1.PodCondition{Type: OOMKilled, Status: corev1.ConditionTrue, Reason: ReasonMemoryLimitExceeded},
			wantChanged: true,
			want: []corev1.PodCondition{nodeOOMAt(t0), ready(corev1.ConditionFalse), {
				Type: OOMKilled, Status: corev1.ConditionTrue, Reason: ReasonMemoryLimitExceeded, LastTransitionTime: t1Trunc,
			}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status := &corev1.PodStatus{Conditions: tc.conditions}
			before := status.DeepCopy()
			got := Set(status, tc.set, t1)
			if got != tc.wantChanged {
				t.Errorf("Set() = %v, want %v", got, tc.wantChanged)
			}
			if diff := cmp.Diff(tc.want, status.Conditions); diff != "" {
				t.Errorf("conditions (-want +got):\n%s", diff)
			}
			if !got {
				if diff := cmp.Diff(before, status); diff != "" {
					t.Errorf("Set returned false but changed status (-before +after):\n%s", diff)
				}
			}
		})
	}
}

func TestFindAndIsTrue(t *testing.T) {
	status := &corev1.PodStatus{Conditions: []corev1.PodCondition{
		ready(corev1.ConditionFalse),
		{Type: DisruptionTarget, Status: corev1.ConditionTrue, Reason: ReasonDeletionByPodGC},
	}}
	cases := []struct {
		name       string
		status     *corev1.PodStatus
		typ        corev1.PodConditionType
		wantReason string
		wantFound  bool
		wantTrue   bool
	}{
		{name: "nil status", status: nil, typ: DisruptionTarget},
		{name: "absent", status: status, typ: OOMKilled},
		{name: "present and True", status: status, typ: DisruptionTarget, wantFound: true, wantTrue: true, wantReason: ReasonDeletionByPodGC},
		{name: "present and False", status: status, typ: corev1.PodReady, wantFound: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Find(tc.status, tc.typ)
			if (c != nil) != tc.wantFound {
				t.Fatalf("Find() = %v, want found %v", c, tc.wantFound)
			}
			if c != nil && c.Reason != tc.wantReason {
				t.Errorf("Find().Reason = %q, want %q", c.Reason, tc.wantReason)
			}
			if got := IsTrue(tc.status, tc.typ); got != tc.wantTrue {
				t.Errorf("IsTrue() = %v, want %v", got, tc.wantTrue)
			}
		})
	}

	// Find points into the slice.
	Find(status, DisruptionTarget).Message = "m"
	if status.Conditions[1].Message != "m" {
		t.Errorf("Find did not return a pointer into status.Conditions")
	}
}
