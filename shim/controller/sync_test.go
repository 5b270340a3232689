package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/shim/observe"
)

// apiCall is one write the controller sent to the API server.
type apiCall struct {
	Verb, Resource, Subresource, Name string
}

func (a apiCall) String() string {
	s := a.Verb + " " + a.Resource
	if a.Subresource != "" {
		s += "/" + a.Subresource
	}
	if a.Name != "" {
		s += " " + a.Name
	}
	return s
}

// recordWrites makes the fake clientset log every write, in the order the API server
// received them (reads are left out).
func recordWrites(f *fixture) func() []string {
	var mu sync.Mutex
	var calls []string
	f.client.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch" {
			return false, nil, nil
		}
		c := apiCall{Verb: a.GetVerb(), Resource: a.GetResource().Resource, Subresource: a.GetSubresource()}
		switch a := a.(type) {
		case clienttesting.PatchAction:
			c.Name = a.GetName()
		case clienttesting.DeleteAction:
			c.Name = a.GetName()
		case clienttesting.CreateAction:
			// Every UpdateAction too: the two interfaces have the same methods (an Action
			// with GetObject), so one case names the object of both.
			c.Name = a.GetObject().(metav1.Object).GetName()
		}
		mu.Lock()
		calls = append(calls, c.String())
		mu.Unlock()
		return false, nil, nil
	})
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(calls)
	}
}

// planFor returns a canned jobsync function that checks it is asked about job and
// returns plan.
func planFor(t *testing.T, job *batchv1.Job, plan jobsync.Plan) func(jobsync.Input) jobsync.Plan {
	return func(in jobsync.Input) jobsync.Plan {
		if in.Job.UID != job.UID {
			t.Errorf("Sync asked about Job %s, want %s", in.Job.UID, job.UID)
		}
		return plan
	}
}

// newPlanPod is a pod for Plan.Create, named (the fake clientset does not generate names).
func newPlanPod(job *batchv1.Job, name string) *corev1.Pod {
	p := newPod(name, job, "")
	p.UID = ""
	p.ResourceVersion = ""
	return p
}

// fullPlan deletes "excess" (finalizer first), creates "new", writes the status and then
// removes the finalizer of "done", with an Event and a backoff record.
func fullPlan(job *batchv1.Job, excess, done *corev1.Pod) jobsync.Plan {
	status := *job.Status.DeepCopy()
	status.Active = 1
	status.Ready = ptr.To[int32](0)
	status.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{Succeeded: []types.UID{done.UID}}
	return jobsync.Plan{
		Status:          status,
		WriteStatus:     true,
		Delete:          []jobsync.PodDelete{{Pod: excess, RemoveFinalizerFirst: true, Reason: "excess pod"}},
		Create:          []jobsync.PodCreate{{Pod: newPlanPod(job, "new"), Reason: observe.CreateNew}},
		RemoveFinalizer: []*corev1.Pod{done},
		Retries:         backoff.Record{Failures: 2, LastFailure: time.Date(2026, 3, 1, 11, 59, 0, 0, time.UTC)},
		RequeueAfter:    7 * time.Second,
		Events:          []jobsync.Event{{Type: corev1.EventTypeNormal, Reason: "Decided", Message: "because"}},
		Observations:    observe.Observations{PodsFinished: map[string]int{"succeeded": 1}},
	}
}

// TestSyncOrder checks that the controller carries out a Plan in jobsync's order:
// deletions (finalizer first), creations, the plan's status write, and only then the
// finalizer removals, followed by the write that counts the pods whose finalizer went;
// Events, the backoff record and the re-queue come last.
func TestSyncOrder(t *testing.T) {
	job := newJob("j")
	excess := newPod("excess", job, corev1.PodRunning)
	// A crash-looping pod: its Deleted pod Event records the last exit.
	excess.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "main", RestartCount: 3,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 1, Reason: "Error", FinishedAt: metav1.Date(2026, 3, 1, 11, 58, 0, 0, time.UTC)}},
	}}
	done := newPod("done", job, corev1.PodSucceeded)
	f := newFixture(t, job, excess, done)
	f.inCache(t, job, excess, done)
	writes := recordWrites(f)
	f.c.syncJob = planFor(t, job, fullPlan(job, excess, done))

	if err := f.c.sync(context.Background(), testNS+"/j"); err != nil {
		t.Fatalf("sync: %v", err)
	}
	want := []string{
		"patch pods excess",
		"delete pods excess",
		"create pods new",
		"update jobs/status j",
		"patch pods done",
		"update jobs/status j",
	}
	if diff := cmp.Diff(want, writes()); diff != "" {
		t.Errorf("API writes (-want +got):\n%s", diff)
	}
	var statuses []batchv1.JobStatus
	for _, a := range f.client.Actions() {
		if u, ok := a.(clienttesting.UpdateAction); ok && a.GetSubresource() == "status" {
			statuses = append(statuses, u.GetObject().(*batchv1.Job).Status)
		}
	}
	if len(statuses) != 2 || statuses[0].UncountedTerminatedPods == nil ||
		!slices.Equal(statuses[0].UncountedTerminatedPods.Succeeded, []types.UID{done.UID}) || statuses[0].Succeeded != 0 {
		t.Errorf("status writes = %+v, want first the plan's (the done pod uncounted)", statuses)
	}
	wantEvents := []string{
		"Normal SuccessfulDelete Deleted pod: excess (excess pod); phase Running; container main waiting (CrashLoopBackOff), last exited 1 (Error) at 2026-03-01T11:58:00Z, 3 restarts",
		"Normal SuccessfulCreate Created pod: new",
		"Normal Decided because",
	}
	if diff := cmp.Diff(wantEvents, f.events()); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
	got, err := f.client.CoreV1().Pods(testNS).Get(context.Background(), "done", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Finalizers) != 0 {
		t.Errorf("finalizers of the counted pod = %v, want none", got.Finalizers)
	}
	written, err := f.client.BatchV1().Jobs(testNS).Get(context.Background(), "j", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if written.Status.Active != 1 || written.Status.Succeeded != 1 || written.Status.UncountedTerminatedPods == nil ||
		len(written.Status.UncountedTerminatedPods.Succeeded) != 0 {
		t.Errorf("written status = %+v, want the plan's with the done pod counted", written.Status)
	}
	if got, _ := f.c.state.retries(job); got.Failures != 2 {
		t.Errorf("backoff record = %+v, want the plan's", got)
	}
	if diff := cmp.Diff([]queued{{Key: testNS + "/j", After: 7 * time.Second}}, f.queue.Calls()); diff != "" {
		t.Errorf("queue (-want +got):\n%s", diff)
	}
	if !f.c.expectations.finalizersBeingRemoved(testNS + "/j").Has(done.UID) {
		t.Errorf("the finalizer removal of %q is not expected", done.Name)
	}
	if f.c.expectations.satisfied(testNS + "/j") {
		t.Errorf("expectations satisfied although the creation and deletion were not observed yet")
	}
	// The informer has not shown the written status yet: the next sync waits for it.
	f.c.syncJob = func(jobsync.Input) jobsync.Plan { t.Errorf("synced from a stale cache"); return jobsync.Plan{} }
	if err := f.c.sync(context.Background(), testNS+"/j"); err != nil {
		t.Fatalf("second sync: %v", err)
	}
}

// TestCountOnlyRemovedFinalizers: the write after the finalizer removals counts the pods
// whose removal succeeded (or found the pod gone), and leaves the one whose removal failed
// in uncountedTerminatedPods for a later sync; with none removed there is no second write.
func TestCountOnlyRemovedFinalizers(t *testing.T) {
	for _, allFail := range []bool{false, true} {
		t.Run(fmt.Sprintf("all removals fail %v", allFail), func(t *testing.T) {
			job := newJob("j")
			ok := newPod("ok", job, corev1.PodFailed)
			bad := newPod("bad", job, corev1.PodFailed)
			gone := newPod("gone", job, corev1.PodSucceeded)
			f := newFixture(t, job, ok, bad) // "gone" is not in the API server: its patch finds nothing
			f.inCache(t, job, ok, bad, gone)
			f.client.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if name := a.(clienttesting.PatchAction).GetName(); name == "bad" || allFail {
					return true, nil, apierrors.NewInternalError(errors.New("etcd is away"))
				}
				return false, nil, nil
			})
			writes := recordWrites(f)
			status := *job.Status.DeepCopy()
			status.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{
				Succeeded: []types.UID{gone.UID}, Failed: []types.UID{ok.UID, bad.UID}}
			f.c.syncJob = planFor(t, job, jobsync.Plan{WriteStatus: true, Status: status, RemoveFinalizer: []*corev1.Pod{ok, bad, gone}})
			err := f.c.sync(context.Background(), testNS+"/j")
			if err == nil || !strings.Contains(err.Error(), "etcd is away") {
				t.Errorf("sync returned %v, want the failed removal's error", err)
			}
			written, gerr := f.client.BatchV1().Jobs(testNS).Get(context.Background(), "j", metav1.GetOptions{})
			if gerr != nil {
				t.Fatal(gerr)
			}
			want := batchv1.JobStatus{Succeeded: 1, Failed: 1, UncountedTerminatedPods: &batchv1.UncountedTerminatedPods{Succeeded: []types.UID{}, Failed: []types.UID{bad.UID}}}
			wantWrites := 2
			if allFail {
				want = status
				wantWrites = 1
			}
			if diff := cmp.Diff(want, written.Status); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
			var updates int
			for _, w := range writes() {
				if w == "update jobs/status j" {
					updates++
				}
			}
			if updates != wantWrites {
				t.Errorf("%d status writes, want %d: %q", updates, wantWrites, writes())
			}
		})
	}
}

// TestSyncRecordFailsBesideTheStatusWrite: the JobRecord write runs beside the creations
// and the status write; when it fails in a way a retry may mend, those go ahead but no
// finalizer is removed, and the sync returns the error (the next sync records the pods
// again: jobsync's TestUncountedRecordedAgain). With deletions planned, nothing is done.
func TestSyncRecordFailsBesideTheStatusWrite(t *testing.T) {
	for _, withDelete := range []bool{false, true} {
		t.Run(fmt.Sprintf("deletions %v", withDelete), func(t *testing.T) {
			job := newJob("j")
			excess := newPod("excess", job, corev1.PodRunning)
			done := newPod("done", job, corev1.PodFailed)
			f := newFixture(t, job, excess, done)
			f.inCache(t, job, excess, done)
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{v1alpha1.GroupVersionResource: v1alpha1.Kind + "List"})
			dyn.PrependReactor("create", "jobrecords", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewInternalError(errors.New("etcd is away"))
			})
			f.c.jobRecords = newRecords(RecordsConfig{Client: dyn}, nil)
			writes := recordWrites(f)
			plan := fullPlan(job, excess, done)
			plan.Status.UncountedTerminatedPods = &batchv1.UncountedTerminatedPods{Failed: []types.UID{done.UID}}
			plan.Leaving = []v1alpha1.Entry{{Name: "done", Phase: corev1.PodFailed, Outcome: v1alpha1.OutcomeFailed}}
			if !withDelete {
				plan.Delete = nil
			}
			f.c.syncJob = planFor(t, job, plan)
			err := f.c.sync(context.Background(), testNS+"/j")
			if err == nil || !strings.Contains(err.Error(), "etcd is away") {
				t.Errorf("sync returned %v, want the record's error", err)
			}
			var want []string
			if !withDelete {
				want = []string{"create pods new", "update jobs/status j"}
			}
			if diff := cmp.Diff(want, writes()); diff != "" {
				t.Errorf("API writes (-want +got):\n%s", diff)
			}
			if f.c.expectations.finalizersBeingRemoved(testNS + "/j").Has(done.UID) {
				t.Errorf("the finalizer removal of %q is expected although it was not issued", done.Name)
			}
		})
	}
}

// TestRemoveFinalizersLabelsCounted checks that the finalizer removal of a counted pod
// that may leave the pod cache (jobsync.LeavesCache) labels it conditions.CountedLabel in
// the same patch, and that of any other pod changes nothing but the finalizer.
func TestRemoveFinalizersLabelsCounted(t *testing.T) {
	job := newJob("j")
	grows := newJob("grows")
	grows.Annotations = map[string]string{v1alpha1.AnnotationOOMMemoryRetry: "2x"} // not valid: its failed pods stay all the same
	succeeded := newPod("succeeded", job, corev1.PodSucceeded)
	failed := newPod("failed", job, corev1.PodFailed)
	stopping := newPod("stopping", job, corev1.PodRunning)
	stopping.DeletionTimestamp = &metav1.Time{Time: time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)}
	oom := newPod("oom", grows, corev1.PodFailed)
	oomDone := newPod("oom-done", grows, corev1.PodSucceeded)
	f := newFixture(t, job, grows, succeeded, failed, stopping, oom, oomDone)
	writes := recordWrites(f)
	ctx := context.Background()
	if _, err := f.c.removeFinalizers(ctx, testNS+"/j", job, []*corev1.Pod{succeeded, failed, stopping}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.removeFinalizers(ctx, testNS+"/grows", grows, []*corev1.Pod{oom, oomDone}, nil); err != nil {
		t.Fatal(err)
	}
	if n := len(writes()); n != 5 {
		t.Errorf("%d writes, want one patch a pod: %q", n, writes())
	}
	for name, wantCounted := range map[string]bool{"succeeded": true, "failed": true, "stopping": false, "oom": false, "oom-done": true} {
		p, err := f.client.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Finalizers) != 0 {
			t.Errorf("pod %s keeps finalizers %q", name, p.Finalizers)
		}
		v, ok := p.Labels[conditions.CountedLabel]
		if got := ok && v == "true"; got != wantCounted || (ok && v != "true") {
			t.Errorf("pod %s: label %s = %q (set %v), want set: %v", name, conditions.CountedLabel, v, ok, wantCounted)
		}
		if p.Labels[batchv1.ControllerUidLabel] == "" {
			t.Errorf("pod %s lost its other labels: %v", name, p.Labels)
		}
	}
}

// TestSyncStatusWriteFails checks that when the status write fails no finalizer is
// removed, no Event of the plan is emitted and the backoff record is kept, and that the
// error re-queues the Job; a conflict re-queues it without an error.
func TestSyncStatusWriteFails(t *testing.T) {
	cases := []struct {
		name      string
		err       error
		wantErr   bool
		wantQueue []queued
	}{
		{
			name:    "server error",
			err:     apierrors.NewInternalError(errors.New("etcd is down")),
			wantErr: true,
		},
		{
			name:      "conflict",
			err:       apierrors.NewConflict(schema.GroupResource{Group: "batch", Resource: "jobs"}, "j", errors.New("stale")),
			wantQueue: []queued{{Key: testNS + "/j", After: batchPeriod}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := newJob("j")
			excess := newPod("excess", job, corev1.PodRunning)
			done := newPod("done", job, corev1.PodSucceeded)
			f := newFixture(t, job, excess, done)
			f.inCache(t, job, excess, done)
			f.client.PrependReactor("update", "jobs", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() == "status" {
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			writes := recordWrites(f)
			f.c.state.setRetries(job, backoff.Record{Failures: 1})
			f.c.syncJob = planFor(t, job, fullPlan(job, excess, done))

			err := f.c.sync(context.Background(), testNS+"/j")
			if (err != nil) != tc.wantErr {
				t.Errorf("sync error = %v, want error %v", err, tc.wantErr)
			}
			for _, w := range writes() {
				if w == "patch pods done" {
					t.Errorf("the finalizer of the counted pod was removed although the status write failed")
				}
			}
			for _, e := range f.events() {
				if strings.Contains(e, "Decided") {
					t.Errorf("plan Event %q emitted although the status write failed", e)
				}
			}
			if got, _ := f.c.state.retries(job); got.Failures != 1 {
				t.Errorf("backoff record = %+v, want the old one kept", got)
			}
			if diff := cmp.Diff(tc.wantQueue, f.queue.Calls()); diff != "" {
				t.Errorf("queue (-want +got):\n%s", diff)
			}
			if f.c.expectations.finalizersBeingRemoved(testNS + "/j").Has(done.UID) {
				t.Errorf("a finalizer removal is expected that was never issued")
			}
		})
	}
}

// TestSyncSlowStart checks the creation batches 1, 2, 4, ...: after a batch with a failed
// creation the remaining pods are not attempted, and the status is corrected for every
// pod that was not created.
func TestSyncSlowStart(t *testing.T) {
	terminating := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: "namespace ns is being terminated",
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}},
	}}
	cases := []struct {
		name         string
		creations    int
		failCall     int   // the call (1-based) that fails; 0: none
		failWith     error // default a server error
		wantCalls    int
		wantNotMade  int
		wantErr      bool
		wantFailedEv int
	}{
		{name: "all succeed", creations: 10, wantCalls: 10},
		{name: "first fails: nothing more", creations: 10, failCall: 1, wantCalls: 1, wantNotMade: 10, wantErr: true, wantFailedEv: 1},
		{name: "second batch fails", creations: 10, failCall: 2, wantCalls: 3, wantNotMade: 8, wantErr: true, wantFailedEv: 1},
		{name: "third batch fails", creations: 10, failCall: 4, wantCalls: 7, wantNotMade: 4, wantErr: true, wantFailedEv: 1},
		{name: "last batch fails", creations: 10, failCall: 9, wantCalls: 10, wantNotMade: 1, wantErr: true, wantFailedEv: 1},
		{name: "namespace terminating: stop, no error", creations: 10, failCall: 2, failWith: terminating, wantCalls: 3, wantNotMade: 8},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := newJob("j")
			f := newFixture(t, job)
			f.inCache(t, job)
			var calls atomic.Int32
			f.client.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if n := int(calls.Add(1)); n == tc.failCall {
					if tc.failWith != nil {
						return true, nil, tc.failWith
					}
					return true, nil, apierrors.NewServiceUnavailable("quota controller is down")
				}
				return false, nil, nil
			})
			plan := jobsync.Plan{WriteStatus: true, Status: *job.Status.DeepCopy()}
			plan.Status.Active = int32(tc.creations)
			plan.Status.Ready = ptr.To[int32](0)
			for i := range tc.creations {
				plan.Create = append(plan.Create, jobsync.PodCreate{Pod: newPlanPod(job, fmt.Sprintf("p-%d", i)), Reason: observe.CreateNew})
			}
			f.c.syncJob = planFor(t, job, plan)

			err := f.c.sync(context.Background(), testNS+"/j")
			if (err != nil) != tc.wantErr {
				t.Errorf("sync error = %v, want error %v", err, tc.wantErr)
			}
			if got := int(calls.Load()); got != tc.wantCalls {
				t.Errorf("create calls = %d, want %d", got, tc.wantCalls)
			}
			written, err := f.client.BatchV1().Jobs(testNS).Get(context.Background(), "j", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want := int32(tc.creations - tc.wantNotMade); written.Status.Active != want {
				t.Errorf("written status.active = %d, want %d", written.Status.Active, want)
			}
			// Only the pods that were created are still expected to show up.
			if got, want := f.c.expectations.byKey[testNS+"/j"].creations, tc.creations-tc.wantNotMade; got != want {
				t.Errorf("pending creations = %d, want %d", got, want)
			}
			failedEvents := 0
			for _, e := range f.events() {
				if strings.HasPrefix(e, "Warning FailedCreate") {
					failedEvents++
				}
			}
			if failedEvents != tc.wantFailedEv {
				t.Errorf("FailedCreate Events = %d, want %d", failedEvents, tc.wantFailedEv)
			}
		})
	}
}

// TestSyncDeleteFails checks that a pod that could not be deleted is reported to
// Plan.Adjust, and that a pod already gone counts as deleted.
func TestSyncDeleteFails(t *testing.T) {
	job := newJob("j")
	stuck := newPod("stuck", job, corev1.PodRunning)
	gone := newPod("gone", job, corev1.PodRunning)
	f := newFixture(t, job, stuck) // "gone" is not on the server
	f.inCache(t, job, stuck, gone)
	f.client.PrependReactor("delete", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.DeleteAction).GetName() == "stuck" {
			return true, nil, apierrors.NewInternalError(errors.New("boom"))
		}
		return false, nil, nil
	})
	plan := jobsync.Plan{WriteStatus: true, Status: *job.Status.DeepCopy()}
	plan.Status.Active = 0
	plan.Status.Ready = ptr.To[int32](0)
	plan.Status.Terminating = ptr.To[int32](2)
	plan.Delete = []jobsync.PodDelete{{Pod: stuck}, {Pod: gone}}
	f.c.syncJob = planFor(t, job, plan)

	if err := f.c.sync(context.Background(), testNS+"/j"); err == nil {
		t.Errorf("sync succeeded although a deletion failed")
	}
	written, err := f.client.BatchV1().Jobs(testNS).Get(context.Background(), "j", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if written.Status.Active != 1 || ptr.Deref(written.Status.Terminating, -1) != 1 {
		t.Errorf("written active=%d terminating=%v, want 1 and 1", written.Status.Active, written.Status.Terminating)
	}
	if !f.c.expectations.satisfied(testNS + "/j") {
		t.Errorf("expectations wait for deletions that failed or found nothing")
	}
}

// TestSyncDoesNotDeleteTwice checks that a sync that runs before the informer showed the
// deletions of the previous one (as after a failure decision, synced at once) does not
// delete those pods again, and keeps waiting for them.
func TestSyncDoesNotDeleteTwice(t *testing.T) {
	job := newJob("j")
	a, b := newPod("a", job, corev1.PodRunning), newPod("b", job, corev1.PodRunning)
	f := newFixture(t, job, a, b)
	f.inCache(t, job, a, b)
	writes := recordWrites(f)
	plan := jobsync.Plan{WriteStatus: true, Status: *job.Status.DeepCopy()}
	plan.Status.Terminating = ptr.To[int32](2)
	plan.Delete = []jobsync.PodDelete{{Pod: a, Reason: "job failed"}, {Pod: b, Reason: "job failed"}}
	key := testNS + "/j"
	f.c.expectations.expect(key, 0, []types.UID{a.UID}) // a's deletion is in flight
	f.c.syncJob = planFor(t, job, plan)
	if err := f.c.sync(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	got := slices.DeleteFunc(writes(), func(s string) bool { return !strings.HasPrefix(s, "delete") })
	if diff := cmp.Diff([]string{"delete pods b"}, got); diff != "" {
		t.Errorf("deletions (-want +got):\n%s", diff)
	}
	if pending := f.c.expectations.pendingDeletions(key); !pending.Has(a.UID) || !pending.Has(b.UID) {
		t.Errorf("pending deletions %v, want a and b", pending.UnsortedList())
	}
}

// TestSyncLeavesOthersAlone checks S1 in sync: a Job managed by anyone else is never
// passed to jobsync and never written, even when its key is queued.
func TestSyncLeavesOthersAlone(t *testing.T) {
	for _, managedBy := range []string{"", "kubernetes.io/job-controller", "example.com/other"} {
		t.Run("managedBy="+managedBy, func(t *testing.T) {
			job := newJob("j", managedBy)
			pod := newPod("p", job, corev1.PodSucceeded)
			f := newFixture(t, job, pod)
			f.inCache(t, job, pod)
			writes := recordWrites(f)
			f.c.syncJob = func(jobsync.Input) jobsync.Plan {
				t.Errorf("jobsync asked about a Job managed by %q", managedBy)
				return jobsync.Plan{}
			}
			if err := f.c.sync(context.Background(), testNS+"/j"); err != nil {
				t.Errorf("sync: %v", err)
			}
			if w := writes(); len(w) > 0 {
				t.Errorf("writes for a Job managed by %q: %v", managedBy, w)
			}
		})
	}
}

// TestSyncInput checks what the controller hands to jobsync: only the Job's own pods,
// its backoff record, the clock's time and the expectations.
func TestSyncInput(t *testing.T) {
	job := newJob("j")
	mine := newPod("mine", job, corev1.PodRunning)
	other := newJob("other")
	theirs := newPod("theirs", other, corev1.PodRunning)
	// Controlled by the Job but labelled for another: not the Job's pod.
	mislabelled := newPod("mislabelled", job, corev1.PodRunning)
	mislabelled.Labels[batchv1.ControllerUidLabel] = "nope"
	f := newFixture(t, job)
	f.inCache(t, job, mine, theirs, mislabelled)
	f.c.state.setRetries(job, backoff.Record{Failures: 3})
	f.c.expectations.expect(testNS+"/j", 1, nil)
	f.c.expectations.expectFinalizersRemoved(testNS+"/j", []types.UID{"x"})
	var got jobsync.Input
	f.c.syncJob = func(in jobsync.Input) jobsync.Plan { got = in; return jobsync.Plan{} }
	if err := f.c.sync(context.Background(), testNS+"/j"); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got.Pods {
		names = append(names, p.Name)
	}
	if diff := cmp.Diff([]string{"mine"}, names); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
	if got.Retries.Failures != 3 || !got.Now.Equal(f.clock.Now()) || got.ExpectationsSatisfied || !got.FinalizersBeingRemoved.Has("x") || got.Backoff != backoff.Default {
		t.Errorf("input = %+v", got)
	}
	// A plan with a zero record drops the Job's record.
	if _, ok := f.c.state.retries(job); ok {
		t.Errorf("the backoff record was kept although the plan's is zero")
	}
}

// TestSyncJobGone checks that a Job gone from the cache makes no call and is forgotten.
func TestSyncJobGone(t *testing.T) {
	f := newFixture(t)
	writes := recordWrites(f)
	f.c.expectations.expect(testNS+"/j", 3, nil)
	f.c.syncJob = func(jobsync.Input) jobsync.Plan {
		t.Errorf("jobsync asked about a Job that is gone")
		return jobsync.Plan{}
	}
	if err := f.c.sync(context.Background(), testNS+"/j"); err != nil {
		t.Fatal(err)
	}
	if !f.c.expectations.satisfied(testNS + "/j") {
		t.Errorf("expectations of a Job that is gone are kept")
	}
	if w := writes(); len(w) > 0 {
		t.Errorf("writes: %v", w)
	}
}

// TestSyncOrphanPod checks when the orphan path removes a pod's tracking finalizer.
func TestSyncOrphanPod(t *testing.T) {
	ours := newJob("ours")
	builtIn := newJob("builtin", "")
	cases := []struct {
		name      string
		pod       *corev1.Pod
		cache     []runtime.Object // Jobs in the lister
		server    []runtime.Object // Jobs on the API server
		wantPatch bool
	}{
		{name: "no controller", pod: newPod("p", nil, corev1.PodSucceeded), wantPatch: true},
		{name: "Job gone from the cache and the server", pod: newPod("p", ours, corev1.PodFailed), wantPatch: true},
		{name: "Job of another controller gone", pod: newPod("p", builtIn, corev1.PodFailed), wantPatch: true},
		{name: "Job not in the cache yet but on the server", pod: newPod("p", ours, corev1.PodRunning), server: []runtime.Object{ours}},
		{name: "Job replaced by one of the same name", pod: newPod("p", ours, corev1.PodFailed), server: []runtime.Object{func() *batchv1.Job {
			j := ours.DeepCopy()
			j.UID = "new"
			return j
		}()}, wantPatch: true},
		{name: "Job of another controller still there", pod: newPod("p", builtIn, corev1.PodFailed), cache: []runtime.Object{builtIn}},
		{name: "our Job still there (its sync is in charge)", pod: newPod("p", ours, corev1.PodFailed), cache: []runtime.Object{ours}},
		{name: "no finalizer any more", pod: withoutFinalizer(newPod("p", nil, corev1.PodFailed))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, append(slices.Clone(tc.server), tc.pod)...)
			f.inCache(t, append(slices.Clone(tc.cache), tc.pod)...)
			writes := recordWrites(f)
			if err := f.c.syncOrphanPod(context.Background(), testNS+"/p"); err != nil {
				t.Fatal(err)
			}
			patched := slices.Contains(writes(), "patch pods p")
			if patched != tc.wantPatch {
				t.Errorf("finalizer removed = %v, want %v", patched, tc.wantPatch)
			}
		})
	}
}

// TestPodPatchesThroughMetadata: with Config.PodMetadata, the pod patches go through it
// (answered with the pod's metadata alone), with the same bodies the typed client would
// have sent, and none through the typed client.
func TestPodPatchesThroughMetadata(t *testing.T) {
	job := newJob("j")
	succeeded := newPod("succeeded", job, corev1.PodSucceeded)
	stopping := newPod("stopping", job, corev1.PodRunning)
	f := newFixture(t, job, succeeded, stopping)
	typed := recordWrites(f)
	meta := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	var mu sync.Mutex
	patches := map[string]string{}
	meta.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		mu.Lock()
		defer mu.Unlock()
		patches[p.GetNamespace()+"/"+p.GetName()] = string(p.GetPatchType()) + " " + string(p.GetPatch())
		return true, &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: p.GetName(), Namespace: p.GetNamespace()}}, nil
	})
	f.c.cfg.PodMetadata = meta
	if _, err := f.c.removeFinalizers(context.Background(), testNS+"/j", job, []*corev1.Pod{succeeded, stopping}, nil); err != nil {
		t.Fatal(err)
	}
	if w := typed(); len(w) != 0 {
		t.Errorf("writes through the typed client: %q, want none", w)
	}
	want := map[string]string{
		testNS + "/succeeded": string(types.StrategicMergePatchType) + " " + string(countedPatch),
		testNS + "/stopping":  string(types.StrategicMergePatchType) + " " + string(removeTrackingFinalizerPatch),
	}
	if diff := cmp.Diff(want, patches); diff != "" {
		t.Errorf("patches through the metadata client (-want +got):\n%s", diff)
	}
}
