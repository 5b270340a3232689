package agent_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
)

// TestRuntimeMode: how the agent follows each runtime, from its runtime_info metric, and
// that it leaves the kubelet's CRI event stream whole. containerd 2.x: mode events (its
// CRI gives every subscriber every event). containerd 1.7: mode relist, saying that its
// CRI event channel is shared; a subscriber there would take about every other event
// away from the kubelet's evented PLEG (test/integration/cri testSharedEventChannel), so
// a stream opened first, as the kubelet's, must still get every event of the pod the
// agent stamps. containerd 1.6 (no GetContainerEvents): relist.
func TestRuntimeMode(t *testing.T) { containerdtest.Each(t, testRuntimeMode) }

func testRuntimeMode(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	var kubelet *eventStream
	if env.Containerd.Events() || env.Containerd.SharedEvents() {
		// On 1.7 a subscription that has gone (an earlier run's, with -count) still takes
		// the next event: a throwaway pod's events first.
		flush(f.ctx, t, env)
		kubelet = openEventStream(f.ctx, t, env)
		kubelet.quiet(t) // 1.7 hands the first subscriber what its channel kept
	}
	a := startAgent(t, f.api, nodeA, f.cri.Endpoint)
	wantMode := "relist"
	if env.Containerd.Events() {
		wantMode = "events"
	}
	waitFor(t, "runtime_info with mode "+wantMode, func() bool {
		return a.metric(t, "coroner_agent_runtime_info", "mode="+wantMode, "runtime=containerd "+env.Containerd.Version) == 1
	})
	body, err := a.scrape()
	if err != nil {
		t.Fatal(err)
	}
	var info string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "coroner_agent_runtime_info{") {
			info = l
		}
	}
	t.Logf("%s: %s", env.Containerd.Name, info)
	switch {
	case env.Containerd.Events():
		if !strings.Contains(info, `no_stream=""`) {
			t.Errorf("events mode with a reason not to stream: %s", info)
		}
	case env.Containerd.SharedEvents():
		if !strings.Contains(info, "shares one GetContainerEvents channel") {
			t.Errorf("relist on containerd %s without saying that its CRI event channel is shared: %s", env.Containerd.Version, info)
		}
	default:
		if strings.Contains(info, `no_stream=""`) {
			t.Errorf("relist without saying why: %s", info)
		}
	}

	p := f.pod(nodeA, "mode-hog", 20<<20, "/bin/memhog")
	id := f.start(p)
	f.waitCondition(p, conditions.OOMKilled)
	f.waitExited(p, id)
	if kubelet == nil {
		return
	}
	// The kubelet's stream: the sandbox created and started, the container created,
	// started and stopped, each once and in order.
	want := "sandbox:CREATED,sandbox:STARTED,container:CREATED,container:STARTED,container:STOPPED"
	var got string
	deadline := time.Now().Add(10 * time.Second)
	for {
		got = kubelet.of(map[string]string{p.SandboxID: "sandbox", id: "container"})
		if got == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got != want {
		t.Errorf("the kubelet's CRI event stream got %s beside the agent, want %s: the agent took events from it", got, want)
	}
}

// flush runs a throwaway pod whose container exits and removes it: several CRI events.
func flush(ctx context.Context, t *testing.T, env *containerd.Env) {
	t.Helper()
	pod, err := env.RunPod(ctx, "flush", "flush")
	if err != nil {
		t.Fatal(err)
	}
	id, err := pod.StartContainer(ctx, containerd.Container{Name: "main", Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the throwaway container exiting", func() bool {
		st, err := env.ContainerStatus(ctx, id)
		return err == nil && st.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED
	})
	if err := pod.Remove(ctx); err != nil {
		t.Fatal(err)
	}
}

// eventStream records a CRI GetContainerEvents stream, as the kubelet's evented PLEG
// reads it.
type eventStream struct {
	mu     sync.Mutex
	events []*runtimeapi.ContainerEventResponse
}

func openEventStream(ctx context.Context, t *testing.T, env *containerd.Env) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	stream, err := env.Runtime.GetContainerEvents(ctx, &runtimeapi.GetEventsRequest{})
	if err != nil {
		cancel()
		t.Fatalf("GetContainerEvents: %v", err)
	}
	s := &eventStream{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.events = append(s.events, ev)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// quiet waits until nothing new has come for 300 ms.
func (s *eventStream) quiet(t *testing.T) {
	t.Helper()
	last := -1
	waitFor(t, "the CRI event stream going quiet", func() bool {
		s.mu.Lock()
		n := len(s.events)
		s.mu.Unlock()
		if n == last {
			return true
		}
		last = n
		time.Sleep(300 * time.Millisecond)
		return false
	})
}

// of lists the events of the ids given, as name:TYPE in the order received.
func (s *eventStream) of(names map[string]string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, ev := range s.events {
		if name, ok := names[ev.GetContainerId()]; ok {
			typ := strings.TrimSuffix(strings.TrimPrefix(ev.GetContainerEventType().String(), "CONTAINER_"), "_EVENT")
			out = append(out, name+":"+typ)
		}
	}
	return strings.Join(out, ",")
}
