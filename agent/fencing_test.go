package agent

// Tests of the fencer's wiring into the agent (Config.Fencing).

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/agent/metrics"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/cri"
)

// stoppingRuntime is a fence.Runtime: containers the test sets, stops recorded.
type stoppingRuntime struct {
	mu         sync.Mutex
	containers []cri.Container
	stops      []string
}

func (r *stoppingRuntime) RunningContainers(context.Context) ([]cri.Container, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []cri.Container
	for _, c := range r.containers {
		if c.Running {
			out = append(out, c)
		}
	}
	return out, nil
}

func (r *stoppingRuntime) StopContainer(_ context.Context, id string, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stops = append(r.stops, id)
	for i := range r.containers {
		if r.containers[i].ID == id {
			r.containers[i].Running = false
		}
	}
	return nil
}

func (r *stoppingRuntime) stopped() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.stops)
}

// TestFencingWired: with Config.Fencing the agent renews its Lease from the start and,
// once renewals fail for fence-after, stops the containers of the opted-in pods of its
// pod cache, and only those.
func TestFencingWired(t *testing.T) {
	in := newPod("in", "uid-in", corev1.RestartPolicyNever, "main")
	in.Annotations = map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"}
	out := newPod("out", "uid-out", corev1.RestartPolicyNever, "main")
	rt := &stoppingRuntime{containers: []cri.Container{
		{ID: "c-in", Name: "main", PodNamespace: ns, PodName: "in", PodUID: "uid-in", Running: true},
		{ID: "c-out", Name: "main", PodNamespace: ns, PodName: "out", PodUID: "uid-out", Running: true},
	}}
	var fencing *fence.Config
	e := newTestEnv(t, func(c *Config) {
		fencing = &fence.Config{Namespace: "coroner-system", FenceAfter: 10 * time.Second, Runtime: rt}
		c.Fencing = fencing
	}, in, out)
	leaseName := conditions.AgentLeaseName(node)
	e.until("the Lease", func() bool {
		l, err := e.client.CoordinationV1().Leases("coroner-system").Get(context.Background(), leaseName, metav1.GetOptions{})
		return err == nil && *l.Spec.HolderIdentity == node && l.Annotations[conditions.AnnotationFenceAfter] == "10s"
	})
	if fencing.NodeName != "" || fencing.Pods != nil {
		t.Error("New modified the caller's fence.Config")
	}

	e.client.PrependReactor("*", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	e.stepUntil("the fence", 250*time.Millisecond, func() bool { return len(rt.stopped()) > 0 })
	e.settle()
	if got := rt.stopped(); !slices.Equal(got, []string{"c-in"}) {
		t.Errorf("stopped %v, want [c-in]", got)
	}
	if v := metrics.Value(e.m.Fenced); v != 1 {
		t.Errorf("coroner_agent_fenced = %v, want 1", v)
	}
	if fenced := e.clk.Now().Sub(t0); fenced <= 10*time.Second {
		t.Errorf("fenced %v after the start, before fence-after", fenced)
	}
}

// TestNoFencingNoLease: without Config.Fencing there is no Lease.
func TestNoFencingNoLease(t *testing.T) {
	e := newTestEnv(t, nil)
	e.stepUntil("a while", time.Second, func() bool { return e.clk.Now().Sub(t0) > 30*time.Second })
	leases, err := e.client.CoordinationV1().Leases("").List(context.Background(), metav1.ListOptions{})
	if err != nil || len(leases.Items) != 0 {
		t.Errorf("Leases %v (%v), want none", leases, err)
	}
	if v := metrics.Value(e.m.Fenced); v != 0 {
		t.Errorf("coroner_agent_fenced = %v", v)
	}
}
