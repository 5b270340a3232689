package controller

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

// A delete event of the pod informer is a stray (the pod left the cache without being
// deleted) when its pod still has the tracking finalizer and no deletionTimestamp, and the
// controller is not removing that finalizer itself; a stray of a managed Job holds the
// Job's creations until it is looked at.
func TestNoteStray(t *testing.T) {
	job := newJob("j")
	pod := newPod("p", job, corev1.PodRunning)
	cases := []struct {
		name      string
		event     any
		expecting bool // the controller is removing the pod's finalizer
		want      []queued
	}{
		{name: "label removed", event: pod, want: []queued{{Key: testNS + "/p/p-uid/j"}}},
		{name: "relist tombstone", event: cache.DeletedFinalStateUnknown{Key: testNS + "/p", Obj: pod}, want: []queued{{Key: testNS + "/p/p-uid/j"}}},
		{name: "orphan", event: newPod("o", nil, corev1.PodRunning), want: []queued{{Key: testNS + "/o/o-uid/"}}},
		{name: "deleted", event: beingDeleted(pod)},
		{name: "finalizer gone", event: withoutFinalizer(pod)},
		{name: "counted by the controller", event: pod, expecting: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.inCache(t, job)
			key := testNS + "/j"
			if tc.expecting {
				f.c.expectations.expectFinalizersRemoved(key, []types.UID{pod.UID})
			}
			f.c.deletePod(tc.event)
			if got := f.strays.Calls(); !slices.Equal(got, tc.want) {
				t.Errorf("stray queue %v, want %v", got, tc.want)
			}
			held := len(tc.want) > 0 && strings.HasSuffix(tc.want[0].Key, "/j")
			if got := f.c.expectations.satisfied(key); got == held {
				t.Errorf("expectations satisfied = %v, want %v", got, !held)
			}
			if held {
				f.clock.Step(ExpectationsTTL + time.Second)
				if !f.c.expectations.satisfied(key) {
					t.Errorf("a stray never looked at holds the Job past the TTL")
				}
			}
		})
	}
}

// syncStrayPod acts on what the API server holds of the stray pod.
func TestSyncStrayPod(t *testing.T) {
	job := newJob("j")
	deleting := job.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.NewTime(time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)))
	unmanaged := newJob("u", "")
	stray := newPod("p", job, corev1.PodRunning)
	delete(stray.Labels, conditions.ManagedPodLabel)
	bare := relabelled(stray)
	bare.Labels = nil

	const (
		none     = ""
		relabel  = "relabel"
		release  = "release"
		finalize = "finalizer"
	)
	cases := []struct {
		name     string
		cached   *batchv1.Job // the pod's Job as the cache holds it
		stored   *corev1.Pod  // the pod the API server holds; nil: gone
		key      string
		want     string
		resolved bool // the Job's stray expectation is gone and the Job enqueued
	}{
		{name: "gone", cached: job, key: "p/p-uid/j", resolved: true},
		{name: "another pod of that name", cached: job, stored: func() *corev1.Pod { p := stray.DeepCopy(); p.UID = "other"; return p }(), key: "p/p-uid/j", resolved: true},
		{name: "still matches: labelled again", cached: job, stored: stray, key: "p/p-uid/j", want: relabel},
		{name: "labels removed: released", cached: job, stored: bare, key: "p/p-uid/j", want: release, resolved: true},
		{name: "Job being deleted: labelled again", cached: deleting, stored: bare, key: "p/p-uid/j", want: relabel},
		{name: "labelled again by someone", cached: job, stored: newPod("p", job, corev1.PodRunning), key: "p/p-uid/j", resolved: true},
		{name: "finalizer gone", cached: job, stored: withoutFinalizer(stray), key: "p/p-uid/j", resolved: true},
		{name: "counted", cached: job, stored: func() *corev1.Pod { p := stray.DeepCopy(); p.Labels[conditions.CountedLabel] = "true"; return p }(), key: "p/p-uid/j", resolved: true},
		{name: "orphan: finalizer removed", cached: job, stored: func() *corev1.Pod { p := bare.DeepCopy(); p.OwnerReferences = nil; return p }(), key: "p/p-uid/", want: finalize},
		{name: "another controller's Job", cached: unmanaged, stored: func() *corev1.Pod { p := newPod("p", unmanaged, corev1.PodRunning); p.Labels = nil; return p }(), key: "p/p-uid/"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{tc.cached}
			if tc.stored != nil {
				objs = append(objs, tc.stored)
			}
			f := newFixture(t, objs...)
			f.inCache(t, tc.cached)
			f.c.expectations.strayed(testNS+"/j", "p-uid")
			if err := f.c.syncStrayPod(context.Background(), testNS+"/"+tc.key); err != nil {
				t.Fatal(err)
			}
			patch := patchesOf(f)["p"]
			got := none
			switch {
			case patch == "":
			case strings.Contains(patch, `"labels":{"`+conditions.ManagedPodLabel+`":"true"}`):
				got = relabel
			case strings.Contains(patch, `"$patch":"delete"`):
				got = release
			case strings.Contains(patch, `"resourceVersion"`) && strings.Contains(patch, "$deleteFromPrimitiveList/finalizers"):
				got = finalize
			default:
				t.Fatalf("unexpected patch %s", patch)
			}
			if got != tc.want {
				t.Errorf("did %q (patch %s), want %q", got, patch, tc.want)
			}
			if got == relabel {
				// On the pod's UID, and the API server's pod is the Job's again.
				if !strings.Contains(patch, `"uid":"p-uid"`) {
					t.Errorf("relabel patch %s is not on the pod's UID", patch)
				}
				stored, err := f.client.CoreV1().Pods(testNS).Get(context.Background(), "p", metav1.GetOptions{})
				if err != nil || stored.Labels[conditions.ManagedPodLabel] != "true" {
					t.Errorf("stored pod %v, %v: want it labelled %s", stored.GetLabels(), err, conditions.ManagedPodLabel)
				}
			}
			if resolved := f.c.expectations.satisfied(testNS + "/j"); resolved != tc.resolved && tc.key[len(tc.key)-1] == 'j' {
				t.Errorf("stray resolved = %v, want %v", resolved, tc.resolved)
			}
			if tc.resolved {
				if calls := f.queue.Calls(); !slices.Contains(calls, queued{Key: testNS + "/j", After: batchPeriod}) {
					t.Errorf("the Job was not enqueued: %v", calls)
				}
			}
		})
	}
}

// The add event of a stray labelled again resolves it.
func TestStrayBackInTheCache(t *testing.T) {
	job := newJob("j")
	f := newFixture(t)
	f.inCache(t, job)
	f.c.expectations.strayed(testNS+"/j", "p-uid")
	f.c.addPod(newPod("p", job, corev1.PodRunning))
	if !f.c.expectations.satisfied(testNS + "/j") {
		t.Errorf("the stray is still held after its add event")
	}
}

// LabelOwnPods labels the managed Jobs' pods that lack coroner.dev/managed, and only them.
func TestLabelOwnPods(t *testing.T) {
	job := newJob("j")
	unmanaged := newJob("u", "")
	unlabelled := func(name string, job *batchv1.Job) *corev1.Pod {
		p := newPod(name, job, corev1.PodRunning)
		delete(p.Labels, conditions.ManagedPodLabel)
		return p
	}
	counted := unlabelled("counted", job)
	counted.Labels[conditions.CountedLabel] = "true"
	f := newFixture(t, job, unmanaged,
		unlabelled("old-1", job), unlabelled("old-2", job), newPod("new", job, corev1.PodRunning),
		counted, unlabelled("theirs", unmanaged), unlabelled("orphan", nil))
	n, err := f.c.LabelOwnPods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("labelled %d pods, want 2", n)
	}
	var got []string
	for name := range patchesOf(f) {
		got = append(got, name)
	}
	slices.Sort(got)
	if want := []string{"old-1", "old-2"}; !slices.Equal(got, want) {
		t.Errorf("patched %v, want %v", got, want)
	}
	for _, name := range []string{"old-1", "old-2", "new"} {
		p, err := f.client.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil || p.Labels[conditions.ManagedPodLabel] != "true" {
			t.Errorf("pod %s: labels %v, %v", name, p.GetLabels(), err)
		}
	}

	// No managed Job: no pod is even listed.
	f = newFixture(t, unmanaged, unlabelled("theirs", unmanaged))
	if n, err := f.c.LabelOwnPods(context.Background()); n != 0 || err != nil {
		t.Errorf("without managed Jobs: labelled %d, %v", n, err)
	}
	for _, a := range f.client.Actions() {
		if a.GetResource().Resource == "pods" {
			t.Errorf("without managed Jobs: %s pods", a.GetVerb())
		}
	}
}
