package chaos

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ownedBy makes the pod controlled by an object of the kind.
func ownedBy(apiVersion, kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: "owner", UID: "owner-uid", Controller: ptr.To(true)}}
	}
}

// asMirror makes the pod a static pod's mirror.
func asMirror(p *corev1.Pod) {
	p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "hash"}
}

// asDeleting gives the pod a deletionTimestamp.
func asDeleting(p *corev1.Pod) {
	p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
}

func TestPlanDrain(t *testing.T) {
	cases := []struct {
		name string
		pod  *corev1.Pod
		want drainAction
	}{
		{"bare pod", fakePod("default", "a", "n"), drainEvict},
		{"ReplicaSet pod", fakePod("default", "a", "n", ownedBy("apps/v1", "ReplicaSet")), drainEvict},
		{"Job pod", fakePod("default", "a", "n", ownedBy("batch/v1", "Job")), drainEvict},
		{"DaemonSet pod", fakePod("default", "a", "n", ownedBy("apps/v1", "DaemonSet")), drainLeaveDaemonSet},
		{"another group's DaemonSet", fakePod("default", "a", "n", ownedBy("example.com/v1", "DaemonSet")), drainEvict},
		{"mirror pod", fakePod("kube-system", "a", "n", asMirror), drainLeaveMirror},
		{"succeeded pod", fakePod("default", "a", "n", withPhase(corev1.PodSucceeded)), drainSkipTerminal},
		{"failed pod", fakePod("default", "a", "n", withPhase(corev1.PodFailed)), drainSkipTerminal},
		{"pending pod", fakePod("default", "a", "n", withPhase(corev1.PodPending)), drainEvict},
		{"pod being deleted", fakePod("default", "a", "n", asDeleting), drainAwait},
		{"failed DaemonSet pod", fakePod("default", "a", "n", ownedBy("apps/v1", "DaemonSet"), withPhase(corev1.PodFailed)), drainLeaveDaemonSet},
		{"failed pod being deleted", fakePod("default", "a", "n", asDeleting, withPhase(corev1.PodFailed)), drainSkipTerminal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			steps := planDrain([]corev1.Pod{*tc.pod})
			if len(steps) != 1 {
				t.Fatalf("planDrain gave %d steps, want 1", len(steps))
			}
			if steps[0].action != tc.want {
				t.Errorf("action = %d, want %d", steps[0].action, tc.want)
			}
		})
	}
}
