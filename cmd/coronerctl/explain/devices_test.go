package explain

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/record"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// gpuJob is an Indexed Job of 4 GPU pods (backoffLimitPerIndex 0, Ignore on
// DisruptionTarget), its pods as the API server holds them once coroner-agent and the
// kubelet wrote their status:
//
//   - index 0: killed by its device (the kubelet's health), ignored, replaced, then gone
//     (its story from the JobRecord); its replacement runs;
//   - index 1: exit 1 while its device stayed healthy (DeviceFailed=False): counted, the
//     index failed;
//   - index 2: killed by a driver's hardware fault (an Xid), not yet decided by the shim;
//   - index 3: exit 1, no verdict yet, 5 s ago: waiting for it.
func gpuJob() (*batchv1.Job, []runtime.Object) {
	job := wrappers.MakeJob("gpu", "default").ManagedBy(conditions.ManagedBy).Indexed().
		Completions(4).Parallelism(4).BackoffLimitPerIndex(0).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget)).Obj()
	job.UID = "gpu-uid"
	job.Status = batchv1.JobStatus{Active: 3, Failed: 1, FailedIndexes: ptr.To("1"), StartTime: &metav1.Time{Time: t0}}

	gpuPod := func(name string, ix int, code int32, finished time.Time, health ...corev1.ResourceHealth) *wrappers.PodWrapper {
		w := ownedPod(job, name, 0).Index(ix).Phase(corev1.PodFailed).ExitedContainer("main", code).FinishedAt(finished)
		gpu := corev1.ResourceList{"coroner.dev/test-gpu": resource.MustParse("1")}
		w.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: gpu, Requests: gpu}
		w.Status.ContainerStatuses[0].AllocatedResourcesStatus = []corev1.ResourceStatus{{Name: "coroner.dev/test-gpu", Resources: health}}
		w.Finalizer(batchv1.JobTrackingFinalizer)
		return w
	}
	stamp := func(w *wrappers.PodWrapper, at time.Time, conds ...corev1.PodCondition) *corev1.Pod {
		for _, c := range conds {
			c.LastTransitionTime = metav1.NewTime(at)
			w.Status.Conditions = append(w.Status.Conditions, c)
		}
		return w.Obj()
	}
	unhealthy := corev1.ResourceHealth{ResourceID: "gpu-0", Health: corev1.ResourceHealthStatusUnhealthy}
	healthy := func(id string) corev1.ResourceHealth {
		return corev1.ResourceHealth{ResourceID: corev1.ResourceID(id), Health: corev1.ResourceHealthStatusHealthy}
	}
	killed := "container main died: its device coroner.dev/test-gpu gpu-0 is Unhealthy (the kubelet's device health) since 2026-01-02T03:00:58Z"
	xid := "container main died: its device coroner.dev/test-gpu gpu-2 reported a hardware fault (code 79) at 2026-01-02T03:02:59Z: GPU has fallen off the bus"
	deviceFailure := func(msg string) []corev1.PodCondition {
		return []corev1.PodCondition{
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: msg},
			{Type: conditions.DeviceFailed, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: msg},
		}
	}

	// Index 0's first pod, as the shim recorded it when it removed its finalizer.
	gone := stamp(gpuPod("gpu-0-a", 0, 1, t0.Add(time.Minute), unhealthy), t0.Add(61*time.Second), deviceFailure(killed)...)
	var r v1alpha1.Record
	r.Add(0, record.Of(gone, record.Decision{Outcome: v1alpha1.OutcomeIgnored, Rule: 0, Action: batchv1.PodFailurePolicyActionIgnore,
		Consequence: "not counted, the pod will be replaced"}, metav1.NewTime(t0.Add(70*time.Second))))
	rec := v1alpha1.New("default", "gpu", "gpu-uid")
	rec.Set(r, 100)

	next := ownedPod(job, "gpu-0-b", 2*time.Minute).Index(0).Phase(corev1.PodRunning).RunningContainer("main").Obj()
	checked := stamp(gpuPod("gpu-1-a", 1, 1, t0.Add(2*time.Minute), healthy("gpu-1")), t0.Add(2*time.Minute+10*time.Second),
		corev1.PodCondition{Type: conditions.DeviceFailed, Status: corev1.ConditionFalse, Reason: conditions.ReasonNoDeviceFailure,
			Message: "container main died with exit code 1; its devices stayed healthy: coroner.dev/test-gpu gpu-1 Healthy"})
	fault := stamp(gpuPod("gpu-2-a", 2, 1, t0.Add(3*time.Minute), healthy("gpu-2")), t0.Add(3*time.Minute+time.Second), deviceFailure(xid)...)
	waiting := gpuPod("gpu-3-a", 3, 1, t0.Add(4*time.Minute), healthy("gpu-3")).Obj()
	return job, []runtime.Object{job, rec, next, checked, fault, waiting}
}

func TestDeviceStory(t *testing.T) {
	now = func() time.Time { return t0.Add(4*time.Minute + 5*time.Second) }
	defer func() { now = time.Now }()
	_, objs := gpuJob()
	client := fakeClient(t, objs...)
	var out bytes.Buffer
	if err := Job(context.Background(), client, "default", "gpu", &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	t.Logf("output:\n%s", got)
	assertLinesInOrder(t, got, []string{
		"Failed pods (3):",
		"  gpu-1-a  index 1  node node-a  finished 2026-01-02T03:02:00Z",
		"    exit:       container main exited 1 (Error) at 2026-01-02T03:02:00Z",
		"    device:     checked by coroner-agent: no device explains the death (every device the pod held stayed healthy, and no driver fault was logged for them)",
		"    verdict:    coroner.dev/DeviceFailed=False (NoDeviceFailure) at 2026-01-02T03:02:10Z: container main died with exit code 1; its devices stayed healthy: coroner.dev/test-gpu gpu-1 Healthy",
		"    devices:    container main: coroner.dev/test-gpu gpu-1 Healthy",
		"    rule:       no rule matched",
		"    action:     counted: failure 1 of index 1, over backoffLimitPerIndex 0: index 1 fails",
		"  gpu-2-a  index 2  node node-a  finished 2026-01-02T03:03:00Z",
		"    exit:       container main exited 1 (Error) at 2026-01-02T03:03:00Z",
		"    device:     coroner.dev/test-gpu gpu-2 failed: hardware fault code 79 at 2026-01-02T03:02:59Z (its driver's word, in the kernel log): GPU has fallen off the bus",
		"    verdict:    coroner.dev/DeviceFailed=True (DeviceFailure) at 2026-01-02T03:03:01Z: container main died: its device coroner.dev/test-gpu gpu-2 reported a hardware fault (code 79) at 2026-01-02T03:02:59Z: GPU has fallen off the bus",
		"    devices:    container main: coroner.dev/test-gpu gpu-2 Healthy",
		"    rule:       rule 0 (Ignore): pod condition DisruptionTarget",
		"    action:     not counted; the pod is replaced",
		"  gpu-3-a  index 3  node node-a  finished 2026-01-02T03:04:00Z",
		"    exit:       container main exited 1 (Error) at 2026-01-02T03:04:00Z",
		"    devices:    container main: coroner.dev/test-gpu gpu-3 Healthy",
		"    rule:       not decided yet: coroner-agent's device verdict can change the rule that matches",
		"    action:     waiting for coroner-agent's device verdict (up to 30s after container main's exit), until 2026-01-02T03:04:30Z at the latest: not counted, not replaced meanwhile",
		"Pods that are gone (1, from coroner-shim's record):",
		"  gpu-0-a  index 0  node node-a",
		"    cause:      killed by a failing device (DisruptionTarget DeviceFailure); container main exited 1",
		"    recorded:   failed, not counted (last phase Failed) at 2026-01-02T03:01:10Z",
		"    device:     coroner.dev/test-gpu gpu-0 failed: Unhealthy since 2026-01-02T03:00:58Z (the kubelet's device health, from the device plugin or DRA driver)",
		"    message:    " + "container main died: its device coroner.dev/test-gpu gpu-0 is Unhealthy (the kubelet's device health) since 2026-01-02T03:00:58Z",
		"    rule:       rule 0 (Ignore)",
		"    action:     not counted, the pod will be replaced",
		"Indexes:",
		"  INDEX  STATE    FAILURES  IGNORED  PODS",
		"  0      active   0         0        gpu-0-b (Running)",
		"  1      failed   1         0        gpu-1-a (Failed)",
		"  2      pending  0         1        gpu-2-a (Failed)",
		"  3      active   0         0        gpu-3-a (Failed, awaiting the device verdict)",
	})
	if strings.Contains(got, "disruption:") {
		t.Error("a device failure is told as device and verdict, not again as a disruption")
	}

	// The pod killed by a driver fault alone, by name: its cause is the device class.
	pr, err := Pod(context.Background(), client, "default", "gpu-2-a")
	if err != nil {
		t.Fatal(err)
	}
	if pr.Cause != "killed by a failing device (DisruptionTarget DeviceFailure); container main exited 1" {
		t.Errorf("cause = %q", pr.Cause)
	}

	// Past the wait, the waiting pod is told as decided without the verdict.
	now = func() time.Time { return t0.Add(5 * time.Minute) }
	out.Reset()
	if err := Job(context.Background(), client, "default", "gpu", &out); err != nil {
		t.Fatal(err)
	}
	assertLinesInOrder(t, out.String(), []string{
		"  gpu-3-a  index 3  node node-a  finished 2026-01-02T03:04:00Z",
		"    device:     no device verdict from coroner-agent: decided without it once the wait was over (30s after container main's exit at 2026-01-02T03:04:00Z, coroner-shim's default --device-verdict-wait); is coroner-agent running on node node-a?",
		"    rule:       no rule matched",
	})
}

// TestDeviceStoryLooseMessage: a verdict whose message is not in the agent's words still
// names the stamp, and shows the message whole.
func TestDeviceStoryLooseMessage(t *testing.T) {
	p := wrappers.MakePod("p", "ns").Phase(corev1.PodFailed).ExitedContainer("main", 1).Obj()
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"example.com/fpga": resource.MustParse("1")}
	p.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: "FPGA lost its bitstream"},
		{Type: conditions.DeviceFailed, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: "FPGA lost its bitstream"},
	}
	pr := podReport(nil, p)
	var lines []string
	for _, l := range pr.Details {
		lines = append(lines, l.Label+": "+l.Text)
	}
	assertLinesInOrder(t, strings.Join(lines, "\n"), []string{
		"device: a device of example.com/fpga failed (coroner-agent's words are in the verdict below)",
		"verdict: coroner.dev/DeviceFailed=True (DeviceFailure): FPGA lost its bitstream",
	})
}
