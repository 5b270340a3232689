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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
)

// orphanOf is a pod with no controller reference that the Job's generated selector
// matches (its controller-uid label is the Job's UID).
func orphanOf(name string, job *batchv1.Job) *corev1.Pod {
	p := newPod(name, nil, corev1.PodRunning)
	p.Labels[batchv1.ControllerUidLabel] = string(job.UID)
	return p
}

// relabelled is p without the Job's label, which its selector matches: still in the
// shim's cache (it keeps coroner.dev/managed), no longer the Job's.
func relabelled(p *corev1.Pod) *corev1.Pod {
	p = p.DeepCopy()
	delete(p.Labels, batchv1.ControllerUidLabel)
	return p
}

func names(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func TestPlanClaims(t *testing.T) {
	job := newJob("j")
	other := newJob("other")
	deleting := job.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.NewTime(time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)))
	manual := job.DeepCopy()
	manual.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}

	cases := []struct {
		name                          string
		job                           *batchv1.Job
		noSelector                    bool
		owned, orphans                []*corev1.Pod
		wantKeep, wantAdopt, wantFree []string
	}{{
		name:     "own pods that match are kept",
		job:      job,
		owned:    []*corev1.Pod{newPod("a", job, corev1.PodRunning), newPod("b", job, corev1.PodFailed)},
		wantKeep: []string{"a", "b"},
	}, {
		name:     "an own pod whose labels no longer match is released",
		job:      job,
		owned:    []*corev1.Pod{newPod("a", job, corev1.PodRunning), relabelled(newPod("b", job, corev1.PodRunning))},
		wantKeep: []string{"a"}, wantFree: []string{"b"},
	}, {
		name:      "a matching orphan is adopted",
		job:       job,
		orphans:   []*corev1.Pod{orphanOf("o", job)},
		wantAdopt: []string{"o"},
	}, {
		name:    "an orphan being deleted is not adopted",
		job:     job,
		orphans: []*corev1.Pod{beingDeleted(orphanOf("o", job))},
	}, {
		name:    "an orphan of another Job's UID is not adopted",
		job:     job,
		orphans: []*corev1.Pod{orphanOf("o", other)},
	}, {
		name:    "a pod that has a controller is never adopted",
		job:     job,
		orphans: []*corev1.Pod{newPod("x", other, corev1.PodRunning)},
	}, {
		name:     "a Job being deleted neither adopts nor releases, and stops counting pods that no longer match",
		job:      deleting,
		owned:    []*corev1.Pod{newPod("a", job, corev1.PodRunning), relabelled(newPod("b", job, corev1.PodRunning))},
		orphans:  []*corev1.Pod{orphanOf("o", job)},
		wantKeep: []string{"a"},
	}, {
		name:     "a manual selector decides, not the controller-uid label",
		job:      manual,
		owned:    []*corev1.Pod{newPod("a", job, corev1.PodRunning)},
		orphans:  []*corev1.Pod{orphanOf("o", job)},
		wantFree: []string{"a"},
	}, {
		name:       "without a usable selector the own pods stay and nothing is adopted",
		job:        job,
		noSelector: true,
		owned:      []*corev1.Pod{relabelled(newPod("a", job, corev1.PodRunning))},
		orphans:    []*corev1.Pod{orphanOf("o", job)},
		wantKeep:   []string{"a"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sel labels.Selector
			if !tc.noSelector {
				sel = jobSelector(tc.job)
			}
			p := planClaims(tc.job, sel, tc.owned, tc.orphans)
			if got := names(p.Keep); !slices.Equal(got, tc.wantKeep) {
				t.Errorf("keep %v, want %v", got, tc.wantKeep)
			}
			if got := names(p.Adopt); !slices.Equal(got, tc.wantAdopt) {
				t.Errorf("adopt %v, want %v", got, tc.wantAdopt)
			}
			if got := names(p.Release); !slices.Equal(got, tc.wantFree) {
				t.Errorf("release %v, want %v", got, tc.wantFree)
			}
		})
	}
}

// patchesOf returns the pod patches the fake clientset received, by pod name.
func patchesOf(f *fixture) map[string]string {
	out := map[string]string{}
	for _, a := range f.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "pods" {
			out[p.GetName()] = string(p.GetPatch())
		}
	}
	return out
}

func TestClaimPods(t *testing.T) {
	job := newJob("j")
	own := newPod("own", job, corev1.PodRunning)
	moved := relabelled(newPod("moved", job, corev1.PodRunning))
	orphan := orphanOf("orphan", job)
	orphan.Finalizers = nil

	f := newFixture(t, job, own, moved, orphan)
	f.inCache(t, job, own, moved, orphan)

	pods, err := f.c.claimPods(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(pods), []string{"orphan", "own"}; !slices.Equal(got, want) {
		t.Errorf("claimed %v, want %v", got, want)
	}
	for _, p := range pods {
		if p.Name == "orphan" && (metav1.GetControllerOf(p) == nil || metav1.GetControllerOf(p).UID != job.UID || !hasTrackingFinalizer(p)) {
			t.Errorf("the adopted pod as counted has owners %v and finalizers %v, want the Job's controller reference and the tracking finalizer", p.OwnerReferences, p.Finalizers)
		}
	}
	patches := patchesOf(f)
	if got := patches["orphan"]; !strings.Contains(got, `"controller":true`) || !strings.Contains(got, string(job.UID)) ||
		!strings.Contains(got, conditions.JobTrackingFinalizer) || !strings.Contains(got, `"uid":"orphan-uid"`) {
		t.Errorf("adoption patch %s: want the Job's controller reference, the tracking finalizer and the pod's UID", got)
	}
	if got := patches["moved"]; !strings.Contains(got, `"$patch":"delete"`) || !strings.Contains(got, "$deleteFromPrimitiveList/finalizers") ||
		!strings.Contains(got, `"uid":"moved-uid"`) {
		t.Errorf("release patch %s: want the reference and the tracking finalizer deleted, on the pod's UID", got)
	}
	if _, ok := patches["own"]; ok {
		t.Errorf("the Job's own pod was patched: %s", patches["own"])
	}
	// What the API server holds after the patches (the fake applies them).
	got, err := f.client.CoreV1().Pods(testNS).Get(context.Background(), "orphan", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(got); ref == nil || ref.UID != job.UID || !hasTrackingFinalizer(got) {
		t.Errorf("adopted pod stored with owners %v, finalizers %v", got.OwnerReferences, got.Finalizers)
	}
	got, err = f.client.CoreV1().Pods(testNS).Get(context.Background(), "moved", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.OwnerReferences) != 0 || hasTrackingFinalizer(got) {
		t.Errorf("released pod stored with owners %v, finalizers %v", got.OwnerReferences, got.Finalizers)
	}
	events := strings.Join(f.events(), "\n")
	for _, want := range []string{conditions.EventReasonAdopted + " Adopted pod orphan", conditions.EventReasonReleased + " Released pod moved"} {
		if !strings.Contains(events, want) {
			t.Errorf("Events %q lack %q", events, want)
		}
	}
}

// A Job that the API server says is being deleted, or was replaced by another of the same
// name, adopts nothing, although its cached copy would.
func TestClaimPodsRechecksTheJob(t *testing.T) {
	job := newJob("j")
	for name, stored := range map[string]runtime.Object{
		"being deleted": func() *batchv1.Job {
			j := job.DeepCopy()
			j.DeletionTimestamp = ptr.To(metav1.NewTime(time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)))
			j.Finalizers = []string{"example.com/hold"}
			return j
		}(),
		"replaced": func() *batchv1.Job {
			j := job.DeepCopy()
			j.UID = types.UID("newer-uid")
			return j
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			orphan := orphanOf("orphan", job)
			f := newFixture(t, stored, orphan)
			f.inCache(t, job, orphan)
			pods, err := f.c.claimPods(context.Background(), job)
			if err != nil {
				t.Fatal(err)
			}
			if len(pods) != 0 {
				t.Errorf("claimed %v, want none", names(pods))
			}
			if p := patchesOf(f); len(p) != 0 {
				t.Errorf("pods patched: %v", p)
			}
		})
	}
}

// An orphan that shows up enqueues the managed Jobs whose selector matches it, and no
// other Job.
func TestOrphanEnqueuesAdopters(t *testing.T) {
	job := newJob("j")
	unmanaged := newJob("u", "")
	unmanaged.Spec.Selector = job.Spec.Selector
	f := newFixture(t)
	f.inCache(t, job, unmanaged)
	f.c.addPod(orphanOf("orphan", job))
	want := []queued{{Key: testNS + "/j", After: batchPeriod}}
	if got := f.queue.Calls(); !slices.Equal(got, want) {
		t.Errorf("queued %v, want %v", got, want)
	}
}
