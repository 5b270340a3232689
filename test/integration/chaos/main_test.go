// Package chaos_test runs the cluster-side actions of `coronerctl chaos` (package
// cmd/coronerctl/chaos: evict, drain, uncordon, preempt, unpreempt) against a real
// kube-apiserver v1.36.3 (test/harness):
//
//   - evict_test.go: the eviction subresource (policy/v1) accepts, refuses with 429 while a
//     PodDisruptionBudget allows no disruption (computed by kube-controller-manager's
//     disruption controller), and refuses with 403 a user without the right.
//   - drain_test.go: cordon, which pods are evicted, left, skipped or awaited, the wait
//     until they are gone, and uncordon.
//   - preempt_test.go: the PriorityClass and the preemptor pod the API server admits, the
//     wait for the binding, and unpreempt.
//
// There is no scheduler and no kubelet. The tests play them: the kubelet deletes (grace 0)
// or fails the pods the API server marked for deletion on its node (a pod bound to a node
// stays terminating until then), the scheduler marks victims and binds the preemptor
// (pods/binding). Nodes and the preemptor's PriorityClass are cluster-scoped: Nodes are
// named after the test's namespace and deleted at the end; the PriorityClass has the fixed
// name coroner-chaos-preemptor, so the tests that make it do not run in parallel.
//
// The actions keep their default timings (eviction retries every 1s, API polls every
// 500ms): the package variables that shorten them are for the unit tests.
package chaos_test

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// image is the image of the test pods (never pulled: there is no kubelet).
const image = "registry.k8s.io/pause:3.10"

// request is one request a recorded client sent, with the status code of its answer.
type request struct {
	Method, Path string
	Code         int
}

// recorder records the requests of a client and calls hook after each answer.
type recorder struct {
	mu   sync.Mutex
	reqs []request
	hook func(r request)
}

func (r *recorder) record(req request) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	hook := r.hook
	r.mu.Unlock()
	if hook != nil {
		hook(req)
	}
}

// requests returns the requests so far.
func (r *recorder) requests() []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]request(nil), r.reqs...)
}

var evictionPath = regexp.MustCompile(`^/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$`)

// evictions returns the "namespace/name" of every eviction request, in order.
func (r *recorder) evictions() []string {
	var out []string
	for _, q := range r.requests() {
		if m := evictionPath.FindStringSubmatch(q.Path); q.Method == http.MethodPost && m != nil {
			out = append(out, m[1]+"/"+m[2])
		}
	}
	return out
}

// count returns how many requests had the method and a path containing part.
func (r *recorder) count(method, part string) int {
	n := 0
	for _, q := range r.requests() {
		if q.Method == method && strings.Contains(q.Path, part) {
			n++
		}
	}
	return n
}

// distinctPaths is how many different paths got requests of method: for POST, how many
// objects a client tried to create, however often it retried one.
func (r *recorder) distinctPaths(method string) int {
	paths := map[string]bool{}
	for _, q := range r.requests() {
		if q.Method == method {
			paths[q.Path] = true
		}
	}
	return len(paths)
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// recordedClient is a cluster-admin client whose requests are recorded, for the action
// under test; with a user, it impersonates that user.
func recordedClient(t *testing.T, env *harness.Env, user ...string) (kubernetes.Interface, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg := rest.CopyConfig(env.Config)
	if len(user) > 0 {
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user[0]}
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			rec.record(request{Method: req.Method, Path: req.URL.Path, Code: code})
			return resp, err
		})
	})
	return kubernetes.NewForConfigOrDie(cfg), rec
}

// adminClient is the test's own cluster-admin client, for fixtures and checks.
func adminClient(env *harness.Env) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(env.Config)
}

var disruption struct {
	once sync.Once
	err  error
}

// disruptionController starts kube-controller-manager's disruption controller once for the
// package: without it a PodDisruptionBudget has no status, and the API server answers every
// eviction it covers 429 with Retry-After 10s, which client-go retries by itself for up to
// 10 times before the action sees it.
func disruptionController(t *testing.T, env *harness.Env) {
	t.Helper()
	disruption.once.Do(func() { _, disruption.err = env.StartControllerManager("disruption") })
	if disruption.err != nil {
		t.Fatalf("starting the disruption controller: %v", disruption.err)
	}
}

// createNode creates a Node named name with a hostname label and the allocatable cpu, and
// deletes it when the test ends.
func createNode(t *testing.T, cs kubernetes.Interface, name, cpu string, unschedulable bool) *corev1.Node {
	t.Helper()
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Spec:       corev1.NodeSpec{Unschedulable: unschedulable},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourcePods: resource.MustParse("110")},
			Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourcePods: resource.MustParse("110")},
		},
	}
	node, err := cs.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if node.Status.Allocatable.Cpu().Cmp(resource.MustParse(cpu)) != 0 {
		// The API server keeps a node's status on create; make sure of it.
		t.Fatalf("node %s created with allocatable %v", name, node.Status.Allocatable)
	}
	return node
}

// podSpec describes a test pod.
type podSpec struct {
	node          string
	phase         corev1.PodPhase // default Running
	cpu           string
	priorityClass string
	labels        map[string]string
	annotations   map[string]string
	owner         *metav1.OwnerReference
}

// createPod creates the pod bound to spec.node (spec.nodeName at create) and writes its
// phase through the status subresource, as its kubelet would.
func createPod(t *testing.T, cs kubernetes.Interface, ns, name string, spec podSpec) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: spec.labels, Annotations: spec.annotations},
		Spec: corev1.PodSpec{
			NodeName:          spec.node,
			PriorityClassName: spec.priorityClass,
			Containers:        []corev1.Container{{Name: "main", Image: image}},
		},
	}
	if spec.owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*spec.owner}
	}
	if spec.cpu != "" {
		pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(spec.cpu)}
	}
	// The Priority admission plugin resolves priorityClassName from its informer's cache,
	// which may not hold a PriorityClass the test has just created: it then refuses the pod
	// ("no PriorityClass with name ... was found"). Retry until its cache has caught up.
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var created *corev1.Pod
		created, err = cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err == nil {
			pod = created
			break
		}
		if spec.priorityClass == "" || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no PriorityClass with name") || time.Now().After(deadline) {
			t.Fatalf("creating pod %s/%s: %v", ns, name, err)
		}
	}
	phase := spec.phase
	if phase == "" {
		phase = corev1.PodRunning
	}
	pod.Status.Phase = phase
	pod, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("setting pod %s/%s %s: %v", ns, name, phase, err)
	}
	return pod
}

// hasPod reports whether the pod exists.
func hasPod(t *testing.T, cs kubernetes.Interface, ns, name string) bool {
	t.Helper()
	_, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("reading pod %s/%s: %v", ns, name, err)
	}
	return err == nil
}

// hasCondition reports whether the pod has the condition True with the reason.
func hasCondition(pod *corev1.Pod, typ corev1.PodConditionType, reason string) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == typ {
			return c.Status == corev1.ConditionTrue && c.Reason == reason
		}
	}
	return false
}

// kubeletMode is what the played kubelet does with a pod being deleted.
type kubeletMode int

const (
	// kubeletDelete deletes it with grace 0, as a kubelet does once its containers stopped.
	kubeletDelete kubeletMode = iota
	// kubeletFail writes phase Failed and leaves it there.
	kubeletFail
)

// playKubelet plays the kubelet of node until the test ends: every 100ms it finishes the
// pods of the node that the API server marked for deletion (deletionTimestamp). With
// afterEviction, it starts only once it has seen a pod evicted (DisruptionTarget,
// EvictionByEvictionAPI), so that pods being deleted before are still there when the
// action under test first looks.
func playKubelet(t *testing.T, cs kubernetes.Interface, node string, mode kubeletMode, afterEviction bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		active := !afterEviction
		for ctx.Err() == nil {
			list, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
			})
			if err == nil {
				for i := range list.Items {
					if hasCondition(&list.Items[i], conditions.DisruptionTarget, conditions.ReasonEvictionByEvictionAPI) {
						active = true
					}
				}
				for i := range list.Items {
					p := &list.Items[i]
					if !active || p.DeletionTimestamp == nil {
						continue
					}
					switch mode {
					case kubeletDelete:
						_ = cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
							GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &p.UID},
						})
					case kubeletFail:
						if p.Status.Phase != corev1.PodFailed {
							p.Status.Phase = corev1.PodFailed
							_, _ = cs.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
						}
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
}

// lines splits the output into lines.
func lines(out string) []string {
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

// matchLines checks that the output's lines match the patterns, one each, in order.
func matchLines(t *testing.T, out string, patterns []string) {
	t.Helper()
	got := lines(out)
	if len(got) != len(patterns) {
		t.Errorf("got %d lines, want %d", len(got), len(patterns))
	}
	for i, pattern := range patterns {
		if i >= len(got) {
			break
		}
		if !regexp.MustCompile("^" + pattern + "$").MatchString(got[i]) {
			t.Errorf("line %d = %q, want a match of %q", i, got[i], pattern)
		}
	}
}
