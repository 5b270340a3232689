package quarantine

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/coroner-dev/coroner/conditions"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func node(name string, unschedulable bool, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "7"}, Spec: corev1.NodeSpec{Unschedulable: unschedulable, Taints: taints}}
}

func quarantined(cause string, effect corev1.TaintEffect, added *time.Time) corev1.Taint {
	t := corev1.Taint{Key: conditions.QuarantineTaintKey, Value: cause, Effect: effect}
	if added != nil {
		t.TimeAdded = &metav1.Time{Time: *added}
	}
	return t
}

var gpu = corev1.Taint{Key: "example.com/gpu", Value: "a100", Effect: corev1.TaintEffectNoSchedule}

func TestList(t *testing.T) {
	added := t0.Add(-10 * time.Minute)
	eventAt := t0.Add(-time.Hour)
	cs := fake.NewClientset(
		node("healthy", false, gpu),
		node("b-device", false, gpu, quarantined("device", corev1.TaintEffectNoSchedule, &added)),
		node("a-by-hand", true, quarantined("node-oom", corev1.TaintEffectPreferNoSchedule, nil)),
		node("c-no-event", false, quarantined("node-lost", corev1.TaintEffectNoSchedule, nil)),
		&corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "e1", Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "a-by-hand"},
			Reason:         conditions.ReasonNodeQuarantined, LastTimestamp: metav1.NewTime(eventAt),
		},
	)
	rows, err := List(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Print(&out, rows, t0); err != nil {
		t.Fatal(err)
	}
	want := `NODE        CAUSE      SINCE                              SCHEDULES
a-by-hand   node-oom   2026-12-07T11:00:00Z (1h0m0s ago)  discouraged, cordoned
b-device    device     2026-12-07T11:50:00Z (10m0s ago)   no
c-no-event  node-lost  unknown                            no
`
	if out.String() != want {
		t.Errorf("list:\n%s\nwant:\n%s", out.String(), want)
	}

	out.Reset()
	if err := Print(&out, nil, t0); err != nil || out.String() != "No quarantined nodes.\n" {
		t.Errorf("empty list: %q, %v", out.String(), err)
	}
}

func TestLift(t *testing.T) {
	added := t0
	t.Run("removes that taint only", func(t *testing.T) {
		cs := fake.NewClientset(node("a", true, gpu, quarantined("device", corev1.TaintEffectNoSchedule, &added)))
		var out bytes.Buffer
		if err := Lift(context.Background(), cs, &out, "a"); err != nil {
			t.Fatal(err)
		}
		n, err := cs.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Spec.Taints) != 1 || n.Spec.Taints[0] != gpu || !n.Spec.Unschedulable {
			t.Errorf("after the lift: taints %+v, unschedulable %v; want the other taint and the cordon kept", n.Spec.Taints, n.Spec.Unschedulable)
		}
		if want := "node a: quarantine lifted (taint coroner.dev/quarantined=device:NoSchedule removed)"; !strings.Contains(out.String(), want) {
			t.Errorf("output %q, want %q", out.String(), want)
		}
	})
	t.Run("an unknown node", func(t *testing.T) {
		err := Lift(context.Background(), fake.NewClientset(), &bytes.Buffer{}, "nope")
		if err == nil || err.Error() != `node "nope" not found` {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("a node without the taint", func(t *testing.T) {
		err := Lift(context.Background(), fake.NewClientset(node("a", false, gpu)), &bytes.Buffer{}, "a")
		if !errors.Is(err, ErrNotQuarantined) || err.Error() != "node a is not quarantined: it has no taint coroner.dev/quarantined" {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("the node changed between the read and the patch: read again", func(t *testing.T) {
		cs := fake.NewClientset(node("a", false, gpu, quarantined("device", corev1.TaintEffectNoSchedule, &added)))
		patches := 0
		cs.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
			patches++
			p := a.(k8stesting.PatchAction)
			if p.GetPatchType() != "application/json-patch+json" || !strings.Contains(string(p.GetPatch()), `"op":"test","path":"/metadata/resourceVersion"`) {
				t.Errorf("patch %s %s, want a JSON patch testing the resourceVersion", p.GetPatchType(), p.GetPatch())
			}
			if patches == 1 {
				return true, nil, errTestFailed
			}
			return false, nil, nil
		})
		if err := Lift(context.Background(), cs, &bytes.Buffer{}, "a"); err != nil || patches != 2 {
			t.Errorf("Lift = %v after %d patches, want nil after 2", err, patches)
		}
	})
}

// errTestFailed is the API server's answer to a JSON patch whose test op failed.
var errTestFailed = apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, "a", nil)
