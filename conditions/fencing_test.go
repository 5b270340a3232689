package conditions

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodeFenced(t *testing.T) {
	renewed := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	lease := func(annotations map[string]string, renew *time.Time) *coordinationv1.Lease {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: AgentLeaseName("n1"), Annotations: annotations}}
		if renew != nil {
			l.Spec.RenewTime = &metav1.MicroTime{Time: *renew}
		}
		return l
	}
	fencing := map[string]string{AnnotationFenceAfter: "45s"}
	const margin = 15 * time.Second
	cases := []struct {
		name      string
		lease     *coordinationv1.Lease
		now       time.Time
		want      bool
		wantSince time.Time
	}{
		{"no lease", nil, renewed.Add(time.Hour), false, time.Time{}},
		{"agent does not fence", lease(nil, &renewed), renewed.Add(time.Hour), false, time.Time{}},
		{"invalid fence-after", lease(map[string]string{AnnotationFenceAfter: "soon"}, &renewed), renewed.Add(time.Hour), false, time.Time{}},
		{"never renewed", lease(fencing, nil), renewed.Add(time.Hour), false, time.Time{}},
		{"fresh", lease(fencing, &renewed), renewed.Add(10 * time.Second), false, time.Time{}},
		{"past fence-after, within the margin", lease(fencing, &renewed), renewed.Add(59 * time.Second), false, time.Time{}},
		{"exactly fence-after plus margin", lease(fencing, &renewed), renewed.Add(60 * time.Second), true, renewed.Add(45 * time.Second)},
		{"long expired", lease(fencing, &renewed), renewed.Add(time.Hour), true, renewed.Add(45 * time.Second)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := NodeFenced(tc.lease, tc.now, margin)
			if got.Fenced != tc.want || !got.Since.Equal(tc.wantSince) || got.Why == "" {
				t.Errorf("NodeFenced = %+v, want fenced=%v since %v and a reason", got, tc.want, tc.wantSince)
			}
			deadline, ok := FenceDeadline(tc.lease, margin)
			if ok && (tc.now.Before(deadline) == tc.want) {
				t.Errorf("FenceDeadline %v disagrees with NodeFenced at %v", deadline, tc.now)
			}
		})
	}
}
