package record

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

var t0 = metav1.NewTime(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))

func failedPod(name, index string, code int32, conds ...corev1.PodCondition) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{batchv1.JobCompletionIndexAnnotation: index}},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, Conditions: conds, ContainerStatuses: []corev1.ContainerStatus{{Name: "main",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Error", FinishedAt: t0}}}}},
	}
}

func TestOf(t *testing.T) {
	preempted := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler"}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		d    Decision
		want Entry
	}{
		{"a counted failure, no rule", failedPod("j-2-a", "2", 1), Decision{Outcome: OutcomeFailed},
			Entry{Name: "j-2-a", Index: ptr.To[int32](2), Node: "node-a", Phase: corev1.PodFailed, Outcome: OutcomeFailed,
				Cause:    &conditions.Cause{Class: conditions.CauseNonZeroExit, Exit: &conditions.CauseExit{Container: "main", Code: 1, Reason: "Error"}},
				Finished: &t0, Recorded: t0}},
		{"an ignored disruption, rule 1", failedPod("j-0-b", "0", 137, preempted), Decision{Outcome: OutcomeIgnored, Rule: 1, Action: batchv1.PodFailurePolicyActionIgnore},
			Entry{Name: "j-0-b", Index: ptr.To[int32](0), Node: "node-a", Phase: corev1.PodFailed, Outcome: OutcomeIgnored,
				Cause: &conditions.Cause{Class: conditions.CauseDisruption, Condition: corev1.DisruptionTarget, Reason: "PreemptionByScheduler",
					Exit: &conditions.CauseExit{Container: "main", Code: 137, Reason: "Error"}},
				Rule: ptr.To[int32](1), Action: batchv1.PodFailurePolicyActionIgnore, Finished: &t0, Recorded: t0}},
		{"deleted while running, no index annotation", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-x", DeletionTimestamp: &t0}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			Decision{Outcome: OutcomeDeleted, Why: "job suspended"},
			Entry{Name: "j-x", Phase: corev1.PodRunning, Outcome: OutcomeDeleted, Cause: &conditions.Cause{Class: conditions.CauseDeleted}, Why: "job suspended", Recorded: t0}},
		{"a success has no cause", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-1-s", Annotations: map[string]string{batchv1.JobCompletionIndexAnnotation: "1"}}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
			Decision{Outcome: OutcomeSucceeded},
			Entry{Name: "j-1-s", Index: ptr.To[int32](1), Phase: corev1.PodSucceeded, Outcome: OutcomeSucceeded, Recorded: t0}},
		{"a bad index annotation is no index", failedPod("j-b", "-1", 2), Decision{Outcome: OutcomeFailed},
			Entry{Name: "j-b", Node: "node-a", Phase: corev1.PodFailed, Outcome: OutcomeFailed,
				Cause: &conditions.Cause{Class: conditions.CauseNonZeroExit, Exit: &conditions.CauseExit{Container: "main", Code: 2, Reason: "Error"}}, Finished: &t0, Recorded: t0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.pod.DeepCopy()
			got := Of(tc.pod, tc.d, t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Of (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.pod); diff != "" {
				t.Errorf("the pod was modified:\n%s", diff)
			}
		})
	}
}

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

// TestEntrySize: the bytes an entry takes in the record's JSON, the figure its bound is
// chosen by (a JobRecord object is at most etcd's 1.5 MiB).
func TestEntrySize(t *testing.T) {
	var r Record
	for i := range 1000 {
		p := failedPod(fmt.Sprintf("train-%d-x7k2p", i), fmt.Sprint(i), 1)
		r.Add(0, Of(p, Decision{Outcome: OutcomeFailed}, t0))
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	per := len(b) / 1000
	t.Logf("1,000 failed pods: %d bytes of JSON, %d per pod", len(b), per)
	if per > 400 {
		t.Errorf("%d bytes per pod: the record would not hold 1,000s of pods", per)
	}
	var back Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r, back); diff != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", diff)
	}
}
