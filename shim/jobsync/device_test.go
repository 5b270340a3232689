package jobsync

import (
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/backoff"
	"github.com/coroner-dev/coroner/shim/observe"
	"github.com/coroner-dev/coroner/test/wrappers"
)

const gpuMessage = "container main died: its device coroner.dev/test-gpu gpu-0 is Unhealthy (the kubelet's device health) since 2026-11-22T11:59:56Z"

// gpuPod is a pod of index 0 holding one coroner.dev/test-gpu whose container main exited
// code ago, with the conditions given.
func gpuPod(name string, code int32, ago time.Duration, conds ...corev1.PodCondition) *corev1.Pod {
	w := failed(name, code).FinishedAt(now.Add(-ago)).Index(0)
	gpu := corev1.ResourceList{"coroner.dev/test-gpu": resource.MustParse("1")}
	w.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: gpu, Requests: gpu}
	w.Spec.NodeName = "node-a"
	w.Status.Conditions = append(w.Status.Conditions, conds...)
	return tracked(w)
}

func deviceFailed(msg string) []corev1.PodCondition {
	return []corev1.PodCondition{
		{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: msg},
		{Type: conditions.DeviceFailed, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: msg},
	}
}

func noDeviceFailure() corev1.PodCondition {
	return corev1.PodCondition{Type: conditions.DeviceFailed, Status: corev1.ConditionFalse, Reason: conditions.ReasonNoDeviceFailure,
		Message: "container main died with exit code 1; its devices coroner.dev/test-gpu gpu-0 stayed Healthy"}
}

// TestDeviceVerdict plays one failed pod of an Indexed Job (backoffLimitPerIndex 0) through
// one sync: what it waits for, how it counts, the one Event about it and the metrics.
func TestDeviceVerdict(t *testing.T) {
	ignoreDisruptions := wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)
	indexedJob := func(rules ...*wrappers.RuleWrapper) *batchv1.Job {
		w := wrappers.MakeJob("j", "ns").Indexed().Completions(1).BackoffLimitPerIndex(0)
		if len(rules) > 0 {
			w.PodFailurePolicy(rules...)
		}
		return job(w)
	}
	type want struct {
		waits          bool // not counted, not replaced, finalizer kept, requeued
		requeue        time.Duration
		failedIndex    bool
		ignored        bool
		event          string // "Type Reason: substring"
		deviceFailures map[observe.DeviceFailure]int
		verdict        string // observe.DeviceVerdict's, "" for none
	}
	for _, tc := range []struct {
		name string
		job  *batchv1.Job
		pod  *corev1.Pod
		wait time.Duration
		want want
	}{
		{name: "no verdict yet: seen running", job: indexedJob(ignoreDisruptions), pod: gpuPod("p", 1, 5*time.Second), wait: 30 * time.Second,
			want: want{waits: true, requeue: 25 * time.Second}},
		{name: "DeviceFailure: ignored, replaced", job: indexedJob(ignoreDisruptions), pod: gpuPod("p", 1, 5*time.Second, deviceFailed(gpuMessage)...), wait: 30 * time.Second,
			want: want{ignored: true,
				event:          "Normal DeviceFailure: pod ns/p (index 0): " + gpuMessage + "; not counted, the pod will be replaced (podFailurePolicy rule 0: Ignore on DisruptionTarget)",
				deviceFailures: map[observe.DeviceFailure]int{{Resource: "coroner.dev/test-gpu", Action: "Ignore"}: 1}, verdict: observe.VerdictDeviceFailure}},
		{name: "NoDeviceFailure: counted, the index fails", job: indexedJob(ignoreDisruptions), pod: gpuPod("p", 1, 12*time.Second, noDeviceFailure()), wait: 30 * time.Second,
			want: want{failedIndex: true,
				event:   "Warning NoDeviceFailure: pod ns/p (index 0): coroner-agent found no failing device (container main died with exit code 1; its devices coroner.dev/test-gpu gpu-0 stayed Healthy): container main exited 1; index 0 failed (no podFailurePolicy rule matched)",
				verdict: observe.VerdictNoDeviceFailure}},
		{name: "no verdict within the wait: counted, said", job: indexedJob(ignoreDisruptions), pod: gpuPod("p", 1, 31*time.Second), wait: 30 * time.Second,
			want: want{failedIndex: true,
				event:   "Warning DeviceVerdictMissing: pod ns/p (index 0): judged without coroner-agent's device verdict (none came within 30s of container main's exit; is coroner-agent running on node node-a?): container main exited 1; index 0 failed (no podFailurePolicy rule matched)",
				verdict: observe.VerdictMissing}},
		{name: "wait turned off: decided at once, said", job: indexedJob(ignoreDisruptions), pod: gpuPod("p", 1, time.Second), wait: 0,
			want: want{failedIndex: true, event: "Warning DeviceVerdictMissing: pod ns/p (index 0): judged without coroner-agent's device verdict (coroner-shim runs with --device-verdict-wait=0;", verdict: observe.VerdictMissing}},
		{name: "a DRA device-taint eviction is any disruption: no wait, Ignored", job: indexedJob(ignoreDisruptions),
			pod:  gpuPod("p", 137, time.Second, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByDeviceTaintManager", Message: "Device Taint manager: deleting due to NoExecute taint"}),
			wait: 30 * time.Second,
			want: want{ignored: true, event: "Normal PodFailurePolicy: pod ns/p: disrupted (DisruptionTarget DeletionByDeviceTaintManager); container main exited 137, matched rule 0 (Ignore): not counted, the pod will be replaced"}},
		{name: "exit-code rules alone: no wait", job: indexedJob(wrappers.OnExitCodes(batchv1.PodFailurePolicyActionFailIndex, batchv1.PodFailurePolicyOnExitCodesOpIn, 42)),
			pod: gpuPod("p", 1, time.Second), wait: 30 * time.Second,
			want: want{failedIndex: true, event: "Warning PodFailurePolicy: pod ns/p: container main exited 1, no rule matched: index 0 failed"}},
		{name: "no policy: a device failure counts, and says so", job: indexedJob(), pod: gpuPod("p", 1, time.Second, deviceFailed(gpuMessage)...), wait: 30 * time.Second,
			want: want{failedIndex: true, event: "Warning DeviceFailure: pod ns/p (index 0): " + gpuMessage + "; index 0 failed (no podFailurePolicy)",
				deviceFailures: map[observe.DeviceFailure]int{{Resource: "coroner.dev/test-gpu", Action: "None"}: 1}}},
		{name: "FailIndex on DeviceFailed", job: indexedJob(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionFailIndex, conditions.DeviceFailed)),
			pod: gpuPod("p", 1, time.Second, deviceFailed(gpuMessage)...), wait: 30 * time.Second,
			want: want{failedIndex: true, event: "Warning DeviceFailure: pod ns/p (index 0): " + gpuMessage + "; index 0 failed (podFailurePolicy rule 0: FailIndex on coroner.dev/DeviceFailed)",
				deviceFailures: map[observe.DeviceFailure]int{{Resource: "coroner.dev/test-gpu", Action: "FailIndex"}: 1}, verdict: observe.VerdictDeviceFailure}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods := []*corev1.Pod{tc.pod}
			if tc.want.ignored {
				// An ignored failure of an index keeps its finalizer until the
				// replacement exists (its backoff first): a later sync, with it.
				pods = append(pods, tracked(running("p-next").Index(0)))
			}
			plan := Sync(Input{Job: tc.job, Pods: pods, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true,
				FinalizersBeingRemoved: sets.New[types.UID](), VerdictWait: 30 * time.Second, DeviceVerdictWait: tc.wait})
			if tc.want.waits {
				if len(plan.Create) != 0 || len(plan.RemoveFinalizer) != 0 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 || plan.Status.Active != 1 || len(plan.Events) != 0 {
					t.Errorf("awaiting the verdict: create %d, remove finalizers %d, uncounted %v, active %d, events %v; want the pod seen active, nothing done, nothing said",
						len(plan.Create), len(plan.RemoveFinalizer), plan.Status.UncountedTerminatedPods.Failed, plan.Status.Active, plan.Events)
				}
				if d := plan.RequeueAfter - tc.want.requeue; d < -time.Second || d > time.Second {
					t.Errorf("RequeueAfter %v, want about %v", plan.RequeueAfter, tc.want.requeue)
				}
				if tc.pod.Status.Phase != corev1.PodFailed {
					t.Errorf("the informer's pod was modified: phase %s", tc.pod.Status.Phase)
				}
				return
			}
			if len(plan.RemoveFinalizer) != 1 {
				t.Errorf("remove finalizers %d, want the pod's", len(plan.RemoveFinalizer))
			}
			if got := len(plan.Status.UncountedTerminatedPods.Failed) == 0; got != tc.want.ignored {
				t.Errorf("uncounted failed %v; want ignored %v", plan.Status.UncountedTerminatedPods.Failed, tc.want.ignored)
			}
			if got := *plan.Status.FailedIndexes == "0"; got != tc.want.failedIndex {
				t.Errorf("failedIndexes %q, want index 0 failed: %v", *plan.Status.FailedIndexes, tc.want.failedIndex)
			}
			var said []string
			for _, e := range plan.Events {
				if e.Reason != "FailedIndexes" {
					said = append(said, e.Type+" "+e.Reason+": "+e.Message)
				}
			}
			if len(said) != 1 || !strings.HasPrefix(said[0], tc.want.event) {
				t.Errorf("events:\n%s\nwant one, starting with:\n%s", strings.Join(said, "\n"), tc.want.event)
			}
			if len(tc.want.deviceFailures) != len(plan.Observations.DeviceFailures) {
				t.Errorf("device failures %v, want %v", plan.Observations.DeviceFailures, tc.want.deviceFailures)
			}
			for k, n := range tc.want.deviceFailures {
				if plan.Observations.DeviceFailures[k] != n {
					t.Errorf("device failures %v, want %v", plan.Observations.DeviceFailures, tc.want.deviceFailures)
				}
			}
			var verdicts []string
			for _, v := range plan.Observations.DeviceVerdicts {
				verdicts = append(verdicts, v.Verdict)
			}
			if got := strings.Join(verdicts, ","); got != tc.want.verdict {
				t.Errorf("device verdicts observed %q, want %q", got, tc.want.verdict)
			}
		})
	}
}

// TestDeviceVerdictSaidOnce: the Event comes with the decision; a later sync of the same
// pod (recorded in uncountedTerminatedPods, its finalizer removal not yet seen) says
// nothing more.
func TestDeviceVerdictSaidOnce(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).BackoffLimitPerIndex(0).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)))
	p := gpuPod("p", 1, 40*time.Second)
	in := Input{Job: j, Pods: []*corev1.Pod{p}, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true,
		FinalizersBeingRemoved: sets.New[types.UID](), DeviceVerdictWait: 30 * time.Second}
	plan := Sync(in)
	if n := countEvents(plan, EventReasonDeviceVerdictMissing); n != 1 {
		t.Fatalf("first sync: %d DeviceVerdictMissing Events, want 1", n)
	}
	j.Status = plan.Status
	plan = Sync(in)
	if n := countEvents(plan, EventReasonDeviceVerdictMissing); n != 0 {
		t.Errorf("second sync: %d DeviceVerdictMissing Events, want none", n)
	}
	in.FinalizersBeingRemoved = sets.New(p.UID)
	plan = Sync(in)
	if n := countEvents(plan, EventReasonDeviceVerdictMissing); n != 0 {
		t.Errorf("finalizer removal in flight: %d DeviceVerdictMissing Events, want none", n)
	}
}

func countEvents(p Plan, reason string) int {
	n := 0
	for _, e := range p.Events {
		if e.Reason == reason {
			n++
		}
	}
	return n
}

// TestDeviceVerdictWaitBesideTheOOMWait: a pod OOM-killed while holding a GPU waits for
// both verdicts, the longer wait; a pod being deleted waits as with the OOM wait (seen
// terminating); a Job that finished waits for nothing.
func TestDeviceVerdictWaitBesideTheOOMWait(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(1).BackoffLimitPerIndex(0).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)))
	in := func(j *batchv1.Job, p *corev1.Pod) Input {
		return Input{Job: j, Pods: []*corev1.Pod{p}, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true,
			FinalizersBeingRemoved: sets.New[types.UID](), VerdictWait: 20 * time.Second, DeviceVerdictWait: 30 * time.Second}
	}
	oom := gpuPod("p", 137, 5*time.Second)
	oom.Status.ContainerStatuses[0].State.Terminated.Reason = "OOMKilled"
	plan := Sync(in(j, oom))
	if len(plan.RemoveFinalizer) != 0 || plan.RequeueAfter < 24*time.Second || plan.RequeueAfter > 26*time.Second {
		t.Errorf("OOM-killed with a GPU: remove finalizers %d, requeue %v; want kept, requeued after about 25s (the device wait's rest)", len(plan.RemoveFinalizer), plan.RequeueAfter)
	}

	deleted := gpuPod("p", 1, 5*time.Second)
	deleted.DeletionTimestamp = &metav1.Time{Time: now.Add(-time.Second)}
	plan = Sync(in(j, deleted))
	if len(plan.RemoveFinalizer) != 0 || len(plan.Status.UncountedTerminatedPods.Failed) != 0 || *plan.Status.Terminating != 1 || plan.RequeueAfter == 0 {
		t.Errorf("being deleted: remove finalizers %d, uncounted %v, terminating %d, requeue %v; want it terminating until the wait is over",
			len(plan.RemoveFinalizer), plan.Status.UncountedTerminatedPods.Failed, *plan.Status.Terminating, plan.RequeueAfter)
	}
	deleted = gpuPod("p", 1, 31*time.Second)
	deleted.DeletionTimestamp = &metav1.Time{Time: now.Add(-time.Second)}
	plan = Sync(in(j, deleted))
	if len(plan.RemoveFinalizer) != 1 || len(plan.Status.UncountedTerminatedPods.Failed) != 1 {
		t.Errorf("being deleted, past the wait: remove finalizers %d, uncounted %v; want counted", len(plan.RemoveFinalizer), plan.Status.UncountedTerminatedPods.Failed)
	}

	done := j.DeepCopy()
	done.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded"}}
	plan = Sync(in(done, gpuPod("p", 1, time.Second)))
	if len(plan.RemoveFinalizer) != 1 || plan.RequeueAfter != 0 {
		t.Errorf("finished Job: remove finalizers %d, requeue %v; want the finalizer off at once", len(plan.RemoveFinalizer), plan.RequeueAfter)
	}
}

// TestNoDevicesNoChange: without devices, the same pods give the same plan whatever the
// device wait (the built-in controller's behaviour).
func TestNoDevicesNoChange(t *testing.T) {
	j := job(wrappers.MakeJob("j", "ns").Indexed().Completions(2).BackoffLimitPerIndex(1).PodFailurePolicy(
		wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)))
	pods := []*corev1.Pod{tracked(failed("a", 1).FinishedAt(now.Add(-time.Second)).Index(0)), tracked(failed("b", 3).FinishedAt(now.Add(-2 * time.Second)).Index(1))}
	in := Input{Job: j, Pods: pods, Now: now, Backoff: backoff.Default, ExpectationsSatisfied: true, FinalizersBeingRemoved: sets.New[types.UID]()}
	before := Sync(in)
	in.DeviceVerdictWait = time.Minute
	after := Sync(in)
	if d := cmpPlans(before, after); d != "" {
		t.Errorf("the device wait changed a plan without devices: %s", d)
	}
}

func cmpPlans(a, b Plan) string {
	var diffs []string
	if len(a.Create) != len(b.Create) || len(a.RemoveFinalizer) != len(b.RemoveFinalizer) || a.RequeueAfter != b.RequeueAfter {
		diffs = append(diffs, "actions")
	}
	if len(a.Events) != len(b.Events) {
		diffs = append(diffs, "events")
	}
	for i := range min(len(a.Events), len(b.Events)) {
		if a.Events[i] != b.Events[i] {
			diffs = append(diffs, "event "+a.Events[i].Message)
		}
	}
	if a.Status.Failed != b.Status.Failed || *a.Status.FailedIndexes != *b.Status.FailedIndexes || len(a.Status.UncountedTerminatedPods.Failed) != len(b.Status.UncountedTerminatedPods.Failed) {
		diffs = append(diffs, "status")
	}
	return strings.Join(diffs, ", ")
}
