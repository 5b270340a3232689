// Package wrappers has fluent builders for the Kubernetes objects that
// coroner's tests make: Pods, Jobs and podFailurePolicy rules.
//
// Each builder wraps the object it builds; every method changes that object
// and returns the builder, and Obj returns a pointer to the object itself,
// not a copy. Nothing is defaulted behind the caller's back beyond what the
// Make functions document.
package wrappers

import (
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodWrapper builds a Pod.
type PodWrapper struct {
	corev1.Pod

	// lastExit is the terminated state written by the latest ExitedContainer
	// or InitContainerExited call, for FinishedAt.
	lastExit *corev1.ContainerStateTerminated
}

// MakePod returns a builder for a Pod with the given name and namespace, a
// spec of one container named "main" (image "busybox:local", never pulled)
// and restartPolicy Never, and an empty status.
func MakePod(name, ns string) *PodWrapper {
	return &PodWrapper{Pod: corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{defaultContainer()},
		},
	}}
}

// Obj returns the built Pod.
func (w *PodWrapper) Obj() *corev1.Pod {
	return &w.Pod
}

// Label sets a label.
func (w *PodWrapper) Label(k, v string) *PodWrapper {
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	w.Labels[k] = v
	return w
}

// Annotation sets an annotation.
func (w *PodWrapper) Annotation(k, v string) *PodWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[k] = v
	return w
}

// ControlledBy makes job the pod's controller, with the owner reference a Job
// controller gives its pods (blockOwnerDeletion set).
func (w *PodWrapper) ControlledBy(job *batchv1.Job) *PodWrapper {
	w.OwnerReferences = append(w.OwnerReferences, *metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job")))
	return w
}

// Finalizer adds a finalizer.
func (w *PodWrapper) Finalizer(f string) *PodWrapper {
	w.Finalizers = append(w.Finalizers, f)
	return w
}

// Index sets the completion index of an Indexed Job's pod, as both the
// label and the annotation batch.kubernetes.io/job-completion-index.
func (w *PodWrapper) Index(i int) *PodWrapper {
	s := strconv.Itoa(i)
	return w.Label(batchv1.JobCompletionIndexAnnotation, s).
		Annotation(batchv1.JobCompletionIndexAnnotation, s)
}

// Phase sets status.phase.
func (w *PodWrapper) Phase(p corev1.PodPhase) *PodWrapper {
	w.Status.Phase = p
	return w
}

// Condition sets the status of the pod condition of type t, adding the
// condition if the pod does not have it yet.
func (w *PodWrapper) Condition(t corev1.PodConditionType, s corev1.ConditionStatus) *PodWrapper {
	for i := range w.Status.Conditions {
		if w.Status.Conditions[i].Type == t {
			w.Status.Conditions[i].Status = s
			return w
		}
	}
	w.Status.Conditions = append(w.Status.Conditions, corev1.PodCondition{Type: t, Status: s})
	return w
}

// ExitedContainer records that the app container name has terminated with
// the exit code, with reason "Completed" for 0 and "Error" otherwise, as the
// kubelet reports it. It replaces any earlier status of that container. Only
// the status is written; the spec is left alone.
func (w *PodWrapper) ExitedContainer(name string, code int32) *PodWrapper {
	w.lastExit = exited(code)
	w.Status.ContainerStatuses = setState(w.Status.ContainerStatuses, name,
		corev1.ContainerState{Terminated: w.lastExit})
	return w
}

// InitContainerExited is ExitedContainer for the init container name.
func (w *PodWrapper) InitContainerExited(name string, code int32) *PodWrapper {
	w.lastExit = exited(code)
	w.Status.InitContainerStatuses = setState(w.Status.InitContainerStatuses, name,
		corev1.ContainerState{Terminated: w.lastExit})
	return w
}

// FinishedAt sets the finish time of the container recorded by the latest
// ExitedContainer or InitContainerExited call, so that
// ExitedContainer("a", 1).FinishedAt(t1).ExitedContainer("b", 2).FinishedAt(t2)
// gives each container its own time. It panics if no exit was recorded yet.
func (w *PodWrapper) FinishedAt(t time.Time) *PodWrapper {
	if w.lastExit == nil {
		panic("wrappers: FinishedAt called before ExitedContainer or InitContainerExited")
	}
	w.lastExit.FinishedAt = metav1.NewTime(t)
	return w
}

// RunningContainer records that the app container name is running. It
// replaces any earlier status of that container.
func (w *PodWrapper) RunningContainer(name string) *PodWrapper {
	w.Status.ContainerStatuses = setState(w.Status.ContainerStatuses, name,
		corev1.ContainerState{Running: &corev1.ContainerStateRunning{}})
	return w
}

// WaitingContainer records that the app container name is waiting with the
// given reason (for example "ContainerCreating"). It replaces any earlier
// status of that container.
func (w *PodWrapper) WaitingContainer(name, reason string) *PodWrapper {
	w.Status.ContainerStatuses = setState(w.Status.ContainerStatuses, name,
		corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}})
	return w
}

func exited(code int32) *corev1.ContainerStateTerminated {
	reason := "Error"
	if code == 0 {
		reason = "Completed"
	}
	return &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason}
}

// setState sets the state of the named container in statuses, appending a
// status for it if there is none.
func setState(statuses []corev1.ContainerStatus, name string, st corev1.ContainerState) []corev1.ContainerStatus {
	for i := range statuses {
		if statuses[i].Name == name {
			statuses[i].State = st
			return statuses
		}
	}
	return append(statuses, corev1.ContainerStatus{Name: name, State: st})
}
