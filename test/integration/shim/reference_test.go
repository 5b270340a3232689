package shim_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// history is a Job and a kubelet script: the same pod history played under either
// controller. The script refers to pods by their place (the first active pod, the new pod
// of index 1, ...), never by name, so it replays the same under both.
//
// Where coroner differs on purpose it is tested on its own: a pod lost with its node is
// replaced without the backoff the built-in controller applies
// (TestNodeLossReplacedWithoutBackoff; docs/choices.md).
type history struct {
	name string
	job  func(ns string) *wrappers.JobWrapper
	play func(f *fixture, job *batchv1.Job)
	// end is the terminal condition the history leads to.
	end batchv1.JobConditionType
}

var histories = []history{
	{
		name: "FailJob on exit code",
		job: func(ns string) *wrappers.JobWrapper {
			return wrappers.MakeJob("ref", ns).Parallelism(2).Completions(2).PodFailurePolicy(
				wrappers.OnExitCodes(failJob, opIn, 42).InContainer("main"),
				wrappers.OnPodCondition(ignore, conditions.DisruptionTarget))
		},
		play: func(f *fixture, job *batchv1.Job) {
			pods := f.waitActive(job, 2, settle)
			for _, p := range pods {
				f.runPod(p, true)
			}
			f.waitCounters(job, counters{Active: 2, Ready: 2}, settle)
			f.failPod(pods[0], 42)
		},
		end: batchv1.JobFailed,
	},
	{
		name: "Ignore DisruptionTarget then success",
		job: func(ns string) *wrappers.JobWrapper {
			return wrappers.MakeJob("ref", ns).Parallelism(1).Completions(2).BackoffLimit(0).PodFailurePolicy(
				wrappers.OnPodCondition(ignore, conditions.DisruptionTarget))
		},
		play: func(f *fixture, job *batchv1.Job) {
			first := f.waitActive(job, 1, settle)[0]
			f.runPod(first, true)
			f.failPod(first, 137, disruption(conditions.ReasonEvictionByEvictionAPI))
			second := f.waitNewActive(job, -1, f.replacementWait(1), first)
			f.runPod(second, true)
			f.succeedPod(second)
			third := f.waitNewActive(job, -1, f.replacementWait(1), first, second)
			f.runPod(third, true)
			f.succeedPod(third)
		},
		end: batchv1.JobComplete,
	},
	{
		name: "backoffLimitPerIndex with one index failing twice",
		job: func(ns string) *wrappers.JobWrapper {
			return wrappers.MakeJob("ref", ns).Indexed().Completions(3).Parallelism(3).BackoffLimitPerIndex(1)
		},
		play: func(f *fixture, job *batchv1.Job) {
			pods := f.waitActive(job, 3, settle)
			for _, p := range pods {
				f.runPod(p, true)
			}
			f.failPod(pods[1], 1)
			again := f.waitNewActive(job, 1, f.replacementWait(1), pods[1])
			f.runPod(again, true)
			f.failPod(again, 1)
			f.waitCounters(job, counters{Active: 2, Ready: 2, Failed: 2, FailedIndexes: strp("1")}, settle)
			f.succeedPod(pods[0])
			f.succeedPod(pods[2])
		},
		end: batchv1.JobFailed,
	},
	{
		name: "TerminatingOrFailed deletion then success",
		job: func(ns string) *wrappers.JobWrapper {
			return wrappers.MakeJob("ref", ns).BackoffLimit(2).PodReplacementPolicy(batchv1.TerminatingOrFailed)
		},
		play: func(f *fixture, job *batchv1.Job) {
			first := f.waitActive(job, 1, settle)[0]
			f.bindPod(first, "node-a")
			f.runPod(first, true)
			f.deletePod(first)
			second := f.waitNewActive(job, -1, f.replacementWait(1), first)
			f.failPod(first, 143)
			f.finishDeletion(first)
			f.runPod(second, true)
			f.succeedPod(second)
		},
		end: batchv1.JobComplete,
	},
}

// TestMatchesBuiltInController plays each history once under the built-in Job controller
// (the reference: kube-controller-manager v1.36.3, a Job without managedBy) and once under
// coroner's shim (the same Job with managedBy), and compares the outcomes: the final
// status (counters, indexes, conditions in order with reasons and messages) and every
// pod's fate and annotations.
func TestMatchesBuiltInController(t *testing.T) {
	if builtinTarget {
		t.Skip("compares coroner with the built-in controller")
	}
	t.Parallel()
	for _, h := range histories {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			outcomes := map[string]*outcome{}
			t.Run("play", func(t *testing.T) {
				for _, builtin := range []bool{true, false} {
					name := "coroner"
					if builtin {
						name = "built-in"
					}
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						f := newFixtureFor(t, builtin, shim.Config{})
						job := f.createJob(h.job(f.ns))
						h.play(f, job)
						f.waitFinished(job, h.end, f.replacementWait(2))
						f.settle()
						o := f.outcome(job)
						mu.Lock()
						outcomes[name] = o
						mu.Unlock()
					})
				}
			})
			ref, got := outcomes["built-in"], outcomes["coroner"]
			if ref == nil || got == nil {
				t.Fatal("a run did not finish; nothing to compare")
			}
			if diff := cmp.Diff(ref, got); diff != "" {
				t.Errorf("coroner's outcome differs from the built-in controller's (-built-in +coroner):\n%s", diff)
			}
		})
	}
}

// outcome is what a user sees of a finished Job, with names that differ between runs
// (namespace, pod names, UIDs) replaced by placeholders.
type outcome struct {
	Status string
	// Conditions are "Type/Status/Reason: message".
	Conditions []string
	// Pods are one line per pod the Job ever had, in creation order per index.
	Pods []string
}

func (f *fixture) outcome(job *batchv1.Job) *outcome {
	j := f.mirror.job(job.UID)
	records := f.mirror.records(job)
	replacer := []string{f.ns + "/", "NS/", string(job.UID), "JOB-UID"}
	for i, r := range records {
		replacer = append(replacer, r.first.Name, fmt.Sprintf("pod%d", i))
	}
	norm := strings.NewReplacer(replacer...).Replace

	s := j.Status
	o := &outcome{
		Status: fmt.Sprintf("active=%d ready=%s terminating=%s succeeded=%d failed=%d completedIndexes=%q failedIndexes=%s uncounted=%d startTime=%v completionTime=%v",
			s.Active, ptrStr(s.Ready), ptrStr(s.Terminating), s.Succeeded, s.Failed, s.CompletedIndexes, strPtr(s.FailedIndexes),
			len(ptr.Deref(s.UncountedTerminatedPods, batchv1.UncountedTerminatedPods{}).Failed)+len(ptr.Deref(s.UncountedTerminatedPods, batchv1.UncountedTerminatedPods{}).Succeeded),
			s.StartTime != nil, s.CompletionTime != nil),
	}
	for _, c := range s.Conditions {
		o.Conditions = append(o.Conditions, norm(fmt.Sprintf("%s/%s/%s: %s", c.Type, c.Status, c.Reason, c.Message)))
	}
	for _, r := range records {
		p := r.last
		fate := string(p.Status.Phase)
		if r.gone {
			fate = "gone (was " + fate + ")"
		} else if p.DeletionTimestamp != nil {
			fate += " deleting"
		}
		var labels, annotations []string
		for k, v := range r.first.Labels {
			if k == conditions.ManagedPodLabel {
				continue // coroner's own, which its pod cache selects on; the built-in sets none
			}
			labels = append(labels, k+"="+v)
		}
		for k, v := range r.first.Annotations {
			annotations = append(annotations, k+"="+v)
		}
		sort.Strings(labels)
		sort.Strings(annotations)
		var env []string
		for _, c := range r.first.Spec.Containers {
			for _, e := range c.Env {
				v := e.Value
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					v = "fieldRef " + e.ValueFrom.FieldRef.FieldPath
				}
				env = append(env, c.Name+":"+e.Name+"="+v)
			}
		}
		// A pod that is gone has lost its finalizer: the API server keeps a pod until its
		// finalizers are empty. But when removing the finalizer is the write that deletes it
		// (the kubelet's grace-0 delete came first), the watch's DELETED event carries the
		// last stored state, finalizer included, and which write came first is the
		// controller's timing, not its behaviour. So only a pod still present reports one.
		finalizer := hasTrackingFinalizer(p) && !r.gone
		o.Pods = append(o.Pods, norm(fmt.Sprintf("%s: %s, finalizer at the end %v, created with finalizers %v hostname %q labels %v annotations %v env %v",
			r.first.Name, fate, finalizer, r.first.Finalizers, r.first.Spec.Hostname, labels, annotations, env)))
	}
	return o
}
