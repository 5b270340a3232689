package wrappers

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Default pod template values of MakeJob and MakePod.
const (
	DefaultContainerName = "main"
	DefaultImage         = "busybox:local"
)

func defaultContainer() corev1.Container {
	return corev1.Container{
		Name:            DefaultContainerName,
		Image:           DefaultImage,
		ImagePullPolicy: corev1.PullNever,
	}
}

// JobWrapper builds a batch/v1 Job.
type JobWrapper struct {
	batchv1.Job
}

// MakeJob returns a builder for a Job with the given name and namespace and
// a pod template of one container named "main" (image "busybox:local",
// never pulled) with restartPolicy Never. Every other field is left unset,
// so the API server's defaults apply when the Job is created.
func MakeJob(name, ns string) *JobWrapper {
	return &JobWrapper{Job: batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{defaultContainer()},
				},
			},
		},
	}}
}

// Obj returns the built Job.
func (w *JobWrapper) Obj() *batchv1.Job {
	return &w.Job
}

// ManagedBy sets spec.managedBy, for example "coroner.dev/shim".
func (w *JobWrapper) ManagedBy(s string) *JobWrapper {
	w.Spec.ManagedBy = &s
	return w
}

// Indexed sets spec.completionMode to Indexed.
func (w *JobWrapper) Indexed() *JobWrapper {
	w.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	return w
}

// Completions sets spec.completions.
func (w *JobWrapper) Completions(n int32) *JobWrapper {
	w.Spec.Completions = &n
	return w
}

// Parallelism sets spec.parallelism.
func (w *JobWrapper) Parallelism(n int32) *JobWrapper {
	w.Spec.Parallelism = &n
	return w
}

// BackoffLimit sets spec.backoffLimit.
func (w *JobWrapper) BackoffLimit(n int32) *JobWrapper {
	w.Spec.BackoffLimit = &n
	return w
}

// BackoffLimitPerIndex sets spec.backoffLimitPerIndex.
func (w *JobWrapper) BackoffLimitPerIndex(n int32) *JobWrapper {
	w.Spec.BackoffLimitPerIndex = &n
	return w
}

// MaxFailedIndexes sets spec.maxFailedIndexes.
func (w *JobWrapper) MaxFailedIndexes(n int32) *JobWrapper {
	w.Spec.MaxFailedIndexes = &n
	return w
}

// PodFailurePolicy sets spec.podFailurePolicy to the given rules, in order.
func (w *JobWrapper) PodFailurePolicy(rules ...*RuleWrapper) *JobWrapper {
	w.Spec.PodFailurePolicy = Policy(rules...)
	return w
}

// RestartPolicy sets the pod template's restartPolicy.
func (w *JobWrapper) RestartPolicy(p corev1.RestartPolicy) *JobWrapper {
	w.Spec.Template.Spec.RestartPolicy = p
	return w
}

// Image sets the image of the template's first container.
func (w *JobWrapper) Image(image string) *JobWrapper {
	w.Spec.Template.Spec.Containers[0].Image = image
	return w
}

// Command sets the command of the template's first container.
func (w *JobWrapper) Command(cmd ...string) *JobWrapper {
	w.Spec.Template.Spec.Containers[0].Command = cmd
	return w
}
