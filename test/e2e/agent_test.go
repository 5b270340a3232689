package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/images"
)

// A container restarted in place (restartPolicy OnFailure) leaves no failed pod behind:
// the agent records each exit in the coroner.dev/exit-history annotation, written with
// its own node-bound credentials through pods/status (all its RBAC allows).
func TestExitHistoryOfARestartingPod(t *testing.T) {
	t.Parallel()
	ctx, ns := setup(t, 2*time.Minute)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "restarting", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: quietNode, RestartPolicy: corev1.RestartPolicyOnFailure, TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "main", Image: images.BusyboxName, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "sleep 1; exit 3"}}},
		},
	}
	if _, err := suite.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := waitPod(ctx, t, ns, p.Name, "two exits in its exit history", 90*time.Second, func(p *corev1.Pod) bool {
		return p != nil && strings.Count(p.Annotations[conditions.AnnotationExitHistory], `"exitCode":3`) >= 2
	})
	h := got.Annotations[conditions.AnnotationExitHistory]
	if !strings.Contains(h, `"container":"main"`) || !strings.Contains(h, `"restartCount":0`) || !strings.Contains(h, `"restartCount":1`) {
		t.Errorf("exit history %s, want exits of container main with restart counts 0 and 1", h)
	}
	if got.Status.Phase == corev1.PodFailed {
		t.Errorf("the pod failed; restartPolicy OnFailure should restart it in place")
	}
}
