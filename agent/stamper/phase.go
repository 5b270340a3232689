package stamper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/coroner-dev/coroner/agent/classify"
	"github.com/coroner-dev/coroner/conditions"
)

// ensurePhaseWithExits is conditions.EnsurePodPhase with the runtime's exits written
// into the container statuses in the same patch (classify.TerminatedStatuses, recomputed
// against the pod as it is at each attempt): the terminal phase the agent writes for a
// pod whose kubelet cannot (A4) then carries the exit codes an onExitCodes rule matches.
// The discipline is the conditions writers': nothing at all when the pod's phase is
// already terminal (the kubelet's word wins), uid and resourceVersion preconditions, the
// pod read again on a conflict, ErrPodGone when it no longer exists. Container statuses
// have no merge key in a strategic merge patch: the lists sent replace the stored ones,
// which the resourceVersion precondition makes safe (they were computed from them).
func ensurePhaseWithExits(ctx context.Context, c conditions.PodPatcher, pod *corev1.Pod, phase corev1.PodPhase,
	exits []classify.ContainerState, scheme string, now func() metav1.Time, conds ...corev1.PodCondition) (bool, error) {
	if !conditions.IsTerminalPhase(phase) {
		return false, fmt.Errorf("stamper: a terminal phase only, not %q", phase)
	}
	cur := pod
	read := pod.ResourceVersion == ""
	written := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if read {
			fresh, err := c.GetPod(ctx, pod.Namespace, pod.Name)
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("stamper: pod %s/%s: %w: %w", pod.Namespace, pod.Name, conditions.ErrPodGone, err)
			}
			if err != nil {
				return err
			}
			if pod.UID != "" && fresh.UID != pod.UID {
				return fmt.Errorf("stamper: pod %s/%s (uid %s): %w", pod.Namespace, pod.Name, pod.UID, conditions.ErrPodGone)
			}
			cur = fresh
		}
		read = true
		if cur.ResourceVersion == "" {
			return errors.New("pod has no resourceVersion; refusing to write without a precondition")
		}
		if conditions.IsTerminalPhase(cur.Status.Phase) {
			return nil
		}
		data, err := json.Marshal(phasePatchFor(cur, phase, exits, scheme, now, conds))
		if err != nil {
			return err
		}
		if _, err := c.PatchPod(ctx, pod.Namespace, pod.Name, types.StrategicMergePatchType, data, "status"); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("stamper: pod %s/%s: %w: %w", pod.Namespace, pod.Name, conditions.ErrPodGone, err)
			}
			return err
		}
		written = true
		return nil
	})
	if err != nil && !errors.Is(err, conditions.ErrPodGone) {
		err = fmt.Errorf("stamper: writing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return written, err
}

// phasePatch is the status patch: preconditions, the phase, the conditions that change
// (merged by type) and the container statuses when they change (replaced).
type phasePatch struct {
	Metadata struct {
		ResourceVersion string    `json:"resourceVersion"`
		UID             types.UID `json:"uid,omitempty"`
	} `json:"metadata"`
	Status struct {
		Phase                 corev1.PodPhase          `json:"phase"`
		Conditions            []corev1.PodCondition    `json:"conditions,omitempty"`
		InitContainerStatuses []corev1.ContainerStatus `json:"initContainerStatuses,omitempty"`
		ContainerStatuses     []corev1.ContainerStatus `json:"containerStatuses,omitempty"`
	} `json:"status"`
}

// phasePatchFor computes the patch against cur (pure).
func phasePatchFor(cur *corev1.Pod, phase corev1.PodPhase, exits []classify.ContainerState, scheme string,
	now func() metav1.Time, conds []corev1.PodCondition) phasePatch {
	var p phasePatch
	p.Metadata.ResourceVersion, p.Metadata.UID = cur.ResourceVersion, cur.UID
	p.Status.Phase = phase
	if len(conds) > 0 {
		t := metav1.Now()
		if now != nil {
			t = now()
		}
		status := cur.Status.DeepCopy()
		for _, cond := range conds {
			if conditions.Set(status, cond, t) {
				p.Status.Conditions = append(p.Status.Conditions, *conditions.Find(status, cond.Type))
			}
		}
	}
	init, app, changed := classify.TerminatedStatuses(cur, exits, scheme)
	if changed {
		if !equalStatuses(init, cur.Status.InitContainerStatuses) {
			p.Status.InitContainerStatuses = init
		}
		if !equalStatuses(app, cur.Status.ContainerStatuses) {
			p.Status.ContainerStatuses = app
		}
	}
	return p
}

func equalStatuses(a, b []corev1.ContainerStatus) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, _ := json.Marshal(a[i])
		y, _ := json.Marshal(b[i])
		if string(x) != string(y) {
			return false
		}
	}
	return true
}
