package shim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/shim/controller"
	"github.com/coroner-dev/coroner/shim/jobsync"
	"github.com/coroner-dev/coroner/test/wrappers"
)

// testGPU is the lab's test device plugin's resource.
const testGPU corev1.ResourceName = "coroner.dev/test-gpu"

// gpuJob is issue 37's Job: Indexed, one completion, backoffLimitPerIndex 0, Ignore on
// DisruptionTarget, its pod holding one test GPU.
func gpuJob(f *fixture, name string) *batchv1.Job {
	w := wrappers.MakeJob(name, f.ns).Indexed().Completions(1).Parallelism(1).BackoffLimitPerIndex(0).
		PodFailurePolicy(wrappers.OnPodCondition(batchv1.PodFailurePolicyActionIgnore, corev1.DisruptionTarget))
	gpu := corev1.ResourceList{testGPU: resource.MustParse("1")}
	w.Spec.Template.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: gpu, Requests: gpu}
	return f.createJob(w)
}

// deviceHealth is the kubelet's allocatedResourcesStatus for the pod's one GPU (KEP-4680).
func deviceHealth(id string, health corev1.ResourceHealthStatus) kubeletOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses[0].AllocatedResourcesStatus = []corev1.ResourceStatus{{
			Name: corev1.ResourceName(testGPU), Resources: []corev1.ResourceHealth{{ResourceID: corev1.ResourceID(id), Health: health}}}}
	}
}

// agentStamp writes coroner-agent's device verdict on the pod, as the agent does: the
// conditions through the status subresource.
func (f *fixture) agentStamp(pod *corev1.Pod, conds ...corev1.PodCondition) *corev1.Pod {
	f.t.Helper()
	return f.writeStatus(pod, "coroner-agent's device verdict", func(p *corev1.Pod) {
		for _, c := range conds {
			setPodCondition(p, c.Type, c.Status, c.Reason, metav1.Now())
			for i := range p.Status.Conditions {
				if p.Status.Conditions[i].Type == c.Type {
					p.Status.Conditions[i].Message = c.Message
				}
			}
		}
	})
}

// TestDeviceVerdict (issue 37) on the real API server, the test playing the kubelet and
// coroner-agent: a pod that held a test GPU exits 1.
//
//   - its GPU turned Unhealthy and the agent stamps DeviceFailure: not counted before the
//     stamp, then not counted (Ignore on DisruptionTarget) and replaced; the Job completes;
//   - the agent finds the GPU healthy (DeviceFailed=False): counted, the index fails;
//   - no agent: counted once --device-verdict-wait is over, with a Warning.
//
// Each says what it decided in one Event.
func TestDeviceVerdict(t *testing.T) {
	if builtinTarget {
		t.Skip("the device verdict's wait is coroner's own")
	}
	t.Parallel()
	const wait = 3 * time.Second

	t.Run("device failure", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, controller.Config{DeviceVerdictWait: time.Minute})
		job := gpuJob(f, "gpu-failed")
		pod := f.waitActive(job, 1, settle)[0]
		pod = f.failPod(pod, 1, deviceHealth("gpu-0", corev1.ResourceHealthStatusUnhealthy))
		// The pod waits for the verdict: seen running, not counted, not replaced.
		f.consistently(job, 2*time.Second, "the failed GPU pod is neither counted nor replaced before coroner-agent's verdict", func(j *batchv1.Job, pods []*corev1.Pod) bool {
			return j.Status.Failed == 0 && len(pods) == 1 && hasTrackingFinalizer(pods[0]) && j.Status.Active == 1 &&
				(j.Status.UncountedTerminatedPods == nil || len(j.Status.UncountedTerminatedPods.Failed) == 0)
		})
		msg := fmt.Sprintf("container main died: its device %s gpu-0 is Unhealthy (the kubelet's device health) since %s", testGPU, time.Now().UTC().Add(-time.Second).Format(time.RFC3339))
		f.agentStamp(pod,
			corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: msg},
			corev1.PodCondition{Type: conditions.DeviceFailed, Status: corev1.ConditionTrue, Reason: conditions.ReasonDeviceFailure, Message: msg})
		next := f.waitNewActive(job, 0, f.replacementWait(1), pod)
		f.succeedPod(next)
		done := f.waitFinished(job, batchv1.JobComplete, settle)
		if done.Status.Failed != 0 || done.Status.CompletedIndexes != "0" || ptr.Deref(done.Status.FailedIndexes, "") != "" {
			t.Errorf("failed %d, completed %q, failedIndexes %q: want the device failure not counted, index 0 completed",
				done.Status.Failed, done.Status.CompletedIndexes, strPtr(done.Status.FailedIndexes))
		}
		if got := next.Annotations[batchv1.JobIndexIgnoredFailureCountAnnotation]; got != "1" {
			t.Errorf("the replacement's %s = %q, want 1", batchv1.JobIndexIgnoredFailureCountAnnotation, got)
		}
		f.waitEvent(job, corev1.EventTypeNormal, jobsync.EventReasonDeviceFailure,
			fmt.Sprintf("pod %s/%s (index 0): %s; not counted, the pod will be replaced (podFailurePolicy rule 0: Ignore on DisruptionTarget)", f.ns, pod.Name, msg))
		f.wantOneDeviceEvent(job)
	})

	t.Run("healthy device", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, controller.Config{DeviceVerdictWait: time.Minute})
		job := gpuJob(f, "gpu-healthy")
		pod := f.waitActive(job, 1, settle)[0]
		pod = f.failPod(pod, 1, deviceHealth("gpu-1", corev1.ResourceHealthStatusHealthy))
		f.consistently(job, 2*time.Second, "the failed GPU pod is not counted before coroner-agent's verdict", func(j *batchv1.Job, pods []*corev1.Pod) bool {
			return j.Status.Failed == 0 && ptr.Deref(j.Status.FailedIndexes, "") == "" && len(pods) == 1 && hasTrackingFinalizer(pods[0])
		})
		const healthy = "container main died with exit code 1; its device coroner.dev/test-gpu gpu-1 stayed Healthy"
		f.agentStamp(pod, corev1.PodCondition{Type: conditions.DeviceFailed, Status: corev1.ConditionFalse, Reason: conditions.ReasonNoDeviceFailure, Message: healthy})
		done := f.waitFinished(job, batchv1.JobFailed, settle)
		if done.Status.Failed != 1 || ptr.Deref(done.Status.FailedIndexes, "") != "0" {
			t.Errorf("failed %d, failedIndexes %q: want the failure counted, index 0 failed", done.Status.Failed, strPtr(done.Status.FailedIndexes))
		}
		f.waitEvent(job, corev1.EventTypeWarning, jobsync.EventReasonNoDeviceFailure,
			fmt.Sprintf("pod %s/%s (index 0): coroner-agent found no failing device (%s): container main exited 1; index 0 failed (no podFailurePolicy rule matched)", f.ns, pod.Name, healthy))
		f.wantOneDeviceEvent(job)
	})

	t.Run("no verdict", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, controller.Config{DeviceVerdictWait: wait})
		job := gpuJob(f, "gpu-silent")
		pod := f.waitActive(job, 1, settle)[0]
		failed := time.Now()
		pod = f.failPod(pod, 1, deviceHealth("gpu-2", corev1.ResourceHealthStatusHealthy))
		done := f.waitFinished(job, batchv1.JobFailed, settle)
		if since := time.Since(failed); since < wait-time.Second {
			t.Errorf("the Job failed %v after the pod, within --device-verdict-wait %v", since, wait)
		}
		if done.Status.Failed != 1 || ptr.Deref(done.Status.FailedIndexes, "") != "0" {
			t.Errorf("failed %d, failedIndexes %q: want the failure counted, index 0 failed", done.Status.Failed, strPtr(done.Status.FailedIndexes))
		}
		f.waitEvent(job, corev1.EventTypeWarning, jobsync.EventReasonDeviceVerdictMissing,
			fmt.Sprintf("pod %s/%s (index 0): judged without coroner-agent's device verdict (none came within %s of container main's exit; is coroner-agent running on node (none)?): container main exited 1; index 0 failed (no podFailurePolicy rule matched)", f.ns, pod.Name, wait))
		f.wantOneDeviceEvent(job)
	})
}

// wantOneDeviceEvent checks that the Job has one Event about its device verdicts (of
// count 1) and no PodFailurePolicy Event about the same pod: one Event per pod, not per
// sync.
func (f *fixture) wantOneDeviceEvent(job *batchv1.Job) {
	f.t.Helper()
	list, err := f.client.CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	var device, policy []string
	for _, e := range list.Items {
		if e.InvolvedObject.UID != job.UID {
			continue
		}
		switch e.Reason {
		case jobsync.EventReasonDeviceFailure, jobsync.EventReasonNoDeviceFailure, jobsync.EventReasonDeviceVerdictMissing:
			device = append(device, fmt.Sprintf("%s x%d", e.Message, e.Count))
			if e.Count != 1 {
				f.t.Errorf("device Event said %d times: %s", e.Count, e.Message)
			}
		case conditions.EventReasonPodFailurePolicy:
			policy = append(policy, e.Message)
		}
	}
	if len(device) != 1 || len(policy) != 0 {
		f.t.Errorf("device Events:\n  %s\nPodFailurePolicy Events:\n  %s\nwant one device Event and no PodFailurePolicy Event", strings.Join(device, "\n  "), strings.Join(policy, "\n  "))
	}
}
