package jobsync

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// TestCountRemoved: the UIDs whose finalizer removal succeeded move from
// uncountedTerminatedPods to the counters; the others stay, and nothing else changes.
func TestCountRemoved(t *testing.T) {
	uncounted := func(succeeded, failed []types.UID) *batchv1.UncountedTerminatedPods {
		return &batchv1.UncountedTerminatedPods{Succeeded: succeeded, Failed: failed}
	}
	cases := []struct {
		name        string
		status      batchv1.JobStatus
		removed     []types.UID
		wantChanged bool
		want        batchv1.JobStatus
	}{{
		name:    "no uncounted pods",
		status:  batchv1.JobStatus{Succeeded: 2, Failed: 1},
		removed: []types.UID{"a"},
		want:    batchv1.JobStatus{Succeeded: 2, Failed: 1},
	}, {
		name:   "nothing removed",
		status: batchv1.JobStatus{Failed: 1, UncountedTerminatedPods: uncounted(nil, []types.UID{"a"})},
		want:   batchv1.JobStatus{Failed: 1, UncountedTerminatedPods: uncounted(nil, []types.UID{"a"})},
	}, {
		name:    "removed pods not among the uncounted",
		status:  batchv1.JobStatus{UncountedTerminatedPods: uncounted([]types.UID{"s"}, []types.UID{"f"})},
		removed: []types.UID{"x", "y"},
		want:    batchv1.JobStatus{UncountedTerminatedPods: uncounted([]types.UID{"s"}, []types.UID{"f"})},
	}, {
		name: "a FailJob pod and the running pods stopped with it",
		status: batchv1.JobStatus{Failed: 1, Active: 0, Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailureTarget, Status: "True"}},
			UncountedTerminatedPods: uncounted(nil, []types.UID{"doomed", "r1", "r2"})},
		removed:     []types.UID{"doomed", "r1", "r2"},
		wantChanged: true,
		want: batchv1.JobStatus{Failed: 4, Active: 0, Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailureTarget, Status: "True"}},
			UncountedTerminatedPods: uncounted(nil, []types.UID{})},
	}, {
		name:        "some removals failed: those stay uncounted",
		status:      batchv1.JobStatus{Succeeded: 3, Failed: 2, UncountedTerminatedPods: uncounted([]types.UID{"s1", "s2"}, []types.UID{"f1", "f2"})},
		removed:     []types.UID{"s2", "f1"},
		wantChanged: true,
		want:        batchv1.JobStatus{Succeeded: 4, Failed: 3, UncountedTerminatedPods: uncounted([]types.UID{"s1"}, []types.UID{"f2"})},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.status.DeepCopy()
			changed := CountRemoved(got, sets.New(tc.removed...))
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if diff := cmp.Diff(tc.want, *got); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
}
