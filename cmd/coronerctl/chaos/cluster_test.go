package chaos

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/util/flowcontrol"
)

// fakePod is a running pod bound to node, with a UID from its name, changed by the mods.
func fakePod(namespace, name, node string, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "busybox"}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

// withCPU gives the pod's first container a cpu request.
func withCPU(cpu string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}
	}
}

// withPriority sets the pod's resolved priority.
func withPriority(prio int32) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Priority = &prio }
}

// withPhase sets the pod's phase.
func withPhase(phase corev1.PodPhase) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Phase = phase }
}

func TestPodFate(t *testing.T) {
	cases := []struct {
		name string
		cur  *corev1.Pod
		want string
	}{
		{"gone", nil, "gone"},
		{"running", fakePod("default", "a", "n"), ""},
		{"pending", fakePod("default", "a", "n", withPhase(corev1.PodPending)), ""},
		{"failed", fakePod("default", "a", "n", withPhase(corev1.PodFailed)), "terminated, phase Failed"},
		{"succeeded", fakePod("default", "a", "n", withPhase(corev1.PodSucceeded)), "terminated, phase Succeeded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := podFate(tc.cur); got != tc.want {
				t.Errorf("podFate = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNodePodsFiltersByNode(t *testing.T) {
	// The fake clientset ignores field selectors: nodePods must still keep only the node's.
	cs := fake.NewClientset(
		fakePod("default", "here", "lab-node-2"),
		fakePod("other", "here-too", "lab-node-2"),
		fakePod("default", "there", "lab-node-3"),
		fakePod("default", "pending", ""),
	)
	pods, err := nodePods(context.Background(), cs, "lab-node-2")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for i := range pods {
		got[podNsName(&pods[i])] = true
	}
	if len(got) != 2 || !got["default/here"] || !got["other/here-too"] {
		t.Errorf("nodePods = %v, want default/here and other/here-too", got)
	}
}

// deadlinePassed is a context in the state a timed-out context is in for a moment: its
// deadline has passed but Go has not closed its Done channel yet (that happens in a
// goroutine of its own, after the timer fired).
type deadlinePassed struct{ context.Context }

func (deadlinePassed) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestPollAPIChecksWithoutTheWaitsDeadline is the cause of TestPreemptFails/never_scheduled's
// flakes (test/integration/chaos): a poll tick falling on the wait's deadline ran the check
// in that moment, and the client's rate limiter refused its request with an error that is
// no context error, which the wait then reported instead of its timeout. The check's
// context must not carry the wait's deadline.
func TestPollAPIChecksWithoutTheWaitsDeadline(t *testing.T) {
	limiter := flowcontrol.NewTokenBucketRateLimiter(200, 400) // the integration tests' client
	ctx := deadlinePassed{context.Background()}
	if err := limiter.Wait(ctx); err == nil || !strings.Contains(err.Error(), "would exceed context deadline") {
		t.Fatalf("the premise: the limiter refuses with the deadline passed, got %v", err)
	}
	calls := 0
	err := pollAPI(ctx, func(rctx context.Context) (bool, error) {
		calls++
		if _, ok := rctx.Deadline(); ok {
			t.Error("the check's context has the wait's deadline")
		}
		return true, limiter.Wait(rctx)
	})
	if err != nil || calls != 1 {
		t.Fatalf("pollAPI = %v after %d checks, want nil after 1", err, calls)
	}
}

// TestPollAPITimeoutIsTheContexts: once the wait's context has ended, pollAPI says so, whatever
// the check's last error was.
func TestPollAPITimeoutIsTheContexts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := pollAPI(ctx, func(context.Context) (bool, error) {
		<-ctx.Done()
		return false, errors.New("client rate limiter Wait returned an error")
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("pollAPI = %v, want the context's deadline error", err)
	}
}
