package jobsync

// The waits for the agent's verdicts before a failed pod is counted: on an OOM-killed pod
// (limit or node OOM), and on a pod that held devices (did a device kill it).

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/shim/policy"
)

// awaitVerdicts returns the pods as this sync sees them: a Failed pod whose OOM kill
// still waits for the agent's verdict (policy.AwaitingVerdict; for a Job with
// coroner.dev/oom-memory-retry, policy.VerdictWait whatever its policy), or whose
// container's death still waits for the agent's device verdict
// (policy.AwaitingDeviceVerdict), is seen as it was a moment before, Running: not
// counted, not replaced, its finalizer kept, until the verdicts are in or the waits are
// over. A pod being deleted waits the same (it is then seen as terminating), and a Job
// that finished does not come here. The second result is the shortest wait left, for a
// requeue (a pod waiting for both verdicts counts with the longer of its two waits: a
// verdict that comes earlier brings a pod update, and a sync with it). The informer's
// pods are not modified: a waiting pod is a shallow copy with its own status.
func awaitVerdicts(in Input) ([]*corev1.Pod, time.Duration) {
	var pods []*corev1.Pod
	var shortest time.Duration
	_, growsMemory := in.Job.Annotations[v1alpha1.AnnotationOOMMemoryRetry]
	for i, p := range in.Pods {
		left := policy.AwaitingVerdict(in.Job, p, in.Now, in.VerdictWait)
		if growsMemory {
			// A growth is decided on the agent's verdict (coroner.dev/OOMKilled).
			left = policy.VerdictWait(p, in.Now, in.VerdictWait)
		}
		left = max(left, policy.AwaitingDeviceVerdict(in.Job, p, in.Now, in.DeviceVerdictWait))
		if left <= 0 {
			if pods != nil {
				pods = append(pods, p)
			}
			continue
		}
		if pods == nil {
			pods = append(make([]*corev1.Pod, 0, len(in.Pods)), in.Pods[:i]...)
		}
		view := *p
		view.Status = *p.Status.DeepCopy()
		view.Status.Phase = corev1.PodRunning
		pods = append(pods, &view)
		if shortest == 0 || left < shortest {
			shortest = left
		}
	}
	if pods == nil {
		return in.Pods, 0
	}
	return pods, shortest
}
