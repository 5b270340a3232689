package fence

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/coroner-dev/coroner/conditions"
)

func TestFencingOffLease(t *testing.T) {
	lease := func(ann map[string]string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: conditions.AgentLeaseName(node), Namespace: "coroner-system", Annotations: ann}}
	}
	for _, tc := range []struct {
		name string
		cur  *coordinationv1.Lease
		want *coordinationv1.Lease
	}{
		{"no Lease", nil, nil},
		{"no annotations", lease(nil), nil},
		{"no fence-after (already off)", lease(map[string]string{conditions.AnnotationFencedAt: "2026-02-01T00:00:00Z"}), nil},
		{"fence-after taken off, the record and the rest kept",
			lease(map[string]string{conditions.AnnotationFenceAfter: "30s", conditions.AnnotationFencedAt: "2026-02-01T00:00:00Z", "other": "kept"}),
			lease(map[string]string{conditions.AnnotationFencedAt: "2026-02-01T00:00:00Z", "other": "kept"})},
		{"an invalid fence-after goes too", lease(map[string]string{conditions.AnnotationFenceAfter: "soon"}), lease(map[string]string{})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before *coordinationv1.Lease
			if tc.cur != nil {
				before = tc.cur.DeepCopy()
			}
			got := FencingOffLease(tc.cur)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("FencingOffLease (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.cur); diff != "" {
				t.Errorf("the input was modified (-before +after):\n%s", diff)
			}
		})
	}
}

func TestDisown(t *testing.T) {
	ctx := context.Background()
	name := conditions.AgentLeaseName(node)
	stale := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "coroner-system",
		Annotations: map[string]string{conditions.AnnotationFenceAfter: "30s", conditions.AnnotationFencedAt: "2026-02-01T00:00:00Z"}}}
	leaseGVR := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	conflictOnce := func(c *fake.Clientset) *int {
		n := new(int)
		c.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			*n++
			if *n == 1 {
				return true, nil, apierrors.NewConflict(leaseGVR.GroupResource(), name, errors.New("changed"))
			}
			return false, nil, nil
		})
		return n
	}
	for _, tc := range []struct {
		name        string
		objects     []runtime.Object
		react       func(*fake.Clientset) *int // counts updates
		wantWritten bool
		wantErr     string
		wantUpdates int
	}{
		{name: "no Lease: nothing to do", wantUpdates: 0},
		{name: "a Lease without fence-after: left alone", objects: []runtime.Object{func() *coordinationv1.Lease {
			l := stale.DeepCopy()
			delete(l.Annotations, conditions.AnnotationFenceAfter)
			return l
		}()}, wantUpdates: 0},
		{name: "a stale fencing Lease: fence-after taken off", objects: []runtime.Object{stale.DeepCopy()}, wantWritten: true, wantUpdates: 1},
		{name: "a conflict: read again and written", objects: []runtime.Object{stale.DeepCopy()}, react: conflictOnce, wantWritten: true, wantUpdates: 2},
		{name: "forbidden: the error says so", objects: []runtime.Object{stale.DeepCopy()}, react: func(c *fake.Clientset) *int {
			n := new(int)
			c.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				*n++
				return true, nil, apierrors.NewForbidden(leaseGVR.GroupResource(), name, errors.New("rbac"))
			})
			return n
		}, wantErr: "taking the fence-after off Lease coroner-system/coroner-agent-node-a", wantUpdates: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(tc.objects...)
			updates := new(int)
			if tc.react != nil {
				updates = tc.react(c)
			} else {
				c.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
					*updates++
					return false, nil, nil
				})
			}
			got, err := Disown(ctx, c, "coroner-system", node)
			if tc.wantErr != "" {
				if err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Disown: %v, want a Forbidden error with %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Disown: %v", err)
			}
			if (got != nil) != tc.wantWritten {
				t.Errorf("Disown returned %v, want written: %v", got, tc.wantWritten)
			}
			if *updates != tc.wantUpdates {
				t.Errorf("%d updates, want %d", *updates, tc.wantUpdates)
			}
			if tc.wantWritten {
				l, err := c.CoordinationV1().Leases("coroner-system").Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := l.Annotations[conditions.AnnotationFenceAfter]; ok || l.Annotations[conditions.AnnotationFencedAt] == "" {
					t.Errorf("the Lease's annotations after Disown: %v; want no fence-after, fenced-at kept", l.Annotations)
				}
				if st := conditions.NodeFenced(conditions.FenceEvidence{Node: node, Agent: l}, t0, 0); st.Fenced {
					t.Errorf("NodeFenced after Disown: %+v", st)
				}
			}
		})
	}
}
