package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types"
	"google.golang.org/protobuf/types/known/timestamppb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
)

// stepUntil steps the fake clock by d until cond holds (a backoff or a timer the watcher
// may register at any moment), failing after 10 s.
func stepUntil(t *testing.T, clk *testingclock.FakeClock, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 10s", what)
		}
		clk.Step(d)
		time.Sleep(time.Millisecond)
	}
}

// TestCRIOStreamEndsAtOnce: CRI-O's GetContainerEvents returns nil at once while
// enable_pod_events is false, its default (cri-o server/container_events.go, v1.36): the
// watcher relists instead, stays connected and healthy, and does not reconnect.
func TestCRIOStreamEndsAtOnce(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("cri-o", true)
	rt.version, rt.endAtOnce, rt.crioInfo = "1.36.0", true, true
	rt.set("c1", running, labels("ns", "p", "app"))
	serve(t, path, rt, nil)
	w, events, clk := testWatcher(t, path, Options{})
	if ev := next(t, events); ev.Kind != Started || ev.PID != 42 || ev.CgroupPath != "kubepods-burstable-poduid-p.slice:crio:c1" {
		t.Errorf("Started %+v, want CRI-O's cgroup path and pid", ev)
	}
	waitFor(t, "relist mode", func() bool { return w.Stats().Mode == ModeRelist })
	if st := w.Stats(); !strings.Contains(st.NoStream, "at once") {
		t.Errorf("NoStream %q", st.NoStream)
	}
	rt.exit("c1", 1, "Error")
	step(t, clk, time.Second)
	if ev := next(t, events); ev.Kind != Exited || ev.ContainerID != "c1" || ev.PID != 42 || ev.Source != SourceRelist {
		t.Errorf("exit %+v", ev)
	}
	for range 5 {
		step(t, clk, time.Second)
	}
	waitTimer(t, clk)
	st := w.Stats()
	if subs, _ := rt.counts(); subs != 1 || st.Connects != 1 || !w.Connected() || w.LastError() != nil || st.Mode != ModeRelist {
		t.Errorf("after 6 relist periods: %d subscriptions, stats %+v, LastError %v; want 1 subscription, 1 connection, connected, relisting", subs, st, w.LastError())
	}
}

// TestStreamEndingAfterWorkingResyncs: a stream that ends (io.EOF) after it delivered
// events, past StreamGrace, is a connection lost: the watcher reconnects and relists. One
// that does so again and again settles into relisting instead of reconnecting forever.
func TestStreamEndingAfterWorkingResyncs(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("fake", true)
	serve(t, path, rt, nil)
	w, events, clk := testWatcher(t, path, Options{StreamGrace: 2 * time.Second})
	for i := 1; i <= maxShortStreams; i++ {
		wait(t, "GetContainerEvents", rt.subscribed)
		waitFor(t, "events mode", func() bool { st := w.Stats(); return st.Mode == ModeEvents && st.Connects == uint64(i) })
		id := fmt.Sprintf("c%d", i)
		rt.set(id, running, labels("ns", "p"+id, "app"))
		rt.criEvents <- &runtimeapi.ContainerEventResponse{ContainerId: id, ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}
		if ev := next(t, events); ev.Kind != Started || ev.ContainerID != id {
			t.Fatalf("stream %d: %+v", i, ev)
		}
		clk.Step(3 * time.Second) // past StreamGrace
		rt.endStream <- struct{}{}
		waitFor(t, "the connection lost", func() bool { return w.LastError() != nil })
		if err := w.LastError(); !strings.Contains(err.Error(), "ended the GetContainerEvents stream") {
			t.Errorf("LastError %v", err)
		}
		rt.exit(id, 3, "Error") // while reconnecting: the reconnect's relist finds it
		stepUntil(t, clk, 100*time.Millisecond, "the reconnection", func() bool { return w.Stats().Connects > uint64(i) })
		if ev := next(t, events); ev.Kind != Exited || ev.ContainerID != id || ev.Source != SourceRelist {
			t.Fatalf("after reconnect %d: %+v", i, ev)
		}
	}
	waitFor(t, "relist mode", func() bool { return w.Stats().Mode == ModeRelist })
	if st := w.Stats(); !strings.Contains(st.NoStream, "ended its last 3") {
		t.Errorf("NoStream %q", st.NoStream)
	}
	stepUntil(t, clk, 500*time.Millisecond, "relists", func() bool { return w.Stats().Relists >= 10 })
	if subs, _ := rt.counts(); subs != maxShortStreams || w.Stats().Connects != maxShortStreams+1 || !w.Connected() {
		t.Errorf("%d subscriptions, stats %+v: want %d subscriptions and no more reconnects", subs, w.Stats(), maxShortStreams)
	}
}

// TestStreamVerdict: containerd before 2.0 shares one GetContainerEvents channel between
// its subscribers (containerd v1.7.34 pkg/cri/server/container_events.go: "replace with a
// real implementation that broadcasts containerEventsChan to all subscribers"); 2.x
// broadcasts (internal/cri/server/container_events.go, internal/eventq, v2.3.4).
func TestStreamVerdict(t *testing.T) {
	for _, tc := range []struct {
		name, version string
		want          bool
	}{
		{"containerd", "v1.7.13", false},
		{"containerd", "1.6.20~ds1", false},
		{"containerd", "1.7.23-k3s2", false},
		{"containerd", "v1.7.27-k3s1", false},
		{"containerd", "v2.4.2", true},
		{"containerd", "2.0.0-rc.1", true},
		{"containerd", "v10.0.0", true},
		{"containerd", "", false},
		{"containerd", "dev", false},
		{"containerd", "3f1e4ab", false},
		{"containerd", "v2", false},
		{"cri-o", "1.36.0", true},
		{"cri-dockerd", "0.3.15", true},
	} {
		if got, why := streamVerdict(tc.name, tc.version); got != tc.want || got == (why != "") {
			t.Errorf("streamVerdict(%q, %q) = %v, %q; want %v", tc.name, tc.version, got, why, tc.want)
		}
	}
}

// TestContainerd17NotSubscribed: on containerd 1.7 the watcher never calls
// GetContainerEvents (it would take events away from the kubelet); it relists and follows
// containerd's event service, which gives each subscriber a queue of its own.
func TestContainerd17NotSubscribed(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("containerd", true) // would serve a stream
	rt.version = "v1.7.13"
	rt.set("c1", running, labels("ns", "p", "app"))
	ev := newFakeEvents()
	serve(t, path, rt, ev)
	w, events, clk := testWatcher(t, path, Options{})
	next(t, events)
	settled(t, w)
	wait(t, "containerd subscription", func() <-chan struct{} {
		c := make(chan struct{})
		go func() { <-ev.subscribed; close(c) }()
		return c
	}())
	rt.exit("c1", 137, "OOMKilled")
	ev.push(t, topicTaskExit, &eventtypes.TaskExit{ContainerID: "c1", ID: "c1", ExitStatus: 137}, time.Unix(400, 0))
	if e := next(t, events); e.Kind != Exited || e.Source != SourceContainerd {
		t.Errorf("exit %+v", e)
	}
	step(t, clk, time.Second)
	waitTimer(t, clk)
	if subs, _ := rt.counts(); subs != 0 {
		t.Errorf("%d GetContainerEvents calls on containerd 1.7, want none", subs)
	}
	if st := w.Stats(); st.Mode != ModeRelist || !strings.Contains(st.NoStream, "before 2.0") || !st.ContainerdEvents {
		t.Errorf("stats %+v", st)
	}

	// containerd 2.x: subscribed.
	path2 := socketIn(t)
	rt2 := newFakeRuntime("containerd", true)
	rt2.version = "v2.4.2"
	serve(t, path2, rt2, newFakeEvents())
	w2, _, _ := testWatcher(t, path2, Options{})
	wait(t, "GetContainerEvents on containerd 2", rt2.subscribed)
	waitFor(t, "events mode", func() bool { return w2.Stats().Mode == ModeEvents })
}

// TestStaleEventsIgnored: a new subscriber gets events from before it subscribed
// (containerd 1.7's channel fills whether anyone listens, pkg/cri/server/helpers.go
// v1.7.34; containerd 2.x replays events queued while nobody listened for up to 5
// minutes, internal/eventq/eventq.go v2.3.4). They are ignored and counted: the relist
// after subscribing has the current state.
func TestStaleEventsIgnored(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("containerd", true)
	rt.version = "2.3.4"
	now := time.Unix(1000, 0) // testWatcher's fake clock
	gone := &runtimeapi.ContainerStatus{
		Id: "gone", State: exited, ExitCode: 1, Labels: labels("ns", "old", "app"),
		Metadata: &runtimeapi.ContainerMetadata{Name: "app"}, FinishedAt: now.Add(-3 * time.Minute).UnixNano(),
	}
	rt.backlog = []*runtimeapi.ContainerEventResponse{
		{ContainerId: "gone", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, CreatedAt: now.Add(-3 * time.Minute).UnixNano(), ContainersStatuses: []*runtimeapi.ContainerStatus{gone}},
		{ContainerId: "gone", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_DELETED_EVENT, CreatedAt: now.Add(-2 * time.Minute).UnixNano()},
	}
	serve(t, path, rt, nil)
	w, events, _ := testWatcher(t, path, Options{})
	wait(t, "GetContainerEvents", rt.subscribed)
	waitFor(t, "events mode", func() bool { return w.Stats().Mode == ModeEvents })

	// Fresh events, within the tolerance of the subscription and after it, count.
	rt.set("new", running, labels("ns", "new", "app"))
	rt.criEvents <- &runtimeapi.ContainerEventResponse{ContainerId: "new", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT, CreatedAt: now.Add(-500 * time.Millisecond).UnixNano()}
	if ev := next(t, events); ev.ContainerID != "new" || ev.Kind != Started {
		t.Errorf("fresh event: %+v, want new Started (and nothing of gone)", ev)
	}
	st := rt.exit("new", 2, "Error")
	rt.criEvents <- &runtimeapi.ContainerEventResponse{ContainerId: "new", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT, CreatedAt: now.Add(time.Second).UnixNano(), ContainersStatuses: []*runtimeapi.ContainerStatus{st}}
	if ev := next(t, events); ev.ContainerID != "new" || ev.Kind != Exited {
		t.Errorf("fresh stop: %+v", ev)
	}
	none(t, events)
	if n := w.Stats().StaleEvents; n != 2 {
		t.Errorf("StaleEvents = %d, want 2", n)
	}
}

// TestStalledConsumerNeverBlocksStream: containerd 2.x publishes to each
// GetContainerEvents subscriber with a blocking send (internal/eventq/eventq.go,
// publish, v2.3.4: a subscriber's channel holds 100), so a subscriber that stops reading
// holds back every other one, the kubelet's included. While the agent does not read, the
// runtime's sends must all go through; once it reads again, every exit arrives once.
func TestStalledConsumerNeverBlocksStream(t *testing.T) {
	const n = 150
	path := socketIn(t)
	rt := newFakeRuntime("containerd", true)
	rt.version = "v2.3.4"
	for i := range n {
		rt.set(fmt.Sprintf("c%03d", i), running, labels("ns", fmt.Sprintf("p%03d", i), "main"))
	}
	serve(t, path, rt, nil)
	w, events, clk := testWatcher(t, path, Options{Buffer: 1, StreamBuffer: 8})
	wait(t, "GetContainerEvents", rt.subscribed)
	// Nobody reads events: the first relist is stuck on its second Started.

	// Every container exits; the runtime sends a stop event for each, five times over
	// (the runtime sends one per container of the pod), with the pod's statuses.
	const repeats = 5
	go func() {
		for i := range n {
			id := fmt.Sprintf("c%03d", i)
			st := rt.exit(id, int32(i%200), "Error")
			ev := &runtimeapi.ContainerEventResponse{
				ContainerId: id, ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
				CreatedAt: clk.Now().UnixNano(), ContainersStatuses: []*runtimeapi.ContainerStatus{st},
				PodSandboxStatus: &runtimeapi.PodSandboxStatus{Id: "sandbox-" + st.Labels[LabelPodName], Annotations: map[string]string{"padding": strings.Repeat("x", 512)}},
			}
			for range repeats {
				rt.criEvents <- ev
			}
		}
	}()
	waitFor(t, "the runtime sending every event while the consumer stalls", func() bool {
		_, sent := rt.counts()
		return sent == n*repeats
	})
	// The runtime has sent everything; the receiving goroutine counts what it dropped a
	// moment later (Stats itself does not wait for the consumer).
	waitFor(t, "the overflow counted", func() bool {
		st := w.Stats()
		return st.StreamOverflows > 0 && st.StreamDropped > 0
	})

	// The consumer reads again: each container's exit exactly once.
	exits := map[string]int{}
	starts := map[string]int{}
	for len(exits) < n {
		ev := next(t, events)
		switch ev.Kind {
		case Exited:
			exits[ev.ContainerID]++
			var i int32
			if _, err := fmt.Sscanf(ev.ContainerID, "c%d", &i); err != nil || ev.ExitCode != i%200 {
				t.Errorf("%s exited %d", ev.ContainerID, ev.ExitCode)
			}
		case Started:
			starts[ev.ContainerID]++
		}
	}
	stepUntil(t, clk, 10*time.Second, "a resync", func() bool { return w.Stats().Relists >= 3 })
	waitTimer(t, clk)
	for {
		select {
		case ev := <-events:
			if ev.Kind == Exited {
				exits[ev.ContainerID]++
			} else {
				starts[ev.ContainerID]++
			}
			continue
		default:
		}
		break
	}
	for id, c := range exits {
		if c != 1 {
			t.Errorf("%s exited %d times", id, c)
		}
	}
	for id, c := range starts {
		if c > 1 {
			t.Errorf("%s started %d times", id, c)
		}
	}
	if len(exits) != n {
		t.Errorf("%d exits, want %d", len(exits), n)
	}
}

// TestStalledConsumerNeverBlocksContainerdEvents: the same for containerd's event service
// (its exchange queues for each subscriber without bound, core/events/exchange, v2.3.4:
// a subscriber that does not read costs containerd memory). Every task exit still
// arrives once.
func TestStalledConsumerNeverBlocksContainerdEvents(t *testing.T) {
	const n = 100
	path := socketIn(t)
	rt := newFakeRuntime("containerd", false)
	rt.version = "1.7.13"
	for i := range n {
		rt.set(fmt.Sprintf("c%03d", i), running, labels("ns", fmt.Sprintf("p%03d", i), "main"))
	}
	evs := newFakeEvents()
	serve(t, path, rt, evs)
	w, events, clk := testWatcher(t, path, Options{Buffer: 1, StreamBuffer: 8})
	select {
	case <-evs.subscribed:
	case <-time.After(10 * time.Second):
		t.Fatal("no containerd subscription")
	}
	const repeats = 5
	// An OOM kill first: handling it waits for the stalled consumer, so the queue
	// behind it overflows.
	envs := []*types.Envelope{envelope(t, topicTaskOOM, &eventtypes.TaskOOM{ContainerID: "c000"}, time.Unix(300, 0))}
	for i := range n {
		id := fmt.Sprintf("c%03d", i)
		rt.exit(id, 1, "Error")
		for range repeats {
			envs = append(envs, envelope(t, topicTaskExit, &eventtypes.TaskExit{ContainerID: id, ID: id, ExitStatus: 1, ExitedAt: timestamppb.New(time.Unix(400, 0))}, time.Unix(400, 0)))
		}
	}
	go func() {
		for _, e := range envs {
			evs.envelopes <- e
		}
	}()
	waitFor(t, "containerd sending every event while the consumer stalls", func() bool { return evs.sentCount() == len(envs) })
	// Sent is not yet received: the receiving goroutine counts its drops a moment later.
	waitFor(t, "the overflow counted", func() bool { return w.Stats().ContainerdOverflows > 0 })
	exits := map[string]int{}
	ooms := 0
	for len(exits) < n {
		switch ev := next(t, events); ev.Kind {
		case Exited:
			exits[ev.ContainerID]++
		case OOM:
			ooms++
		}
	}
	stepUntil(t, clk, time.Second, "relists", func() bool { return w.Stats().Relists >= 5 })
	waitTimer(t, clk)
	for {
		select {
		case ev := <-events:
			switch ev.Kind {
			case Exited:
				exits[ev.ContainerID]++
			case OOM:
				ooms++
			}
			continue
		default:
		}
		break
	}
	if ooms != 1 {
		t.Errorf("%d OOM events, want 1; stats %+v", ooms, w.Stats())
	}
	for id, c := range exits {
		if c != 1 {
			t.Errorf("%s exited %d times", id, c)
		}
	}
}

// hostSocket returns the path of a candidate socket under prefix, its directory made.
func hostSocket(t *testing.T, prefix, candidate string) string {
	t.Helper()
	p := filepath.Join(prefix, candidate)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// hostPrefix is a short temporary directory (unix socket paths are limited to 107 bytes).
func hostPrefix(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "cri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(d); err != nil {
			t.Error(err)
		}
	})
	return d
}

// TestDiscovery: the first candidate that exists and answers CRI Version wins, under the
// host prefix; one that is not a CRI runtime (a containerd with its CRI plugin disabled,
// as Docker installs it) is skipped.
func TestDiscovery(t *testing.T) {
	prefix := hostPrefix(t)
	// Docker's containerd: the socket exists, without the CRI RuntimeService.
	serve(t, hostSocket(t, prefix, "/run/containerd/containerd.sock"), nil, newFakeEvents())
	// A stale file where CRI-O's socket was.
	if err := os.WriteFile(hostSocket(t, prefix, "/var/run/crio/crio.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	rt := newFakeRuntime("containerd", false)
	rt.version = "v1.7.27-k3s1"
	rt.set("c1", running, labels("ns", "p", "app"))
	k3s := hostSocket(t, prefix, "/run/k3s/containerd/containerd.sock")
	serve(t, k3s, rt, nil)

	w, events, _ := testWatcher(t, "", Options{Endpoint: EndpointAuto, HostPrefix: prefix})
	if ev := next(t, events); ev.ContainerID != "c1" {
		t.Errorf("event %+v", ev)
	}
	if st := w.Stats(); st.Endpoint != "unix://"+k3s || !st.Connected || st.Runtime != "containerd v1.7.27-k3s1" {
		t.Errorf("stats %+v, want connected to %s", st, k3s)
	}

	// The fencing client follows what discovery found.
	rc, err := w.RuntimeClient()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rc.Close(); err != nil {
			t.Error(err)
		}
	}()
	cs, err := rc.RunningContainers(context.Background())
	if err != nil || len(cs) != 1 || cs[0].ID != "c1" {
		t.Errorf("RunningContainers = %+v, %v", cs, err)
	}
}

// TestDiscoveryNothingFound: no candidate answers: one error that names every path
// tried, not connected, and the watcher keeps looking until a runtime appears.
func TestDiscoveryNothingFound(t *testing.T) {
	prefix := hostPrefix(t)
	if !IsAuto("") || !IsAuto(EndpointAuto) {
		t.Error(`"" and "auto" are not discovery`)
	}
	w, events, clk := testWatcher(t, "", Options{Endpoint: EndpointAuto, HostPrefix: prefix})
	waitTimer(t, clk)
	err := w.LastError()
	if err == nil || w.Connected() {
		t.Fatalf("LastError %v, Connected %v", err, w.Connected())
	}
	for _, c := range DefaultSockets {
		if !strings.Contains(err.Error(), filepath.Join(prefix, c)+": no such socket") {
			t.Errorf("LastError %q does not name %s", err, c)
		}
	}
	if !strings.Contains(err.Error(), "no container runtime found") {
		t.Errorf("LastError %q", err)
	}
	rc, _ := w.RuntimeClient()
	if _, err := rc.RunningContainers(context.Background()); err == nil {
		t.Error("RunningContainers worked before discovery found a runtime")
	}
	if err := rc.Close(); err != nil {
		t.Error(err)
	}

	rt := newFakeRuntime("cri-o", true)
	rt.endAtOnce = true
	rt.set("c1", running, labels("ns", "p", "app"))
	serve(t, hostSocket(t, prefix, "/run/crio/crio.sock"), rt, nil)
	stepUntil(t, clk, 500*time.Millisecond, "discovery", w.Connected)
	if ev := next(t, events); ev.ContainerID != "c1" {
		t.Errorf("event %+v", ev)
	}
}

// TestRepeatedErrorLoggedOnce: a wrong explicit endpoint is logged once, not on every
// retry, and again after ErrorLogInterval.
func TestRepeatedErrorLoggedOnce(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	w := New(Options{Endpoint: "unix:///nonexistent/containerd.sock", Clock: clk, Backoff: time.Second, MaxBackoff: time.Second, ErrorLogInterval: time.Minute})
	events := w.Events(ctx)
	t.Cleanup(func() {
		cancel()
		for range events {
		}
	})
	count := func() int {
		return strings.Count(logger.GetSink().(ktesting.Underlier).GetBuffer().String(), "Container runtime not usable")
	}
	for range 20 {
		step(t, clk, time.Second)
	}
	waitTimer(t, clk)
	if c := count(); c != 1 {
		t.Errorf("logged %d times in 20 retries, want 1", c)
	}
	for range 45 {
		step(t, clk, time.Second)
	}
	waitTimer(t, clk)
	if c := count(); c != 2 {
		t.Errorf("logged %d times after more than ErrorLogInterval, want 2", c)
	}
	if err := w.LastError(); err == nil || !strings.Contains(err.Error(), "/nonexistent/containerd.sock does not exist") {
		t.Errorf("LastError %v", err)
	}
}
