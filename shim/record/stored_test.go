package record

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
)

// apply applies a merge patch to o as the API server does (JSON merge patch, RFC 7386).
func apply(t *testing.T, o *v1alpha1.JobRecord, patch []byte) *v1alpha1.JobRecord {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonpatch.MergePatch(b, patch)
	if err != nil {
		t.Fatalf("applying %s: %v", patch, err)
	}
	var got v1alpha1.JobRecord
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

func TestMergePatch(t *testing.T) {
	at := func(s int) metav1.Time { return metav1.NewTime(t0.Add(time.Duration(s) * time.Second)) }
	e := func(name string, o v1alpha1.Outcome, s int) v1alpha1.Entry {
		return v1alpha1.Entry{Name: name, Phase: corev1.PodFailed, Outcome: o, Recorded: at(s)}
	}
	stored := v1alpha1.New("ns", "j", "uid-1")
	stored.ResourceVersion = "41"
	stored.Set(v1alpha1.Record{Entries: []v1alpha1.Entry{e("a", v1alpha1.OutcomeSucceeded, 0), e("b", v1alpha1.OutcomeFailed, 1), e("c", v1alpha1.OutcomeDeleted, 2)}}, 3)

	t.Run("only what changed is sent, and the record it makes is the new one", func(t *testing.T) {
		next := stored.Record()
		next.Add(3, e("d", v1alpha1.OutcomeFailed, 3), v1alpha1.Entry{Name: "c", Phase: corev1.PodFailed, Outcome: v1alpha1.OutcomeFailed, Why: "job failed: BackoffLimitExceeded", Recorded: at(3)})
		patch, ok, err := MergePatch(stored, next, 3)
		if err != nil || !ok {
			t.Fatalf("MergePatch = %v, %v", ok, err)
		}
		var body map[string]any
		if err := json.Unmarshal(patch, &body); err != nil {
			t.Fatal(err)
		}
		pods := body["pods"].(map[string]any)
		if _, sent := pods["b"]; sent {
			t.Errorf("the unchanged entry b was sent: %s", patch)
		}
		if pods["a"] != nil {
			t.Errorf("the dropped entry a is not null: %s", patch)
		}
		if rv := body["metadata"].(map[string]any)["resourceVersion"]; rv != "41" {
			t.Errorf("resourceVersion precondition = %v, want 41", rv)
		}
		got := apply(t, stored, patch)
		// The stored order of entries recorded in the same second is by name.
		norm := &v1alpha1.JobRecord{}
		norm.Set(next, 3)
		want := norm.Record()
		if diff := cmp.Diff(want, got.Record()); diff != "" {
			t.Errorf("the patched record (-want +got):\n%s", diff)
		}
		if got.Dropped[v1alpha1.OutcomeSucceeded] != 1 {
			t.Errorf("dropped = %v, want one Succeeded", got.Dropped)
		}
	})
	t.Run("nothing to write", func(t *testing.T) {
		next := stored.Record()
		again := e("b", v1alpha1.OutcomeFailed, 9) // recorded again, unchanged but for the time
		if next.Add(3, again) {
			t.Error("Add reported a change for an unchanged entry")
		}
		if patch, ok, err := MergePatch(stored, next, 3); ok || err != nil {
			t.Errorf("MergePatch = %s, %v, %v; want nothing", patch, ok, err)
		}
	})
	t.Run("a new bound alone is written", func(t *testing.T) {
		if _, ok, _ := MergePatch(stored, stored.Record(), 5); !ok {
			t.Error("a changed maxPods was not written")
		}
	})
}

// TestPatched: the record the shim keeps after a write (Patched, from its own patch) is
// the one the API server stores (the patch applied by the JSON merge patch library the API
// server uses), round after round of new entries, changed entries and entries dropped
// past the bound, times with nanoseconds included.
func TestPatched(t *testing.T) {
	stored := v1alpha1.New("ns", "train", "uid-1")
	stored.ResourceVersion = "1"
	const max = 7
	for round := range 6 {
		next := stored.Record()
		for i := range 3 {
			name := fmt.Sprintf("train-%d-%d", i, round)
			at := t0.Add(time.Duration(round)*time.Second + time.Duration(i)*time.Millisecond + 123)
			next.Add(max, Of(failedPod(name, fmt.Sprint(i), int32(round+1)), Decision{Outcome: v1alpha1.OutcomeFailed, Consequence: "counts towards the backoff limit"}, metav1.NewTime(at)))
		}
		if round == 3 { // an entry of an earlier round written again, changed
			next.Add(max, Of(failedPod("train-0-2", "0", 9), Decision{Outcome: v1alpha1.OutcomeDeleted, Why: "job failed: BackoffLimitExceeded"}, metav1.NewTime(t0.Add(3*time.Second))))
		}
		patch, ok, err := MergePatch(stored, next, max)
		if err != nil || !ok {
			t.Fatalf("round %d: MergePatch = %v, %v", round, ok, err)
		}
		rv := fmt.Sprint(round + 2)
		want := apply(t, stored, patch)
		want.ResourceVersion = rv
		got, err := Patched(stored, patch, rv)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("round %d: the record kept (+) is not the stored one (-):\n%s", round, diff)
		}
		if round >= 3 && len(got.Pods) != max {
			t.Errorf("round %d: %d entries, want the bound %d", round, len(got.Pods), max)
		}
		stored = got
	}
	if stored.Dropped[v1alpha1.OutcomeFailed] == 0 {
		t.Errorf("no entry was dropped past the bound: %v", stored.Dropped)
	}
	if _, err := Patched(stored, []byte("{"), "9"); err == nil {
		t.Error("a patch that is not JSON was taken")
	}
}

// TestPatchSize: the bytes a write costs per pod recorded, the figure the merge patch is
// chosen for: a patch of 50 new entries into a record of 2,000.
func TestPatchSize(t *testing.T) {
	stored := v1alpha1.New("ns", "train", "uid-1")
	var r v1alpha1.Record
	for i := range 2000 {
		r.Add(0, Of(failedPod(fmt.Sprintf("train-%d-x7k2p", i), fmt.Sprint(i), 1), Decision{Outcome: v1alpha1.OutcomeFailed, Consequence: "counts towards the backoff limit"}, t0))
	}
	stored.Set(r, 3000)
	whole, err := json.Marshal(stored)
	if err != nil {
		t.Fatal(err)
	}
	next := stored.Record()
	for i := range 50 {
		next.Add(3000, Of(failedPod(fmt.Sprintf("train-%d-b9q4z", i), fmt.Sprint(i), 1), Decision{Outcome: v1alpha1.OutcomeFailed, Consequence: "counts towards the backoff limit"}, t0))
	}
	patch, ok, err := MergePatch(stored, next, 3000)
	if err != nil || !ok {
		t.Fatalf("MergePatch = %v, %v", ok, err)
	}
	per := len(patch) / 50
	t.Logf("record of 2,000 pods: %d bytes; a patch of 50 new pods: %d bytes, %d per pod", len(whole), len(patch), per)
	if per > 400 {
		t.Errorf("%d bytes per pod written", per)
	}
	if len(whole) > 700<<10 {
		t.Errorf("a record of 2,000 pods takes %d bytes of JSON, over 700 KiB: with the API server's managedFields (about half again) it would near etcd's 1.5 MiB", len(whole))
	}
}
