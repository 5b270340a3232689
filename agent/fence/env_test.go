package fence

// The fencer's test environment: a fake runtime, an Event recorder, a fake API server and a fake clock.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// fakeRuntime is a hand-written Runtime and SandboxLister: containers and sandboxes the
// test sets, stops recorded, errors injectable.
type fakeRuntime struct {
	mu         sync.Mutex
	containers []cri.Container
	sandboxes  []cri.Sandbox
	stops      []string        // container ids, in order
	timeouts   []time.Duration // of each stop
	lists      []string        // "containers" and "sandboxes", in the order listed
	listErr    error
	sandboxErr error
	stopErr    map[string]error
}

func (r *fakeRuntime) Sandboxes(context.Context) ([]cri.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists = append(r.lists, "sandboxes")
	if r.sandboxErr != nil {
		return nil, r.sandboxErr
	}
	return slices.Clone(r.sandboxes), nil
}

func (r *fakeRuntime) addSandbox(s cri.Sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sandboxes = append(r.sandboxes, s)
}

func (r *fakeRuntime) RunningContainers(context.Context) ([]cri.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists = append(r.lists, "containers")
	if r.listErr != nil {
		return nil, r.listErr
	}
	var out []cri.Container
	for _, c := range r.containers {
		if c.Running {
			out = append(out, c)
		}
	}
	return out, nil
}

func (r *fakeRuntime) StopContainer(_ context.Context, id string, timeout time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.stopErr[id]; err != nil {
		return err
	}
	r.stops = append(r.stops, id)
	r.timeouts = append(r.timeouts, timeout)
	for i := range r.containers {
		if r.containers[i].ID == id {
			r.containers[i].Running = false
		}
	}
	return nil
}

func (r *fakeRuntime) add(c cri.Container) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.containers = append(r.containers, c)
}

func (r *fakeRuntime) stopped() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.stops)
}

// event is one recorded Event.
type event struct {
	ref                  *corev1.ObjectReference
	typ, reason, message string
}

// recorder captures Events with their object.
type recorder struct {
	mu     sync.Mutex
	events []event
}

func (r *recorder) Event(obj runtime.Object, typ, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref, _ := obj.(*corev1.ObjectReference)
	r.events = append(r.events, event{ref: ref, typ: typ, reason: reason, message: message})
}

func (r *recorder) Eventf(obj runtime.Object, typ, reason, format string, args ...any) {
	r.Event(obj, typ, reason, fmt.Sprintf(format, args...))
}

func (r *recorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, typ, reason, format string, args ...any) {
	r.Eventf(obj, typ, reason, format, args...)
}

func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

type testEnv struct {
	t      *testing.T
	ctx    context.Context
	clk    *testingclock.FakeClock
	client *fake.Clientset
	rt     *fakeRuntime
	rec    *recorder
	m      *metrics.Metrics
	f      *Fencer

	mu       sync.Mutex
	apiDown  bool // every Lease request fails
	pods     []*corev1.Pod
	requests int // Lease requests
}

func newTestEnv(t *testing.T, pods ...*corev1.Pod) *testEnv {
	t.Helper()
	return newTestEnvWith(t, func(*Config) {}, pods...)
}

// newTestEnvWith is newTestEnv with the Config changed by configure before New.
func newTestEnvWith(t *testing.T, configure func(*Config), pods ...*corev1.Pod) *testEnv {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	e := &testEnv{t: t, ctx: ctx, clk: testingclock.NewFakeClock(t0), rt: &fakeRuntime{}, rec: &recorder{}, pods: pods}
	e.client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	e.client.PrependReactor("*", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.requests++
		if e.apiDown {
			return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
		}
		return false, nil, nil
	})
	e.m = metrics.New(prometheus.NewRegistry())
	cfg := Config{
		NodeName: node, Namespace: leaseNS, FenceAfter: fenceAfter, Client: e.client, Runtime: e.rt,
		Pods: func() []*corev1.Pod {
			e.mu.Lock()
			defer e.mu.Unlock()
			return slices.Clone(e.pods)
		},
		Recorder: e.rec, Metrics: e.m, Clock: e.clk,
	}
	configure(&cfg)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.f = f
	return e
}

func (e *testEnv) setAPIDown(down bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.apiDown = down
}

func (e *testEnv) lease() *coordinationv1.Lease {
	e.t.Helper()
	l, err := e.client.Tracker().Get(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}, leaseNS, conditions.AgentLeaseName(node))
	if err != nil {
		e.t.Fatalf("the Lease: %v", err)
	}
	return l.(*coordinationv1.Lease)
}

// pass steps the fake clock by d and runs the passes Run would have run.
func (e *testEnv) pass(d time.Duration) {
	e.clk.Step(d)
	_ = e.f.renew(e.ctx)
	e.f.enforce(e.ctx)
}

func (e *testEnv) fenced() float64 { return metrics.Value(e.m.Fenced) }

// until waits in real time, 10 s at most, for cond: the loops Run starts react to the fake
// clock in goroutines of their own.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// step moves the fake clock by d in steps of at most chunk, each once Run's loops wait on
// it, calling each (when not nil) after every step.
func (e *testEnv) step(d, chunk time.Duration, each func()) {
	e.t.Helper()
	for d > 0 {
		s := min(d, chunk)
		until(e.t, "the loops waiting", e.clk.HasWaiters)
		time.Sleep(2 * time.Millisecond)
		e.clk.Step(s)
		d -= s
		if each != nil {
			each()
		}
	}
}

// run runs the fencer until the test ends, and returns the context it runs with.
func (e *testEnv) run() context.Context {
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.f.Run(ctx)
	}()
	e.t.Cleanup(func() {
		cancel()
		<-done
	})
	return ctx
}
