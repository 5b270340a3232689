package policy

import (
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/coroner-dev/coroner/conditions"
)

// AwaitingVerdict says how much longer a failed pod's failure should wait for coroner's
// agent to say what kind of OOM kill ended it, or 0 when it need not wait.
//
// The agent stamps an OOM kill (coroner.dev/OOMKilled for the pod's own limit,
// DisruptionTarget NodeOOMKill for the node's memory) within a few hundred milliseconds of
// the exit, before the kubelet reports the pod Failed, and onPodConditions rules decide on
// that stamp. When the agent of the node is down at that moment (restarting, or itself
// killed by the node's OOM killer, as the node-OOM e2e saw once), the kubelet's Failed
// phase comes first and a node OOM would be counted as an unmatched failure; the restarted
// agent's stamp (it reconciles exits and the kernel log on start) would come too late.
// So a Failed pod waits, up to wait after its container finished, when all of these hold:
//   - the Job's podFailurePolicy has a rule on pod conditions (a verdict can change the
//     outcome; exit-code rules alone do not read it);
//   - a container of the pod (or an init container) terminated with reason OOMKilled;
//   - the pod has neither coroner.dev/OOMKilled nor DisruptionTarget=True.
//
// The wait counts from the latest finishedAt of those containers, so a shim that starts
// late does not wait again. Without a finishedAt there is nothing to count from: no wait.
// A cluster without coroner's agent pays wait once per such failure; 0 turns it off.
func AwaitingVerdict(job *batchv1.Job, pod *corev1.Pod, now time.Time, wait time.Duration) time.Duration {
	if !readsConditions(job.Spec.PodFailurePolicy) {
		return 0
	}
	return VerdictWait(pod, now, wait)
}

// VerdictWait is AwaitingVerdict without its first condition: how much longer a failed
// pod that a container's OOM kill ended waits for the agent's verdict, whatever the Job's
// policy (a Job that grows memory on its own-limit OOM kills reads the verdict too).
func VerdictWait(pod *corev1.Pod, now time.Time, wait time.Duration) time.Duration {
	if wait <= 0 || pod.Status.Phase != corev1.PodFailed {
		return 0
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == conditions.OOMKilled || (c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue) {
			return 0
		}
	}
	var finished time.Time
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for _, s := range list {
			if t := s.State.Terminated; t != nil && t.Reason == "OOMKilled" && t.FinishedAt.After(finished) {
				finished = t.FinishedAt.Time
			}
		}
	}
	if finished.IsZero() {
		return 0
	}
	return max(0, finished.Add(wait).Sub(now))
}

// readsConditions reports whether a rule of the policy is on pod conditions.
func readsConditions(p *batchv1.PodFailurePolicy) bool {
	if p == nil {
		return false
	}
	for _, r := range p.Rules {
		if len(r.OnPodConditions) > 0 {
			return true
		}
	}
	return false
}
