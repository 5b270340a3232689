package conditions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// PodPatcher is the writers' only I/O: read one pod, patch one pod. A
// kubernetes.Interface satisfies it through NewPodPatcher; tests use a small
// fake.
type PodPatcher interface {
	// GetPod reads the pod from the API server (not from a cache).
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// PatchPod patches the pod, or one of its subresources ("status").
	PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, subresources ...string) (*corev1.Pod, error)
}

// ClientsetPodPatcher is the PodPatcher of a kubernetes.Interface.
type ClientsetPodPatcher struct {
	Client kubernetes.Interface
	// FieldManager, when set, names the writer in the pod's managedFields
	// (for example "coroner-agent" or "coroner-shim").
	FieldManager string
}

// NewPodPatcher returns the PodPatcher of client; fieldManager may be empty.
func NewPodPatcher(client kubernetes.Interface, fieldManager string) *ClientsetPodPatcher {
	return &ClientsetPodPatcher{Client: client, FieldManager: fieldManager}
}

// GetPod reads the pod with an empty resourceVersion, that is the latest
// version (a consistent read), never a possibly stale cache.
func (p *ClientsetPodPatcher) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return p.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

// PatchPod sends the patch as is.
func (p *ClientsetPodPatcher) PatchPod(ctx context.Context, namespace, name string, pt types.PatchType, data []byte, subresources ...string) (*corev1.Pod, error) {
	return p.Client.CoreV1().Pods(namespace).Patch(ctx, name, pt, data, metav1.PatchOptions{FieldManager: p.FieldManager}, subresources...)
}

// ErrPodGone is wrapped by the writers' error when the pod no longer exists:
// the API server answered 404, or the pod was deleted and re-created with the
// same name (a different UID). When the cause is a 404, the error also wraps
// the API error, so apierrors.IsNotFound holds as well. Callers usually log
// and move on.
var ErrPodGone = errors.New("pod is gone")

// IsTerminalPhase reports whether phase is Failed or Succeeded.
func IsTerminalPhase(phase corev1.PodPhase) bool {
	return phase == corev1.PodFailed || phase == corev1.PodSucceeded
}

// EnsurePodCondition makes pod have condition c (see Set for how
// lastTransitionTime, lastProbeTime and observedGeneration are handled).
//
// When pod already has it (same status, reason and message), no API call is
// made and changed is false. Otherwise one strategic merge patch goes to the
// pod's status subresource with just that condition and the pod's uid and
// resourceVersion as preconditions; on 409 Conflict the pod is read again and
// the change recomputed, up to retry.DefaultRetry times. now (nil means
// metav1.Now) is read once per attempt. pod is not modified.
//
// The error wraps ErrPodGone when the pod no longer exists.
func EnsurePodCondition(ctx context.Context, c PodPatcher, pod *corev1.Pod, cond corev1.PodCondition, now func() metav1.Time) (changed bool, err error) {
	written, err := EnsurePodConditions(ctx, c, pod, now, cond)
	return len(written) > 0, err
}

// EnsurePodConditions is EnsurePodCondition for several conditions in one write: the
// patch carries those of conds the pod does not have as wanted (of two of the same type,
// the first), and written lists their types (none: no API call was made). Retries, now
// and errors are as for EnsurePodCondition.
func EnsurePodConditions(ctx context.Context, c PodPatcher, pod *corev1.Pod, now func() metav1.Time, conds ...corev1.PodCondition) (written []corev1.PodConditionType, err error) {
	for _, cond := range conds {
		if cond.Type == "" {
			return nil, errors.New("conditions: condition type is empty")
		}
	}
	var changedTypes []corev1.PodConditionType
	ok, err := write(ctx, c, pod, func(cur *corev1.Pod) ([]byte, error) {
		t := clock(now)()
		status := cur.Status.DeepCopy()
		changedTypes = changedTypes[:0]
		for _, cond := range conds {
			if containsType(changedTypes, cond.Type) {
				continue
			}
			if Set(status, cond, t) {
				changedTypes = append(changedTypes, cond.Type)
			}
		}
		if len(changedTypes) == 0 {
			return nil, nil
		}
		return json.Marshal(newStatusPatch(cur, "", status, changedTypes))
	}, types.StrategicMergePatchType, "status")
	if !ok {
		return nil, err
	}
	return changedTypes, err
}

// EnsurePodPhase moves pod to the terminal phase (Failed or Succeeded), with
// conds set in the same write, unless the pod's phase is already terminal:
// the kubelet's word wins, so then nothing at all is written (not the
// conditions either) and changed is false. This also holds when the kubelet
// writes between coroner's read and write: the resourceVersion precondition
// turns that into a conflict, the pod is read again and found terminal.
//
// The write is one strategic merge patch to the status subresource carrying
// status.phase and only those of conds that change (a condition that is
// already as wanted is not sent); retries, now and errors are as for
// EnsurePodCondition. A phase other than Failed or Succeeded is an error and
// nothing is read or written.
func EnsurePodPhase(ctx context.Context, c PodPatcher, pod *corev1.Pod, phase corev1.PodPhase, now func() metav1.Time, conds ...corev1.PodCondition) (changed bool, err error) {
	return EnsurePodPhaseWithStatuses(ctx, c, pod, phase, nil, now, conds...)
}

// ContainerStatusesFunc computes, against the pod as it is at each attempt, the init and
// app container status lists to write with a terminal phase; changed false: none.
type ContainerStatusesFunc func(cur *corev1.Pod) (init, app []corev1.ContainerStatus, changed bool)

// EnsurePodPhaseWithStatuses is EnsurePodPhase that also writes the container statuses
// statuses computes (nil: none), in the same patch. Container statuses have no merge key
// in a strategic merge patch: a list sent replaces the stored one, which the
// resourceVersion precondition makes safe (statuses computed it from that version), and a
// list equal to the stored one is not sent.
func EnsurePodPhaseWithStatuses(ctx context.Context, c PodPatcher, pod *corev1.Pod, phase corev1.PodPhase, statuses ContainerStatusesFunc, now func() metav1.Time, conds ...corev1.PodCondition) (changed bool, err error) {
	if !IsTerminalPhase(phase) {
		return false, fmt.Errorf("conditions: EnsurePodPhase sets only a terminal phase, not %q", phase)
	}
	for _, cond := range conds {
		if cond.Type == "" {
			return false, errors.New("conditions: condition type is empty")
		}
	}
	return write(ctx, c, pod, func(cur *corev1.Pod) ([]byte, error) {
		if IsTerminalPhase(cur.Status.Phase) {
			return nil, nil
		}
		t := clock(now)()
		status := cur.Status.DeepCopy()
		var changedTypes []corev1.PodConditionType
		for _, cond := range conds {
			if Set(status, cond, t) && !containsType(changedTypes, cond.Type) {
				changedTypes = append(changedTypes, cond.Type)
			}
		}
		patch := newStatusPatch(cur, phase, status, changedTypes)
		if statuses != nil {
			if init, app, ok := statuses(cur); ok {
				if !equalStatuses(init, cur.Status.InitContainerStatuses) {
					patch.Status.InitContainerStatuses = init
				}
				if !equalStatuses(app, cur.Status.ContainerStatuses) {
					patch.Status.ContainerStatuses = app
				}
			}
		}
		return json.Marshal(patch)
	}, types.StrategicMergePatchType, "status")
}

func equalStatuses(a, b []corev1.ContainerStatus) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return len(a) == len(b) && string(x) == string(y)
}

// EnsurePodAnnotation makes pod carry annotation key=value. When it already
// does, no API call is made. Otherwise one JSON merge patch goes to the pod's
// status subresource (which stores metadata changes too, and is all the agent
// may patch) with just that annotation and the pod's uid and resourceVersion as
// preconditions; conflicts, retries and errors are as for EnsurePodCondition.
func EnsurePodAnnotation(ctx context.Context, c PodPatcher, pod *corev1.Pod, key, value string) (changed bool, err error) {
	if key == "" {
		return false, errors.New("conditions: annotation key is empty")
	}
	return write(ctx, c, pod, func(cur *corev1.Pod) ([]byte, error) {
		if v, ok := cur.Annotations[key]; ok && v == value {
			return nil, nil
		}
		return json.Marshal(podPatch{Metadata: preconditions(cur, map[string]string{key: value})})
	}, types.MergePatchType, "status")
}

// write is the write discipline shared by the Ensure functions. compute gets
// the pod as last known (first the caller's, after a conflict a fresh read)
// and returns the patch to send, or nil when nothing is to be written.
func write(ctx context.Context, c PodPatcher, pod *corev1.Pod, compute func(cur *corev1.Pod) ([]byte, error), pt types.PatchType, subresources ...string) (bool, error) {
	if pod == nil {
		return false, errors.New("conditions: pod is nil")
	}
	cur := pod
	// Without a resourceVersion there is no precondition: read first.
	read := pod.ResourceVersion == ""
	written := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if read {
			fresh, err := c.GetPod(ctx, pod.Namespace, pod.Name)
			if apierrors.IsNotFound(err) {
				return gone(pod, err)
			}
			if err != nil {
				return err
			}
			if pod.UID != "" && fresh.UID != pod.UID {
				return gone(pod, nil)
			}
			cur = fresh
		}
		read = true
		if cur.ResourceVersion == "" {
			return errors.New("pod has no resourceVersion; refusing to write without a precondition")
		}
		data, err := compute(cur)
		if err != nil || data == nil {
			return err
		}
		if _, err := c.PatchPod(ctx, pod.Namespace, pod.Name, pt, data, subresources...); err != nil {
			if apierrors.IsNotFound(err) {
				return gone(pod, err)
			}
			return err // a Conflict is retried by RetryOnConflict
		}
		written = true
		return nil
	})
	if err != nil && !errors.Is(err, ErrPodGone) {
		err = fmt.Errorf("conditions: writing pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return written, err
}

func gone(pod *corev1.Pod, cause error) error {
	if cause == nil {
		return fmt.Errorf("conditions: pod %s/%s (uid %s): %w", pod.Namespace, pod.Name, pod.UID, ErrPodGone)
	}
	return fmt.Errorf("conditions: pod %s/%s: %w: %w", pod.Namespace, pod.Name, ErrPodGone, cause)
}

func clock(now func() metav1.Time) func() metav1.Time {
	if now == nil {
		return metav1.Now
	}
	return now
}

func containsType(types []corev1.PodConditionType, t corev1.PodConditionType) bool {
	for _, x := range types {
		if x == t {
			return true
		}
	}
	return false
}

// podPatch is the body of every patch the writers send. metadata.uid and
// metadata.resourceVersion are preconditions: the API server applies the
// patch to the stored pod, and its optimistic-concurrency check
// (k8s.io/apiserver registry/generic/registry/store.go, Update) then finds
// the patched object's resourceVersion different from the stored one and
// answers 409 Conflict, for JSON merge and strategic merge patches alike; a
// different uid (a re-created pod) also fails that check first, since a new
// pod has a new resourceVersion. The same holds on the status subresource,
// whose strategy resets the spec, not the resourceVersion.
type podPatch struct {
	Metadata metaPatch    `json:"metadata"`
	Status   *statusPatch `json:"status,omitempty"`
}

type metaPatch struct {
	Annotations     map[string]string `json:"annotations,omitempty"`
	ResourceVersion string            `json:"resourceVersion"`
	UID             types.UID         `json:"uid,omitempty"`
}

type statusPatch struct {
	Phase corev1.PodPhase `json:"phase,omitempty"`
	// Conditions merge by type (patchMergeKey=type, patchStrategy=merge on
	// PodStatus.Conditions): the server replaces the fields sent in the
	// listed conditions and keeps every other condition as it is.
	Conditions []conditionPatch `json:"conditions,omitempty"`
	// InitContainerStatuses and ContainerStatuses, when sent, replace the stored lists
	// (no merge key): see EnsurePodPhaseWithStatuses.
	InitContainerStatuses []corev1.ContainerStatus `json:"initContainerStatuses,omitempty"`
	ContainerStatuses     []corev1.ContainerStatus `json:"containerStatuses,omitempty"`
}

// conditionPatch is a PodCondition as sent: zero times and observedGeneration
// are left out (so the stored values stay, as Set keeps them), reason and
// message are always sent (so an empty one clears the stored one).
type conditionPatch struct {
	Type               corev1.PodConditionType `json:"type"`
	ObservedGeneration int64                   `json:"observedGeneration,omitempty"`
	Status             corev1.ConditionStatus  `json:"status"`
	LastProbeTime      *metav1.Time            `json:"lastProbeTime,omitempty"`
	LastTransitionTime *metav1.Time            `json:"lastTransitionTime,omitempty"`
	Reason             string                  `json:"reason"`
	Message            string                  `json:"message"`
}

func preconditions(pod *corev1.Pod, annotations map[string]string) metaPatch {
	return metaPatch{Annotations: annotations, ResourceVersion: pod.ResourceVersion, UID: pod.UID}
}

// newStatusPatch returns the patch setting phase (if not empty) and the
// conditions of the given types as they are in status.
func newStatusPatch(pod *corev1.Pod, phase corev1.PodPhase, status *corev1.PodStatus, changed []corev1.PodConditionType) podPatch {
	sp := &statusPatch{Phase: phase}
	for _, t := range changed {
		c := Find(status, t)
		cp := conditionPatch{
			Type:               c.Type,
			ObservedGeneration: c.ObservedGeneration,
			Status:             c.Status,
			Reason:             c.Reason,
			Message:            c.Message,
		}
		if !c.LastProbeTime.IsZero() {
			cp.LastProbeTime = &c.LastProbeTime
		}
		if !c.LastTransitionTime.IsZero() {
			cp.LastTransitionTime = &c.LastTransitionTime
		}
		sp.Conditions = append(sp.Conditions, cp)
	}
	return podPatch{Metadata: preconditions(pod, nil), Status: sp}
}
