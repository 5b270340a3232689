package jobsync

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/test/wrappers"
)

// TestByIndex: pods by completion index, those without a valid one first, the pods of
// one index in their order; the input is left as it was.
func TestByIndex(t *testing.T) {
	pod := func(name string, ix int) *corev1.Pod {
		w := wrappers.MakePod(name, "ns")
		if ix >= 0 {
			w = w.Index(ix)
		}
		return w.Obj()
	}
	bad := pod("bad", -1)
	bad.Annotations = map[string]string{"batch.kubernetes.io/job-completion-index": "x"}
	in := []*corev1.Pod{pod("10-a", 10), pod("2-a", 2), pod("none", -1), pod("10-b", 10), bad, pod("0-a", 0), pod("2-b", 2)}
	before := names(in)
	got := names(byIndex(in))
	want := []string{"none", "bad", "0-a", "2-a", "2-b", "10-a", "10-b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, names(in)); diff != "" {
		t.Errorf("the input changed (-before +after):\n%s", diff)
	}
}
