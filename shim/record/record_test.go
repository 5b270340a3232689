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

	"github.com/coroner-dev/coroner/api/v1alpha1"
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
		want v1alpha1.Entry
	}{
		{"a counted failure, no rule", failedPod("j-2-a", "2", 1), Decision{Outcome: v1alpha1.OutcomeFailed},
			v1alpha1.Entry{Name: "j-2-a", Index: ptr.To[int32](2), Node: "node-a", Phase: corev1.PodFailed, Outcome: v1alpha1.OutcomeFailed,
				Cause:    &conditions.Cause{Class: conditions.CauseNonZeroExit, Exit: &conditions.CauseExit{Container: "main", Code: 1, Reason: "Error"}},
				Finished: &t0, Recorded: t0}},
		{"an ignored disruption, rule 1", failedPod("j-0-b", "0", 137, preempted), Decision{Outcome: v1alpha1.OutcomeIgnored, Rule: 1, Action: batchv1.PodFailurePolicyActionIgnore},
			v1alpha1.Entry{Name: "j-0-b", Index: ptr.To[int32](0), Node: "node-a", Phase: corev1.PodFailed, Outcome: v1alpha1.OutcomeIgnored,
				Cause: &conditions.Cause{Class: conditions.CauseDisruption, Condition: corev1.DisruptionTarget, Reason: "PreemptionByScheduler",
					Exit: &conditions.CauseExit{Container: "main", Code: 137, Reason: "Error"}},
				Rule: ptr.To[int32](1), Action: batchv1.PodFailurePolicyActionIgnore, Finished: &t0, Recorded: t0}},
		{"deleted while running, no index annotation", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-x", DeletionTimestamp: &t0}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
			Decision{Outcome: v1alpha1.OutcomeDeleted, Why: "job suspended"},
			v1alpha1.Entry{Name: "j-x", Phase: corev1.PodRunning, Outcome: v1alpha1.OutcomeDeleted, Cause: &conditions.Cause{Class: conditions.CauseDeleted}, Why: "job suspended", Recorded: t0}},
		{"a success has no cause", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "j-1-s", Annotations: map[string]string{batchv1.JobCompletionIndexAnnotation: "1"}}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
			Decision{Outcome: v1alpha1.OutcomeSucceeded},
			v1alpha1.Entry{Name: "j-1-s", Index: ptr.To[int32](1), Phase: corev1.PodSucceeded, Outcome: v1alpha1.OutcomeSucceeded, Recorded: t0}},
		{"a bad index annotation is no index", failedPod("j-b", "-1", 2), Decision{Outcome: v1alpha1.OutcomeFailed},
			v1alpha1.Entry{Name: "j-b", Node: "node-a", Phase: corev1.PodFailed, Outcome: v1alpha1.OutcomeFailed,
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

// TestEntrySize: the bytes an entry takes in the record's JSON, the figure its bound is
// chosen by (a v1alpha1.JobRecord object is at most etcd's 1.5 MiB).
func TestEntrySize(t *testing.T) {
	var r v1alpha1.Record
	for i := range 1000 {
		p := failedPod(fmt.Sprintf("train-%d-x7k2p", i), fmt.Sprint(i), 1)
		r.Add(0, Of(p, Decision{Outcome: v1alpha1.OutcomeFailed}, t0))
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
	var back v1alpha1.Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(r, back); diff != "" {
		t.Errorf("JSON round trip (-want +got):\n%s", diff)
	}
}
