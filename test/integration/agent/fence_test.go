package agent_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"

	"github.com/coroner-dev/coroner/agent"
	"github.com/coroner-dev/coroner/agent/fence"
	"github.com/coroner-dev/coroner/conditions"
	"github.com/coroner-dev/coroner/test/containerd"
	"github.com/coroner-dev/coroner/test/containerd/containerdtest"
	"github.com/coroner-dev/coroner/test/integration/agent/kubeletsim"
)

// apiProxy forwards TCP connections to the API server, so that a test can cut one agent
// off the shared API server (Cut: every connection closed, new ones closed at once) and
// let it back (Restore) while the API server keeps serving everyone else.
type apiProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startProxy listens on 127.0.0.1 and forwards to target (host:port) until the test ends.
func startProxy(t *testing.T, target string) *apiProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Addr is the proxy's host:port.
func (p *apiProxy) Addr() string { return p.ln.Addr().String() }

func (p *apiProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// track remembers an open connection; false while cut.
func (p *apiProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *apiProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *apiProxy) forward(down net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.untrack(down)
		return
	}
	if !p.track(up) {
		_ = up.Close()
		p.untrack(down)
		return
	}
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, down)
		p.untrack(up, down)
		close(done)
	}()
	_, _ = io.Copy(down, up)
	p.untrack(up, down)
	<-done
}

// Cut closes every connection and refuses new ones (accepted, then closed at once).
func (p *apiProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Restore lets connections through again.
func (p *apiProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// fencingAgent is an agent started by startFencingAgent.
type fencingAgent struct {
	*runningAgent
	// started is just before agent.Run was called: the agent's start, at the latest.
	started time.Time
	// exited is closed when agent.Run returns, with err its error.
	exited chan struct{}
	err    error
	// stop ends the agent and waits for agent.Run to return (again: at once).
	stop func()
}

// running fails the test if agent.Run has returned.
func (a *fencingAgent) running(t *testing.T) {
	t.Helper()
	select {
	case <-a.exited:
		t.Fatalf("agent.Run returned %v, %v after its start", a.err, time.Since(a.started).Round(time.Millisecond))
	default:
	}
}

// startFencingAgent runs agent.Run for node with --fencing and --fence-after, its Lease in
// leaseNS, talking to the API server at host (the proxy), and waits until it serves
// /metrics (which does not need the API server).
func startFencingAgent(t *testing.T, f *fixture, node, host string, fenceAfter time.Duration) *fencingAgent {
	t.Helper()
	return startLeaseAgent(t, f, node, host, true, fenceAfter)
}

// startLeaseAgent is startFencingAgent with the choice of --fencing (fenceAfter unused
// without it). The agent fences on its own Lease (--fence-signal=agent-lease).
func startLeaseAgent(t *testing.T, f *fixture, node, host string, fencing bool, fenceAfter time.Duration) *fencingAgent {
	t.Helper()
	return startAgentWith(t, f, node, host, fencing, fenceAfter, func(o *agent.Options) { o.FenceSignal = conditions.FenceSignalAgentLease })
}

// startAgentWith is startLeaseAgent with the options changed by configure before Validate.
func startAgentWith(t *testing.T, f *fixture, node, host string, fencing bool, fenceAfter time.Duration, configure func(*agent.Options)) *fencingAgent {
	t.Helper()
	opts := agent.NewOptions()
	opts.NodeName = node
	opts.RuntimeEndpoint = f.cri.Endpoint
	opts.PhaseGrace = phaseGrace
	opts.MetricsAddress = freeAddr(t)
	opts.QPS, opts.Burst = 50, 100
	opts.Fencing, opts.LeaseNamespace = fencing, f.ns
	if fencing {
		opts.FenceAfter = fenceAfter
	}
	configure(opts)
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(f.api.Config)
	cfg.Host = "https://" + host
	cfg.QPS, cfg.Burst = opts.QPS, opts.Burst
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	a := &fencingAgent{runningAgent: &runningAgent{addr: opts.MetricsAddress}, exited: make(chan struct{}), started: time.Now()}
	go func() {
		defer close(a.exited)
		a.err = agent.Run(ctx, cfg, opts)
	}()
	a.stop = func() {
		cancel()
		select {
		case <-a.exited:
			if a.err != nil {
				t.Errorf("agent.Run: %v", a.err)
			}
		case <-time.After(30 * time.Second):
			t.Error("agent.Run did not return within 30s of its context's end")
		}
	}
	t.Cleanup(a.stop)
	waitFor(t, "the agent serving /metrics", func() bool {
		a.running(t)
		_, err := a.scrape()
		return err == nil
	})
	return a
}

// TestFencing (A6): an agent with --fencing renews its Lease; cut off from the API server
// for longer than --fence-after it stops the containers of its node's opted-in pod, and
// only those, again when the kubelet starts one anew; back, it records fenced-at on the
// Lease and a Fenced Event on the Node, and is no longer fenced.
func TestFencing(t *testing.T) { containerdtest.Each(t, testFencing) }

func testFencing(t *testing.T, env *containerd.Env) {
	const fenceAfter = 10 * time.Second
	// A Node of its own per runtime: the Fenced Events of one run must not meet the other's.
	node := "node-fence-" + strings.ReplaceAll(env.Containerd.Name, ".", "-")
	renewPeriod := fence.RenewPeriod(fenceAfter)
	f := newFixture(t, env)
	ctx := f.ctx

	n := f.registerNode(node)
	cmd := stopsOnTerm
	in := f.fencePod(node, "opted-in", map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"},
		containerd.Container{Name: "main", Command: cmd}, containerd.Container{Name: "restarted", Command: cmd})
	out := f.fencePod(node, "not-opted-in", nil, containerd.Container{Name: "main", Command: cmd})
	inID := f.start(in)
	outID := f.start(out)

	u, err := url.Parse(f.api.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	a := startFencingAgent(t, f, node, proxy.Addr(), fenceAfter)

	// The Lease, renewed.
	lease := func() *coordinationv1.Lease { return f.agentLease(t, node) }
	var l *coordinationv1.Lease
	waitFor(t, "the agent's Lease", func() bool {
		l = lease()
		return l != nil && l.Spec.RenewTime != nil
	})
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != node || l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds != 10 ||
		l.Annotations[conditions.AnnotationFenceAfter] != "10s" || l.Spec.AcquireTime == nil {
		t.Fatalf("Lease spec %+v, annotations %v: want holder %s, 10s, acquired, annotation fence-after 10s", l.Spec, l.Annotations, node)
	}
	if st := conditions.NodeFenced(conditions.FenceEvidence{Node: node, Agent: l}, time.Now(), time.Second); st.Fenced {
		t.Errorf("the shim would read the fresh Lease as fenced: %+v", st)
	}
	first := l.Spec.RenewTime.Time
	waitFor(t, "a renewal", func() bool {
		l = lease()
		return l.Spec.RenewTime.After(first)
	})
	t.Logf("Lease renewed %v after its first renewal (period %v)", l.Spec.RenewTime.Sub(first).Round(time.Millisecond), renewPeriod)
	if v := a.metric(t, "coroner_agent_fenced"); v != 0 {
		t.Fatalf("fenced = %v before the cut", v)
	}

	// Cut the agent off. Its last renewal is at least the one just read (whose answer has
	// reached it by now), at most the last one the API server has.
	time.Sleep(200 * time.Millisecond)
	knownRenewal := lease().Spec.RenewTime.Time
	cut := time.Now()
	proxy.Cut()
	lastRenewal := lease().Spec.RenewTime.Time

	finished := waitExited(t, f, in, inID, time.Now().Add(fenceAfter+8*time.Second), "the opted-in container (cut at "+cut.Format(time.RFC3339Nano)+")")
	t.Logf("cut -> opted-in container stopped: %v (its exit %v after the Lease's last renewTime; fence-after %v)",
		finished.Sub(cut).Round(time.Millisecond), finished.Sub(lastRenewal).Round(time.Millisecond), fenceAfter)
	if finished.Before(knownRenewal.Add(fenceAfter)) {
		t.Errorf("stopped at %v, before the agent's last renewal (%v at the latest) + fence-after", finished, knownRenewal)
	}
	// What the shim relies on: stopped well within renewTime + fence-after + its margin.
	if late := finished.Sub(lastRenewal.Add(fenceAfter)); late > 3*time.Second {
		t.Errorf("stopped %v after the Lease's renewTime + fence-after", late)
	}
	if v := a.metric(t, "coroner_agent_fenced"); v != 1 {
		t.Errorf("fenced = %v while cut off", v)
	}

	// The kubelet starts a container of the opted-in pod anew: stopped too.
	restartedID, err := in.StartContainer(ctx, "restarted")
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	waitFor(t, "the new container stopped", func() bool {
		st, err := in.Status(ctx, restartedID)
		return err == nil && st.GetState().String() == "CONTAINER_EXITED"
	})
	t.Logf("a container started while fenced stopped after %v", time.Since(started).Round(time.Millisecond))
	// The agent counts a stop once the runtime's StopContainer returns, which may be a
	// moment after the container shows exited.
	var stopped float64
	waitFor(t, "fence_stopped_containers_total at 2", func() bool {
		stopped = a.metric(t, "coroner_agent_fence_stopped_containers_total")
		return stopped >= 2
	})
	if stopped != 2 {
		t.Errorf("fence_stopped_containers_total = %v, want 2", stopped)
	}
	f.wantRunning(out, outID, "the pod that is not opted in")
	if got := lease().Spec.RenewTime.Time; !got.Equal(lastRenewal) {
		t.Errorf("the Lease was renewed while cut off: %v, then %v", lastRenewal, got)
	}

	// Back: fenced-at on the Lease, renewals again, one Fenced Event on the Node.
	restored := time.Now()
	proxy.Restore()
	waitFor(t, "fenced-at on the Lease", func() bool {
		l = lease()
		_, ok := l.Annotations[conditions.AnnotationFencedAt]
		return ok
	})
	t.Logf("fenced-at written %v after the restore", time.Since(restored).Round(time.Millisecond))
	fencedAt, err := time.Parse(time.RFC3339, l.Annotations[conditions.AnnotationFencedAt])
	if err != nil {
		t.Fatalf("fenced-at %q: %v", l.Annotations[conditions.AnnotationFencedAt], err)
	}
	if fencedAt.Before(knownRenewal.Add(fenceAfter).Truncate(time.Second)) || fencedAt.After(finished) {
		t.Errorf("fenced-at %v, want between the last renewal + fence-after (%v) and the stop (%v)", fencedAt, knownRenewal.Add(fenceAfter), finished)
	}
	if !l.Spec.RenewTime.After(restored.Add(-time.Second)) {
		t.Errorf("renewTime %v, not renewed since the restore at %v", l.Spec.RenewTime, restored)
	}
	renewedAgain := l.Spec.RenewTime.Time
	waitFor(t, "renewals after the fence", func() bool { return lease().Spec.RenewTime.After(renewedAgain) })

	ev := waitFencedEvent(t, f, n)
	t.Logf("Event %s %s: %q", ev.Type, ev.Reason, ev.Message)
	if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != n.UID || ev.Source.Component != agent.Component {
		t.Errorf("Event %+v: want a Warning from %s on the Node with UID %s", ev, agent.Component, n.UID)
	}
	if !strings.Contains(ev.Message, f.ns+"/opted-in") || strings.Contains(ev.Message, "not-opted-in") ||
		!strings.Contains(ev.Message, "stopped 2 containers of 1 opted-in pod") || !strings.Contains(ev.Message, "--fence-after 10s") {
		t.Errorf("Event message %q: want the 2 containers of %s/opted-in, and no other pod", ev.Message, f.ns)
	}
	waitFor(t, "the fence gauge back to 0", func() bool { return a.metric(t, "coroner_agent_fenced") == 0 })
	f.wantRunning(out, outID, "the pod that is not opted in, after the fence")
}

// TestFencingStartedCutOff (A6): an agent with --fencing that starts while its node is
// cut off from the API server starts all the same, and fence-after after its start stops
// the containers whose sandboxes' annotations (the kubelet's copy of the pod's) opt in,
// though its pod cache is empty, and only those; back, it writes its Lease with fenced-at
// and a Fenced Event on the Node.
func TestFencingStartedCutOff(t *testing.T) { containerdtest.Each(t, testFencingStartedCutOff) }

func testFencingStartedCutOff(t *testing.T, env *containerd.Env) {
	const fenceAfter = 10 * time.Second
	// A Node of its own per runtime: the Fenced Events of one run must not meet the other's.
	node := "node-fence-cut-" + strings.ReplaceAll(env.Containerd.Name, ".", "-")
	f := newFixture(t, env)
	ctx := f.ctx
	n := f.registerNode(node)

	// The pods run; the agent cannot read their objects, only their sandboxes.
	cmd := stopsOnTerm
	in := f.fencePod(node, "opted-in", map[string]string{conditions.AnnotationSafeToForcefullyDelete: "true"},
		containerd.Container{Name: "main", Command: cmd})
	out := f.fencePod(node, "not-opted-in", map[string]string{"team": "batch"}, containerd.Container{Name: "main", Command: cmd})
	for _, p := range []struct {
		pod  *kubeletsim.Pod
		want bool
	}{{in, true}, {out, false}} {
		ann, err := p.pod.SandboxAnnotations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if conditions.OptedInToForcefulDeletion(ann) != p.want || ann["kubernetes.io/config.source"] != "api" {
			t.Fatalf("sandbox of %s: annotations %v, want the pod's %v (opted in: %v) and the kubelet's", p.pod.Object.Name, ann, p.pod.Object.Annotations, p.want)
		}
	}
	inID := f.start(in)
	outID := f.start(out)

	u, err := url.Parse(f.api.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	proxy.Cut()
	a := startFencingAgent(t, f, node, proxy.Addr(), fenceAfter)
	t.Logf("the agent serves /metrics %v after its start, cut off", time.Since(a.started).Round(time.Millisecond))

	var finished time.Time
	deadline := a.started.Add(fenceAfter + 8*time.Second)
	for {
		a.running(t)
		st, err := in.Status(ctx, inID)
		if err == nil && st.GetState().String() == "CONTAINER_EXITED" {
			finished = kubeletsim.FinishedAt(st)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the opted-in container still runs %v after the agent's start (fence-after %v)", time.Since(a.started).Round(time.Millisecond), fenceAfter)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("agent start -> opted-in container stopped: %v (fence-after %v)", finished.Sub(a.started).Round(time.Millisecond), fenceAfter)
	if finished.Before(a.started.Add(fenceAfter)) {
		t.Errorf("stopped %v after the agent's start, before fence-after %v", finished.Sub(a.started), fenceAfter)
	}
	if late := finished.Sub(a.started.Add(fenceAfter)); late > 3*time.Second {
		t.Errorf("stopped %v after the agent's start + fence-after", late)
	}
	if v := a.metric(t, "coroner_agent_fenced"); v != 1 {
		t.Errorf("fenced = %v while cut off", v)
	}
	if v := a.metric(t, "coroner_agent_fence_stopped_containers_total"); v != 1 {
		t.Errorf("fence_stopped_containers_total = %v, want 1", v)
	}
	time.Sleep(2 * fence.FencedPeriod) // a few more passes: the other pod is still left alone
	f.wantRunning(out, outID, "the pod that is not opted in")
	leases := f.client.CoordinationV1().Leases(f.ns)
	if _, err := leases.Get(ctx, conditions.AgentLeaseName(node), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the agent's Lease while it was cut off from its start: %v, want none", err)
	}
	a.running(t)

	// Back: the Lease, with fenced-at, and one Fenced Event on the Node.
	restored := time.Now()
	proxy.Restore()
	var l *coordinationv1.Lease
	waitFor(t, "the Lease with fenced-at", func() bool {
		l, err = leases.Get(ctx, conditions.AgentLeaseName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		_, ok := l.Annotations[conditions.AnnotationFencedAt]
		return ok
	})
	t.Logf("Lease with fenced-at %v after the restore", time.Since(restored).Round(time.Millisecond))
	fencedAt, err := time.Parse(time.RFC3339, l.Annotations[conditions.AnnotationFencedAt])
	if err != nil {
		t.Fatalf("fenced-at %q: %v", l.Annotations[conditions.AnnotationFencedAt], err)
	}
	if fencedAt.Before(a.started.Add(fenceAfter).Truncate(time.Second)) || fencedAt.After(finished) {
		t.Errorf("fenced-at %v, want between the start + fence-after (%v) and the stop (%v)", fencedAt, a.started.Add(fenceAfter), finished)
	}
	if l.Spec.RenewTime == nil || l.Spec.RenewTime.Before(&metav1.MicroTime{Time: restored.Add(-time.Second)}) ||
		l.Annotations[conditions.AnnotationFenceAfter] != "10s" {
		t.Errorf("Lease spec %+v, annotations %v: want renewed since the restore at %v, fence-after 10s", l.Spec, l.Annotations, restored)
	}

	ev := waitFencedEvent(t, f, n)
	t.Logf("Event %s %s: %q", ev.Type, ev.Reason, ev.Message)
	if ev.Type != corev1.EventTypeWarning || ev.InvolvedObject.UID != n.UID {
		t.Errorf("Event %+v: want a Warning on the Node with UID %s", ev, n.UID)
	}
	if !strings.HasPrefix(ev.Message, "Could not reach the API server for ") || !strings.Contains(ev.Message, "since the agent started (over --fence-after 10s)") ||
		!strings.HasSuffix(ev.Message, ": stopped 1 container of 1 opted-in pod: "+f.ns+"/opted-in") {
		t.Errorf("Event message %q: want the agent's start, and the container of %s/opted-in alone", ev.Message, f.ns)
	}
	waitFor(t, "the fence gauge back to 0", func() bool { return a.metric(t, "coroner_agent_fenced") == 0 })
	f.wantRunning(out, outID, "the pod that is not opted in, after the fence")
	a.running(t)
}

// fencePod creates a pod on node with the given annotations and containers (started with
// f.start for "main", or StartContainer); the test's end removes it.
func (f *fixture) fencePod(node, name string, annotations map[string]string, containers ...containerd.Container) *kubeletsim.Pod {
	f.t.Helper()
	return f.podWith(node, name, kubeletsim.PodOptions{Annotations: annotations, Containers: containers})
}

// wantRunning fails the test unless the container runs.
func (f *fixture) wantRunning(p *kubeletsim.Pod, id, what string) {
	f.t.Helper()
	st, err := p.Status(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	if st.GetState().String() != "CONTAINER_RUNNING" {
		f.t.Errorf("%s: container %v (exit %d), want it running", what, st.GetState(), st.GetExitCode())
	}
}

// stopsOnTerm is a container command that exits at once on SIGTERM (PID 1 of a container
// ignores it unless it handles it).
var stopsOnTerm = []string{"sh", "-c", `trap "exit 143" TERM; while :; do sleep 0.1; done`}

// registerNode creates the Node, as its kubelet would register it, removed at the end.
func (f *fixture) registerNode(name string) *corev1.Node {
	f.t.Helper()
	n, err := f.client.CoreV1().Nodes().Create(f.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = f.client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return n
}
