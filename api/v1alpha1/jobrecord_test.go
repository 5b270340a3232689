package v1alpha1

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

var t0 = metav1.NewTime(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))

func TestAdd(t *testing.T) {
	e := func(name string, o Outcome) Entry {
		return Entry{Name: name, Phase: corev1.PodFailed, Outcome: o, Recorded: t0}
	}
	names := func(r Record) []string {
		var out []string
		for _, x := range r.Entries {
			out = append(out, x.Name)
		}
		return out
	}
	t.Run("new entries append, oldest first", func(t *testing.T) {
		var r Record
		if !r.Add(0, e("a", OutcomeFailed), e("b", OutcomeSucceeded)) {
			t.Fatal("no change reported")
		}
		if diff := cmp.Diff([]string{"a", "b"}, names(r)); diff != "" {
			t.Error(diff)
		}
	})
	t.Run("the same entry again is no change, even recorded later", func(t *testing.T) {
		var r Record
		r.Add(0, e("a", OutcomeFailed))
		again := e("a", OutcomeFailed)
		again.Recorded = metav1.NewTime(t0.Add(time.Minute))
		if r.Add(0, again) {
			t.Error("re-recording an unchanged pod reported a change")
		}
	})
	t.Run("a later word replaces the entry and moves it last", func(t *testing.T) {
		var r Record
		r.Add(0, e("a", OutcomeDeleted), e("b", OutcomeFailed))
		if !r.Add(0, e("a", OutcomeFailed)) {
			t.Fatal("no change reported")
		}
		if diff := cmp.Diff([]string{"b", "a"}, names(r)); diff != "" {
			t.Error(diff)
		}
		if got, _ := r.Find("a"); got.Outcome != OutcomeFailed {
			t.Errorf("a: %s, want Failed", got.Outcome)
		}
	})
	t.Run("past the bound: successes go first, then deletions, ignored, failures; counted", func(t *testing.T) {
		var r Record
		r.Add(0, e("f1", OutcomeFailed), e("s1", OutcomeSucceeded), e("i1", OutcomeIgnored), e("d1", OutcomeDeleted), e("s2", OutcomeSucceeded), e("f2", OutcomeFailed))
		r.Add(3)
		if diff := cmp.Diff([]string{"f1", "i1", "f2"}, names(r)); diff != "" {
			t.Errorf("kept (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(map[Outcome]int32{OutcomeSucceeded: 2, OutcomeDeleted: 1}, r.Dropped); diff != "" {
			t.Errorf("dropped (-want +got):\n%s", diff)
		}
		r.Add(1)
		if diff := cmp.Diff([]string{"f2"}, names(r)); diff != "" {
			t.Errorf("kept at 1 (-want +got):\n%s", diff)
		}
		if r.DroppedTotal() != 5 {
			t.Errorf("dropped %d in all, want 5", r.DroppedTotal())
		}
	})
}

// TestDeepCopy: a copy shares nothing with the original.
func TestDeepCopy(t *testing.T) {
	o := New("ns", "j", "uid")
	var r Record
	r.Add(0, Entry{Name: "j-0-a", Index: ptr.To[int32](0), Node: "node-a", Phase: corev1.PodFailed, Outcome: OutcomeFailed,
		Cause: &conditions.Cause{Class: conditions.CauseNonZeroExit, Exit: &conditions.CauseExit{Container: "main", Code: 1, Reason: "Error"}},
		Rule:  ptr.To[int32](2), Action: "Count", Restarts: 1, LastExit: &conditions.CauseExit{Container: "main", Code: 3},
		Finished: &t0, Recorded: t0})
	r.Dropped = map[Outcome]int32{OutcomeSucceeded: 1}
	o.Set(r, 10)
	c := o.DeepCopyObject().(*JobRecord)
	if diff := cmp.Diff(o, c); diff != "" {
		t.Fatalf("copy differs (-want +got):\n%s", diff)
	}
	e := c.Pods["j-0-a"]
	*e.Index, *e.Rule, e.Cause.Exit.Code, e.LastExit.Code = 9, 9, 9, 9
	e.Finished.Time = time.Time{}
	c.Dropped[OutcomeSucceeded] = 9
	c.OwnerReferences[0].Name = "other"
	if diff := cmp.Diff(New("ns", "j", "uid").OwnerReferences, o.OwnerReferences); diff != "" {
		t.Errorf("the original's owner changed: %s", diff)
	}
	if got := o.Pods["j-0-a"]; *got.Index != 0 || *got.Rule != 2 || got.Cause.Exit.Code != 1 || got.LastExit.Code != 3 || got.Finished.IsZero() || o.Dropped[OutcomeSucceeded] != 1 {
		t.Errorf("the original changed with its copy: %+v, dropped %v", got, o.Dropped)
	}
}
