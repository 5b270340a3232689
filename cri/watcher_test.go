package cri

import (
	"strings"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/types/known/timestamppb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	running = runtimeapi.ContainerState_CONTAINER_RUNNING
	exited  = runtimeapi.ContainerState_CONTAINER_EXITED
	created = runtimeapi.ContainerState_CONTAINER_CREATED
)

// ignoreTimes leaves out when the watcher saw an event, which tests check separately.
var ignoreTimes = cmpopts.IgnoreFields(ContainerEvent{}, "ObservedAt")

// byID collects n events by container id.
func byID(t *testing.T, events <-chan ContainerEvent, n int) map[string]ContainerEvent {
	t.Helper()
	out := map[string]ContainerEvent{}
	for range n {
		ev := next(t, events)
		out[ev.ContainerID+"/"+string(ev.Kind)] = ev
	}
	return out
}

func TestRelistEmitsEachExitOnce(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("fake", false)
	rt.set("c1", running, labels("ns", "web", "app"))
	rt.set("c2", running, labels("ns", "job", "main"))
	rt.exit("c2", 3, "Error") // exited before the watcher started
	rt.set("c3", created, labels("ns", "job", "side"))
	serve(t, path, rt, nil)

	w, events, clk := testWatcher(t, path, Options{})
	got := byID(t, events, 2)
	settled(t, w)
	want := map[string]ContainerEvent{
		"c1/Started": {
			Kind: Started, PodNamespace: "ns", PodName: "web", PodUID: "uid-web", ContainerName: "app",
			ContainerID: "c1", SandboxID: "sandbox-web", StartedAt: time.Unix(101, 0),
			CgroupPath: "/kubepods/burstable/poduid-web/c1", MemoryLimit: 20 << 20, PID: 42, Source: SourceRelist,
		},
		"c2/Exited": {
			Kind: Exited, PodNamespace: "ns", PodName: "job", PodUID: "uid-job", ContainerName: "main",
			ContainerID: "c2", SandboxID: "sandbox-job", ExitCode: 3, Reason: "Error",
			StartedAt: time.Unix(101, 0), FinishedAt: time.Unix(200, 0),
			CgroupPath: "/kubepods/burstable/poduid-job/c2", MemoryLimit: 20 << 20, PID: 42, Source: SourceRelist,
		},
	}
	if diff := cmp.Diff(want, got, ignoreTimes); diff != "" {
		t.Errorf("first relist (-want +got):\n%s", diff)
	}
	if !got["c1/Started"].ObservedAt.Equal(clk.Now()) {
		t.Errorf("ObservedAt %v, want the fake clock's %v", got["c1/Started"].ObservedAt, clk.Now())
	}

	rt.exit("c1", 137, "OOMKilled")
	step(t, clk, time.Second)
	ev := next(t, events)
	if ev.Kind != Exited || ev.ContainerID != "c1" || ev.ExitCode != 137 || ev.Reason != "OOMKilled" || ev.PodName != "web" {
		t.Errorf("after c1 exited: %+v", ev)
	}
	// More relists: nothing new.
	for range 3 {
		step(t, clk, time.Second)
	}
	waitTimer(t, clk)
	none(t, events)
	st := w.Stats()
	if st.Mode != ModeRelist || st.Relists != 5 || st.Emitted[Exited] != 2 || st.Emitted[Started] != 1 || !st.Connected {
		t.Errorf("stats %+v", st)
	}
}

func TestRelistPeriod(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("fake", false)
	serve(t, path, rt, nil)
	w, _, clk := testWatcher(t, path, Options{RelistPeriod: 3 * time.Second})
	settled(t, w)
	clk.Step(2 * time.Second) // not yet
	clk.Step(999 * time.Millisecond)
	if n := rt.lists(); n != 1 {
		t.Fatalf("%d lists before the period passed, want 1", n)
	}
	clk.Step(time.Millisecond)
	waitTimer(t, clk)
	if n := rt.lists(); n != 2 {
		t.Fatalf("%d lists after the period, want 2", n)
	}
}

func TestContainerEventsStreamUsedWhenAvailable(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("fake", true)
	serve(t, path, rt, nil)
	w, events, _ := testWatcher(t, path, Options{})
	wait(t, "GetContainerEvents", rt.subscribed)
	waitFor(t, "the first relist", func() bool { return w.Stats().Mode == ModeEvents })

	rt.set("c1", running, labels("ns", "p", "app"))
	rt.criEvents <- &runtimeapi.ContainerEventResponse{ContainerId: "c1", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}
	if ev := next(t, events); ev.Kind != Started || ev.ContainerID != "c1" || ev.Source != SourceCRIEvents || ev.CgroupPath == "" {
		t.Errorf("started: %+v", ev)
	}

	// A stop event carries the statuses; the same event twice is one exit.
	st := rt.exit("c1", 2, "Error")
	stopped := &runtimeapi.ContainerEventResponse{
		ContainerId: "c1", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STOPPED_EVENT,
		PodSandboxStatus:   &runtimeapi.PodSandboxStatus{Id: "sandbox-p"},
		ContainersStatuses: []*runtimeapi.ContainerStatus{st},
	}
	rt.criEvents <- stopped
	ev := next(t, events)
	if ev.Kind != Exited || ev.ExitCode != 2 || ev.Source != SourceCRIEvents || ev.CgroupPath != "/kubepods/burstable/poduid-p/c1" {
		t.Errorf("exited: %+v", ev)
	}
	rt.criEvents <- stopped
	rt.set("c2", running, labels("ns", "p", "other"))
	rt.criEvents <- &runtimeapi.ContainerEventResponse{ContainerId: "c2", ContainerEventType: runtimeapi.ContainerEventType_CONTAINER_STARTED_EVENT}
	if ev := next(t, events); ev.ContainerID != "c2" || ev.Kind != Started {
		t.Errorf("after a repeated stop event: %+v, want c2 Started only", ev)
	}
	if n := rt.lists(); n != 1 {
		t.Errorf("%d ListContainers calls, want only the initial one", n)
	}
	if m := w.Stats().Mode; m != ModeEvents {
		t.Errorf("mode %q, want events", m)
	}
}

func TestReconnectRelistsExitsMissedWhileDisconnected(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("fake", false)
	rt.set("c1", running, labels("ns", "a", "app"))
	rt.set("c2", running, labels("ns", "b", "app"))
	srv := serve(t, path, rt, nil)
	w, events, clk := testWatcher(t, path, Options{Backoff: 500 * time.Millisecond})
	byID(t, events, 2)
	settled(t, w)
	rt.exit("c2", 1, "Error")
	step(t, clk, time.Second)
	if ev := next(t, events); ev.ContainerID != "c2" || ev.Kind != Exited {
		t.Fatalf("c2: %+v", ev)
	}

	// The runtime goes away; c1 exits meanwhile.
	srv.stop()
	rt.exit("c1", 143, "Error")
	step(t, clk, time.Second) // the relist fails; the watcher backs off
	waitTimer(t, clk)
	if w.Connected() {
		t.Error("Connected after the runtime went away")
	}
	if err := w.LastError(); err == nil || !strings.Contains(err.Error(), "connection lost") {
		t.Errorf("LastError = %v", err)
	}
	step(t, clk, 500*time.Millisecond) // socket gone: the first retry fails too
	waitTimer(t, clk)
	if err := w.LastError(); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("LastError = %v", err)
	}

	serve(t, path, rt, nil)
	step(t, clk, time.Second) // second backoff: 1s
	ev := next(t, events)
	if ev.ContainerID != "c1" || ev.Kind != Exited || ev.ExitCode != 143 {
		t.Errorf("after reconnecting: %+v, want c1 Exited 143", ev)
	}
	waitTimer(t, clk)
	none(t, events) // c2's exit is not emitted again
	if !w.Connected() || w.LastError() != nil {
		t.Errorf("Connected=%v LastError=%v after reconnecting", w.Connected(), w.LastError())
	}
	if st := w.Stats(); st.Connects != 2 || st.Emitted[Exited] != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestUnlabeledContainersIgnoredAndCounted(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("fake", false)
	rt.set("bare", running, map[string]string{"app": "x"})
	partial := labels("ns", "p", "app")
	delete(partial, LabelContainerName)
	rt.set("partial", running, partial)
	rt.set("kube", running, labels("ns", "p", "app"))
	serve(t, path, rt, nil)
	w, events, clk := testWatcher(t, path, Options{})
	if ev := next(t, events); ev.ContainerID != "kube" {
		t.Errorf("event for %s, want only kube", ev.ContainerID)
	}
	settled(t, w)
	rt.exit("bare", 1, "Error")
	step(t, clk, time.Second)
	step(t, clk, time.Second)
	waitTimer(t, clk)
	none(t, events)
	if n := w.Stats().IgnoredContainers; n != 2 {
		t.Errorf("IgnoredContainers = %d, want 2 (each counted once)", n)
	}
}

func TestMissingSocket(t *testing.T) {
	path := socketIn(t)
	w, events, clk := testWatcher(t, path, Options{})
	waitTimer(t, clk)
	if w.Connected() {
		t.Error("Connected without a socket")
	}
	err := w.LastError()
	if err == nil || !strings.Contains(err.Error(), "does not exist: is the container runtime running?") {
		t.Errorf("LastError = %v", err)
	}

	// The runtime comes up later: the watcher keeps retrying and connects.
	rt := newFakeRuntime("fake", false)
	rt.set("c1", running, labels("ns", "p", "app"))
	serve(t, path, rt, nil)
	step(t, clk, 500*time.Millisecond)
	if ev := next(t, events); ev.ContainerID != "c1" {
		t.Errorf("event %+v", ev)
	}
	if !w.Connected() {
		t.Error("not Connected after the runtime came up")
	}
}

func TestBackoffGrows(t *testing.T) {
	path := socketIn(t)
	_, _, clk := testWatcher(t, path, Options{Backoff: time.Second, MaxBackoff: 4 * time.Second})
	for _, d := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		waitTimer(t, clk)
		clk.Step(d - time.Millisecond)
		if !clk.HasWaiters() {
			t.Fatalf("retried before %v", d)
		}
		clk.Step(time.Millisecond)
	}
}

func TestNotACRIRuntime(t *testing.T) {
	path := socketIn(t)
	serve(t, path, nil, newFakeEvents()) // a gRPC server without the RuntimeService
	w, _, clk := testWatcher(t, path, Options{})
	waitTimer(t, clk)
	err := w.LastError()
	if err == nil || !strings.Contains(err.Error(), "does not serve the CRI v1 RuntimeService") {
		t.Errorf("LastError = %v", err)
	}
	if w.Connected() {
		t.Error("Connected to a server that is not CRI")
	}
}

func TestEndpoint(t *testing.T) {
	for _, tc := range []struct {
		endpoint, wantPath, wantErr string
	}{
		{endpoint: "unix:///run/containerd/containerd.sock", wantPath: "/run/containerd/containerd.sock"},
		{endpoint: "/run/crio/crio.sock", wantPath: "/run/crio/crio.sock"},
		{endpoint: "tcp://127.0.0.1:1234", wantErr: "want unix:///path/to/socket"},
		{endpoint: "unix://", wantErr: "want unix:///path/to/socket"},
	} {
		t.Run(tc.endpoint, func(t *testing.T) {
			path, err := socketPath(tc.endpoint)
			if path != tc.wantPath || (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("socketPath(%q) = %q, %v; want %q, %q", tc.endpoint, path, err, tc.wantPath, tc.wantErr)
			}
		})
	}
}

func TestContainerdEvents(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("containerd", false)
	rt.set("c1", running, labels("ns", "hog", "main"))
	ev := newFakeEvents()
	serve(t, path, rt, ev)
	w, events, clk := testWatcher(t, path, Options{})
	if e := next(t, events); e.Kind != Started {
		t.Fatalf("%+v", e)
	}
	settled(t, w)
	var filters []string
	select {
	case filters = <-ev.subscribed:
	case <-time.After(10 * time.Second):
		t.Fatal("no containerd subscription")
	}
	wantFilters := []string{`topic=="/tasks/exit",namespace=="k8s.io"`, `topic=="/tasks/oom",namespace=="k8s.io"`}
	if diff := cmp.Diff(wantFilters, filters); diff != "" {
		t.Errorf("filters (-want +got):\n%s", diff)
	}

	// An OOM kill in the container (which keeps running), then one in a pod sandbox,
	// which CRI does not know as a container.
	oomAt := time.Unix(300, 0)
	ev.push(t, topicTaskOOM, &eventtypes.TaskOOM{ContainerID: "c1"}, oomAt)
	ev.push(t, topicTaskOOM, &eventtypes.TaskOOM{ContainerID: "sandbox-hog"}, oomAt)
	got := next(t, events)
	want := ContainerEvent{
		Kind: OOM, PodNamespace: "ns", PodName: "hog", PodUID: "uid-hog", ContainerName: "main",
		ContainerID: "c1", SandboxID: "sandbox-hog", StartedAt: time.Unix(101, 0), OOMAt: oomAt,
		CgroupPath: "/kubepods/burstable/poduid-hog/c1", MemoryLimit: 20 << 20, PID: 42, Source: SourceContainerd,
	}
	if diff := cmp.Diff(want, got, ignoreTimes); diff != "" {
		t.Errorf("OOM event (-want +got):\n%s", diff)
	}

	// The task exit is delivered without waiting for a relist, and only once.
	rt.exit("c1", 137, "OOMKilled")
	ev.push(t, topicTaskExit, &eventtypes.TaskExit{ContainerID: "c1", ID: "exec-1", ExitStatus: 1}, time.Unix(400, 0))
	ev.push(t, topicTaskExit, &eventtypes.TaskExit{ContainerID: "c1", ID: "c1", ExitStatus: 137, ExitedAt: timestamppb.New(time.Unix(400, 0))}, time.Unix(400, 0))
	got = next(t, events)
	if got.Kind != Exited || got.ExitCode != 137 || got.Reason != "OOMKilled" || got.Source != SourceContainerd {
		t.Errorf("exit: %+v", got)
	}
	step(t, clk, time.Second)
	waitTimer(t, clk)
	none(t, events)
	if st := w.Stats(); !st.ContainerdEvents || st.Emitted[OOM] != 1 || st.Emitted[Exited] != 1 {
		t.Errorf("stats %+v", st)
	}
}

func TestNoContainerdEventsOption(t *testing.T) {
	path := socketIn(t)
	rt := newFakeRuntime("containerd", false)
	ev := newFakeEvents()
	serve(t, path, rt, ev)
	w, _, clk := testWatcher(t, path, Options{NoContainerdEvents: true})
	settled(t, w)
	step(t, clk, time.Second)
	waitTimer(t, clk)
	select {
	case <-ev.subscribed:
		t.Error("subscribed to containerd events although NoContainerdEvents")
	default:
	}
	if w.Stats().ContainerdEvents {
		t.Error("Stats.ContainerdEvents")
	}
}
