package chaos

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/coroner-dev/coroner/conditions"
)

var podResource = corev1.SchemeGroupVersion.WithResource("pods")

// fastClusterTimings shortens the retry and poll intervals for the test.
func fastClusterTimings(t *testing.T) {
	t.Helper()
	retry, poll := evictRetryInterval, apiPollInterval
	evictRetryInterval, apiPollInterval = 10*time.Millisecond, 2*time.Millisecond
	t.Cleanup(func() { evictRetryInterval, apiPollInterval = retry, poll })
}

// fakeNode is a node with a hostname label and the allocatable cpu.
func fakeNode(name, cpu string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourcePods: resource.MustParse("110"),
		}},
	}
}

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

// fakeEvictions makes the fake clientset answer evictions as the API server does, with
// knobs: refuse[name] evictions of a pod are answered 429 first, fail[name] answers with that
// error; an accepted eviction adds DisruptionTarget (EvictionByEvictionAPI) and a
// deletionTimestamp and deletes the pod after deleteAfter (never when negative), or, when
// finish is set, moves it to phase Failed instead.
type fakeEvictions struct {
	cs          *fake.Clientset
	refuse      map[string]int
	fail        map[string]error
	deleteAfter time.Duration
	finish      bool

	mu       sync.Mutex
	requests []string // namespace/name of every eviction request, in order
	timers   []*time.Timer
}

// install prepends the eviction reactor to the clientset and stops its timers at cleanup.
func (f *fakeEvictions) install(t *testing.T) {
	t.Helper()
	f.cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		return true, nil, f.evict(a.GetNamespace(), ev.Name)
	})
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, tm := range f.timers {
			tm.Stop()
		}
	})
}

// evict answers one eviction request.
func (f *fakeEvictions) evict(ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, ns+"/"+name)
	if err := f.fail[name]; err != nil {
		return err
	}
	if f.refuse[name] > 0 {
		f.refuse[name]--
		return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	}
	tracker := f.cs.Tracker()
	obj, err := tracker.Get(podResource, ns, name)
	if err != nil {
		return err
	}
	pod := obj.(*corev1.Pod).DeepCopy()
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{
		Type: conditions.DisruptionTarget, Status: corev1.ConditionTrue, Reason: conditions.ReasonEvictionByEvictionAPI,
	})
	if f.finish {
		pod.Status.Phase = corev1.PodFailed
	} else {
		pod.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	}
	if err := tracker.Update(podResource, pod, ns); err != nil {
		return err
	}
	switch {
	case f.finish || f.deleteAfter < 0:
	case f.deleteAfter == 0:
		return tracker.Delete(podResource, ns, name)
	default:
		f.timers = append(f.timers, time.AfterFunc(f.deleteAfter, func() { _ = tracker.Delete(podResource, ns, name) }))
	}
	return nil
}

// evictionRequests returns the eviction requests so far.
func (f *fakeEvictions) evictionRequests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// fakeHasPod reports whether the fake holds the pod.
func fakeHasPod(t *testing.T, cs *fake.Clientset, ns, name string) bool {
	t.Helper()
	_, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("reading pod %s/%s: %v", ns, name, err)
	}
	return err == nil
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
