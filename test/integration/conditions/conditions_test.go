// Package conditions_test exercises coroner's pod writers (package conditions) against a
// real kube-apiserver: the precondition, the retry on conflict, the no-op and the rule
// that a terminal phase written by the kubelet is never overwritten.
package conditions_test

import (
	"context"
	"errors"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/wrappers"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

func newPod(t *testing.T) (kubernetes.Interface, *corev1.Pod) {
	t.Helper()
	env := harness.Shared(t)
	client := kubernetes.NewForConfigOrDie(env.Config)
	ns := env.Namespace(t)
	pod, err := client.CoreV1().Pods(ns).Create(context.Background(), wrappers.MakePod("p", ns).Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod: %v", err)
	}
	return client, pod
}

var disruption = corev1.PodCondition{
	Type:    conditions.DisruptionTarget,
	Status:  corev1.ConditionTrue,
	Reason:  conditions.ReasonNodeOOMKill,
	Message: "the node ran out of memory",
}

func TestEnsurePodConditionWritesOnceAndSurvivesAStaleCache(t *testing.T) {
	client, pod := newPod(t)
	ctx := context.Background()
	patcher := conditions.NewPodPatcher(client, "coroner-test")

	// Someone else (the kubelet, say) writes a condition after our cache copy was taken.
	fresh := pod.DeepCopy()
	fresh.Status.Conditions = append(fresh.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable"})
	if _, err := client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, fresh, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("concurrent status write: %v", err)
	}

	changed, err := conditions.EnsurePodCondition(ctx, patcher, pod /* stale */, disruption, nil)
	if err != nil || !changed {
		t.Fatalf("EnsurePodCondition on a stale copy = (%v, %v), want (true, nil) after a retry", changed, err)
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := conditions.Find(&got.Status, conditions.DisruptionTarget); c == nil || c.Reason != conditions.ReasonNodeOOMKill || c.Status != corev1.ConditionTrue {
		t.Errorf("DisruptionTarget = %+v, want True/%s", c, conditions.ReasonNodeOOMKill)
	}
	if c := conditions.Find(&got.Status, corev1.PodScheduled); c == nil || c.Reason != "Unschedulable" {
		t.Errorf("the other writer's condition was lost: PodScheduled = %+v", c)
	}

	// The same condition again is a no-op: no write, resourceVersion unchanged.
	changed, err = conditions.EnsurePodCondition(ctx, patcher, got, disruption, nil)
	if err != nil || changed {
		t.Fatalf("second EnsurePodCondition = (%v, %v), want (false, nil)", changed, err)
	}
	again, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != got.ResourceVersion {
		t.Errorf("resourceVersion moved from %s to %s: a no-op wrote", got.ResourceVersion, again.ResourceVersion)
	}
}

func TestEnsurePodPhaseNeverOverwritesTheKubelet(t *testing.T) {
	client, pod := newPod(t)
	ctx := context.Background()
	patcher := conditions.NewPodPatcher(client, "coroner-test")

	// The kubelet marks the pod Succeeded after our cache copy (phase Pending) was taken.
	kubelet := pod.DeepCopy()
	kubelet.Status.Phase = corev1.PodSucceeded
	if _, err := client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, kubelet, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("kubelet status write: %v", err)
	}
	changed, err := conditions.EnsurePodPhase(ctx, patcher, pod /* stale */, corev1.PodFailed, nil, disruption)
	if err != nil || changed {
		t.Fatalf("EnsurePodPhase over a terminal phase = (%v, %v), want (false, nil)", changed, err)
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodSucceeded || conditions.Find(&got.Status, conditions.DisruptionTarget) != nil {
		t.Errorf("phase %s, DisruptionTarget %v: want the kubelet's Succeeded untouched", got.Status.Phase, conditions.Find(&got.Status, conditions.DisruptionTarget))
	}
}

func TestEnsurePodPhaseSetsPhaseAndConditionInOneWrite(t *testing.T) {
	client, pod := newPod(t)
	ctx := context.Background()
	changed, err := conditions.EnsurePodPhase(ctx, conditions.NewPodPatcher(client, "coroner-test"), pod, corev1.PodFailed, nil, disruption)
	if err != nil || !changed {
		t.Fatalf("EnsurePodPhase = (%v, %v), want (true, nil)", changed, err)
	}
	got, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodFailed || !conditions.IsTrue(&got.Status, conditions.DisruptionTarget) {
		t.Errorf("phase %s, conditions %+v; want Failed with DisruptionTarget", got.Status.Phase, got.Status.Conditions)
	}
}

func TestWritersReportAGonePod(t *testing.T) {
	client, pod := newPod(t)
	ctx := context.Background()
	if err := client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	patcher := conditions.NewPodPatcher(client, "coroner-test")
	if _, err := conditions.EnsurePodCondition(ctx, patcher, pod, disruption, nil); !errors.Is(err, conditions.ErrPodGone) {
		t.Errorf("EnsurePodCondition on a deleted pod: err = %v, want ErrPodGone", err)
	}
	if _, err := conditions.EnsurePodAnnotation(ctx, patcher, pod, conditions.AnnotationExitHistory, "[]"); !errors.Is(err, conditions.ErrPodGone) {
		t.Errorf("EnsurePodAnnotation on a deleted pod: err = %v, want ErrPodGone", err)
	}
}
