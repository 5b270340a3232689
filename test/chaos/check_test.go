package main

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/wrappers"
)

func finishedJob(completions int32, failed int32, cond batchv1.JobConditionType) *batchv1.Job {
	j := wrappers.MakeJob("j", "ns").Indexed().Completions(completions).Obj()
	j.Status.Succeeded = completions
	j.Status.Failed = failed
	j.Status.CompletedIndexes = indexRange(completions)
	j.Status.Conditions = []batchv1.JobCondition{{Type: cond, Status: corev1.ConditionTrue}}
	return j
}

func indexPod(name string, ix int, phase corev1.PodPhase, failureCount string) *corev1.Pod {
	w := wrappers.MakePod(name, "ns").Index(ix).Phase(phase)
	if failureCount != "" {
		w.Annotation(batchv1.JobIndexFailureCountAnnotation, failureCount)
	}
	return w.Obj()
}

func TestCheckStormJob(t *testing.T) {
	s := stormJob{Name: "j", Completions: 2, Fail: []int{0}}
	// Index 0 failed once (pod a) then succeeded (b); index 1 succeeded at once.
	truth := jobTruth{
		0: {{Pod: "a", Start: 1, End: 3, Exited: true, Code: 1}, {Pod: "b", Start: 4, End: 6, Exited: true}},
		1: {{Pod: "c", Start: 1, End: 5, Exited: true}},
	}
	pods := func(carried string) []*corev1.Pod {
		return []*corev1.Pod{
			indexPod("a", 0, corev1.PodFailed, ""),
			indexPod("b", 0, corev1.PodSucceeded, carried),
			indexPod("c", 1, corev1.PodSucceeded, ""),
		}
	}
	for _, tc := range []struct {
		name                 string
		job                  *batchv1.Job
		truth                jobTruth
		pods                 []*corev1.Pod
		wantLost, wantDouble int
		wantProblem          string
	}{
		{name: "as without faults", job: finishedJob(2, 1, batchv1.JobComplete), truth: truth, pods: pods("1")},
		{name: "failure counted twice", job: finishedJob(2, 2, batchv1.JobComplete), truth: truth, pods: pods("1"),
			wantDouble: 1, wantProblem: "counted twice"},
		{name: "failure lost", job: finishedJob(2, 0, batchv1.JobComplete), truth: truth, pods: pods("0"),
			wantLost: 2, wantProblem: "lost"},
		{name: "failure carried twice", job: finishedJob(2, 1, batchv1.JobComplete), truth: truth, pods: pods("2"),
			wantDouble: 1, wantProblem: "carries more failures"},
		{name: "Job failed", job: func() *batchv1.Job {
			j := finishedJob(2, 1, batchv1.JobFailed)
			j.Status.FailedIndexes = ptr.To("1")
			return j
		}(), truth: truth, pods: pods("1"), wantProblem: "ended Failed"},
		{name: "a pod that never started its command counts once", job: finishedJob(2, 2, batchv1.JobComplete), truth: truth,
			pods: append(pods("1"), indexPod("e", 1, corev1.PodFailed, ""))},
		{name: "a pod that never started its command counted twice", job: finishedJob(2, 3, batchv1.JobComplete), truth: truth,
			pods: append(pods("1"), indexPod("e", 1, corev1.PodFailed, "")), wantDouble: 1, wantProblem: "counted twice"},
		{name: "a pod that never ran its command not counted (a rule may ignore it: fenced, disrupted)", job: finishedJob(2, 1, batchv1.JobComplete), truth: truth,
			pods: append(pods("1"), indexPod("e", 1, corev1.PodFailed, ""))},
		{name: "index ran twice at once", job: finishedJob(2, 1, batchv1.JobComplete), truth: jobTruth{
			0: truth[0],
			1: {{Pod: "c", Start: 1, End: 5, Exited: true}, {Pod: "d", Start: 4.5, End: 5.5}},
		}, pods: pods("1"), wantProblem: "ran twice at once for 0.50s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := checkStormJob(s, tc.job, tc.truth, tc.pods)
			if c.Lost != tc.wantLost || c.Double != tc.wantDouble {
				t.Errorf("lost %d double %d, want %d %d (%v)", c.Lost, c.Double, tc.wantLost, tc.wantDouble, c.Problems)
			}
			all := strings.Join(c.Problems, "\n")
			if tc.wantProblem == "" && len(c.Problems) > 0 {
				t.Errorf("problems %v, want none", c.Problems)
			}
			if tc.wantProblem != "" && !strings.Contains(all, tc.wantProblem) {
				t.Errorf("problems %v, want one saying %q", c.Problems, tc.wantProblem)
			}
		})
	}
}

func TestIndexRange(t *testing.T) {
	for n, want := range map[int32]string{1: "0", 2: "0,1", 3: "0-2", 200: "0-199"} {
		if got := indexRange(n); got != want {
			t.Errorf("indexRange(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRejudge is the containerd-restart scenario's count after the runtime rewrote an exit 0
// as 255: a CI run's Job failed that way with two pods created but not yet started, which
// it deleted and counted as failures as the built-in controller does.
func TestRejudge(t *testing.T) {
	s := stormJob{Name: "j", Completions: 2}
	// Index 0 exited 0, the runtime said 255: the index failed (backoffLimitPerIndex 0 here)
	// and the Job with it; index 1's pod was pending and deleted at the Job's end.
	truth := jobTruth{0: {{Pod: "a", Start: 1, End: 3, Exited: true, Code: 0}}}
	pods := []*corev1.Pod{indexPod("a", 0, corev1.PodFailed, ""), indexPod("b", 1, corev1.PodPending, "")}
	failed := func(n int32) *batchv1.Job {
		j := finishedJob(2, n, batchv1.JobFailed)
		j.Status.Succeeded = 0
		return j
	}
	for _, tc := range []struct {
		name                 string
		job                  *batchv1.Job
		wantLost, wantDouble int
	}{
		{name: "the rewritten exit and the deleted pod, once each", job: failed(2)},
		{name: "one counted twice", job: failed(3), wantDouble: 1},
		{name: "the deleted pod not counted (a rule may ignore it)", job: failed(1)},
		{name: "the rewritten exit not counted", job: failed(0), wantLost: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := rejudge(jobCheck{}, s, tc.job, truth, pods, map[int]int{0: 1})
			if c.Lost != tc.wantLost || c.Double != tc.wantDouble {
				t.Errorf("lost %d double %d, want %d %d (%v)", c.Lost, c.Double, tc.wantLost, tc.wantDouble, c.Problems)
			}
		})
	}
}
