package stamper

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/conditions"
)

// ensurePhaseWithExits is conditions.EnsurePodPhase with the runtime's exits written
// into the container statuses in the same patch (classify.TerminatedStatuses, recomputed
// against the pod as it is at each attempt): the terminal phase the agent writes for a
// pod whose kubelet cannot (A4) then carries the exit codes an onExitCodes rule matches.
// The write discipline is the conditions writers': nothing at all when the pod's phase is
// already terminal (the kubelet's word wins), uid and resourceVersion preconditions, the
// pod read again on a conflict, ErrPodGone when it no longer exists.
func ensurePhaseWithExits(ctx context.Context, c conditions.PodPatcher, pod *corev1.Pod, phase corev1.PodPhase,
	exits []classify.ContainerState, scheme string, now func() metav1.Time, conds ...corev1.PodCondition) (bool, error) {
	statuses := func(cur *corev1.Pod) ([]corev1.ContainerStatus, []corev1.ContainerStatus, bool) {
		return classify.TerminatedStatuses(cur, exits, scheme)
	}
	return conditions.EnsurePodPhaseWithStatuses(ctx, c, pod, phase, statuses, now, conds...)
}
