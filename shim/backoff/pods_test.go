package backoff

import (
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// t0 is the fixed "now" of the tests; times are written as offsets from it.
var t0 = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// podWrapper builds test pods fluently.
type podWrapper struct{ corev1.Pod }

func pod() *podWrapper {
	return &podWrapper{corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}}
}

func (w *podWrapper) name(n string) *podWrapper { w.Name = n; return w }

func (w *podWrapper) created(t time.Time) *podWrapper {
	w.CreationTimestamp = metav1.NewTime(t)
	return w
}

func (w *podWrapper) deleted(t time.Time, graceSeconds *int64) *podWrapper {
	w.DeletionTimestamp = ptr.To(metav1.NewTime(t))
	w.DeletionGracePeriodSeconds = graceSeconds
	return w
}

func (w *podWrapper) ready(status corev1.ConditionStatus, t time.Time) *podWrapper {
	w.Status.Conditions = append(w.Status.Conditions, corev1.PodCondition{
		Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.NewTime(t),
	})
	return w
}

func terminatedAt(t time.Time) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: metav1.NewTime(t)}}
}

var (
	running = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	waiting = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
)

// containers adds app containers with the given states.
func (w *podWrapper) containers(states ...corev1.ContainerState) *podWrapper {
	for i, s := range states {
		name := "c" + strconv.Itoa(i)
		w.Spec.Containers = append(w.Spec.Containers, corev1.Container{Name: name})
		w.Status.ContainerStatuses = append(w.Status.ContainerStatuses, corev1.ContainerStatus{Name: name, State: s})
	}
	return w
}

// initContainer adds an init container, a sidecar when sidecar is set.
func (w *podWrapper) initContainer(name string, sidecar bool, s corev1.ContainerState) *podWrapper {
	c := corev1.Container{Name: name}
	if sidecar {
		c.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	}
	w.Spec.InitContainers = append(w.Spec.InitContainers, c)
	w.Status.InitContainerStatuses = append(w.Status.InitContainerStatuses, corev1.ContainerStatus{Name: name, State: s})
	return w
}

func (w *podWrapper) annotation(k, v string) *podWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[k] = v
	return w
}

func (w *podWrapper) failureCount(v string) *podWrapper {
	return w.annotation(batchv1.JobIndexFailureCountAnnotation, v)
}

func (w *podWrapper) ignoredFailureCount(v string) *podWrapper {
	return w.annotation(batchv1.JobIndexIgnoredFailureCountAnnotation, v)
}

func (w *podWrapper) obj() *corev1.Pod { return &w.Pod }

// finishedAt is a pod whose only container finished at t.
func finishedAt(t time.Time) *corev1.Pod {
	return pod().created(t0.Add(-time.Hour)).containers(terminatedAt(t)).obj()
}
