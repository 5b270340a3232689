package lab

import (
	"context"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/test/images"
)

// WaitOptIn waits until a Job created in namespace ns without managedBy (a server-side
// dry run: nothing is stored) comes back with managedBy ManagedBy (want true) or without
// one (want false), and returns how long that took. The API server's admission plugin
// reads policies, bindings and namespace labels through informers: a namespace labelled
// coroner.dev/jobs=managed a moment ago may still be seen without its label, and a Job
// created then stays with the built-in controller (an e2e run on a loaded machine: 0.3 s
// after the label, managedBy was empty).
func WaitOptIn(ctx context.Context, cs kubernetes.Interface, ns string, want bool, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	probe := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "opt-in-probe"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "c", Image: images.BusyboxName}},
		}}},
	}
	var last string
	err := Poll(ctx, timeout, fmt.Sprintf("a Job in namespace %s to come back handed to coroner: %v", ns, want), func() (bool, error) {
		j, err := cs.BatchV1().Jobs(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("managedBy %q", ptr.Deref(j.Spec.ManagedBy, ""))
		return (ptr.Deref(j.Spec.ManagedBy, "") == ManagedBy) == want, nil
	})
	if err != nil {
		return time.Since(start), fmt.Errorf("%w (last: %s)", err, last)
	}
	return time.Since(start), nil
}
