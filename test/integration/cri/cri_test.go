// Package cri_test runs the cri package's Watcher against real containerds (test/containerd):
// Debian's 1.6 with runc 1.1 (no CRI events: relist), 1.7 built from its module with runc
// 1.1 (CRI GetContainerEvents on a channel shared by every subscriber: never subscribed to,
// relist) and 2.x with runc 1.5 built from their modules (CRI GetContainerEvents), each
// test once per runtime, the test playing the kubelet over CRI.
package cri_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/coroner-dev/coroner/cri"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
)

func TestMain(m *testing.M) { os.Exit(containerdtest.Main(m)) }

// recorder drains a Watcher's events into a list that tests wait on.
type recorder struct {
	mu     sync.Mutex
	events []cri.ContainerEvent
	added  chan struct{}
}

// watch starts a Watcher on the shared containerd and records its events until the test
// ends.
func watch(t *testing.T, env *containerd.Env, opts cri.Options) (*cri.Watcher, *recorder) {
	t.Helper()
	opts.Endpoint = env.Endpoint
	w := cri.New(opts)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	r := &recorder{added: make(chan struct{}, 1)}
	events := w.Events(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range events {
			r.mu.Lock()
			r.events = append(r.events, ev)
			r.mu.Unlock()
			select {
			case r.added <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w, r
}

// matching returns the recorded events that match.
func (r *recorder) matching(match func(cri.ContainerEvent) bool) []cri.ContainerEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []cri.ContainerEvent
	for _, ev := range r.events {
		if match(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// wait returns the first event that matches, failing after timeout.
func (r *recorder) wait(t *testing.T, what string, timeout time.Duration, match func(cri.ContainerEvent) bool) cri.ContainerEvent {
	t.Helper()
	deadline := time.After(timeout)
	for {
		if evs := r.matching(match); len(evs) > 0 {
			return evs[0]
		}
		select {
		case <-r.added:
		case <-deadline:
			t.Fatalf("no %s event within %v; recorded: %+v", what, timeout, r.matching(func(cri.ContainerEvent) bool { return true }))
		}
	}
}

func is(kind cri.Kind, id string) func(cri.ContainerEvent) bool {
	return func(ev cri.ContainerEvent) bool { return ev.Kind == kind && ev.ContainerID == id }
}

func ofContainer(id string) func(cri.ContainerEvent) bool {
	return func(ev cri.ContainerEvent) bool { return ev.ContainerID == id }
}

// settle lets two relists and any late containerd events pass, to catch duplicates.
const settle = 2100 * time.Millisecond

func TestExitCode(t *testing.T) { containerdtest.Each(t, testExitCode) }

func testExitCode(t *testing.T, env *containerd.Env) {
	type testCase struct {
		name string
		opts cri.Options
		// wantSources are where the exit may be seen first.
		wantSources []string
	}
	cases := []testCase{
		{name: "containerd events", opts: cri.Options{}, wantSources: []string{cri.SourceContainerd}},
		{name: "relist only", opts: cri.Options{NoContainerdEvents: true}, wantSources: []string{cri.SourceRelist}},
	}
	if env.Containerd.Events() {
		// containerd 2.x sends both a task exit and a CRI stopped event: either is first.
		cases = []testCase{
			{name: "containerd events", opts: cri.Options{}, wantSources: []string{cri.SourceContainerd, cri.SourceCRIEvents}},
			{name: "CRI events only", opts: cri.Options{NoContainerdEvents: true}, wantSources: []string{cri.SourceCRIEvents}},
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			w, rec := watch(t, env, tc.opts)
			// Connected comes with CRI Version; the streams are subscribed a moment later
			// (on a loaded machine, later than the container below takes to exit).
			waitUntil(t, "connected and subscribed", func() bool {
				st := w.Stats()
				return st.Connected && st.Mode != cri.ModeNone && (tc.opts.NoContainerdEvents || st.ContainerdEvents)
			})

			start := time.Now()
			pod, err := env.RunPod(ctx, "it", "exit3")
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := pod.Remove(ctx); err != nil {
					t.Errorf("removing the pod: %v", err)
				}
			}()
			sandboxAt := time.Since(start)
			id, err := pod.StartContainer(ctx, containerd.Container{Name: "main", Command: []string{"sh", "-c", "sleep 0.2; exit 3"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("sandbox started in %v, container created and started in %v", sandboxAt.Round(time.Millisecond), (time.Since(start) - sandboxAt).Round(time.Millisecond))

			ev := rec.wait(t, "Exited", 10*time.Second, is(cri.Exited, id))
			if ev.ExitCode != 3 || ev.Reason != "Error" || ev.PodNamespace != "it" || ev.PodName != "exit3" ||
				ev.PodUID != pod.UID || ev.ContainerName != "main" || ev.SandboxID != pod.SandboxID || ev.FinishedAt.IsZero() {
				t.Errorf("Exited event %+v", ev)
			}
			if !slices.Contains(tc.wantSources, ev.Source) {
				t.Errorf("exit seen by %s, want one of %v", ev.Source, tc.wantSources)
			}
			t.Logf("exit to event: %v (source %s)", ev.ObservedAt.Sub(ev.FinishedAt).Round(time.Millisecond), ev.Source)
			if started := rec.matching(is(cri.Started, id)); len(started) == 1 {
				if want := pod.CgroupParent + "/" + id; started[0].CgroupPath != want {
					t.Errorf("cgroup path %q, want %q", started[0].CgroupPath, want)
				}
			}
			time.Sleep(settle)
			if n := len(rec.matching(is(cri.Exited, id))); n != 1 {
				t.Errorf("%d Exited events, want 1", n)
			}
		})
	}
}

func TestOOMKilled(t *testing.T) { containerdtest.Each(t, testOOMKilled) }

func testOOMKilled(t *testing.T, env *containerd.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, rec := watch(t, env, cri.Options{})
	pod, err := env.RunPod(ctx, "it", "oom")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pod.Remove(ctx); err != nil {
			t.Errorf("removing the pod: %v", err)
		}
	}()
	id, err := pod.StartContainer(ctx, containerd.Container{Name: "hog", Command: []string{"/bin/memhog"}, MemoryLimit: 20 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ev := rec.wait(t, "Exited", 30*time.Second, is(cri.Exited, id))
	if ev.Reason != "OOMKilled" || ev.ExitCode != 137 || ev.PodName != "oom" || ev.ContainerName != "hog" {
		t.Errorf("Exited event %+v, want reason OOMKilled, exit code 137", ev)
	}
	oom := rec.wait(t, "OOM", 10*time.Second, is(cri.OOM, id))
	if oom.Source != cri.SourceContainerd || oom.PodUID != pod.UID || oom.MemoryLimit != 20<<20 || oom.OOMAt.IsZero() {
		t.Errorf("OOM event %+v", oom)
	}
	t.Logf("exit to event: %v (source %s); OOM event %v after the kill, exit %v after",
		ev.ObservedAt.Sub(ev.FinishedAt).Round(time.Millisecond), ev.Source,
		oom.ObservedAt.Sub(oom.OOMAt).Round(time.Millisecond), ev.FinishedAt.Sub(oom.OOMAt).Round(time.Millisecond))
	time.Sleep(settle)
	if n := len(rec.matching(is(cri.Exited, id))); n != 1 {
		t.Errorf("%d Exited events, want 1", n)
	}
}

// TestChildOOMKilled: the kernel kills a child process over the limit while PID 1
// survives: an OOM event, and no exit.
func TestChildOOMKilled(t *testing.T) { containerdtest.Each(t, testChildOOMKilled) }

func testChildOOMKilled(t *testing.T, env *containerd.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, rec := watch(t, env, cri.Options{})
	pod, err := env.RunPod(ctx, "it", "child-oom")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pod.Remove(ctx); err != nil {
			t.Errorf("removing the pod: %v", err)
		}
	}()
	id, err := pod.StartContainer(ctx, containerd.Container{Name: "hog", Command: []string{"/bin/memhog", "-child"}, MemoryLimit: 20 << 20})
	if err != nil {
		t.Fatal(err)
	}
	oom := rec.wait(t, "OOM", 30*time.Second, is(cri.OOM, id))
	if oom.PodName != "child-oom" || oom.ContainerName != "hog" {
		t.Errorf("OOM event %+v", oom)
	}
	time.Sleep(settle)
	if evs := rec.matching(is(cri.Exited, id)); len(evs) > 0 {
		t.Errorf("the container exited: %+v", evs[0])
	}
	st, err := env.ContainerStatus(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if st.State.String() != "CONTAINER_RUNNING" {
		t.Errorf("container state %v, want running", st.State)
	}
}

// TestRuntimeRestart: containerd dies, the container exits while it is down, containerd
// comes back: the exit is delivered once.
func TestRuntimeRestart(t *testing.T) { containerdtest.Each(t, testRuntimeRestart) }

func testRuntimeRestart(t *testing.T, env *containerd.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w, rec := watch(t, env, cri.Options{})
	pod, err := env.RunPod(ctx, "it", "restart")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pod.Remove(ctx); err != nil {
			t.Errorf("removing the pod: %v", err)
		}
	}()
	id, err := pod.StartContainer(ctx, containerd.Container{Name: "main",
		Command: []string{"sh", "-c", "while [ ! -e /tmp/stop ]; do sleep 0.05; done; exit 7"}})
	if err != nil {
		t.Fatal(err)
	}
	started := rec.wait(t, "Started", 10*time.Second, is(cri.Started, id))
	pid := containerPID(t, started.CgroupPath)

	env.Kill()
	waitUntil(t, "the watcher noticing containerd is gone", func() bool { return !w.Connected() })
	t.Logf("watcher: %v", w.LastError())
	if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "root/tmp/stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the container exiting", func() bool { return !alive(pid) })
	if n := len(rec.matching(ofContainer(id))); n != 1 {
		t.Errorf("%d events before the restart, want only Started", n)
	}

	start := time.Now()
	if err := env.StartAgain(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	ev := rec.wait(t, "Exited", 30*time.Second, is(cri.Exited, id))
	t.Logf("containerd ready again %v after its start; the exit that happened while it was down delivered %v after its start (source %s)",
		restarted.Sub(start).Round(time.Millisecond), ev.ObservedAt.Sub(start).Round(time.Millisecond), ev.Source)
	// containerd 1.7 and 2.x report exit 255 "Unknown" for a container that exited while
	// it was down (test/containerd/containerdtest TestRestartKeepsContainers): the exit is
	// still delivered, once.
	wantCode := int32(7)
	if env.Containerd.LosesExitWhileDown() {
		wantCode = 255
	}
	if ev.ExitCode != wantCode || ev.PodName != "restart" {
		t.Errorf("Exited event %+v, want exit code %d", ev, wantCode)
	}
	time.Sleep(settle)
	if n := len(rec.matching(is(cri.Exited, id))); n != 1 {
		t.Errorf("%d Exited events, want 1", n)
	}
	// containerd 1.6 has no GetContainerEvents and 1.7 shares its channel: relist mode,
	// plus containerd's events; 2.x has both streams.
	wantMode := cri.ModeRelist
	if env.Containerd.Events() {
		wantMode = cri.ModeEvents
	}
	if st := w.Stats(); !st.Connected || st.Connects < 2 || !st.ContainerdEvents || st.Mode != wantMode ||
		!strings.HasPrefix(st.Runtime, "containerd ") {
		t.Errorf("stats after the restart: %+v", st)
	}
}

// TestMode: the mode the Watcher picks on each runtime, and why. containerd 2.x: events
// (the CRI stream, which gives every subscriber every event). containerd 1.7 serves
// GetContainerEvents, but on one channel every subscriber takes from (TestContainerdV2EventStream
// records it): relist, saying so, and the stream never opened. 1.6: relist. All three: containerd's
// own event service beside it.
func TestMode(t *testing.T) { containerdtest.Each(t, testMode) }

func testMode(t *testing.T, env *containerd.Env) {
	w, _ := watch(t, env, cri.Options{})
	waitUntil(t, "connected and subscribed", func() bool {
		st := w.Stats()
		return st.Connected && st.Mode != cri.ModeNone && st.ContainerdEvents
	})
	st := w.Stats()
	t.Logf("%s: runtime %q, mode %s, no stream: %q", env.Containerd.Name, st.Runtime, st.Mode, st.NoStream)
	switch {
	case env.Containerd.Events():
		if st.Mode != cri.ModeEvents || st.NoStream != "" {
			t.Errorf("mode %s (no stream: %q), want events", st.Mode, st.NoStream)
		}
	case env.Containerd.SharedEvents():
		if st.Mode != cri.ModeRelist || !strings.Contains(st.NoStream, "shares one GetContainerEvents channel") ||
			!strings.Contains(st.NoStream, env.Containerd.Version) {
			t.Errorf("mode %s (no stream: %q), want relist because containerd %s shares its CRI event channel", st.Mode, st.NoStream, env.Containerd.Version)
		}
	default:
		if st.Mode != cri.ModeRelist || st.NoStream == "" {
			t.Errorf("mode %s (no stream: %q), want relist, saying why", st.Mode, st.NoStream)
		}
	}
	if !strings.Contains(st.Runtime, env.Containerd.Version) {
		t.Errorf("runtime %q does not name containerd %s", st.Runtime, env.Containerd.Version)
	}
}

func TestUnlabeledContainersIgnored(t *testing.T) {
	containerdtest.Each(t, testUnlabeledContainersIgnored)
}

func testUnlabeledContainersIgnored(t *testing.T, env *containerd.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w, rec := watch(t, env, cri.Options{})
	pod, err := env.RunPod(ctx, "it", "unlabeled")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pod.Remove(ctx); err != nil {
			t.Errorf("removing the pod: %v", err)
		}
	}()
	id, err := pod.StartContainer(ctx, containerd.Container{Name: "other", Command: []string{"sh", "-c", "exit 1"}, Unlabeled: true})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the container counted as ignored", func() bool { return w.Stats().IgnoredContainers >= 1 })
	time.Sleep(settle)
	if evs := rec.matching(ofContainer(id)); len(evs) > 0 {
		t.Errorf("events for a container without the kubelet's labels: %+v", evs)
	}
}

// containerPID reads the container's main process from its memory cgroup. The Started
// event can come before the process is the shell: runc's start returns once runc init has
// been told to go, and runc init execs the command after that (CI saw the cgroup's one
// process still without the shell's command line), so it waits for the exec.
func containerPID(t *testing.T, cgroupPath string) int {
	t.Helper()
	if cgroupPath == "" {
		t.Fatal("no cgroup path in the Started event")
	}
	procs := filepath.Join("/sys/fs/cgroup/memory", cgroupPath, "cgroup.procs")
	var seen []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(procs)
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
		for _, f := range strings.Fields(string(b)) {
			cmd, _ := os.ReadFile("/proc/" + f + "/cmdline")
			if strings.Contains(string(cmd), "/tmp/stop") {
				pid, _ := strconv.Atoi(f)
				return pid
			}
			seen = append(seen, fmt.Sprintf("%s %q", f, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no shell in cgroup %s within 10s: processes %v", cgroupPath, seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
