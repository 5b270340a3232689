package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/coroner-dev/coroner/shim/jobsync"
)

// TestEventHandlers checks which key each informer event puts on which queue, and
// with what delay: only Jobs managed by coroner are enqueued, Job events at once (or
// batched for status-only updates), pod events batched under their Job's key, and pods
// whose Job is gone on the orphan queue.
func TestEventHandlers(t *testing.T) {
	ours := newJob("ours")
	builtIn := newJob("builtin", "")
	other := newJob("other", "example.com/other")
	gone := newJob("gone") // never in the cache
	const oursKey = testNS + "/ours"

	rsOwned := newPod("rs-pod", nil, corev1.PodRunning)
	rsOwned.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(
		&appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "rs", UID: "rs-uid"}}, appsv1.SchemeGroupVersion.WithKind("ReplicaSet"))}
	orphan := newPod("orphan", nil, corev1.PodSucceeded)

	cases := []struct {
		name        string
		cache       []runtime.Object
		event       func(c *Controller)
		wantQueue   []queued
		wantOrphans []queued
	}{
		{
			name:      "managed Job added: synced at once",
			event:     func(c *Controller) { c.addJob(ours) },
			wantQueue: []queued{{Key: oursKey}},
		},
		{
			name:  "Job without managedBy added: ignored",
			event: func(c *Controller) { c.addJob(builtIn) },
		},
		{
			name:  "Job managed by another controller added: ignored",
			event: func(c *Controller) { c.addJob(other) },
		},
		{
			name: "managed Job status update: batched",
			event: func(c *Controller) {
				cur := ours.DeepCopy()
				cur.ResourceVersion = "11"
				cur.Status.Active = 1
				c.updateJob(ours, cur)
			},
			wantQueue: []queued{{Key: oursKey, After: batchPeriod}},
		},
		{
			name: "managed Job spec update: synced at once",
			event: func(c *Controller) {
				cur := ours.DeepCopy()
				cur.Generation++
				c.updateJob(ours, cur)
			},
			wantQueue: []queued{{Key: oursKey}},
		},
		{
			name: "other Job updated: ignored",
			event: func(c *Controller) {
				cur := other.DeepCopy()
				cur.Generation++
				c.updateJob(other, cur)
			},
		},
		{
			name:        "managed Job deleted (tombstone): synced, its pods with the finalizer are orphans",
			cache:       []runtime.Object{newPod("p1", ours, corev1.PodRunning), withoutFinalizer(newPod("p2", ours, corev1.PodSucceeded))},
			event:       func(c *Controller) { c.deleteJob(cache.DeletedFinalStateUnknown{Key: oursKey, Obj: ours}) },
			wantQueue:   []queued{{Key: oursKey}},
			wantOrphans: []queued{{Key: testNS + "/p1"}},
		},
		{
			name:  "other Job deleted: ignored, its pods too",
			cache: []runtime.Object{newPod("p1", other, corev1.PodRunning)},
			event: func(c *Controller) { c.deleteJob(other) },
		},
		{
			name:      "pod of a managed Job added: its Job, batched",
			cache:     []runtime.Object{ours},
			event:     func(c *Controller) { c.addPod(newPod("p1", ours, corev1.PodPending)) },
			wantQueue: []queued{{Key: oursKey, After: batchPeriod}},
		},
		{
			name:      "pod of a finished managed Job added: its Job, which removes leftover finalizers",
			cache:     []runtime.Object{finished(ours, batchv1.JobComplete)},
			event:     func(c *Controller) { c.addPod(newPod("p1", ours, corev1.PodSucceeded)) },
			wantQueue: []queued{{Key: oursKey, After: batchPeriod}},
		},
		{
			name:  "pod of a Job without managedBy added: ignored",
			cache: []runtime.Object{builtIn},
			event: func(c *Controller) { c.addPod(newPod("p1", builtIn, corev1.PodPending)) },
		},
		{
			name:  "pod of another controller's Job added: ignored",
			cache: []runtime.Object{other},
			event: func(c *Controller) { c.addPod(newPod("p1", other, corev1.PodSucceeded)) },
		},
		{
			name:  "pod controlled by a ReplicaSet: ignored even with the finalizer",
			event: func(c *Controller) { c.addPod(rsOwned) },
		},
		{
			name:        "pod without a controller, with the finalizer: orphan",
			event:       func(c *Controller) { c.addPod(orphan) },
			wantOrphans: []queued{{Key: testNS + "/orphan"}},
		},
		{
			name:  "pod without a controller nor finalizer: ignored",
			event: func(c *Controller) { c.addPod(withoutFinalizer(orphan)) },
		},
		{
			name:        "pod whose Job is not in the cache, with the finalizer: orphan",
			event:       func(c *Controller) { c.addPod(newPod("p1", gone, corev1.PodFailed)) },
			wantOrphans: []queued{{Key: testNS + "/p1"}},
		},
		{
			name: "pod whose Job was replaced by one of the same name: orphan",
			cache: []runtime.Object{func() *batchv1.Job {
				j := ours.DeepCopy()
				j.UID = "new-uid"
				return j
			}()},
			event:       func(c *Controller) { c.addPod(newPod("p1", ours, corev1.PodFailed)) },
			wantOrphans: []queued{{Key: testNS + "/p1"}},
		},
		{
			name:      "pod of a managed Job updated: its Job, batched",
			cache:     []runtime.Object{ours},
			event:     func(c *Controller) { p := newPod("p1", ours, corev1.PodRunning); c.updatePod(p, withoutFinalizer(p)) },
			wantQueue: []queued{{Key: oursKey, After: batchPeriod}},
		},
		{
			name:  "resync of a pod (same resourceVersion): ignored",
			cache: []runtime.Object{ours},
			event: func(c *Controller) { p := newPod("p1", ours, corev1.PodRunning); c.updatePod(p, p) },
		},
		{
			name:      "pod of a managed Job being deleted: its Job, batched",
			cache:     []runtime.Object{ours},
			event:     func(c *Controller) { p := newPod("p1", ours, corev1.PodRunning); c.updatePod(p, beingDeleted(p)) },
			wantQueue: []queued{{Key: oursKey, After: batchPeriod}},
		},
		{
			name:  "pod of a managed Job deleted (tombstone): its Job, batched",
			cache: []runtime.Object{ours},
			event: func(c *Controller) {
				c.deletePod(cache.DeletedFinalStateUnknown{Obj: newPod("p1", ours, corev1.PodRunning)})
			},
			wantQueue: []queued{{Key: oursKey, After: batchPeriod}},
		},
		{
			name:  "orphan pod deleted: nothing left to do",
			event: func(c *Controller) { c.deletePod(orphan) },
		},
		{
			name:  "tombstone of something else: ignored",
			event: func(c *Controller) { c.deletePod(cache.DeletedFinalStateUnknown{Obj: ours}) },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.inCache(t, tc.cache...)
			tc.event(f.c)
			if diff := cmp.Diff(tc.wantQueue, f.queue.Calls()); diff != "" {
				t.Errorf("Job queue (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantOrphans, f.orphans.Calls()); diff != "" {
				t.Errorf("orphan queue (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEventHandlersObserveExpectations checks that pod events lower the expectations of
// their Job: a new pod is an observed creation, a deletionTimestamp or a removal an
// observed deletion, and a pod without the finalizer an observed finalizer removal.
func TestEventHandlersObserveExpectations(t *testing.T) {
	ours := newJob("ours")
	key := testNS + "/ours"
	p1 := newPod("p1", ours, corev1.PodRunning)
	p2 := newPod("p2", ours, corev1.PodSucceeded)
	f := newFixture(t)
	f.inCache(t, ours)
	e := f.c.expectations

	e.expect(key, 1, []types.UID{p1.UID, p2.UID})
	e.expectFinalizersRemoved(key, []types.UID{p2.UID})

	f.c.addPod(newPod("new", ours, corev1.PodPending))
	if e.byKey[key].creations != 0 {
		t.Errorf("after the new pod's add: pending creations = %d, want 0", e.byKey[key].creations)
	}
	f.c.updatePod(p1, beingDeleted(p1))
	if e.byKey[key].deletions.Has(p1.UID) {
		t.Errorf("the deletionTimestamp of p1 was not observed as its deletion")
	}
	if e.satisfied(key) {
		t.Errorf("satisfied with the deletion of p2 pending")
	}
	f.c.updatePod(p2, withoutFinalizer(p2))
	if got := e.finalizersBeingRemoved(key); got.Has(p2.UID) {
		t.Errorf("the finalizer removal of p2 was not observed")
	}
	f.c.deletePod(cache.DeletedFinalStateUnknown{Obj: withoutFinalizer(p2)})
	if !e.satisfied(key) {
		t.Errorf("not satisfied after every creation and deletion was observed")
	}
}

// TestManagedJobsGauge checks the Jobs counted by coroner_managed_jobs.
func TestManagedJobsGauge(t *testing.T) {
	f := newFixture(t)
	ours, other := newJob("ours"), newJob("other", "")
	f.c.addJob(ours)
	f.c.addJob(other)
	f.c.addJob(newJob("second"))
	if got := gaugeValue(t, f, "coroner_managed_jobs"); got != 2 {
		t.Errorf("coroner_managed_jobs = %v, want 2", got)
	}
	f.c.updateJob(ours, finished(ours, batchv1.JobFailed))
	if got := gaugeValue(t, f, "coroner_managed_jobs"); got != 1 {
		t.Errorf("after a Job failed: coroner_managed_jobs = %v, want 1", got)
	}
	f.c.deleteJob(newJob("second"))
	if got := gaugeValue(t, f, "coroner_managed_jobs"); got != 0 {
		t.Errorf("after a Job was deleted: coroner_managed_jobs = %v, want 0", got)
	}
}

func gaugeValue(t *testing.T, f *fixture, name string) float64 {
	t.Helper()
	mfs, err := f.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// TestFailureDecisionSyncsAtOnce checks that a pod that just failed and matches a FailJob
// or FailIndex rule enqueues its Job at once, while other failures stay batched; and
// that for one batch period after such a decision the Job's other events enqueue it at
// once too, until a sync with satisfied expectations carries the decision out.
func TestFailureDecisionSyncsAtOnce(t *testing.T) {
	const key = testNS + "/ours"
	withPolicy := func(rules ...batchv1.PodFailurePolicyRule) *batchv1.Job {
		j := newJob("ours")
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: rules}
		return j
	}
	onExit := func(action batchv1.PodFailurePolicyAction, code int32) batchv1.PodFailurePolicyRule {
		return batchv1.PodFailurePolicyRule{Action: action, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
			Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{code}}}
	}
	policyRules := []batchv1.PodFailurePolicyRule{
		onExit(batchv1.PodFailurePolicyActionFailJob, 43),
		onExit(batchv1.PodFailurePolicyActionFailIndex, 42),
		onExit(batchv1.PodFailurePolicyActionIgnore, 3),
	}
	failed := func(p *corev1.Pod, code int32) *corev1.Pod {
		p = p.DeepCopy()
		p.Status.Phase = corev1.PodFailed
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}}
		p.ResourceVersion += "1"
		return p
	}
	cases := []struct {
		name string
		job  *batchv1.Job
		old  *corev1.Pod
		cur  func(old *corev1.Pod) *corev1.Pod
		want []queued
	}{
		{
			name: "FailJob match: at once",
			job:  withPolicy(policyRules...),
			cur:  func(p *corev1.Pod) *corev1.Pod { return failed(p, 43) },
			want: []queued{{Key: key}},
		},
		{
			name: "FailIndex match: at once",
			job:  withPolicy(policyRules...),
			cur:  func(p *corev1.Pod) *corev1.Pod { return failed(p, 42) },
			want: []queued{{Key: key}},
		},
		{
			name: "Ignore match: batched",
			job:  withPolicy(policyRules...),
			cur:  func(p *corev1.Pod) *corev1.Pod { return failed(p, 3) },
			want: []queued{{Key: key, After: batchPeriod}},
		},
		{
			name: "no rule matches: batched",
			job:  withPolicy(policyRules...),
			cur:  func(p *corev1.Pod) *corev1.Pod { return failed(p, 1) },
			want: []queued{{Key: key, After: batchPeriod}},
		},
		{
			name: "no podFailurePolicy: batched",
			job:  newJob("ours"),
			cur:  func(p *corev1.Pod) *corev1.Pod { return failed(p, 43) },
			want: []queued{{Key: key, After: batchPeriod}},
		},
		{
			name: "already Failed before (another update of a failed pod): batched",
			job:  withPolicy(policyRules...),
			old:  failed(newPod("p1", withPolicy(), corev1.PodRunning), 43),
			cur:  func(p *corev1.Pod) *corev1.Pod { p = p.DeepCopy(); p.ResourceVersion += "1"; return p },
			want: []queued{{Key: key, After: batchPeriod}},
		},
		{
			name: "failed pod without the tracking finalizer (already accounted for): batched",
			job:  withPolicy(policyRules...),
			cur:  func(p *corev1.Pod) *corev1.Pod { return withoutFinalizer(failed(p, 43)) },
			want: []queued{{Key: key, After: batchPeriod}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.inCache(t, tc.job)
			old := tc.old
			if old == nil {
				old = newPod("p1", tc.job, corev1.PodRunning)
			}
			f.c.updatePod(old, tc.cur(old))
			if diff := cmp.Diff(tc.want, f.queue.Calls()); diff != "" {
				t.Errorf("Job queue (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("the Job's next events are not batched for one batch period", func(t *testing.T) {
		job := withPolicy(policyRules...)
		f := newFixture(t)
		f.inCache(t, job)
		p1, p2 := newPod("p1", job, corev1.PodRunning), newPod("p2", job, corev1.PodRunning)
		f.c.updatePod(p1, failed(p1, 43))
		cur := job.DeepCopy()
		cur.ResourceVersion = "11"
		f.c.updateJob(job, cur)                 // the FailureTarget written: at once
		f.c.updatePod(p2, beingDeleted(p2))     // a deleted sibling: at once
		f.clock.Step(batchPeriod)               // the urgency has lapsed
		f.c.updatePod(p2, withoutFinalizer(p2)) // batched again
		want := []queued{{Key: key}, {Key: key}, {Key: key}, {Key: key, After: batchPeriod}}
		if diff := cmp.Diff(want, f.queue.Calls()); diff != "" {
			t.Errorf("Job queue (-want +got):\n%s", diff)
		}
	})

	t.Run("a sync with satisfied expectations ends the urgency", func(t *testing.T) {
		job := withPolicy(policyRules...)
		f := newFixture(t, job)
		f.inCache(t, job)
		p1 := newPod("p1", job, corev1.PodRunning)
		f.c.updatePod(p1, failed(p1, 43))
		if err := f.c.sync(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		cur := job.DeepCopy()
		cur.ResourceVersion = "12"
		f.c.updateJob(job, cur)
		want := []queued{{Key: key}, {Key: key, After: batchPeriod}}
		if diff := cmp.Diff(want, f.queue.Calls()); diff != "" {
			t.Errorf("Job queue (-want +got):\n%s", diff)
		}
	})
}

// TestStaleCacheSyncRunsOnCatchUp: a sync skipped because the informer did not show the
// status written by the previous sync is carried out as soon as the Job's update event
// shows it, not after the batch period; other status updates stay batched.
func TestStaleCacheSyncRunsOnCatchUp(t *testing.T) {
	job := newJob("j")
	key := testNS + "/j"
	f := newFixture(t, job)
	f.inCache(t, job)
	status := job.Status.DeepCopy()
	status.Active = 1
	f.c.syncJob = planFor(t, job, jobsync.Plan{WriteStatus: true, Status: *status})
	if err := f.c.sync(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	f.c.updateJob(job, job) // a resync: not the write yet, and no sync waits
	if err := f.c.sync(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	f.c.updateJob(job, job) // still not the write: the skipped sync waits on
	written := job.DeepCopy()
	written.ResourceVersion = "11"
	written.Status.Active = 1
	f.c.updateJob(job, written) // the write: the skipped sync at once
	again := written.DeepCopy()
	again.ResourceVersion = "12"
	f.c.updateJob(written, again) // batched
	want := []queued{{Key: key, After: batchPeriod}, {Key: key, After: batchPeriod}, {Key: key}, {Key: key, After: batchPeriod}}
	if diff := cmp.Diff(want, f.queue.Calls()); diff != "" {
		t.Errorf("Job queue (-want +got):\n%s", diff)
	}
}
