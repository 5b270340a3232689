package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/agent/cgroup"
	"github.com/coroner-dev/coroner/api/v1alpha1"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
	"github.com/coroner-dev/coroner/test/harness"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

// startStoppableAgent is startAgent with a stop: stop cancels the agent's context and
// waits for agent.Run to return, as a SIGTERM of the agent's container or a rollout does
// (and, for what it has not written yet, a SIGKILL: the next agent starts from nothing).
func startStoppableAgent(t *testing.T, api *harness.Env, node, endpoint string, tweaks ...func(*agent.Options)) (a *runningAgent, stop func()) {
	t.Helper()
	opts := agent.NewOptions()
	opts.NodeName = node
	opts.RuntimeEndpoint = endpoint
	opts.PhaseGrace = phaseGrace
	opts.MetricsAddress = freeAddr(t)
	opts.QPS, opts.Burst = 50, 100
	for _, tweak := range tweaks {
		tweak(opts)
	}
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(api.Config)
	cfg.QPS, cfg.Burst = opts.QPS, opts.Burst
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx, cfg, opts) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent.Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("agent.Run did not return within 30s of its context's end")
		}
	}
	t.Cleanup(stop)
	a = &runningAgent{addr: opts.MetricsAddress}
	waitFor(t, "the agent serving /metrics", func() bool {
		_, err := a.scrape()
		return err == nil
	})
	return a, stop
}

// gated is a command that waits for /tmp/go in the container's root, then runs then.
func gated(then string) []string {
	return []string{"sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; " + then}
}

// release creates /tmp/go in a running container's root (see gated).
func (f *fixture) release(p *kubeletsim.Pod, id string) int {
	f.t.Helper()
	pid, err := p.PID(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(pid), "root/tmp/go"), nil, 0o644); err != nil {
		f.t.Fatal(err)
	}
	return pid
}

// history reads the pod's exit history annotation.
func (f *fixture) history(p *kubeletsim.Pod) []v1alpha1.Exit {
	f.t.Helper()
	got := f.get(p)
	entries, err := v1alpha1.ParseExitHistory(got.Annotations[conditions.AnnotationExitHistory])
	if err != nil {
		f.t.Fatalf("exit history %q: %v", got.Annotations[conditions.AnnotationExitHistory], err)
	}
	return entries
}

// TestRestartRecovery (issue 12, item 1): an agent runs, is stopped; while no agent runs
// a container is OOM-killed at its limit, another container's child is OOM-killed while
// its main process survives, and a restartPolicy OnFailure pod's container exits again
// (the kubelet, played by the test, restarted it in place). A new agent stamps every pod
// exactly once: OOMKilled on both OOM pods (placed by the kernel's kill lines, read from
// the oldest record of /dev/kmsg, and the container cgroup's counters), the second exit
// appended to the exit history without a duplicate of the first one, which the first
// agent recorded. A third agent, started after, writes nothing at all.
func TestRestartRecovery(t *testing.T) { containerdtest.Each(t, testRestartRecovery) }

func testRestartRecovery(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	a1, stop1 := startStoppableAgent(t, f.api, nodeA, f.cri.Endpoint)

	hog := f.pod(nodeA, "hog", 20<<20, gated("exec /bin/memhog")...)
	hogID := f.start(hog)
	child := f.pod(nodeA, "child-hog", 20<<20, gated("exec /bin/memhog -child")...)
	childID := f.start(child)
	hist := f.podWith(nodeA, "retry", kubeletsim.PodOptions{RestartPolicy: corev1.RestartPolicyOnFailure,
		Containers: []containerd.Container{{Name: "main", Command: gated("exit 3")}}})
	first, err := hist.StartAttempt(f.ctx, "main", 0)
	if err != nil {
		t.Fatal(err)
	}
	f.release(hist, first)
	f.waitExited(hist, first)
	waitFor(t, "the first agent recording the first exit", func() bool { return len(f.history(hist)) == 1 })
	time.Sleep(1500 * time.Millisecond) // a relist: the first agent has seen every container start
	if n := a1.metric(t, "coroner_agent_stamps_total", "kind=LimitOOM"); n != 0 {
		t.Fatalf("the first agent stamped %v OOM kills before any", n)
	}
	stop1()

	// While no agent runs.
	hogPID := f.release(hog, hogID)
	waitFor(t, "the hog OOM-killed", func() bool { return !alive(hogPID) })
	_, hogReason, hogFinished := f.waitExited(hog, hogID)
	f.release(child, childID)
	waitFor(t, "the child OOM-killed", func() bool {
		m, err := cgroup.Read("/sys/fs/cgroup", child.CgroupParent+"/"+childID)
		return err == nil && m.OOMKill > 0
	})
	second, err := hist.StartAttempt(f.ctx, "main", 1)
	if err != nil {
		t.Fatal(err)
	}
	f.release(hist, second)
	f.waitExited(hist, second)
	t.Logf("while no agent ran: hog exited (%s) at %v, the child of child-hog was OOM-killed, retry's attempt 1 exited",
		hogReason, hogFinished.Format(time.RFC3339Nano))
	for _, p := range []*kubeletsim.Pod{hog, child} {
		if got := f.get(p); conditions.Find(&got.Status, conditions.OOMKilled) != nil {
			t.Fatalf("%s stamped while no agent ran", p.Object.Name)
		}
	}

	started := time.Now()
	a2, stop2 := startStoppableAgent(t, f.api, nodeA, f.cri.Endpoint)
	var hogAt, childAt, histAt time.Duration
	waitFor(t, "every pod stamped by the new agent", func() bool {
		if hogAt == 0 {
			if c := conditions.Find(&f.get(hog).Status, conditions.OOMKilled); c != nil && c.Status == corev1.ConditionTrue {
				hogAt = time.Since(started)
			}
		}
		if childAt == 0 {
			if c := conditions.Find(&f.get(child).Status, conditions.OOMKilled); c != nil && c.Status == corev1.ConditionTrue {
				childAt = time.Since(started)
			}
		}
		if histAt == 0 && len(f.history(hist)) == 2 {
			histAt = time.Since(started)
		}
		return hogAt > 0 && childAt > 0 && histAt > 0
	})
	t.Logf("after the new agent's start: hog stamped in %v, child-hog in %v, the exit history in %v",
		hogAt.Round(time.Millisecond), childAt.Round(time.Millisecond), histAt.Round(time.Millisecond))
	for _, p := range []*kubeletsim.Pod{hog, child} {
		c := conditions.Find(&f.get(p).Status, conditions.OOMKilled)
		if c.Reason != conditions.ReasonMemoryLimitExceeded {
			t.Errorf("%s: condition %+v, want reason %s", p.Object.Name, c, conditions.ReasonMemoryLimitExceeded)
		}
		t.Logf("%s: %q", p.Object.Name, c.Message)
	}
	entries := f.history(hist)
	if len(entries) != 2 || entries[0].RestartCount != 0 || entries[1].RestartCount != 1 || entries[0].ExitCode != 3 || entries[1].ExitCode != 3 {
		t.Errorf("exit history %+v, want exit 3 of restart 0 then of restart 1, once each", entries)
	}
	time.Sleep(time.Second) // more batch periods: nothing else may come
	if n := a2.metric(t, "coroner_agent_stamps_total", "kind=LimitOOM"); n != 2 {
		t.Errorf("the new agent stamped %v LimitOOM, want 2 (one per OOM pod)", n)
	}
	if n := a2.metric(t, "coroner_agent_stamps_total", "kind=ExitHistory"); n != 1 {
		t.Errorf("the new agent stamped %v ExitHistory, want 1 (the exit it did not see)", n)
	}
	if n := a2.metric(t, "coroner_agent_unknown_oom_total"); n != 0 {
		t.Errorf("unknown OOMs %v: the kernel's lines should have placed the kills", n)
	}
	stop2()

	// A third agent finds everything stamped: it writes nothing.
	before := map[string]string{}
	for _, p := range []*kubeletsim.Pod{hog, child, hist} {
		before[p.Object.Name] = f.get(p).ResourceVersion
	}
	a3, _ := startStoppableAgent(t, f.api, nodeA, f.cri.Endpoint)
	waitFor(t, "the third agent classifying the replayed exits", func() bool {
		return a3.metric(t, "coroner_agent_container_exits_total") >= 3
	})
	time.Sleep(time.Second)
	for _, p := range []*kubeletsim.Pod{hog, child, hist} {
		if rv := f.get(p).ResourceVersion; rv != before[p.Object.Name] {
			t.Errorf("%s written again by the third agent (resourceVersion %s -> %s)", p.Object.Name, before[p.Object.Name], rv)
		}
	}
	if n := a3.metric(t, "coroner_agent_stamps_total"); n != 0 {
		t.Errorf("the third agent stamped %v times, want 0", n)
	}
}

// TestShutdownDrains: an agent stopped (its context ended, as SIGTERM does) while a limit
// OOM's stamp waits in its batch writes the stamp before Run returns. The batch period
// is 10s (the longest allowed), so the stamp is still pending when the agent is told to
// stop; without the drain it would be lost with the process.
func TestShutdownDrains(t *testing.T) { containerdtest.Each(t, testShutdownDrains) }

func testShutdownDrains(t *testing.T, env *containerd.Env) {
	f := newFixture(t, env)
	const batch = 10 * time.Second
	a, stop := startStoppableAgent(t, f.api, nodeA, f.cri.Endpoint, func(o *agent.Options) { o.StampBatchPeriod = batch })
	p := f.pod(nodeA, "hog", 20<<20, "/bin/memhog")
	id := f.start(p)
	f.waitExited(p, id)
	waitFor(t, "the exit classified", func() bool {
		return a.metric(t, "coroner_agent_container_exits_total") >= 1
	})
	if c := conditions.Find(&f.get(p).Status, conditions.OOMKilled); c != nil {
		t.Fatalf("stamped before the stop (%+v): the batch period did not hold it; the test shows nothing", c)
	}
	began := time.Now()
	stop()
	took := time.Since(began)
	c := conditions.Find(&f.get(p).Status, conditions.OOMKilled)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != conditions.ReasonMemoryLimitExceeded {
		t.Fatalf("after the stop: OOMKilled %+v, want True MemoryLimitExceeded written by the drain", c)
	}
	if took >= batch {
		t.Errorf("the stop took %v: the drain waited for the batch period", took)
	}
	t.Logf("stopped in %v with the stamp written", took)
}
