package jobsync

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestLeavesCache(t *testing.T) {
	plain := job(wrappers.MakeJob("j", "ns").Indexed().Completions(4))
	grows := job(wrappers.MakeJob("j", "ns").Indexed().Completions(4))
	grows.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=2,max=1Gi"}
	failJob := job(wrappers.MakeJob("j", "ns").Indexed().Completions(4).PodFailurePolicy(failJobOn42()))
	stopping := deleting(tracked(running("stopping")))
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		pod  *corev1.Pod
		want bool
	}{
		{"succeeded", plain, tracked(succeeded("a")), true},
		{"failed", plain, tracked(failed("a", 1)), true},
		{"running, being deleted", plain, stopping, false},
		{"pending", plain, tracked(wrappers.MakePod("a", "ns").Phase(corev1.PodPending)), false},
		{"failed, memory retry", grows, tracked(failed("a", 137)), false},
		{"succeeded, memory retry", grows, tracked(succeeded("a")), true},
		{"failed, a FailJob rule matches", failJob, tracked(failed("a", 42)), false},
		{"failed, being deleted", plain, deleting(tracked(failed("a", 1))), false},
		{"succeeded, being deleted", plain, deleting(tracked(succeeded("a"))), false},
		{"failed by node-failure recovery", plain, tracked(failed("a", 137).Condition(conditions.ForcefullyTerminated, corev1.ConditionTrue)), false},
		{"failed, a FailJob rule does not match", failJob, tracked(failed("a", 1)), true},
	} {
		if got := LeavesCache(tc.job, tc.pod); got != tc.want {
			t.Errorf("%s: LeavesCache = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// failJobOn42 is a podFailurePolicy rule: FailJob on exit code 42.
func failJobOn42() *wrappers.RuleWrapper {
	return wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailJob, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)
}

func deleting(p *corev1.Pod) *corev1.Pod {
	p.DeletionTimestamp = &metav1.Time{Time: now}
	return p
}

// TestCountedPodsAreNotRead plays Jobs through syncs twice, as the controller and the
// kubelet would: once with every pod in Input.Pods, once without the pods whose finalizer
// a plan removed and that LeavesCache lets go (what the shim's cache no longer holds). Each
// sync must plan the same in both runs: no decision reads a counted pod that left.
func TestCountedPodsAreNotRead(t *testing.T) {
	ignoreExit3 := wrappers.OnExitCodes(batchv1.PodFailurePolicyActionIgnore, batchv1.PodFailurePolicyOnExitCodesOpIn, 3)
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		// exit is the exit code of attempt n of index ix (-1 for a NonIndexed Job's
		// pod), at its ran-th look since it started; -1: it runs on.
		exit func(ix, n, ran int) int32
	}{
		{"indexed, global backoff", job(wrappers.MakeJob("j", "ns").Indexed().Completions(12).Parallelism(4).
			PodFailurePolicy(ignoreExit3)), func(ix, n, _ int) int32 {
			switch {
			case n == 0 && ix%3 == 0:
				return 1
			case n == 0 && ix%4 == 1:
				return 3
			}
			return 0
		}},
		{"indexed, backoffLimitPerIndex 1, maxFailedIndexes 3", job(wrappers.MakeJob("j", "ns").Indexed().Completions(12).Parallelism(5).
			BackoffLimitPerIndex(1).MaxFailedIndexes(3).PodFailurePolicy(ignoreExit3)), func(ix, n, _ int) int32 {
			switch {
			case ix%5 == 2 && n < 2:
				return 1 // fails its index
			case ix%3 == 0 && n == 0:
				return 1
			case ix%4 == 1 && n == 0:
				return 3
			}
			return 0
		}},
		{"non-indexed, backoffLimit 3, ends failed", job(wrappers.MakeJob("j", "ns").Completions(10).Parallelism(3).BackoffLimit(3)), func(_, n, _ int) int32 {
			if n%3 == 1 {
				return 1
			}
			return 0
		}},
		{"non-indexed, backoffLimit 1 exceeded while a pod runs", job(wrappers.MakeJob("j", "ns").Completions(6).Parallelism(3).BackoffLimit(1)), func(_, n, _ int) int32 {
			if n%3 == 0 {
				return -1
			}
			return 1
		}},
		{"non-indexed, OOM kills with coroner.dev/oom-memory-retry", func() *batchv1.Job {
			j := withMemory(job(wrappers.MakeJob("j", "ns").Completions(3).Parallelism(3).BackoffLimit(1)), "24Mi", "")
			j.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "factor=2,max=1Gi"}
			return j
		}(), func(_, n, _ int) int32 {
			if n < 2 {
				return 137
			}
			return 0
		}},
		{"indexed, a FailJob exit", job(wrappers.MakeJob("j", "ns").Indexed().Completions(8).Parallelism(4).PodFailurePolicy(failJobOn42())), func(ix, n, _ int) int32 {
			if ix == 6 {
				return 42
			}
			if ix%2 == 1 && n == 0 {
				return 1
			}
			return 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			all := playJob(t, tc.job, tc.exit, false)
			dropped := playJob(t, tc.job, tc.exit, true)
			if diff := cmp.Diff(all, dropped); diff != "" {
				t.Errorf("plans with every pod (-) and without the counted ones (+):\n%s", diff)
			}
			last := all[len(all)-1]
			if len(last.Status.Conditions) == 0 {
				t.Errorf("the Job did not finish in %d syncs: %+v", len(all), last)
			}
		})
	}
}

// syncSummary is what one sync decided, in comparable form.
type syncSummary struct {
	Status    batchv1.JobStatus
	Creates   []string
	Deletes   []string
	Finalizer []string
	Leaving   []string
	Requeue   time.Duration
	Retries   backoff.Record
}

// playJob syncs j until it finishes (at most 80 syncs, 20 s apart), carrying out each plan
// at once; a pod that ran through a sync finishes before the next as exit says (by index,
// attempt and syncs seen). Every third sync finds the expectations unsatisfied (the
// informer behind), so that a failure is counted a sync before its replacement is made.
// With dropCounted, a pod whose finalizer a plan removed and that LeavesCache lets go is
// not passed to later syncs.
func playJob(t *testing.T, j *batchv1.Job, exit func(ix, n, ran int) int32, dropCounted bool) []syncSummary {
	t.Helper()
	j = j.DeepCopy()
	j.Status.StartTime = &metav1.Time{Time: now}
	var (
		pods     []*corev1.Pod
		gone     = sets.New[types.UID]()
		attempts = map[int]int{}
		record   backoff.Record
		out      []syncSummary
		made     int
	)
	for round := range 80 {
		at := now.Add(time.Duration(round) * 20 * time.Second)
		var in []*corev1.Pod
		for _, p := range pods {
			if !gone.Has(p.UID) {
				in = append(in, p)
			}
		}
		plan := Sync(Input{Job: j, Pods: in, Now: at, Backoff: backoff.Default, Retries: record,
			ExpectationsSatisfied: round%3 != 2, FinalizersBeingRemoved: sets.New[types.UID]()})
		if plan.Skip != "" {
			t.Fatalf("sync %d skipped: %s", round, plan.Skip)
		}
		s := syncSummary{Status: plan.Status, Requeue: plan.RequeueAfter, Retries: plan.Retries}
		j = j.DeepCopy()
		j.Status = *plan.Status.DeepCopy()
		record = plan.Retries
		for _, d := range plan.Delete {
			s.Deletes = append(s.Deletes, d.Pod.Name)
			for i, q := range pods {
				if q.UID == d.Pod.UID {
					q = q.DeepCopy()
					q.DeletionTimestamp = &metav1.Time{Time: at}
					if d.RemoveFinalizerFirst {
						q.Finalizers = nil
					}
					pods[i] = q
				}
			}
		}
		for _, p := range plan.RemoveFinalizer {
			s.Finalizer = append(s.Finalizer, p.Name)
			for i, q := range pods {
				if q.UID == p.UID {
					q = q.DeepCopy()
					q.Finalizers = nil
					pods[i] = q
				}
			}
			if dropCounted && LeavesCache(j, p) {
				gone.Insert(p.UID)
			}
		}
		for _, e := range plan.Leaving {
			s.Leaving = append(s.Leaving, e.Name+" "+string(e.Outcome)+" "+e.Consequence+" "+e.Why)
		}
		// The pods that ran finish, 1 s before the next sync (a pod deleted two syncs ago
		// killed, exit 143; one deleted since still terminating), a pod being deleted
		// without finalizers is gone once it finished; the new pods start.
		for i, p := range pods {
			if gone.Has(p.UID) {
				continue
			}
			if p.Status.Phase == corev1.PodRunning {
				if p.DeletionTimestamp != nil && at.Sub(p.DeletionTimestamp.Time) < 40*time.Second {
					continue // its grace period: terminating through two more syncs
				}
				ix := completionIndex(p)
				n, _ := strconv.Atoi(p.Labels["attempt"])
				started, _ := strconv.Atoi(p.Labels["started"])
				code := exit(ix, n, round-started)
				if p.DeletionTimestamp != nil {
					code = 143
				}
				if code < 0 {
					continue
				}
				w := wrappers.MakePod(p.Name, "ns").ExitedContainer("main", code).FinishedAt(at.Add(19 * time.Second))
				if code == 0 {
					w = w.Phase(corev1.PodSucceeded)
				} else {
					w = w.Phase(corev1.PodFailed)
				}
				q := p.DeepCopy()
				q.Status = w.Obj().Status
				if code == 137 {
					q.Status.ContainerStatuses[0].State.Terminated.Reason = "OOMKilled"
					q.Status.Conditions = append(q.Status.Conditions, ownLimit)
				}
				pods[i] = q
				continue
			}
			if p.DeletionTimestamp != nil && len(p.Finalizers) == 0 {
				gone.Insert(p.UID)
			}
		}
		for _, c := range plan.Create {
			p := c.Pod.DeepCopy()
			p.Name = fmt.Sprintf("%sp%d", p.GenerateName, made)
			p.UID = types.UID(p.Name)
			p.CreationTimestamp = metav1.Time{Time: at}
			made++
			ix := completionIndex(p)
			p.Labels["attempt"] = strconv.Itoa(attempts[ix])
			p.Labels["started"] = strconv.Itoa(round)
			attempts[ix]++
			p.Status = wrappers.MakePod(p.Name, "ns").Phase(corev1.PodRunning).RunningContainer("main").Obj().Status
			pods = append(pods, p)
			s.Creates = append(s.Creates, p.Name+" "+fmt.Sprint(p.Annotations)+" "+fmt.Sprint(p.Spec.Containers[0].Resources.Limits))
		}
		out = append(out, s)
		if finishedCondition(j) != nil {
			break
		}
	}
	return out
}
